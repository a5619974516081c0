//! One virtio-blk request (virtio 1.x §5.2.6), parsed from a validated descriptor chain.
//!
//! A request is a 16-byte header (`type`, `reserved`, `sector`) at the start of the
//! device-readable part of the chain, data, and a one-byte status at the very end of the
//! device-writable part. Any framing over descriptors is accepted (virtio 1.x has no fixed
//! layout): header and data may share a descriptor. [`parse`] finds the three parts;
//! [`Request::check`] decides, without touching the disk, whether the request may run against
//! a disk of a given size and mode. Both are pure functions of guest memory and the chain, so
//! they can be fuzzed without a VM.

use vm_memory::{Address, Bytes, GuestAddress};

use crate::devices::virtio::queue::Desc;
use crate::memory::GuestMem;

/// Bytes per sector: the unit of `sector` and of the capacity, whatever the block size.
pub const SECTOR_SIZE: u64 = 512;
/// Length of the request header.
pub const HEADER_LEN: u64 = 16;
/// Length of a GET_ID answer (`VIRTIO_BLK_ID_BYTES`).
pub const ID_BYTES: usize = 20;
/// Most data segments (descriptors or descriptor parts) in one request; offered to the
/// driver as `seg_max`.
pub const SEG_MAX: u32 = 126;
/// Longest data segment; offered to the driver as `size_max`.
pub const SIZE_MAX: u32 = 64 * 1024;
/// Most data bytes in one request (`seg_max * size_max`: a driver that honours both never
/// exceeds it). Larger requests fail with IOERR.
pub const MAX_REQUEST_BYTES: u64 = SEG_MAX as u64 * SIZE_MAX as u64;

/// Request type values (`VIRTIO_BLK_T_*`).
pub mod req_type {
    /// Read.
    pub const IN: u32 = 0;
    /// Write.
    pub const OUT: u32 = 1;
    /// Flush the disk's write cache.
    pub const FLUSH: u32 = 4;
    /// Device ID string.
    pub const GET_ID: u32 = 8;
}

/// Status values (`VIRTIO_BLK_S_*`).
pub mod status {
    /// Success.
    pub const OK: u8 = 0;
    /// Device or driver error.
    pub const IOERR: u8 = 1;
    /// Unsupported request type.
    pub const UNSUPP: u8 = 2;
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestType {
    /// Read sectors into the data buffers.
    In,
    /// Write the data buffers to sectors.
    Out,
    /// Make earlier writes durable.
    Flush,
    /// Return the device ID string.
    GetId,
    /// Anything else (answered UNSUPP).
    Unsupported(u32),
}

impl From<u32> for RequestType {
    fn from(v: u32) -> Self {
        match v {
            req_type::IN => RequestType::In,
            req_type::OUT => RequestType::Out,
            req_type::FLUSH => RequestType::Flush,
            req_type::GET_ID => RequestType::GetId,
            other => RequestType::Unsupported(other),
        }
    }
}

/// A guest buffer (inside guest memory: it is part of a validated descriptor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Guest-physical address.
    pub addr: GuestAddress,
    /// Length in bytes (never 0).
    pub len: u32,
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// What it asks for.
    pub kind: RequestType,
    /// First sector (512-byte units).
    pub sector: u64,
    /// Data buffers, in order: device-writable for IN and GET_ID, device-readable for OUT,
    /// empty otherwise.
    pub data: Vec<Segment>,
    /// Total length of `data`.
    pub data_len: u64,
    /// Where the status byte goes.
    pub status: GuestAddress,
}

/// Why a chain is not a request.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    /// The chain has no device-writable byte to hold the status.
    #[error("no device-writable status byte")]
    NoStatus,
    /// The device-readable part is shorter than the header.
    #[error("device-readable part is {0} bytes, shorter than the 16-byte header")]
    ShortHeader(u64),
    /// The header could not be read.
    #[error("header unreadable")]
    Header,
    /// The buffers do not fit the request type.
    #[error("{0}")]
    Layout(&'static str),
}

/// A [`RequestError`] and, when the chain has one, the status byte to report it in (the
/// request then fails with IOERR; without one the queue is unusable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// What is wrong.
    pub error: RequestError,
    /// The status byte, if the chain has one.
    pub status: Option<GuestAddress>,
}

/// Why a well-formed request is refused.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    /// Unknown request type.
    #[error("unsupported request type {0}")]
    Unsupported(u32),
    /// A write to a read-only disk.
    #[error("write to a read-only disk")]
    ReadOnly,
    /// Data length not a multiple of [`SECTOR_SIZE`].
    #[error("data length {0} is not a multiple of 512")]
    Unaligned(u64),
    /// More than [`MAX_REQUEST_BYTES`].
    #[error("data length {0} exceeds {MAX_REQUEST_BYTES}")]
    TooLarge(u64),
    /// The sectors lie (partly) beyond the end of the disk, or their end overflows.
    #[error("sectors {sector}+{sectors} beyond the disk's {capacity}")]
    OutOfRange {
        /// First sector.
        sector: u64,
        /// Sector count.
        sectors: u64,
        /// Disk size in sectors.
        capacity: u64,
    },
}

impl Refusal {
    /// The status reported for it.
    pub fn status(&self) -> u8 {
        match self {
            Refusal::Unsupported(_) => status::UNSUPP,
            _ => status::IOERR,
        }
    }
}

impl Request {
    /// Checks the request against a disk of `capacity` sectors: type, write permission,
    /// length (sector multiple, at most [`MAX_REQUEST_BYTES`]) and sector range, all with
    /// checked arithmetic.
    pub fn check(&self, capacity: u64, read_only: bool) -> Result<(), Refusal> {
        match self.kind {
            RequestType::Unsupported(t) => return Err(Refusal::Unsupported(t)),
            RequestType::Flush | RequestType::GetId => return Ok(()),
            RequestType::Out if read_only => return Err(Refusal::ReadOnly),
            RequestType::In | RequestType::Out => {}
        }
        if !self.data_len.is_multiple_of(SECTOR_SIZE) {
            return Err(Refusal::Unaligned(self.data_len));
        }
        if self.data_len > MAX_REQUEST_BYTES {
            return Err(Refusal::TooLarge(self.data_len));
        }
        let sectors = self.data_len / SECTOR_SIZE;
        let out_of_range = Refusal::OutOfRange {
            sector: self.sector,
            sectors,
            capacity,
        };
        match self.sector.checked_add(sectors) {
            Some(end) if end <= capacity => Ok(()),
            _ => Err(out_of_range),
        }
    }

    /// Byte offset of `sector` in the disk file (`None` when it overflows; never after a
    /// successful [`Request::check`] of an IN or OUT request).
    pub fn offset(&self) -> Option<u64> {
        self.sector.checked_mul(SECTOR_SIZE)
    }
}

/// Total length of the descriptors in one direction.
fn part_len(descs: &[Desc], writable: bool) -> u64 {
    descs
        .iter()
        .filter(|d| d.writable == writable)
        .map(|d| u64::from(d.len))
        .sum()
}

/// The segments covering bytes `[start, end)` of the descriptors in one direction.
fn segments(descs: &[Desc], writable: bool, start: u64, end: u64) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    for d in descs.iter().filter(|d| d.writable == writable) {
        let len = u64::from(d.len);
        let (lo, hi) = (start.max(pos), end.min(pos + len));
        if lo < hi {
            // Both fit: `hi - lo <= d.len`, and `addr + d.len` was checked against guest
            // memory when the chain was collected.
            if let (Ok(n), Some(addr)) = (u32::try_from(hi - lo), d.addr.checked_add(lo - pos)) {
                out.push(Segment { addr, len: n });
            }
        }
        pos += len;
    }
    out
}

/// The address of the last device-writable byte of the chain.
fn status_byte(descs: &[Desc]) -> Option<GuestAddress> {
    let last = descs.iter().rev().find(|d| d.writable && d.len > 0)?;
    last.addr.checked_add(u64::from(last.len) - 1)
}

/// Reads the 16-byte header from the start of the device-readable part.
fn read_header(mem: &GuestMem, descs: &[Desc]) -> Result<[u8; 16], RequestError> {
    let mut h = [0u8; 16];
    let mut done = 0usize;
    for s in segments(descs, false, 0, HEADER_LEN) {
        let n = s.len as usize;
        let dst = h.get_mut(done..done + n).ok_or(RequestError::Header)?;
        mem.read_slice(dst, s.addr)
            .map_err(|_| RequestError::Header)?;
        done += n;
    }
    if done == h.len() {
        Ok(h)
    } else {
        Err(RequestError::Header)
    }
}

/// Parses a validated chain (every descriptor inside guest memory, readable ones first, at
/// most the device's chain bound) into a request.
pub fn parse(mem: &GuestMem, descs: &[Desc]) -> Result<Request, ParseError> {
    let status = status_byte(descs);
    let fail = |error| ParseError { error, status };
    let status_addr = status.ok_or(fail(RequestError::NoStatus))?;
    let readable = part_len(descs, false);
    // The status byte is the last writable byte; everything writable before it is data.
    let writable_data = part_len(descs, true) - 1;
    if readable < HEADER_LEN {
        return Err(fail(RequestError::ShortHeader(readable)));
    }
    let h = read_header(mem, descs).map_err(fail)?;
    let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let mut sector_bytes = [0u8; 8];
    sector_bytes.copy_from_slice(&h[8..16]);
    let kind = RequestType::from(word(0));
    let sector = u64::from_le_bytes(sector_bytes);
    let (data, data_len) = match kind {
        RequestType::In | RequestType::GetId => {
            if readable != HEADER_LEN {
                return Err(fail(RequestError::Layout(
                    "device-readable data after the header of a read",
                )));
            }
            (segments(descs, true, 0, writable_data), writable_data)
        }
        RequestType::Out => {
            if writable_data != 0 {
                return Err(fail(RequestError::Layout(
                    "device-writable data before the status of a write",
                )));
            }
            let len = readable - HEADER_LEN;
            (segments(descs, false, HEADER_LEN, readable), len)
        }
        RequestType::Flush | RequestType::Unsupported(_) => (Vec::new(), 0),
    };
    Ok(Request {
        kind,
        sector,
        data,
        data_len,
        status: status_addr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;

    fn mem_with_header(at: u64, kind: u32, sector: u64) -> GuestMem {
        let mem = create_guest_memory(1 << 20).unwrap();
        mem.write_obj(kind, GuestAddress(at)).unwrap();
        mem.write_obj(sector, GuestAddress(at + 8)).unwrap();
        mem
    }

    fn d(addr: u64, len: u32, writable: bool) -> Desc {
        Desc {
            addr: GuestAddress(addr),
            len,
            writable,
        }
    }

    #[test]
    fn classic_layouts() {
        let mem = mem_with_header(0x1000, req_type::IN, 7);
        let r = parse(
            &mem,
            &[
                d(0x1000, 16, false),
                d(0x2000, 512, true),
                d(0x3000, 1024, true),
                d(0x4000, 1, true),
            ],
        )
        .unwrap();
        assert_eq!(r.kind, RequestType::In);
        assert_eq!(r.sector, 7);
        assert_eq!(r.data_len, 1536);
        assert_eq!(r.data.len(), 2);
        assert_eq!(r.status, GuestAddress(0x4000));
        // Sectors 7..10.
        assert_eq!(r.check(10, true), Ok(()));
        assert!(matches!(r.check(9, false), Err(Refusal::OutOfRange { .. })));

        let mem = mem_with_header(0x1000, req_type::OUT, 0);
        let r = parse(
            &mem,
            &[
                d(0x1000, 16, false),
                d(0x2000, 512, false),
                d(0x4000, 1, true),
            ],
        )
        .unwrap();
        assert_eq!(r.kind, RequestType::Out);
        assert_eq!(
            r.data,
            vec![Segment {
                addr: GuestAddress(0x2000),
                len: 512
            }]
        );
        assert_eq!(r.check(1, true), Err(Refusal::ReadOnly));
        assert_eq!(r.check(1, false), Ok(()));
    }

    #[test]
    fn header_data_and_status_may_share_descriptors() {
        // OUT: header and data in one descriptor; IN: data and status in one.
        let mem = mem_with_header(0x1000, req_type::OUT, 3);
        let r = parse(&mem, &[d(0x1000, 16 + 512, false), d(0x4000, 1, true)]).unwrap();
        assert_eq!(
            r.data,
            vec![Segment {
                addr: GuestAddress(0x1010),
                len: 512
            }]
        );
        let mem = mem_with_header(0x1000, req_type::IN, 3);
        let r = parse(&mem, &[d(0x1000, 16, false), d(0x2000, 513, true)]).unwrap();
        assert_eq!(r.data_len, 512);
        assert_eq!(r.status, GuestAddress(0x2200));
        // The header split over two descriptors.
        let mem = create_guest_memory(1 << 20).unwrap();
        mem.write_obj(req_type::IN, GuestAddress(0x1000)).unwrap();
        mem.write_obj(0x55u64, GuestAddress(0x5000)).unwrap();
        let r = parse(
            &mem,
            &[d(0x1000, 8, false), d(0x5000, 8, false), d(0x2000, 1, true)],
        )
        .unwrap();
        assert_eq!(r.sector, 0x55);
        // A zero-length trailing writable descriptor: the status is the byte before it.
        let r = parse(
            &mem,
            &[
                d(0x1000, 8, false),
                d(0x5000, 8, false),
                d(0x2000, 1, true),
                d(0x3000, 0, true),
            ],
        )
        .unwrap();
        assert_eq!(r.status, GuestAddress(0x2000));
    }

    #[test]
    fn malformed_chains() {
        let mem = mem_with_header(0x1000, req_type::IN, 0);
        // No writable byte: nowhere to report.
        let e = parse(&mem, &[d(0x1000, 16, false), d(0x2000, 512, false)]).unwrap_err();
        assert_eq!(e.error, RequestError::NoStatus);
        assert_eq!(e.status, None);
        let e = parse(&mem, &[d(0x1000, 16, false), d(0x2000, 0, true)]).unwrap_err();
        assert_eq!(e.status, None);
        // Short header: reported in the status byte.
        let e = parse(&mem, &[d(0x1000, 15, false), d(0x2000, 1, true)]).unwrap_err();
        assert_eq!(e.error, RequestError::ShortHeader(15));
        assert_eq!(e.status, Some(GuestAddress(0x2000)));
        // A read with readable data, a write with writable data.
        let e = parse(&mem, &[d(0x1000, 16 + 512, false), d(0x2000, 513, true)]).unwrap_err();
        assert!(matches!(e.error, RequestError::Layout(_)));
        let mem = mem_with_header(0x1000, req_type::OUT, 0);
        let e = parse(&mem, &[d(0x1000, 16, false), d(0x2000, 513, true)]).unwrap_err();
        assert!(matches!(e.error, RequestError::Layout(_)));
    }

    #[test]
    fn range_and_length_checks() {
        let req = |kind, sector, data_len| Request {
            kind,
            sector,
            data: Vec::new(),
            data_len,
            status: GuestAddress(0),
        };
        let cap = 100;
        assert_eq!(req(RequestType::In, 99, 512).check(cap, false), Ok(()));
        assert_eq!(req(RequestType::In, 100, 0).check(cap, false), Ok(()));
        assert!(req(RequestType::In, 100, 512).check(cap, false).is_err());
        assert!(req(RequestType::In, 101, 0).check(cap, false).is_err());
        assert!(req(RequestType::Out, u64::MAX, 512)
            .check(cap, false)
            .is_err());
        assert!(req(RequestType::In, u64::MAX - 1, 1024)
            .check(u64::MAX, false)
            .is_err());
        assert_eq!(
            req(RequestType::In, 0, 100).check(cap, false),
            Err(Refusal::Unaligned(100))
        );
        assert_eq!(
            req(RequestType::In, 0, MAX_REQUEST_BYTES + 512).check(u64::MAX, false),
            Err(Refusal::TooLarge(MAX_REQUEST_BYTES + 512))
        );
        assert_eq!(
            req(RequestType::In, 0, MAX_REQUEST_BYTES).check(u64::MAX, false),
            Ok(())
        );
        let unsupp = req(RequestType::from(11), 0, 0)
            .check(cap, false)
            .unwrap_err();
        assert_eq!(unsupp.status(), status::UNSUPP);
        assert_eq!(Refusal::ReadOnly.status(), status::IOERR);
        // Flush and GET_ID ignore the sector.
        assert_eq!(
            req(RequestType::Flush, u64::MAX, 0).check(cap, true),
            Ok(())
        );
        assert_eq!(
            req(RequestType::GetId, u64::MAX, 0).check(cap, true),
            Ok(())
        );
        assert_eq!(req(RequestType::In, u64::MAX, 0).offset(), None);
    }
}
