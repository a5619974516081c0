//! Frames in descriptor chains: the 12-byte `virtio_net_hdr_v1` in front of every frame
//! (stripped on transmit, written zeroed with `num_buffers = 1` on receive) and the bounds
//! of both directions.
//!
//! No offload is negotiated, so the header carries nothing the device needs: a transmitted
//! header is skipped whatever it holds (a frame that claims segmentation is over-long and
//! dropped anyway).

use super::{ETH_HLEN, MAX_FRAME_LEN};
use crate::devices::virtio::queue::{read_gather, total_len, write_scatter, ChainError, Desc};
use crate::memory::GuestMem;

/// Length of `virtio_net_hdr_v1` (`VERSION_1` always has `num_buffers`).
pub const NET_HDR_LEN: usize = 12;
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
}

/// Reads the frame of a transmit chain (device-readable descriptors only) without its
/// virtio-net header. `Err` is a malformed chain (the queue is broken); `Ok(Err)` a frame
/// that is dropped. Nothing is allocated before the length is bounded.
pub fn read_tx_frame(
    mem: &GuestMem,
    descs: &[Desc],
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
    // Bounded just above: at most NET_HDR_LEN + MAX_FRAME_LEN bytes.
    let mut frame = vec![0u8; total as usize - NET_HDR_LEN];
    read_gather(mem, descs, NET_HDR_LEN as u64, &mut frame)?;
    Ok(Ok(frame))
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

/// The header written in front of every received frame.
pub fn rx_header() -> [u8; NET_HDR_LEN] {
    let mut h = [0u8; NET_HDR_LEN];
    h[NUM_BUFFERS_AT..].copy_from_slice(&1u16.to_le_bytes());
    h
}

/// Writes header and `frame` into a receive chain the caller checked it fits
/// ([`rx_capacity`]); returns the used length.
pub fn write_rx_frame(mem: &GuestMem, descs: &[Desc], frame: &[u8]) -> Result<u32, ChainError> {
    write_scatter(mem, descs, 0, &rx_header())?;
    write_scatter(mem, descs, NET_HDR_LEN as u64, frame)?;
    u32::try_from(NET_HDR_LEN + frame.len()).map_err(|_| ChainError::Overflow)
}
