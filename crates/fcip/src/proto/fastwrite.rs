//! FastWrite: write acceleration for class 3 FCP writes that cross the
//! tunnel. One WAN round trip per write instead of two.
//!
//! - Near the host ([`HostSide`]): an FCP_CMND for a write leaving
//!   through the tunnel is forwarded marked as accelerated, and the host
//!   at once gets a proxy FCP_XFER_RDY for the whole transfer (as if from
//!   the target), so its data follows the command across. The target's
//!   real XFER_RDYs coming back are swallowed; the FCP_RSP always comes
//!   from the real target, end to end (its RX_ID rewritten to the
//!   proxy's, the one the host knows).
//! - Near the target ([`TargetSide`]): the accelerated command goes to
//!   the target; the data arriving with it is held until the target's
//!   XFER_RDY asks for it, then fed to the target (RX_ID rewritten to
//!   the target's). The XFER_RDY itself never crosses the tunnel.
//!
//! Both tables are bounded (2,048 exchanges by default, and a largest
//! write); a write that does not fit is simply not accelerated. An ABTS
//! drops an exchange's entry (and held data) on both sides; link loss
//! clears both tables ([`HostSide::clear`], [`TargetSide::clear`]).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use unifab_fc::wire::fcp::{FcpCmndRepr, XferRdy, XferRdyRepr};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FCtl, FcType, RCtl};
use unifab_fc::wire::{FcHeaderRepr, FcId, OxId, RxId};

/// Default table size.
pub const DEFAULT_TABLE: usize = 2048;
/// Default largest accelerated write.
pub const DEFAULT_MAX_BYTES: u32 = 1 << 20;

fn is_fcp(h: &FcHeaderRepr, r: RCtl) -> bool {
    h.fc_type == FcType::FCP && h.r_ctl == r
}

fn is_abts(h: &FcHeaderRepr) -> bool {
    h.r_ctl == RCtl::ABTS
}

/// A write command worth accelerating: class 3 FCP_CMND, write only,
/// some data, no task management.
fn write_len(f: &Frame, max: u32) -> Option<u32> {
    if !is_fcp(&f.header, RCtl::FCP_CMND) || !f.sof.is_initiate() && f.sof.0 != 0x2e {
        return None;
    }
    let c = FcpCmndRepr::parse(&f.payload).ok()?;
    (c.wrdata && !c.rddata && c.fcp_dl > 0 && c.fcp_dl <= max && c.tmf.0 == 0).then_some(c.fcp_dl)
}

#[derive(Debug, Clone, Copy)]
struct HostEntry {
    proxy_rx: RxId,
}

/// What the host side wants done with a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostAction {
    /// Send into the tunnel, with record flags.
    Tunnel(Frame, u8),
    /// Hand to the local fabric (the proxy XFER_RDY).
    Fabric(Frame),
}

/// FastWrite near the initiator.
#[derive(Debug)]
pub struct HostSide {
    table: HashMap<(FcId, OxId), HostEntry>,
    cap: usize,
    max_bytes: u32,
    next_rx: u16,
    /// Writes accelerated.
    pub accelerated: u64,
    /// Writes not accelerated because the table was full.
    pub table_full: u64,
}

impl HostSide {
    /// A table of `cap` exchanges, writes up to `max_bytes`.
    pub fn new(cap: usize, max_bytes: u32) -> HostSide {
        HostSide {
            table: HashMap::new(),
            cap,
            max_bytes,
            next_rx: 0x8000,
            accelerated: 0,
            table_full: 0,
        }
    }

    /// Exchanges in the table.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// A frame from the local fabric going into the tunnel.
    pub fn outbound(&mut self, f: Frame) -> Vec<HostAction> {
        let h = f.header;
        let key = (h.s_id, h.ox_id);
        if is_abts(&h) {
            self.table.remove(&key);
            return vec![HostAction::Tunnel(f, 0)];
        }
        let Some(dl) = write_len(&f, self.max_bytes) else {
            return vec![HostAction::Tunnel(f, 0)];
        };
        if self.table.contains_key(&key) {
            return vec![HostAction::Tunnel(f, 0)];
        }
        if self.table.len() >= self.cap {
            self.table_full += 1;
            return vec![HostAction::Tunnel(f, 0)];
        }
        let proxy_rx = RxId(self.next_rx);
        self.next_rx = if self.next_rx >= 0xfffe {
            0x8000
        } else {
            self.next_rx + 1
        };
        self.table.insert(key, HostEntry { proxy_rx });
        self.accelerated += 1;
        let x = XferRdyRepr {
            data_ro: 0,
            burst_len: dl,
        };
        let xh = FcHeaderRepr {
            r_ctl: RCtl::FCP_XFER_RDY,
            d_id: h.s_id,
            s_id: h.d_id,
            fc_type: FcType::FCP,
            f_ctl: FCtl(FCtl::EXCHANGE_CONTEXT | FCtl::END_SEQUENCE | FCtl::SEQUENCE_INITIATIVE),
            seq_id: 0xf0,
            ox_id: h.ox_id,
            rx_id: proxy_rx,
            ..FcHeaderRepr::default()
        };
        let proxy = Frame::new(xh, Bytes::copy_from_slice(&x.to_bytes()));
        vec![
            HostAction::Tunnel(f, crate::wire::enhanced::RECORD_FASTWRITE),
            HostAction::Fabric(proxy),
        ]
    }

    /// A frame from the tunnel going to the local fabric; `None` when it
    /// is swallowed (a real XFER_RDY of an accelerated write).
    pub fn inbound(&mut self, mut f: Frame) -> Option<Frame> {
        let h = f.header;
        let key = (h.d_id, h.ox_id);
        let Some(e) = self.table.get(&key).copied() else {
            return Some(f);
        };
        if is_fcp(&h, RCtl::FCP_XFER_RDY) {
            return None;
        }
        if is_fcp(&h, RCtl::FCP_RSP) || h.r_ctl == RCtl::BA_ACC || h.r_ctl == RCtl::BA_RJT {
            self.table.remove(&key);
        }
        f.header.rx_id = e.proxy_rx;
        Some(f)
    }

    /// Link loss: every accelerated exchange is forgotten (the host's
    /// exchange timeout and ABTS recover them).
    pub fn clear(&mut self) {
        self.table.clear();
    }
}

#[derive(Debug, Default)]
struct TargetEntry {
    /// Data frames waiting for the target's XFER_RDY, by relative offset.
    held: BTreeMap<u32, Frame>,
    held_bytes: usize,
    /// Offset the next frame without a relative offset starts at.
    next_ro: u32,
    /// The target's RX_ID and the ranges it asked for.
    target_rx: Option<RxId>,
    granted: Vec<(u32, u32)>,
    /// A frame of the exchange passed since the last [`TargetSide::sweep`].
    touched: bool,
}

/// How often the tunnel sweeps idle exchanges out of the target side's
/// table ([`TargetSide::sweep`]).
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// FastWrite near the target.
#[derive(Debug)]
pub struct TargetSide {
    table: HashMap<(FcId, OxId), TargetEntry>,
    cap: usize,
    max_bytes: u32,
    /// Bytes held now (all exchanges).
    pub held_bytes: usize,
    /// Accelerated commands refused (table full: the write fails and the
    /// host retries it).
    pub refused: u64,
    /// Exchanges dropped by [`TargetSide::sweep`], with their held data.
    pub swept: u64,
}

impl TargetSide {
    /// A table of `cap` exchanges holding at most `max_bytes` each.
    pub fn new(cap: usize, max_bytes: u32) -> TargetSide {
        TargetSide {
            table: HashMap::new(),
            cap,
            max_bytes,
            held_bytes: 0,
            refused: 0,
            swept: 0,
        }
    }

    /// Drops the exchanges no frame has passed for since the last sweep,
    /// with the data they hold; returns how many. Called every
    /// `SWEEP_EVERY`, it ends an exchange idle for one to two intervals:
    /// the host's command timed out and was aborted long before, and an
    /// ABTS or FCP_RSP that never came (a target gone quiet, a peer that
    /// sends commands for ports that do not exist) cannot pin the memory.
    pub fn sweep(&mut self) -> usize {
        let before = self.table.len();
        let mut freed = 0;
        self.table.retain(|_, e| {
            let keep = std::mem::take(&mut e.touched);
            if !keep {
                freed += e.held_bytes;
            }
            keep
        });
        self.held_bytes -= freed;
        let n = before - self.table.len();
        self.swept += n as u64;
        n
    }

    /// Exchanges in the table.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn granted(e: &TargetEntry, ro: u32) -> bool {
        e.granted
            .iter()
            .any(|(s, l)| ro >= *s && ro < s.saturating_add(*l))
    }

    /// A frame from the tunnel going to the target, with its record
    /// flags; returns what to hand to the local fabric now.
    pub fn inbound(&mut self, mut f: Frame, flags: u8) -> Vec<Frame> {
        let h = f.header;
        let key = (h.s_id, h.ox_id);
        if is_abts(&h) {
            if let Some(e) = self.table.remove(&key) {
                self.held_bytes -= e.held_bytes;
            }
            return vec![f];
        }
        if flags & crate::wire::enhanced::RECORD_FASTWRITE != 0 && is_fcp(&h, RCtl::FCP_CMND) {
            if self.table.len() < self.cap && write_len(&f, self.max_bytes).is_some() {
                self.table.insert(
                    key,
                    TargetEntry {
                        touched: true,
                        ..TargetEntry::default()
                    },
                );
            } else {
                self.refused += 1;
            }
            return vec![f];
        }
        let Some(e) = self.table.get_mut(&key) else {
            return vec![f];
        };
        e.touched = true;
        if !is_fcp(&h, RCtl::FCP_DATA) {
            return vec![f];
        }
        let ro = if h.f_ctl.relative_offset_present() {
            h.parameter
        } else {
            e.next_ro
        };
        e.next_ro = ro.saturating_add(u32::try_from(f.payload.len()).unwrap_or(u32::MAX));
        match e.target_rx {
            Some(rx) if Self::granted(e, ro) => {
                f.header.rx_id = rx;
                vec![f]
            }
            _ => {
                let n = f.payload.len();
                if e.held_bytes + n > self.max_bytes as usize {
                    // More than the command announced: let the target judge it.
                    return vec![f];
                }
                e.held_bytes += n;
                self.held_bytes += n;
                e.held.insert(ro, f);
                Vec::new()
            }
        }
    }

    /// A frame from the target going into the tunnel. Returns
    /// `(to_tunnel, to_fabric)`: a real XFER_RDY of an accelerated write
    /// stays here and releases the held data it asks for.
    pub fn outbound(&mut self, f: Frame) -> (Option<Frame>, Vec<Frame>) {
        let h = f.header;
        let key = (h.d_id, h.ox_id);
        let Some(e) = self.table.get_mut(&key) else {
            return (Some(f), Vec::new());
        };
        e.touched = true;
        if is_fcp(&h, RCtl::FCP_XFER_RDY) {
            let Ok(v) = XferRdy::new_checked(&f.payload[..]) else {
                return (Some(f), Vec::new());
            };
            let x = XferRdyRepr::parse(&v);
            e.target_rx = Some(h.rx_id);
            e.granted.push((x.data_ro, x.burst_len));
            let end = x.data_ro.saturating_add(x.burst_len);
            let keys: Vec<u32> = e.held.range(x.data_ro..end).map(|(k, _)| *k).collect();
            let mut out = Vec::with_capacity(keys.len());
            for k in keys {
                if let Some(mut d) = e.held.remove(&k) {
                    e.held_bytes -= d.payload.len();
                    self.held_bytes -= d.payload.len();
                    d.header.rx_id = h.rx_id;
                    out.push(d);
                }
            }
            return (None, out);
        }
        if (is_fcp(&h, RCtl::FCP_RSP) || h.r_ctl == RCtl::BA_ACC || h.r_ctl == RCtl::BA_RJT)
            && let Some(e) = self.table.remove(&key)
        {
            self.held_bytes -= e.held_bytes;
        }
        (Some(f), Vec::new())
    }

    /// Forgets exchange (`s_id`, `ox_id`) with the data it holds (a
    /// command tape pipelining discarded).
    pub fn forget(&mut self, s_id: FcId, ox_id: OxId) {
        if let Some(e) = self.table.remove(&(s_id, ox_id)) {
            self.held_bytes -= e.held_bytes;
        }
    }

    /// Link loss: held data is dropped.
    pub fn clear(&mut self) {
        self.table.clear();
        self.held_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use unifab_fc::wire::fcp::{FcpTaskAttr, FcpTmf};
    use unifab_scsi_core::Lun;

    const HOST: FcId = FcId::new(0x010100);
    const TGT: FcId = FcId::new(0x020100);

    fn cmnd(dl: u32) -> Frame {
        let c = FcpCmndRepr {
            lun: Lun::ZERO,
            crn: 0,
            priority: 0,
            task_attribute: FcpTaskAttr::SIMPLE,
            tmf: FcpTmf(0),
            rddata: false,
            wrdata: true,
            cdb: Bytes::from_static(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0]),
            fcp_dl: dl,
            bidirectional_read_dl: None,
        };
        let h = FcHeaderRepr {
            r_ctl: RCtl::FCP_CMND,
            d_id: TGT,
            s_id: HOST,
            fc_type: FcType::FCP,
            f_ctl: FCtl::request(),
            ox_id: OxId(7),
            rx_id: RxId::UNASSIGNED,
            ..FcHeaderRepr::default()
        };
        let mut b = vec![0u8; c.buffer_len()];
        c.emit(&mut b).unwrap();
        Frame::new(h, Bytes::from(b))
    }

    fn data(rx: RxId, ro: u32, n: usize) -> Frame {
        let h = FcHeaderRepr {
            r_ctl: RCtl::FCP_DATA,
            d_id: TGT,
            s_id: HOST,
            fc_type: FcType::FCP,
            f_ctl: FCtl(FCtl::RELATIVE_OFFSET),
            ox_id: OxId(7),
            rx_id: rx,
            parameter: ro,
            ..FcHeaderRepr::default()
        };
        Frame::new(h, Bytes::from(vec![ro as u8; n]))
    }

    fn from_target(r: RCtl, payload: Bytes) -> Frame {
        let h = FcHeaderRepr {
            r_ctl: r,
            d_id: HOST,
            s_id: TGT,
            fc_type: FcType::FCP,
            ox_id: OxId(7),
            rx_id: RxId(0x42),
            ..FcHeaderRepr::default()
        };
        Frame::new(h, payload)
    }

    #[test]
    fn a_write_crosses_in_one_trip_and_status_is_end_to_end() {
        let mut host = HostSide::new(DEFAULT_TABLE, DEFAULT_MAX_BYTES);
        let mut tgt = TargetSide::new(DEFAULT_TABLE, DEFAULT_MAX_BYTES);
        let acts = host.outbound(cmnd(4096));
        let [HostAction::Tunnel(c, fl), HostAction::Fabric(proxy)] = &acts[..] else {
            panic!("{acts:?}")
        };
        assert_eq!(proxy.header.r_ctl, RCtl::FCP_XFER_RDY);
        assert_eq!((proxy.header.s_id, proxy.header.d_id), (TGT, HOST));
        let prx = proxy.header.rx_id;
        // At the far side: the command passes, the data is held.
        assert_eq!(tgt.inbound(c.clone(), *fl).len(), 1);
        assert!(tgt.inbound(data(prx, 0, 2048), 0).is_empty());
        assert!(tgt.inbound(data(prx, 2048, 2048), 0).is_empty());
        assert_eq!(tgt.held_bytes, 4096);
        // The target asks for the first half, then the rest.
        let x = |ro, len| {
            XferRdyRepr {
                data_ro: ro,
                burst_len: len,
            }
            .to_bytes()
        };
        let (up, fed) = tgt.outbound(from_target(
            RCtl::FCP_XFER_RDY,
            Bytes::copy_from_slice(&x(0, 2048)),
        ));
        assert!(up.is_none());
        assert_eq!(fed.len(), 1);
        assert_eq!(fed[0].header.rx_id, RxId(0x42));
        let (_, fed) = tgt.outbound(from_target(
            RCtl::FCP_XFER_RDY,
            Bytes::copy_from_slice(&x(2048, 2048)),
        ));
        assert_eq!(fed.len(), 1);
        assert_eq!(tgt.held_bytes, 0);
        // The response travels back and reaches the host with the proxy RX_ID.
        let (rsp, _) = tgt.outbound(from_target(RCtl::FCP_RSP, Bytes::from(vec![0; 24])));
        let rsp = rsp.unwrap();
        assert!(tgt.is_empty());
        // A stray real XFER_RDY at the host side is swallowed.
        assert!(
            host.inbound(from_target(
                RCtl::FCP_XFER_RDY,
                Bytes::copy_from_slice(&x(0, 4096))
            ))
            .is_none()
        );
        let got = host.inbound(rsp).unwrap();
        assert_eq!(got.header.rx_id, prx);
        assert!(host.is_empty());
    }

    #[test]
    fn table_bounds_and_abts() {
        let mut host = HostSide::new(1, DEFAULT_MAX_BYTES);
        assert_eq!(host.outbound(cmnd(512)).len(), 2);
        let mut second = cmnd(512);
        second.header.ox_id = OxId(8);
        assert_eq!(
            host.outbound(second).len(),
            1,
            "table full: not accelerated"
        );
        assert_eq!(host.table_full, 1);
        assert_eq!(host.outbound(cmnd(DEFAULT_MAX_BYTES + 1)).len(), 1);
        let mut abts = cmnd(0);
        abts.header.r_ctl = RCtl::ABTS;
        abts.header.fc_type = FcType::BLS;
        host.outbound(abts.clone());
        assert!(host.is_empty());
        let mut tgt = TargetSide::new(4, DEFAULT_MAX_BYTES);
        tgt.inbound(cmnd(4096), crate::wire::enhanced::RECORD_FASTWRITE);
        tgt.inbound(data(RxId(1), 0, 1024), 0);
        assert_eq!(tgt.held_bytes, 1024);
        tgt.inbound(abts, 0);
        assert_eq!((tgt.len(), tgt.held_bytes), (0, 0));
    }

    /// An accelerated write whose exchange goes quiet (no XFER_RDY, no
    /// FCP_RSP, no ABTS ever) is swept out with its data on the second
    /// sweep; one that saw a frame in between stays.
    #[test]
    fn idle_exchanges_are_swept_with_their_data() {
        let mut tgt = TargetSide::new(4, DEFAULT_MAX_BYTES);
        let mut quiet = cmnd(4096);
        quiet.header.ox_id = OxId(21);
        let mut q_data = data(RxId(1), 0, 2048);
        q_data.header.ox_id = OxId(21);
        tgt.inbound(quiet, crate::wire::enhanced::RECORD_FASTWRITE);
        tgt.inbound(q_data, 0);
        tgt.inbound(cmnd(4096), crate::wire::enhanced::RECORD_FASTWRITE);
        tgt.inbound(data(RxId(1), 0, 1024), 0);
        assert_eq!((tgt.len(), tgt.held_bytes), (2, 3072));
        // Both were active since they began: the first sweep keeps them.
        assert_eq!(tgt.sweep(), 0);
        // One more frame for the second exchange only.
        tgt.inbound(data(RxId(1), 1024, 1024), 0);
        assert_eq!(tgt.sweep(), 1);
        assert_eq!((tgt.len(), tgt.held_bytes, tgt.swept), (1, 2048, 1));
        assert_eq!(tgt.sweep(), 1);
        assert_eq!((tgt.len(), tgt.held_bytes), (0, 0));
    }
}
