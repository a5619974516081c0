//! The system half of a `Rekey`: reseeding the kernel RNG with host entropy and setting
//! `CLOCK_REALTIME`, done before the session secret is rotated.
//!
//! VMs restored from one snapshot share their RNG state and wake up with the snapshot's
//! wall clock. [`RekeyMode::System`] (always the mode of PID 1 in a VM) feeds the host's
//! entropy to the kernel with `RNDADDENTROPY`, forces an immediate CRNG reseed with
//! `RNDRESEEDCRNG` (both need `CAP_SYS_ADMIN`) and sets the clock with `clock_settime`
//! (`CAP_SYS_TIME`); if any step fails the re-key is refused and the secret is kept.
//! A node with network then has its interface re-applied and its neighbour table flushed
//! ([`crate::net::reapply`], called by the server after [`apply_system`]; no-ops after a
//! cold boot, where the engine re-keys too).
//! As a host process (tests) the agent must not touch the host's RNG or clock, so it
//! refuses `Rekey` unless started with `--rekey secret-only` (rotation only, advertised as
//! [`CAP_REKEY_SECRET_ONLY`] instead of [`CAP_REKEY`]) or `--rekey system`.

use std::io;
use std::os::fd::AsRawFd;

use voidbox_protocol::{
    ErrorCode, CAP_REKEY, CAP_REKEY_SECRET_ONLY, REKEY_ENTROPY_MAX, REKEY_ENTROPY_MIN,
};

/// What a `Rekey` does besides rotating the session secret.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RekeyMode {
    /// `Rekey` is refused (`unsupported`); the default of a host process.
    #[default]
    Off,
    /// Rotate the secret only — no RNG reseed, no clock (explicit `--rekey secret-only`,
    /// host tests). Advertised as [`CAP_REKEY_SECRET_ONLY`].
    SecretOnly,
    /// Reseed the kernel RNG and set the clock, then rotate the secret; refuse (and keep
    /// the secret) if either step fails. Always the mode of PID 1. Advertised as [`CAP_REKEY`].
    System,
}

impl RekeyMode {
    /// Parses the `--rekey` flag value: `off`, `secret-only` or `system`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(RekeyMode::Off),
            "secret-only" => Ok(RekeyMode::SecretOnly),
            "system" => Ok(RekeyMode::System),
            other => Err(format!(
                "--rekey takes off, secret-only or system, not `{other}`"
            )),
        }
    }

    /// The `GuestInfo` capability announcing this mode, if `Rekey` is served at all.
    pub fn capability(self) -> Option<&'static str> {
        match self {
            RekeyMode::Off => None,
            RekeyMode::SecretOnly => Some(CAP_REKEY_SECRET_ONLY),
            RekeyMode::System => Some(CAP_REKEY),
        }
    }
}

/// Earliest wall-clock time a `Rekey` may set (2020-01-01T00:00:00Z): anything before is
/// a broken host clock, and setting it would break certificate checks in the guest.
pub const MIN_UNIX_TIME_NS: u64 = 1_577_836_800 * NANOS_PER_SEC;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Checks a `Rekey`'s fields before anything is changed (the protocol decoder already
/// bounds the entropy; this also guards hand-built requests).
pub fn validate(entropy: &[u8], unix_time_ns: u64) -> Result<(), (ErrorCode, String)> {
    if !(REKEY_ENTROPY_MIN..=REKEY_ENTROPY_MAX).contains(&entropy.len()) {
        return Err((
            ErrorCode::InvalidRequest,
            format!(
                "re-key entropy must be {REKEY_ENTROPY_MIN}..={REKEY_ENTROPY_MAX} bytes, got {}",
                entropy.len()
            ),
        ));
    }
    if unix_time_ns < MIN_UNIX_TIME_NS {
        return Err((
            ErrorCode::InvalidRequest,
            format!(
                "re-key time {unix_time_ns} ns since the epoch is before 2020: host clock broken?"
            ),
        ));
    }
    Ok(())
}

/// Reseeds the kernel RNG, then sets the clock. On failure: the error code and message to
/// answer the `Rekey` with (the caller then keeps the old secret).
pub fn apply_system(entropy: &[u8], unix_time_ns: u64) -> Result<(), (ErrorCode, String)> {
    let refused = |what: &str, e: io::Error| {
        let code = match e.kind() {
            io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
            _ => ErrorCode::Io,
        };
        (
            code,
            format!("re-key refused: {what} failed: {e}; the session secret was not rotated"),
        )
    };
    reseed_kernel_rng(entropy).map_err(|e| refused("reseeding the kernel RNG", e))?;
    set_realtime_clock(unix_time_ns).map_err(|e| refused("setting the clock", e))?;
    Ok(())
}

// Linux's generic ioctl number encoding (`_IOC`): dir << 30 | size << 16 | type << 8 | nr.
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64",
    target_arch = "loongarch64",
    target_arch = "s390x"
)))]
compile_error!("RNDADDENTROPY / RNDRESEEDCRNG are encoded here for the generic ioctl layout only");

const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((ty as u32) << 8) | nr as u32
}

/// `_IOW('R', 0x03, int[2])`: mix bytes into the input pool and credit entropy.
pub const RNDADDENTROPY: u32 = ioc(1, b'R', 0x03, 2 * std::mem::size_of::<libc::c_int>());
/// `_IO('R', 0x07)`: reseed the CRNG from the input pool now.
pub const RNDRESEEDCRNG: u32 = ioc(0, b'R', 0x07, 0);

/// The kernel's `struct rand_pool_info` with room for [`REKEY_ENTROPY_MAX`] bytes; the
/// bytes are zeroed on drop.
#[repr(C)]
struct RandPoolInfo {
    entropy_count: libc::c_int,
    buf_size: libc::c_int,
    buf: [u8; REKEY_ENTROPY_MAX],
}

impl RandPoolInfo {
    /// Credits 8 bits per byte: the bytes come straight from the host's CSPRNG.
    fn new(entropy: &[u8]) -> io::Result<Self> {
        let len = entropy.len();
        if len == 0 || len > REKEY_ENTROPY_MAX {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut info = RandPoolInfo {
            entropy_count: (8 * len) as libc::c_int,
            buf_size: len as libc::c_int,
            buf: [0; REKEY_ENTROPY_MAX],
        };
        info.buf[..len].copy_from_slice(entropy);
        Ok(info)
    }
}

impl Drop for RandPoolInfo {
    fn drop(&mut self) {
        crate::auth::scrub(&mut self.buf);
    }
}

/// Adds `entropy` to the kernel's input pool (`RNDADDENTROPY`, credited 8 bits per byte),
/// then rekeys the CRNG at once (`RNDRESEEDCRNG`). Needs `CAP_SYS_ADMIN`.
pub fn reseed_kernel_rng(entropy: &[u8]) -> io::Result<()> {
    let info = RandPoolInfo::new(entropy)?;
    let urandom = std::fs::File::open("/dev/urandom")?;
    let fd = urandom.as_raw_fd();
    // SAFETY: RNDADDENTROPY reads the two-int header and then `buf_size` (≤ buf.len())
    // bytes from `info`, a live, correctly laid out `rand_pool_info`; `fd` is open.
    if unsafe { libc::ioctl(fd, RNDADDENTROPY as _, &info as *const RandPoolInfo) } < 0 {
        return Err(annotate("RNDADDENTROPY", io::Error::last_os_error()));
    }
    // SAFETY: RNDRESEEDCRNG takes no argument; `fd` is open.
    if unsafe { libc::ioctl(fd, RNDRESEEDCRNG as _) } < 0 {
        return Err(annotate("RNDRESEEDCRNG", io::Error::last_os_error()));
    }
    Ok(())
}

/// Sets `CLOCK_REALTIME` to `unix_time_ns`. Needs `CAP_SYS_TIME`.
pub fn set_realtime_clock(unix_time_ns: u64) -> io::Result<()> {
    let ts = timespec(unix_time_ns)?;
    // SAFETY: `ts` is a valid timespec that outlives the call.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } < 0 {
        return Err(annotate("clock_settime", io::Error::last_os_error()));
    }
    Ok(())
}

fn timespec(unix_time_ns: u64) -> io::Result<libc::timespec> {
    let secs = libc::time_t::try_from(unix_time_ns / NANOS_PER_SEC)
        .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    // SAFETY: timespec is plain data (some targets have padding fields); all-zero is valid.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    ts.tv_sec = secs;
    // Below 10^9: fits every `c_long`.
    ts.tv_nsec = (unix_time_ns % NANOS_PER_SEC) as _;
    Ok(ts)
}

/// Names the call that failed, keeping the error's kind (EPERM stays `PermissionDenied`).
fn annotate(call: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{call}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux() {
        assert_eq!(RNDADDENTROPY, 0x4008_5203);
        assert_eq!(RNDRESEEDCRNG, 0x5207);
    }

    #[test]
    fn pool_info_layout_and_credit() {
        assert_eq!(std::mem::offset_of!(RandPoolInfo, buf), 8);
        let info = RandPoolInfo::new(&[0xab; 64]).unwrap();
        assert_eq!((info.entropy_count, info.buf_size), (512, 64));
        assert!(info.buf[..64].iter().all(|&b| b == 0xab));
        assert!(info.buf[64..].iter().all(|&b| b == 0));
        assert!(RandPoolInfo::new(&[]).is_err());
        assert!(RandPoolInfo::new(&[1; REKEY_ENTROPY_MAX + 1]).is_err());
        assert!(RandPoolInfo::new(&[1; REKEY_ENTROPY_MAX]).is_ok());
    }

    #[test]
    fn timespec_split() {
        let ts = timespec(1_700_000_000_123_456_789).unwrap();
        assert_eq!((ts.tv_sec, ts.tv_nsec), (1_700_000_000, 123_456_789));
        let ts = timespec(u64::MAX).unwrap();
        assert_eq!(ts.tv_nsec, 709_551_615);
    }

    #[test]
    fn validation() {
        let now = 1_700_000_000 * NANOS_PER_SEC;
        assert!(validate(&[0; 32], now).is_ok());
        assert!(validate(&[0; 256], MIN_UNIX_TIME_NS).is_ok());
        for (len, t) in [
            (31, now),
            (257, now),
            (0, now),
            (32, 0),
            (32, MIN_UNIX_TIME_NS - 1),
        ] {
            let (code, _) = validate(&vec![0; len], t).unwrap_err();
            assert_eq!(code, ErrorCode::InvalidRequest);
        }
    }

    #[test]
    fn modes() {
        assert_eq!(RekeyMode::parse("secret-only"), Ok(RekeyMode::SecretOnly));
        assert_eq!(RekeyMode::parse("system"), Ok(RekeyMode::System));
        assert_eq!(RekeyMode::parse("off"), Ok(RekeyMode::Off));
        assert!(RekeyMode::parse("yes").is_err());
        assert_eq!(RekeyMode::default(), RekeyMode::Off);
        assert_eq!(RekeyMode::System.capability(), Some(CAP_REKEY));
        assert_eq!(RekeyMode::Off.capability(), None);
    }

    /// Unprivileged, the system steps fail (and say why) instead of being skipped.
    #[test]
    fn system_steps_need_privileges() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            eprintln!("root: not calling RNDADDENTROPY / clock_settime on the host");
            return;
        }
        let (code, msg) = apply_system(&[7; 32], 1_700_000_000 * NANOS_PER_SEC).unwrap_err();
        assert_eq!(code, ErrorCode::PermissionDenied, "{msg}");
        assert!(
            msg.contains("RNDADDENTROPY") && msg.contains("not rotated"),
            "{msg}"
        );
    }
}
