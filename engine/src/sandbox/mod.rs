//! Drives one micro-VM: a VMM child process plus the authenticated guest-agent connection.
//!
//! [`Sandbox::start`] spawns the VMM ([`vmm_process`]) with a per-VM temp dir (vsock socket,
//! console log) to cold-boot a guest (a fresh 32-byte session secret on its command line) or
//! to restore one from a snapshot ([`RestoreFrom`]). A cold boot waits for the guest agent
//! within a deadline (retrying `CONNECT`, watching the VMM's status), authenticates
//! ([`guest`]) and re-keys: a new secret, a guest RNG reseed and the host's clock, then the
//! policy under the new secret. A restore hands all of that to the VMM instead, which writes
//! it onto the guest's restore page before the guest resumes
//! ([`voidbox_protocol::restore_page`]); `start` then waits for the VMM alone and returns
//! with the connection open and its handshake sent, so the first request is the guest's
//! first exchange ([`GuestConn::resume`]). Then [`Sandbox::exec`], [`Sandbox::write_file`],
//! [`Sandbox::read_file`]; [`Sandbox::stop`] asks the guest to shut down and kills the VMM
//! after a grace period. Host directories in [`SandboxConfig::shares`] are bound to the VM's
//! share slots and mounted in the guest before `start` returns ([`shares`]). Dropping a
//! `Sandbox` kills and reaps the VMM and removes its temp dir (the console log too, unless it was placed elsewhere with `keep_console`).
//!
//! The API is blocking; async callers run it on a blocking thread. The VMM is always
//! forked from one long-lived thread, so its parent-death signal is tied to this process.

pub mod boot;
pub mod diagnose;
pub mod disks;
pub mod error;
pub mod guest;
pub mod image;
pub mod kvm_access;
pub mod rundir;
pub mod shares;
pub mod status;
pub mod vmm_process;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use voidbox_protocol::restore_page::RestoreGrant;
use voidbox_protocol::{
    ExecRequest, ExecResponse, GuestInfo, GuestPolicy, OutputStream, SessionSecret,
};
use voidbox_vmm::config::{VmConfig, BASE_CMDLINE, COMPAT_CMDLINE};

pub use error::{SandboxError, VmmExit};
pub use guest::GuestConn;
pub use image::{GuestImage, ImageSource};
pub use vmm_process::{VmmLauncher, VmmProcess, VMM_SUBCOMMAND};

/// The VMM's exit code for a refused snapshot (corrupt, mismatched, unreadable).
pub const SNAPSHOT_REFUSED_EXIT: i32 = 5;

use crate::image::Profile;
use status::VmmEvent;

/// Settings of one VM.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Kernel + system disk.
    pub image: GuestImage,
    /// Guest memory in MiB.
    pub memory_mb: u32,
    /// vCPUs.
    pub vcpus: u8,
    /// How the VMM process is started.
    pub launcher: VmmLauncher,
    /// Deadline from VMM spawn to an authenticated agent.
    pub boot_timeout: Duration,
    /// Hard limit on the VM's lifetime (enforced by the VMM).
    pub wall_limit: Option<Duration>,
    /// Keep the console log at this path instead of deleting it with the VM.
    pub keep_console: Option<PathBuf>,
    /// Parent of the per-VM temp dirs (default: the system temp dir).
    pub runtime_dir: Option<PathBuf>,
    /// NetworkPolicy sent with the handshake (can only narrow the boot policy).
    pub policy: Option<GuestPolicy>,
    /// Extra kernel parameters (tests, debugging).
    pub extra_cmdline: Vec<String>,
    /// Image disks after the system disk (`sandbox.image`, OCI skills) and the user
    /// commands run as.
    pub disks: disks::VmDisks,
    /// The network device and its NAT (policy, DNS upstreams); `None`: no network device.
    /// The guest gets [`crate::network::boot_param`] on its command line, and the device set
    /// is part of the snapshot identity ([`image_key`]); the policy is not.
    pub network: Option<voidbox_net::NatConfig>,
    /// Wait this long for a graceful shutdown before killing the VMM.
    pub stop_grace: Duration,
    /// Restore this snapshot instead of booting the kernel.
    pub restore: Option<RestoreFrom>,
    /// Start the VMM with a control channel so [`Sandbox::snapshot_to`] works. Only golden
    /// snapshot creators set it: their VMM's seccomp filter also allows file writes.
    pub snapshot_control: bool,
    /// Test hook: the VMM issues a syscall outside its seccomp filter.
    #[doc(hidden)]
    pub test_forbidden_syscall: bool,
    /// Host directories the guest sees (at most [`shares::MAX_SHARES`]), mounted before
    /// [`Sandbox::start`] returns. Not part of the snapshot identity: a VM restored from a
    /// golden snapshot gets its own.
    pub shares: Vec<shares::Share>,
    /// Give the VM the virtio-9p share slots even without `shares`: the creator of a golden
    /// snapshot that VMs with shares restore from. (A VM with shares always has them; one
    /// without boots with no 9p devices to probe.)
    pub share_slots: bool,
}

impl SandboxConfig {
    /// Defaults for `image`: [`crate::limits::DEFAULT_RUN_MEMORY_MB`] (256 MiB, as `voidbox
    /// run` and `voidbox snapshot create`), 1 vCPU, 300 s boot deadline, 2 s stop grace.
    pub fn new(image: GuestImage) -> SandboxConfig {
        SandboxConfig {
            image,
            memory_mb: crate::limits::DEFAULT_RUN_MEMORY_MB,
            vcpus: 1,
            launcher: VmmLauncher::default(),
            boot_timeout: Duration::from_secs(300),
            wall_limit: None,
            keep_console: None,
            runtime_dir: None,
            policy: None,
            extra_cmdline: Vec::new(),
            disks: disks::VmDisks::default(),
            network: None,
            stop_grace: Duration::from_secs(2),
            restore: None,
            snapshot_control: false,
            test_forbidden_syscall: false,
            shares: Vec::new(),
            share_slots: false,
        }
    }

    /// Whether the VM gets the share slots: it has shares, or its snapshot's VMs will.
    pub fn needs_share_slots(&self) -> bool {
        self.share_slots || !self.shares.is_empty()
    }

    /// Sets the host shares, and asks for a writable guest root when one of them goes where
    /// the read-only system disk cannot take a mount point (outside `/workspace` and
    /// `/home`; [`disks::VmDisks::writable_root`]). Call after `disks`: that flag is part of
    /// the disks' snapshot identity.
    pub fn set_shares(&mut self, shares: Vec<shares::Share>) {
        self.disks.writable_root = shares
            .iter()
            .any(|s| voidbox_protocol::guest_paths::needs_writable_root(&s.guest));
        self.shares = shares;
    }
}

/// A snapshot to restore a VM from, with the session secret of the VM it was taken of
/// (used once, to authenticate the re-key right after the restore).
#[derive(Debug, Clone)]
pub struct RestoreFrom {
    /// Directory with `state.snap` and `memory.bin`.
    pub dir: PathBuf,
    /// The snapshotted guest's session secret. A restore never uses it (the restored guest
    /// gets a new one on its restore page and refuses this one); it is kept with the
    /// snapshot so that refusal can be checked.
    pub secret: SessionSecret,
    /// For a layered (diff) snapshot: the directory of the base snapshot whose memory the
    /// diff overlays (`None`: `dir` holds the whole memory).
    pub base: Option<PathBuf>,
}

/// What a snapshot written by [`Sandbox::snapshot_to`] cost.
#[derive(Debug, Clone, Default)]
pub struct SnapshotStats {
    /// vCPUs paused.
    pub pause: Duration,
    /// Request to files written, as the VMM measured it.
    pub vmm_total: Duration,
    /// Request to confirmation, measured here.
    pub total: Duration,
    /// State blob size.
    pub state_bytes: u64,
    /// Guest memory size.
    pub memory_bytes: u64,
    /// Bytes allocated on disk.
    pub disk_bytes: u64,
    /// For a layered snapshot ([`Sandbox::snapshot_diff_to`]): the pages in its memory diff
    /// (`None`: a full snapshot).
    pub diff_pages: Option<u64>,
}

/// Identity of what a VM boots (image, its system disk, its command line, extra
/// parameters, image disks, whether it has a network device and the guest's network boot
/// parameter) for snapshot keys: the VMM refuses a snapshot taken of anything else. The
/// network policy is not part of it (a restored VMM builds its NAT from its own config).
pub fn image_key(
    image: &GuestImage,
    extra_cmdline: &[String],
    disks: &disks::VmDisks,
    network: bool,
) -> String {
    let base = crate::image::manifest::content_hash(&(
        &image.hash,
        &image.system_disk_sha256,
        image.profile.as_str(),
        &image.cmdline,
        extra_cmdline,
    ));
    // Keys of VMs without image disks or network stay what they were.
    let with_disks = if disks.is_empty() {
        base
    } else {
        crate::image::manifest::content_hash(&(base, disks.key_parts()))
    };
    if !network {
        return with_disks;
    }
    crate::image::manifest::content_hash(&(
        with_disks,
        voidbox_vmm::devices::net::SNAPSHOT_KEY,
        crate::network::boot_param(),
    ))
}

/// Where the time of a cold start went (all measured on the host).
#[derive(Debug, Clone, Default)]
pub struct BootTimings {
    /// `fork`/`exec` of the VMM until it reported `started` (config read).
    pub vmm_spawn: Duration,
    /// KVM, memory, devices, kernel load and boot params (the VMM's `configured.setup_us`).
    pub vm_setup: Duration,
    /// Spawn until the vCPUs were released (`booting`).
    pub to_booting: Duration,
    /// vCPUs released until the guest agent accepted a vsock connection.
    pub kernel_to_agent: Duration,
    /// Authentication round trip.
    pub handshake: Duration,
    /// Spawn until authenticated.
    pub total: Duration,
    /// The VM was restored from a snapshot: the VMM's restore time (else zero).
    pub restore: Option<Duration>,
    /// Re-key (new secret, RNG reseed, clock) plus the policy handshake.
    pub rekey: Duration,
}

/// A running micro-VM with an authenticated agent connection.
pub struct Sandbox {
    // Field order is drop order: connection, then VMM (killed, reaped), then temp dir.
    conn: GuestConn,
    vmm: VmmProcess,
    dir: tempfile::TempDir,
    secret: SessionSecret,
    vsock_path: PathBuf,
    console_log: PathBuf,
    timings: BootTimings,
    stop_grace: Duration,
    policy: Option<GuestPolicy>,
    restored_from: Option<PathBuf>,
}

/// A VMM just spawned, with what the [`Sandbox`] keeps of it.
struct Spawned {
    vmm: VmmProcess,
    dir: tempfile::TempDir,
    vsock_path: PathBuf,
    console_log: PathBuf,
}

/// Why a VMM exited before its guest was reachable.
fn start_failed(vmm: &mut VmmProcess) -> SandboxError {
    let exit = vmm.exit_report();
    if exit.code == Some(3) {
        return SandboxError::Environment(format!(
            "KVM is unusable: {}",
            exit.detail.clone().unwrap_or_else(|| exit.status_text())
        ));
    }
    if exit.code == Some(SNAPSHOT_REFUSED_EXIT) {
        return SandboxError::SnapshotRefused(
            exit.detail.clone().unwrap_or_else(|| exit.status_text()),
        );
    }
    SandboxError::BootFailed(Box::new(exit))
}

/// A restore grant: a fresh secret, host entropy and `policy` (refused when the policy does
/// not fit the restore page, before any VMM starts).
fn restore_grant(policy: Option<GuestPolicy>) -> Result<RestoreGrant, SandboxError> {
    let secret = SessionSecret::random().map_err(SandboxError::io("session secret"))?;
    RestoreGrant::new(secret, guest::host_entropy()?, policy)
        .map_err(|e| SandboxError::Environment(format!("cannot restore this VM: {e}")))
}

/// Checks that `/dev/kvm` can be opened read-write; the error carries the same finding and
/// fix as `voidbox doctor`'s `kvm` check ([`kvm_access::access`]).
pub fn check_kvm() -> Result<(), SandboxError> {
    kvm_access::access().map_err(|p| SandboxError::Environment(p.to_string()))
}

/// Kernel parameters for the VMM's `cmdline_extra`: the image's own flags the VMM does not
/// add itself, `extra`, and the session secret.
fn cmdline_extra(image: &GuestImage, compat: bool, extra: &[String], secret: &str) -> String {
    let generated: Vec<&str> = BASE_CMDLINE
        .split_whitespace()
        .chain(if compat { COMPAT_CMDLINE } else { "" }.split_whitespace())
        .collect();
    let mut out: Vec<String> = image
        .cmdline
        .split_whitespace()
        .filter(|t| !generated.contains(t))
        .map(str::to_string)
        .collect();
    out.extend(extra.iter().cloned());
    out.push(format!("voidbox.secret={secret}"));
    out.join(" ")
}

impl Sandbox {
    /// Boots a fresh VM and authenticates to its agent.
    pub fn start(cfg: &SandboxConfig) -> Result<Sandbox, SandboxError> {
        shares::check(&cfg.shares, cfg.snapshot_control)?;
        check_kvm()?;
        let parent = cfg.runtime_dir.clone().unwrap_or_else(std::env::temp_dir);
        let dir = tempfile::Builder::new()
            .prefix("voidbox-vm-")
            .tempdir_in(&parent)
            .map_err(SandboxError::io(format!(
                "creating a VM directory in {}",
                parent.display()
            )))?;
        let vsock_path = dir.path().join("vsock.sock");
        let console_log = cfg
            .keep_console
            .clone()
            .unwrap_or_else(|| dir.path().join("console.log"));
        // A cold boot gets a fresh secret on its command line (rotated right after the
        // handshake); a restored VM gets a new one, with host entropy, the clock and its
        // policy, on its restore page before it resumes (its command line is not used).
        let boot_secret = SessionSecret::random().map_err(SandboxError::io("session secret"))?;
        let grant = match &cfg.restore {
            Some(_) => Some(restore_grant(cfg.policy.clone())?),
            None => None,
        };
        let compat = cfg.image.profile == Profile::Compat;
        let mut guest_params = cfg.extra_cmdline.clone();
        guest_params.extend(cfg.disks.boot_params());
        if cfg.network.is_some() {
            guest_params.push(crate::network::boot_param());
        }
        let config = VmConfig {
            kernel: cfg.image.vmlinux.clone(),
            initramfs: cfg.image.initramfs.clone(),
            cmdline_extra: cmdline_extra(&cfg.image, compat, &guest_params, &boot_secret.to_hex()),
            image_hash: image_key(
                &cfg.image,
                &cfg.extra_cmdline,
                &cfg.disks,
                cfg.network.is_some(),
            ),
            snapshot_control: cfg.snapshot_control,
            restore: cfg.restore.as_ref().map(|r| r.dir.clone()),
            restore_base: cfg.restore.as_ref().and_then(|r| r.base.clone()),
            restore_grant: grant.clone(),
            memory_mb: cfg.memory_mb,
            vcpus: cfg.vcpus,
            vsock_uds: Some(vsock_path.clone()),
            vsock_cid: 3,
            console_log: console_log.clone(),
            compat,
            // Ours fires first (with the console tail); the VMM's is the backstop.
            boot_timeout_ms: Some((cfg.boot_timeout + Duration::from_secs(5)).as_millis() as u64),
            wall_limit_ms: cfg.wall_limit.map(|d| d.as_millis() as u64),
            test_forbidden_syscall: cfg.test_forbidden_syscall,
            disks: cfg.disks.vm_disks(&cfg.image.system_disk),
            network: cfg.network.clone(),
            shares: shares::vm_shares(&cfg.shares, cfg.disks.user),
            share_slots: cfg.needs_share_slots(),
        };
        let mut vmm = VmmProcess::spawn(&cfg.launcher, &config)?;
        let t0 = vmm.spawned_at();
        let deadline = t0 + cfg.boot_timeout;
        if let Some(grant) = grant {
            let vm = Spawned {
                vmm,
                dir,
                vsock_path,
                console_log,
            };
            return Sandbox::resume(cfg, vm, grant, deadline);
        }
        let stream = loop {
            if vmm.try_wait().is_some() {
                return Err(start_failed(&mut vmm));
            }
            if Instant::now() >= deadline {
                vmm.kill();
                let exit = vmm.exit_report();
                return Err(SandboxError::BootTimeout {
                    after: cfg.boot_timeout,
                    tail: error::ConsoleTail(exit.console_tail),
                });
            }
            if let Some(s) =
                guest::try_connect(&vsock_path, guest::AGENT_PORT, Duration::from_secs(2))?
            {
                break s;
            }
            std::thread::sleep(Duration::from_millis(25));
        };
        let connected = Instant::now();
        let hs_timeout = deadline
            .saturating_duration_since(connected)
            .max(Duration::from_secs(5));
        // The boot secret authenticates this first handshake only; the policy comes with
        // the second one, under the rotated secret.
        let (conn, _pong) = match GuestConn::handshake(stream, &boot_secret, None, hs_timeout) {
            Ok(x) => x,
            Err(e) => {
                if vmm.wait_timeout(Duration::from_millis(200)).is_some() {
                    return Err(SandboxError::BootFailed(Box::new(vmm.exit_report())));
                }
                return Err(e);
            }
        };
        let done = Instant::now();
        let mut timings = boot_timings(&vmm, t0, connected, done);
        let vm = Spawned {
            vmm,
            dir,
            vsock_path,
            console_log,
        };
        let mut sb = Sandbox::assemble(cfg, vm, conn, boot_secret);
        // Golden creators stay on the boot secret until the snapshot is written.
        if !cfg.snapshot_control {
            let t = Instant::now();
            sb.rekey()?;
            timings.rekey = t.elapsed();
            for (slot, s) in cfg.shares.iter().enumerate() {
                sb.mount_share(slot as u8, &s.guest, s.read_only)?;
            }
            timings.total = sb.vmm.spawned_at().elapsed();
        }
        sb.timings = timings;
        Ok(sb)
    }

    /// A sandbox of `cfg` around a started VM and its guest connection.
    fn assemble(
        cfg: &SandboxConfig,
        vm: Spawned,
        conn: GuestConn,
        secret: SessionSecret,
    ) -> Sandbox {
        Sandbox {
            conn,
            vmm: vm.vmm,
            dir: vm.dir,
            secret,
            vsock_path: vm.vsock_path,
            console_log: vm.console_log,
            timings: BootTimings::default(),
            stop_grace: cfg.stop_grace,
            policy: cfg.policy.clone(),
            restored_from: cfg.restore.as_ref().map(|r| r.dir.clone()),
        }
    }

    /// Resumes a VM the VMM is restoring: waits for the VMM alone (its restore, and the
    /// restore page filled with `grant`), then opens the guest connection with the node's
    /// first request pipelined behind its handshake ([`GuestConn::resume`]). No guest round
    /// trip comes before this returns; shares are mounted as the first requests.
    fn resume(
        cfg: &SandboxConfig,
        mut vm: Spawned,
        grant: RestoreGrant,
        deadline: Instant,
    ) -> Result<Sandbox, SandboxError> {
        let t0 = vm.vmm.spawned_at();
        let released =
            vm.vmm
                .status()
                .wait_for(
                    0,
                    deadline.saturating_duration_since(Instant::now()),
                    |e| match e {
                        VmmEvent::Booting { .. } => Some(()),
                        _ => None,
                    },
                );
        if released.is_none() {
            if vm.vmm.wait_timeout(Duration::from_millis(200)).is_some() {
                return Err(start_failed(&mut vm.vmm));
            }
            vm.vmm.kill();
            let exit = vm.vmm.exit_report();
            return Err(SandboxError::BootTimeout {
                after: cfg.boot_timeout,
                tail: error::ConsoleTail(exit.console_tail),
            });
        }
        let settle = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(5));
        let conn = match GuestConn::resume(&vm.vsock_path, guest::AGENT_PORT, &grant.secret, settle)
        {
            Ok(c) => c,
            Err(e) => {
                if vm.vmm.wait_timeout(Duration::from_millis(200)).is_some() {
                    return Err(start_failed(&mut vm.vmm));
                }
                return Err(e);
            }
        };
        let ready = Instant::now();
        let mut timings = boot_timings(&vm.vmm, t0, ready, ready);
        let mut sb = Sandbox::assemble(cfg, vm, conn, grant.secret.clone());
        for (slot, s) in cfg.shares.iter().enumerate() {
            sb.mount_share(slot as u8, &s.guest, s.read_only)?;
        }
        timings.total = sb.vmm.spawned_at().elapsed();
        sb.timings = timings;
        Ok(sb)
    }

    /// Rotates the session secret (an authenticated re-key that also reseeds the guest RNG
    /// and sets its clock), then sends the policy under the new secret.
    pub fn rekey(&mut self) -> Result<(), SandboxError> {
        let new = SessionSecret::random().map_err(SandboxError::io("session secret"))?;
        let r = self
            .conn
            .rekey(&new, self.policy.clone(), Duration::from_secs(30));
        self.check("re-key", r)?;
        self.secret = new;
        Ok(())
    }

    /// Snapshots the running VM into `dir` (VMM started with `snapshot_control`); the guest
    /// resumes afterwards.
    pub fn snapshot_to(
        &mut self,
        dir: &Path,
        timeout: Duration,
    ) -> Result<SnapshotStats, SandboxError> {
        self.snapshot_cmd(serde_json::json!({"snapshot": {"dir": dir}}), timeout)
    }

    /// Writes a layered snapshot into `dir`: the VM's state and only the memory pages written
    /// since it was restored from the full snapshot in `base` (VMM started with
    /// `snapshot_control`, restored from exactly `base`; anything else is refused as
    /// [`SandboxError::SnapshotFailed`]). Restore it with `RestoreFrom { base: Some(base) }`.
    pub fn snapshot_diff_to(
        &mut self,
        dir: &Path,
        base: &Path,
        timeout: Duration,
    ) -> Result<SnapshotStats, SandboxError> {
        self.snapshot_cmd(
            serde_json::json!({"snapshot": {"dir": dir, "base": base}}),
            timeout,
        )
    }

    fn snapshot_cmd(
        &mut self,
        cmd: serde_json::Value,
        timeout: Duration,
    ) -> Result<SnapshotStats, SandboxError> {
        let from = self.vmm.status().len();
        let t0 = Instant::now();
        self.vmm.send_control(&cmd)?;
        let got = self.vmm.status().wait_for(from, timeout, |e| match e {
            VmmEvent::SnapshotSaved {
                pause_us,
                total_ms,
                state_bytes,
                memory_bytes,
                disk_bytes,
                diff_pages,
            } => Some(Ok(SnapshotStats {
                pause: Duration::from_micros(*pause_us),
                vmm_total: Duration::from_millis(*total_ms),
                total: Duration::ZERO,
                state_bytes: *state_bytes,
                memory_bytes: *memory_bytes,
                disk_bytes: *disk_bytes,
                diff_pages: *diff_pages,
            })),
            VmmEvent::SnapshotFailed { detail } => Some(Err(detail.clone())),
            _ => None,
        });
        match got {
            Some(Ok(mut s)) => {
                s.total = t0.elapsed();
                Ok(s)
            }
            Some(Err(detail)) => Err(SandboxError::SnapshotFailed(detail)),
            None => {
                if self.vmm.wait_timeout(Duration::from_millis(200)).is_some() {
                    return Err(SandboxError::VmmDied {
                        during: "snapshot".into(),
                        exit: Box::new(self.vmm.exit_report()),
                    });
                }
                Err(SandboxError::Timeout("snapshot".into(), timeout))
            }
        }
    }

    /// Runs a command, streaming its output to `on_output`.
    pub fn exec(
        &mut self,
        req: ExecRequest,
        on_output: &mut dyn FnMut(OutputStream, &[u8]),
    ) -> Result<ExecResponse, SandboxError> {
        let r = self.conn.exec(req, on_output);
        self.check("exec", r)
    }

    /// [`Sandbox::exec`] with periodic guest telemetry ([`guest::GuestConn::exec_sampled`]).
    pub fn exec_sampled(
        &mut self,
        req: ExecRequest,
        on_output: &mut dyn FnMut(OutputStream, &[u8]),
        sampling: Option<guest::Sampling<'_>>,
    ) -> Result<ExecResponse, SandboxError> {
        let r = self.conn.exec_sampled(req, on_output, sampling);
        self.check("exec", r)
    }

    /// Starts `req` as the held exec `name`: it outlives this connection (and a snapshot
    /// of this VM carries it) until [`Sandbox::exec_attach`] (see [`GuestConn::exec_hold`]).
    pub fn exec_hold(&mut self, name: &str, req: ExecRequest) -> Result<(), SandboxError> {
        let r = self.conn.exec_hold(name, req);
        self.check("exec_hold", r)
    }

    /// The state of the held exec `name` (see [`GuestConn::held_info`]).
    pub fn held_info(&mut self, name: &str) -> Result<voidbox_protocol::HeldInfo, SandboxError> {
        let r = self.conn.held_info(name);
        self.check("held_info", r)
    }

    /// Attaches the held exec `name` and runs it to its end, or until `on_output` says
    /// [`guest::Attach::Finish`] (see [`GuestConn::exec_attach`]).
    pub fn exec_attach(
        &mut self,
        name: &str,
        stdin: Vec<u8>,
        timeout_secs: Option<u64>,
        on_output: &mut dyn FnMut(OutputStream, &[u8]) -> guest::Attach,
        sampling: Option<guest::Sampling<'_>>,
    ) -> Result<guest::Attached, SandboxError> {
        let r = self
            .conn
            .exec_attach(name, stdin, timeout_secs, on_output, sampling);
        self.check("exec_attach", r)
    }

    /// Runs an interactive session on a guest pseudo-terminal (see [`GuestConn::pty`]).
    pub fn pty(
        &mut self,
        open: voidbox_protocol::PtyOpen,
        on_open: &mut dyn FnMut(guest::PtyInput),
        on_event: &mut dyn FnMut(guest::PtyEvent<'_>),
    ) -> Result<ExecResponse, SandboxError> {
        let r = self.conn.pty(open, on_open, on_event);
        self.check("pty", r)
    }

    /// Writes a guest file.
    pub fn write_file(
        &mut self,
        path: &str,
        data: &[u8],
        mode: Option<u32>,
    ) -> Result<(), SandboxError> {
        let r = self.conn.write_file(path, data, mode);
        self.check("write_file", r)
    }

    /// Reads a guest file of at most `max_len` bytes.
    pub fn read_file(&mut self, path: &str, max_len: u64) -> Result<Vec<u8>, SandboxError> {
        let r = self.conn.read_file(path, max_len);
        self.check("read_file", r)
    }

    /// Lists a guest directory (see [`guest::GuestConn::list_dir`]).
    pub fn list_dir(
        &mut self,
        path: &str,
    ) -> Result<(Vec<voidbox_protocol::DirEntry>, bool), SandboxError> {
        let r = self.conn.list_dir(path);
        self.check("list_dir", r)
    }

    /// Mounts share slot `slot` (bound to a host directory when the VMM started, see
    /// [`SandboxConfig::shares`]) at guest path `guest`; [`Sandbox::start`] does it for every
    /// configured share.
    pub fn mount_share(
        &mut self,
        slot: u8,
        guest: &str,
        read_only: bool,
    ) -> Result<(), SandboxError> {
        let r = self.conn.mount_share(slot, guest, read_only);
        self.check("mount_share", r)
    }

    /// Creates a guest directory and its parents.
    pub fn mkdir_p(&mut self, path: &str) -> Result<(), SandboxError> {
        let r = self.conn.mkdir_p(path);
        self.check("mkdir_p", r)
    }

    /// A snapshot of the guest's CPU and memory counters ([`voidbox_protocol::Telemetry`]).
    pub fn telemetry(&mut self) -> Result<voidbox_protocol::Telemetry, SandboxError> {
        let r = self.conn.telemetry();
        self.check("telemetry", r)
    }

    /// One authenticated `Ping` round trip.
    pub fn ping(&mut self) -> Result<Duration, SandboxError> {
        let r = self.conn.ping(&self.secret, Duration::from_secs(10));
        self.check("ping", r)
    }

    /// A failed exchange on a VMM that has died is reported as [`SandboxError::VmmDied`].
    fn check<T>(&mut self, during: &str, r: Result<T, SandboxError>) -> Result<T, SandboxError> {
        match r {
            Ok(v) => Ok(v),
            Err(e @ SandboxError::Guest { .. }) => Err(e),
            Err(e) => {
                if self.vmm.wait_timeout(Duration::from_millis(1500)).is_some() {
                    Err(SandboxError::VmmDied {
                        during: during.to_string(),
                        exit: Box::new(self.vmm.exit_report()),
                    })
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Graceful stop: `Shutdown`, wait up to the grace period, then SIGKILL. Returns how
    /// the VMM ended. Resources are released when the `Sandbox` is dropped here.
    pub fn stop(mut self) -> VmmExit {
        if self.vmm.try_wait().is_none() {
            let grace = self.stop_grace;
            if self.conn.shutdown(grace).is_ok() {
                self.vmm.wait_timeout(grace);
            }
        }
        self.vmm.kill();
        self.vmm.exit_report()
    }

    /// Kills the VMM (no graceful shutdown) and returns how it ended, with the NAT's final
    /// denial counts: when the VMM sent denials within the last 250 ms, it may be holding
    /// back a newer count, which is waited for first (at most 600 ms). Resources are released
    /// when the `Sandbox` is dropped here.
    pub fn kill(mut self) -> VmmExit {
        self.vmm.status().settle_net_denials();
        self.vmm.kill();
        self.vmm.exit_report()
    }

    /// The NAT's denials so far (cumulative, as the VMM last reported them; empty without
    /// a network device).
    pub fn net_denials(&self) -> Vec<voidbox_net::Denial> {
        self.vmm.status().net_denials()
    }

    /// The session secret in force (handle with care).
    pub fn secret(&self) -> &SessionSecret {
        &self.secret
    }

    /// Cold-start phases.
    pub fn timings(&self) -> &BootTimings {
        &self.timings
    }

    /// The snapshot directory this VM was restored from (`None`: cold boot).
    pub fn restored_from(&self) -> Option<&Path> {
        self.restored_from.as_deref()
    }

    /// What the guest reported in its handshake (`None` for a restored VM until its first
    /// request was answered: nothing waits for the guest before that).
    pub fn guest_info(&self) -> Option<&GuestInfo> {
        self.conn.guest_info()
    }

    /// The VMM's pid.
    pub fn vmm_pid(&self) -> u32 {
        self.vmm.pid()
    }

    /// VMM resident set size in KiB.
    pub fn vmm_rss_kib(&self) -> Option<u64> {
        self.vmm.rss_kib()
    }

    /// A second authenticated connection to the guest agent, under the VM's current secret:
    /// its requests (a readiness probe, a file read) run beside an exec in progress on the
    /// first. `timeout` bounds the connect and the handshake.
    pub fn side_connection(&self, timeout: Duration) -> Result<GuestConn, SandboxError> {
        let stream = guest::try_connect(&self.vsock_path, guest::AGENT_PORT, timeout)?
            .ok_or_else(|| SandboxError::Timeout("a second guest connection".into(), timeout))?;
        GuestConn::handshake(stream, &self.secret, None, timeout).map(|(c, _)| c)
    }

    /// The host side of the VM's vsock (tests connect to it directly).
    pub fn vsock_path(&self) -> &Path {
        &self.vsock_path
    }

    /// The guest console log.
    pub fn console_log(&self) -> &Path {
        &self.console_log
    }

    /// The per-VM temp dir.
    pub fn runtime_dir(&self) -> &Path {
        self.dir.path()
    }
}

fn boot_timings(vmm: &VmmProcess, t0: Instant, connected: Instant, done: Instant) -> BootTimings {
    let mut t = BootTimings {
        handshake: done - connected,
        total: done - t0,
        ..BootTimings::default()
    };
    let mut booting_at = None;
    for e in vmm.events() {
        match e.event {
            VmmEvent::Started { .. } => t.vmm_spawn = e.at.saturating_duration_since(t0),
            VmmEvent::Configured { setup_us } => t.vm_setup = Duration::from_micros(setup_us),
            VmmEvent::Restored { restore_us, .. } => {
                t.restore = Some(Duration::from_micros(restore_us))
            }
            VmmEvent::Booting { .. } => {
                t.to_booting = e.at.saturating_duration_since(t0);
                booting_at = Some(e.at);
            }
            _ => {}
        }
    }
    if let Some(b) = booting_at {
        t.kernel_to_agent = connected.saturating_duration_since(b);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_extra_drops_what_the_vmm_adds() {
        let img = GuestImage {
            hash: "h".into(),
            vmlinux: "k".into(),
            system_disk: "d".into(),
            system_disk_sha256: "s".into(),
            agent: "a".into(),
            initramfs: None,
            profile: Profile::Compat,
            cmdline: Profile::Compat.cmdline().into(),
        };
        let s = cmdline_extra(&img, true, &["rdinit=/x".into()], "ab");
        assert_eq!(s, "rdinit=/x voidbox.secret=ab");
        let plain = GuestImage {
            profile: Profile::Plain,
            cmdline: Profile::Plain.cmdline().into(),
            ..img
        };
        assert_eq!(
            cmdline_extra(&plain, false, &[], "ab"),
            "quiet voidbox.secret=ab"
        );
        // The system disk's boot flags come from the image's recorded command line.
        let disk = GuestImage {
            cmdline: crate::image::recipe::image_cmdline(Profile::Compat),
            ..plain
        };
        assert_eq!(
            cmdline_extra(&disk, true, &[], "ab"),
            "root=/dev/vda rootfstype=erofs ro init=/sbin/voidbox-agent voidbox.secret=ab"
        );
        // The key follows the disk's contents; the VMM gets the disk read-only as vda.
        let mut other = disk.clone();
        other.system_disk_sha256 = "t".into();
        assert_ne!(
            image_key(&disk, &[], &Default::default(), false),
            image_key(&other, &[], &Default::default(), false)
        );
        let disks = disks::VmDisks::default().vm_disks(&disk.system_disk);
        assert_eq!(disks.len(), 1);
        assert!(disks[0].read_only && disks[0].path == std::path::Path::new("d"));
    }
}
