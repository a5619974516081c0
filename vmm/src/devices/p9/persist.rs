//! Snapshot state of a share slot: its slot number, the negotiated features, the device's
//! own copy of its queue and the dropped-request counter — the transport side only.
//!
//! The 9P session is not saved (its fids are host descriptors of this process), so a slot
//! with live fids — something mounted — cannot be snapshotted: [`P9::save`] refuses. Golden
//! snapshots are taken before any mount, so they always can. Which directory a slot serves
//! is not saved either: the restored VM binds the one its own config names (or none).

use std::sync::mpsc::Sender;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{offered_features, tag, Share, P9, QUEUE_SIZE, SHARE_SLOTS};
use crate::devices::virtio::persist::QueueSnapshot;
use crate::devices::virtio::{Interrupt, MAX_BROKEN_REASON_LEN};
use crate::exit::VmEvent;
use crate::memory::GuestMem;
use crate::persist::PersistError;

const NAME: &str = "p9";

/// Serializable share slot state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct P9State {
    /// The slot (its tag is `voidbox<slot>`).
    pub slot: u8,
    /// Features the driver acknowledged (0 unless active).
    pub acked_features: u64,
    /// The device's queue while active (DRIVER_OK and not reset).
    pub queue: Option<QueueSnapshot>,
    /// Why the device is broken, if it is.
    pub broken: Option<String>,
    /// Requests dropped without a reply.
    pub dropped: u64,
}

impl P9 {
    /// Captures the device state (the vCPUs paused). Refused while the guest holds fids on
    /// the share (it is mounted): they cannot outlive this process.
    pub fn save(&self) -> Result<P9State, String> {
        let fids = self.share.live_fids();
        if fids > 0 {
            return Err(format!(
                "share {} is in use ({fids} open fids): a VM with a mounted share cannot be \
                 snapshotted",
                tag(self.slot)
            ));
        }
        Ok(P9State {
            slot: u8::try_from(self.slot).map_err(|_| "share slot out of range".to_string())?,
            acked_features: self.acked_features,
            queue: self.queue.as_ref().map(QueueSnapshot::save),
            broken: self.broken.clone(),
            dropped: self.dropped,
        })
    }

    /// Rebuilds slot `slot` from `state` over the restored guest memory `mem`, serving
    /// `share` (this VM's binding). Everything is validated before the device is built.
    pub fn restore(
        state: &P9State,
        slot: usize,
        share: Share,
        mem: GuestMem,
        irq: Arc<Interrupt>,
        events: Option<Sender<VmEvent>>,
    ) -> Result<Self, PersistError> {
        if usize::from(state.slot) != slot || slot >= SHARE_SLOTS {
            return Err(PersistError::invalid(
                NAME,
                format!("slot {} saved where slot {slot} belongs", state.slot),
            ));
        }
        if state.acked_features & !offered_features() != 0 {
            return Err(PersistError::invalid(
                NAME,
                format!(
                    "acked features {:#x} were never offered",
                    state.acked_features
                ),
            ));
        }
        if state
            .broken
            .as_ref()
            .is_some_and(|r| r.len() > MAX_BROKEN_REASON_LEN)
        {
            return Err(PersistError::invalid(NAME, "broken reason too long"));
        }
        let queue = match &state.queue {
            Some(q) => {
                let q = q.restore(NAME, QUEUE_SIZE, &mem)?;
                if !virtio_queue::QueueT::ready(&q) {
                    return Err(PersistError::invalid(NAME, "active queue not ready"));
                }
                Some(q)
            }
            None if state.acked_features != 0 => {
                return Err(PersistError::invalid(NAME, "features acked while inactive"));
            }
            None => None,
        };
        let mut p = P9::new(slot, share, irq, events);
        p.mem = queue.as_ref().map(|_| mem);
        p.queue = queue;
        p.acked_features = state.acked_features;
        p.broken = state.broken.clone();
        p.dropped = state.dropped;
        Ok(p)
    }
}
