//! Snapshot state of the vsock device: activation, the device's own copies of its queues
//! (their ring indices advance here, not in the transport), the connection table, queued
//! RST replies, port allocation and counters.

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::connection::persist::ConnectionState;
use super::connection::Connection;
use super::packet::{Op, VsockHeader, HOST_CID, TYPE_STREAM};
use super::{
    ConnKey, VsockBackend, VsockStats, FIRST_LOCAL_PORT, MAX_CONNECTIONS, MAX_ORPHAN_REPLIES,
    QUEUE_SIZES,
};
use crate::devices::virtio::persist::{check_broken_reason, QueueSnapshot};
use crate::devices::virtio::Interrupt;
use crate::exit::VmEvent;
use crate::memory::GuestMem;
use crate::persist::PersistError;

const NAME: &str = "vsock";
/// Longest "broken" reason kept.
pub use crate::devices::virtio::MAX_BROKEN_REASON_LEN as MAX_REASON_LEN;

/// Serializable vsock device state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockBackendState {
    /// Guest CID.
    pub cid: u64,
    /// Activated (DRIVER_OK) and not reset.
    pub active: bool,
    /// Why the device is broken, if it is.
    pub broken: Option<String>,
    /// The device's queues (empty unless active).
    pub queues: Vec<QueueSnapshot>,
    /// Live connections.
    pub connections: Vec<ConnectionState>,
    /// Queued RSTs for packets that matched no connection: (host port, guest port).
    pub orphan_rsts: Vec<(u32, u32)>,
    /// Next host port to hand out.
    pub next_local_port: u32,
    /// Round-robin position of the RX path.
    pub rr_after: Option<ConnKey>,
    /// GuestReady was reported.
    pub ready_reported: bool,
    /// Packets taken from TX.
    pub tx_packets: u64,
    /// Packets written to RX.
    pub rx_packets: u64,
    /// Dropped packets.
    pub dropped: u64,
    /// RSTs for unknown connections.
    pub orphan_rsts_sent: u64,
}

impl VsockBackend {
    /// Captures the device state (the vCPUs paused and the muxer stopped).
    pub fn save(&self) -> VsockBackendState {
        VsockBackendState {
            cid: self.cid,
            active: self.active,
            broken: self.broken.clone(),
            queues: self.queues.iter().map(QueueSnapshot::save).collect(),
            connections: self.conns.values().map(Connection::save).collect(),
            orphan_rsts: self
                .orphan_replies
                .iter()
                .map(|h| (h.src_port, h.dst_port))
                .collect(),
            next_local_port: self.next_local_port,
            rr_after: self.rr_after,
            ready_reported: self.ready_reported,
            tx_packets: self.stats.tx_packets,
            rx_packets: self.stats.rx_packets,
            dropped: self.stats.dropped,
            orphan_rsts_sent: self.stats.orphan_rsts,
        }
    }

    /// Lets the next connection a guest listener accepts report [`VmEvent::GuestReady`]
    /// again: "ready" is per VMM process, and a restored device was ready in its old one.
    pub fn rearm_guest_ready(&mut self) {
        self.ready_reported = false;
    }

    /// Rebuilds the device from `state` over `mem` (the restored guest memory). `stream_for`
    /// supplies the new host stream of a connection; connections without one are reset, so
    /// the guest sees them closed. Everything is validated before anything is built.
    pub fn restore(
        state: &VsockBackendState,
        mem: GuestMem,
        irq: Arc<Interrupt>,
        events: Option<Sender<VmEvent>>,
        mut stream_for: impl FnMut(ConnKey) -> Option<UnixStream>,
    ) -> Result<Self, PersistError> {
        if state.connections.len() > MAX_CONNECTIONS {
            return Err(PersistError::invalid(
                NAME,
                format!("{} connections", state.connections.len()),
            ));
        }
        if state.orphan_rsts.len() > MAX_ORPHAN_REPLIES {
            return Err(PersistError::invalid(
                NAME,
                format!("{} queued replies", state.orphan_rsts.len()),
            ));
        }
        check_broken_reason(NAME, state.broken.as_deref())?;
        if !(FIRST_LOCAL_PORT..u32::MAX).contains(&state.next_local_port) {
            return Err(PersistError::invalid(
                NAME,
                format!("next host port {}", state.next_local_port),
            ));
        }
        let queues = if state.active {
            if state.queues.len() != QUEUE_SIZES.len() {
                return Err(PersistError::mismatch(
                    NAME,
                    format!(
                        "{} queues, expected {}",
                        state.queues.len(),
                        QUEUE_SIZES.len()
                    ),
                ));
            }
            let qs = state
                .queues
                .iter()
                .zip(QUEUE_SIZES)
                .map(|(q, max)| q.restore(NAME, max, &mem))
                .collect::<Result<Vec<_>, _>>()?;
            if let Some(i) = qs.iter().position(|q| !virtio_queue::QueueT::ready(q)) {
                return Err(PersistError::invalid(
                    NAME,
                    format!("active with queue {i} not ready"),
                ));
            }
            qs
        } else {
            if !state.queues.is_empty() {
                return Err(PersistError::invalid(NAME, "queues saved while inactive"));
            }
            Vec::new()
        };
        for c in &state.connections {
            Connection::validate(c)?;
            if c.guest_cid != state.cid {
                return Err(PersistError::invalid(
                    NAME,
                    format!(
                        "connection to CID {} on device with CID {}",
                        c.guest_cid, state.cid
                    ),
                ));
            }
        }
        let mut keys = std::collections::BTreeSet::new();
        for c in &state.connections {
            if !keys.insert((c.local_port, c.peer_port)) {
                return Err(PersistError::invalid(
                    NAME,
                    format!("duplicate connection {}:{}", c.local_port, c.peer_port),
                ));
            }
        }
        // Validated: now build (only socketpair creation can still fail).
        let mut conns = BTreeMap::new();
        for c in &state.connections {
            let key = (c.local_port, c.peer_port);
            conns.insert(key, Connection::restore(c, stream_for(key))?);
        }
        let orphan_replies: VecDeque<VsockHeader> = state
            .orphan_rsts
            .iter()
            .map(|&(src_port, dst_port)| VsockHeader {
                src_cid: HOST_CID,
                dst_cid: state.cid,
                src_port,
                dst_port,
                len: 0,
                type_: TYPE_STREAM,
                op: Op::Rst as u16,
                flags: 0,
                buf_alloc: 0,
                fwd_cnt: 0,
            })
            .collect();
        Ok(Self {
            cid: state.cid,
            mem: state.active.then_some(mem),
            queues,
            active: state.active,
            broken: state.broken.clone(),
            irq,
            conns,
            dead: Vec::new(),
            orphan_replies,
            next_local_port: state.next_local_port,
            rr_after: state.rr_after,
            events,
            ready_reported: state.ready_reported,
            stats: VsockStats {
                tx_packets: state.tx_packets,
                rx_packets: state.rx_packets,
                dropped: state.dropped,
                orphan_rsts: state.orphan_rsts_sent,
            },
        })
    }
}
