//! Guest init duties when the agent is PID 1: mounts, hostname, loopback, hardening
//! sysctls, hiding the session secret, and powering the VM off.
//!
//! Everything here is best effort: a missing filesystem type (e.g. a kernel without
//! sysfs) is logged and skipped, because PID 1 must never exit.

use std::ffi::CString;
use std::io;
use std::path::Path;

use crate::cmdline::ShutdownMode;
use crate::spawn::SANDBOX;

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
        target: "/dev/shm",
        fstype: "tmpfs",
        flags: NOSUID_NODEV,
        data: "mode=1777",
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

fn c(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn mount(m: &MountSpec) -> io::Result<()> {
    let _ = std::fs::create_dir_all(m.target);
    let (src, tgt, fs, data) = (c(m.source)?, c(m.target)?, c(m.fstype)?, c(m.data)?);
    let data_ptr = if m.data.is_empty() {
        std::ptr::null()
    } else {
        data.as_ptr().cast()
    };
    // SAFETY: all strings are NUL-terminated and outlive the call.
    if unsafe { libc::mount(src.as_ptr(), tgt.as_ptr(), fs.as_ptr(), m.flags, data_ptr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn chown(path: &str, uid: u32, gid: u32, mode: u32) {
    if let Ok(p) = c(path) {
        // SAFETY: valid NUL-terminated path.
        unsafe {
            libc::chown(p.as_ptr(), uid, gid);
            libc::chmod(p.as_ptr(), mode);
        }
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

/// Mounts the guest's filesystems (proc first: the boot parameters live there) and
/// prepares `/workspace`, `/home/sandbox` and `/etc/voidbox`.
pub fn mount_filesystems() {
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0o022) };
    for m in MOUNTS {
        if let Err(e) = mount(m) {
            // EBUSY: already mounted (e.g. the kernel's devtmpfs automount).
            if e.raw_os_error() != Some(libc::EBUSY) {
                crate::log!("mount {} on {}: {e}", m.fstype, m.target);
            }
            let _ = std::fs::create_dir_all(m.target);
        }
        if m.target == "/dev" {
            ensure_stdio();
        }
    }
    if !Path::new("/dev/ptmx").exists() {
        let _ = std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx");
    }
    chown("/workspace", SANDBOX.uid, SANDBOX.gid, 0o755);
    let _ = std::fs::create_dir_all("/home/sandbox");
    chown("/home/sandbox", SANDBOX.uid, SANDBOX.gid, 0o700);
    let _ = std::fs::create_dir_all("/etc/voidbox");
    chown("/etc/voidbox", 0, 0, 0o755);
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

/// Sets the hostname (default `voidbox`) and brings up loopback.
pub fn configure(hostname: Option<&str>) {
    let name = hostname.unwrap_or("voidbox");
    // SAFETY: pointer/length pair of a live string.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } < 0 {
        crate::debug!("sethostname: {}", io::Error::last_os_error());
    }
    if let Err(e) = loopback_up() {
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
    std::fs::write(path, redacted.join(" ") + "\n")?;
    chown(path, 0, 0, 0o444);
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

/// Brings `lo` up (one socket + two ioctls; skipped when the kernel has no inet).
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket creation; closed below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain data.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, b) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read/write the ifreq we pass; `s` is our socket.
    let result = unsafe {
        if libc::ioctl(s, libc::SIOCGIFFLAGS, &mut ifr) < 0 {
            Err(io::Error::last_os_error())
        } else {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            if libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr) < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
    };
    // SAFETY: closes the socket we created.
    unsafe { libc::close(s) };
    result
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
