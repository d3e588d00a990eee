//! SPC-4 commands the device server answers from its own state:
//! INQUIRY and its VPD pages, MODE SENSE/SELECT and the mode pages,
//! REPORT SUPPORTED OPERATION CODES, and PERSISTENT RESERVE OUT (the
//! reservation model itself is [`crate::pr`]).

use super::*;

impl Inner {
    pub(super) async fn prout(
        self: &Arc<Self>,
        task: &Task,
        service_action: u8,
        scope: u8,
        pr_type: u8,
        param_len: u32,
    ) -> TaskResult {
        let params = gather(&task.data_out, 0, param_len.min(64 * 1024) as usize);
        if let Some(store) = self.shared() {
            let me = PortKey::of(&task.nexus);
            let nexus = task.nexus.clone();
            return self
                .change_shared(store, move |s| {
                    if s.reserve6.as_ref().is_some_and(|h| *h != me) {
                        return Err(PrRefusal::Conflict);
                    }
                    // The store persists the state: APTPL is honoured.
                    let fx = s.pr.prout(
                        &nexus,
                        service_action,
                        scope,
                        pr_type,
                        param_len,
                        &params,
                        true,
                    )?;
                    s.unit_attentions = fx.unit_attentions;
                    s.abort = fx.abort;
                    Ok(true)
                })
                .await;
        }
        let mut st = self.lock();
        if let Some(h) = &st.reserve6
            && *h != PortKey::of(&task.nexus)
        {
            return TaskResult::status(Status::RESERVATION_CONFLICT);
        }
        let before = st.pr.clone();
        match st.pr.prout(
            &task.nexus,
            service_action,
            scope,
            pr_type,
            param_len,
            &params,
            self.cfg.pr_path.is_some(),
        ) {
            Ok(fx) => {
                if fx.persist
                    && let Some(path) = &self.cfg.pr_path
                    && let Err(e) = st.pr.persist(path)
                {
                    tracing::error!(error = %e, "APTPL state not saved");
                    st.pr = before;
                    return check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE);
                }
                self.ua_for(&mut st, &fx.unit_attentions);
                self.update_reserved(&st);
                drop(st);
                for t in &fx.abort {
                    let t = t.clone();
                    drop(
                        self.tasks
                            .abort_matching(move |n, _| t.matches(&PortKey::of(n))),
                    );
                }
                TaskResult::good()
            }
            Err(PrRefusal::Conflict) => TaskResult::status(Status::RESERVATION_CONFLICT),
            Err(PrRefusal::Check(s)) => TaskResult::check_condition(s),
        }
    }

    pub(super) fn inquiry(
        &self,
        nexus: &ItNexus,
        evpd: bool,
        page: u8,
        alloc_len: u16,
    ) -> TaskResult {
        let alloc = usize::from(alloc_len);
        if !evpd {
            if page != 0 {
                return bad_cdb(2, None);
            }
            let mut v = Vec::with_capacity(96);
            // Direct access, RMB, SPC-4, HiSup + format 2.
            let rmb = if self.cfg.removable { 0x80 } else { 0 };
            v.extend_from_slice(&[0x00, rmb, 0x06, 0x12, 0, 0, 0, 0x02]);
            // TPGS (01b implicit ALUA, 11b explicit too: SET TARGET PORT
            // GROUPS); 3PC: EXTENDED COPY works (`xcopy`). CmdQue.
            v[5] = (self.alua.tpgs() << 4) | 0x08;
            ascii_field(&mut v, &self.cfg.vendor, 8);
            ascii_field(&mut v, &self.cfg.product, 16);
            ascii_field(&mut v, &self.cfg.revision, 4);
            v.resize(58, 0);
            // Version descriptors: SAM-5, SPC-4, SBC-3, iSCSI/FCP-4.
            for d in [0x00a0u16, 0x0460, 0x04c0, 0x0960, 0x0a40] {
                v.extend_from_slice(&d.to_be_bytes());
            }
            v.resize(96, 0);
            v[4] = (v.len() - 5) as u8;
            return data_in(v, alloc);
        }
        let mut v = vec![0x00, page, 0, 0];
        match page {
            0x00 => v.extend_from_slice(&[0x00, 0x80, 0x83, 0x8f, 0xb0, 0xb1, 0xb2]),
            0x8f => {
                // Third-party Copy: a Supported Commands descriptor
                // (0001h) naming EXTENDED COPY(LID1) and RECEIVE COPY
                // RESULTS' COPY STATUS and OPERATING PARAMETERS.
                let cmds: [u8; 7] = [0x83, 1, 0x00, 0x84, 2, 0x00, 0x03];
                let mut d = vec![0x00, 0x01, 0, 0, cmds.len() as u8];
                d.extend_from_slice(&cmds);
                d.resize(d.len().div_ceil(4) * 4, 0);
                let dlen = (d.len() - 4) as u16;
                d[2..4].copy_from_slice(&dlen.to_be_bytes());
                v.extend_from_slice(&d);
            }
            0x80 => v.extend_from_slice(self.serial.as_bytes()),
            0x83 => self.device_id(nexus, &mut v),
            0xb0 => {
                v.resize(64, 0);
                v[5] = MAX_CAW_BLOCKS as u8;
                let lbppb = 1u32 << self.lbppbe;
                v[6..8].copy_from_slice(&(lbppb as u16).to_be_bytes());
                v[8..12].copy_from_slice(&self.cfg.max_transfer_blocks.to_be_bytes());
                let opt = (128 * 1024 / self.bs as u32).min(self.cfg.max_transfer_blocks);
                v[12..16].copy_from_slice(&opt.to_be_bytes());
                if self.thin {
                    v[20..24].copy_from_slice(&(MAX_UNMAP_BLOCKS as u32).to_be_bytes());
                    v[24..28].copy_from_slice(&(MAX_UNMAP_DESCRIPTORS as u32).to_be_bytes());
                    v[28..32].copy_from_slice(&lbppb.to_be_bytes());
                }
                v[36..44].copy_from_slice(&MAX_WRITE_SAME_BLOCKS.to_be_bytes());
                // MAXIMUM ATOMIC TRANSFER LENGTH; ATOMIC ALIGNMENT and
                // ATOMIC TRANSFER LENGTH GRANULARITY 0 (no restriction);
                // no atomic boundaries.
                v[44..48].copy_from_slice(&self.max_atomic_blocks().to_be_bytes());
            }
            0xb1 => {
                v.resize(64, 0);
                v[4..6].copy_from_slice(&1u16.to_be_bytes()); // non-rotating
                // WABEREQ = WACEREQ = 01b: reads after a BLOCK or CRYPTO
                // ERASE succeed (the medium reads as zeros).
                v[7] = 0x50;
            }
            0xb2 => {
                v.resize(8, 0);
                if self.thin {
                    v[4] = self.texp; // THRESHOLD EXPONENT
                    v[5] = 0x80 | 0x40 | 0x20 | 0x04; // LBPU LBPWS LBPWS10 LBPRZ
                    v[6] = 0x02; // thin provisioned
                }
            }
            _ => return bad_cdb(2, None),
        }
        let len = (v.len() - 4) as u16;
        v[2..4].copy_from_slice(&len.to_be_bytes());
        data_in(v, alloc)
    }

    pub(super) fn device_id(&self, nexus: &ItNexus, v: &mut Vec<u8>) {
        let t = nexus.target();
        let proto = t.id.protocol_identifier() << 4;
        // NAA, logical unit, binary.
        v.extend_from_slice(&[0x01, 0x03, 0, 8]);
        v.extend_from_slice(&self.naa.to_be_bytes());
        // T10 vendor ID, logical unit, ASCII.
        let mut t10 = Vec::new();
        ascii_field(&mut t10, &self.cfg.vendor, 8);
        t10.extend_from_slice(self.serial.as_bytes());
        v.extend_from_slice(&[0x02, 0x01, 0, t10.len().min(255) as u8]);
        v.extend(t10.iter().take(255));
        // Relative target port, target port, PIV.
        v.extend_from_slice(&[proto | 0x01, 0x80 | 0x10 | 0x04, 0, 4, 0, 0]);
        v.extend_from_slice(&t.relative_port_id.to_be_bytes());
        // Target port group.
        v.extend_from_slice(&[proto | 0x01, 0x80 | 0x10 | 0x05, 0, 4, 0, 0]);
        v.extend_from_slice(&t.port_group.to_be_bytes());
        // Target port name.
        match &t.id {
            TransportId::Fcp { wwpn } => {
                v.extend_from_slice(&[proto | 0x01, 0x80 | 0x10 | 0x03, 0, 8]);
                v.extend_from_slice(&wwpn.to_be_bytes());
            }
            id @ TransportId::Iscsi { .. } => {
                let name = id.port_name();
                let mut len = name.len() + 1;
                len = len.div_ceil(4) * 4;
                let len = len.min(252);
                v.extend_from_slice(&[proto | 0x03, 0x80 | 0x10 | 0x08, 0, len as u8]);
                let start = v.len();
                v.extend(name.bytes().take(len - 1));
                v.resize(start + len, 0);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn mode_sense(
        &self,
        ten: bool,
        llbaa: bool,
        dbd: bool,
        pc: u8,
        page: u8,
        subpage: u8,
        alloc_len: u16,
    ) -> TaskResult {
        if pc == 3 {
            return illegal(asc::SAVING_PARAMETERS_NOT_SUPPORTED);
        }
        let (wce, swp, lbp) = {
            let st = self.lock();
            (st.wce, st.swp, st.lbp)
        };
        let default_lbp =
            lbp::LbpState::configured(self.cfg.soft_threshold, self.threshold_set_bytes());
        // (page, subpage): 1Ch/02h (logical block provisioning) on thin LUs.
        let lbp_page: &[(u8, u8)] = if self.thin { &[(0x1c, 0x02)] } else { &[] };
        let mut pages: Vec<(u8, u8)> = Vec::with_capacity(4);
        match (page, subpage) {
            (0x3f, 0x00) => pages.extend([(0x08, 0), (0x0a, 0), (0x1c, 0)]),
            (0x3f, 0xff) => {
                pages.extend([(0x08, 0), (0x0a, 0), (0x1c, 0)]);
                pages.extend_from_slice(lbp_page);
            }
            (0x08 | 0x0a | 0x1c, 0x00) | (0x08 | 0x0a, 0xff) => pages.push((page, 0)),
            (0x1c, 0xff) => {
                pages.push((0x1c, 0));
                pages.extend_from_slice(lbp_page);
            }
            (0x1c, 0x02) if self.thin => pages.push((0x1c, 0x02)),
            (0x08 | 0x0a | 0x1c | 0x3f, _) => return bad_cdb(3, None),
            _ => return bad_cdb(2, Some(5)),
        }
        let mut v = Vec::with_capacity(128);
        let hdr = if ten { 8 } else { 4 };
        v.resize(hdr, 0);
        let wp = self.read_only.load(Ordering::Acquire) || self.backend.caps().read_only || swp;
        let dsp = (u8::from(wp) << 7) | 0x10; // WP, DPOFUA
        let blocks = self.blocks();
        if !dbd {
            if ten && llbaa {
                v.extend_from_slice(&blocks.to_be_bytes());
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&(self.bs as u32).to_be_bytes());
            } else {
                v.extend_from_slice(&(blocks.min(0xffff_ffff) as u32).to_be_bytes());
                v.push(0);
                v.extend_from_slice(&(self.bs as u32).to_be_bytes()[1..]);
            }
        }
        let bd_len = v.len() - hdr;
        for (p, sub) in pages {
            if sub == 0x02 {
                let st = if pc == 2 { &default_lbp } else { &lbp };
                v.extend_from_slice(&lbp::mode_page(pc, st));
            } else {
                v.extend_from_slice(&mode_page(p, pc, wce, swp));
            }
        }
        if ten {
            let n = (v.len() - 2) as u16;
            v[0..2].copy_from_slice(&n.to_be_bytes());
            v[3] = dsp;
            v[4] = u8::from(ten && llbaa && !dbd);
            v[6..8].copy_from_slice(&(bd_len as u16).to_be_bytes());
        } else {
            v[0] = (v.len() - 1).min(255) as u8;
            v[2] = dsp;
            v[3] = bd_len as u8;
        }
        data_in(v, usize::from(alloc_len))
    }

    pub(super) fn mode_select(
        &self,
        task: &Task,
        ten: bool,
        pf: bool,
        sp: bool,
        param_len: u16,
    ) -> TaskResult {
        if !pf {
            return bad_cdb(1, Some(4));
        }
        if sp {
            return bad_cdb(1, Some(0));
        }
        let len = usize::from(param_len);
        let p = gather(&task.data_out, 0, len);
        if p.len() < len {
            return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
        }
        let hdr = if ten { 8 } else { 4 };
        if len == 0 {
            return TaskResult::good();
        }
        if len < hdr {
            return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
        }
        let bd_len = if ten {
            usize::from(u16::from_be_bytes([p[6], p[7]]))
        } else {
            usize::from(p[3])
        };
        let mut at = hdr;
        if bd_len != 0 {
            let Some(bd) = p.get(at..at + bd_len) else {
                return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
            };
            if bd_len != 8 && bd_len != 16 {
                return bad_param((hdr - 1) as u16, None);
            }
            let block_len = u64::from(u32::from_be_bytes([
                0,
                bd[bd_len - 3],
                bd[bd_len - 2],
                bd[bd_len - 1],
            ]));
            if block_len != self.bs {
                return bad_param((at + bd_len - 3) as u16, None);
            }
            at += bd_len;
        }
        let mut st = self.lock();
        let (mut wce, mut swp) = (st.wce, st.swp);
        let mut lbp_new: Option<(bool, lbp::Threshold)> = None;
        while at < p.len() {
            let code = p[at] & 0x3f;
            if p[at] & 0x40 != 0 {
                // Subpage format: only 1Ch/02h, on a thin LU.
                let Some(h) = p.get(at..at + 4) else {
                    return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
                };
                if code != 0x1c || h[1] != 0x02 || !self.thin {
                    return bad_param(at as u16, None);
                }
                let plen = usize::from(u16::from_be_bytes([h[2], h[3]]));
                let Some(body) = p.get(at..at + 4 + plen) else {
                    return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
                };
                match lbp::parse_mode_page(body, at) {
                    Ok(v) => lbp_new = Some(v),
                    Err(r) => return r,
                }
                at += body.len();
                continue;
            }
            let Some(&plen) = p.get(at + 1) else {
                return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
            };
            let Some(body) = p.get(at..at + 2 + usize::from(plen)) else {
                return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
            };
            if !matches!(code, 0x08 | 0x0a | 0x1c) {
                return bad_param(at as u16, None);
            }
            let current = mode_page(code, 0, wce, swp);
            let mask = mode_page(code, 1, wce, swp);
            if body.len() != current.len() {
                return bad_param((at + 1) as u16, None);
            }
            for i in 2..body.len() {
                let diff = (body[i] ^ current[i]) & !mask[i];
                if diff != 0 {
                    return bad_param((at + i) as u16, Some(7 - diff.leading_zeros() as u8));
                }
            }
            match code {
                0x08 => wce = body[2] & 0x04 != 0,
                0x0a => swp = body[4] & 0x08 != 0,
                _ => {}
            }
            at += body.len();
        }
        let lbp_changed = lbp_new.is_some_and(|(situa, t)| {
            let changed = situa != st.lbp.situa || t != st.lbp.threshold;
            if changed {
                self.set_threshold(&mut st, situa, t);
            }
            changed
        });
        if lbp_changed && wce == st.wce && swp == st.swp {
            let me = PortKey::of(&task.nexus);
            self.ua_where(&mut st, |k| *k != me, asc::MODE_PARAMETERS_CHANGED, false);
        }
        if wce != st.wce || swp != st.swp {
            st.wce = wce;
            st.swp = swp;
            self.wce.store(wce, Ordering::Release);
            let ro = self.read_only.load(Ordering::Acquire) || self.backend.caps().read_only || swp;
            self.write_protected.store(ro, Ordering::Release);
            let me = PortKey::of(&task.nexus);
            self.ua_where(&mut st, |k| *k != me, asc::MODE_PARAMETERS_CHANGED, false);
        }
        TaskResult::good()
    }
}

/// A mode page for page control `pc` (0 current, 1 changeable mask,
/// 2 default).
pub(super) fn mode_page(code: u8, pc: u8, wce: bool, swp: bool) -> Vec<u8> {
    let changeable = pc == 1;
    let default = pc == 2;
    match code {
        0x08 => {
            let mut p = vec![0u8; 20];
            p[0] = 0x08;
            p[1] = 18;
            p[2] = if changeable || default {
                0x04
            } else {
                u8::from(wce) << 2
            };
            p
        }
        0x0a => {
            let mut p = vec![0u8; 12];
            p[0] = 0x0a;
            p[1] = 10;
            if changeable {
                p[4] = 0x08;
            } else {
                // QUEUE ALGORITHM MODIFIER = 1 (unrestricted reordering).
                p[3] = 0x10;
                p[4] = if swp && !default { 0x08 } else { 0 };
                // BUSY TIMEOUT PERIOD: unlimited.
                p[8..10].copy_from_slice(&0xffffu16.to_be_bytes());
            }
            p
        }
        _ => {
            let mut p = vec![0u8; 12];
            p[0] = 0x1c;
            p[1] = 10;
            p
        }
    }
}

/// Fixed or descriptor format sense bytes (REQUEST SENSE parameter data;
/// also a read-only remote LU's own unit attentions).
pub(crate) fn sense_bytes(s: &Sense, desc: bool) -> Vec<u8> {
    if !desc {
        return s.to_fixed().to_vec();
    }
    let mut v = vec![0x72, s.key.0 & 0x0f, s.asc.0, s.asc.1, 0, 0, 0, 0];
    if let Some(info) = s.information {
        v.extend_from_slice(&[0x00, 0x0a, 0x80, 0]);
        v.extend_from_slice(&u64::from(info).to_be_bytes());
    }
    v[7] = (v.len() - 8) as u8;
    v
}

/// Every command this device server implements: opcode and service action.
pub(super) const SUPPORTED: &[(u8, Option<u16>)] = &[
    (0x00, None),
    (0x03, None),
    (0x04, None),
    (0x08, None),
    (0x0a, None),
    (0x12, None),
    (0x15, None),
    (0x16, None),
    (0x17, None),
    (0x1a, None),
    (0x1b, None),
    (0x1d, None),
    (0x1e, None),
    (0x25, None),
    (0x28, None),
    (0x2a, None),
    (0x2e, None),
    (0x2f, None),
    (0x34, None),
    (0x35, None),
    (0x37, None),
    (0x41, None),
    (0x42, None),
    (0x48, Some(0x01)),
    (0x48, Some(0x02)),
    (0x48, Some(0x03)),
    (0x48, Some(0x1f)),
    (0x4d, None),
    (0x55, None),
    (0x56, None),
    (0x57, None),
    (0x5a, None),
    (0x5e, None),
    (0x5f, None),
    (0x83, Some(0x00)),
    (0x84, Some(0x00)),
    (0x84, Some(0x03)),
    (0x88, None),
    (0x89, None),
    (0x8a, None),
    (0x8b, None),
    (0x8e, None),
    (0x8f, None),
    (0x90, None),
    (0x91, None),
    (0x93, None),
    (0x9c, None),
    (0x9e, Some(0x10)),
    (0x9e, Some(0x12)),
    (0xa0, None),
    (0xa3, Some(0x0a)),
    (0xa3, Some(0x0c)),
    (0xa3, Some(0x0d)),
    (0xa4, Some(0x0a)),
    (0xa8, None),
    (0xaa, None),
    (0xae, None),
    (0xaf, None),
    (0xb7, None),
];

/// CDB usage data: for each byte, the bits the parser accepts, probed one
/// bit at a time on an otherwise zero CDB, less the fields the device
/// server refuses when non-zero (protection fields, ANCHOR).
pub(super) fn usage_data(op: u8, sa: Option<u16>) -> Vec<u8> {
    let len = crate::cdb::cdb_length_of(op).unwrap_or(16);
    let mut base = vec![0u8; len];
    base[0] = op;
    if let (Some(sa), Some(b)) = (sa, base.get_mut(1)) {
        *b = sa as u8;
    }
    let mut usage = base.clone();
    for i in 1..len {
        for bit in 0..8 {
            // The service action field reads as the service action itself.
            if sa.is_some() && i == 1 && bit < 5 {
                continue;
            }
            let mut probe = base.clone();
            probe[i] ^= 1 << bit;
            if Command::parse(&probe).is_ok() {
                usage[i] |= 1 << bit;
            }
        }
    }
    let block_io = matches!(
        op,
        0x28 | 0x2a
            | 0x2e
            | 0x2f
            | 0x88
            | 0x89
            | 0x8a
            | 0x8b
            | 0x8e
            | 0x8f
            | 0xa8
            | 0xaa
            | 0xae
            | 0xaf
            | 0x41
            | 0x93
            | 0x9c
    );
    if block_io {
        usage[1] &= !0xe0;
    }
    if matches!(op, 0x41 | 0x93 | 0x42) {
        usage[1] &= if op == 0x42 { !0x01 } else { !0x10 };
    }
    if matches!(op, 0x25 | 0x9e) {
        // The obsolete PMI/LBA pair is accepted only in combination.
        for b in usage
            .iter_mut()
            .take(if op == 0x25 { 6 } else { 10 })
            .skip(2)
        {
            *b = 0;
        }
    }
    usage
}

pub(super) fn timeouts(v: &mut Vec<u8>) {
    v.extend_from_slice(&0x000au16.to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&30u32.to_be_bytes());
    v.extend_from_slice(&60u32.to_be_bytes());
}

pub(super) fn report_opcodes(
    rctd: bool,
    options: u8,
    op: u8,
    sa: u16,
) -> Result<Vec<u8>, TaskResult> {
    match options {
        0 => {
            let mut v = vec![0u8; 4];
            for (o, s) in SUPPORTED {
                v.push(*o);
                v.push(0);
                v.extend_from_slice(&s.unwrap_or(0).to_be_bytes());
                v.push(0);
                v.push((u8::from(rctd) << 1) | u8::from(s.is_some()));
                let len = usage_data(*o, *s).len() as u16;
                v.extend_from_slice(&len.to_be_bytes());
                if rctd {
                    timeouts(&mut v);
                }
            }
            let n = (v.len() - 4) as u32;
            v[0..4].copy_from_slice(&n.to_be_bytes());
            Ok(v)
        }
        1..=3 => {
            let has_sa = SUPPORTED.iter().any(|(o, s)| *o == op && s.is_some());
            let entry = match (options, has_sa) {
                (1, true) => return Err(bad_cdb(3, None)),
                (2, false) => return Err(bad_cdb(3, None)),
                (1, false) => SUPPORTED.iter().find(|(o, _)| *o == op),
                (3, false) if sa != 0 => None,
                (3, false) => SUPPORTED.iter().find(|(o, _)| *o == op),
                _ => SUPPORTED.iter().find(|(o, s)| *o == op && *s == Some(sa)),
            };
            let mut v = vec![0u8; 4];
            match entry {
                None => v[1] = 0x01,
                Some((o, s)) => {
                    v[1] = (u8::from(rctd) << 7) | 0x03;
                    let u = usage_data(*o, *s);
                    v[2..4].copy_from_slice(&(u.len() as u16).to_be_bytes());
                    v.extend_from_slice(&u);
                    if rctd {
                        timeouts(&mut v);
                    }
                }
            }
            Ok(v)
        }
        _ => Err(bad_cdb(2, Some(2))),
    }
}
