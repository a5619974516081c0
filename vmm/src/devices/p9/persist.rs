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
use crate::devices::virtio::request_queue::RequestQueueState;
use crate::devices::virtio::Interrupt;
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
        let slot = u8::try_from(self.slot).map_err(|_| "share slot out of range".to_string())?;
        let requests = self.requests.save();
        Ok(P9State {
            slot,
            acked_features: requests.acked_features,
            queue: requests.queue,
            broken: requests.broken,
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
        let mut p = P9::new(slot, share, irq, events);
        p.requests.restore(
            NAME,
            RequestQueueState {
                acked_features: state.acked_features,
                queue: state.queue,
                broken: state.broken.clone(),
            },
            offered_features(),
            QUEUE_SIZE,
            mem,
        )?;
        p.dropped = state.dropped;
        Ok(p)
    }
}
