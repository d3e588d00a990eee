//! The FCP target engine (FCP-4 §6–§9, §12): FCP_CMND becomes a
//! scsi-core [`Task`] ([`NPortEvent::Execute`]); write data is solicited
//! with one FCP_XFER_RDY per burst and reassembled by relative offset
//! without copying (the task's data-out is the list of received frame
//! payloads, in offset order); the task's result goes back as FCP_DATA
//! frames and an FCP_RSP with residuals and sense. Task management comes
//! as FCP_CMND task management flags or as ABTS (ABORT TASK).
//!
//! Decisions:
//!
//! - All of FCP_DL is solicited, as iSCSI solicits the expected data
//!   transfer length; the device server decides what it uses and reports
//!   the residual.
//! - Data-in frames carry at most the initiator's receive data field size.
//! - A data frame outside the burst asked for ends the command with
//!   FCP_RSP_CODE 3 (FCP_DATA_RO mismatch); a burst that does not arrive
//!   within 2 × R_A_TOV is dropped.
//! - After an ABTS the exchange sends nothing more; BA_ACC goes out once
//!   the LU has ended the task (or at once if the task never started).

use std::collections::VecDeque;
use std::time::Instant;
use unifab_scsi_core::idmap::IdMap;

use bytes::{Bytes, BytesMut};
use unifab_scsi_core::sense::asc;
use unifab_scsi_core::{
    Cdb, ItNexus, Residual, Sense, SenseKey, Status, Task, TaskAttr, TaskResult, TmfFunction,
    TmfRequest, TmfResponse,
};

use super::budget::{LinkBudget, Room, Ticket};
use super::{NPort, NPortEvent};
use crate::compose::Route;
use crate::wire::bls::{BaAcc, BlsRepr};
use crate::wire::els::RecAcc;
use crate::wire::fcp::{
    FcpCmndRepr, FcpRspCode, FcpRspFlags, FcpRspRepr, FcpTaskAttr, FcpTmf, XferRdyRepr,
};
use crate::wire::frame::Frame;
use crate::wire::header::{FCtl, FcHeaderRepr, FcType, RCtl};
use crate::wire::{FcId, OxId, RxId};

/// Identifies a task or task management function the target engine handed
/// to its driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u64);

#[derive(Debug)]
enum XState {
    /// A write the write-data budget cannot take yet: queued, nothing
    /// asked for (the FCP_XFER_RDY goes out when the budget frees).
    Waiting,
    /// Waiting for data-out of the burst `[start, end)`.
    Receiving {
        segs: Pieces,
        got: u32,
        start: u32,
        end: u32,
        deadline: Instant,
    },
    /// Handed to the LU.
    Running,
}

#[derive(Debug)]
struct Exchange {
    id: u64,
    rx: RxId,
    nexus: ItNexus,
    cmnd: FcpCmndRepr,
    read_len: u32,
    write_len: u32,
    /// Bytes of data-out received so far (for REC).
    transferred: u32,
    state: XState,
    /// An ABTS arrived: nothing more is sent on this exchange.
    aborted: bool,
    /// Data-out collected over earlier bursts.
    done: Vec<(u32, Bytes)>,
    /// A waiting write's place in the link's line.
    ticket: Option<Ticket>,
    /// An admitted write's data still to come, held in the link's budget
    /// (`max_write_in_flight`) and given back as it comes.
    room: Option<Room>,
}

#[derive(Debug, Clone, Copy)]
enum PendingTmf {
    /// Task management flags in an FCP_CMND: answered with FCP_RSP.
    Fcp { peer: FcId, ox: OxId, rx: RxId },
    /// ABTS: answered with BA_ACC.
    Abts { peer: FcId, ox: OxId, rx: RxId },
}

/// Data frames with payloads shorter than this are copied together with
/// the one before them when their relative offsets follow on, instead of
/// each being kept as its own buffer: a peer sending a write's data four
/// bytes per frame would otherwise make the port keep a buffer and an
/// entry (~100 bytes) per four bytes, far more than the write budget
/// counts. Full frames (2,048 bytes, as every HBA sends) stay zero-copy.
const GATHER_BELOW: usize = 512;

/// The most separate pieces a burst of `len` bytes may arrive in: one
/// per 512 bytes, and a few more. Small frames that follow on are
/// gathered into one piece, so only a sender that scatters small frames
/// out of offset order comes near it.
fn max_pieces(len: u32) -> usize {
    len as usize / GATHER_BELOW + 8
}

/// The data-out of one burst as it arrives: pieces in arrival order, with
/// small frames that follow on from the piece before gathered into it.
#[derive(Debug, Default)]
struct Pieces {
    kept: Vec<(u32, Bytes)>,
    /// Small payloads gathered since the last kept piece: the offset of
    /// the first and the bytes.
    gather: Option<(u32, BytesMut)>,
}

impl Pieces {
    fn push(&mut self, ro: u32, payload: Bytes) {
        if payload.len() < GATHER_BELOW {
            if let Some((o, b)) = &mut self.gather
                && u64::from(*o) + b.len() as u64 == u64::from(ro)
            {
                b.extend_from_slice(&payload);
                return;
            }
            self.flush();
            self.gather = Some((ro, BytesMut::from(&payload[..])));
        } else {
            self.flush();
            self.kept.push((ro, payload));
        }
    }

    fn flush(&mut self) {
        if let Some((o, b)) = self.gather.take() {
            self.kept.push((o, b.freeze()));
        }
    }

    /// Pieces held now.
    fn count(&self) -> usize {
        self.kept.len() + usize::from(self.gather.is_some())
    }

    /// Every piece, in arrival order.
    fn take(&mut self) -> Vec<(u32, Bytes)> {
        self.flush();
        std::mem::take(&mut self.kept)
    }
}

/// Write data one N_Port's open exchanges may hold by default
/// (`NPortConfig::max_write_held`; FCP_DL summed over write commands
/// whose data has been asked for and that are not yet answered): 256 MiB.
/// A write that would pass the bound waits, in arrival order, without an
/// FCP_XFER_RDY until answered writes give their share back (as an iSCSI
/// target defers R2T), so the host sees latency, not an error; a waiting
/// write holds its command only. A single write larger than the whole
/// bound is refused with ILLEGAL REQUEST, INVALID FIELD IN CDB (an LU
/// would refuse it too, but only after all its data had come). Without the
/// bound a peer could make the port hold up to `max_exchanges` × 4 GiB.
pub const MAX_WRITE_HELD: u64 = 256 << 20;

/// The target engine's state (part of an [`NPort`]).
#[derive(Debug)]
pub struct TargetEngine {
    max_burst: u32,
    /// Write data the admitted exchanges may still bring (their FCP_DLs),
    /// bounded by `max_write_held`.
    write_held: u64,
    max_write_held: u64,
    /// Write data the admitted exchanges have yet to receive.
    to_come: u64,
    /// The link's budget for `NPortConfig::max_write_in_flight`.
    budget: Option<LinkBudget>,
    /// [`LinkBudget::freed`] when this port last looked for room.
    seen_freed: u64,
    /// Writes waiting for the budget ([`XState::Waiting`]), oldest first.
    waiting: VecDeque<(FcId, OxId)>,
    next_id: u64,
    exchanges: IdMap<(FcId, OxId), Exchange>,
    by_id: IdMap<u64, (FcId, OxId)>,
    tmfs: IdMap<u64, PendingTmf>,
}

impl TargetEngine {
    pub(crate) fn new(
        max_burst: u32,
        max_write_held: u64,
        budget: Option<LinkBudget>,
    ) -> TargetEngine {
        TargetEngine {
            max_burst: max_burst.max(512),
            write_held: 0,
            max_write_held,
            to_come: 0,
            seen_freed: budget.as_ref().map_or(0, LinkBudget::freed),
            budget,
            waiting: VecDeque::new(),
            next_id: 1,
            exchanges: IdMap::default(),
            by_id: IdMap::default(),
            tmfs: IdMap::default(),
        }
    }

    /// Commands the engine holds (receiving data or running).
    pub fn open_exchanges(&self) -> usize {
        self.exchanges.len()
    }

    /// Bytes of write data its admitted exchanges account for (received or
    /// still to come).
    pub fn write_bytes_held(&self) -> u64 {
        self.write_held
    }

    /// Write commands waiting for the write-data budget.
    pub fn writes_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Removes an exchange and gives back its share of the write budget
    /// (or its place in the queue for it).
    fn remove(&mut self, key: &(FcId, OxId)) -> Option<Exchange> {
        let x = self.exchanges.remove(key)?;
        self.by_id.remove(&x.id);
        if matches!(x.state, XState::Waiting) {
            self.waiting.retain(|k| k != key);
        } else {
            self.write_held = self.write_held.saturating_sub(u64::from(x.write_len));
            let missing = x.write_len.saturating_sub(x.transferred);
            self.to_come = self.to_come.saturating_sub(u64::from(missing));
        }
        Some(x)
    }

    /// Write data the admitted exchanges have yet to receive, at most
    /// `NPortConfig::max_write_in_flight` (one write alone may pass it).
    pub fn write_bytes_to_come(&self) -> u64 {
        self.to_come
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.exchanges
            .values()
            .filter_map(|x| match x.state {
                XState::Receiving { deadline, .. } => Some(deadline),
                XState::Waiting | XState::Running => None,
            })
            .min()
    }

    fn alloc_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }
}

fn attr(a: FcpTaskAttr) -> TaskAttr {
    match a {
        FcpTaskAttr::HEAD_OF_QUEUE => TaskAttr::HeadOfQueue,
        FcpTaskAttr::ORDERED => TaskAttr::Ordered,
        FcpTaskAttr::ACA => TaskAttr::Aca,
        _ => TaskAttr::Simple,
    }
}

fn tmf_function(t: FcpTmf) -> Option<TmfFunction> {
    Some(match t {
        FcpTmf::ABORT_TASK_SET => TmfFunction::AbortTaskSet,
        FcpTmf::CLEAR_TASK_SET => TmfFunction::ClearTaskSet,
        FcpTmf::LOGICAL_UNIT_RESET => TmfFunction::LogicalUnitReset,
        FcpTmf::TARGET_RESET => TmfFunction::TargetReset,
        FcpTmf::CLEAR_ACA => TmfFunction::ClearAca,
        _ => return None,
    })
}

fn rsp_code(r: TmfResponse) -> FcpRspCode {
    match r {
        TmfResponse::FunctionComplete => FcpRspCode::COMPLETE,
        TmfResponse::FunctionSucceeded => FcpRspCode::TMF_SUCCEEDED,
        TmfResponse::FunctionRejected => FcpRspCode::TMF_NOT_SUPPORTED,
        TmfResponse::IncorrectLun => FcpRspCode::TMF_INCORRECT_LUN,
        TmfResponse::ServiceDeliveryFailure => FcpRspCode::TMF_FAILED,
    }
}

fn fcp_header(
    me: FcId,
    peer: FcId,
    ox: OxId,
    rx: RxId,
    r_ctl: RCtl,
    f_ctl: FCtl,
    seq_id: u8,
) -> FcHeaderRepr {
    FcHeaderRepr {
        r_ctl,
        d_id: peer,
        cs_ctl: 0,
        s_id: me,
        fc_type: FcType::FCP,
        f_ctl,
        seq_id,
        df_ctl: 0,
        seq_cnt: 0,
        ox_id: ox,
        rx_id: rx,
        parameter: 0,
    }
}

impl NPort {
    fn target_rsp(&mut self, peer: FcId, ox: OxId, rx: RxId, rsp: &FcpRspRepr) {
        let seq = self.next_seq_id();
        let h = fcp_header(
            self.fc_id,
            peer,
            ox,
            rx,
            RCtl::FCP_RSP,
            FCtl::last_reply(),
            seq,
        );
        if let Ok(b) = rsp.to_bytes() {
            self.send(Frame::new(h, b));
        }
    }

    fn target_xfer_rdy(&mut self, peer: FcId, ox: OxId, rx: RxId, ro: u32, len: u32) {
        let seq = self.next_seq_id();
        let f = FCtl(FCtl::EXCHANGE_CONTEXT | FCtl::END_SEQUENCE | FCtl::SEQUENCE_INITIATIVE);
        let h = fcp_header(self.fc_id, peer, ox, rx, RCtl::FCP_XFER_RDY, f, seq);
        let x = XferRdyRepr {
            data_ro: ro,
            burst_len: len,
        };
        self.send(Frame::new(h, Bytes::copy_from_slice(&x.to_bytes())));
    }

    pub(super) fn target_command(&mut self, now: Instant, frame: Frame) {
        let h = frame.header;
        let peer = h.s_id;
        let Some(nexus) = self
            .remotes
            .get(&peer)
            .filter(|r| r.ready())
            .and_then(|r| r.nexus.clone())
        else {
            self.stats.discarded += 1;
            return;
        };
        if !self.cfg.target || self.target.exchanges.contains_key(&(peer, h.ox_id)) {
            self.stats.discarded += 1;
            return;
        }
        let Ok(rx) = self.xm.alloc_rx(peer, h.ox_id) else {
            // Out of exchanges: the command is refused with BUSY.
            let rsp = FcpRspRepr {
                scsi_status: unifab_scsi_core::Status::BUSY.0,
                ..FcpRspRepr::default()
            };
            self.target_rsp(peer, h.ox_id, RxId::UNASSIGNED, &rsp);
            return;
        };
        let cmnd = match FcpCmndRepr::parse(&frame.payload) {
            Ok(c) => c,
            Err(_) => {
                let rsp = FcpRspRepr::tmf(FcpRspCode::INVALID_CMND_FIELDS);
                self.target_rsp(peer, h.ox_id, rx, &rsp);
                self.xm.close_rx(peer, h.ox_id);
                return;
            }
        };
        let id = self.target.alloc_id();
        if cmnd.tmf != FcpTmf::NONE {
            let Some(function) = tmf_function(cmnd.tmf) else {
                let rsp = FcpRspRepr::tmf(FcpRspCode::TMF_NOT_SUPPORTED);
                self.target_rsp(peer, h.ox_id, rx, &rsp);
                self.xm.close_rx(peer, h.ox_id);
                return;
            };
            // Writes still collecting data, or waiting to, are tasks the
            // LU has not seen yet: the function ends those in its scope here.
            self.target_drop_unstarted(now, &nexus, cmnd.lun, &function);
            self.target.tmfs.insert(
                id,
                PendingTmf::Fcp {
                    peer,
                    ox: h.ox_id,
                    rx,
                },
            );
            self.event(NPortEvent::TaskManagement {
                id: TaskId(id),
                request: TmfRequest {
                    nexus,
                    lun: cmnd.lun,
                    function,
                },
            });
            return;
        }
        let (read_len, write_len) = match (cmnd.rddata, cmnd.wrdata) {
            (true, false) => (cmnd.fcp_dl, 0),
            (false, true) => (0, cmnd.fcp_dl),
            (true, true) => (cmnd.bidirectional_read_dl.unwrap_or(0), cmnd.fcp_dl),
            (false, false) => (0, 0),
        };
        // Bounded memory per port: a write larger than the whole budget is
        // refused before any data is asked for.
        if u64::from(write_len) > self.target.max_write_held {
            let sense = Sense::new(SenseKey::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_CDB);
            let rsp = FcpRspRepr {
                scsi_status: Status::CHECK_CONDITION.0,
                sense: Bytes::copy_from_slice(&sense.to_fixed()),
                ..FcpRspRepr::default()
            };
            self.stats.write_refusals += 1;
            self.target_rsp(peer, h.ox_id, rx, &rsp);
            self.xm.close_rx(peer, h.ox_id);
            return;
        }
        let mut x = Exchange {
            id,
            rx,
            nexus,
            cmnd,
            read_len,
            write_len,
            transferred: 0,
            state: XState::Running,
            aborted: false,
            done: Vec::new(),
            ticket: None,
            room: None,
        };
        self.target.by_id.insert(id, (peer, h.ox_id));
        if write_len > 0 {
            // Queued behind any write already waiting, so a stream of
            // small writes cannot starve a large one.
            x.state = XState::Waiting;
            self.target.exchanges.insert((peer, h.ox_id), x);
            self.target.waiting.push_back((peer, h.ox_id));
            self.target_admit_writes(now);
            if self.target.waiting.back() == Some(&(peer, h.ox_id)) {
                self.stats.writes_deferred += 1;
            }
        } else {
            let task = make_task(&x, Vec::new(), h.ox_id);
            self.target.exchanges.insert((peer, h.ox_id), x);
            self.event(NPortEvent::Execute {
                id: TaskId(id),
                task,
            });
        }
    }
}

impl NPort {
    /// Asks for the data of waiting writes, oldest first, while the
    /// write-data budget has room for the next one.
    fn target_admit_writes(&mut self, now: Instant) {
        while let Some(&key) = self.target.waiting.front() {
            let t = &mut self.target;
            let Some(x) = t.exchanges.get_mut(&key) else {
                t.waiting.pop_front();
                continue;
            };
            let len = u64::from(x.write_len);
            if t.write_held + len > t.max_write_held {
                return;
            }
            if let Some(b) = &t.budget {
                // One write alone on the link always goes. A write that
                // has to wait for the link takes its place in line across
                // the link's ports (only then: the writes behind it on
                // this port wait behind it here).
                let Some(room) = b.take(len, x.ticket.as_ref()) else {
                    x.ticket.get_or_insert_with(|| b.ticket());
                    return;
                };
                x.room = Some(room);
                x.ticket = None;
            }
            t.waiting.pop_front();
            t.write_held += len;
            t.to_come += len;
            let end = x.write_len.min(t.max_burst);
            x.state = XState::Receiving {
                segs: Pieces::default(),
                got: 0,
                start: 0,
                end,
                deadline: now + self.cfg.timeouts.els_timeout(),
            };
            let rx = x.rx;
            self.target_xfer_rdy(key.0, key.1, rx, 0, end);
        }
    }

    /// Ends, without a response, the writes in a task management
    /// function's scope that the LU has not been given yet (collecting
    /// their data or waiting to): SAM aborts them with the rest of the
    /// task set, and the initiator ends its side when the function's
    /// response comes.
    fn target_drop_unstarted(
        &mut self,
        now: Instant,
        nexus: &ItNexus,
        lun: unifab_scsi_core::Lun,
        function: &TmfFunction,
    ) {
        let in_scope = |x: &Exchange| match function {
            TmfFunction::AbortTaskSet => x.nexus.id() == nexus.id() && x.cmnd.lun == lun,
            TmfFunction::ClearTaskSet | TmfFunction::LogicalUnitReset => x.cmnd.lun == lun,
            TmfFunction::TargetReset => true,
            _ => false,
        };
        self.target_drop_where(now, |x| !matches!(x.state, XState::Running) && in_scope(x));
    }

    /// Ends the exchanges `pred` picks without a response, holds their
    /// RX_IDs for late frames, and lets waiting writes into the budget
    /// they gave back.
    fn target_drop_where(&mut self, now: Instant, pred: impl Fn(&Exchange) -> bool) {
        let keys: Vec<(FcId, OxId)> = self
            .target
            .exchanges
            .iter()
            .filter(|(_, x)| pred(x))
            .map(|(k, _)| *k)
            .collect();
        for (peer, ox) in keys {
            self.target.remove(&(peer, ox));
            self.xm.hold_rx(now, peer, ox);
        }
        self.target_admit_writes(now);
    }
}

fn make_task(x: &Exchange, data_out: Vec<Bytes>, ox: OxId) -> Task {
    Task::new(
        x.nexus.clone(),
        x.cmnd.lun,
        u64::from(ox.0),
        Cdb::new(x.cmnd.cdb.clone()),
    )
    .with_attr(attr(x.cmnd.task_attribute))
    .with_priority(x.cmnd.priority)
    .with_data_out(data_out, x.write_len)
    .with_data_in(x.read_len)
}

impl NPort {
    pub(super) fn target_data(&mut self, now: Instant, frame: Frame) {
        self.target_data_frame(now, frame);
        // Data that came makes room under `max_write_in_flight`.
        if self.target.budget.is_some() && !self.target.waiting.is_empty() {
            self.target_admit_writes(now);
        }
    }

    /// Admits waiting writes if room was given back on the link (by this
    /// port or another sharing its budget) since the port last looked.
    pub(super) fn target_room_freed(&mut self, now: Instant) {
        let Some(b) = &self.target.budget else {
            return;
        };
        if self.target.waiting.is_empty() {
            return;
        }
        let f = b.freed();
        if std::mem::replace(&mut self.target.seen_freed, f) != f {
            self.target_admit_writes(now);
        }
    }

    fn target_data_frame(&mut self, now: Instant, frame: Frame) {
        let h = frame.header;
        let key = (h.s_id, h.ox_id);
        let Some(x) = self.target.exchanges.get_mut(&key) else {
            self.stats.discarded += 1;
            return;
        };
        let state = &mut x.state;
        if matches!(state, XState::Waiting) {
            // Data nobody asked for yet.
            let (peer, ox, rx) = (h.s_id, h.ox_id, x.rx);
            self.target_fail(now, peer, ox, rx, FcpRspCode::DATA_RO_MISMATCH);
            return;
        }
        let XState::Receiving {
            segs,
            got,
            start,
            end,
            ..
        } = state
        else {
            self.stats.discarded += 1;
            return;
        };
        let len = u32::try_from(frame.payload.len()).unwrap_or(u32::MAX);
        let ro = if h.f_ctl.relative_offset_present() {
            h.parameter
        } else {
            *start + *got
        };
        let fits = ro >= *start && ro.checked_add(len).is_some_and(|e| e <= *end);
        if !fits || len == 0 {
            let (peer, ox, rx) = (h.s_id, h.ox_id, x.rx);
            self.target_fail(now, peer, ox, rx, FcpRspCode::DATA_RO_MISMATCH);
            return;
        }
        segs.push(ro, frame.payload);
        if segs.count() > max_pieces(*end - *start) {
            // Scattered this finely, the burst's bookkeeping would outgrow
            // its data: refused like an offset that does not fit.
            let (peer, ox, rx) = (h.s_id, h.ox_id, x.rx);
            self.target_fail(now, peer, ox, rx, FcpRspCode::DATA_RO_MISMATCH);
            return;
        }
        *got += len;
        x.transferred = x.transferred.saturating_add(len);
        if let Some(r) = x.room.as_mut() {
            r.give_back(u64::from(len));
        }
        self.target.to_come = self.target.to_come.saturating_sub(u64::from(len));
        if *got < *end - *start {
            return;
        }
        // The burst is complete: check it covers [start, end) exactly.
        let mut burst = segs.take();
        burst.sort_by_key(|(o, _)| *o);
        let mut at = *start;
        let mut exact = true;
        for (o, b) in &burst {
            if *o != at {
                exact = false;
                break;
            }
            at += b.len() as u32;
        }
        let burst_end = *end;
        if !exact || at != burst_end {
            let (peer, ox, rx) = (h.s_id, h.ox_id, x.rx);
            self.target_fail(now, peer, ox, rx, FcpRspCode::DATA_RO_MISMATCH);
            return;
        }
        x.done.extend(burst);
        if burst_end < x.write_len {
            let next_end = x
                .write_len
                .min(burst_end.saturating_add(self.target.max_burst));
            x.state = XState::Receiving {
                segs: Pieces::default(),
                got: 0,
                start: burst_end,
                end: next_end,
                deadline: now + self.cfg.timeouts.els_timeout(),
            };
            let rx = x.rx;
            self.target_xfer_rdy(h.s_id, h.ox_id, rx, burst_end, next_end - burst_end);
            return;
        }
        x.state = XState::Running;
        let data: Vec<Bytes> = std::mem::take(&mut x.done)
            .into_iter()
            .map(|(_, b)| b)
            .collect();
        let id = x.id;
        let task = make_task(x, data, h.ox_id);
        self.event(NPortEvent::Execute {
            id: TaskId(id),
            task,
        });
    }

    /// Ends a command that broke the data protocol.
    fn target_fail(&mut self, now: Instant, peer: FcId, ox: OxId, rx: RxId, code: FcpRspCode) {
        self.target.remove(&(peer, ox));
        self.target_rsp(peer, ox, rx, &FcpRspRepr::tmf(code));
        self.xm.close_rx(peer, ox);
        self.target_admit_writes(now);
    }

    /// The LU finished a task [`NPortEvent::Execute`] handed out.
    pub fn complete_task(&mut self, now: Instant, id: TaskId, result: TaskResult) {
        self.target_answer(id, result);
        // Its write data's share of the budget is back.
        self.target_admit_writes(now);
    }

    fn target_answer(&mut self, id: TaskId, result: TaskResult) {
        let Some(&key) = self.target.by_id.get(&id.0) else {
            return;
        };
        let Some(x) = self.target.remove(&key) else {
            self.target.by_id.remove(&id.0);
            return;
        };
        let (peer, ox) = key;
        if x.aborted {
            // The ABTS answer closes the exchange.
            return;
        }
        if result.aborted {
            self.xm.close_rx(peer, ox);
            return;
        }
        let max = self
            .remotes
            .get(&peer)
            .map_or(2048, |r| usize::from(r.rx_size))
            .min(usize::from(self.cfg.rx_data_field_size).max(256));
        let produced: u64 = result.data_in.iter().map(|b| b.len() as u64).sum();
        let sendable = produced.min(u64::from(x.read_len)) as usize;
        if sendable > 0 {
            let seq = self.next_seq_id();
            let mut ro = 0usize;
            let mut cnt: u16 = 0;
            'outer: for seg in &result.data_in {
                let mut off = 0;
                while off < seg.len() {
                    if ro >= sendable {
                        break 'outer;
                    }
                    let n = (seg.len() - off).min(max).min(sendable - ro);
                    let last = ro + n == sendable;
                    let mut f = FCtl(FCtl::EXCHANGE_CONTEXT | FCtl::RELATIVE_OFFSET);
                    if last {
                        f = f.with(FCtl::END_SEQUENCE, true);
                    }
                    let mut h = fcp_header(self.fc_id, peer, ox, x.rx, RCtl::FCP_DATA, f, seq);
                    h.seq_cnt = cnt;
                    h.parameter = ro as u32;
                    self.send(Frame::new(h, seg.slice(off..off + n)));
                    cnt = cnt.wrapping_add(1);
                    off += n;
                    ro += n;
                }
            }
        }
        let derived_read = {
            let p = u32::try_from(produced).unwrap_or(u32::MAX);
            match p.cmp(&x.read_len) {
                std::cmp::Ordering::Equal => None,
                std::cmp::Ordering::Greater => Some(Residual::Overflow(p - x.read_len)),
                std::cmp::Ordering::Less => Some(Residual::Underflow(x.read_len - p)),
            }
        };
        let bidi = x.read_len > 0 && x.write_len > 0;
        // The device server's own residual wins (it knows what a write
        // needed); otherwise the data produced against FCP_DL decides, for
        // a command announced without data too (an overrun of 0). For a
        // bidirectional command it is the write residual, and the read
        // residual is derived.
        let (main, bidi_res) = if bidi {
            (result.residual, derived_read)
        } else {
            (result.residual.or(derived_read), None)
        };
        let mut rsp = FcpRspRepr {
            scsi_status: result.status.0,
            sense: result.sense.clone().unwrap_or_default(),
            ..FcpRspRepr::default()
        };
        match main {
            Some(Residual::Overflow(n)) => {
                rsp.flags.0 |= FcpRspFlags::RESID_OVER;
                rsp.resid = n;
            }
            Some(Residual::Underflow(n)) => {
                rsp.flags.0 |= FcpRspFlags::RESID_UNDER;
                rsp.resid = n;
            }
            None => {}
        }
        if bidi {
            match bidi_res {
                Some(Residual::Overflow(n)) => {
                    rsp.flags.0 |= FcpRspFlags::BIDI_READ_RESID_OVER;
                    rsp.bidirectional_read_resid = Some(n);
                }
                Some(Residual::Underflow(n)) => {
                    rsp.flags.0 |= FcpRspFlags::BIDI_READ_RESID_UNDER;
                    rsp.bidirectional_read_resid = Some(n);
                }
                None => rsp.bidirectional_read_resid = Some(0),
            }
        }
        self.target_rsp(peer, ox, x.rx, &rsp);
        self.xm.close_rx(peer, ox);
    }

    /// The LU finished a task management function
    /// [`NPortEvent::TaskManagement`] handed out.
    pub fn complete_tmf(&mut self, now: Instant, id: TaskId, response: TmfResponse) {
        let Some(t) = self.target.tmfs.remove(&id.0) else {
            return;
        };
        match t {
            PendingTmf::Fcp { peer, ox, rx } => {
                self.target_rsp(peer, ox, rx, &FcpRspRepr::tmf(rsp_code(response)));
                self.xm.close_rx(peer, ox);
            }
            PendingTmf::Abts { peer, ox, rx } => {
                self.target_ba_acc(now, peer, ox, rx);
            }
        }
    }

    fn target_ba_acc(&mut self, now: Instant, peer: FcId, ox: OxId, rx: RxId) {
        let acc = BlsRepr::BaAcc(BaAcc {
            seq_id_validity: 0,
            last_seq_id: 0,
            ox_id: ox,
            rx_id: rx,
            low_seq_cnt: 0,
            high_seq_cnt: 0xffff,
        });
        let route = Route {
            s_id: self.fc_id,
            d_id: peer,
            ox_id: ox,
            rx_id: rx,
        };
        if let Ok(f) = crate::compose::bls_reply(route, &acc, true) {
            self.send(f);
        }
        self.xm.hold_rx(now, peer, ox);
    }

    pub(super) fn target_abts(&mut self, now: Instant, h: &FcHeaderRepr) {
        let key = (h.s_id, h.ox_id);
        let Some(x) = self.target.exchanges.get_mut(&key) else {
            self.ba_rjt(h);
            return;
        };
        let rx = x.rx;
        match x.state {
            XState::Waiting | XState::Receiving { .. } => {
                self.target.remove(&key);
                self.target_ba_acc(now, h.s_id, h.ox_id, rx);
                self.target_admit_writes(now);
            }
            XState::Running => {
                if x.aborted {
                    return;
                }
                x.aborted = true;
                let request = TmfRequest {
                    nexus: x.nexus.clone(),
                    lun: x.cmnd.lun,
                    function: TmfFunction::AbortTask {
                        tag: u64::from(h.ox_id.0),
                    },
                };
                let id = self.target.alloc_id();
                self.target.tmfs.insert(
                    id,
                    PendingTmf::Abts {
                        peer: h.s_id,
                        ox: h.ox_id,
                        rx,
                    },
                );
                self.event(NPortEvent::TaskManagement {
                    id: TaskId(id),
                    request,
                });
            }
        }
    }

    pub(super) fn target_rec(&self, originator: FcId, ox: OxId) -> Option<RecAcc> {
        let x = self.target.exchanges.get(&(originator, ox))?;
        Some(RecAcc {
            ox_id: ox,
            rx_id: x.rx,
            originator,
            responder: self.fc_id,
            fc4_value: x.transferred,
            // E_STAT: this port is the exchange responder (bit 31).
            e_stat: 0x8000_0000,
        })
    }

    /// The initiator's nexus ended: its commands end without a response.
    pub(super) fn target_nexus_gone(&mut self, now: Instant, peer: FcId, nexus: ItNexus) {
        let keys: Vec<(FcId, OxId)> = self
            .target
            .exchanges
            .keys()
            .filter(|(p, _)| *p == peer)
            .copied()
            .collect();
        for k in keys {
            self.target.remove(&k);
        }
        self.target.tmfs.retain(|_, t| match t {
            PendingTmf::Fcp { peer: p, .. } | PendingTmf::Abts { peer: p, .. } => *p != peer,
        });
        self.xm.close_peer(peer);
        self.event(NPortEvent::NexusLoss(nexus));
        self.target_admit_writes(now);
    }

    pub(super) fn target_timeouts(&mut self, now: Instant) {
        self.target_drop_where(
            now,
            |x| matches!(x.state, XState::Receiving { deadline, .. } if deadline <= now),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small payloads that follow on are gathered into one piece; a full
    /// frame is kept as it came; out-of-order small ones start new pieces.
    #[test]
    fn small_frames_that_follow_on_are_gathered() {
        let full = Bytes::from(vec![1u8; 2048]);
        let mut p = Pieces::default();
        p.push(0, full.clone());
        for i in 0..256u32 {
            p.push(2048 + 4 * i, Bytes::copy_from_slice(&i.to_be_bytes()));
        }
        assert_eq!(p.count(), 2, "a full frame, then one gathered piece");
        p.push(3072, full.clone());
        // Out of order: 5,124 before 5,120; neither follows on.
        p.push(5124, Bytes::from_static(b"late"));
        p.push(5120, Bytes::from_static(b"back"));
        assert_eq!(p.count(), 5);
        let v = p.take();
        assert_eq!(p.count(), 0);
        let offsets: Vec<u32> = v.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, vec![0, 2048, 3072, 5124, 5120]);
        assert_eq!(v[0].1.as_ptr(), full.as_ptr(), "full frames are not copied");
        assert_eq!(v[1].1.len(), 1024);
        let want: Vec<u8> = (0..256u32).flat_map(|i| i.to_be_bytes()).collect();
        assert_eq!(&v[1].1[..], &want[..]);
        assert_eq!(v[2].1.as_ptr(), full.as_ptr());
    }

    /// The bound on pieces leaves room for any in-order sender, down to
    /// 512-byte frames, and for a few stragglers.
    #[test]
    fn the_piece_bound_fits_every_in_order_frame_size() {
        for burst in [512u32, 4096, 256 * 1024, 1 << 20] {
            for frame in [512u32, 1024, 2048, 2112] {
                assert!(burst.div_ceil(frame) as usize <= max_pieces(burst));
            }
        }
        assert_eq!(max_pieces(1 << 20), 2048 + 8);
    }
}
