//! Bounds-checked descriptor-chain access on top of virtio-queue.
//!
//! Every descriptor is checked against guest memory before use; loops, over-long chains,
//! chains that stop at a bad `next` index, overflowing lengths and readable-after-writable
//! descriptors are errors. Callers treat an error as "the queue is malformed".

use std::ops::Deref;

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryBackend};

use crate::memory::GuestMem;

/// Longest chain we accept.
pub const MAX_CHAIN_DESCS: usize = 64;

/// One validated descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    /// Guest-physical address.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
    /// Device-writable.
    pub writable: bool,
}

/// A malformed queue or chain.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ChainError {
    /// The available ring is inconsistent (e.g. avail idx ran ahead by more than the size).
    #[error("available ring invalid: {0}")]
    Ring(String),
    /// The chain has no usable descriptor (bad head index or unreadable table).
    #[error("empty descriptor chain")]
    Empty,
    /// More descriptors than the device accepts ([`MAX_CHAIN_DESCS`] unless it says otherwise).
    #[error("descriptor chain longer than the device accepts")]
    TooLong,
    /// The chain loops, or its `next` index is out of range.
    #[error("descriptor chain loops or has an invalid next index")]
    Truncated,
    /// A buffer lies (partly) outside guest memory.
    #[error("descriptor {addr:#x}+{len:#x} outside guest memory")]
    OutOfBounds {
        /// Address.
        addr: u64,
        /// Length.
        len: u32,
    },
    /// Total length overflows.
    #[error("descriptor chain length overflows")]
    Overflow,
    /// A device-readable descriptor follows a writable one, or the direction is wrong.
    #[error("descriptor direction invalid: {0}")]
    Direction(&'static str),
    /// The chain is too short for what it must hold.
    #[error("descriptor chain too short: {0}")]
    TooShort(&'static str),
}

/// Pops the next available chain; `Ok(None)` when the ring is empty.
pub fn pop_chain<'a>(
    queue: &mut Queue,
    mem: &'a GuestMem,
) -> Result<Option<DescriptorChain<&'a GuestMem>>, ChainError> {
    let mut iter = queue
        .iter(mem)
        .map_err(|e| ChainError::Ring(e.to_string()))?;
    Ok(iter.next())
}

/// Walks and validates a chain of at most [`MAX_CHAIN_DESCS`] descriptors. Returns the head
/// index and the descriptors.
pub fn collect_chain<M>(
    mem: &GuestMem,
    chain: DescriptorChain<M>,
) -> Result<(u16, Vec<Desc>), ChainError>
where
    M: Deref,
    M::Target: GuestMemory,
{
    collect_chain_bounded(mem, chain, MAX_CHAIN_DESCS)
}

/// [`collect_chain`] with its own bound: a chain of more than `max_descs` descriptors is
/// [`ChainError::TooLong`]. (virtio-queue's iterator also stops after the queue size, which
/// a loop hits: [`ChainError::Truncated`].)
pub fn collect_chain_bounded<M>(
    mem: &GuestMem,
    chain: DescriptorChain<M>,
    max_descs: usize,
) -> Result<(u16, Vec<Desc>), ChainError>
where
    M: Deref,
    M::Target: GuestMemory,
{
    let head = chain.head_index();
    let mut descs = Vec::new();
    let mut last_has_next = false;
    let mut seen_writable = false;
    let mut total: u64 = 0;
    for d in chain {
        if descs.len() >= max_descs {
            return Err(ChainError::TooLong);
        }
        let desc = Desc {
            addr: d.addr(),
            len: d.len(),
            writable: d.is_write_only(),
        };
        check_desc(mem, &desc)?;
        if desc.writable {
            seen_writable = true;
        } else if seen_writable {
            return Err(ChainError::Direction(
                "readable descriptor after a writable one",
            ));
        }
        total = total
            .checked_add(u64::from(desc.len))
            .ok_or(ChainError::Overflow)?;
        last_has_next = d.has_next();
        descs.push(desc);
    }
    if descs.is_empty() {
        return Err(ChainError::Empty);
    }
    if last_has_next {
        // The iterator stopped early: TTL exhausted (loop) or next index out of range.
        return Err(ChainError::Truncated);
    }
    Ok((head, descs))
}

fn check_desc(mem: &GuestMem, d: &Desc) -> Result<(), ChainError> {
    let oob = ChainError::OutOfBounds {
        addr: d.addr.0,
        len: d.len,
    };
    if d.len == 0 {
        return mem.address_in_range(d.addr).then_some(()).ok_or(oob);
    }
    d.addr
        .0
        .checked_add(u64::from(d.len))
        .ok_or(ChainError::Overflow)?;
    if GuestMemoryBackend::check_range(mem, d.addr, d.len as usize) {
        Ok(())
    } else {
        Err(oob)
    }
}

/// Total length of the descriptors with the given direction.
pub fn total_len(descs: &[Desc], writable: bool) -> u64 {
    descs
        .iter()
        .filter(|d| d.writable == writable)
        .map(|d| u64::from(d.len))
        .sum()
}

/// Copies `buf.len()` bytes starting `offset` bytes into the readable part of the chain.
pub fn read_gather(
    mem: &GuestMem,
    descs: &[Desc],
    mut offset: u64,
    buf: &mut [u8],
) -> Result<(), ChainError> {
    let mut done = 0usize;
    for d in descs.iter().filter(|d| !d.writable) {
        if done == buf.len() {
            break;
        }
        let len = u64::from(d.len);
        if offset >= len {
            offset -= len;
            continue;
        }
        let n = usize::try_from((len - offset).min((buf.len() - done) as u64))
            .map_err(|_| ChainError::Overflow)?;
        let addr = d.addr.checked_add(offset).ok_or(ChainError::Overflow)?;
        mem.read_slice(&mut buf[done..done + n], addr)
            .map_err(|_| ChainError::OutOfBounds {
                addr: addr.0,
                len: n as u32,
            })?;
        done += n;
        offset = 0;
    }
    if done == buf.len() {
        Ok(())
    } else {
        Err(ChainError::TooShort("readable part shorter than requested"))
    }
}

/// Copies `data` into the writable part of the chain starting at `offset`.
pub fn write_scatter(
    mem: &GuestMem,
    descs: &[Desc],
    mut offset: u64,
    data: &[u8],
) -> Result<(), ChainError> {
    let mut done = 0usize;
    for d in descs.iter().filter(|d| d.writable) {
        if done == data.len() {
            break;
        }
        let len = u64::from(d.len);
        if offset >= len {
            offset -= len;
            continue;
        }
        let n = usize::try_from((len - offset).min((data.len() - done) as u64))
            .map_err(|_| ChainError::Overflow)?;
        let addr = d.addr.checked_add(offset).ok_or(ChainError::Overflow)?;
        mem.write_slice(&data[done..done + n], addr)
            .map_err(|_| ChainError::OutOfBounds {
                addr: addr.0,
                len: n as u32,
            })?;
        done += n;
        offset = 0;
    }
    if done == data.len() {
        Ok(())
    } else {
        Err(ChainError::TooShort("writable part shorter than the data"))
    }
}
