//! Owned representations of every RFC 7143 PDU header (§11.3 – §11.18).
//!
//! A [`Pdu`] is the parsed meaning of a BHS. The AHS and the data segment
//! stay `Bytes` slices of the receive buffer in a [`PduFrame`](super::PduFrame);
//! nothing here copies a payload. `Pdu::parse(&bhs)` followed by
//! [`Pdu::emit`] reproduces the 48 bytes exactly for any header whose
//! reserved fields are zero (the RFC's "MUST be 0").

use super::WireError;
use super::bhs::{BHS_LEN, Bhs, Opcode};

/// SCSI task attribute codes in the SCSI Command PDU (§11.3.1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TaskAttrCode(pub u8);

#[allow(missing_docs)]
impl TaskAttrCode {
    pub const UNTAGGED: TaskAttrCode = TaskAttrCode(0);
    pub const SIMPLE: TaskAttrCode = TaskAttrCode(1);
    pub const ORDERED: TaskAttrCode = TaskAttrCode(2);
    pub const HEAD_OF_QUEUE: TaskAttrCode = TaskAttrCode(3);
    pub const ACA: TaskAttrCode = TaskAttrCode(4);
}

/// NOP-Out (§11.18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NopOut {
    /// I bit.
    pub immediate: bool,
    /// LUN (echoed in NOP-In).
    pub lun: u64,
    /// ITT; 0xffffffff when answering a NOP-In (no reply wanted).
    pub itt: u32,
    /// TTT; the NOP-In's TTT when answering one, else 0xffffffff.
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// SCSI Command (§11.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScsiCommand {
    /// I bit.
    pub immediate: bool,
    /// F bit: no unsolicited Data-Out follows.
    pub final_flag: bool,
    /// R bit: data-in expected.
    pub read: bool,
    /// W bit: data-out expected.
    pub write: bool,
    /// ATTR (3 bits).
    pub attr: TaskAttrCode,
    /// LUN.
    pub lun: u64,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Expected Data Transfer Length.
    pub expected_data_transfer_length: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// The first 16 bytes of the CDB (rest in an extended-CDB AHS).
    pub cdb: [u8; 16],
}

/// SCSI Response (§11.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScsiResponse {
    /// o bit: bidirectional read residual overflow.
    pub bidi_overflow: bool,
    /// u bit: bidirectional read residual underflow.
    pub bidi_underflow: bool,
    /// O bit: residual overflow.
    pub overflow: bool,
    /// U bit: residual underflow.
    pub underflow: bool,
    /// iSCSI service response (0 = command completed at target).
    pub response: u8,
    /// SCSI status.
    pub status: u8,
    /// ITT.
    pub itt: u32,
    /// SNACK Tag.
    pub snack_tag: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// ExpDataSN.
    pub exp_data_sn: u32,
    /// Bidirectional Read Residual Count.
    pub bidi_residual_count: u32,
    /// Residual Count.
    pub residual_count: u32,
}

/// Task management function codes (§11.5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TmfCode(pub u8);

#[allow(missing_docs)]
impl TmfCode {
    pub const ABORT_TASK: TmfCode = TmfCode(1);
    pub const ABORT_TASK_SET: TmfCode = TmfCode(2);
    pub const CLEAR_ACA: TmfCode = TmfCode(3);
    pub const CLEAR_TASK_SET: TmfCode = TmfCode(4);
    pub const LOGICAL_UNIT_RESET: TmfCode = TmfCode(5);
    pub const TARGET_WARM_RESET: TmfCode = TmfCode(6);
    pub const TARGET_COLD_RESET: TmfCode = TmfCode(7);
    pub const TASK_REASSIGN: TmfCode = TmfCode(8);
    pub const QUERY_TASK: TmfCode = TmfCode(9);
    pub const QUERY_TASK_SET: TmfCode = TmfCode(10);
    pub const I_T_NEXUS_RESET: TmfCode = TmfCode(11);
    pub const QUERY_ASYNC_EVENT: TmfCode = TmfCode(12);
}

/// Task management function responses (§11.6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TmfResponseCode(pub u8);

#[allow(missing_docs)]
impl TmfResponseCode {
    pub const FUNCTION_COMPLETE: TmfResponseCode = TmfResponseCode(0);
    pub const TASK_DOES_NOT_EXIST: TmfResponseCode = TmfResponseCode(1);
    pub const LUN_DOES_NOT_EXIST: TmfResponseCode = TmfResponseCode(2);
    pub const TASK_STILL_ALLEGIANT: TmfResponseCode = TmfResponseCode(3);
    pub const TASK_ALLEGIANCE_REASSIGNMENT_NOT_SUPPORTED: TmfResponseCode = TmfResponseCode(4);
    pub const NOT_SUPPORTED: TmfResponseCode = TmfResponseCode(5);
    pub const AUTHORIZATION_FAILED: TmfResponseCode = TmfResponseCode(6);
    pub const FUNCTION_SUCCEEDED: TmfResponseCode = TmfResponseCode(7);
    pub const FUNCTION_REJECTED: TmfResponseCode = TmfResponseCode(255);
}

/// Task Management Function Request (§11.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskMgmtRequest {
    /// I bit.
    pub immediate: bool,
    /// Function (7 bits).
    pub function: TmfCode,
    /// LUN.
    pub lun: u64,
    /// ITT of this request.
    pub itt: u32,
    /// Referenced Task Tag (ABORT TASK, QUERY TASK, TASK REASSIGN).
    pub referenced_task_tag: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// RefCmdSN.
    pub ref_cmd_sn: u32,
    /// ExpDataSN.
    pub exp_data_sn: u32,
}

/// Task Management Function Response (§11.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskMgmtResponse {
    /// Response.
    pub response: TmfResponseCode,
    /// ITT of the request.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// SCSI Data-Out (§11.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataOut {
    /// F bit: last PDU of the sequence.
    pub final_flag: bool,
    /// LUN (from the R2T, or the command for unsolicited data).
    pub lun: u64,
    /// ITT.
    pub itt: u32,
    /// TTT (0xffffffff for unsolicited data).
    pub ttt: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// DataSN.
    pub data_sn: u32,
    /// Buffer Offset.
    pub buffer_offset: u32,
}

/// SCSI Data-In (§11.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataIn {
    /// F bit.
    pub final_flag: bool,
    /// A bit: acknowledge requested (ERL ≥ 1).
    pub acknowledge: bool,
    /// O bit.
    pub overflow: bool,
    /// U bit.
    pub underflow: bool,
    /// S bit: status is carried (phase collapse).
    pub status_present: bool,
    /// Status (valid with S).
    pub status: u8,
    /// LUN (valid with A; else reserved but commonly set).
    pub lun: u64,
    /// ITT.
    pub itt: u32,
    /// TTT.
    pub ttt: u32,
    /// StatSN (valid with S).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN.
    pub data_sn: u32,
    /// Buffer Offset.
    pub buffer_offset: u32,
    /// Residual Count (valid with S).
    pub residual_count: u32,
}

/// Ready To Transfer (§11.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct R2t {
    /// LUN.
    pub lun: u64,
    /// ITT.
    pub itt: u32,
    /// TTT.
    pub ttt: u32,
    /// StatSN (the next one; not advanced).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// R2TSN.
    pub r2t_sn: u32,
    /// Buffer Offset.
    pub buffer_offset: u32,
    /// Desired Data Transfer Length.
    pub desired_data_transfer_length: u32,
}

/// Asynchronous events (§11.9.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AsyncEvent(pub u8);

#[allow(missing_docs)]
impl AsyncEvent {
    pub const SCSI_ASYNC_EVENT: AsyncEvent = AsyncEvent(0);
    pub const LOGOUT_REQUEST: AsyncEvent = AsyncEvent(1);
    pub const CONNECTION_DROP: AsyncEvent = AsyncEvent(2);
    pub const SESSION_DROP: AsyncEvent = AsyncEvent(3);
    pub const NEGOTIATION_REQUEST: AsyncEvent = AsyncEvent(4);
    pub const TASK_TERMINATION: AsyncEvent = AsyncEvent(5);
    pub const VENDOR_SPECIFIC: AsyncEvent = AsyncEvent(255);
}

/// Asynchronous Message (§11.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AsyncMessage {
    /// LUN (SCSI async events).
    pub lun: u64,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// AsyncEvent.
    pub event: AsyncEvent,
    /// AsyncVCode.
    pub vcode: u8,
    /// Parameter1.
    pub parameter1: u16,
    /// Parameter2.
    pub parameter2: u16,
    /// Parameter3.
    pub parameter3: u16,
}

/// Text Request (§11.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TextRequest {
    /// I bit.
    pub immediate: bool,
    /// F bit.
    pub final_flag: bool,
    /// C bit: text continues in the next PDU.
    pub continue_flag: bool,
    /// LUN (reserved, kept for fidelity).
    pub lun: u64,
    /// ITT.
    pub itt: u32,
    /// TTT (0xffffffff for a new exchange).
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// Text Response (§11.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TextResponse {
    /// F bit.
    pub final_flag: bool,
    /// C bit.
    pub continue_flag: bool,
    /// LUN (reserved, kept for fidelity).
    pub lun: u64,
    /// ITT.
    pub itt: u32,
    /// TTT.
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// Login stages (§11.12.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Stage(pub u8);

#[allow(missing_docs)]
impl Stage {
    pub const SECURITY_NEGOTIATION: Stage = Stage(0);
    pub const LOGIN_OPERATIONAL_NEGOTIATION: Stage = Stage(1);
    pub const FULL_FEATURE_PHASE: Stage = Stage(3);
}

/// Login Request (§11.12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoginRequest {
    /// T bit: transit to NSG.
    pub transit: bool,
    /// C bit: text continues.
    pub continue_flag: bool,
    /// Current stage.
    pub csg: Stage,
    /// Next stage.
    pub nsg: Stage,
    /// Version-max.
    pub version_max: u8,
    /// Version-min.
    pub version_min: u8,
    /// ISID.
    pub isid: [u8; 6],
    /// TSIH.
    pub tsih: u16,
    /// ITT.
    pub itt: u32,
    /// CID.
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// Login Response (§11.13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoginResponse {
    /// T bit.
    pub transit: bool,
    /// C bit.
    pub continue_flag: bool,
    /// Current stage.
    pub csg: Stage,
    /// Next stage.
    pub nsg: Stage,
    /// Version-max.
    pub version_max: u8,
    /// Version-active.
    pub version_active: u8,
    /// ISID.
    pub isid: [u8; 6],
    /// TSIH.
    pub tsih: u16,
    /// ITT.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Status-Class.
    pub status_class: u8,
    /// Status-Detail.
    pub status_detail: u8,
}

/// Logout reason codes (§11.14.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LogoutReason(pub u8);

#[allow(missing_docs)]
impl LogoutReason {
    pub const CLOSE_SESSION: LogoutReason = LogoutReason(0);
    pub const CLOSE_CONNECTION: LogoutReason = LogoutReason(1);
    pub const REMOVE_FOR_RECOVERY: LogoutReason = LogoutReason(2);
}

/// Logout Request (§11.14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogoutRequest {
    /// I bit.
    pub immediate: bool,
    /// Reason code (7 bits).
    pub reason: LogoutReason,
    /// ITT.
    pub itt: u32,
    /// CID to close (reasons 1 and 2).
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// Logout Response (§11.15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogoutResponse {
    /// Response (0 = closed successfully, 1 = CID not found, 2 = recovery
    /// not supported, 3 = cleanup failed).
    pub response: u8,
    /// ITT.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Time2Wait.
    pub time2wait: u16,
    /// Time2Retain.
    pub time2retain: u16,
}

/// SNACK Request (§11.16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SnackRequest {
    /// Type (4 bits): 0 Data/R2T, 1 Status, 2 DataACK, 3 R-Data.
    pub snack_type: u8,
    /// LUN.
    pub lun: u64,
    /// ITT.
    pub itt: u32,
    /// TTT or SNACK Tag.
    pub ttt: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// BegRun.
    pub beg_run: u32,
    /// RunLength.
    pub run_length: u32,
}

/// Reject reason codes (§11.17.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RejectReason(pub u8);

#[allow(missing_docs)]
impl RejectReason {
    pub const DATA_DIGEST_ERROR: RejectReason = RejectReason(0x02);
    pub const SNACK_REJECT: RejectReason = RejectReason(0x03);
    pub const PROTOCOL_ERROR: RejectReason = RejectReason(0x04);
    pub const COMMAND_NOT_SUPPORTED: RejectReason = RejectReason(0x05);
    pub const IMMEDIATE_COMMAND_REJECT: RejectReason = RejectReason(0x06);
    pub const TASK_IN_PROGRESS: RejectReason = RejectReason(0x07);
    pub const INVALID_DATA_ACK: RejectReason = RejectReason(0x08);
    pub const INVALID_PDU_FIELD: RejectReason = RejectReason(0x09);
    pub const LONG_OPERATION_REJECT: RejectReason = RejectReason(0x0a);
    pub const DEPRECATED_NEGOTIATION_RESET: RejectReason = RejectReason(0x0b);
    pub const WAITING_FOR_LOGOUT: RejectReason = RejectReason(0x0c);
}

/// Reject (§11.17). The data segment carries the rejected PDU's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reject {
    /// Reason.
    pub reason: RejectReason,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN/R2TSN (for a rejected SNACK).
    pub data_sn: u32,
}

/// NOP-In (§11.19).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NopIn {
    /// LUN.
    pub lun: u64,
    /// ITT (0xffffffff for a target-initiated ping).
    pub itt: u32,
    /// TTT (0xffffffff when answering a NOP-Out).
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// Every PDU header, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pdu {
    /// NOP-Out.
    NopOut(NopOut),
    /// SCSI Command.
    ScsiCommand(ScsiCommand),
    /// Task Management Function Request.
    TaskMgmtRequest(TaskMgmtRequest),
    /// Login Request.
    LoginRequest(LoginRequest),
    /// Text Request.
    TextRequest(TextRequest),
    /// SCSI Data-Out.
    DataOut(DataOut),
    /// Logout Request.
    LogoutRequest(LogoutRequest),
    /// SNACK Request.
    SnackRequest(SnackRequest),
    /// NOP-In.
    NopIn(NopIn),
    /// SCSI Response.
    ScsiResponse(ScsiResponse),
    /// Task Management Function Response.
    TaskMgmtResponse(TaskMgmtResponse),
    /// Login Response.
    LoginResponse(LoginResponse),
    /// Text Response.
    TextResponse(TextResponse),
    /// SCSI Data-In.
    DataIn(DataIn),
    /// Logout Response.
    LogoutResponse(LogoutResponse),
    /// R2T.
    R2t(R2t),
    /// Asynchronous Message.
    AsyncMessage(AsyncMessage),
    /// Reject.
    Reject(Reject),
}

fn stage(v: u8) -> Stage {
    Stage(v & 0x03)
}

impl Pdu {
    /// Parses the meaning of a BHS. An undefined opcode is
    /// [`WireError::UnknownOpcode`]: the caller answers it with a Reject
    /// (COMMAND NOT SUPPORTED for initiator opcodes).
    pub fn parse<T: AsRef<[u8]>>(bhs: &Bhs<T>) -> Result<Pdu, WireError> {
        let flags = bhs.flags();
        let f = flags & 0x80 != 0;
        let imm = bhs.immediate();
        Ok(match bhs.opcode() {
            Opcode::NOP_OUT => Pdu::NopOut(NopOut {
                immediate: imm,
                lun: bhs.lun(),
                itt: bhs.initiator_task_tag(),
                ttt: bhs.word5(),
                cmd_sn: bhs.word6(),
                exp_stat_sn: bhs.word7(),
            }),
            Opcode::SCSI_COMMAND => {
                let mut cdb = [0u8; 16];
                cdb.copy_from_slice(bhs.cdb());
                Pdu::ScsiCommand(ScsiCommand {
                    immediate: imm,
                    final_flag: f,
                    read: flags & 0x40 != 0,
                    write: flags & 0x20 != 0,
                    attr: TaskAttrCode(flags & 0x07),
                    lun: bhs.lun(),
                    itt: bhs.initiator_task_tag(),
                    expected_data_transfer_length: bhs.word5(),
                    cmd_sn: bhs.word6(),
                    exp_stat_sn: bhs.word7(),
                    cdb,
                })
            }
            Opcode::TASK_MGMT_REQUEST => Pdu::TaskMgmtRequest(TaskMgmtRequest {
                immediate: imm,
                function: TmfCode(flags & 0x7f),
                lun: bhs.lun(),
                itt: bhs.initiator_task_tag(),
                referenced_task_tag: bhs.word5(),
                cmd_sn: bhs.word6(),
                exp_stat_sn: bhs.word7(),
                ref_cmd_sn: bhs.word8(),
                exp_data_sn: bhs.word9(),
            }),
            Opcode::LOGIN_REQUEST => Pdu::LoginRequest(LoginRequest {
                transit: f,
                continue_flag: flags & 0x40 != 0,
                csg: stage(flags >> 2),
                nsg: stage(flags),
                version_max: bhs.byte2(),
                version_min: bhs.byte3(),
                isid: bhs.isid(),
                tsih: bhs.tsih(),
                itt: bhs.initiator_task_tag(),
                cid: bhs.cid(),
                cmd_sn: bhs.word6(),
                exp_stat_sn: bhs.word7(),
            }),
            Opcode::TEXT_REQUEST => Pdu::TextRequest(TextRequest {
                immediate: imm,
                final_flag: f,
                continue_flag: flags & 0x40 != 0,
                lun: bhs.lun(),
                itt: bhs.initiator_task_tag(),
                ttt: bhs.word5(),
                cmd_sn: bhs.word6(),
                exp_stat_sn: bhs.word7(),
            }),
            Opcode::SCSI_DATA_OUT => Pdu::DataOut(DataOut {
                final_flag: f,
                lun: bhs.lun(),
                itt: bhs.initiator_task_tag(),
                ttt: bhs.word5(),
                exp_stat_sn: bhs.word7(),
                data_sn: bhs.word9(),
                buffer_offset: bhs.word10(),
            }),
            Opcode::LOGOUT_REQUEST => Pdu::LogoutRequest(LogoutRequest {
                immediate: imm,
                reason: LogoutReason(flags & 0x7f),
                itt: bhs.initiator_task_tag(),
                cid: bhs.cid(),
                cmd_sn: bhs.word6(),
                exp_stat_sn: bhs.word7(),
            }),
            Opcode::SNACK_REQUEST => Pdu::SnackRequest(SnackRequest {
                snack_type: flags & 0x0f,
                lun: bhs.lun(),
                itt: bhs.initiator_task_tag(),
                ttt: bhs.word5(),
                exp_stat_sn: bhs.word7(),
                beg_run: bhs.word10(),
                run_length: bhs.word11(),
            }),
            Opcode::NOP_IN => Pdu::NopIn(NopIn {
                lun: bhs.lun(),
                itt: bhs.initiator_task_tag(),
                ttt: bhs.word5(),
                stat_sn: bhs.word6(),
                exp_cmd_sn: bhs.word7(),
                max_cmd_sn: bhs.word8(),
            }),
            Opcode::SCSI_RESPONSE => Pdu::ScsiResponse(ScsiResponse {
                bidi_overflow: flags & 0x10 != 0,
                bidi_underflow: flags & 0x08 != 0,
                overflow: flags & 0x04 != 0,
                underflow: flags & 0x02 != 0,
                response: bhs.byte2(),
                status: bhs.byte3(),
                itt: bhs.initiator_task_tag(),
                snack_tag: bhs.word5(),
                stat_sn: bhs.word6(),
                exp_cmd_sn: bhs.word7(),
                max_cmd_sn: bhs.word8(),
                exp_data_sn: bhs.word9(),
                bidi_residual_count: bhs.word10(),
                residual_count: bhs.word11(),
            }),
            Opcode::TASK_MGMT_RESPONSE => Pdu::TaskMgmtResponse(TaskMgmtResponse {
                response: TmfResponseCode(bhs.byte2()),
                itt: bhs.initiator_task_tag(),
                stat_sn: bhs.word6(),
                exp_cmd_sn: bhs.word7(),
                max_cmd_sn: bhs.word8(),
            }),
            Opcode::LOGIN_RESPONSE => Pdu::LoginResponse(LoginResponse {
                transit: f,
                continue_flag: flags & 0x40 != 0,
                csg: stage(flags >> 2),
                nsg: stage(flags),
                version_max: bhs.byte2(),
                version_active: bhs.byte3(),
                isid: bhs.isid(),
                tsih: bhs.tsih(),
                itt: bhs.initiator_task_tag(),
                stat_sn: bhs.word6(),
                exp_cmd_sn: bhs.word7(),
                max_cmd_sn: bhs.word8(),
                status_class: (bhs.word9() >> 24) as u8,
                status_detail: (bhs.word9() >> 16) as u8,
            }),
            Opcode::TEXT_RESPONSE => Pdu::TextResponse(TextResponse {
                final_flag: f,
                continue_flag: flags & 0x40 != 0,
                lun: bhs.lun(),
                itt: bhs.initiator_task_tag(),
                ttt: bhs.word5(),
                stat_sn: bhs.word6(),
                exp_cmd_sn: bhs.word7(),
                max_cmd_sn: bhs.word8(),
            }),
            Opcode::SCSI_DATA_IN => Pdu::DataIn(DataIn {
                final_flag: f,
                acknowledge: flags & 0x40 != 0,
                overflow: flags & 0x04 != 0,
                underflow: flags & 0x02 != 0,
                status_present: flags & 0x01 != 0,
                status: bhs.byte3(),
                lun: bhs.lun(),
                itt: bhs.initiator_task_tag(),
                ttt: bhs.word5(),
                stat_sn: bhs.word6(),
                exp_cmd_sn: bhs.word7(),
                max_cmd_sn: bhs.word8(),
                data_sn: bhs.word9(),
                buffer_offset: bhs.word10(),
                residual_count: bhs.word11(),
            }),
            Opcode::LOGOUT_RESPONSE => Pdu::LogoutResponse(LogoutResponse {
                response: bhs.byte2(),
                itt: bhs.initiator_task_tag(),
                stat_sn: bhs.word6(),
                exp_cmd_sn: bhs.word7(),
                max_cmd_sn: bhs.word8(),
                time2wait: (bhs.word10() >> 16) as u16,
                time2retain: bhs.word10() as u16,
            }),
            Opcode::R2T => Pdu::R2t(R2t {
                lun: bhs.lun(),
                itt: bhs.initiator_task_tag(),
                ttt: bhs.word5(),
                stat_sn: bhs.word6(),
                exp_cmd_sn: bhs.word7(),
                max_cmd_sn: bhs.word8(),
                r2t_sn: bhs.word9(),
                buffer_offset: bhs.word10(),
                desired_data_transfer_length: bhs.word11(),
            }),
            Opcode::ASYNC_MESSAGE => {
                let w9 = bhs.word9();
                let w10 = bhs.word10();
                Pdu::AsyncMessage(AsyncMessage {
                    lun: bhs.lun(),
                    stat_sn: bhs.word6(),
                    exp_cmd_sn: bhs.word7(),
                    max_cmd_sn: bhs.word8(),
                    event: AsyncEvent((w9 >> 24) as u8),
                    vcode: (w9 >> 16) as u8,
                    parameter1: w9 as u16,
                    parameter2: (w10 >> 16) as u16,
                    parameter3: w10 as u16,
                })
            }
            Opcode::REJECT => Pdu::Reject(Reject {
                reason: RejectReason(bhs.byte2()),
                stat_sn: bhs.word6(),
                exp_cmd_sn: bhs.word7(),
                max_cmd_sn: bhs.word8(),
                data_sn: bhs.word9(),
            }),
            other => return Err(WireError::UnknownOpcode(other.0)),
        })
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Pdu::NopOut(_) => Opcode::NOP_OUT,
            Pdu::ScsiCommand(_) => Opcode::SCSI_COMMAND,
            Pdu::TaskMgmtRequest(_) => Opcode::TASK_MGMT_REQUEST,
            Pdu::LoginRequest(_) => Opcode::LOGIN_REQUEST,
            Pdu::TextRequest(_) => Opcode::TEXT_REQUEST,
            Pdu::DataOut(_) => Opcode::SCSI_DATA_OUT,
            Pdu::LogoutRequest(_) => Opcode::LOGOUT_REQUEST,
            Pdu::SnackRequest(_) => Opcode::SNACK_REQUEST,
            Pdu::NopIn(_) => Opcode::NOP_IN,
            Pdu::ScsiResponse(_) => Opcode::SCSI_RESPONSE,
            Pdu::TaskMgmtResponse(_) => Opcode::TASK_MGMT_RESPONSE,
            Pdu::LoginResponse(_) => Opcode::LOGIN_RESPONSE,
            Pdu::TextResponse(_) => Opcode::TEXT_RESPONSE,
            Pdu::DataIn(_) => Opcode::SCSI_DATA_IN,
            Pdu::LogoutResponse(_) => Opcode::LOGOUT_RESPONSE,
            Pdu::R2t(_) => Opcode::R2T,
            Pdu::AsyncMessage(_) => Opcode::ASYNC_MESSAGE,
            Pdu::Reject(_) => Opcode::REJECT,
        }
    }

    /// The Initiator Task Tag (0xffffffff where the RFC fixes it so).
    pub fn itt(&self) -> u32 {
        match self {
            Pdu::NopOut(p) => p.itt,
            Pdu::ScsiCommand(p) => p.itt,
            Pdu::TaskMgmtRequest(p) => p.itt,
            Pdu::LoginRequest(p) => p.itt,
            Pdu::TextRequest(p) => p.itt,
            Pdu::DataOut(p) => p.itt,
            Pdu::LogoutRequest(p) => p.itt,
            Pdu::SnackRequest(p) => p.itt,
            Pdu::NopIn(p) => p.itt,
            Pdu::ScsiResponse(p) => p.itt,
            Pdu::TaskMgmtResponse(p) => p.itt,
            Pdu::LoginResponse(p) => p.itt,
            Pdu::TextResponse(p) => p.itt,
            Pdu::DataIn(p) => p.itt,
            Pdu::LogoutResponse(p) => p.itt,
            Pdu::R2t(p) => p.itt,
            Pdu::AsyncMessage(_) | Pdu::Reject(_) => u32::MAX,
        }
    }

    /// Writes this header into `bhs` (all 48 bytes are written), with the
    /// given TotalAHSLength (words) and DataSegmentLength (bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        bhs: &mut Bhs<T>,
        total_ahs_length: u8,
        data_segment_length: u32,
    ) {
        bhs.as_bytes_mut().fill(0);
        bhs.set_total_ahs_length(total_ahs_length);
        bhs.set_data_segment_length(data_segment_length);
        let fb = |b: bool, bit: u8| if b { bit } else { 0 };
        match *self {
            Pdu::NopOut(p) => {
                bhs.set_opcode(Opcode::NOP_OUT, p.immediate);
                bhs.set_flags(0x80);
                bhs.set_lun(p.lun);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word5(p.ttt);
                bhs.set_word6(p.cmd_sn);
                bhs.set_word7(p.exp_stat_sn);
            }
            Pdu::ScsiCommand(p) => {
                bhs.set_opcode(Opcode::SCSI_COMMAND, p.immediate);
                bhs.set_flags(
                    fb(p.final_flag, 0x80)
                        | fb(p.read, 0x40)
                        | fb(p.write, 0x20)
                        | (p.attr.0 & 0x07),
                );
                bhs.set_lun(p.lun);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word5(p.expected_data_transfer_length);
                bhs.set_word6(p.cmd_sn);
                bhs.set_word7(p.exp_stat_sn);
                bhs.set_cdb(&p.cdb);
            }
            Pdu::TaskMgmtRequest(p) => {
                bhs.set_opcode(Opcode::TASK_MGMT_REQUEST, p.immediate);
                bhs.set_flags(0x80 | (p.function.0 & 0x7f));
                bhs.set_lun(p.lun);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word5(p.referenced_task_tag);
                bhs.set_word6(p.cmd_sn);
                bhs.set_word7(p.exp_stat_sn);
                bhs.set_word8(p.ref_cmd_sn);
                bhs.set_word9(p.exp_data_sn);
            }
            Pdu::LoginRequest(p) => {
                bhs.set_opcode(Opcode::LOGIN_REQUEST, true);
                bhs.set_flags(
                    fb(p.transit, 0x80)
                        | fb(p.continue_flag, 0x40)
                        | ((p.csg.0 & 3) << 2)
                        | (p.nsg.0 & 3),
                );
                bhs.set_byte2(p.version_max);
                bhs.set_byte3(p.version_min);
                bhs.set_isid(p.isid);
                bhs.set_tsih(p.tsih);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_cid(p.cid);
                bhs.set_word6(p.cmd_sn);
                bhs.set_word7(p.exp_stat_sn);
            }
            Pdu::TextRequest(p) => {
                bhs.set_opcode(Opcode::TEXT_REQUEST, p.immediate);
                bhs.set_flags(fb(p.final_flag, 0x80) | fb(p.continue_flag, 0x40));
                bhs.set_lun(p.lun);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word5(p.ttt);
                bhs.set_word6(p.cmd_sn);
                bhs.set_word7(p.exp_stat_sn);
            }
            Pdu::DataOut(p) => {
                bhs.set_opcode(Opcode::SCSI_DATA_OUT, false);
                bhs.set_flags(fb(p.final_flag, 0x80));
                bhs.set_lun(p.lun);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word5(p.ttt);
                bhs.set_word7(p.exp_stat_sn);
                bhs.set_word9(p.data_sn);
                bhs.set_word10(p.buffer_offset);
            }
            Pdu::LogoutRequest(p) => {
                bhs.set_opcode(Opcode::LOGOUT_REQUEST, p.immediate);
                bhs.set_flags(0x80 | (p.reason.0 & 0x7f));
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_cid(p.cid);
                bhs.set_word6(p.cmd_sn);
                bhs.set_word7(p.exp_stat_sn);
            }
            Pdu::SnackRequest(p) => {
                bhs.set_opcode(Opcode::SNACK_REQUEST, false);
                bhs.set_flags(0x80 | (p.snack_type & 0x0f));
                bhs.set_lun(p.lun);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word5(p.ttt);
                bhs.set_word7(p.exp_stat_sn);
                bhs.set_word10(p.beg_run);
                bhs.set_word11(p.run_length);
            }
            Pdu::NopIn(p) => {
                bhs.set_opcode(Opcode::NOP_IN, false);
                bhs.set_flags(0x80);
                bhs.set_lun(p.lun);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word5(p.ttt);
                bhs.set_word6(p.stat_sn);
                bhs.set_word7(p.exp_cmd_sn);
                bhs.set_word8(p.max_cmd_sn);
            }
            Pdu::ScsiResponse(p) => {
                bhs.set_opcode(Opcode::SCSI_RESPONSE, false);
                bhs.set_flags(
                    0x80 | fb(p.bidi_overflow, 0x10)
                        | fb(p.bidi_underflow, 0x08)
                        | fb(p.overflow, 0x04)
                        | fb(p.underflow, 0x02),
                );
                bhs.set_byte2(p.response);
                bhs.set_byte3(p.status);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word5(p.snack_tag);
                bhs.set_word6(p.stat_sn);
                bhs.set_word7(p.exp_cmd_sn);
                bhs.set_word8(p.max_cmd_sn);
                bhs.set_word9(p.exp_data_sn);
                bhs.set_word10(p.bidi_residual_count);
                bhs.set_word11(p.residual_count);
            }
            Pdu::TaskMgmtResponse(p) => {
                bhs.set_opcode(Opcode::TASK_MGMT_RESPONSE, false);
                bhs.set_flags(0x80);
                bhs.set_byte2(p.response.0);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word6(p.stat_sn);
                bhs.set_word7(p.exp_cmd_sn);
                bhs.set_word8(p.max_cmd_sn);
            }
            Pdu::LoginResponse(p) => {
                bhs.set_opcode(Opcode::LOGIN_RESPONSE, false);
                bhs.set_flags(
                    fb(p.transit, 0x80)
                        | fb(p.continue_flag, 0x40)
                        | ((p.csg.0 & 3) << 2)
                        | (p.nsg.0 & 3),
                );
                bhs.set_byte2(p.version_max);
                bhs.set_byte3(p.version_active);
                bhs.set_isid(p.isid);
                bhs.set_tsih(p.tsih);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word6(p.stat_sn);
                bhs.set_word7(p.exp_cmd_sn);
                bhs.set_word8(p.max_cmd_sn);
                bhs.set_word9(
                    (u32::from(p.status_class) << 24) | (u32::from(p.status_detail) << 16),
                );
            }
            Pdu::TextResponse(p) => {
                bhs.set_opcode(Opcode::TEXT_RESPONSE, false);
                bhs.set_flags(fb(p.final_flag, 0x80) | fb(p.continue_flag, 0x40));
                bhs.set_lun(p.lun);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word5(p.ttt);
                bhs.set_word6(p.stat_sn);
                bhs.set_word7(p.exp_cmd_sn);
                bhs.set_word8(p.max_cmd_sn);
            }
            Pdu::DataIn(p) => {
                bhs.set_opcode(Opcode::SCSI_DATA_IN, false);
                bhs.set_flags(
                    fb(p.final_flag, 0x80)
                        | fb(p.acknowledge, 0x40)
                        | fb(p.overflow, 0x04)
                        | fb(p.underflow, 0x02)
                        | fb(p.status_present, 0x01),
                );
                bhs.set_byte3(p.status);
                bhs.set_lun(p.lun);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word5(p.ttt);
                bhs.set_word6(p.stat_sn);
                bhs.set_word7(p.exp_cmd_sn);
                bhs.set_word8(p.max_cmd_sn);
                bhs.set_word9(p.data_sn);
                bhs.set_word10(p.buffer_offset);
                bhs.set_word11(p.residual_count);
            }
            Pdu::LogoutResponse(p) => {
                bhs.set_opcode(Opcode::LOGOUT_RESPONSE, false);
                bhs.set_flags(0x80);
                bhs.set_byte2(p.response);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word6(p.stat_sn);
                bhs.set_word7(p.exp_cmd_sn);
                bhs.set_word8(p.max_cmd_sn);
                bhs.set_word10((u32::from(p.time2wait) << 16) | u32::from(p.time2retain));
            }
            Pdu::R2t(p) => {
                bhs.set_opcode(Opcode::R2T, false);
                bhs.set_flags(0x80);
                bhs.set_lun(p.lun);
                bhs.set_initiator_task_tag(p.itt);
                bhs.set_word5(p.ttt);
                bhs.set_word6(p.stat_sn);
                bhs.set_word7(p.exp_cmd_sn);
                bhs.set_word8(p.max_cmd_sn);
                bhs.set_word9(p.r2t_sn);
                bhs.set_word10(p.buffer_offset);
                bhs.set_word11(p.desired_data_transfer_length);
            }
            Pdu::AsyncMessage(p) => {
                bhs.set_opcode(Opcode::ASYNC_MESSAGE, false);
                bhs.set_flags(0x80);
                bhs.set_lun(p.lun);
                bhs.set_initiator_task_tag(u32::MAX);
                bhs.set_word6(p.stat_sn);
                bhs.set_word7(p.exp_cmd_sn);
                bhs.set_word8(p.max_cmd_sn);
                bhs.set_word9(
                    (u32::from(p.event.0) << 24)
                        | (u32::from(p.vcode) << 16)
                        | u32::from(p.parameter1),
                );
                bhs.set_word10((u32::from(p.parameter2) << 16) | u32::from(p.parameter3));
            }
            Pdu::Reject(p) => {
                bhs.set_opcode(Opcode::REJECT, false);
                bhs.set_flags(0x80);
                bhs.set_byte2(p.reason.0);
                bhs.set_initiator_task_tag(u32::MAX);
                bhs.set_word6(p.stat_sn);
                bhs.set_word7(p.exp_cmd_sn);
                bhs.set_word8(p.max_cmd_sn);
                bhs.set_word9(p.data_sn);
            }
        }
    }

    /// Emits into a fresh 48-byte array.
    pub fn to_bhs(&self, total_ahs_length: u8, data_segment_length: u32) -> [u8; BHS_LEN] {
        let mut buf = [0u8; BHS_LEN];
        self.emit(
            &mut Bhs::new_unchecked(&mut buf[..]),
            total_ahs_length,
            data_segment_length,
        );
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Pdu> {
        let lun = 0x0001_0000_0000_0000;
        vec![
            Pdu::NopOut(NopOut {
                immediate: true,
                lun,
                itt: 1,
                ttt: u32::MAX,
                cmd_sn: 7,
                exp_stat_sn: 9,
            }),
            Pdu::ScsiCommand(ScsiCommand {
                immediate: false,
                final_flag: true,
                read: true,
                write: false,
                attr: TaskAttrCode::SIMPLE,
                lun,
                itt: 0x1234,
                expected_data_transfer_length: 4096,
                cmd_sn: 0x10,
                exp_stat_sn: 0x20,
                cdb: [0x28, 0, 0, 0, 0, 8, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0],
            }),
            Pdu::TaskMgmtRequest(TaskMgmtRequest {
                immediate: true,
                function: TmfCode::ABORT_TASK,
                lun,
                itt: 5,
                referenced_task_tag: 4,
                cmd_sn: 3,
                exp_stat_sn: 2,
                ref_cmd_sn: 1,
                exp_data_sn: 6,
            }),
            Pdu::LoginRequest(LoginRequest {
                transit: true,
                continue_flag: false,
                csg: Stage::SECURITY_NEGOTIATION,
                nsg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                version_max: 0,
                version_min: 0,
                isid: [0x40, 0, 1, 0x37, 0, 0],
                tsih: 0,
                itt: 0,
                cid: 1,
                cmd_sn: 1,
                exp_stat_sn: 0,
            }),
            Pdu::TextRequest(TextRequest {
                immediate: true,
                final_flag: true,
                continue_flag: false,
                lun: 0,
                itt: 9,
                ttt: u32::MAX,
                cmd_sn: 1,
                exp_stat_sn: 2,
            }),
            Pdu::DataOut(DataOut {
                final_flag: true,
                lun,
                itt: 3,
                ttt: 77,
                exp_stat_sn: 8,
                data_sn: 2,
                buffer_offset: 8192,
            }),
            Pdu::LogoutRequest(LogoutRequest {
                immediate: true,
                reason: LogoutReason::CLOSE_CONNECTION,
                itt: 4,
                cid: 2,
                cmd_sn: 5,
                exp_stat_sn: 6,
            }),
            Pdu::SnackRequest(SnackRequest {
                snack_type: 1,
                lun,
                itt: 1,
                ttt: 2,
                exp_stat_sn: 3,
                beg_run: 4,
                run_length: 5,
            }),
            Pdu::NopIn(NopIn {
                lun,
                itt: u32::MAX,
                ttt: 12,
                stat_sn: 1,
                exp_cmd_sn: 2,
                max_cmd_sn: 33,
            }),
            Pdu::ScsiResponse(ScsiResponse {
                bidi_overflow: true,
                bidi_underflow: false,
                overflow: false,
                underflow: true,
                response: 0,
                status: 2,
                itt: 0x99,
                snack_tag: 0,
                stat_sn: 100,
                exp_cmd_sn: 101,
                max_cmd_sn: 164,
                exp_data_sn: 3,
                bidi_residual_count: 512,
                residual_count: 1024,
            }),
            Pdu::TaskMgmtResponse(TaskMgmtResponse {
                response: TmfResponseCode::TASK_DOES_NOT_EXIST,
                itt: 5,
                stat_sn: 1,
                exp_cmd_sn: 2,
                max_cmd_sn: 3,
            }),
            Pdu::LoginResponse(LoginResponse {
                transit: true,
                continue_flag: false,
                csg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                nsg: Stage::FULL_FEATURE_PHASE,
                version_max: 0,
                version_active: 0,
                isid: [0x40, 0, 1, 0x37, 0, 0],
                tsih: 0x0102,
                itt: 0,
                stat_sn: 1,
                exp_cmd_sn: 1,
                max_cmd_sn: 64,
                status_class: 2,
                status_detail: 1,
            }),
            Pdu::TextResponse(TextResponse {
                final_flag: false,
                continue_flag: true,
                lun: 0,
                itt: 9,
                ttt: 0x55,
                stat_sn: 1,
                exp_cmd_sn: 2,
                max_cmd_sn: 3,
            }),
            Pdu::DataIn(DataIn {
                final_flag: true,
                acknowledge: false,
                overflow: true,
                underflow: false,
                status_present: true,
                status: 0,
                lun,
                itt: 0x1234,
                ttt: u32::MAX,
                stat_sn: 5,
                exp_cmd_sn: 6,
                max_cmd_sn: 70,
                data_sn: 1,
                buffer_offset: 65536,
                residual_count: 100,
            }),
            Pdu::LogoutResponse(LogoutResponse {
                response: 1,
                itt: 4,
                stat_sn: 5,
                exp_cmd_sn: 6,
                max_cmd_sn: 7,
                time2wait: 2,
                time2retain: 20,
            }),
            Pdu::R2t(R2t {
                lun,
                itt: 3,
                ttt: 77,
                stat_sn: 8,
                exp_cmd_sn: 9,
                max_cmd_sn: 10,
                r2t_sn: 1,
                buffer_offset: 65536,
                desired_data_transfer_length: 262144,
            }),
            Pdu::AsyncMessage(AsyncMessage {
                lun: 0,
                stat_sn: 1,
                exp_cmd_sn: 2,
                max_cmd_sn: 3,
                event: AsyncEvent::LOGOUT_REQUEST,
                vcode: 0,
                parameter1: 0,
                parameter2: 0,
                parameter3: 5,
            }),
            Pdu::Reject(Reject {
                reason: RejectReason::PROTOCOL_ERROR,
                stat_sn: 1,
                exp_cmd_sn: 2,
                max_cmd_sn: 3,
                data_sn: 0,
            }),
        ]
    }

    #[test]
    fn every_pdu_round_trips() {
        for pdu in samples() {
            let bytes = pdu.to_bhs(1, 300);
            let bhs = Bhs::new_checked(&bytes[..]).unwrap();
            assert_eq!(bhs.opcode(), pdu.opcode());
            assert_eq!(bhs.total_ahs_length(), 1);
            assert_eq!(bhs.data_segment_length(), 300);
            let parsed = Pdu::parse(&bhs).unwrap();
            assert_eq!(parsed, pdu, "{:?}", pdu.opcode());
            assert_eq!(parsed.to_bhs(1, 300), bytes);
            assert_eq!(parsed.itt(), pdu.itt());
        }
    }

    #[test]
    fn known_bytes() {
        // A READ(10) command as open-iscsi sends it.
        let cmd = samples()[1];
        let b = cmd.to_bhs(0, 0);
        assert_eq!(b[0], 0x01);
        assert_eq!(b[1], 0xc1);
        assert_eq!(&b[8..10], &[0x00, 0x01]);
        assert_eq!(&b[16..20], &[0, 0, 0x12, 0x34]);
        assert_eq!(&b[20..24], &[0, 0, 0x10, 0]);
        assert_eq!(b[32], 0x28);
        // The login request always has the I bit.
        let login = samples()[3].to_bhs(0, 0);
        assert_eq!(login[0], 0x43);
        assert_eq!(login[1], 0x81);
        // Status-Class/Detail at bytes 36, 37.
        let resp = samples()[11].to_bhs(0, 0);
        assert_eq!(&resp[36..38], &[2, 1]);
        assert_eq!(resp[1], 0x87);
    }

    #[test]
    fn unknown_opcode_and_truncation() {
        let mut b = [0u8; BHS_LEN];
        b[0] = 0x1c;
        assert_eq!(
            Pdu::parse(&Bhs::new_checked(&b[..]).unwrap()),
            Err(WireError::UnknownOpcode(0x1c))
        );
        for n in 0..BHS_LEN {
            assert_eq!(
                Bhs::new_checked(&b[..n]).err(),
                Some(WireError::Truncated {
                    needed: BHS_LEN,
                    got: n
                })
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn parse_emit_is_stable(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), BHS_LEN)) {
            let bhs = Bhs::new_checked(&bytes[..]).unwrap();
            if let Ok(pdu) = Pdu::parse(&bhs) {
                let again = pdu.to_bhs(bhs.total_ahs_length(), bhs.data_segment_length());
                let reparsed = Pdu::parse(&Bhs::new_checked(&again[..]).unwrap()).unwrap();
                proptest::prop_assert_eq!(reparsed, pdu);
            }
        }
    }
}
