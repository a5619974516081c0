//! The voidbox guest agent: PID 1 inside every micro-VM.
//!
//! * [`init`]: guest init as PID 1 — mounts, hostname, loopback, power-off.
//! * [`cmdline`]: `voidbox.*` boot parameters from `/proc/cmdline`.
//! * [`server`]: the vsock (or, on the host, Unix-socket) server; one thread per
//!   connection and per long-running request, multiplexed by request id.
//! * [`auth`]: session-secret handling and the handshake.
//! * [`rekey`]: the system half of a `Rekey` (RNG reseed, clock) before secret rotation.
//! * [`policy`]: command allowlist, rlimits, timeouts.
//! * [`exec`] + [`spawn`]: running programs as uid/gid 1000 with limits, streaming output.
//! * [`held`]: held execs, which outlive their connection until an attach takes them over.
//! * [`reaper`] + [`watchdog`]: the single `waitpid` owner and the timeout killer.
//! * [`files`]: file RPCs confined with `openat2(RESOLVE_IN_ROOT)`.
//! * [`disks`] + [`rootfs`] + [`mount`]: OCI image root and skill disks, set up at boot.
//! * [`net`]: the network interface, route and `/etc/resolv.conf` (`voidbox.net`), at boot
//!   and after a snapshot restore.
//! * [`pty`]: interactive sessions on a pseudo-terminal.
//! * [`shares`]: host directory shares (virtio-9p), mounted on the host's request.
//! * [`telemetry`]: resource statistics from `/proc`.

pub mod auth;
pub mod cli;
pub mod cmdline;
pub mod disks;
pub mod exec;
pub mod files;
pub mod held;
pub mod init;
pub mod mount;
pub mod net;
pub mod policy;
pub mod probe;
pub mod pty;
pub mod reaper;
pub mod rekey;
pub mod restore_page;
pub mod rootfs;
pub mod server;
pub mod shares;
pub mod spawn;
pub mod telemetry;
pub mod watchdog;

use std::sync::atomic::{AtomicBool, Ordering};

static DEBUG: AtomicBool = AtomicBool::new(false);

/// Turns debug logging on or off.
pub fn set_debug(on: bool) {
    DEBUG.store(on, Ordering::Relaxed);
}

/// Whether debug logging is on.
pub fn debug_enabled() -> bool {
    DEBUG.load(Ordering::Relaxed)
}

/// Logs a line to stderr (the guest console when PID 1).
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("voidbox-agent: {}", format_args!($($arg)*))
    };
}

/// Logs a line when debug logging is on.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => {
        if $crate::debug_enabled() {
            $crate::log!($($arg)*);
        }
    };
}
