//! virtio-net (device id 1): the guest's Ethernet interface, backed by the VM's own user-mode
//! NAT ([`voidbox_net::Nat`]). The device exists only when the config has a `network`.
//!
//! Offered features: `VERSION_1`, `MAC` (the config's `guest_mac`), `MTU` ([`MTU`], the NAT's
//! 65520: Linux sets it on the interface and posts "big" receive buffers — chains of pages
//! holding a whole frame — so one TCP segment of up to 64 KiB is one frame, one notification
//! and one interrupt), `CSUM` and `GUEST_CSUM` (checksum offload both ways: the guest kernel,
//! whose every instruction is expensive on some hosts, neither computes nor verifies TCP/UDP
//! checksums; the device completes them on transmit — see [`frame`]) and `STATUS` (link
//! always up) — no segmentation or mergeable-buffer offloads, no control queue, so every
//! frame is a whole Ethernet frame of at most [`MAX_FRAME_LEN`] bytes behind the 12-byte
//! `virtio_net_hdr_v1` ([`frame`]). Two queues: receive ([`RXQ`]) and transmit ([`TXQ`]).
//!
//! **Where frames move.** All queue processing runs on the VMM's `net` thread ([`thread`]),
//! which owns the NAT; the vCPU thread only kicks one of two eventfds on QueueNotify. The
//! thread touches the queues and guest memory only under the [`NetBackend`] lock, so a
//! snapshot (which holds that lock) sees consistent rings. Backpressure towards the guest:
//! a frame is taken from the NAT only when a receive buffer is available; the NAT's bounded
//! queue then stops it reading host sockets.
//!
//! **Notifications and interrupts** (`VIRTIO_RING_F_EVENT_IDX`, offered): every guest
//! notification and interrupt costs the guest an exit or an interrupt entry, expensive on
//! hosts that interpret guest kernel code. The device raises at most one interrupt per queue
//! per batch, and none the driver's `used_event` suppressed; it asks for a transmit
//! notification only once it has taken every chain, and for a receive notification only when
//! it ran out of receive buffers.
//!
//! Everything the guest controls is checked: every descriptor walk is bounded by the queue
//! size and [`MAX_CHAIN_DESCS`], every buffer lies in guest memory, lengths are summed with
//! overflow checks and never allocated from before they are bounded. A malformed queue (a
//! loop, a buffer outside guest memory, a device-writable buffer in the transmit queue, a
//! device-readable one in the receive queue, a runaway available index) marks the device
//! broken (DEVICE_NEEDS_RESET), as for the other virtio devices; a well-formed chain holding
//! a bad frame (shorter than an Ethernet header, longer than the MTU allows, a checksum to
//! complete at offsets outside the frame) is dropped and
//! counted, and a frame that does not fit the guest's receive buffer is dropped and counted
//! (the buffer is returned empty, which Linux counts as a length error).

pub mod frame;
#[doc(hidden)]
pub mod fuzz;
pub mod persist;
pub mod report;
pub mod thread;

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vmm_sys_util::eventfd::EventFd;

use self::frame::{read_tx_frame, rx_capacity, rx_header, write_rx_frame, NET_HDR_LEN};
use super::virtio::queue::{collect_chain_bounded, pop_chain, ChainError, Desc};
use super::virtio::{
    announce_broken, checked_queues, read_config_bytes, ActivateError, Interrupt, VirtioDevice,
    INT_VRING, VIRTIO_F_VERSION_1,
};
use crate::exit::VmEvent;
use crate::memory::GuestMem;

/// virtio device id of a network device.
pub const NET_DEVICE_ID: u32 = 1;
/// Size of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// Receive queue index (NAT → guest).
pub const RXQ: usize = 0;
/// Transmit queue index (guest → NAT).
pub const TXQ: usize = 1;
/// Longest descriptor chain accepted (Linux uses one or two descriptors per frame).
pub const MAX_CHAIN_DESCS: usize = 64;
/// Link MTU offered (`VIRTIO_NET_F_MTU`): bytes of IP packet per frame.
pub const MTU: u16 = voidbox_net::MTU as u16;
/// Largest Ethernet frame either way (header + MTU, no FCS, no VLAN tag).
pub const MAX_FRAME_LEN: usize = voidbox_net::MTU + ETH_HLEN;
/// Length of an Ethernet header: the smallest frame.
pub const ETH_HLEN: usize = 14;
/// What the guest sees of this device model (offered features, MTU), for snapshot keys: a
/// guest restored from a snapshot keeps what its driver negotiated at boot, so a snapshot
/// taken with another device model must not be reused. Change it whenever the offered
/// features or the config space change.
pub const SNAPSHOT_KEY: &str = "virtio-net mtu=65520 csum guest_csum event_idx";
/// Longest "broken" reason kept.
pub use super::virtio::MAX_BROKEN_REASON_LEN as MAX_REASON_LEN;

const QUEUE_SIZES: [u16; 2] = [QUEUE_SIZE; 2];

/// Feature bits (`VIRTIO_NET_F_*`).
pub mod features {
    /// The driver may leave transmitted TCP/UDP checksums partial (`NEEDS_CSUM`): the device
    /// completes them ([`super::frame::complete_checksum`]).
    pub const CSUM: u32 = 0;
    /// The device marks received frames `DATA_VALID`: the driver need not verify checksums.
    pub const GUEST_CSUM: u32 = 1;
    /// `mtu` in config space is valid.
    pub const MTU: u32 = 3;
    /// `mac` in config space is valid.
    pub const MAC: u32 = 5;
    /// `status` in config space is valid.
    pub const STATUS: u32 = 16;
    /// `VIRTIO_RING_F_EVENT_IDX`: the driver says when it wants an interrupt (`used_event`),
    /// the device when it wants a notification (`avail_event`).
    pub const RING_EVENT_IDX: u32 = 29;
}

/// `VIRTIO_NET_S_LINK_UP`.
pub const LINK_UP: u16 = 1;

/// The features offered.
pub fn offered_features() -> u64 {
    (1u64 << VIRTIO_F_VERSION_1)
        | (1 << features::CSUM)
        | (1 << features::GUEST_CSUM)
        | (1 << features::MTU)
        | (1 << features::MAC)
        | (1 << features::STATUS)
        | (1 << features::RING_EVENT_IDX)
}

/// The config space (`struct virtio_net_config` up to `mtu`): MAC, status (link up),
/// `max_virtqueue_pairs` (1), MTU.
pub fn config_space(mac: [u8; 6]) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0..6].copy_from_slice(&mac);
    c[6..8].copy_from_slice(&LINK_UP.to_le_bytes());
    c[8..10].copy_from_slice(&1u16.to_le_bytes());
    c[10..12].copy_from_slice(&MTU.to_le_bytes());
    c
}

/// Counters, for tests and diagnostics (and kept in snapshots).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NetStats {
    /// Frames taken from the transmit queue and handed to the NAT.
    pub tx_frames: u64,
    /// Transmit chains dropped: shorter than a virtio-net and Ethernet header, or longer than
    /// the MTU allows.
    pub tx_dropped: u64,
    /// Frames written into receive buffers.
    pub rx_frames: u64,
    /// Frames from the NAT dropped because they did not fit the guest's receive buffer.
    pub rx_dropped: u64,
}

/// Both queues of an activated device.
pub(crate) struct NetQueues {
    pub(crate) rx: Queue,
    pub(crate) tx: Queue,
}

/// What one [`NetBackend::drain_tx`] took from the transmit queue.
#[derive(Debug, Default)]
pub struct TxBatch {
    /// Ethernet frames (virtio-net header stripped), in queue order.
    pub frames: Vec<Vec<u8>>,
    /// Used buffers were added (the interrupt was raised).
    pub used: bool,
    /// The batch stopped at its limit with chains still available.
    pub more: bool,
}

/// The device state shared by the MMIO transport (vCPU thread) and the net thread.
pub struct NetBackend {
    mac: [u8; 6],
    mem: Option<GuestMem>,
    queues: Option<NetQueues>,
    acked_features: u64,
    broken: Option<String>,
    irq: Arc<Interrupt>,
    events: Option<Sender<VmEvent>>,
    stats: NetStats,
}

/// A chain popped from a queue, walked and bounded.
type Chain = (u16, Vec<Desc>);

impl NetBackend {
    /// A device with address `mac`, raising `irq`, reporting a broken queue to `events`.
    pub fn new(mac: [u8; 6], irq: Arc<Interrupt>, events: Option<Sender<VmEvent>>) -> Self {
        Self {
            mac,
            mem: None,
            queues: None,
            acked_features: 0,
            broken: None,
            irq,
            events,
            stats: NetStats::default(),
        }
    }

    /// The guest's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Counters.
    pub fn stats(&self) -> NetStats {
        self.stats
    }

    /// Why the device is broken, if it is.
    pub fn broken_reason(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// True when the driver acknowledged feature bit `bit`.
    fn acked(&self, bit: u32) -> bool {
        self.acked_features & (1 << bit) != 0
    }

    /// True between activation and reset, unless broken.
    pub fn is_active(&self) -> bool {
        self.queues.is_some() && self.broken.is_none()
    }

    /// Takes the driver's queues (DRIVER_OK).
    pub fn activate(
        &mut self,
        mem: GuestMem,
        queues: Vec<Queue>,
        acked_features: u64,
    ) -> Result<(), ActivateError> {
        let [mut rx, mut tx] = checked_queues::<{ QUEUE_SIZES.len() }>(queues, &mem)?;
        for q in [&mut rx, &mut tx] {
            q.set_event_idx(acked_features & (1 << features::RING_EVENT_IDX) != 0);
        }
        self.mem = Some(mem);
        self.queues = Some(NetQueues { rx, tx });
        self.acked_features = acked_features;
        self.broken = None;
        Ok(())
    }

    /// Device reset: forget the queues.
    pub fn reset(&mut self) {
        self.queues = None;
        self.mem = None;
        self.acked_features = 0;
        self.broken = None;
    }

    /// Marks the device broken: processing stops, the driver sees DEVICE_NEEDS_RESET and a
    /// configuration-change interrupt. The VMM (and the NAT) keep running.
    pub fn mark_broken(&mut self, why: String) {
        if self.broken.is_some() {
            return;
        }
        self.broken = Some(announce_broken("net", why, &self.irq, self.events.as_ref()));
    }

    /// Pops and walks the next chain of queue `which`; `Ok(None)` when none is available.
    fn next_chain(&mut self, mem: &GuestMem, which: usize) -> Result<Option<Chain>, ChainError> {
        let Some(qs) = self.queues.as_mut() else {
            return Ok(None);
        };
        let q = if which == RXQ { &mut qs.rx } else { &mut qs.tx };
        let max = usize::from(q.size()).min(MAX_CHAIN_DESCS);
        match pop_chain(q, mem)? {
            Some(chain) => collect_chain_bounded(mem, chain, max).map(Some),
            None => Ok(None),
        }
    }

    fn add_used(&mut self, mem: &GuestMem, which: usize, head: u16, len: u32) -> bool {
        let Some(qs) = self.queues.as_mut() else {
            return false;
        };
        let q = if which == RXQ { &mut qs.rx } else { &mut qs.tx };
        match q.add_used(mem, head, len) {
            Ok(()) => true,
            Err(e) => {
                let name = if which == RXQ { "RX" } else { "TX" };
                self.mark_broken(format!("{name} used ring: {e}"));
                false
            }
        }
    }

    /// Raises the used-buffer interrupt for queue `which`, unless the driver suppressed it
    /// (`used_event`, with `EVENT_IDX`).
    fn signal_used(&mut self, mem: &GuestMem, which: usize) {
        let Some(qs) = self.queues.as_mut() else {
            return;
        };
        let q = if which == RXQ { &mut qs.rx } else { &mut qs.tx };
        // A used_event the device cannot read: interrupt, as without EVENT_IDX.
        if !q.needs_notification(mem).unwrap_or(true) {
            return;
        }
        if let Err(e) = self.irq.signal(INT_VRING) {
            log::warn!("net: cannot raise interrupt: {e}");
        }
    }

    /// Asks the driver to notify when it adds to queue `which` (with `EVENT_IDX`: at the
    /// next chain after those taken so far). True when chains arrived meanwhile (take them:
    /// no notification will come for them).
    fn want_notification(&mut self, mem: &GuestMem, which: usize) -> bool {
        let Some(qs) = self.queues.as_mut() else {
            return false;
        };
        let q = if which == RXQ { &mut qs.rx } else { &mut qs.tx };
        match q.enable_notification(mem) {
            Ok(more) => more,
            Err(e) => {
                let name = if which == RXQ { "RX" } else { "TX" };
                self.mark_broken(format!("{name} avail ring: {e}"));
                false
            }
        }
    }

    /// Takes up to `max` chains from the transmit queue: each well-formed frame is returned
    /// (header stripped), each bad one dropped and counted; every chain is returned to the
    /// guest as used. Raises the interrupt when buffers were used.
    pub fn drain_tx(&mut self, max: usize) -> TxBatch {
        let mut batch = TxBatch::default();
        if !self.is_active() {
            return batch;
        }
        let Some(mem) = self.mem.clone() else {
            return batch;
        };
        let csum = self.acked(features::CSUM);
        let mut taken = 0usize;
        loop {
            if taken >= max {
                batch.more = self.has_available(&mem, TXQ);
                break;
            }
            let (head, descs) = match self.next_chain(&mem, TXQ) {
                Ok(Some(c)) => c,
                Ok(None) if self.want_notification(&mem, TXQ) => continue,
                Ok(None) => break,
                Err(e) => {
                    self.mark_broken(format!("TX queue: {e}"));
                    break;
                }
            };
            match read_tx_frame(&mem, &descs, csum) {
                Ok(Ok(frame)) => {
                    self.stats.tx_frames += 1;
                    batch.frames.push(frame);
                }
                Ok(Err(drop)) => {
                    log::debug!("net: dropped a transmitted frame: {drop}");
                    self.stats.tx_dropped += 1;
                }
                Err(e) => {
                    self.mark_broken(format!("TX queue: {e}"));
                    break;
                }
            }
            taken += 1;
            if !self.add_used(&mem, TXQ, head, 0) {
                break;
            }
            batch.used = true;
        }
        if batch.used && self.broken.is_none() {
            self.signal_used(&mem, TXQ);
        }
        batch
    }

    /// True when queue `which` has a chain available (nothing is consumed).
    fn has_available(&mut self, mem: &GuestMem, which: usize) -> bool {
        let Some(qs) = self.queues.as_mut() else {
            return false;
        };
        let q = if which == RXQ { &mut qs.rx } else { &mut qs.tx };
        match q.avail_idx(mem, std::sync::atomic::Ordering::Acquire) {
            Ok(idx) => idx.0 != q.next_avail(),
            Err(_) => false,
        }
    }

    /// Fills receive buffers with frames from `next` while buffers are available; a frame is
    /// taken only once a buffer is in hand, so frames stay queued in the NAT while the guest
    /// has no buffer. A frame that does not fit its buffer is dropped and counted. Raises the
    /// interrupt when buffers were used; returns true then.
    pub fn fill_rx(&mut self, mut next: impl FnMut() -> Option<Vec<u8>>) -> bool {
        if !self.is_active() {
            return false;
        }
        let Some(mem) = self.mem.clone() else {
            return false;
        };
        let header = rx_header(self.acked(features::GUEST_CSUM));
        let mut used = false;
        loop {
            let (head, descs) = match self.next_chain(&mem, RXQ) {
                Ok(Some(c)) => c,
                // Out of buffers: the guest notifies when it adds some (while buffers are
                // left, its notifications are not needed and stay suppressed).
                Ok(None) if self.want_notification(&mem, RXQ) => continue,
                Ok(None) => break,
                Err(e) => {
                    self.mark_broken(format!("RX queue: {e}"));
                    break;
                }
            };
            let cap = match rx_capacity(&descs) {
                Ok(c) => c,
                Err(e) => {
                    self.mark_broken(format!("RX queue: {e}"));
                    break;
                }
            };
            let Some(frame) = next() else {
                // Nothing to deliver: give the buffer back untouched.
                if let Some(qs) = self.queues.as_mut() {
                    qs.rx.go_to_previous_position();
                }
                break;
            };
            let fits = frame.len() <= MAX_FRAME_LEN && (NET_HDR_LEN + frame.len()) as u64 <= cap;
            let written = if fits {
                match write_rx_frame(&mem, &descs, &header, &frame) {
                    Ok(n) => {
                        self.stats.rx_frames += 1;
                        n
                    }
                    Err(e) => {
                        self.mark_broken(format!("RX queue: {e}"));
                        break;
                    }
                }
            } else {
                log::debug!(
                    "net: dropped a {}-byte frame for a {cap}-byte receive buffer",
                    frame.len()
                );
                self.stats.rx_dropped += 1;
                0
            };
            if !self.add_used(&mem, RXQ, head, written) {
                break;
            }
            used = true;
        }
        if used && self.broken.is_none() {
            self.signal_used(&mem, RXQ);
        }
        used
    }
}

/// Locks the backend, recovering from a poisoned lock (state stays consistent per call).
pub fn lock(b: &Mutex<NetBackend>) -> MutexGuard<'_, NetBackend> {
    b.lock().unwrap_or_else(|p| p.into_inner())
}

/// The eventfds the virtio side kicks to wake the net thread.
#[derive(Debug, Clone)]
pub struct NetKicks {
    /// The guest posted receive buffers.
    pub rx: Arc<EventFd>,
    /// The guest posted frames to transmit.
    pub tx: Arc<EventFd>,
}

impl NetKicks {
    /// Two new non-blocking eventfds.
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            rx: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
            tx: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
        })
    }

    /// Wakes the net thread for both queues.
    pub fn kick_both(&self) {
        kick(&self.rx);
        kick(&self.tx);
    }
}

fn kick(evt: &EventFd) {
    if let Err(e) = evt.write(1) {
        log::warn!("net: cannot wake the net thread: {e}");
    }
}

/// The virtio side of the network device, owned by the MMIO transport.
pub struct NetDevice {
    backend: Arc<Mutex<NetBackend>>,
    kicks: NetKicks,
    config: [u8; 12],
}

impl NetDevice {
    /// A device around `backend`; `kicks` wake the net thread.
    pub fn new(backend: Arc<Mutex<NetBackend>>, kicks: NetKicks) -> Self {
        let config = config_space(lock(&backend).mac);
        Self {
            backend,
            kicks,
            config,
        }
    }
}

impl VirtioDevice for NetDevice {
    fn name(&self) -> &'static str {
        "net"
    }

    fn device_type(&self) -> u32 {
        NET_DEVICE_ID
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn features(&self) -> u64 {
        offered_features()
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        log::debug!("net: guest wrote read-only config space");
    }

    fn activate(
        &mut self,
        mem: GuestMem,
        queues: Vec<Queue>,
        acked_features: u64,
    ) -> Result<(), ActivateError> {
        lock(&self.backend).activate(mem, queues, acked_features)?;
        // Frames may be waiting in the NAT, buffers in the rings.
        self.kicks.kick_both();
        Ok(())
    }

    fn queue_notify(&mut self, index: u32) {
        match index as usize {
            RXQ => kick(&self.kicks.rx),
            _ => kick(&self.kicks.tx),
        }
    }

    fn reset(&mut self) {
        lock(&self.backend).reset();
    }

    fn is_broken(&self) -> bool {
        lock(&self.backend).broken.is_some()
    }
}

#[cfg(test)]
mod tests;
