//! Device attachment, shared by cold boot ([`super::builder`]) and restore
//! ([`super::restore`]): the console log, the serial port and the i8042 reset port on the
//! port bus, and the virtio-mmio slots — the disks first (`/dev/vda`, `/dev/vdb`, … in
//! config order, so `/dev/vda` stays the system disk), then the network device (only with a
//! `network` config), then vsock, then the [`SHARE_SLOTS`] virtio-9p share slots (with
//! `share_slots`, bound or not) — each with its 4 KiB register window, its IRQ (an irqfd)
//! and its `virtio_mmio.device=` announcement. The two paths differ only in how each device is
//! made: new, or from its own `persist` state.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::EventFd;

use super::{setup, VmError};
use crate::bus::Bus;
use crate::config::{ConfigError, MmioAnnouncement, VmConfig, SHARE_SLOTS};
use crate::devices::block::disk::{Disk, DiskError};
use crate::devices::block::Block;
use crate::devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use crate::devices::net::thread::NetThread;
use crate::devices::net::NetBackend;
use crate::devices::p9::{Share, P9};
use crate::devices::serial::{
    ConsoleLog, ConsoleTail, SerialDevice, SERIAL_IRQ, SERIAL_PORT_BASE, SERIAL_PORT_LEN,
};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::Interrupt;
use crate::devices::vsock::muxer::Muxer;
use crate::devices::vsock::VsockBackend;
use crate::exit::VmEvent;
use crate::memory::{VIRTIO_IRQ_BASE, VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE};
use crate::seccomp::{DiskFd, ShareAccess};

/// A virtio-mmio slot as the snapshot code sees it: the transport and the device's state.
pub(crate) struct VirtioSlot {
    pub(super) transport: Arc<Mutex<MmioTransport>>,
    pub(super) backend: VirtioBackend,
}

/// The state-holding part of a virtio device.
pub(crate) enum VirtioBackend {
    /// A disk.
    Block(Arc<Mutex<Block>>),
    /// The network device.
    Net(Arc<Mutex<NetBackend>>),
    /// The vsock device.
    Vsock(Arc<Mutex<VsockBackend>>),
    /// A share slot.
    P9(Arc<Mutex<P9>>),
}

/// Opens and locks every configured disk, in order (before seccomp; the files stay open for
/// the VMM's lifetime). A file that cannot be a disk is a config error naming it; one that
/// cannot be opened or is locked by another VM is a setup error.
pub(super) fn open_disks(cfg: &VmConfig) -> Result<Vec<Disk>, VmError> {
    cfg.disks
        .iter()
        .map(|d| {
            Disk::open(d).map_err(|e: DiskError| {
                if e.is_config() {
                    VmError::Config(ConfigError::Disk(e.to_string()))
                } else {
                    VmError::Setup(e.to_string())
                }
            })
        })
        .collect()
}

/// Binds every share slot: slot `i` to `cfg.shares[i]`, the others unbound (before
/// seccomp: each bound share opens its descriptors here). With a share bound, the
/// descriptor limit is raised to its hard limit (every fid the guest holds is a
/// descriptor). A share that cannot be bound is a config error naming it.
pub(super) fn open_shares(cfg: &VmConfig) -> Result<Vec<Share>, VmError> {
    let slots = if cfg.share_slots { SHARE_SLOTS } else { 0 };
    let shares = (0..slots)
        .map(|i| match cfg.shares.get(i) {
            Some(s) => Share::open(s).map_err(|e| VmError::Config(ConfigError::Share(e))),
            None => Ok(Share::unbound()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !cfg.shares.is_empty() {
        crate::devices::p9::share::raise_nofile_limit();
    }
    Ok(shares)
}

/// The VM's own NAT, built in the VMM process before seccomp (it reads the host's
/// resolv.conf when no DNS upstream is configured).
pub(super) fn new_nat(cfg: &voidbox_net::NatConfig) -> Result<voidbox_net::Nat, VmError> {
    voidbox_net::Nat::new(cfg.clone()).map_err(|e| VmError::Setup(format!("network: {e}")))
}

/// The console log (created or truncated, mode 0600), before the UART that writes it.
pub(super) struct Console {
    log: ConsoleLog,
    tail: Arc<Mutex<ConsoleTail>>,
    fd: RawFd,
}

impl Console {
    /// Opens `cfg.console_log`; panics seen on the console are reported on `events`.
    pub(super) fn open(cfg: &VmConfig, events: &Sender<VmEvent>) -> Result<Console, VmError> {
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&cfg.console_log)
            .map_err(|e| {
                VmError::Setup(format!("console log {}: {e}", cfg.console_log.display()))
            })?;
        let fd = file.as_raw_fd();
        let log = ConsoleLog::new(Some(file), Some(events.clone()));
        let tail = log.tail();
        Ok(Console { log, tail, fd })
    }
}

/// A virtio slot's wiring: the interrupt line its device raises.
pub(super) struct SlotWiring {
    /// The interrupt line (InterruptStatus plus the registered irqfd).
    pub irq: Arc<Interrupt>,
    base: u64,
    gsi: u32,
}

/// Every device of a built VM.
pub(super) struct DeviceSet {
    pub pio: Bus,
    pub mmio: Bus,
    pub serial: Arc<Mutex<SerialDevice>>,
    pub console_tail: Arc<Mutex<ConsoleTail>>,
    pub console_fd: RawFd,
    pub virtio: Vec<VirtioSlot>,
    pub muxer: Option<Muxer>,
    /// The network device's thread body (it owns the NAT), with a network config.
    pub net: Option<NetThread>,
    /// Tells the muxer, the net thread (and the vCPUs) to stop.
    pub stop: Arc<AtomicBool>,
}

impl DeviceSet {
    /// The disks' descriptors, for the seccomp filter.
    pub fn disk_fds(&self) -> Vec<DiskFd> {
        self.virtio
            .iter()
            .filter_map(|s| match &s.backend {
                VirtioBackend::Block(b) => {
                    let b = crate::devices::block::lock(b);
                    Some(DiskFd {
                        fd: b.disk().fd(),
                        writable: !b.disk().read_only(),
                    })
                }
                VirtioBackend::Net(_) | VirtioBackend::Vsock(_) | VirtioBackend::P9(_) => None,
            })
            .collect()
    }

    /// What the bound shares need from the seccomp filter.
    pub fn share_access(&self) -> ShareAccess {
        let mut access = ShareAccess::default();
        for s in &self.virtio {
            if let VirtioBackend::P9(p) = &s.backend {
                let p = crate::devices::p9::lock(p);
                if p.share().is_bound() {
                    access.bound = true;
                    access.writable |= !p.share().read_only();
                }
            }
        }
        access
    }
}

/// The attached UART and its console log.
struct Serial {
    dev: Arc<Mutex<SerialDevice>>,
    tail: Arc<Mutex<ConsoleTail>>,
    fd: RawFd,
}

/// Attaches devices to one VM, in bus order.
pub(super) struct Attach<'a> {
    vm_fd: &'a VmFd,
    console: Option<Console>,
    pio: Bus,
    mmio: Bus,
    serial: Option<Serial>,
    virtio: Vec<VirtioSlot>,
    announcements: Vec<MmioAnnouncement>,
    muxer: Option<Muxer>,
    net: Option<NetThread>,
    stop: Arc<AtomicBool>,
}

impl<'a> Attach<'a> {
    /// Starts with empty buses; `console` goes to the serial port.
    pub(super) fn new(vm_fd: &'a VmFd, console: Console) -> Self {
        Self {
            vm_fd,
            console: Some(console),
            pio: Bus::new(),
            mmio: Bus::new(),
            serial: None,
            virtio: Vec::new(),
            announcements: Vec::new(),
            muxer: None,
            net: None,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The virtio devices announced so far.
    pub(super) fn announcements(&self) -> &[MmioAnnouncement] {
        &self.announcements
    }

    /// Attaches the UART that `make` builds from its irqfd (IRQ 4) and the console log, and
    /// the i8042 reset port (which reports a guest reset on `events`).
    pub(super) fn attach_legacy(
        &mut self,
        events: &Sender<VmEvent>,
        make: impl FnOnce(EventFd, ConsoleLog) -> Result<SerialDevice, VmError>,
    ) -> Result<(), VmError> {
        let console = self
            .console
            .take()
            .ok_or_else(|| VmError::Setup("serial port attached twice".into()))?;
        let evt = EventFd::new(libc::EFD_NONBLOCK).map_err(setup("eventfd"))?;
        self.vm_fd
            .register_irqfd(&evt, SERIAL_IRQ)
            .map_err(setup("KVM_IRQFD (serial)"))?;
        let serial = Arc::new(Mutex::new(make(evt, console.log)?));
        self.pio
            .insert(serial.clone(), SERIAL_PORT_BASE, SERIAL_PORT_LEN)
            .map_err(setup("serial"))?;
        self.pio
            .insert(
                Arc::new(Mutex::new(I8042::new(events.clone()))),
                I8042_BASE,
                I8042_LEN,
            )
            .map_err(setup("i8042"))?;
        self.serial = Some(Serial {
            dev: serial,
            tail: console.tail,
            fd: console.fd,
        });
        Ok(())
    }

    /// The next virtio slot: its interrupt line, with the irqfd registered for its IRQ.
    pub(super) fn next_virtio_slot(&mut self, device: &str) -> Result<SlotWiring, VmError> {
        let index = self.virtio.len();
        let base = VIRTIO_MMIO_BASE + index as u64 * VIRTIO_MMIO_SIZE;
        let gsi = VIRTIO_IRQ_BASE + index as u32;
        let evt = EventFd::new(libc::EFD_NONBLOCK).map_err(setup("eventfd"))?;
        self.vm_fd
            .register_irqfd(&evt, gsi)
            .map_err(|e| VmError::Setup(format!("KVM_IRQFD ({device}): {e}")))?;
        Ok(SlotWiring {
            irq: Arc::new(Interrupt::new(evt)),
            base,
            gsi,
        })
    }

    /// Puts `transport` on the MMIO bus at `slot` and announces it.
    pub(super) fn attach_virtio(
        &mut self,
        slot: SlotWiring,
        transport: MmioTransport,
        backend: VirtioBackend,
    ) -> Result<(), VmError> {
        let transport = Arc::new(Mutex::new(transport));
        self.mmio
            .insert(transport.clone(), slot.base, VIRTIO_MMIO_SIZE)
            .map_err(setup("virtio-mmio"))?;
        self.announcements.push(MmioAnnouncement {
            base: slot.base,
            irq: slot.gsi,
        });
        self.virtio.push(VirtioSlot { transport, backend });
        Ok(())
    }

    /// Attaches the vsock device's transport and starts its muxer (not yet its thread) on
    /// `listener`, woken by `kick`.
    pub(super) fn attach_vsock(
        &mut self,
        slot: SlotWiring,
        transport: MmioTransport,
        backend: Arc<Mutex<VsockBackend>>,
        listener: UnixListener,
        kick: Arc<EventFd>,
    ) -> Result<(), VmError> {
        self.attach_virtio(slot, transport, VirtioBackend::Vsock(backend.clone()))?;
        self.muxer = Some(
            Muxer::new(listener, kick, backend, self.stop.clone()).map_err(setup("vsock muxer"))?,
        );
        Ok(())
    }

    /// The flag that stops the device threads (a net thread is built around it).
    pub(super) fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Attaches the network device's transport and keeps its thread body (not yet a thread),
    /// which owns the NAT.
    pub(super) fn attach_net(
        &mut self,
        slot: SlotWiring,
        transport: MmioTransport,
        backend: Arc<Mutex<NetBackend>>,
        thread: NetThread,
    ) -> Result<(), VmError> {
        self.attach_virtio(slot, transport, VirtioBackend::Net(backend))?;
        self.net = Some(thread);
        Ok(())
    }

    /// Every device attached.
    pub(super) fn finish(self) -> Result<DeviceSet, VmError> {
        let serial = self
            .serial
            .ok_or_else(|| VmError::Setup("no serial port attached".into()))?;
        Ok(DeviceSet {
            pio: self.pio,
            mmio: self.mmio,
            serial: serial.dev,
            console_tail: serial.tail,
            console_fd: serial.fd,
            virtio: self.virtio,
            muxer: self.muxer,
            net: self.net,
            stop: self.stop,
        })
    }
}
