//! Logical block provisioning thresholds (SBC-3 §4.7.3.7): a thin LU
//! reports its LBA mapping resources and raises a unit attention when a
//! soft threshold is crossed, so that a host hears the pool is running
//! out before a write fails with SPACE ALLOCATION FAILED WRITE PROTECT.
//!
//! - VPD page B2h carries the THRESHOLD EXPONENT: resources are counted in
//!   threshold sets of 2^exponent logical blocks (1 MiB).
//! - The Logical Block Provisioning mode page (1Ch/02h) holds one soft
//!   threshold descriptor (ENABLED, ARMING decreasing or increasing,
//!   RESOURCE available or used, THRESHOLD COUNT) and SITUA; MODE SELECT
//!   changes them. `EmulatedLuConfig::soft_threshold` arms one at start.
//! - The Logical Block Provisioning log page (0Ch, LOG SENSE) reports the
//!   available (shared pool: scope not dedicated) and used (dedicated)
//!   resource counts, from [`BlockBackend::provisioning`].
//! - After writes (once per `threshold_check_interval`, or every
//!   millisecond while a thread writes more than a sixteenth of a
//!   threshold set between checks), the resource is compared with the
//!   threshold: an armed-decreasing
//!   threshold is reached when the count falls below THRESHOLD COUNT, an
//!   armed-increasing one when it rises above. Reaching it establishes
//!   THIN PROVISIONING SOFT THRESHOLD REACHED (38h/07h) for every I_T nexus
//!   (with SITUA, only the one whose command crossed it) and logs it; the
//!   threshold re-arms once the count is back on its side.

use std::time::Duration;

use super::*;

/// The least time between two checks a writer's bytes trigger.
const MIN_SPACING: Duration = Duration::from_millis(1);

/// RESOURCE: available LBA mapping resources.
pub(super) const AVAILABLE: u8 = 0x01;
/// RESOURCE: used LBA mapping resources.
pub(super) const USED: u8 = 0x02;

/// The soft threshold descriptor of the Logical Block Provisioning mode
/// page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Threshold {
    pub(super) enabled: bool,
    /// ARMING: armed increasing (else armed decreasing).
    pub(super) increasing: bool,
    /// RESOURCE: [`AVAILABLE`] or [`USED`].
    pub(super) resource: u8,
    /// THRESHOLD COUNT, in threshold sets.
    pub(super) count: u32,
}

/// The mode page's settings, and whether the threshold has been reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct LbpState {
    pub(super) situa: bool,
    pub(super) threshold: Threshold,
    /// Reached and not yet re-armed.
    pub(super) reached: bool,
}

/// The threshold exponent for logical blocks of 2^`shift` bytes: threshold
/// sets of 1 MiB.
pub(super) fn threshold_exponent(shift: u32) -> u8 {
    20u32.saturating_sub(shift) as u8
}

impl LbpState {
    /// The state a configured soft threshold (bytes available) starts
    /// with; `set_bytes` is the size of a threshold set.
    pub(super) fn configured(soft_threshold: Option<u64>, set_bytes: u64) -> LbpState {
        LbpState {
            situa: false,
            threshold: match soft_threshold {
                Some(bytes) => Threshold {
                    enabled: true,
                    increasing: false,
                    resource: AVAILABLE,
                    count: bytes.div_ceil(set_bytes.max(1)).min(u64::from(u32::MAX)) as u32,
                },
                None => Threshold {
                    resource: AVAILABLE,
                    ..Threshold::default()
                },
            },
            reached: false,
        }
    }
}

/// The Logical Block Provisioning mode page (1Ch/02h), 24 bytes: the
/// values in `st` (`pc` 0 current, 2 default), or the changeable mask
/// (`pc` 1).
pub(super) fn mode_page(pc: u8, st: &LbpState) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0] = 0x40 | 0x1c; // SPF, page code
    p[1] = 0x02;
    p[2..4].copy_from_slice(&20u16.to_be_bytes());
    if pc == 1 {
        p[4] = 0x01; // SITUA
        p[16] = 0x80 | 0x07; // ENABLED, ARMING
        p[17] = 0xff; // RESOURCE
        p[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        return p;
    }
    let t = st.threshold;
    p[4] = u8::from(st.situa);
    // TYPE 000b: soft threshold.
    p[16] = (u8::from(t.enabled) << 7) | u8::from(t.increasing);
    p[17] = t.resource;
    p[20..24].copy_from_slice(&t.count.to_be_bytes());
    p
}

/// Parses a Logical Block Provisioning mode page from MODE SELECT (`body`,
/// the whole page, at `at` in the parameter list). Err: the sense for the
/// first bad field.
pub(super) fn parse_mode_page(body: &[u8], at: usize) -> Result<(bool, Threshold), TaskResult> {
    let field = |i: usize, bit: Option<u8>| bad_param((at + i) as u16, bit);
    if body.len() != 24 {
        return Err(field(2, None));
    }
    if body[4] & !0x01 != 0 {
        return Err(field(4, None));
    }
    if let Some(i) = (5..16).find(|&i| body[i] != 0) {
        return Err(field(i, None));
    }
    let d = body[16];
    if d & 0x40 != 0 {
        return Err(field(16, Some(6)));
    }
    if (d >> 3) & 0x07 != 0 {
        // Only soft thresholds.
        return Err(field(16, Some(5)));
    }
    if d & 0x07 > 1 {
        return Err(field(16, Some(2)));
    }
    let resource = body[17];
    if resource != AVAILABLE && resource != USED {
        return Err(field(17, None));
    }
    if body[18] != 0 || body[19] != 0 {
        return Err(field(if body[18] != 0 { 18 } else { 19 }, None));
    }
    Ok((
        body[4] & 0x01 != 0,
        Threshold {
            enabled: d & 0x80 != 0,
            increasing: d & 0x01 != 0,
            resource,
            count: u32::from_be_bytes([body[20], body[21], body[22], body[23]]),
        },
    ))
}

impl Inner {
    /// Bytes in one threshold set.
    pub(super) fn threshold_set_bytes(&self) -> u64 {
        self.bs << self.texp
    }

    /// The available and used resource counts, in threshold sets.
    fn resource_counts(&self) -> Option<(u32, u32)> {
        let p = self.backend.provisioning()?;
        let set = self.threshold_set_bytes().max(1);
        let sets = |b: u64| (b / set).min(u64::from(u32::MAX)) as u32;
        Some((sets(p.available), sets(p.used)))
    }

    /// Compares the resources with an enabled threshold after a write of
    /// `written` bytes: at the first write, then once per
    /// `threshold_check_interval`, or sooner (at most every
    /// [`MIN_SPACING`]) once a thread has written a sixteenth of a
    /// threshold set, so that a fast writer cannot pass from the threshold
    /// to a full medium between two checks. A write pays one atomic add to
    /// its thread's counter and a clock read; one writer at a time checks.
    /// See the module documentation.
    pub(super) fn check_threshold(&self, nexus: &ItNexus, written: u64) {
        if !self.lbp_on.load(Ordering::Acquire) {
            return;
        }
        let shard = &self.lbp_written[thread_shard() % self.lbp_written.len()];
        let mine = shard.fetch_add(written, Ordering::Relaxed) + written;
        let now = self.lbp_epoch.elapsed().as_nanos() as u64 + 1;
        let last = self.lbp_checked.load(Ordering::Relaxed);
        let since = now.saturating_sub(last);
        let due = last == 0
            || since >= self.cfg.threshold_check_interval.as_nanos() as u64
            || (mine >= self.threshold_set_bytes() / 16 && since >= MIN_SPACING.as_nanos() as u64);
        if !due
            || self
                .lbp_checked
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        shard.store(0, Ordering::Relaxed);
        let Some((available, used)) = self.resource_counts() else {
            return;
        };
        let mut st = self.lock();
        let t = st.lbp.threshold;
        if !t.enabled {
            return;
        }
        let value = if t.resource == USED { used } else { available };
        let beyond = if t.increasing {
            value > t.count
        } else {
            value < t.count
        };
        if beyond && !st.lbp.reached {
            st.lbp.reached = true;
            let situa = st.lbp.situa;
            let me = PortKey::of(nexus);
            self.ua_where(
                &mut st,
                |k| !situa || *k == me,
                asc::THIN_PROVISIONING_SOFT_THRESHOLD_REACHED,
                false,
            );
            drop(st);
            let set = self.threshold_set_bytes();
            tracing::warn!(
                lu = %self.cfg.name,
                resource = if t.resource == USED { "used" } else { "available" },
                bytes = u64::from(value) * set,
                threshold_bytes = u64::from(t.count) * set,
                "thin provisioning soft threshold reached"
            );
        } else if !beyond && st.lbp.reached {
            st.lbp.reached = false;
        }
    }

    /// A new threshold from MODE SELECT: it re-arms, and the next write
    /// checks at once.
    pub(super) fn set_threshold(&self, st: &mut LuState, situa: bool, t: Threshold) {
        st.lbp = LbpState {
            situa,
            threshold: t,
            reached: false,
        };
        self.lbp_on.store(t.enabled, Ordering::Release);
        for w in self.lbp_written.iter() {
            w.store(0, Ordering::Relaxed);
        }
        self.lbp_checked.store(0, Ordering::Release);
    }

    /// LOG SENSE: the supported pages (00h) and the Logical Block
    /// Provisioning page (0Ch, thin LUs), current cumulative values only.
    pub(super) fn log_sense(
        &self,
        pc: u8,
        page: u8,
        subpage: u8,
        pointer: u16,
        alloc_len: u16,
    ) -> TaskResult {
        if pc != 1 {
            return bad_cdb(2, Some(7));
        }
        let mut v = vec![0u8; 4];
        match (page, subpage) {
            (0x00, 0x00) => {
                if pointer != 0 {
                    return bad_cdb(5, None);
                }
                v.push(0x00);
                if self.thin {
                    v.push(0x0c);
                }
            }
            (0x00, 0xff) => {
                if pointer != 0 {
                    return bad_cdb(5, None);
                }
                v[0] = 0x40; // SPF
                v[1] = 0xff;
                v.extend_from_slice(&[0x00, 0x00, 0x00, 0xff]);
                if self.thin {
                    v.extend_from_slice(&[0x0c, 0x00]);
                }
            }
            (0x0c, 0x00) if self.thin => {
                if pointer > 0x0002 {
                    return bad_cdb(5, None);
                }
                v[0] = 0x0c;
                if let Some((available, used)) = self.resource_counts() {
                    // SCOPE: the pool is shared (not dedicated to this
                    // LU); what the LU holds is its own.
                    for (code, count, scope) in [(0x0001u16, available, 0b10), (0x0002, used, 0b01)]
                    {
                        if code < pointer {
                            continue;
                        }
                        v.extend_from_slice(&code.to_be_bytes());
                        v.push(0x03); // binary list format
                        v.push(8);
                        v.extend_from_slice(&count.to_be_bytes());
                        v.extend_from_slice(&[scope, 0, 0, 0]);
                    }
                }
            }
            (0x00 | 0x0c, _) => return bad_cdb(3, None),
            _ => return bad_cdb(2, Some(5)),
        }
        let n = (v.len() - 4) as u16;
        v[2..4].copy_from_slice(&n.to_be_bytes());
        data_in(v, usize::from(alloc_len))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_good as good, data as bytes, ready_nexus, run};
    use super::*;
    use crate::backend::MemoryBackend;
    use crate::faulty::{Faults, FaultyBackend};

    /// A thin 8 MiB LU whose backend has `space` bytes left, a soft
    /// threshold of `threshold` bytes available, checked on every write.
    fn thin_lu(space: u64, threshold: Option<u64>) -> (EmulatedLu, Faults) {
        let (b, f) = FaultyBackend::new(Arc::new(MemoryBackend::new(8 << 20)));
        f.space(Some(space));
        let lu = EmulatedLu::new(
            EmulatedLuConfig {
                io_mode: IoMode::Inline,
                soft_threshold: threshold,
                threshold_check_interval: std::time::Duration::ZERO,
                ..EmulatedLuConfig::default()
            },
            Arc::new(b),
        )
        .unwrap();
        (lu, f)
    }

    fn sense(r: &TaskResult) -> Option<Sense> {
        r.sense.as_ref().and_then(|s| Sense::parse(s))
    }

    fn is_threshold_ua(r: &TaskResult) -> bool {
        r.status == Status::CHECK_CONDITION
            && sense(r).is_some_and(|s| {
                s.key == SenseKey::UNIT_ATTENTION
                    && s.asc == asc::THIN_PROVISIONING_SOFT_THRESHOLD_REACHED
            })
    }

    /// WRITE(16) of 512 KiB at `lba`.
    async fn write_half_mib(lu: &EmulatedLu, n: &ItNexus, lba: u64) -> TaskResult {
        let mut c = [0u8; 16];
        c[0] = 0x8a;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&1024u32.to_be_bytes());
        run(lu, n, &c, &vec![0x5a; 512 << 10]).await
    }

    fn log_sense(pc: u8, page: u8, sub: u8, pointer: u16) -> [u8; 10] {
        let mut c = [0u8; 10];
        c[0] = 0x4d;
        c[2] = (pc << 6) | page;
        c[3] = sub;
        c[5..7].copy_from_slice(&pointer.to_be_bytes());
        c[7..9].copy_from_slice(&1024u16.to_be_bytes());
        c
    }

    /// The LBP log page's parameters: (code, count, scope).
    fn lbp_params(page: &[u8]) -> Vec<(u16, u32, u8)> {
        assert_eq!(page[0] & 0x3f, 0x0c);
        let len = usize::from(u16::from_be_bytes([page[2], page[3]]));
        page[4..4 + len]
            .chunks(12)
            .map(|p| {
                assert_eq!((p[2], p[3]), (0x03, 8));
                (
                    u16::from_be_bytes([p[0], p[1]]),
                    u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
                    p[8] & 3,
                )
            })
            .collect()
    }

    /// MODE SENSE(10) of page 1Ch/02h.
    fn lbp_mode_sense(pc: u8) -> [u8; 10] {
        let mut c = [0u8; 10];
        c[0] = 0x5a;
        c[1] = 0x08; // DBD
        c[2] = (pc << 6) | 0x1c;
        c[3] = 0x02;
        c[7..9].copy_from_slice(&512u16.to_be_bytes());
        c
    }

    /// MODE SELECT(10) of a Logical Block Provisioning page.
    async fn select(lu: &EmulatedLu, n: &ItNexus, page: &[u8]) -> TaskResult {
        let mut p = vec![0u8; 8];
        p.extend_from_slice(page);
        let mut c = [0u8; 10];
        c[0] = 0x55;
        c[1] = 0x10; // PF
        c[7..9].copy_from_slice(&(p.len() as u16).to_be_bytes());
        run(lu, n, &c, &p).await
    }

    fn page(situa: bool, d0: u8, resource: u8, count: u32) -> Vec<u8> {
        let mut p = vec![0u8; 24];
        p[0] = 0x5c;
        p[1] = 0x02;
        p[2..4].copy_from_slice(&20u16.to_be_bytes());
        p[4] = u8::from(situa);
        p[16] = d0;
        p[17] = resource;
        p[20..24].copy_from_slice(&count.to_be_bytes());
        p
    }

    /// The LU advertises its threshold (VPD B2h exponent, mode page, log
    /// page); crossing it raises THIN PROVISIONING SOFT THRESHOLD REACHED
    /// for every nexus once; it re-arms when space comes back and fires
    /// again; with SITUA only the writer hears it.
    #[tokio::test]
    async fn a_soft_threshold_warns_every_host_once_and_rearms() {
        let (lu, faults) = thin_lu(4 << 20, Some(3 << 20));
        let a = ready_nexus(&lu, "iqn.a").await;
        let b = ready_nexus(&lu, "iqn.b").await;
        // VPD B2h: threshold sets of 2^11 blocks of 512 bytes (1 MiB).
        let r = run(&lu, &a, &[0x12, 0x01, 0xb2, 0, 64, 0], &[]).await;
        good(&r);
        assert_eq!(bytes(&r)[4], 11);
        // The mode page: enabled, armed decreasing, available, 3 sets.
        let r = run(&lu, &a, &lbp_mode_sense(0), &[]).await;
        good(&r);
        let m = bytes(&r);
        assert_eq!(&m[8..12], &[0x5c, 0x02, 0, 20]);
        assert_eq!((m[8 + 16], m[8 + 17]), (0x80, 0x01));
        assert_eq!(&m[8 + 20..8 + 24], &3u32.to_be_bytes());
        // The log page: 4 sets available (the pool, not dedicated), none
        // used.
        let r = run(&lu, &a, &log_sense(1, 0x0c, 0, 0), &[]).await;
        good(&r);
        assert_eq!(lbp_params(&bytes(&r)), vec![(1, 4, 0b10), (2, 0, 0b01)]);

        // 3.5 and 3 MiB left: not below 3 sets.
        good(&write_half_mib(&lu, &a, 0).await);
        good(&write_half_mib(&lu, &a, 1024).await);
        good(&run(&lu, &b, &[0; 6], &[]).await);
        // 2.5 MiB: below. Every nexus hears it once.
        good(&write_half_mib(&lu, &a, 2048).await);
        assert!(is_threshold_ua(&run(&lu, &a, &[0; 6], &[]).await));
        assert!(is_threshold_ua(&run(&lu, &b, &[0; 6], &[]).await));
        good(&run(&lu, &a, &[0; 6], &[]).await);
        good(&run(&lu, &b, &[0; 6], &[]).await);
        // Still below: no second attention.
        good(&write_half_mib(&lu, &a, 3072).await);
        good(&run(&lu, &b, &[0; 6], &[]).await);
        let r = run(&lu, &a, &log_sense(1, 0x0c, 0, 2), &[]).await;
        assert_eq!(
            lbp_params(&bytes(&r)),
            vec![(2, 2, 0b01)],
            "pointer 2: 2 MiB used"
        );
        // Space comes back (re-armed at the next check), then goes again.
        faults.space(Some(6 << 20));
        good(&write_half_mib(&lu, &a, 4096).await);
        good(&run(&lu, &b, &[0; 6], &[]).await);
        faults.space(Some(1 << 20));
        good(&write_half_mib(&lu, &b, 5120).await);
        assert!(is_threshold_ua(&run(&lu, &a, &[0; 6], &[]).await));
        assert!(is_threshold_ua(&run(&lu, &b, &[0; 6], &[]).await));

        // SITUA: only the nexus whose write crossed it. (The others hear
        // MODE PARAMETERS CHANGED first.)
        faults.space(Some(8 << 20));
        good(&select(&lu, &a, &page(true, 0x80, 0x01, 3)).await);
        let r = run(&lu, &b, &[0; 6], &[]).await;
        assert_eq!(sense(&r).map(|s| s.asc), Some(asc::MODE_PARAMETERS_CHANGED));
        faults.space(Some(1 << 20));
        good(&write_half_mib(&lu, &a, 0).await);
        good(&run(&lu, &b, &[0; 6], &[]).await);
        assert!(is_threshold_ua(&run(&lu, &a, &[0; 6], &[]).await));
    }

    /// An armed-increasing threshold on used resources; a disabled one
    /// never fires; MODE SELECT refuses what the page does not allow,
    /// pointing at the field.
    #[tokio::test]
    async fn thresholds_on_used_space_and_mode_select_refusals() {
        let (lu, faults) = thin_lu(8 << 20, None);
        let a = ready_nexus(&lu, "iqn.a").await;
        // Not configured: disabled.
        let m = bytes(&run(&lu, &a, &lbp_mode_sense(0), &[]).await);
        assert_eq!(m[8 + 16] & 0x80, 0);
        good(&write_half_mib(&lu, &a, 0).await);
        good(&run(&lu, &a, &[0; 6], &[]).await);
        // The changeable mask.
        let m = bytes(&run(&lu, &a, &lbp_mode_sense(1), &[]).await);
        assert_eq!((m[8 + 4], m[8 + 16], m[8 + 17]), (0x01, 0x87, 0xff));
        // Refusals: TYPE hard (001b), ARMING 010b, RESOURCE 03h, a
        // reserved byte, a short page.
        for (p, byte, bit) in [
            (page(false, 0x88, 0x01, 1), 8 + 16, Some(5)),
            (page(false, 0x82, 0x01, 1), 8 + 16, Some(2)),
            (page(false, 0x80, 0x03, 1), 8 + 17, None),
            (
                {
                    let mut p = page(false, 0x80, 0x01, 1);
                    p[9] = 1;
                    p
                },
                8 + 9,
                None,
            ),
        ] {
            let r = select(&lu, &a, &p).await;
            let s = sense(&r).unwrap();
            assert_eq!(
                (s.key, s.asc),
                (
                    SenseKey::ILLEGAL_REQUEST,
                    asc::INVALID_FIELD_IN_PARAMETER_LIST
                ),
                "{p:02x?}"
            );
            let want = Sense::illegal_field(s.asc, false, byte as u16, bit);
            assert_eq!(s.key_specific, want.key_specific, "{p:02x?}");
        }
        // Armed increasing on used: fires once this LU holds more than one
        // set (1 MiB); 512 KiB was written above.
        good(&select(&lu, &a, &page(false, 0x81, 0x02, 1)).await);
        let m = bytes(&run(&lu, &a, &lbp_mode_sense(0), &[]).await);
        assert_eq!((m[8 + 16], m[8 + 17]), (0x81, 0x02));
        good(&write_half_mib(&lu, &a, 1024).await);
        good(&write_half_mib(&lu, &a, 2048).await);
        good(&run(&lu, &a, &[0; 6], &[]).await);
        let r = run(&lu, &a, &log_sense(1, 0x0c, 0, 0), &[]).await;
        assert_eq!(lbp_params(&bytes(&r))[1], (2, 1, 0b01), "1.5 MiB used");
        good(&write_half_mib(&lu, &a, 3072).await);
        assert!(is_threshold_ua(&run(&lu, &a, &[0; 6], &[]).await));
        // Disabled: nothing more, whatever is written.
        faults.space(Some(8 << 20));
        good(&select(&lu, &a, &page(false, 0x01, 0x02, 0)).await);
        good(&write_half_mib(&lu, &a, 4096).await);
        good(&run(&lu, &a, &[0; 6], &[]).await);
    }

    /// LOG SENSE: the supported pages, with and without subpages; only
    /// current cumulative values; a pointer past the last parameter and an
    /// unknown page refused.
    #[tokio::test]
    async fn log_sense_pages_and_refusals() {
        let (lu, _faults) = thin_lu(8 << 20, None);
        let a = ready_nexus(&lu, "iqn.a").await;
        let r = run(&lu, &a, &log_sense(1, 0, 0, 0), &[]).await;
        assert_eq!(bytes(&r), vec![0, 0, 0, 2, 0x00, 0x0c]);
        let r = run(&lu, &a, &log_sense(1, 0, 0xff, 0), &[]).await;
        assert_eq!(bytes(&r), vec![0x40, 0xff, 0, 6, 0, 0, 0, 0xff, 0x0c, 0]);
        for (c, byte, bit) in [
            (log_sense(0, 0x0c, 0, 0), 2, Some(7)),
            (log_sense(1, 0x0c, 0, 3), 5, None),
            (log_sense(1, 0x0d, 0, 0), 2, Some(5)),
            (log_sense(1, 0x0c, 1, 0), 3, None),
        ] {
            let s = sense(&run(&lu, &a, &c, &[]).await).unwrap();
            assert_eq!(
                (s.key, s.asc),
                (SenseKey::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_CDB),
                "{c:02x?}"
            );
            let want = Sense::illegal_field(s.asc, true, byte, bit);
            assert_eq!(s.key_specific, want.key_specific, "{c:02x?}");
        }
    }
}
