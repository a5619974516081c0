//! Snapshot state of a block device: the disk's size and mode (checked against the file the
//! restored VM opens), the negotiated features, the device's own copy of its queue (whose
//! ring indices advance here, not in the transport), and counters.
//!
//! Requests run synchronously inside the notifying vCPU's MMIO exit, so a snapshot (taken
//! with every vCPU paused after its pending exit completed) never has a request in flight:
//! the queue indices are the whole story. The disk's contents are not part of the snapshot:
//! the restored VM reopens the file its config names.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::disk::Disk;
use super::{disk_name, offered_features, Block, BlockStats, QUEUE_SIZE};
use crate::devices::virtio::persist::QueueSnapshot;
use crate::devices::virtio::request_queue::RequestQueueState;
use crate::devices::virtio::Interrupt;
use crate::exit::VmEvent;
use crate::memory::GuestMem;
use crate::persist::PersistError;

const NAME: &str = "block";

/// Serializable block device state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockState {
    /// Disk size in 512-byte sectors.
    pub capacity: u64,
    /// Offered read-only.
    pub read_only: bool,
    /// Features the driver acknowledged (0 unless active).
    pub acked_features: u64,
    /// The device's queue while active (DRIVER_OK and not reset).
    pub queue: Option<QueueSnapshot>,
    /// Why the device is broken, if it is.
    pub broken: Option<String>,
    /// Completed reads.
    pub reads: u64,
    /// Completed writes.
    pub writes: u64,
    /// Completed flushes.
    pub flushes: u64,
    /// Failed requests.
    pub errors: u64,
}

impl Block {
    /// Captures the device state (the vCPUs paused).
    pub fn save(&self) -> BlockState {
        let requests = self.requests.save();
        BlockState {
            capacity: self.disk.capacity(),
            read_only: self.disk.read_only(),
            acked_features: requests.acked_features,
            queue: requests.queue,
            broken: requests.broken,
            reads: self.stats.reads,
            writes: self.stats.writes,
            flushes: self.stats.flushes,
            errors: self.stats.errors,
        }
    }

    /// Rebuilds disk `index` from `state` around `disk` (the file the restored VM's config
    /// names, already opened and locked) over the restored guest memory `mem`. The disk must
    /// have the saved size and mode; everything is validated before the device is built.
    pub fn restore(
        state: &BlockState,
        disk: Disk,
        index: usize,
        mem: GuestMem,
        irq: Arc<Interrupt>,
        events: Option<Sender<VmEvent>>,
    ) -> Result<Self, PersistError> {
        let name = disk_name(index);
        if disk.capacity() != state.capacity {
            return Err(PersistError::mismatch(
                NAME,
                format!(
                    "disk {index} ({name}, {}) has {} sectors; the snapshot's had {}",
                    disk.path().display(),
                    disk.capacity(),
                    state.capacity
                ),
            ));
        }
        if disk.read_only() != state.read_only {
            return Err(PersistError::mismatch(
                NAME,
                format!(
                    "disk {index} ({name}, {}) is configured {}; the snapshot's was {}",
                    disk.path().display(),
                    mode(disk.read_only()),
                    mode(state.read_only)
                ),
            ));
        }
        let mut block = Block::new(disk, index, irq, events);
        block.requests.restore(
            NAME,
            RequestQueueState {
                acked_features: state.acked_features,
                queue: state.queue,
                broken: state.broken.clone(),
            },
            offered_features(state.read_only),
            QUEUE_SIZE,
            mem,
        )?;
        block.stats = BlockStats {
            reads: state.reads,
            writes: state.writes,
            flushes: state.flushes,
            errors: state.errors,
        };
        Ok(block)
    }
}

fn mode(read_only: bool) -> &'static str {
    if read_only {
        "read-only"
    } else {
        "read-write"
    }
}
