//! Frames in descriptor chains: the 12-byte `virtio_net_hdr_v1` in front of every frame
//! (read and stripped on transmit, written on receive) and the bounds of both directions.
//!
//! Checksum offload is the only offload: with `VIRTIO_NET_F_CSUM` acked, a transmitted header
//! with `NEEDS_CSUM` names the span `csum_start..` of the frame whose Internet checksum the
//! device completes (the driver left the pseudo-header sum in the field at
//! `csum_start + csum_offset`); both offsets are checked against the frame (a hostile guest
//! chooses them) and a frame whose offsets do not fit is dropped. The completed frame goes to
//! the NAT, which still verifies every checksum. The other header fields (segmentation) are
//! ignored: no segmentation offload is offered, and a frame longer than the MTU allows is
//! dropped anyway. With `VIRTIO_NET_F_GUEST_CSUM` acked, received frames carry `DATA_VALID`
//! (the NAT builds every frame with complete, correct checksums), so the guest does not
//! verify them.

use super::{ETH_HLEN, MAX_FRAME_LEN};
use crate::devices::virtio::queue::{read_gather, total_len, write_scatter, ChainError, Desc};
use crate::memory::GuestMem;

/// Length of `virtio_net_hdr_v1` (`VERSION_1` always has `num_buffers`).
pub const NET_HDR_LEN: usize = 12;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the device completes the checksum (transmit).
pub const HDR_F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the checksums were validated (receive).
pub const HDR_F_DATA_VALID: u8 = 2;
/// Offset of `csum_start` in the header.
const CSUM_START_AT: usize = 6;
/// Offset of `csum_offset` in the header.
const CSUM_OFFSET_AT: usize = 8;
/// Offset of `num_buffers` in the header.
const NUM_BUFFERS_AT: usize = 10;

/// Why a well-formed transmit chain's frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameDrop {
    /// Shorter than the virtio-net header plus an Ethernet header.
    #[error("chain of {0} bytes is shorter than a virtio-net and an Ethernet header")]
    TooShort(u64),
    /// Longer than the virtio-net header plus the largest frame the MTU allows.
    #[error(
        "chain of {0} bytes is longer than a virtio-net header and a {MAX_FRAME_LEN}-byte frame"
    )]
    TooLong(u64),
    /// `NEEDS_CSUM` with a checksum span or field outside the frame.
    #[error("checksum at {start}+{offset} outside a {len}-byte frame")]
    BadCsumOffsets {
        /// `csum_start`.
        start: u16,
        /// `csum_offset`.
        offset: u16,
        /// Frame length.
        len: usize,
    },
}

/// Reads the frame of a transmit chain (device-readable descriptors only) without its
/// virtio-net header, completing its checksum when `csum` (`VIRTIO_NET_F_CSUM` acked) and the
/// header asks for it. `Err` is a malformed chain (the queue is broken); `Ok(Err)` a frame
/// that is dropped. Nothing is allocated before the length is bounded.
pub fn read_tx_frame(
    mem: &GuestMem,
    descs: &[Desc],
    csum: bool,
) -> Result<Result<Vec<u8>, FrameDrop>, ChainError> {
    if descs.iter().any(|d| d.writable) {
        return Err(ChainError::Direction(
            "device-writable descriptor in the transmit queue",
        ));
    }
    let total = total_len(descs, false);
    if total < (NET_HDR_LEN + ETH_HLEN) as u64 {
        return Ok(Err(FrameDrop::TooShort(total)));
    }
    if total > (NET_HDR_LEN + MAX_FRAME_LEN) as u64 {
        return Ok(Err(FrameDrop::TooLong(total)));
    }
    let mut hdr = [0u8; NET_HDR_LEN];
    read_gather(mem, descs, 0, &mut hdr)?;
    // Bounded just above: at most NET_HDR_LEN + MAX_FRAME_LEN bytes.
    let mut frame = vec![0u8; total as usize - NET_HDR_LEN];
    read_gather(mem, descs, NET_HDR_LEN as u64, &mut frame)?;
    if csum && hdr[0] & HDR_F_NEEDS_CSUM != 0 {
        let start = u16::from_le_bytes([hdr[CSUM_START_AT], hdr[CSUM_START_AT + 1]]);
        let offset = u16::from_le_bytes([hdr[CSUM_OFFSET_AT], hdr[CSUM_OFFSET_AT + 1]]);
        if let Err(drop) = complete_checksum(&mut frame, start, offset) {
            return Ok(Err(drop));
        }
    }
    Ok(Ok(frame))
}

/// Completes a partial checksum: the Internet checksum of `frame[start..]` (which includes
/// the pseudo-header sum the driver left in the field) goes into the 16-bit field at
/// `start + offset`, 0 written as 0xffff (as Linux does). Fails when the field does not lie
/// inside the span.
pub fn complete_checksum(frame: &mut [u8], start: u16, offset: u16) -> Result<(), FrameDrop> {
    let bad = FrameDrop::BadCsumOffsets {
        start,
        offset,
        len: frame.len(),
    };
    let start = usize::from(start);
    let field = start + usize::from(offset); // u16 + u16: no overflow
    if field + 2 > frame.len() {
        return Err(bad);
    }
    let sum = !fold(ones_sum(&frame[start..]));
    let sum = if sum == 0 { 0xffff } else { sum };
    frame[field..field + 2].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

/// Ones'-complement sum of `data` as big-endian 16-bit words (an odd last byte padded), not
/// yet folded.
fn ones_sum(data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(4);
    let mut sum: u64 = 0;
    for c in &mut chunks {
        sum += u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
    }
    let mut tail = chunks.remainder().chunks(2);
    for c in &mut tail {
        let hi = c[0];
        let lo = c.get(1).copied().unwrap_or(0);
        sum += u64::from(u16::from_be_bytes([hi, lo]));
    }
    sum
}

/// Folds a wide ones'-complement sum to 16 bits.
fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The bytes a receive chain can hold (device-writable descriptors only).
pub fn rx_capacity(descs: &[Desc]) -> Result<u64, ChainError> {
    if descs.iter().any(|d| !d.writable) {
        return Err(ChainError::Direction(
            "device-readable descriptor in the receive queue",
        ));
    }
    Ok(total_len(descs, true))
}

/// The header written in front of every received frame: `num_buffers = 1`, and `DATA_VALID`
/// when `data_valid` (`VIRTIO_NET_F_GUEST_CSUM` acked).
pub fn rx_header(data_valid: bool) -> [u8; NET_HDR_LEN] {
    let mut h = [0u8; NET_HDR_LEN];
    if data_valid {
        h[0] = HDR_F_DATA_VALID;
    }
    h[NUM_BUFFERS_AT..].copy_from_slice(&1u16.to_le_bytes());
    h
}

/// Writes `header` and `frame` into a receive chain the caller checked it fits
/// ([`rx_capacity`]); returns the used length.
pub fn write_rx_frame(
    mem: &GuestMem,
    descs: &[Desc],
    header: &[u8; NET_HDR_LEN],
    frame: &[u8],
) -> Result<u32, ChainError> {
    write_scatter(mem, descs, 0, header)?;
    write_scatter(mem, descs, NET_HDR_LEN as u64, frame)?;
    u32::try_from(NET_HDR_LEN + frame.len()).map_err(|_| ChainError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: RFC 1071 over 16-bit words, one at a time.
    fn reference(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for c in data.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    #[test]
    fn ones_sum_matches_rfc1071_at_every_length() {
        let data: Vec<u8> = (0..2000u32)
            .map(|i| (i * 7919 % 251) as u8 | 0x80)
            .collect();
        for n in 0..data.len() {
            assert_eq!(fold(ones_sum(&data[..n])), reference(&data[..n]), "{n}");
        }
        assert_eq!(fold(ones_sum(&[0xff; 65534])), reference(&[0xff; 65534]));
    }

    #[test]
    fn completed_checksum_verifies_and_offsets_are_bounded() {
        let mut f = vec![0x11u8; 100];
        f[30..32].copy_from_slice(&[0x12, 0x34]); // a "pseudo-header sum"
        complete_checksum(&mut f, 14, 16).unwrap();
        // The span plus the pseudo-header sum (as a receiver adds it) is 0xffff: valid.
        let total = u32::from(reference(&f[14..])) + 0x1234;
        assert_eq!(fold(u64::from(total)), 0xffff);
        // The field must lie inside the frame.
        assert!(complete_checksum(&mut f, 14, 85).is_err());
        assert!(complete_checksum(&mut f, 14, 84).is_ok());
        assert!(complete_checksum(&mut f, 99, 0).is_err());
        assert!(complete_checksum(&mut f, u16::MAX, u16::MAX).is_err());
        assert!(complete_checksum(&mut [], 0, 0).is_err());
    }

    #[test]
    fn a_zero_checksum_is_written_as_ffff() {
        // Span whose sum is 0xffff with a zero field: the checksum would be 0.
        let mut f = vec![0xff, 0xff, 0, 0];
        complete_checksum(&mut f, 0, 2).unwrap();
        assert_eq!(f[2..], [0xff, 0xff]);
    }
}
