//! Request-id multiplexing helpers that do not depend on an async runtime.
//!
//! See [`crate::tokio_io::Demux`] (feature `tokio`) for routing incoming messages to
//! per-request channels.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::message::RequestId;

/// Hands out unique, non-zero request ids for one connection. Thread-safe.
#[derive(Debug)]
pub struct RequestIdAllocator {
    next: AtomicU64,
}

impl Default for RequestIdAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestIdAllocator {
    /// Starts at id 1 (id 0 is reserved for the handshake).
    pub fn new() -> Self {
        RequestIdAllocator {
            next: AtomicU64::new(1),
        }
    }

    /// Starts at `first` (0 is bumped to 1).
    pub fn starting_at(first: u64) -> Self {
        RequestIdAllocator {
            next: AtomicU64::new(first.max(1)),
        }
    }

    /// Returns a fresh id; never returns [`RequestId::RESERVED`].
    pub fn next_id(&self) -> RequestId {
        loop {
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                return RequestId(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_nonzero() {
        let a = RequestIdAllocator::new();
        let ids: Vec<_> = (0..1000).map(|_| a.next_id()).collect();
        assert_eq!(ids[0], RequestId(1));
        let set: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(set.len(), 1000);
        assert!(!ids.contains(&RequestId::RESERVED));
    }

    #[test]
    fn wraps_past_zero() {
        let a = RequestIdAllocator::starting_at(u64::MAX);
        assert_eq!(a.next_id(), RequestId(u64::MAX));
        assert_eq!(a.next_id(), RequestId(1));
    }

    #[test]
    fn concurrent_allocation_is_unique() {
        let a = std::sync::Arc::new(RequestIdAllocator::new());
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let a = a.clone();
                std::thread::spawn(move || (0..500).map(|_| a.next_id()).collect::<Vec<_>>())
            })
            .collect();
        let mut all = std::collections::HashSet::new();
        for h in hs {
            for id in h.join().expect("thread") {
                assert!(all.insert(id));
            }
        }
        assert_eq!(all.len(), 2000);
    }
}
