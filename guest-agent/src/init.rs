//! Guest init duties when the agent is PID 1: the root (the read-only system disk, or an
//! overlay on it when skill disks need mount points), mounts, hostname, loopback,
//! hardening sysctls, hiding the session secret, boot timestamps, and powering the VM off.
//!
//! Everything here is best effort: a missing filesystem type (e.g. a kernel without
//! sysfs) is logged and skipped, because PID 1 must never exit.

use std::ffi::CString;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::cmdline::ShutdownMode;
use crate::mount;
use crate::spawn::SANDBOX;

/// `statfs` magic of erofs (`EROFS_SUPER_MAGIC_V1`): the system disk.
pub const EROFS_SUPER_MAGIC: i64 = 0xE0F5_E1E2;
/// Where the writable root's tmpfs is mounted on the system disk before the pivot (the
/// disk's `/run`, empty; the agent mounts a fresh tmpfs on the new root's `/run` after).
const OVERLAY_BASE: &str = "/run";

/// Boot steps and the guest's uptime when each was reached.
static BOOT_MARKS: Mutex<Vec<(&'static str, Duration)>> = Mutex::new(Vec::new());

/// The guest's uptime (`CLOCK_BOOTTIME`: the clock of the kernel's log timestamps).
pub fn uptime() -> Duration {
    // SAFETY: timespec is plain data filled by the kernel (the vDSO).
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or_default(),
        u32::try_from(ts.tv_nsec).unwrap_or_default(),
    )
}

/// Records that boot reached `step` (cheap: no system call; printed by
/// [`log_boot_marks`] once `voidbox.debug` is known).
pub fn boot_mark(step: &'static str) {
    let t = uptime();
    if let Ok(mut m) = BOOT_MARKS.lock() {
        m.push((step, t));
    }
}

/// Logs the boot steps with the guest's uptime at each (debug only): where the time from
/// kernel start to a listening agent went. (The uptime clock may lag the host's by the
/// early-boot time the kernel counted on jiffies; differences between steps are exact.)
pub fn log_boot_marks() {
    if !crate::debug_enabled() {
        return;
    }
    if let Ok(m) = BOOT_MARKS.lock() {
        let start = m.first().map(|(_, t)| *t).unwrap_or_default();
        for (step, t) in m.iter() {
            crate::log!(
                "boot: {step} at {:.3} s (+{:.0} ms)",
                t.as_secs_f64(),
                t.saturating_sub(start).as_secs_f64() * 1e3
            );
        }
    }
}

/// What PID 1 made of the root it was started on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootMode {
    /// Not the system disk (an initramfs boot, or the agent is not PID 1): left alone.
    Other,
    /// The read-only erofs system disk; tmpfs mounts make the writable paths writable.
    ReadOnly,
    /// An overlay of the system disk and a tmpfs: every path is writable.
    Overlay,
}

static ROOT_MODE: AtomicU8 = AtomicU8::new(0);

/// What [`prepare_root`] made of the root.
pub fn root_mode() -> RootMode {
    match ROOT_MODE.load(Ordering::Relaxed) {
        1 => RootMode::ReadOnly,
        2 => RootMode::Overlay,
        _ => RootMode::Other,
    }
}

fn set_root_mode(m: RootMode) {
    let v = match m {
        RootMode::Other => 0,
        RootMode::ReadOnly => 1,
        RootMode::Overlay => 2,
    };
    ROOT_MODE.store(v, Ordering::Relaxed);
}

/// Whether `/` is the read-only erofs system disk.
pub fn root_is_erofs() -> bool {
    // SAFETY: statfs is plain data filled by the kernel.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path and a valid out-pointer.
    if unsafe { libc::statfs(c"/".as_ptr(), &mut st) } < 0 {
        return false;
    }
    st.f_type as i64 == EROFS_SUPER_MAGIC
}

/// Whether the boot parameters need a writable root: skill disks (`voidbox.mount=`) are
/// mounted at any path of the system root, and their mount points may not exist on the
/// read-only system disk; the engine asks for one (`voidbox.root=rw`) when a host share
/// goes outside `/workspace` and `/home`.
pub fn needs_writable_root(cmdline: &str) -> bool {
    crate::cmdline::split_cmdline(cmdline).iter().any(|t| {
        t.starts_with("voidbox.mount=") || t == voidbox_protocol::guest_paths::WRITABLE_ROOT_PARAM
    })
}

/// The first thing PID 1 does on the read-only erofs system disk (nothing elsewhere):
/// mounts `/proc` and reads the boot parameters. When they ask for skill disks
/// ([`needs_writable_root`]) it makes `/` writable — a tmpfs on the disk's `/run`, an
/// overlay of `/` (lower) and that tmpfs (upper, discarded with the VM) on `/run/root`, a
/// `pivot_root` into it, the old root detached — so mount points can be created anywhere.
/// Otherwise the root stays read-only: [`mount_filesystems`] puts tmpfs on every path that
/// is written (`/workspace`, `/home`, `/tmp`, `/run`, `/etc/voidbox`), which boots ≈0.4 s
/// faster on a host that interprets guest kernel code (the overlay's mount and pivot) with
/// no difference for commands (they run as the sandbox user, who may write nowhere else).
/// If the overlay fails the root stays read-only and the failure is logged.
pub fn prepare_root() {
    if !root_is_erofs() {
        return;
    }
    set_root_mode(RootMode::ReadOnly);
    if let Err(e) = mount(&MOUNTS[0]) {
        crate::log!("mount proc on /proc: {e}");
    }
    let raw = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    if !needs_writable_root(&raw) {
        return;
    }
    match overlay_root(Path::new(OVERLAY_BASE)) {
        Ok(()) => set_root_mode(RootMode::Overlay),
        Err(e) => crate::log!("the root stays read-only: {e}"),
    }
}

/// Mounts a tmpfs on `base`, an overlay of `/` and that tmpfs on `base/root`, and pivots
/// into it (the old root and everything mounted on it are detached).
fn overlay_root(base: &Path) -> Result<(), String> {
    mount::mount(
        Path::new("tmpfs"),
        base,
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        "mode=0755",
    )?;
    let (upper, work, root) = (base.join("upper"), base.join("work"), base.join("root"));
    for d in [&upper, &work, &root] {
        std::fs::create_dir(d).map_err(|e| format!("mkdir {}: {e}", d.display()))?;
    }
    let data = format!(
        "lowerdir=/,upperdir={},workdir={}",
        upper.display(),
        work.display()
    );
    mount::mount(Path::new("overlay"), &root, "overlay", 0, &data)?;
    mount::pivot_into(&root)
}

struct MountSpec {
    source: &'static str,
    target: &'static str,
    fstype: &'static str,
    flags: libc::c_ulong,
    data: &'static str,
}

const NOSUID_NODEV: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV;

const MOUNTS: &[MountSpec] = &[
    MountSpec {
        source: "proc",
        target: "/proc",
        fstype: "proc",
        flags: NOSUID_NODEV | libc::MS_NOEXEC,
        data: "",
    },
    MountSpec {
        source: "sysfs",
        target: "/sys",
        fstype: "sysfs",
        flags: NOSUID_NODEV | libc::MS_NOEXEC,
        data: "",
    },
    MountSpec {
        source: "devtmpfs",
        target: "/dev",
        fstype: "devtmpfs",
        flags: libc::MS_NOSUID,
        data: "mode=0755",
    },
    MountSpec {
        source: "devpts",
        target: "/dev/pts",
        fstype: "devpts",
        flags: libc::MS_NOSUID | libc::MS_NOEXEC,
        data: "mode=0620,ptmxmode=0666,gid=5",
    },
    MountSpec {
        source: "tmpfs",
        target: "/tmp",
        fstype: "tmpfs",
        flags: NOSUID_NODEV,
        data: "mode=1777",
    },
    MountSpec {
        source: "tmpfs",
        target: "/run",
        fstype: "tmpfs",
        flags: NOSUID_NODEV | libc::MS_NOEXEC,
        data: "mode=0755",
    },
    MountSpec {
        source: "tmpfs",
        target: "/workspace",
        fstype: "tmpfs",
        flags: NOSUID_NODEV,
        data: "mode=0755,uid=1000,gid=1000",
    },
    MountSpec {
        source: "tmpfs",
        target: "/home",
        fstype: "tmpfs",
        flags: NOSUID_NODEV,
        data: "mode=0755",
    },
];

/// `/etc/voidbox` on a read-only root: the host writes the guest's configuration there.
const ETC_VOIDBOX: MountSpec = MountSpec {
    source: "tmpfs",
    target: "/etc/voidbox",
    fstype: "tmpfs",
    flags: NOSUID_NODEV | libc::MS_NOEXEC,
    data: "mode=0755",
};

fn c(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Mounts `m`, creating its mount point only when it is missing (on the system disk every
/// one exists: no extra lookups at boot).
fn mount(m: &MountSpec) -> io::Result<()> {
    let (src, tgt, fs, data) = (c(m.source)?, c(m.target)?, c(m.fstype)?, c(m.data)?);
    let data_ptr = if m.data.is_empty() {
        std::ptr::null()
    } else {
        data.as_ptr().cast()
    };
    let attempt = || {
        // SAFETY: all strings are NUL-terminated and outlive the call.
        if unsafe { libc::mount(src.as_ptr(), tgt.as_ptr(), fs.as_ptr(), m.flags, data_ptr) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    match attempt() {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            std::fs::create_dir_all(m.target)?;
            attempt()
        }
        r => r,
    }
}

fn chown(path: &str, uid: u32, gid: u32) {
    if let Ok(p) = c(path) {
        // SAFETY: valid NUL-terminated path.
        unsafe { libc::chown(p.as_ptr(), uid, gid) };
    }
}

/// `mkdir path mode` (the umask applies); an existing directory is left as it is.
fn mkdir(path: &str, mode: libc::mode_t) {
    if let Ok(p) = c(path) {
        // SAFETY: valid NUL-terminated path.
        unsafe { libc::mkdir(p.as_ptr(), mode) };
    }
}

/// Makes sure fds 0, 1 and 2 are open (on the console if possible), so that no pipe or
/// socket ever gets one of those numbers.
pub fn ensure_stdio() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only queries the descriptor.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            // SAFETY: plain opens of device nodes; the fd is intentionally leaked as 0..2.
            let n = unsafe { libc::open(c"/dev/console".as_ptr(), libc::O_RDWR | libc::O_NOCTTY) };
            // SAFETY: as above.
            let n = if n < 0 {
                unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) }
            } else {
                n
            };
            if n >= 0 && n != fd {
                // SAFETY: dup2 onto the missing low fd, then close the temporary.
                unsafe {
                    libc::dup2(n, fd);
                    libc::close(n);
                }
            }
        }
    }
}

/// Mounts the guest's filesystems (proc first: the boot parameters live there; already
/// there on a read-only root) and prepares `/workspace`, `/home/sandbox`, `/dev/shm` and
/// `/etc/voidbox` (a tmpfs too on a read-only root). Every system call here is interpreted
/// guest-kernel work on some hosts, so nothing is done twice: `/workspace` gets its owner
/// and mode from its mount options, the system disk already has `/etc/voidbox` (root,
/// 0755), and `/dev/shm` is a directory of the devtmpfs.
pub fn mount_filesystems() {
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0o022) };
    let etc = (root_mode() == RootMode::ReadOnly).then_some(&ETC_VOIDBOX);
    for m in MOUNTS.iter().chain(etc) {
        if let Err(e) = mount(m) {
            match e.raw_os_error() {
                // Already mounted (e.g. the kernel's devtmpfs automount).
                Some(libc::EBUSY) => {}
                // A kernel without this file system (the compat kernel has no sysfs).
                Some(libc::ENODEV) => crate::debug!("mount {} on {}: {e}", m.fstype, m.target),
                _ => crate::log!("mount {} on {}: {e}", m.fstype, m.target),
            }
        }
        if m.target == "/dev" {
            ensure_stdio();
        }
    }
    if !Path::new("/dev/ptmx").exists() {
        let _ = std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx");
    }
    mkdir("/dev/shm", 0o777);
    if let Ok(p) = c("/dev/shm") {
        // SAFETY: valid NUL-terminated path (mkdir's mode is cut by the umask).
        unsafe { libc::chmod(p.as_ptr(), 0o1777) };
    }
    mkdir("/home/sandbox", 0o700);
    chown("/home/sandbox", SANDBOX.uid, SANDBOX.gid);
    if !Path::new("/etc/voidbox").is_dir() {
        let _ = std::fs::create_dir_all("/etc/voidbox");
    }
    for (knob, value) in [
        ("/proc/sys/kernel/dmesg_restrict", "1"), // the boot log contains the command line
        ("/proc/sys/kernel/kptr_restrict", "2"),
        ("/proc/sys/fs/protected_hardlinks", "1"),
        ("/proc/sys/fs/protected_symlinks", "1"),
    ] {
        if let Err(e) = std::fs::write(knob, value) {
            crate::debug!("{knob}: {e}");
        }
    }
}

/// The hostname when `voidbox.hostname` does not set one.
pub const DEFAULT_HOSTNAME: &str = "voidbox";

/// Sets the hostname (default [`DEFAULT_HOSTNAME`]) and brings up loopback with 127.0.0.1/8
/// ([`crate::net::iface::loopback_up`]; the rest of the network is [`crate::net::boot`]'s).
pub fn configure(hostname: Option<&str>) {
    let name = hostname.unwrap_or(DEFAULT_HOSTNAME);
    // SAFETY: pointer/length pair of a live string.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } < 0 {
        crate::debug!("sethostname: {}", io::Error::last_os_error());
    }
    if let Err(e) = crate::net::iface::loopback_up() {
        crate::debug!("loopback: {e}");
    }
}

/// Replaces `/proc/cmdline` (readable by every user) with a copy whose `voidbox.secret`
/// value is redacted, by bind-mounting a file from `/run` over it.
pub fn hide_cmdline_secret(raw: &str) -> io::Result<()> {
    let redacted: Vec<String> = crate::cmdline::split_cmdline(raw)
        .into_iter()
        .map(|t| {
            if t.starts_with("voidbox.secret=") {
                "voidbox.secret=<redacted>".into()
            } else {
                t
            }
        })
        .collect();
    std::fs::create_dir_all("/run/voidbox")?;
    let path = "/run/voidbox/cmdline";
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // Created by root (PID 1) with mode 0444: no chown/chmod after.
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o444)
            .open(path)?
            .write_all((redacted.join(" ") + "\n").as_bytes())?;
    }
    let (src, tgt) = (c(path)?, c("/proc/cmdline")?);
    // SAFETY: NUL-terminated strings; a bind mount ignores fstype and data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // Read-only remount of the bind so nobody can write through it.
    let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
    // SAFETY: as above.
    unsafe {
        libc::mount(
            std::ptr::null(),
            tgt.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    Ok(())
}

/// Ends the VM: kills every other process, syncs, and reboots/powers off.
///
/// With the default [`ShutdownMode::Reboot`] the kernel (booted with `reboot=k`) writes
/// 0xFE to port 0x64, the "guest is done" signal the VMM watches for — without ACPI a
/// power-off would only halt the vCPU, invisibly to the VMM.
pub fn power_off(mode: ShutdownMode) -> ! {
    // SAFETY: as PID 1, kill(-1) signals every process except ourselves.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    let cmd = match mode {
        ShutdownMode::Reboot => libc::RB_AUTOBOOT,
        ShutdownMode::PowerOff => libc::RB_POWER_OFF,
        ShutdownMode::Halt => libc::RB_HALT_SYSTEM,
    };
    // SAFETY: reboot only returns on failure.
    unsafe { libc::reboot(cmd) };
    crate::log!("reboot({cmd:#x}) failed: {}", io::Error::last_os_error());
    loop {
        // PID 1 must not exit (that panics the kernel); wait for the VMM to kill us.
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skill_disks_and_outside_shares_need_a_writable_root() {
        assert!(needs_writable_root(
            "console=ttyS0 voidbox.secret=ab voidbox.mount=vdb:/skills/py:ro"
        ));
        assert!(!needs_writable_root(
            "console=ttyS0 root=/dev/vda voidbox.rootfs=vdb voidbox.user=1001:1001"
        ));
        assert!(needs_writable_root("console=ttyS0 voidbox.root=rw"));
        assert!(!needs_writable_root("voidbox.root=ro"));
        // Only the parameter itself counts, not a value that mentions it.
        assert!(!needs_writable_root("voidbox.hostname=voidbox.mount=x"));
        assert!(!needs_writable_root(""));
    }

    #[test]
    fn proc_is_mounted_first() {
        // `prepare_root` mounts MOUNTS[0] to read the boot parameters.
        assert_eq!(MOUNTS[0].target, "/proc");
        assert_eq!(MOUNTS[0].fstype, "proc");
        assert!(!MOUNTS.iter().any(|m| m.target == "/etc/voidbox"));
    }

    #[test]
    fn boot_marks_keep_their_order() {
        boot_mark("first");
        boot_mark("second");
        let m = BOOT_MARKS.lock().unwrap();
        let i = m.iter().position(|(s, _)| *s == "first").unwrap();
        assert_eq!(m[i + 1].0, "second");
        assert!(m[i + 1].1 >= m[i].1);
    }
}
