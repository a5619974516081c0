//! Snapshot state of one virtqueue (addresses, size, ring indices), shared by the transport
//! and by devices that process their queues themselves.

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueState, QueueT};

use super::MAX_BROKEN_REASON_LEN;
use crate::memory::GuestMem;
use crate::persist::PersistError;

/// Serializable virtqueue state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSnapshot {
    /// QueueNumMax offered by the device.
    pub max_size: u16,
    /// QueueNum chosen by the driver.
    pub size: u16,
    /// QueueReady.
    pub ready: bool,
    /// Descriptor table address.
    pub desc_table: u64,
    /// Available (driver) ring address.
    pub avail_ring: u64,
    /// Used (device) ring address.
    pub used_ring: u64,
    /// Next available-ring entry the device will take.
    pub next_avail: u16,
    /// Next used-ring entry the device will fill.
    pub next_used: u16,
    /// VIRTIO_F_EVENT_IDX negotiated.
    pub event_idx: bool,
}

impl QueueSnapshot {
    /// Captures `q`.
    pub fn save(q: &Queue) -> Self {
        let s = q.state();
        Self {
            max_size: s.max_size,
            size: s.size,
            ready: s.ready,
            desc_table: s.desc_table,
            avail_ring: s.avail_ring,
            used_ring: s.used_ring,
            next_avail: s.next_avail,
            next_used: s.next_used,
            event_idx: s.event_idx_enabled,
        }
    }

    /// Rebuilds the queue for `device`, whose queue offers `max_size` entries. A ready queue
    /// must lie inside `mem`.
    pub fn restore(
        &self,
        device: &'static str,
        max_size: u16,
        mem: &GuestMem,
    ) -> Result<Queue, PersistError> {
        if self.max_size != max_size {
            return Err(PersistError::mismatch(
                device,
                format!(
                    "queue max size {} in snapshot, device offers {max_size}",
                    self.max_size
                ),
            ));
        }
        let q = Queue::try_from(QueueState {
            max_size: self.max_size,
            next_avail: self.next_avail,
            next_used: self.next_used,
            event_idx_enabled: self.event_idx,
            size: self.size,
            ready: self.ready,
            desc_table: self.desc_table,
            avail_ring: self.avail_ring,
            used_ring: self.used_ring,
        })
        .map_err(|e| PersistError::invalid(device, format!("queue: {e}")))?;
        if q.ready() && !q.is_valid(mem) {
            return Err(PersistError::invalid(
                device,
                "ready queue lies outside guest memory or is misaligned",
            ));
        }
        Ok(q)
    }
}

/// Refuses a snapshot of `device` whose driver acknowledged features (`acked`) that were
/// never `offered`.
pub fn check_acked_features(
    device: &'static str,
    acked: u64,
    offered: u64,
) -> Result<(), PersistError> {
    if acked & !offered != 0 {
        return Err(PersistError::invalid(
            device,
            format!("acked features {acked:#x} were never offered"),
        ));
    }
    Ok(())
}

/// Refuses a snapshot of `device` whose broken reason is longer than a device keeps
/// ([`MAX_BROKEN_REASON_LEN`]).
pub fn check_broken_reason(device: &'static str, broken: Option<&str>) -> Result<(), PersistError> {
    if broken.is_some_and(|r| r.len() > MAX_BROKEN_REASON_LEN) {
        return Err(PersistError::invalid(device, "broken reason too long"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;

    fn queue() -> Queue {
        let mut q = Queue::new(256).unwrap();
        q.set_size(16);
        q.set_desc_table_address(Some(0x1000), Some(0));
        q.set_avail_ring_address(Some(0x2000), Some(0));
        q.set_used_ring_address(Some(0x3000), Some(0));
        q.set_ready(true);
        q.set_next_avail(7);
        q.set_next_used(5);
        q
    }

    #[test]
    fn round_trip() {
        let mem = create_guest_memory(1 << 20).unwrap();
        let q = queue();
        let s = QueueSnapshot::save(&q);
        let json = serde_json::to_string(&s).unwrap();
        let s2: QueueSnapshot = serde_json::from_str(&json).unwrap();
        let r = s2.restore("t", 256, &mem).unwrap();
        assert_eq!(r.state(), q.state());
    }

    #[test]
    fn invalid_states_are_refused() {
        let mem = create_guest_memory(1 << 20).unwrap();
        let s = QueueSnapshot::save(&queue());
        assert!(matches!(
            s.restore("t", 128, &mem),
            Err(PersistError::Mismatch { .. })
        ));
        for bad in [
            QueueSnapshot { size: 3, ..s },
            QueueSnapshot { size: 512, ..s },
            QueueSnapshot {
                desc_table: 1 << 40,
                ..s
            },
            QueueSnapshot {
                used_ring: 0x3001,
                ..s
            },
        ] {
            assert!(
                matches!(
                    bad.restore("t", 256, &mem),
                    Err(PersistError::Invalid { .. })
                ),
                "{bad:?}"
            );
        }
        // A queue that is not ready may hold anything the driver wrote.
        let idle = QueueSnapshot {
            ready: false,
            desc_table: 1 << 40,
            ..s
        };
        assert!(idle.restore("t", 256, &mem).is_ok());
    }
}
