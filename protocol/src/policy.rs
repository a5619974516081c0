//! Guest security policy and guest self-description, exchanged in the handshake.

use serde::{Deserialize, Serialize};

/// Resource limits applied with `setrlimit` to every child the guest spawns.
/// `None` leaves the guest's default in place.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResourceLimits {
    /// `RLIMIT_NOFILE`: maximum open file descriptors.
    pub nofile: Option<u64>,
    /// `RLIMIT_NPROC`: maximum processes of the sandbox user.
    pub nproc: Option<u64>,
    /// `RLIMIT_FSIZE`: maximum file size in bytes.
    pub fsize: Option<u64>,
    /// `RLIMIT_AS`: maximum address-space size in bytes.
    #[serde(rename = "as")]
    pub as_bytes: Option<u64>,
}

/// Security policy the guest enforces from the first accepted request on.
///
/// It is delivered in the boot parameters and/or the authenticated [`crate::Ping`]. A
/// handshake policy can only *narrow* the boot policy (allowlists intersect, limits take the
/// minimum), and the result holds for the lifetime of the VM.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GuestPolicy {
    /// Programs that may be executed. `None` allows everything; `Some(vec![])` allows nothing.
    /// A bare name (`sh`) is resolved through the guest's fixed system `PATH`
    /// (`/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin`), an absolute path is
    /// taken as is. A requested program (a bare name resolved through the request's `PATH`,
    /// or an absolute path) is allowed only if it resolves to the same path as an entry
    /// (directory canonicalised, file name kept so busybox applets stay distinct) — so
    /// `/workspace/sh` does not pass an allowlist containing `sh`.
    pub allowlist: Option<Vec<String>>,
    /// Resource limits for every child.
    pub rlimits: ResourceLimits,
    /// Timeout applied to an exec that does not set `timeout_secs`.
    pub default_timeout_secs: Option<u64>,
    /// Upper bound on any exec's `timeout_secs`.
    pub max_timeout_secs: Option<u64>,
    /// Cap on stdout + stderr bytes streamed per exec; beyond it output is dropped.
    pub max_output_bytes: Option<u64>,
    /// Maximum number of execs / PTYs running at once on the guest.
    pub max_concurrent_execs: Option<u32>,
    /// Whether PTY sessions may be opened.
    pub allow_pty: Option<bool>,
}

/// [`GuestInfo::capabilities`] entry: the guest serves [`crate::Rekey`] in full — it reseeds
/// its kernel RNG and sets its clock before rotating the secret (always so in a VM).
pub const CAP_REKEY: &str = "rekey";

/// [`GuestInfo::capabilities`] entry of a guest agent running as a host process for tests
/// and configured so: [`crate::Rekey`] rotates the secret only (no RNG reseed, no clock).
pub const CAP_REKEY_SECRET_ONLY: &str = "rekey_secret_only";

/// Information the guest reports about itself in its [`crate::Pong`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GuestInfo {
    /// Guest agent version string.
    pub agent_version: String,
    /// Kernel release (`uname -r`).
    pub kernel: Option<String>,
    /// Machine architecture (`uname -m`).
    pub arch: Option<String>,
    /// Online CPUs.
    pub cpus: Option<u32>,
    /// Total memory in KiB.
    pub mem_total_kb: Option<u64>,
    /// Optional features the agent supports (e.g. `"pty"`, `"telemetry"`, [`CAP_REKEY`]).
    pub capabilities: Vec<String>,
}
