//! `virtio_vsock_hdr` (44 bytes, little endian) and packet (de)serialisation from and to
//! validated descriptor chains. Everything here treats the guest as hostile.

use crate::devices::virtio::queue::{read_gather, total_len, write_scatter, ChainError, Desc};
use crate::memory::GuestMem;

/// Size of `struct virtio_vsock_hdr`.
pub const HDR_LEN: usize = 44;
/// Largest payload we accept from or send to the guest.
pub const MAX_PKT_PAYLOAD: usize = 64 * 1024;
/// The host's CID.
pub const HOST_CID: u64 = 2;
/// `VIRTIO_VSOCK_TYPE_STREAM`.
pub const TYPE_STREAM: u16 = 1;
/// Shutdown flag: the sender will receive no more data.
pub const SHUTDOWN_RCV: u32 = 1;
/// Shutdown flag: the sender will send no more data.
pub const SHUTDOWN_SEND: u32 = 2;

/// vsock operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    /// Connection request.
    Request = 1,
    /// Connection accepted.
    Response = 2,
    /// Connection reset / refused.
    Rst = 3,
    /// Half or full shutdown.
    Shutdown = 4,
    /// Data.
    Rw = 5,
    /// Credit information.
    CreditUpdate = 6,
    /// Ask for a credit update.
    CreditRequest = 7,
}

impl Op {
    /// Decodes an op field.
    pub fn from_u16(v: u16) -> Option<Op> {
        Some(match v {
            1 => Op::Request,
            2 => Op::Response,
            3 => Op::Rst,
            4 => Op::Shutdown,
            5 => Op::Rw,
            6 => Op::CreditUpdate,
            7 => Op::CreditRequest,
            _ => return None,
        })
    }
}

/// `struct virtio_vsock_hdr`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VsockHeader {
    /// Source CID.
    pub src_cid: u64,
    /// Destination CID.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload length.
    pub len: u32,
    /// Socket type (1 = stream).
    pub type_: u16,
    /// Operation.
    pub op: u16,
    /// Op-specific flags.
    pub flags: u32,
    /// Sender's receive buffer size.
    pub buf_alloc: u32,
    /// Bytes the sender has consumed from its receive buffer.
    pub fwd_cnt: u32,
}

/// A malformed packet; the device is marked broken.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PacketError {
    /// The descriptor chain itself is invalid.
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// Fewer than 44 readable bytes.
    #[error("packet shorter than the 44-byte header ({0} bytes)")]
    HeaderTooShort(u64),
    /// `len` larger than [`MAX_PKT_PAYLOAD`].
    #[error("packet payload length {0} exceeds {MAX_PKT_PAYLOAD}")]
    TooLarge(u32),
    /// `len` larger than what the descriptors hold.
    #[error("header says {len} payload bytes but the buffer holds {avail}")]
    LenExceedsBuffer {
        /// Header `len`.
        len: u32,
        /// Bytes available after the header.
        avail: u64,
    },
    /// An RX buffer is too small for a header.
    #[error("receive buffer of {0} bytes cannot hold a header")]
    RxBufferTooSmall(u64),
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

impl VsockHeader {
    /// Decodes the first 44 bytes of `b`.
    pub fn from_bytes(b: &[u8]) -> Result<Self, PacketError> {
        let b = b
            .get(..HDR_LEN)
            .ok_or(PacketError::HeaderTooShort(b.len() as u64))?;
        Ok(Self {
            src_cid: u64_at(b, 0),
            dst_cid: u64_at(b, 8),
            src_port: u32_at(b, 16),
            dst_port: u32_at(b, 20),
            len: u32_at(b, 24),
            type_: u16_at(b, 28),
            op: u16_at(b, 30),
            flags: u32_at(b, 32),
            buf_alloc: u32_at(b, 36),
            fwd_cnt: u32_at(b, 40),
        })
    }

    /// Encodes the header.
    pub fn to_bytes(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// The decoded operation, if known.
    pub fn op(&self) -> Option<Op> {
        Op::from_u16(self.op)
    }

    /// Payload bytes this packet carries (only RW packets carry data).
    pub fn payload_len(&self) -> u32 {
        if self.op == Op::Rw as u16 {
            self.len
        } else {
            0
        }
    }
}

/// Checks a header's `len` against the bytes available after it.
pub fn validate_len(hdr: &VsockHeader, avail_after_header: u64) -> Result<(), PacketError> {
    let len = hdr.payload_len();
    if len as usize > MAX_PKT_PAYLOAD {
        return Err(PacketError::TooLarge(len));
    }
    if u64::from(len) > avail_after_header {
        return Err(PacketError::LenExceedsBuffer {
            len,
            avail: avail_after_header,
        });
    }
    Ok(())
}

/// Parses a packet from a flat buffer (header followed by payload).
pub fn parse_packet(buf: &[u8]) -> Result<(VsockHeader, &[u8]), PacketError> {
    let hdr = VsockHeader::from_bytes(buf)?;
    let rest = &buf[HDR_LEN..];
    validate_len(&hdr, rest.len() as u64)?;
    Ok((hdr, &rest[..hdr.payload_len() as usize]))
}

/// Reads a guest→host packet from a validated TX chain (device-readable descriptors only).
pub fn read_tx_packet(
    mem: &GuestMem,
    descs: &[Desc],
) -> Result<(VsockHeader, Vec<u8>), PacketError> {
    if descs.iter().any(|d| d.writable) {
        return Err(ChainError::Direction("device-writable descriptor on the TX queue").into());
    }
    let total = total_len(descs, false);
    if total < HDR_LEN as u64 {
        return Err(PacketError::HeaderTooShort(total));
    }
    let mut hb = [0u8; HDR_LEN];
    read_gather(mem, descs, 0, &mut hb)?;
    let hdr = VsockHeader::from_bytes(&hb)?;
    validate_len(&hdr, total - HDR_LEN as u64)?;
    let mut payload = vec![0u8; hdr.payload_len() as usize];
    read_gather(mem, descs, HDR_LEN as u64, &mut payload)?;
    Ok((hdr, payload))
}

/// Payload capacity of an RX chain (device-writable descriptors only).
pub fn rx_capacity(descs: &[Desc]) -> Result<usize, PacketError> {
    if descs.iter().any(|d| !d.writable) {
        return Err(ChainError::Direction("device-readable descriptor on the RX queue").into());
    }
    let total = total_len(descs, true);
    if total < HDR_LEN as u64 {
        return Err(PacketError::RxBufferTooSmall(total));
    }
    Ok(usize::try_from(total - HDR_LEN as u64)
        .unwrap_or(MAX_PKT_PAYLOAD)
        .min(MAX_PKT_PAYLOAD))
}

/// Writes a host→guest packet into an RX chain; returns the bytes written.
pub fn write_rx_packet(
    mem: &GuestMem,
    descs: &[Desc],
    hdr: &VsockHeader,
    payload: &[u8],
) -> Result<u32, PacketError> {
    let cap = rx_capacity(descs)?;
    if payload.len() > cap {
        return Err(ChainError::TooShort("payload larger than the RX buffer").into());
    }
    let mut h = *hdr;
    h.len = payload.len() as u32;
    write_scatter(mem, descs, 0, &h.to_bytes())?;
    write_scatter(mem, descs, HDR_LEN as u64, payload)?;
    Ok((HDR_LEN + payload.len()) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr() -> VsockHeader {
        VsockHeader {
            src_cid: 3,
            dst_cid: 2,
            src_port: 1234,
            dst_port: 1 << 30,
            len: 5,
            type_: TYPE_STREAM,
            op: Op::Rw as u16,
            flags: 0,
            buf_alloc: 65536,
            fwd_cnt: 7,
        }
    }

    #[test]
    fn header_roundtrip() {
        let h = hdr();
        let b = h.to_bytes();
        assert_eq!(b.len(), 44);
        assert_eq!(VsockHeader::from_bytes(&b).unwrap(), h);
        // Field offsets as in the virtio spec.
        assert_eq!(u32_at(&b, 24), 5);
        assert_eq!(u16_at(&b, 30), 5);
        assert_eq!(u32_at(&b, 40), 7);
    }

    #[test]
    fn flat_parse_rejects_bad_lengths() {
        let mut buf = hdr().to_bytes().to_vec();
        assert!(matches!(
            parse_packet(&buf),
            Err(PacketError::LenExceedsBuffer { len: 5, avail: 0 })
        ));
        buf.extend_from_slice(b"hello!");
        let (h, p) = parse_packet(&buf).unwrap();
        assert_eq!(h.len, 5);
        assert_eq!(p, b"hello");
        assert!(matches!(
            parse_packet(&buf[..43]),
            Err(PacketError::HeaderTooShort(43))
        ));
        let mut big = hdr();
        big.len = 64 * 1024 + 1;
        let mut b = big.to_bytes().to_vec();
        b.resize(44 + 70_000, 0);
        assert!(matches!(parse_packet(&b), Err(PacketError::TooLarge(_))));
        // Non-RW ops carry no payload whatever len says.
        let mut ctl = hdr();
        ctl.op = Op::Request as u16;
        ctl.len = u32::MAX;
        let bytes = ctl.to_bytes();
        let (_, p) = parse_packet(&bytes).unwrap();
        assert!(p.is_empty());
    }

    #[test]
    fn ops() {
        for v in 1..=7 {
            assert_eq!(Op::from_u16(v).unwrap() as u16, v);
        }
        assert_eq!(Op::from_u16(0), None);
        assert_eq!(Op::from_u16(8), None);
    }
}
