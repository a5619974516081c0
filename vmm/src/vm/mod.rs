//! Building one VM (KVM, memory, devices, boot or [`restore`]) and running it to an outcome,
//! taking [`snapshot`]s on request.

mod restore;
mod snapshot;

pub use snapshot::SnapshotReport;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::os::unix::thread::JoinHandleExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, Kvm, VcpuFd, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::boot;
use crate::bus::Bus;
use crate::config::{build_cmdline, ConfigError, MmioAnnouncement, VmConfig};
use crate::control::{ControlCommand, LineReader};
use crate::devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use crate::devices::serial::{
    ConsoleLog, ConsoleTail, SerialDevice, SERIAL_IRQ, SERIAL_PORT_BASE, SERIAL_PORT_LEN,
};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::Interrupt;
use crate::devices::vsock::muxer::Muxer;
use crate::devices::vsock::{VsockBackend, VsockDevice};
use crate::exit::{ExitCode, Outcome, VmEvent};
use crate::memory::{
    create_guest_memory, GuestMem, KVM_TSS_ADDRESS, VIRTIO_IRQ_BASE, VIRTIO_MMIO_BASE,
    VIRTIO_MMIO_SIZE,
};
use crate::persist::format::SnapshotKey;
use crate::persist::state::{snapshot_key, VirtioDeviceState};
use crate::persist::vcpu::VcpuCaps;
use crate::persist::PersistError;
use crate::status::StatusWriter;
use crate::vcpu::{configure_vcpu, kick_signal, VcpuCommand, VcpuRunner};

/// How long after "Kernel panic" on the console we wait for the guest's reset.
pub const PANIC_GRACE: Duration = Duration::from_secs(3);

/// Errors building a VM, classified by exit code.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// /dev/kvm missing, inaccessible or lacking a capability.
    #[error("KVM unavailable: {0}")]
    KvmUnavailable(String),
    /// Invalid configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Anything else while building the VM.
    #[error("VM setup failed: {0}")]
    Setup(String),
    /// The snapshot to restore was refused (unreadable, corrupt, mismatched, invalid state).
    #[error("snapshot refused: {0}")]
    Snapshot(String),
}

impl VmError {
    /// Exit code for this error.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            VmError::KvmUnavailable(_) => ExitCode::KvmUnavailable,
            VmError::Config(_) => ExitCode::Config,
            VmError::Setup(_) => ExitCode::Setup,
            VmError::Snapshot(_) => ExitCode::Snapshot,
        }
    }
}

fn setup<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> VmError {
    move |e| VmError::Setup(format!("{what}: {e}"))
}

/// Opens /dev/kvm and checks the capabilities the VMM relies on.
pub fn open_kvm() -> Result<Kvm, VmError> {
    let kvm =
        Kvm::new().map_err(|e| VmError::KvmUnavailable(format!("cannot open /dev/kvm: {e}")))?;
    if kvm.get_api_version() != 12 {
        return Err(VmError::KvmUnavailable(format!(
            "unsupported KVM API version {}",
            kvm.get_api_version()
        )));
    }
    for (cap, name) in [
        (Cap::Irqchip, "IRQCHIP"),
        (Cap::Pit2, "PIT2"),
        (Cap::Irqfd, "IRQFD"),
        (Cap::ImmediateExit, "IMMEDIATE_EXIT"),
        (Cap::UserMemory, "USER_MEMORY"),
        (Cap::SetTssAddr, "SET_TSS_ADDR"),
        (Cap::ExtCpuid, "EXT_CPUID"),
    ] {
        if !kvm.check_extension(cap) {
            return Err(VmError::KvmUnavailable(format!(
                "missing capability KVM_CAP_{name}"
            )));
        }
    }
    Ok(kvm)
}

/// Binds the per-VM vsock Unix socket (replacing a stale socket file, never another file).
pub fn bind_vsock_socket(path: &Path) -> Result<UnixListener, VmError> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if meta.file_type().is_socket() {
            fs::remove_file(path).map_err(setup("removing stale vsock socket"))?;
        } else {
            return Err(VmError::Setup(format!(
                "vsock socket path {} exists and is not a socket",
                path.display()
            )));
        }
    }
    let l = UnixListener::bind(path).map_err(setup("binding vsock socket"))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .map_err(setup("chmod vsock socket"))?;
    Ok(l)
}

/// A virtio-mmio slot as the snapshot code sees it: the transport and the device's backend.
pub(crate) struct VirtioSlot {
    transport: Arc<Mutex<MmioTransport>>,
    backend: VirtioBackend,
}

/// The state-holding part of a virtio device.
pub(crate) enum VirtioBackend {
    Vsock(Arc<Mutex<VsockBackend>>),
}

/// How long a restore took, for the `restored` status event.
#[derive(Debug, Clone, Copy)]
pub struct RestoreTimes {
    /// Reading and verifying the snapshot (checksums, key, state bounds).
    pub verify: Duration,
    /// Building the VM from it (memory mapping, devices, VM and vCPU state).
    pub restore: Duration,
}

/// A built VM whose threads are not started yet.
pub struct Vm {
    /// The kernel command line in use (empty for a restored VM).
    pub cmdline: String,
    /// Time spent building the VM.
    pub setup_time: Duration,
    /// Set when the VM was restored from a snapshot instead of booted.
    pub restored: Option<RestoreTimes>,
    kvm: Kvm,
    vm_fd: VmFd,
    mem: GuestMem,
    vcpus: Vec<VcpuFd>,
    pio: Arc<Bus>,
    mmio: Arc<Bus>,
    serial: Arc<Mutex<SerialDevice>>,
    console_tail: Arc<Mutex<ConsoleTail>>,
    console_fd: RawFd,
    virtio: Vec<VirtioSlot>,
    muxer: Option<Muxer>,
    events_tx: Sender<VmEvent>,
    events_rx: Receiver<VmEvent>,
    stop: Arc<AtomicBool>,
    key: SnapshotKey,
    caps: Arc<VcpuCaps>,
}

/// Host facts for snapshots; required when the config saves or restores snapshots.
fn probe_caps(kvm: &Kvm, cfg: &VmConfig) -> Result<VcpuCaps, VmError> {
    match VcpuCaps::probe(kvm) {
        Ok(c) => Ok(c),
        Err(e) if cfg.restore.is_some() => Err(VmError::Snapshot(format!(
            "this host cannot restore snapshots: {e}"
        ))),
        Err(e) if cfg.snapshot_control => Err(VmError::Setup(format!(
            "this host cannot take snapshots: {e}"
        ))),
        Err(e) => {
            log::debug!("snapshots unavailable on this host: {e}");
            Ok(VcpuCaps {
                msr_indices: Vec::new(),
                xcrs: false,
            })
        }
    }
}

impl Vm {
    /// Builds everything up to (not including) the first KVM_RUN: boots `cfg.kernel`, or,
    /// with `cfg.restore`, loads, verifies and validates that snapshot first (refusing it
    /// with [`VmError::Snapshot`] before anything is created) and restores from it.
    pub fn build(cfg: &VmConfig) -> Result<Vm, VmError> {
        let t0 = Instant::now();
        cfg.validate()?;
        let kvm = open_kvm()?;
        let caps = probe_caps(&kvm, cfg)?;
        let t_load = Instant::now();
        let snap = match &cfg.restore {
            Some(dir) => Some(restore::load(cfg, dir, &caps)?),
            None => None,
        };
        let verify = t_load.elapsed();
        let vm_fd = kvm
            .create_vm()
            .map_err(|e| VmError::KvmUnavailable(format!("KVM_CREATE_VM: {e}")))?;
        vm_fd
            .set_tss_address(KVM_TSS_ADDRESS)
            .map_err(setup("KVM_SET_TSS_ADDR"))?;
        vm_fd
            .create_irq_chip()
            .map_err(setup("KVM_CREATE_IRQCHIP"))?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        vm_fd.create_pit2(pit).map_err(setup("KVM_CREATE_PIT2"))?;

        let size = u64::from(cfg.memory_mb) << 20;
        let mem = match &snap {
            Some(s) => restore::map_memory(s, size)?,
            None => create_guest_memory(size).map_err(setup("guest memory"))?,
        };
        for (slot, region) in mem.iter().enumerate() {
            let r = kvm_userspace_memory_region {
                slot: slot as u32,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
                flags: 0,
            };
            // SAFETY: the region is a live mmap owned by `mem`, which the Vm keeps alive for
            // as long as the VM fd (both are dropped together, after all vCPU threads stop or
            // the process exits); the range does not overlap another slot.
            unsafe { vm_fd.set_user_memory_region(r) }
                .map_err(setup("KVM_SET_USER_MEMORY_REGION"))?;
        }

        let (events_tx, events_rx) = channel();
        let mut pio = Bus::new();
        let mut mmio = Bus::new();
        let snap_err = |e: PersistError| VmError::Snapshot(e.to_string());

        // Serial console.
        let console_file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&cfg.console_log)
            .map_err(|e| {
                VmError::Setup(format!("console log {}: {e}", cfg.console_log.display()))
            })?;
        let console_fd = console_file.as_raw_fd();
        let console = ConsoleLog::new(Some(console_file), Some(events_tx.clone()));
        let console_tail = console.tail();
        let serial_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(setup("eventfd"))?;
        vm_fd
            .register_irqfd(&serial_evt, SERIAL_IRQ)
            .map_err(setup("KVM_IRQFD (serial)"))?;
        let serial_dev = match &snap {
            Some(s) => SerialDevice::restore(&s.state.devices.serial, serial_evt, console)
                .map_err(snap_err)?,
            None => SerialDevice::new(serial_evt, console),
        };
        let serial = Arc::new(Mutex::new(serial_dev));
        pio.insert(serial.clone(), SERIAL_PORT_BASE, SERIAL_PORT_LEN)
            .map_err(setup("serial"))?;
        pio.insert(
            Arc::new(Mutex::new(I8042::new(events_tx.clone()))),
            I8042_BASE,
            I8042_LEN,
        )
        .map_err(setup("i8042"))?;

        // virtio devices (only vsock so far), in the order of `virtio_device_names`.
        let stop = Arc::new(AtomicBool::new(false));
        let mut announcements = Vec::new();
        let mut muxer = None;
        let mut virtio = Vec::new();
        if let Some(path) = &cfg.vsock_uds {
            let index = virtio.len();
            let saved = match &snap {
                Some(s) => Some(s.state.devices.virtio.get(index).ok_or_else(|| {
                    VmError::Snapshot(format!("no state for virtio device {index}"))
                })?),
                None => None,
            };
            let listener = bind_vsock_socket(path)?;
            let base = VIRTIO_MMIO_BASE + index as u64 * VIRTIO_MMIO_SIZE;
            let irq_num = VIRTIO_IRQ_BASE + index as u32;
            let irq_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(setup("eventfd"))?;
            vm_fd
                .register_irqfd(&irq_evt, irq_num)
                .map_err(setup("KVM_IRQFD (vsock)"))?;
            let irq = Arc::new(Interrupt::new(irq_evt));
            let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(setup("eventfd"))?);
            let (backend, transport) = match saved {
                Some(slot) => {
                    let VirtioDeviceState::Vsock(bs) = &slot.device;
                    // The host ends of saved connections are gone: they are reset.
                    let mut b = VsockBackend::restore(
                        bs,
                        mem.clone(),
                        irq.clone(),
                        Some(events_tx.clone()),
                        |_| None,
                    )
                    .map_err(snap_err)?;
                    b.rearm_guest_ready();
                    let backend = Arc::new(Mutex::new(b));
                    let dev = VsockDevice::new(backend.clone(), kick.clone());
                    let t =
                        MmioTransport::restore(Box::new(dev), mem.clone(), irq, &slot.transport)
                            .map_err(snap_err)?;
                    // Let the muxer look at the queues (and send the resets) at once.
                    kick.write(1).map_err(setup("eventfd"))?;
                    (backend, t)
                }
                None => {
                    let backend = Arc::new(Mutex::new(VsockBackend::new(
                        cfg.vsock_cid,
                        irq.clone(),
                        Some(events_tx.clone()),
                    )));
                    let dev = VsockDevice::new(backend.clone(), kick.clone());
                    (
                        backend.clone(),
                        MmioTransport::new(Box::new(dev), mem.clone(), irq),
                    )
                }
            };
            let transport = Arc::new(Mutex::new(transport));
            mmio.insert(transport.clone(), base, VIRTIO_MMIO_SIZE)
                .map_err(setup("virtio-mmio"))?;
            announcements.push(MmioAnnouncement { base, irq: irq_num });
            muxer = Some(
                Muxer::new(listener, kick, backend.clone(), stop.clone())
                    .map_err(setup("vsock muxer"))?,
            );
            virtio.push(VirtioSlot {
                transport,
                backend: VirtioBackend::Vsock(backend),
            });
        }

        // vCPUs.
        let mut vcpus = Vec::with_capacity(usize::from(cfg.vcpus));
        for i in 0..cfg.vcpus {
            vcpus.push(
                vm_fd
                    .create_vcpu(u64::from(i))
                    .map_err(setup("KVM_CREATE_VCPU"))?,
            );
        }
        let cmdline = match &snap {
            Some(s) => {
                restore::restore_cpu_state(&vm_fd, &vcpus, &s.state)?;
                String::new()
            }
            None => boot_kernel(&kvm, &mem, cfg, &vcpus, &announcements)?,
        };
        let setup_time = t0.elapsed();
        Ok(Vm {
            cmdline,
            setup_time,
            restored: snap.map(|_| RestoreTimes {
                verify,
                restore: t_load.elapsed().saturating_sub(verify),
            }),
            kvm,
            vm_fd,
            mem,
            vcpus,
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
            serial,
            console_tail,
            console_fd,
            virtio,
            muxer,
            events_tx,
            events_rx,
            stop,
            key: snapshot_key(cfg),
            caps: Arc::new(caps),
        })
    }

    /// Spawns the vCPU, muxer and (with `control`, the rest of the config fd) control
    /// threads; they block until [`Running::release`].
    pub fn spawn(self, control: Option<LineReader<File>>) -> Result<Running, VmError> {
        crate::vcpu::install_kick_handler().map_err(setup("signal handler"))?;
        let n_threads = self.vcpus.len()
            + usize::from(self.muxer.is_some())
            + usize::from(control.is_some())
            + 1;
        // Two rendezvous: every thread has finished its start-up syscalls (so TSYNC covers a
        // fully started thread), then the filter is installed, then the guest runs.
        let arrived = Arc::new(Barrier::new(n_threads));
        let start = Arc::new(Barrier::new(n_threads));
        let mut vcpu_threads = Vec::new();
        let mut vcpu_cmds = Vec::new();
        for (i, fd) in self.vcpus.into_iter().enumerate() {
            let (cmd_tx, cmd_rx) = channel();
            let runner = VcpuRunner {
                id: i as u8,
                fd,
                pio: self.pio.clone(),
                mmio: self.mmio.clone(),
                events: self.events_tx.clone(),
                stop: self.stop.clone(),
                commands: cmd_rx,
                caps: self.caps.clone(),
                mem: self.mem.clone(),
                xstate_reported: false,
            };
            let (a, b) = (arrived.clone(), start.clone());
            let h = std::thread::Builder::new()
                .name(format!("vcpu{i}"))
                .spawn(move || runner.run(a, b))
                .map_err(setup("spawning vCPU thread"))?;
            vcpu_threads.push(h);
            vcpu_cmds.push(cmd_tx);
        }
        let mut muxer_thread = None;
        if let Some(m) = self.muxer {
            let (a, b) = (arrived.clone(), start.clone());
            muxer_thread = Some(
                std::thread::Builder::new()
                    .name("vsock".into())
                    .spawn(move || {
                        a.wait();
                        b.wait();
                        m.run();
                    })
                    .map_err(setup("spawning vsock thread"))?,
            );
        }
        if let Some(reader) = control {
            let (a, b) = (arrived.clone(), start.clone());
            let events = self.events_tx.clone();
            std::thread::Builder::new()
                .name("control".into())
                .spawn(move || {
                    a.wait();
                    b.wait();
                    crate::control::run(reader, events);
                })
                .map_err(setup("spawning control thread"))?;
        }
        arrived.wait();
        Ok(Running {
            _kvm: self.kvm,
            vm_fd: self.vm_fd,
            mem: self.mem,
            events_rx: self.events_rx,
            serial: self.serial,
            console_tail: self.console_tail,
            console_fd: self.console_fd,
            virtio: self.virtio,
            stop: self.stop,
            vcpu_threads,
            vcpu_cmds,
            _muxer_thread: muxer_thread,
            start,
            key: self.key,
        })
    }
}

/// Boots `cfg.kernel`: loads kernel and initramfs, writes the command line, boot params, GDT
/// and page tables, and sets up every vCPU for 64-bit entry. Returns the command line.
fn boot_kernel(
    kvm: &Kvm,
    mem: &GuestMem,
    cfg: &VmConfig,
    vcpus: &[VcpuFd],
    announcements: &[MmioAnnouncement],
) -> Result<String, VmError> {
    let tsc_khz = if cfg.vcpus > 1 {
        vcpus.first().and_then(|v| v.get_tsc_khz().ok())
    } else {
        None
    };
    let cmdline = build_cmdline(cfg, tsc_khz, announcements)?;
    let kernel = boot::load_kernel(mem, &cfg.kernel).map_err(setup("kernel"))?;
    let initrd = match &cfg.initramfs {
        Some(p) => Some(boot::load_initramfs(mem, p, &kernel).map_err(setup("initramfs"))?),
        None => None,
    };
    boot::write_cmdline(mem, &cmdline).map_err(setup("cmdline"))?;
    boot::configure_system(mem, cmdline.len(), initrd, kernel.setup_header, cfg.vcpus)
        .map_err(setup("boot params"))?;
    boot::write_gdt_idt(mem).map_err(setup("GDT"))?;
    let cr3 = boot::paging::setup_identity_map(mem).map_err(setup("page tables"))?;
    let cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(setup("KVM_GET_SUPPORTED_CPUID"))?;
    for (i, v) in vcpus.iter().enumerate() {
        configure_vcpu(v, i as u8, cfg.vcpus, kernel.entry, cr3, &cpuid).map_err(setup("vCPU"))?;
    }
    Ok(cmdline)
}

/// A VM whose threads exist.
pub struct Running {
    _kvm: Kvm,
    vm_fd: VmFd,
    mem: GuestMem,
    events_rx: Receiver<VmEvent>,
    serial: Arc<Mutex<SerialDevice>>,
    console_tail: Arc<Mutex<ConsoleTail>>,
    console_fd: RawFd,
    virtio: Vec<VirtioSlot>,
    stop: Arc<AtomicBool>,
    vcpu_threads: Vec<JoinHandle<()>>,
    vcpu_cmds: Vec<Sender<VcpuCommand>>,
    _muxer_thread: Option<JoinHandle<()>>,
    start: Arc<Barrier>,
    key: SnapshotKey,
}

/// Deadlines for [`Running::wait_outcome`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Deadlines {
    /// Guest must accept a vsock connection within this time.
    pub boot: Option<Duration>,
    /// Whole-VM wall-clock limit.
    pub wall: Option<Duration>,
}

impl Running {
    /// Lets the vCPUs enter the guest (call after installing seccomp).
    pub fn release(&self) {
        self.start.wait();
    }

    /// The last console lines (secrets redacted).
    pub fn console_tail(&self) -> Vec<String> {
        self.console_tail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lines()
    }

    /// The console log's descriptor (the only one seccomp lets the VMM `pwrite` and
    /// `ftruncate`; it stays open for the VMM's lifetime).
    pub fn console_fd(&self) -> RawFd {
        self.console_fd
    }

    /// Flushes buffered console output to the log file.
    pub fn flush_console(&self) {
        self.serial
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .flush();
    }

    /// Asks the vCPUs to leave KVM_RUN (sets the stop flag and signals each thread).
    pub fn kick_all(&self) {
        self.stop.store(true, Ordering::Release);
        self.kick_vcpus();
    }

    /// Signals every vCPU thread out of KVM_RUN (it then looks at its stop flag and commands).
    fn kick_vcpus(&self) {
        for t in &self.vcpu_threads {
            // SAFETY: the pthread_t comes from a JoinHandle we still hold, so the thread has
            // not been joined/detached; the kick signal has a handler installed.
            unsafe {
                libc::pthread_kill(t.as_pthread_t(), kick_signal());
            }
        }
    }

    /// Waits for the VM's outcome, emitting progress events on `status`.
    pub fn wait_outcome(&self, deadlines: Deadlines, status: &StatusWriter) -> Outcome {
        let started = Instant::now();
        let mut ready = false;
        let mut panic_at: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let mut next: Vec<(Instant, Outcome)> = Vec::new();
            if let Some(w) = deadlines.wall {
                next.push((started + w, Outcome::WallLimit));
            }
            if let (Some(b), false) = (deadlines.boot, ready) {
                next.push((started + b, Outcome::BootTimeout));
            }
            if let Some(p) = panic_at {
                next.push((p + PANIC_GRACE, Outcome::KernelPanic));
            }
            next.sort_by_key(|(t, _)| *t);
            let ev = match next.first() {
                Some((t, o)) => {
                    if *t <= now {
                        return o.clone();
                    }
                    match self.events_rx.recv_timeout(*t - now) {
                        Ok(ev) => ev,
                        Err(RecvTimeoutError::Timeout) => return o.clone(),
                        Err(RecvTimeoutError::Disconnected) => {
                            return Outcome::Internal("event channel closed".into())
                        }
                    }
                }
                None => match self.events_rx.recv() {
                    Ok(ev) => ev,
                    Err(_) => return Outcome::Internal("event channel closed".into()),
                },
            };
            match ev {
                VmEvent::Stopped(o) => {
                    if panic_at.is_some()
                        && matches!(
                            o,
                            Outcome::GuestReset
                                | Outcome::TripleFault { .. }
                                | Outcome::GuestHalted
                        )
                    {
                        return Outcome::KernelPanic;
                    }
                    return o;
                }
                VmEvent::GuestReady => {
                    if !ready {
                        ready = true;
                        status.emit(&serde_json::json!({
                            "event": "guest_ready",
                            "ms": started.elapsed().as_millis() as u64,
                        }));
                    }
                }
                VmEvent::PanicSeen => {
                    panic_at.get_or_insert_with(Instant::now);
                    status.emit(&serde_json::json!({"event": "kernel_panic_seen"}));
                }
                VmEvent::DeviceBroken(dev, why) => {
                    status.emit(&serde_json::json!({
                        "event": "device_broken", "device": dev, "reason": why,
                    }));
                }
                VmEvent::Control(ControlCommand::Snapshot(cmd)) => {
                    let event = match self.snapshot(&cmd.dir) {
                        Ok(r) => serde_json::json!({
                            "event": "snapshot_saved",
                            "dir": cmd.dir,
                            "pause_us": r.pause.as_micros() as u64,
                            "vcpu_pause_us": r.vcpu_pause.as_micros() as u64,
                            "total_ms": r.total.as_millis() as u64,
                            "state_bytes": r.state_bytes,
                            "memory_bytes": r.memory_bytes,
                            "disk_bytes": r.disk_bytes,
                        }),
                        Err(e) => {
                            log::warn!("snapshot into {} failed: {e}", cmd.dir.display());
                            serde_json::json!({
                                "event": "snapshot_failed", "dir": cmd.dir, "detail": e,
                            })
                        }
                    };
                    status.emit(&event);
                }
                VmEvent::ControlRejected(why) => {
                    status.emit(&serde_json::json!({
                        "event": "control_rejected", "detail": why,
                    }));
                }
            }
        }
    }
}
