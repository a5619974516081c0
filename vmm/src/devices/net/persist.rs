//! Snapshot state of the network device: its MAC address, the negotiated features, the
//! device's own copies of its two queues (whose ring indices advance here, not in the
//! transport) and counters.
//!
//! The NAT is not part of it: a restored VM gets a new NAT built from the restoring config
//! (its policy may differ from the snapshot creator's), sharing nothing with any other VM.
//! Connections the guest had at snapshot time are unknown to it (the guest sees them reset).
//! Buffers the guest had posted stay posted: the net thread looks at both queues as soon as
//! it starts, so the restored guest's network works at once.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use virtio_queue::QueueT;

use super::{offered_features, NetBackend, NetQueues, NetStats, QUEUE_SIZES, RXQ, TXQ};
use crate::devices::virtio::persist::{check_acked_features, check_broken_reason, QueueSnapshot};
use crate::devices::virtio::Interrupt;
use crate::exit::VmEvent;
use crate::memory::GuestMem;
use crate::persist::PersistError;

const NAME: &str = "net";

/// The two queues of an active device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetQueuesState {
    /// Receive queue.
    pub rx: QueueSnapshot,
    /// Transmit queue.
    pub tx: QueueSnapshot,
}

/// Serializable network device state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetState {
    /// The guest's MAC address (the driver read it at probe; the restoring config must name
    /// the same).
    pub mac: [u8; 6],
    /// Features the driver acknowledged (0 unless active).
    pub acked_features: u64,
    /// The device's queues while active (DRIVER_OK and not reset).
    pub queues: Option<NetQueuesState>,
    /// Why the device is broken, if it is.
    pub broken: Option<String>,
    /// Frames transmitted.
    pub tx_frames: u64,
    /// Transmitted chains dropped.
    pub tx_dropped: u64,
    /// Frames received.
    pub rx_frames: u64,
    /// Frames dropped for want of room in a receive buffer.
    pub rx_dropped: u64,
}

impl NetBackend {
    /// Captures the device state (the vCPUs paused; the net thread touches queues and guest
    /// memory only under the backend lock the caller holds).
    pub fn save(&self) -> NetState {
        NetState {
            mac: self.mac,
            acked_features: self.acked_features,
            queues: self.queues.as_ref().map(|q| NetQueuesState {
                rx: QueueSnapshot::save(&q.rx),
                tx: QueueSnapshot::save(&q.tx),
            }),
            broken: self.broken.clone(),
            tx_frames: self.stats.tx_frames,
            tx_dropped: self.stats.tx_dropped,
            rx_frames: self.stats.rx_frames,
            rx_dropped: self.stats.rx_dropped,
        }
    }

    /// Rebuilds the device from `state` over the restored guest memory `mem`, for a config
    /// whose guest MAC is `mac`. Everything is validated before the device is built.
    pub fn restore(
        state: &NetState,
        mac: [u8; 6],
        mem: GuestMem,
        irq: Arc<Interrupt>,
        events: Option<Sender<VmEvent>>,
    ) -> Result<Self, PersistError> {
        if state.mac != mac {
            return Err(PersistError::mismatch(
                NAME,
                format!(
                    "guest MAC {} in the snapshot, {} configured",
                    fmt_mac(state.mac),
                    fmt_mac(mac)
                ),
            ));
        }
        check_acked_features(NAME, state.acked_features, offered_features())?;
        check_broken_reason(NAME, state.broken.as_deref())?;
        let queues = match &state.queues {
            Some(q) => {
                let rx = q.rx.restore(NAME, QUEUE_SIZES[RXQ], &mem)?;
                let tx = q.tx.restore(NAME, QUEUE_SIZES[TXQ], &mem)?;
                if !rx.ready() || !tx.ready() {
                    return Err(PersistError::invalid(NAME, "active queue not ready"));
                }
                Some(NetQueues { rx, tx })
            }
            None if state.acked_features != 0 => {
                return Err(PersistError::invalid(NAME, "features acked while inactive"));
            }
            None => None,
        };
        Ok(Self {
            mac,
            mem: queues.as_ref().map(|_| mem),
            queues,
            acked_features: state.acked_features,
            broken: state.broken.clone(),
            irq,
            events,
            stats: NetStats {
                tx_frames: state.tx_frames,
                tx_dropped: state.tx_dropped,
                rx_frames: state.rx_frames,
                rx_dropped: state.rx_dropped,
            },
        })
    }
}

/// `52:54:00:12:34:56`.
pub fn fmt_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
