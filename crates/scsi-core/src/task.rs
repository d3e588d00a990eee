//! The transport-neutral task model (SAM-5 §5, §8).
//!
//! Every front end (iSCSI, FCP over FCoE or FCIP) turns what arrives into a
//! [`Task`] and hands it to a [`LogicalUnit`](crate::LogicalUnit); what comes
//! back is a [`TaskResult`]. Nothing here knows about a transport.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

/// A SAM-5 logical unit number, kept in its 8-byte wire encoding (SAM-5 §4.7).
///
/// Transports carry the 8 bytes unchanged; [`Lun::from_index`] and
/// [`Lun::index`] convert to and from the single-level peripheral (LUN < 256)
/// or flat (LUN < 16384) addressing methods that initiators use in practice.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Lun(pub u64);

impl Lun {
    /// LUN 0, peripheral addressing.
    pub const ZERO: Lun = Lun(0);

    /// Encodes a LUN index with peripheral device addressing for indexes
    /// below 256 and flat space addressing up to 16383.
    ///
    /// Returns `None` for indexes that neither method can carry.
    pub fn from_index(index: u16) -> Option<Lun> {
        match index {
            0..=255 => Some(Lun(u64::from(index) << 48)),
            256..=0x3fff => Some(Lun((0x4000 | u64::from(index)) << 48)),
            _ => None,
        }
    }

    /// The LUN index for single-level peripheral or flat addressing, or
    /// `None` for any other (hierarchical, extended, well-known) form.
    pub fn index(self) -> Option<u16> {
        let first_level = (self.0 >> 48) as u16;
        if self.0 & 0x0000_ffff_ffff_ffff != 0 {
            return None;
        }
        match first_level >> 14 {
            // Peripheral device addressing, bus 0.
            0b00 if first_level >> 8 == 0 => Some(first_level & 0xff),
            // Flat space addressing.
            0b01 => Some(first_level & 0x3fff),
            _ => None,
        }
    }

    /// The 8 bytes as they appear on the wire.
    pub fn to_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }

    /// From the 8 wire bytes.
    pub fn from_bytes(bytes: [u8; 8]) -> Lun {
        Lun(u64::from_be_bytes(bytes))
    }
}

impl fmt::Debug for Lun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index() {
            Some(i) => write!(f, "Lun({i})"),
            None => write!(f, "Lun({:#018x})", self.0),
        }
    }
}

impl fmt::Display for Lun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index() {
            Some(i) => write!(f, "{i}"),
            None => write!(f, "{:#018x}", self.0),
        }
    }
}

/// SAM-5 task attribute (§8.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TaskAttr {
    /// SIMPLE: may run in any order relative to other SIMPLE tasks.
    #[default]
    Simple,
    /// ORDERED: runs after every older task and before every newer one.
    Ordered,
    /// HEAD OF QUEUE: runs before any task not yet started.
    HeadOfQueue,
    /// ACA: only while an ACA condition is active.
    Aca,
}

/// A SCSI transport protocol identifier with its TransportID (SPC-4 §7.6.4),
/// naming an initiator port for persistent reservations and VPD pages.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TransportId {
    /// Fibre Channel (protocol identifier 0h): the N_Port name.
    Fcp {
        /// World-wide port name.
        wwpn: u64,
    },
    /// iSCSI (protocol identifier 5h): the iSCSI name, and for an initiator
    /// port the ISID that makes the port name `name,i,0xISID`.
    Iscsi {
        /// The iSCSI name (IQN, EUI or NAA form).
        name: String,
        /// The session's ISID, when this names an initiator port.
        isid: Option<[u8; 6]>,
    },
}

impl TransportId {
    /// SPC-4 protocol identifier code (Table 362).
    pub fn protocol_identifier(&self) -> u8 {
        match self {
            TransportId::Fcp { .. } => 0x0,
            TransportId::Iscsi { .. } => 0x5,
        }
    }

    /// The port name as an operator reads it.
    pub fn port_name(&self) -> String {
        match self {
            TransportId::Fcp { wwpn } => format_wwn(*wwpn),
            TransportId::Iscsi { name, isid: None } => name.clone(),
            TransportId::Iscsi {
                name,
                isid: Some(isid),
            } => {
                let mut s = format!("{name},i,0x");
                for b in isid {
                    s.push_str(&format!("{b:02x}"));
                }
                s
            }
        }
    }

    /// True when both name the same initiator device, ignoring the ISID
    /// (what SPC-4 calls "the same initiator" for ALL_TG_PT and registration
    /// matching on iSCSI with a TransportID format code of 00b).
    pub fn same_device(&self, other: &TransportId) -> bool {
        match (self, other) {
            (TransportId::Fcp { wwpn: a }, TransportId::Fcp { wwpn: b }) => a == b,
            (TransportId::Iscsi { name: a, .. }, TransportId::Iscsi { name: b, .. }) => {
                a.eq_ignore_ascii_case(b)
            }
            _ => false,
        }
    }
}

/// Formats a world-wide name as `20:00:00:25:b5:00:00:01`.
pub fn format_wwn(wwn: u64) -> String {
    let b = wwn.to_be_bytes();
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// The target port through which a task arrived (SPC-4 §7.8.6 designators).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TargetPort {
    /// The target port's transport identity (iSCSI: the target name with the
    /// portal group tag as `name,t,0xTPGT`; FC: its WWPN).
    pub id: TransportId,
    /// Relative target port identifier (1-based; 0 is reserved).
    pub relative_port_id: u16,
    /// Target port group, for the TARGET PORT GROUP designator.
    pub port_group: u16,
}

/// The I_T nexus a task belongs to (SAM-5 §4.8): which initiator port, through
/// which target port. Cheap to clone; compared by its unique id.
#[derive(Clone)]
pub struct ItNexus(Arc<NexusInner>);

#[derive(Debug)]
struct NexusInner {
    id: u64,
    initiator: TransportId,
    target: TargetPort,
}

static NEXT_NEXUS_ID: AtomicU64 = AtomicU64::new(1);

impl ItNexus {
    /// A new nexus. Every call yields a distinct [`ItNexus::id`], so a
    /// reinstated session (same names) is still a new nexus to the LU's
    /// unit-attention and reservation bookkeeping only where SAM says so:
    /// those compare [`ItNexus::initiator`] and [`ItNexus::target`], not ids.
    pub fn new(initiator: TransportId, target: TargetPort) -> ItNexus {
        ItNexus(Arc::new(NexusInner {
            id: NEXT_NEXUS_ID.fetch_add(1, Ordering::Relaxed),
            initiator,
            target,
        }))
    }

    /// An iSCSI nexus: initiator port `initiator` with `isid` to the
    /// target port named `target` (`iqn…,t,0xTPGT`), relative port 1 of
    /// target port group 1, as a unifab target with one portal group
    /// presents itself. For code that drives LUs without the iSCSI target
    /// (benchmarks, tools, tests).
    pub fn iscsi(initiator: &str, isid: [u8; 6], target: &str) -> ItNexus {
        ItNexus::new(
            TransportId::Iscsi {
                name: initiator.into(),
                isid: Some(isid),
            },
            TargetPort {
                id: TransportId::Iscsi {
                    name: target.into(),
                    isid: None,
                },
                relative_port_id: 1,
                port_group: 1,
            },
        )
    }

    /// Unique for the process lifetime.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The initiator port.
    pub fn initiator(&self) -> &TransportId {
        &self.0.initiator
    }

    /// The target port.
    pub fn target(&self) -> &TargetPort {
        &self.0.target
    }

    /// True when `other` joins the same initiator port to the same target
    /// port (a reinstated session is the same I_T nexus in SAM terms).
    pub fn same_ports(&self, other: &ItNexus) -> bool {
        self.0.initiator == other.0.initiator && self.0.target.id == other.0.target.id
    }
}

impl PartialEq for ItNexus {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}
impl Eq for ItNexus {}

impl std::hash::Hash for ItNexus {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.id.hash(state);
    }
}

impl fmt::Debug for ItNexus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ItNexus#{}({} -> {})",
            self.0.id,
            self.0.initiator.port_name(),
            self.0.target.id.port_name()
        )
    }
}

/// A command descriptor block (6 to 260 bytes), a slice of the receive buffer.
#[derive(Clone, PartialEq, Eq)]
pub struct Cdb(Bytes);

impl Cdb {
    /// Wraps CDB bytes. An empty CDB is allowed here and refused by the
    /// device server with INVALID COMMAND OPERATION CODE.
    pub fn new(bytes: Bytes) -> Cdb {
        Cdb(bytes)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The shared buffer.
    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    /// The CDB's bytes, without a reference-count increment.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }

    /// OPERATION CODE, or `None` for an empty CDB.
    pub fn opcode(&self) -> Option<u8> {
        self.0.first().copied()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for an empty CDB.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Cdb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cdb[")?;
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, " ")?;
            }
            write!(f, "{b:02x}")?;
        }
        write!(f, "]")
    }
}

/// A SCSI task (SAM-5 §8): one command on one I_T_L nexus.
#[derive(Debug, Clone)]
pub struct Task {
    /// Which initiator port through which target port.
    pub nexus: ItNexus,
    /// The addressed logical unit.
    pub lun: Lun,
    /// The task tag, unique per I_T nexus while the task exists
    /// (the iSCSI ITT, the FCP OX_ID, widened).
    pub tag: u64,
    /// Task attribute.
    pub attr: TaskAttr,
    /// Command priority (SAM-5 §8.7), 0 = vendor default.
    pub priority: u8,
    /// The CDB.
    pub cdb: Cdb,
    /// Data-out, as received: a list of slices in relative-offset order
    /// whose total length is at most `data_out_len`.
    pub data_out: Vec<Bytes>,
    /// The expected data-out transfer length the initiator announced.
    pub data_out_len: u32,
    /// The expected data-in transfer length the initiator announced.
    pub data_in_len: u32,
}

impl Task {
    /// A SIMPLE task at default priority that expects no data either way;
    /// the `with_…` methods set the rest. Every transport and test builds
    /// its tasks this way:
    ///
    /// ```
    /// # use bytes::Bytes;
    /// # use unifab_scsi_core::{Cdb, ItNexus, Lun, Task, TaskAttr};
    /// let nexus = ItNexus::iscsi("iqn.2026-11.io.unifab:host", [0x40, 0, 0, 0, 0, 1], "iqn.2026-11.io.unifab:t,t,0x1");
    /// let read = Cdb::new(Bytes::from_static(&[0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0]));
    /// let task = Task::new(nexus, Lun(0), 7, read)
    ///     .with_attr(TaskAttr::Ordered)
    ///     .with_data_in(8 * 512);
    /// assert_eq!(task.data_in_len, 4096);
    /// ```
    pub fn new(nexus: ItNexus, lun: Lun, tag: u64, cdb: Cdb) -> Task {
        Task {
            nexus,
            lun,
            tag,
            attr: TaskAttr::Simple,
            priority: 0,
            cdb,
            data_out: Vec::new(),
            data_out_len: 0,
            data_in_len: 0,
        }
    }

    /// With this task attribute.
    #[must_use]
    pub fn with_attr(mut self, attr: TaskAttr) -> Task {
        self.attr = attr;
        self
    }

    /// With this command priority (SAM-5 §8.7).
    #[must_use]
    pub fn with_priority(mut self, priority: u8) -> Task {
        self.priority = priority;
        self
    }

    /// With the data-out received so far (`slices`, in relative-offset
    /// order) and the expected data-out transfer length the initiator
    /// announced.
    #[must_use]
    pub fn with_data_out(mut self, slices: Vec<Bytes>, expected_len: u32) -> Task {
        self.data_out = slices;
        self.data_out_len = expected_len;
        self
    }

    /// With all of its data-out in one buffer, which is also the expected
    /// length (saturated at `u32::MAX`).
    #[must_use]
    pub fn with_data(self, data: Bytes) -> Task {
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        self.with_data_out(vec![data], len)
    }

    /// With this expected data-in transfer length.
    #[must_use]
    pub fn with_data_in(mut self, expected_len: u32) -> Task {
        self.data_in_len = expected_len;
        self
    }

    /// Total bytes of data-out actually present.
    pub fn data_out_total(&self) -> usize {
        self.data_out.iter().map(Bytes::len).sum()
    }

    /// The direction implied by the expected lengths.
    pub fn direction(&self) -> DataDirection {
        match (self.data_in_len > 0, self.data_out_len > 0) {
            (false, false) => DataDirection::None,
            (true, false) => DataDirection::In,
            (false, true) => DataDirection::Out,
            (true, true) => DataDirection::Bidirectional,
        }
    }
}

/// Data transfer direction, from the initiator's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataDirection {
    /// No data phase.
    None,
    /// Target to initiator (read).
    In,
    /// Initiator to target (write).
    Out,
    /// Both.
    Bidirectional,
}

/// SAM-5 status code (§5.3). Open: unknown values pass through unchanged.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status(pub u8);

impl Status {
    /// GOOD.
    pub const GOOD: Status = Status(0x00);
    /// CHECK CONDITION: sense data describes why.
    pub const CHECK_CONDITION: Status = Status(0x02);
    /// CONDITION MET.
    pub const CONDITION_MET: Status = Status(0x04);
    /// BUSY.
    pub const BUSY: Status = Status(0x08);
    /// RESERVATION CONFLICT.
    pub const RESERVATION_CONFLICT: Status = Status(0x18);
    /// TASK SET FULL.
    pub const TASK_SET_FULL: Status = Status(0x28);
    /// ACA ACTIVE.
    pub const ACA_ACTIVE: Status = Status(0x30);
    /// TASK ABORTED.
    pub const TASK_ABORTED: Status = Status(0x40);
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match *self {
            Status::GOOD => "GOOD",
            Status::CHECK_CONDITION => "CHECK CONDITION",
            Status::CONDITION_MET => "CONDITION MET",
            Status::BUSY => "BUSY",
            Status::RESERVATION_CONFLICT => "RESERVATION CONFLICT",
            Status::TASK_SET_FULL => "TASK SET FULL",
            Status::ACA_ACTIVE => "ACA ACTIVE",
            Status::TASK_ABORTED => "TASK ABORTED",
            Status(other) => return write!(f, "Status({other:#04x})"),
        };
        f.write_str(name)
    }
}

/// A residual as a transport reports it (SAM-5 §5.4, iSCSI O/U bits, FCP
/// FCP_RESID_OVER/UNDER).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Residual {
    /// The device server wanted to move this many bytes more than expected.
    Overflow(u32),
    /// This many fewer bytes than expected were moved.
    Underflow(u32),
}

/// What a task ended with.
#[derive(Debug, Clone, Default)]
pub struct TaskResult {
    /// SCSI status.
    pub status: Status,
    /// Sense data (fixed or descriptor format), with CHECK CONDITION.
    pub sense: Option<Bytes>,
    /// Data-in the device server produced, in order. It may be longer than
    /// the expected data-in length: the transport sends only what the
    /// initiator expected and reports the rest as overflow.
    pub data_in: Vec<Bytes>,
    /// A residual decided by a pass-through LU (the remote target's own),
    /// which the transport then reports unchanged. Emulated LUs leave it
    /// `None` and the transport derives the residual from the lengths.
    pub residual: Option<Residual>,
    /// The task was aborted by task management: the transport sends no
    /// response for it (SAM-5 §7.2, RFC 7143 §11.5.1, FCP-4 §12.3).
    pub aborted: bool,
}

impl TaskResult {
    /// GOOD status with no data.
    pub fn good() -> TaskResult {
        TaskResult::default()
    }

    /// GOOD status with data-in.
    pub fn with_data(data: Bytes) -> TaskResult {
        TaskResult {
            data_in: vec![data],
            ..TaskResult::default()
        }
    }

    /// CHECK CONDITION with the given sense.
    pub fn check_condition(sense: crate::Sense) -> TaskResult {
        TaskResult {
            status: Status::CHECK_CONDITION,
            sense: Some(sense.to_fixed_bytes()),
            ..TaskResult::default()
        }
    }

    /// A bare status with no sense (BUSY, RESERVATION CONFLICT, ...).
    pub fn status(status: Status) -> TaskResult {
        TaskResult {
            status,
            ..TaskResult::default()
        }
    }

    /// A task ended by task management: no response is sent.
    pub fn aborted() -> TaskResult {
        TaskResult {
            status: Status::TASK_ABORTED,
            aborted: true,
            ..TaskResult::default()
        }
    }

    /// Total data-in bytes produced.
    pub fn data_in_total(&self) -> usize {
        self.data_in.iter().map(Bytes::len).sum()
    }

    /// The residual to report for `expected` data-in bytes: the LU's own
    /// if it set one, else derived from the produced length.
    pub fn data_in_residual(&self, expected: u32) -> Option<Residual> {
        if self.residual.is_some() {
            return self.residual;
        }
        let produced = u32::try_from(self.data_in_total()).unwrap_or(u32::MAX);
        match produced.cmp(&expected) {
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Greater => Some(Residual::Overflow(produced - expected)),
            std::cmp::Ordering::Less => Some(Residual::Underflow(expected - produced)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_peripheral_and_flat() {
        assert_eq!(Lun::from_index(0), Some(Lun(0)));
        assert_eq!(
            Lun::from_index(5).map(|l| l.to_bytes()),
            Some([0, 5, 0, 0, 0, 0, 0, 0])
        );
        assert_eq!(
            Lun::from_index(300).map(|l| l.to_bytes()),
            Some([0x41, 0x2c, 0, 0, 0, 0, 0, 0])
        );
        for i in [0u16, 1, 255, 256, 1000, 0x3fff] {
            assert_eq!(Lun::from_index(i).and_then(Lun::index), Some(i));
        }
        assert_eq!(Lun::from_index(0x4000), None);
        // Peripheral with a non-zero bus is not a plain index.
        assert_eq!(Lun(0x0105 << 48).index(), None);
        // A second level is not a plain index.
        assert_eq!(Lun((5 << 48) | 1).index(), None);
    }

    #[test]
    fn residual_derivation() {
        let r = TaskResult::with_data(Bytes::from_static(&[0; 36]));
        assert_eq!(r.data_in_residual(36), None);
        assert_eq!(r.data_in_residual(8), Some(Residual::Overflow(28)));
        assert_eq!(r.data_in_residual(96), Some(Residual::Underflow(60)));
        let mut r = r;
        r.residual = Some(Residual::Underflow(1));
        assert_eq!(r.data_in_residual(36), Some(Residual::Underflow(1)));
    }

    #[test]
    fn iscsi_port_name() {
        let t = TransportId::Iscsi {
            name: "iqn.2026-11.io.unifab:h".into(),
            isid: Some([0x40, 0, 0x01, 0x37, 0, 0]),
        };
        assert_eq!(t.port_name(), "iqn.2026-11.io.unifab:h,i,0x400001370000");
        let u = TransportId::Iscsi {
            name: "IQN.2026-11.io.unifab:h".into(),
            isid: None,
        };
        assert!(t.same_device(&u));
    }
}
