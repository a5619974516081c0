//! Userspace virtio-vsock device (id 19) with a Firecracker-style hybrid host side: one Unix
//! socket per VM; the host connects, sends `CONNECT <port>\n`, receives `OK <hostport>\n`, and
//! the stream is then joined to the guest's listener on that port.
//!
//! All device state lives in plain structs ([`VsockBackend`], [`connection::Connection`]) so
//! a snapshot can capture it. Queue processing runs on the muxer thread; the vCPU thread only
//! kicks an eventfd on QueueNotify.

pub mod connection;
pub mod muxer;
pub mod packet;
pub mod persist;

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use self::connection::{Connection, PacketOutcome};
use self::packet::{
    read_tx_packet, rx_capacity, write_rx_packet, Op, PacketError, VsockHeader, HOST_CID,
    TYPE_STREAM,
};
use super::virtio::queue::{collect_chain, pop_chain};
use super::virtio::{
    checked_queues, read_config_bytes, ActivateError, Interrupt, VirtioDevice, INT_CONFIG,
    INT_VRING, VIRTIO_F_VERSION_1,
};
use crate::exit::VmEvent;
use crate::memory::GuestMem;

/// virtio device id of vsock.
pub const VSOCK_DEVICE_ID: u32 = 19;
/// Size of each of the three queues.
pub const QUEUE_SIZE: u16 = 256;
/// RX queue index (host → guest).
pub const RXQ: usize = 0;
/// TX queue index (guest → host).
pub const TXQ: usize = 1;
/// Event queue index.
pub const EVQ: usize = 2;
/// Most concurrent connections.
pub const MAX_CONNECTIONS: usize = 256;
/// Most queued replies for packets that match no connection.
const MAX_ORPHAN_REPLIES: usize = 1024;
/// First host-side port handed out.
pub const FIRST_LOCAL_PORT: u32 = 1 << 30;

const QUEUE_SIZES: [u16; 3] = [QUEUE_SIZE; 3];

/// Key of a connection: (host port, guest port).
pub type ConnKey = (u32, u32);

/// Counters, for tests and diagnostics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct VsockStats {
    /// Packets taken from the TX queue.
    pub tx_packets: u64,
    /// Packets written to the RX queue.
    pub rx_packets: u64,
    /// Guest packets dropped (wrong CID, unknown type …).
    pub dropped: u64,
    /// RST replies sent for packets matching no connection.
    pub orphan_rsts: u64,
}

/// The device state shared by the MMIO transport (vCPU thread) and the muxer thread.
pub struct VsockBackend {
    cid: u64,
    mem: Option<GuestMem>,
    queues: Vec<Queue>,
    active: bool,
    broken: Option<String>,
    irq: Arc<Interrupt>,
    conns: BTreeMap<ConnKey, Connection>,
    dead: Vec<Connection>,
    orphan_replies: VecDeque<VsockHeader>,
    next_local_port: u32,
    rr_after: Option<ConnKey>,
    events: Option<Sender<VmEvent>>,
    ready_reported: bool,
    stats: VsockStats,
}

impl VsockBackend {
    /// A device for guest `cid`, raising `irq`, reporting to `events`.
    pub fn new(cid: u64, irq: Arc<Interrupt>, events: Option<Sender<VmEvent>>) -> Self {
        Self {
            cid,
            mem: None,
            queues: Vec::new(),
            active: false,
            broken: None,
            irq,
            conns: BTreeMap::new(),
            dead: Vec::new(),
            orphan_replies: VecDeque::new(),
            next_local_port: FIRST_LOCAL_PORT,
            rr_after: None,
            events,
            ready_reported: false,
            stats: VsockStats::default(),
        }
    }

    /// Guest CID.
    pub fn cid(&self) -> u64 {
        self.cid
    }

    /// True between activation and reset, unless broken.
    pub fn is_active(&self) -> bool {
        self.active && self.broken.is_none()
    }

    /// Why the device is broken, if it is.
    pub fn broken_reason(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Counters.
    pub fn stats(&self) -> VsockStats {
        self.stats
    }

    /// Live connections.
    pub fn connections(&self) -> impl Iterator<Item = &Connection> {
        self.conns.values()
    }

    /// Takes the driver's queues (DRIVER_OK).
    pub fn activate(&mut self, mem: GuestMem, queues: Vec<Queue>) -> Result<(), ActivateError> {
        let queues = checked_queues::<{ QUEUE_SIZES.len() }>(queues, &mem)?;
        self.mem = Some(mem);
        self.queues = queues.into();
        self.active = true;
        self.broken = None;
        Ok(())
    }

    /// Device reset: forget queues, close every connection.
    pub fn reset(&mut self) {
        self.active = false;
        self.broken = None;
        self.queues.clear();
        self.mem = None;
        self.orphan_replies.clear();
        self.kill_all_connections();
    }

    fn kill_all_connections(&mut self) {
        for (_, mut c) in std::mem::take(&mut self.conns) {
            c.reset();
            self.dead.push(c);
        }
    }

    /// Marks the device broken: processing stops, host streams are closed, the driver sees
    /// DEVICE_NEEDS_RESET and a configuration-change interrupt. The VMM keeps running.
    pub fn mark_broken(&mut self, why: String) {
        if self.broken.is_some() {
            return;
        }
        log::error!("vsock device broken: {why}");
        self.broken = Some(why.clone());
        self.kill_all_connections();
        self.orphan_replies.clear();
        if let Err(e) = self.irq.signal(INT_CONFIG) {
            log::warn!("vsock: cannot raise interrupt: {e}");
        }
        if let Some(ev) = &self.events {
            let _ = ev.send(VmEvent::DeviceBroken("vsock".into(), why));
        }
    }

    fn alloc_local_port(&mut self) -> Option<u32> {
        for _ in 0..=MAX_CONNECTIONS {
            let p = self.next_local_port;
            self.next_local_port = if p == u32::MAX - 1 {
                FIRST_LOCAL_PORT
            } else {
                p + 1
            };
            if !self.conns.keys().any(|(l, _)| *l == p) {
                return Some(p);
            }
        }
        None
    }

    /// Starts a host-initiated connection to guest `peer_port`; returns the host port.
    pub fn connect_from_host(&mut self, peer_port: u32, stream: UnixStream) -> Option<u32> {
        if !self.is_active() || self.conns.len() >= MAX_CONNECTIONS {
            return None;
        }
        let local = self.alloc_local_port()?;
        let conn = Connection::new_host_initiated(local, peer_port, self.cid, stream);
        self.conns.insert((local, peer_port), conn);
        Some(local)
    }

    /// Mutable access to one connection.
    pub fn connection_mut(&mut self, local_port: u32, peer_port: u32) -> Option<&mut Connection> {
        self.conns.get_mut(&(local_port, peer_port))
    }

    /// Finds the connection whose host stream has this fd.
    pub fn key_for_fd(&self, fd: RawFd) -> Option<ConnKey> {
        self.conns
            .iter()
            .find(|(_, c)| c.stream().as_raw_fd() == fd)
            .map(|(k, _)| *k)
    }

    /// The host stream of `key` is readable/writable/hung up.
    pub fn stream_event(&mut self, key: ConnKey, readable: bool, writable: bool, hup: bool) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if hup {
            c.host_hung_up();
        }
        if writable {
            c.flush_tx();
        }
        if readable {
            c.fill_rx_stage();
        }
    }

    /// `(fd, wants_read, wants_write, wants_hangup)` for each live connection.
    pub fn poll_interests(&self) -> Vec<(RawFd, bool, bool, bool)> {
        self.conns
            .values()
            .filter(|c| !c.is_done())
            .map(|c| {
                (
                    c.stream().as_raw_fd(),
                    c.wants_read(),
                    c.wants_write(),
                    c.wants_hangup(),
                )
            })
            .collect()
    }

    /// Removes finished connections; the caller deregisters their fds before dropping them.
    pub fn reap(&mut self, now: Instant) -> Vec<Connection> {
        for c in self.conns.values_mut() {
            c.tick(now);
        }
        let done: Vec<ConnKey> = self
            .conns
            .iter()
            .filter(|(_, c)| c.is_done())
            .map(|(k, _)| *k)
            .collect();
        let mut out = std::mem::take(&mut self.dead);
        for k in done {
            if let Some(c) = self.conns.remove(&k) {
                out.push(c);
            }
        }
        out
    }

    /// Processes the TX queue; returns true when used buffers were added.
    pub fn process_tx(&mut self) -> bool {
        if !self.is_active() {
            return false;
        }
        let Some(mem) = self.mem.clone() else {
            return false;
        };
        let mut used = false;
        loop {
            let Some(q) = self.queues.get_mut(TXQ) else {
                return used;
            };
            let chain = match pop_chain(q, &mem) {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    self.mark_broken(format!("TX queue: {e}"));
                    return used;
                }
            };
            let parsed = collect_chain(&mem, chain)
                .map_err(PacketError::from)
                .and_then(|(head, descs)| read_tx_packet(&mem, &descs).map(|p| (head, p)));
            let (head, (hdr, payload)) = match parsed {
                Ok(v) => v,
                Err(e) => {
                    self.mark_broken(format!("TX queue: {e}"));
                    return used;
                }
            };
            if let Err(e) = q.add_used(&mem, head, 0) {
                self.mark_broken(format!("TX used ring: {e}"));
                return used;
            }
            used = true;
            self.stats.tx_packets += 1;
            self.handle_guest_packet(&hdr, &payload);
        }
        used
    }

    fn queue_orphan_rst(&mut self, hdr: &VsockHeader) {
        if self.orphan_replies.len() >= MAX_ORPHAN_REPLIES {
            self.stats.dropped += 1;
            return;
        }
        self.stats.orphan_rsts += 1;
        self.orphan_replies.push_back(VsockHeader {
            src_cid: HOST_CID,
            dst_cid: self.cid,
            src_port: hdr.dst_port,
            dst_port: hdr.src_port,
            len: 0,
            type_: TYPE_STREAM,
            op: Op::Rst as u16,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        });
    }

    /// Dispatches one guest packet (already bounds-checked).
    pub fn handle_guest_packet(&mut self, hdr: &VsockHeader, payload: &[u8]) {
        if hdr.src_cid != self.cid || hdr.dst_cid != HOST_CID {
            // Spoofed or misaddressed: nothing sensible to answer.
            log::debug!(
                "vsock: dropping packet {}→{} (guest cid {})",
                hdr.src_cid,
                hdr.dst_cid,
                self.cid
            );
            self.stats.dropped += 1;
            return;
        }
        let key = (hdr.dst_port, hdr.src_port);
        if hdr.type_ != TYPE_STREAM || hdr.op().is_none() {
            self.stats.dropped += 1;
            if let Some(c) = self.conns.get_mut(&key) {
                c.reset();
            } else if hdr.op != Op::Rst as u16 {
                self.queue_orphan_rst(hdr);
            }
            return;
        }
        match self.conns.get_mut(&key) {
            Some(c) => {
                if c.on_guest_packet(hdr, payload) == PacketOutcome::Established
                    && !self.ready_reported
                {
                    self.ready_reported = true;
                    if let Some(ev) = &self.events {
                        let _ = ev.send(VmEvent::GuestReady);
                    }
                }
            }
            None => {
                // Guest-initiated connections to the host are not offered; unknown
                // connections get an RST (never answer an RST).
                if hdr.op != Op::Rst as u16 {
                    self.queue_orphan_rst(hdr);
                }
            }
        }
    }

    fn has_rx_work(&self) -> bool {
        !self.orphan_replies.is_empty() || self.conns.values().any(Connection::has_rx_work)
    }

    fn next_rx_packet(&mut self, max_payload: usize) -> Option<(VsockHeader, Vec<u8>)> {
        if let Some(h) = self.orphan_replies.pop_front() {
            return Some((h, Vec::new()));
        }
        // Round robin over connections, starting after the last one served.
        let keys: Vec<ConnKey> = match self.rr_after {
            Some(after) => self
                .conns
                .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
                .chain(self.conns.range(..=after))
                .map(|(k, _)| *k)
                .collect(),
            None => self.conns.keys().copied().collect(),
        };
        for k in keys {
            if let Some(c) = self.conns.get_mut(&k) {
                if let Some(p) = c.next_packet(max_payload) {
                    self.rr_after = Some(k);
                    return Some(p);
                }
            }
        }
        None
    }

    /// Fills the RX queue with pending packets; returns true when used buffers were added.
    pub fn process_rx(&mut self) -> bool {
        if !self.is_active() {
            return false;
        }
        let Some(mem) = self.mem.clone() else {
            return false;
        };
        let mut used = false;
        while self.has_rx_work() {
            let Some(q) = self.queues.get_mut(RXQ) else {
                return used;
            };
            let chain = match pop_chain(q, &mem) {
                Ok(Some(c)) => c,
                Ok(None) => break, // no buffers: the guest notifies when it adds some
                Err(e) => {
                    self.mark_broken(format!("RX queue: {e}"));
                    return used;
                }
            };
            let (head, descs) = match collect_chain(&mem, chain) {
                Ok(v) => v,
                Err(e) => {
                    self.mark_broken(format!("RX queue: {e}"));
                    return used;
                }
            };
            let cap = match rx_capacity(&descs) {
                Ok(c) => c,
                Err(e) => {
                    self.mark_broken(format!("RX queue: {e}"));
                    return used;
                }
            };
            let Some((hdr, data)) = self.next_rx_packet(cap) else {
                // has_rx_work promised a packet; give the buffer back untouched.
                if let Some(q) = self.queues.get_mut(RXQ) {
                    virtio_queue::QueueOwnedT::go_to_previous_position(q);
                }
                break;
            };
            let written = match write_rx_packet(&mem, &descs, &hdr, &data) {
                Ok(n) => n,
                Err(e) => {
                    self.mark_broken(format!("RX queue: {e}"));
                    return used;
                }
            };
            let Some(q) = self.queues.get_mut(RXQ) else {
                return used;
            };
            if let Err(e) = q.add_used(&mem, head, written) {
                self.mark_broken(format!("RX used ring: {e}"));
                return used;
            }
            used = true;
            self.stats.rx_packets += 1;
        }
        used
    }

    /// Drains the TX queue (descriptor buffers of the event queue are left to the guest),
    /// fills RX and raises the interrupt when needed.
    pub fn process(&mut self) {
        let mut used = self.process_tx();
        used |= self.process_rx();
        if used && self.is_active() {
            if let Err(e) = self.irq.signal(INT_VRING) {
                log::warn!("vsock: cannot raise interrupt: {e}");
            }
        }
    }
}

/// Locks the backend, recovering from a poisoned lock (state stays consistent per call).
pub fn lock(b: &Mutex<VsockBackend>) -> MutexGuard<'_, VsockBackend> {
    b.lock().unwrap_or_else(|p| p.into_inner())
}

/// The virtio side of the vsock device, owned by the MMIO transport.
pub struct VsockDevice {
    backend: Arc<Mutex<VsockBackend>>,
    kick: Arc<EventFd>,
}

impl VsockDevice {
    /// A device around `backend`; `kick` wakes the muxer.
    pub fn new(backend: Arc<Mutex<VsockBackend>>, kick: Arc<EventFd>) -> Self {
        Self { backend, kick }
    }

    fn kick(&self) {
        if let Err(e) = self.kick.write(1) {
            log::warn!("vsock: cannot wake the muxer: {e}");
        }
    }
}

impl VirtioDevice for VsockDevice {
    fn name(&self) -> &'static str {
        "vsock"
    }

    fn device_type(&self) -> u32 {
        VSOCK_DEVICE_ID
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let cfg = lock(&self.backend).cid.to_le_bytes();
        read_config_bytes(&cfg, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        log::debug!("vsock: guest wrote read-only config space");
    }

    fn activate(
        &mut self,
        mem: GuestMem,
        queues: Vec<Queue>,
        _acked_features: u64,
    ) -> Result<(), ActivateError> {
        lock(&self.backend).activate(mem, queues)?;
        self.kick();
        Ok(())
    }

    fn queue_notify(&mut self, _index: u32) {
        self.kick();
    }

    fn reset(&mut self) {
        lock(&self.backend).reset();
        self.kick();
    }

    fn is_broken(&self) -> bool {
        lock(&self.backend).broken.is_some()
    }
}

/// Fuzzing entry point: runs the TX and RX paths over guest memory whose rings, descriptors
/// and buffers all come from `data`. Must never panic.
#[doc(hidden)]
pub fn fuzz_queues(data: &[u8]) {
    use vm_memory::{Bytes, GuestAddress};
    let Ok(mem) = crate::memory::create_guest_memory(0x1_0000) else {
        return;
    };
    let n = data.len().min(0x1_0000);
    if mem.write_slice(&data[..n], GuestAddress(0)).is_err() {
        return;
    }
    let Ok(evt) = EventFd::new(libc::EFD_NONBLOCK) else {
        return;
    };
    let irq = Arc::new(Interrupt::new(evt));
    let mut b = VsockBackend::new(3, irq, None);
    let mk = |desc: u64| -> Option<Queue> {
        let mut q = Queue::new(QUEUE_SIZE).ok()?;
        q.set_size(16);
        q.set_desc_table_address(Some(desc as u32), Some(0));
        q.set_avail_ring_address(Some((desc + 0x100) as u32), Some(0));
        q.set_used_ring_address(Some((desc + 0x200) as u32), Some(0));
        q.set_ready(true);
        Some(q)
    };
    let (Some(rx), Some(tx), Some(ev)) = (mk(0x0), mk(0x400), mk(0x800)) else {
        return;
    };
    if b.activate(mem, vec![rx, tx, ev]).is_err() {
        return;
    }
    let (host, _guest) = match UnixStream::pair() {
        Ok(p) => p,
        Err(_) => return,
    };
    let _ = host.set_nonblocking(true);
    b.connect_from_host(1234, host);
    b.process();
    b.process();
    let _ = b.reap(Instant::now());
}

#[cfg(test)]
mod tests;
