//! Building one VM and running it to an outcome, taking snapshots on request.
//!
//! A VM is built in one of two ways, each readable on its own: `builder` boots a kernel
//! with new devices; `restore` rebuilds a saved VM from a snapshot, each device from its
//! own `persist` state. Both share the KVM setup (`kvm`) and device attachment
//! (`devices`: bus layout, IRQs, the disks, then the network device, then vsock).
//! [`Vm::spawn`] then starts the threads (vCPUs, vsock muxer, net, control) and [`Running`]
//! installs seccomp, releases them and waits for the outcome.

mod builder;
mod devices;
mod kvm;
mod restore;
mod snapshot;

pub use kvm::open_kvm;
pub use snapshot::SnapshotReport;

use std::fs::{self, File};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::io::RawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::thread::JoinHandleExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_ioctls::{Kvm, VcpuFd, VmFd};

use self::devices::{DeviceSet, VirtioSlot};
use crate::config::{ConfigError, VmConfig};
use crate::control::{ControlCommand, LineReader};
use crate::devices::net::report::DenialReporter;
use crate::devices::serial::{ConsoleTail, SerialDevice};
use crate::exit::{ExitCode, Outcome, VmEvent};
use crate::memory::GuestMem;
use crate::persist::format::SnapshotKey;
use crate::persist::vcpu::VcpuCaps;
use crate::seccomp::{DiskFd, FilterKind, FilterParams, SeccompError, ShareAccess, ThreadSeccomp};
use crate::status::StatusWriter;
use crate::vcpu::{kick_signal, VcpuCommand, VcpuRunner};

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

/// Guest memory of a VM built from `cfg`, in bytes.
fn memory_size(cfg: &VmConfig) -> u64 {
    u64::from(cfg.memory_mb) << 20
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
    devices: DeviceSet,
    events_tx: Sender<VmEvent>,
    events_rx: Receiver<VmEvent>,
    key: SnapshotKey,
    caps: Arc<VcpuCaps>,
    /// What a restored VM's memory was mapped from (`None`: booted).
    origin: Option<snapshot::Origin>,
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
    /// Builds everything up to (not including) the first KVM_RUN: boots `cfg.kernel`
    /// (`builder`), or, with `cfg.restore`, loads, verifies and validates that snapshot
    /// first (refusing it with [`VmError::Snapshot`] before anything is created) and
    /// restores from it (`restore`).
    pub fn build(cfg: &VmConfig) -> Result<Vm, VmError> {
        let t0 = Instant::now();
        cfg.validate()?;
        let kvm = open_kvm()?;
        let caps = probe_caps(&kvm, cfg)?;
        match &cfg.restore {
            Some(dir) => restore::restore(cfg, dir, kvm, caps, t0),
            None => builder::boot(cfg, kvm, caps, t0),
        }
    }

    /// Spawns the vCPU, muxer, net and (with `control`, the rest of the config fd) control
    /// threads; they block until [`Running::release`]. The net thread reports its NAT's
    /// denials on `status`.
    pub fn spawn(
        self,
        control: Option<LineReader<File>>,
        status: &StatusWriter,
    ) -> Result<Running, VmError> {
        crate::vcpu::install_kick_handler().map_err(setup("signal handler"))?;
        let disk_fds = self.devices.disk_fds();
        let share_access = self.devices.share_access();
        let DeviceSet {
            pio,
            mmio,
            serial,
            console_tail,
            console_fd,
            virtio,
            muxer,
            net,
            stop,
        } = self.devices;
        let (pio, mmio) = (Arc::new(pio), Arc::new(mmio));
        let n_threads = self.vcpus.len()
            + usize::from(muxer.is_some())
            + usize::from(net.is_some())
            + usize::from(control.is_some())
            + 1;
        let seccomp = Arc::new(ThreadSeccomp::new());
        // A thread whose own filter cannot be stacked stops the VM instead of running.
        let narrow = |kind: FilterKind, name: &'static str, events: Sender<VmEvent>| {
            let seccomp = seccomp.clone();
            move || match seccomp.narrow(kind) {
                Ok(()) => true,
                Err(e) => {
                    let _ = events.send(VmEvent::Stopped(Outcome::Internal(format!(
                        "{name} thread: {e}"
                    ))));
                    false
                }
            }
        };
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
                pio: pio.clone(),
                mmio: mmio.clone(),
                events: self.events_tx.clone(),
                stop: stop.clone(),
                commands: cmd_rx,
                caps: self.caps.clone(),
                mem: self.mem.clone(),
                xstate_reported: false,
                seccomp: seccomp.clone(),
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
        if let Some(m) = muxer {
            let (a, b) = (arrived.clone(), start.clone());
            let narrowed = narrow(FilterKind::Base, "vsock", self.events_tx.clone());
            muxer_thread = Some(
                std::thread::Builder::new()
                    .name("vsock".into())
                    .spawn(move || {
                        a.wait();
                        b.wait();
                        if narrowed() {
                            m.run();
                        }
                    })
                    .map_err(setup("spawning vsock thread"))?,
            );
        }
        let mut net_thread = None;
        let mut net_report = None;
        if let Some(n) = net {
            let (a, b) = (arrived.clone(), start.clone());
            let narrowed = narrow(FilterKind::Net, "net", self.events_tx.clone());
            let reporter = Arc::new(DenialReporter::new(status.clone()));
            net_report = Some(reporter.clone());
            net_thread = Some(
                std::thread::Builder::new()
                    .name("net".into())
                    .spawn(move || {
                        crate::devices::net::thread::prepare_thread();
                        a.wait();
                        b.wait();
                        if narrowed() {
                            n.run(Some(reporter));
                        }
                    })
                    .map_err(setup("spawning net thread"))?,
            );
        }
        if let Some(reader) = control {
            let (a, b) = (arrived.clone(), start.clone());
            let events = self.events_tx.clone();
            let narrowed = narrow(FilterKind::Base, "control", self.events_tx.clone());
            std::thread::Builder::new()
                .name("control".into())
                .spawn(move || {
                    a.wait();
                    b.wait();
                    if narrowed() {
                        crate::control::run(reader, events);
                    }
                })
                .map_err(setup("spawning control thread"))?;
        }
        arrived.wait();
        Ok(Running {
            _kvm: self.kvm,
            vm_fd: self.vm_fd,
            mem: self.mem,
            events_rx: self.events_rx,
            serial,
            console_tail,
            console_fd,
            disk_fds,
            share_access,
            virtio,
            stop,
            vcpu_threads,
            vcpu_cmds,
            _muxer_thread: muxer_thread,
            _net_thread: net_thread,
            net_report,
            seccomp,
            start,
            key: self.key,
            origin: self.origin,
        })
    }
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
    disk_fds: Vec<DiskFd>,
    share_access: ShareAccess,
    virtio: Vec<VirtioSlot>,
    stop: Arc<AtomicBool>,
    vcpu_threads: Vec<JoinHandle<()>>,
    vcpu_cmds: Vec<Sender<VcpuCommand>>,
    _muxer_thread: Option<JoinHandle<()>>,
    _net_thread: Option<JoinHandle<()>>,
    net_report: Option<Arc<DenialReporter>>,
    seccomp: Arc<ThreadSeccomp>,
    start: Arc<Barrier>,
    key: SnapshotKey,
    origin: Option<snapshot::Origin>,
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
    /// Installs the seccomp filter on every thread (see [`crate::seccomp`]): built for this
    /// process with the console log and disk descriptors, the snapshot syscalls with
    /// `snapshot`, what bound shares need, and the net thread's own filter when the VM has a
    /// network device. Call before [`Running::release`].
    pub fn install_seccomp(&self, snapshot: bool) -> Result<(), SeccompError> {
        let params = FilterParams::for_this_process(snapshot, Some(self.console_fd))
            .with_disks(&self.disk_fds)
            .with_network(self.net_report.is_some())
            .with_shares(self.share_access);
        crate::seccomp::install(&params, &self.seccomp)
    }

    /// Lets the vCPUs enter the guest (call after installing seccomp).
    pub fn release(&self) {
        self.start.wait();
    }

    /// Emits the NAT's denial counts one last time if they changed since the last
    /// `net_denials` line, and no more after that (call before reporting the exit).
    pub fn close_net_report(&self) {
        if let Some(r) = &self.net_report {
            r.close();
        }
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

    /// The disks' descriptors (seccomp allows their I/O syscalls on them only).
    pub fn disk_fds(&self) -> &[DiskFd] {
        &self.disk_fds
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
                    let event = match self.snapshot(&cmd.dir, cmd.base.as_deref()) {
                        Ok(r) => serde_json::json!({
                            "event": "snapshot_saved",
                            "dir": cmd.dir,
                            "pause_us": r.pause.as_micros() as u64,
                            "vcpu_pause_us": r.vcpu_pause.as_micros() as u64,
                            "total_ms": r.total.as_millis() as u64,
                            "state_bytes": r.state_bytes,
                            "memory_bytes": r.memory_bytes,
                            "disk_bytes": r.disk_bytes,
                            "diff_pages": r.diff_pages,
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
