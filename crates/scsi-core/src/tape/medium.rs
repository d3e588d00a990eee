//! The unifab tape image: a tape cartridge kept in a [`BlockBackend`]
//! (a sparse file, whose size is the cartridge's capacity).
//!
//! # Format (version 1, little-endian)
//!
//! | offset | length | contents |
//! |---|---|---|
//! | 0 | 512 | label: `"UNIFAB-TAPE\0"`, version (u32) = 1, early-warning size in bytes (u64), CRC-32C of bytes 0..24 (u32) |
//! | 512 | 512 | sync record: `"SYNC"`, 4 reserved, synced end (u64), CRC-32C of bytes 0..16 (u32) |
//! | 4096 | … | records, back to back |
//!
//! Each record is a 32-byte header and its data: `"UFTR"`, kind (u8: 1
//! logical block, 2 filemark, 3 end-of-data), 3 reserved, generation
//! (u32), data length (u32), logical object number (u64), CRC-32C of the
//! data (u32), CRC-32C of header bytes 0..28 (u32).
//!
//! A tape is written sequentially, and writing anywhere but at
//! end-of-data erases everything after it. The image never moves data to
//! do so: an overwrite (or ERASE) starts a new *generation*, and opening
//! the image reads records from the start while each is whole, is logical
//! object number *i* at position *i*, and has a generation no older than
//! the record before it. What was erased is older, so the scan stops
//! there; an end-of-data record stops it where nothing newer was written.
//!
//! Durability: records before the *synced end* were flushed to stable
//! storage before the sync record said so; their data is checked when
//! read. Records after it are checked whole (data CRC too) when the image
//! is opened, so a record torn by a crash ends the tape where it began.
//! An overwrite before the synced end lowers it first (a FUA write).
//!
//! The capacity is the backend's size less the 4 KiB of label; early
//! warning is reported once the records reach `capacity - early_warning`.

use bytes::{BufMut, Bytes, BytesMut};
use std::sync::Arc;

use crate::backend::{BackendError, BlockBackend};

/// Where records start.
pub const DATA_START: u64 = 4096;
/// A record's header.
pub const RECORD_HEADER: u64 = 32;
const LABEL_MAGIC: &[u8; 12] = b"UNIFAB-TAPE\0";
const SYNC_MAGIC: &[u8; 4] = b"SYNC";
const RECORD_MAGIC: &[u8; 4] = b"UFTR";
const FILEMARK_BIT: u64 = 1 << 63;

const KIND_BLOCK: u8 = 1;
const KIND_FILEMARK: u8 = 2;
const KIND_EOD: u8 = 3;

/// One logical object on the medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Object {
    /// A logical block of this many bytes.
    Block(u32),
    /// A filemark.
    Filemark,
}

/// Why an image could not be opened or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MediumError {
    /// The backend holds something that is not a unifab tape image.
    #[error("not a unifab tape image (label {0})")]
    NotATape(&'static str),
    /// The backend is too small to hold the label and one record.
    #[error("a tape image needs at least {0} bytes")]
    TooSmall(u64),
    /// More logical objects than the image keeps an index for.
    #[error("the image holds more than {0} logical objects")]
    TooManyObjects(usize),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// Why a record could not be appended.
#[derive(Debug)]
pub enum AppendError {
    /// Past the physical end of medium (or the object limit): nothing
    /// was written.
    Overflow,
    /// The backend failed.
    Backend(BackendError),
}

/// An open tape image: the index of its logical objects and where
/// end-of-data is.
#[derive(Debug)]
pub struct Medium {
    backend: Arc<dyn BlockBackend>,
    /// Offset of each logical object's record; [`FILEMARK_BIT`] marks a
    /// filemark.
    objects: Vec<u64>,
    /// Offset of end-of-data (where the next record goes).
    end: u64,
    /// Records before this are on stable storage.
    synced_end: u64,
    /// Generation of the records written now.
    generation: u32,
    early_warning: u64,
    max_objects: usize,
}

fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// A decoded record header.
struct Header {
    kind: u8,
    generation: u32,
    len: u32,
    number: u64,
    data_crc: u32,
}

fn encode_header(kind: u8, generation: u32, len: u32, number: u64, data_crc: u32) -> Bytes {
    let mut h = BytesMut::with_capacity(RECORD_HEADER as usize);
    h.put_slice(RECORD_MAGIC);
    h.put_u8(kind);
    h.put_bytes(0, 3);
    h.put_u32_le(generation);
    h.put_u32_le(len);
    h.put_u64_le(number);
    h.put_u32_le(data_crc);
    let c = crc(&h);
    h.put_u32_le(c);
    h.freeze()
}

fn decode_header(b: &[u8]) -> Option<Header> {
    if b.len() < RECORD_HEADER as usize || &b[..4] != RECORD_MAGIC || crc(&b[..28]) != le32(b, 28) {
        return None;
    }
    Some(Header {
        kind: b[4],
        generation: le32(b, 8),
        len: le32(b, 12),
        number: le64(b, 16),
        data_crc: le32(b, 24),
    })
}

impl Medium {
    /// Opens the image in `backend`, formatting it first if it is blank
    /// (all zeros where the label goes) with `early_warning` bytes of
    /// early-warning zone. An image that is neither blank nor a unifab
    /// tape is refused, never overwritten.
    pub fn open(
        backend: Arc<dyn BlockBackend>,
        early_warning: u64,
        max_objects: usize,
    ) -> Result<Medium, MediumError> {
        let min = DATA_START + 2 * RECORD_HEADER;
        if backend.size() < min {
            return Err(MediumError::TooSmall(min));
        }
        let mut label = [0u8; 32];
        backend.read_at(0, &mut label)?;
        let early_warning = if label.iter().all(|&b| b == 0) {
            Self::format(&*backend, early_warning)?;
            early_warning
        } else {
            if &label[..12] != LABEL_MAGIC {
                return Err(MediumError::NotATape("magic"));
            }
            if crc(&label[..24]) != le32(&label, 24) {
                return Err(MediumError::NotATape("checksum"));
            }
            if le32(&label, 12) != 1 {
                return Err(MediumError::NotATape("version"));
            }
            le64(&label, 16)
        };
        let mut sync = [0u8; 20];
        backend.read_at(512, &mut sync)?;
        let synced_end = if &sync[..4] == SYNC_MAGIC && crc(&sync[..16]) == le32(&sync, 16) {
            le64(&sync, 8)
        } else {
            // A torn sync record: check every record whole.
            DATA_START
        };
        let mut m = Medium {
            backend,
            objects: Vec::new(),
            end: DATA_START,
            synced_end,
            generation: 1,
            early_warning,
            max_objects,
        };
        m.scan()?;
        Ok(m)
    }

    fn format(backend: &dyn BlockBackend, early_warning: u64) -> Result<(), BackendError> {
        let mut label = BytesMut::with_capacity(512);
        label.put_slice(LABEL_MAGIC);
        label.put_u32_le(1);
        label.put_u64_le(early_warning);
        let c = crc(&label);
        label.put_u32_le(c);
        label.resize(512, 0);
        backend.write_at(0, &[label.freeze(), sync_record(DATA_START)], false)?;
        backend.write_at(
            DATA_START,
            &[encode_header(KIND_EOD, 1, 0, 0, crc(&[]))],
            false,
        )?;
        backend.flush()
    }

    /// Reads the records from the start, building the index.
    fn scan(&mut self) -> Result<(), MediumError> {
        let size = self.backend.size();
        let mut pos = DATA_START;
        let mut floor = 0u32;
        let mut top = 1u32;
        let mut hb = [0u8; RECORD_HEADER as usize];
        while pos + RECORD_HEADER <= size {
            self.backend.read_at(pos, &mut hb)?;
            let Some(h) = decode_header(&hb) else { break };
            let next = pos + RECORD_HEADER + u64::from(h.len);
            if h.number != self.objects.len() as u64
                || h.generation < floor
                || next > size
                || !matches!(h.kind, KIND_BLOCK | KIND_FILEMARK | KIND_EOD)
            {
                break;
            }
            top = top.max(h.generation);
            if h.kind == KIND_EOD {
                break;
            }
            if pos >= self.synced_end && h.len > 0 {
                let mut data = vec![0u8; h.len as usize];
                self.backend.read_at(pos + RECORD_HEADER, &mut data)?;
                if crc(&data) != h.data_crc {
                    break;
                }
            }
            if self.objects.len() >= self.max_objects {
                return Err(MediumError::TooManyObjects(self.max_objects));
            }
            self.objects.push(if h.kind == KIND_FILEMARK {
                pos | FILEMARK_BIT
            } else {
                pos
            });
            floor = h.generation;
            pos = next;
        }
        self.end = pos;
        self.generation = top;
        self.synced_end = self.synced_end.min(pos);
        Ok(())
    }

    /// Number of logical objects (blocks and filemarks) before
    /// end-of-data.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether the medium holds no logical object.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    fn offset(&self, i: usize) -> u64 {
        self.objects.get(i).map_or(self.end, |o| o & !FILEMARK_BIT)
    }

    /// The object at position `i`; `None` at end-of-data.
    pub fn object(&self, i: usize) -> Option<Object> {
        let o = *self.objects.get(i)?;
        if o & FILEMARK_BIT != 0 {
            return Some(Object::Filemark);
        }
        let len = self.offset(i + 1) - o - RECORD_HEADER;
        Some(Object::Block(len as u32))
    }

    /// Filemarks before position `i` (the logical file identifier).
    pub fn files_before(&self, i: usize) -> u64 {
        let i = i.min(self.objects.len());
        self.objects[..i]
            .iter()
            .filter(|o| *o & FILEMARK_BIT != 0)
            .count() as u64
    }

    /// The position just after the `n`th filemark (1-based) counting from
    /// the start, or `None` if there are fewer.
    pub fn after_filemark(&self, n: u64) -> Option<usize> {
        if n == 0 {
            return Some(0);
        }
        let mut seen = 0;
        for (i, o) in self.objects.iter().enumerate() {
            if o & FILEMARK_BIT != 0 {
                seen += 1;
                if seen == n {
                    return Some(i + 1);
                }
            }
        }
        None
    }

    /// Reads logical block `i`, checking its record whole.
    pub fn read(&self, i: usize) -> Result<Bytes, BackendError> {
        let Some(Object::Block(len)) = self.object(i) else {
            return Ok(Bytes::new());
        };
        let off = self.offset(i);
        let mut buf = vec![0u8; (RECORD_HEADER + u64::from(len)) as usize];
        self.backend.read_at(off, &mut buf)?;
        let ok = decode_header(&buf)
            .is_some_and(|h| h.len == len && crc(&buf[RECORD_HEADER as usize..]) == h.data_crc);
        if !ok {
            return Err(BackendError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("tape record {i} at byte {off} is corrupt"),
            )));
        }
        let mut b = Bytes::from(buf);
        Ok(b.split_off(RECORD_HEADER as usize))
    }

    /// Bytes of records on the medium.
    pub fn used(&self) -> u64 {
        self.end - DATA_START
    }

    /// The medium's capacity in bytes (records and their headers).
    pub fn capacity(&self) -> u64 {
        self.backend
            .size()
            .saturating_sub(DATA_START + RECORD_HEADER)
    }

    /// Whether end-of-data is in the early-warning zone.
    pub fn past_early_warning(&self) -> bool {
        self.used() >= self.capacity().saturating_sub(self.early_warning)
    }

    /// Bytes a block of `len` bytes takes on the medium.
    pub fn cost(len: u64) -> u64 {
        RECORD_HEADER + len
    }

    /// Whether a record of `len` data bytes written at position `at`
    /// still fits before the physical end of medium.
    pub fn fits(&self, at: usize, len: u64) -> bool {
        let off = self.offset(at.min(self.objects.len()));
        off + Self::cost(len) + RECORD_HEADER <= self.backend.size()
            && at.min(self.objects.len()) < self.max_objects
    }

    /// Writes a record of `kind` at position `at` (everything after it is
    /// erased), returning the new end-of-data position.
    fn append(
        &mut self,
        at: usize,
        kind: u8,
        data: &[Bytes],
        fua: bool,
    ) -> Result<usize, AppendError> {
        let len: u64 = data.iter().map(|b| b.len() as u64).sum();
        if !self.fits(at, len) || len > u64::from(u32::MAX) {
            return Err(AppendError::Overflow);
        }
        let at = at.min(self.objects.len());
        if at < self.objects.len() {
            // An overwrite: what follows is erased first, on the medium.
            self.erase(at).map_err(AppendError::Backend)?;
        }
        let mut c = 0u32;
        for b in data {
            c = crc32c::crc32c_append(c, b);
        }
        let off = self.end;
        let mut slices = Vec::with_capacity(data.len() + 1);
        slices.push(encode_header(
            kind,
            self.generation,
            len as u32,
            at as u64,
            c,
        ));
        slices.extend(data.iter().cloned());
        self.backend
            .write_at(off, &slices, fua)
            .map_err(AppendError::Backend)?;
        self.objects.push(if kind == KIND_FILEMARK {
            off | FILEMARK_BIT
        } else {
            off
        });
        self.end = off + RECORD_HEADER + len;
        Ok(self.objects.len())
    }

    /// Writes a logical block at position `at`.
    pub fn write_block(
        &mut self,
        at: usize,
        data: &[Bytes],
        fua: bool,
    ) -> Result<usize, AppendError> {
        self.append(at, KIND_BLOCK, data, fua)
    }

    /// Writes a filemark at position `at`.
    pub fn write_filemark(&mut self, at: usize) -> Result<usize, AppendError> {
        self.append(at, KIND_FILEMARK, &[], false)
    }

    /// ERASE (and the start of every overwrite): end-of-data at position
    /// `at`, recorded on the medium as an end-of-data record of a new
    /// generation, so that what followed is never read back, even if the
    /// next write fails. The synced end is lowered first where it was
    /// past `at`. Nothing changes here unless both writes succeed.
    pub fn erase(&mut self, at: usize) -> Result<(), BackendError> {
        let at = at.min(self.objects.len());
        let off = self.offset(at);
        if self.synced_end > off {
            self.backend.write_at(512, &[sync_record(off)], true)?;
            self.synced_end = off;
        }
        let generation = self.generation.saturating_add(1);
        self.backend.write_at(
            off,
            &[encode_header(KIND_EOD, generation, 0, at as u64, crc(&[]))],
            false,
        )?;
        self.generation = generation;
        self.objects.truncate(at);
        self.end = off;
        Ok(())
    }

    /// Makes every record written so far stable, then says so in the sync
    /// record.
    pub fn sync(&mut self) -> Result<(), BackendError> {
        self.backend.flush()?;
        if self.synced_end != self.end {
            self.backend.write_at(512, &[sync_record(self.end)], true)?;
            self.synced_end = self.end;
        }
        Ok(())
    }

    /// The backend, for describing the LU.
    pub fn backend(&self) -> &Arc<dyn BlockBackend> {
        &self.backend
    }
}

fn sync_record(end: u64) -> Bytes {
    let mut s = BytesMut::with_capacity(512);
    s.put_slice(SYNC_MAGIC);
    s.put_bytes(0, 4);
    s.put_u64_le(end);
    let c = crc(&s);
    s.put_u32_le(c);
    s.resize(512, 0);
    s.freeze()
}
