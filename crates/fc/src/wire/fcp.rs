//! FCP-4 information units (FCP-4 §9): FCP_CMND, FCP_XFER_RDY, FCP_RSP.
//! FCP_DATA is the frame payload itself, placed by the relative offset in
//! the header's Parameter field.
//!
//! The fixed parts are zero-copy views; the representations keep the CDB,
//! response information and sense as `Bytes` slices of the frame.

use bytes::Bytes;
use unifab_scsi_core::Lun;

use super::be;
use super::{WireError, check_len};

/// Smallest FCP_CMND (16-byte CDB, no bidirectional length).
pub const FCP_CMND_MIN_LEN: usize = 32;
/// FCP_XFER_RDY length.
pub const XFER_RDY_LEN: usize = 12;
/// FCP_RSP length without response information or sense.
pub const FCP_RSP_MIN_LEN: usize = 24;

/// FCP task attribute codes (FCP-4 Table 23). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FcpTaskAttr(pub u8);

#[allow(missing_docs)]
impl FcpTaskAttr {
    pub const SIMPLE: FcpTaskAttr = FcpTaskAttr(0);
    pub const HEAD_OF_QUEUE: FcpTaskAttr = FcpTaskAttr(1);
    pub const ORDERED: FcpTaskAttr = FcpTaskAttr(2);
    pub const ACA: FcpTaskAttr = FcpTaskAttr(4);
    /// Obsolete untagged.
    pub const UNTAGGED: FcpTaskAttr = FcpTaskAttr(5);
}

/// FCP task management flags (FCP-4 Table 24). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FcpTmf(pub u8);

#[allow(missing_docs)]
impl FcpTmf {
    pub const NONE: FcpTmf = FcpTmf(0);
    pub const ABORT_TASK_SET: FcpTmf = FcpTmf(0x02);
    pub const CLEAR_TASK_SET: FcpTmf = FcpTmf(0x04);
    pub const LOGICAL_UNIT_RESET: FcpTmf = FcpTmf(0x10);
    /// Obsolete in FCP-4, still sent by some initiators.
    pub const TARGET_RESET: FcpTmf = FcpTmf(0x20);
    pub const CLEAR_ACA: FcpTmf = FcpTmf(0x40);
}

/// FCP_RSP_CODE (FCP-4 Table 29). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FcpRspCode(pub u8);

#[allow(missing_docs)]
impl FcpRspCode {
    pub const COMPLETE: FcpRspCode = FcpRspCode(0);
    pub const DATA_LENGTH_MISMATCH: FcpRspCode = FcpRspCode(1);
    pub const INVALID_CMND_FIELDS: FcpRspCode = FcpRspCode(2);
    pub const DATA_RO_MISMATCH: FcpRspCode = FcpRspCode(3);
    pub const TMF_NOT_SUPPORTED: FcpRspCode = FcpRspCode(4);
    pub const TMF_FAILED: FcpRspCode = FcpRspCode(5);
    pub const TMF_INCORRECT_LUN: FcpRspCode = FcpRspCode(9);
    pub const TMF_SUCCEEDED: FcpRspCode = FcpRspCode(8);
}

/// FCP_RSP flags (FCP-4 Table 28).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FcpRspFlags(pub u8);

#[allow(missing_docs)]
impl FcpRspFlags {
    pub const RSP_LEN_VALID: u8 = 0x01;
    pub const SNS_LEN_VALID: u8 = 0x02;
    pub const RESID_OVER: u8 = 0x04;
    pub const RESID_UNDER: u8 = 0x08;
    pub const CONF_REQ: u8 = 0x10;
    pub const BIDI_READ_RESID_OVER: u8 = 0x20;
    pub const BIDI_READ_RESID_UNDER: u8 = 0x40;
    pub const BIDI_RSP: u8 = 0x80;

    /// True when every bit of `mask` is set.
    pub const fn contains(self, mask: u8) -> bool {
        self.0 & mask == mask
    }
}

/// Field offsets of FCP_CMND.
#[allow(missing_docs)]
pub mod cmnd_field {
    pub const FCP_LUN: usize = 0;
    pub const CRN: usize = 8;
    pub const TASK_ATTRIBUTE: usize = 9;
    pub const TMF_FLAGS: usize = 10;
    pub const ADDL_CDB_LEN_RW: usize = 11;
    pub const FCP_CDB: usize = 12;
}

/// A zero-copy view of an FCP_CMND IU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FcpCmnd<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> FcpCmnd<T> {
    /// Wraps a buffer holding a whole FCP_CMND, checking that it is long
    /// enough for its additional CDB and bidirectional length.
    pub fn new_checked(buffer: T) -> Result<FcpCmnd<T>, WireError> {
        let b = buffer.as_ref();
        check_len(b, FCP_CMND_MIN_LEN)?;
        let v = FcpCmnd { buffer };
        check_len(v.buffer.as_ref(), v.required_len())?;
        Ok(v)
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Length this IU needs, from its additional CDB length and RD/WR bits.
    pub fn required_len(&self) -> usize {
        FCP_CMND_MIN_LEN
            + 4 * usize::from(self.additional_cdb_len())
            + if self.rddata() && self.wrdata() { 4 } else { 0 }
    }

    /// FCP_LUN.
    pub fn lun(&self) -> Lun {
        Lun(be::u64_at(self.b(), cmnd_field::FCP_LUN))
    }

    /// Command reference number.
    pub fn crn(&self) -> u8 {
        self.b()[cmnd_field::CRN]
    }

    /// Task priority (4 bits).
    pub fn priority(&self) -> u8 {
        (self.b()[cmnd_field::TASK_ATTRIBUTE] >> 3) & 0x0f
    }

    /// Task attribute (3 bits).
    pub fn task_attribute(&self) -> FcpTaskAttr {
        FcpTaskAttr(self.b()[cmnd_field::TASK_ATTRIBUTE] & 0x07)
    }

    /// Task management flags.
    pub fn tmf_flags(&self) -> FcpTmf {
        FcpTmf(self.b()[cmnd_field::TMF_FLAGS])
    }

    /// Additional FCP_CDB length in words.
    pub fn additional_cdb_len(&self) -> u8 {
        self.b()[cmnd_field::ADDL_CDB_LEN_RW] >> 2
    }

    /// RDDATA: data-in expected.
    pub fn rddata(&self) -> bool {
        self.b()[cmnd_field::ADDL_CDB_LEN_RW] & 0x02 != 0
    }

    /// WRDATA: data-out expected.
    pub fn wrdata(&self) -> bool {
        self.b()[cmnd_field::ADDL_CDB_LEN_RW] & 0x01 != 0
    }

    /// The CDB: FCP_CDB and any additional CDB bytes.
    pub fn cdb(&self) -> &[u8] {
        let n = 16 + 4 * usize::from(self.additional_cdb_len());
        &self.b()[cmnd_field::FCP_CDB..cmnd_field::FCP_CDB + n]
    }

    fn dl_at(&self) -> usize {
        cmnd_field::FCP_CDB + 16 + 4 * usize::from(self.additional_cdb_len())
    }

    /// FCP_DL: the expected data length (data-out for a write, data-in
    /// otherwise).
    pub fn fcp_dl(&self) -> u32 {
        be::u32_at(self.b(), self.dl_at())
    }

    /// FCP_BIDIRECTIONAL_READ_DL, when both RDDATA and WRDATA are set.
    pub fn bidirectional_read_dl(&self) -> Option<u32> {
        (self.rddata() && self.wrdata()).then(|| be::u32_at(self.b(), self.dl_at() + 4))
    }
}

/// The owned meaning of an FCP_CMND.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FcpCmndRepr {
    /// FCP_LUN.
    pub lun: Lun,
    /// Command reference number.
    pub crn: u8,
    /// Priority (4 bits).
    pub priority: u8,
    /// Task attribute.
    pub task_attribute: FcpTaskAttr,
    /// Task management flags (non-zero: a TMF, no CDB).
    pub tmf: FcpTmf,
    /// Data-in expected.
    pub rddata: bool,
    /// Data-out expected.
    pub wrdata: bool,
    /// The CDB field: 16 bytes plus a multiple of 4 (zero-padded CDB).
    pub cdb: Bytes,
    /// FCP_DL.
    pub fcp_dl: u32,
    /// FCP_BIDIRECTIONAL_READ_DL, with RDDATA and WRDATA both set.
    pub bidirectional_read_dl: Option<u32>,
}

impl FcpCmndRepr {
    /// Parses an FCP_CMND payload; the CDB is a slice of `payload`.
    pub fn parse(payload: &Bytes) -> Result<FcpCmndRepr, WireError> {
        let v = FcpCmnd::new_checked(&payload[..])?;
        let cdb_len = 16 + 4 * usize::from(v.additional_cdb_len());
        Ok(FcpCmndRepr {
            lun: v.lun(),
            crn: v.crn(),
            priority: v.priority(),
            task_attribute: v.task_attribute(),
            tmf: v.tmf_flags(),
            rddata: v.rddata(),
            wrdata: v.wrdata(),
            cdb: payload.slice(cmnd_field::FCP_CDB..cmnd_field::FCP_CDB + cdb_len),
            fcp_dl: v.fcp_dl(),
            bidirectional_read_dl: v.bidirectional_read_dl(),
        })
    }

    /// A command for `cdb` (padded to 16 bytes, or to a word beyond).
    pub fn command(lun: Lun, cdb: &[u8], fcp_dl: u32, rddata: bool, wrdata: bool) -> FcpCmndRepr {
        let n = cdb.len().max(16).div_ceil(4) * 4;
        let mut v = vec![0u8; n];
        v[..cdb.len()].copy_from_slice(cdb);
        FcpCmndRepr {
            lun,
            rddata,
            wrdata,
            cdb: Bytes::from(v),
            fcp_dl,
            bidirectional_read_dl: (rddata && wrdata).then_some(0),
            ..FcpCmndRepr::default()
        }
    }

    /// Length in bytes.
    pub fn buffer_len(&self) -> usize {
        12 + self.cdb_field_len() + 4 + if self.rddata && self.wrdata { 4 } else { 0 }
    }

    fn cdb_field_len(&self) -> usize {
        self.cdb.len().max(16).div_ceil(4) * 4
    }

    /// Writes the IU into `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let n = self.buffer_len();
        check_len(buf, n)?;
        let addl = (self.cdb_field_len() - 16) / 4;
        if addl > 63 {
            return Err(WireError::InvalidField("CDB longer than 268 bytes"));
        }
        let b = &mut buf[..n];
        b.fill(0);
        be::put_u64(b, cmnd_field::FCP_LUN, self.lun.0);
        b[cmnd_field::CRN] = self.crn;
        b[cmnd_field::TASK_ATTRIBUTE] =
            ((self.priority & 0x0f) << 3) | (self.task_attribute.0 & 0x07);
        b[cmnd_field::TMF_FLAGS] = self.tmf.0;
        b[cmnd_field::ADDL_CDB_LEN_RW] =
            ((addl as u8) << 2) | (u8::from(self.rddata) << 1) | u8::from(self.wrdata);
        b[12..12 + self.cdb.len()].copy_from_slice(&self.cdb);
        let at = 12 + self.cdb_field_len();
        be::put_u32(b, at, self.fcp_dl);
        if self.rddata && self.wrdata {
            be::put_u32(b, at + 4, self.bidirectional_read_dl.unwrap_or(0));
        }
        Ok(())
    }
}

/// A zero-copy view of FCP_XFER_RDY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XferRdy<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> XferRdy<T> {
    /// Wraps a buffer of at least 12 bytes.
    pub fn new_checked(buffer: T) -> Result<XferRdy<T>, WireError> {
        check_len(buffer.as_ref(), XFER_RDY_LEN)?;
        Ok(XferRdy { buffer })
    }

    /// FCP_DATA_RO: where the burst starts.
    pub fn data_ro(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), 0)
    }

    /// FCP_BURST_LEN.
    pub fn burst_len(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), 4)
    }
}

/// The owned meaning of FCP_XFER_RDY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct XferRdyRepr {
    /// Relative offset of the burst.
    pub data_ro: u32,
    /// Burst length.
    pub burst_len: u32,
}

impl XferRdyRepr {
    /// Reads a view.
    pub fn parse<T: AsRef<[u8]>>(v: &XferRdy<T>) -> XferRdyRepr {
        XferRdyRepr {
            data_ro: v.data_ro(),
            burst_len: v.burst_len(),
        }
    }

    /// Always 12.
    pub const fn buffer_len(&self) -> usize {
        XFER_RDY_LEN
    }

    /// Writes the IU.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        check_len(buf, XFER_RDY_LEN)?;
        be::put_u32(buf, 0, self.data_ro);
        be::put_u32(buf, 4, self.burst_len);
        be::put_u32(buf, 8, 0);
        Ok(())
    }

    /// The 12 wire bytes.
    pub fn to_bytes(&self) -> [u8; XFER_RDY_LEN] {
        let mut b = [0u8; XFER_RDY_LEN];
        let _ = self.emit(&mut b);
        b
    }
}

/// A zero-copy view of FCP_RSP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FcpRsp<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> FcpRsp<T> {
    /// Wraps a buffer holding a whole FCP_RSP, checking it is long enough
    /// for the response information and sense its flags announce.
    pub fn new_checked(buffer: T) -> Result<FcpRsp<T>, WireError> {
        check_len(buffer.as_ref(), FCP_RSP_MIN_LEN)?;
        let v = FcpRsp { buffer };
        let need = FCP_RSP_MIN_LEN as u64
            + u64::from(v.rsp_len())
            + u64::from(v.sns_len())
            + if v.flags().contains(FcpRspFlags::BIDI_RSP) {
                4
            } else {
                0
            };
        if need > v.buffer.as_ref().len() as u64 {
            return Err(WireError::Truncated {
                needed: usize::try_from(need).unwrap_or(usize::MAX),
                got: v.buffer.as_ref().len(),
            });
        }
        Ok(v)
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Retry delay timer / status qualifier (bytes 8–9).
    pub fn retry_delay_timer(&self) -> u16 {
        be::u16_at(self.b(), 8)
    }

    /// Flags.
    pub fn flags(&self) -> FcpRspFlags {
        FcpRspFlags(self.b()[10])
    }

    /// SCSI status.
    pub fn scsi_status(&self) -> u8 {
        self.b()[11]
    }

    /// FCP_RESID.
    pub fn resid(&self) -> u32 {
        be::u32_at(self.b(), 12)
    }

    /// FCP_SNS_LEN (0 unless the flag says it is valid).
    pub fn sns_len(&self) -> u32 {
        if self.flags().contains(FcpRspFlags::SNS_LEN_VALID) {
            be::u32_at(self.b(), 16)
        } else {
            0
        }
    }

    /// FCP_RSP_LEN (0 unless the flag says it is valid).
    pub fn rsp_len(&self) -> u32 {
        if self.flags().contains(FcpRspFlags::RSP_LEN_VALID) {
            be::u32_at(self.b(), 20)
        } else {
            0
        }
    }

    /// FCP_RSP_INFO.
    pub fn rsp_info(&self) -> &[u8] {
        &self.b()[24..24 + self.rsp_len() as usize]
    }

    /// FCP_RSP_CODE, when response information is present.
    pub fn rsp_code(&self) -> Option<FcpRspCode> {
        self.rsp_info().get(3).map(|c| FcpRspCode(*c))
    }

    /// FCP_SNS_INFO.
    pub fn sense(&self) -> &[u8] {
        let at = 24 + self.rsp_len() as usize;
        &self.b()[at..at + self.sns_len() as usize]
    }

    /// FCP_BIDIRECTIONAL_READ_RESID, with FCP_BIDI_RSP.
    pub fn bidirectional_read_resid(&self) -> Option<u32> {
        self.flags().contains(FcpRspFlags::BIDI_RSP).then(|| {
            let at = 24 + self.rsp_len() as usize + self.sns_len() as usize;
            be::u32_at(self.b(), at)
        })
    }
}

/// The owned meaning of FCP_RSP.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FcpRspRepr {
    /// Retry delay timer / status qualifier.
    pub retry_delay_timer: u16,
    /// Flags. On emit the length-valid bits are added where `rsp_info` or
    /// `sense` is not empty, and BIDI_RSP follows
    /// `bidirectional_read_resid`.
    pub flags: FcpRspFlags,
    /// SCSI status.
    pub scsi_status: u8,
    /// FCP_RESID.
    pub resid: u32,
    /// FCP_RSP_INFO (empty, 4 or 8 bytes).
    pub rsp_info: Bytes,
    /// FCP_SNS_INFO.
    pub sense: Bytes,
    /// FCP_BIDIRECTIONAL_READ_RESID.
    pub bidirectional_read_resid: Option<u32>,
}

impl FcpRspRepr {
    /// Parses an FCP_RSP payload; response information and sense are
    /// slices of `payload`.
    pub fn parse(payload: &Bytes) -> Result<FcpRspRepr, WireError> {
        let v = FcpRsp::new_checked(&payload[..])?;
        let r = v.rsp_len() as usize;
        let s = v.sns_len() as usize;
        Ok(FcpRspRepr {
            retry_delay_timer: v.retry_delay_timer(),
            flags: v.flags(),
            scsi_status: v.scsi_status(),
            resid: v.resid(),
            rsp_info: payload.slice(24..24 + r),
            sense: payload.slice(24 + r..24 + r + s),
            bidirectional_read_resid: v.bidirectional_read_resid(),
        })
    }

    /// A task management response with the given code.
    pub fn tmf(code: FcpRspCode) -> FcpRspRepr {
        FcpRspRepr {
            rsp_info: Bytes::copy_from_slice(&[0, 0, 0, code.0, 0, 0, 0, 0]),
            ..FcpRspRepr::default()
        }
    }

    /// FCP_RSP_CODE, when response information is present.
    pub fn rsp_code(&self) -> Option<FcpRspCode> {
        self.rsp_info.get(3).map(|c| FcpRspCode(*c))
    }

    fn effective_flags(&self) -> u8 {
        // A length-valid flag may stand with a zero length; BIDI_RSP only
        // with the residual it announces.
        let mut f = self.flags.0 & !FcpRspFlags::BIDI_RSP;
        if !self.rsp_info.is_empty() {
            f |= FcpRspFlags::RSP_LEN_VALID;
        }
        if !self.sense.is_empty() {
            f |= FcpRspFlags::SNS_LEN_VALID;
        }
        if self.bidirectional_read_resid.is_some() {
            f |= FcpRspFlags::BIDI_RSP;
        }
        f
    }

    /// Length in bytes.
    pub fn buffer_len(&self) -> usize {
        FCP_RSP_MIN_LEN
            + self.rsp_info.len()
            + self.sense.len()
            + if self.bidirectional_read_resid.is_some() {
                4
            } else {
                0
            }
    }

    /// Writes the IU.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let n = self.buffer_len();
        check_len(buf, n)?;
        let b = &mut buf[..n];
        b[..8].fill(0);
        be::put_u16(b, 8, self.retry_delay_timer);
        b[10] = self.effective_flags();
        b[11] = self.scsi_status;
        be::put_u32(b, 12, self.resid);
        be::put_u32(b, 16, self.sense.len() as u32);
        be::put_u32(b, 20, self.rsp_info.len() as u32);
        let r = self.rsp_info.len();
        b[24..24 + r].copy_from_slice(&self.rsp_info);
        b[24 + r..24 + r + self.sense.len()].copy_from_slice(&self.sense);
        if let Some(x) = self.bidirectional_read_resid {
            be::put_u32(b, 24 + r + self.sense.len(), x);
        }
        Ok(())
    }

    /// The IU as a buffer. GOOD status with nothing else to say (no
    /// residual, sense or response info) is 24 zero bytes: a shared
    /// static, not an allocation per command.
    pub fn to_bytes(&self) -> Result<Bytes, WireError> {
        static GOOD: [u8; FCP_RSP_MIN_LEN] = [0; FCP_RSP_MIN_LEN];
        if self.buffer_len() == FCP_RSP_MIN_LEN {
            let mut b = [0u8; FCP_RSP_MIN_LEN];
            self.emit(&mut b)?;
            if b == GOOD {
                return Ok(Bytes::from_static(&GOOD));
            }
            return Ok(Bytes::copy_from_slice(&b));
        }
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(Bytes::from(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fcp_rsp_to_bytes_shares_good_and_builds_the_rest() {
        let good = FcpRspRepr {
            scsi_status: 0,
            ..Default::default()
        };
        let b = good.to_bytes().unwrap();
        assert_eq!(&b[..], &[0u8; FCP_RSP_MIN_LEN][..]);
        assert_eq!(b.as_ptr(), good.to_bytes().unwrap().as_ptr());
        assert_eq!(FcpRspRepr::parse(&b).unwrap(), good);
        // Anything else is its own buffer, and parses back to itself.
        let under = FcpRspRepr {
            flags: FcpRspFlags(FcpRspFlags::RESID_UNDER),
            resid: 512,
            ..Default::default()
        };
        let busy = FcpRspRepr {
            scsi_status: 0x08,
            ..Default::default()
        };
        let check = FcpRspRepr {
            scsi_status: 0x02,
            sense: Bytes::from_static(&[
                0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0,
            ]),
            ..Default::default()
        };
        for mut r in [under, busy, check] {
            let b = r.to_bytes().unwrap();
            assert_ne!(&b[..FCP_RSP_MIN_LEN], &[0u8; FCP_RSP_MIN_LEN][..]);
            // Emit adds the length-valid bits.
            r.flags = FcpRspFlags(r.effective_flags());
            assert_eq!(FcpRspRepr::parse(&b).unwrap(), r);
        }
    }

    #[test]
    fn report_luns_command_layout() {
        // REPORT LUNS to LUN 0 laid out byte by byte from FCP-4 Table 22.
        let mut b = vec![0u8; 32];
        b[9] = 0; // SIMPLE
        b[11] = 0x02; // RDDATA
        b[12] = 0xa0;
        b[18..22].copy_from_slice(&[0, 0, 0x10, 0]);
        b[28..32].copy_from_slice(&0x1000u32.to_be_bytes());
        let bytes = Bytes::from(b.clone());
        let c = FcpCmndRepr::parse(&bytes).unwrap();
        assert!(c.rddata && !c.wrdata);
        assert_eq!(c.cdb[0], 0xa0);
        assert_eq!(c.cdb.len(), 16);
        assert_eq!(c.fcp_dl, 0x1000);
        let mut out = vec![0u8; c.buffer_len()];
        c.emit(&mut out).unwrap();
        assert_eq!(out, b);
        for n in 0..32 {
            assert!(FcpCmndRepr::parse(&bytes.slice(..n)).is_err());
        }
    }

    #[test]
    fn additional_cdb_and_bidi() {
        let cdb: Vec<u8> = (0..32).collect();
        let mut c = FcpCmndRepr::command(Lun(1 << 48), &cdb, 512, true, true);
        c.bidirectional_read_dl = Some(4096);
        c.priority = 5;
        c.task_attribute = FcpTaskAttr::ORDERED;
        let mut out = vec![0u8; c.buffer_len()];
        c.emit(&mut out).unwrap();
        assert_eq!(out.len(), 12 + 32 + 8);
        assert_eq!(out[11], (4 << 2) | 3);
        let v = FcpCmnd::new_checked(&out[..]).unwrap();
        assert_eq!(v.cdb(), &cdb[..]);
        assert_eq!(v.priority(), 5);
        assert_eq!(v.bidirectional_read_dl(), Some(4096));
        assert_eq!(FcpCmndRepr::parse(&Bytes::from(out.clone())).unwrap(), c);
        // Cut before the bidirectional length.
        assert!(FcpCmnd::new_checked(&out[..out.len() - 1]).is_err());
    }

    #[test]
    fn rsp_with_sense_and_residual() {
        let r = FcpRspRepr {
            flags: FcpRspFlags(FcpRspFlags::RESID_UNDER),
            scsi_status: 2,
            resid: 512,
            sense: Bytes::from_static(&[
                0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0,
            ]),
            ..FcpRspRepr::default()
        };
        let b = r.to_bytes().unwrap();
        assert_eq!(b[10], FcpRspFlags::RESID_UNDER | FcpRspFlags::SNS_LEN_VALID);
        let p = FcpRspRepr::parse(&b).unwrap();
        assert_eq!(p.sense, r.sense);
        assert_eq!(p.resid, 512);
        assert_eq!(p.to_bytes().unwrap(), b);
        let v = FcpRsp::new_checked(&b[..]).unwrap();
        assert_eq!(v.sense()[12], 0x24);
        assert!(FcpRsp::new_checked(&b[..b.len() - 1]).is_err());
        let t = FcpRspRepr::tmf(FcpRspCode::TMF_INCORRECT_LUN);
        let tb = t.to_bytes().unwrap();
        assert_eq!(tb.len(), 32);
        assert_eq!(
            FcpRspRepr::parse(&tb).unwrap().rsp_code(),
            Some(FcpRspCode::TMF_INCORRECT_LUN)
        );
        // A huge announced sense length is a truncation, not a panic.
        let mut bad = b.to_vec();
        bad[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(FcpRspRepr::parse(&Bytes::from(bad)).is_err());
    }

    #[test]
    fn xfer_rdy() {
        let x = XferRdyRepr {
            data_ro: 65536,
            burst_len: 65536,
        };
        let b = x.to_bytes();
        assert_eq!(
            XferRdyRepr::parse(&XferRdy::new_checked(&b[..]).unwrap()),
            x
        );
        assert!(XferRdy::new_checked(&b[..11]).is_err());
    }
}
