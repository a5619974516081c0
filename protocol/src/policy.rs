//! Guest security policy and guest self-description, exchanged in the handshake.

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

/// Resource limits (`setrlimit`) the guest agent applies to every process it starts.
///
/// This one type is the spec's `sandbox.limits` and the [`GuestPolicy::rlimits`] on the
/// wire. `None` means "not set here": the guest then applies [`ResourceLimits::DEFAULT`]
/// (see [`ResourceLimits::or_default`]). Values are checked against the `*_RANGE`
/// constants ([`ResourceLimits::validate`]; the spec's JSON Schema carries the same ranges).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(deny_unknown_fields))]
#[cfg_attr(
    feature = "schemars",
    schemars(
        description = "Resource limits (setrlimit) of every process the guest agent starts in the VM. Unset ones get the defaults: nofile 1024, nproc 1024, fsize_mb 4096, address space unlimited."
    )
)]
#[serde(default)]
pub struct ResourceLimits {
    /// Open file descriptors per process (`RLIMIT_NOFILE`). Default 1024.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 16, max = 1048576)))]
    pub nofile: Option<u64>,
    /// Processes and threads of the sandbox user, counted across the whole VM
    /// (`RLIMIT_NPROC`). Default 1024.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 16, max = 4194304)))]
    pub nproc: Option<u64>,
    /// Largest file a process may write, in MiB (`RLIMIT_FSIZE`). Default 4096.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 1, max = 16777216)))]
    pub fsize_mb: Option<u64>,
    /// Virtual address space per process, in MiB (`RLIMIT_AS`). Default: unlimited
    /// (runtimes such as V8 and Go reserve far more address space than they use).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 64, max = 16777216)))]
    pub address_space_mb: Option<u64>,
}

impl ResourceLimits {
    /// The limits of every process when neither the boot parameters nor the host set one.
    pub const DEFAULT: ResourceLimits = ResourceLimits {
        nofile: Some(1024),
        nproc: Some(1024),
        fsize_mb: Some(4096),
        address_space_mb: None,
    };
    /// Allowed values of [`ResourceLimits::nofile`] (the kernel's default `nr_open` caps it).
    pub const NOFILE_RANGE: RangeInclusive<u64> = 16..=1 << 20;
    /// Allowed values of [`ResourceLimits::nproc`] (the kernel's `PID_MAX_LIMIT`).
    pub const NPROC_RANGE: RangeInclusive<u64> = 16..=1 << 22;
    /// Allowed values of [`ResourceLimits::fsize_mb`] (up to 16 TiB).
    pub const FSIZE_MB_RANGE: RangeInclusive<u64> = 1..=1 << 24;
    /// Allowed values of [`ResourceLimits::address_space_mb`] (64 MiB to 16 TiB).
    pub const ADDRESS_SPACE_MB_RANGE: RangeInclusive<u64> = 64..=1 << 24;

    /// These limits with [`ResourceLimits::DEFAULT`] filled in where unset.
    pub fn or_default(self) -> ResourceLimits {
        let d = ResourceLimits::DEFAULT;
        ResourceLimits {
            nofile: self.nofile.or(d.nofile),
            nproc: self.nproc.or(d.nproc),
            fsize_mb: self.fsize_mb.or(d.fsize_mb),
            address_space_mb: self.address_space_mb.or(d.address_space_mb),
        }
    }

    /// Field-wise minimum: a limit set on either side holds; the smaller one if both are.
    pub fn narrow(self, other: ResourceLimits) -> ResourceLimits {
        fn min(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        ResourceLimits {
            nofile: min(self.nofile, other.nofile),
            nproc: min(self.nproc, other.nproc),
            fsize_mb: min(self.fsize_mb, other.fsize_mb),
            address_space_mb: min(self.address_space_mb, other.address_space_mb),
        }
    }

    /// `RLIMIT_FSIZE` in bytes (saturating: a huge value means unlimited).
    pub fn fsize_bytes(&self) -> Option<u64> {
        self.fsize_mb.map(|m| m.saturating_mul(1 << 20))
    }

    /// `RLIMIT_AS` in bytes (saturating: a huge value means unlimited).
    pub fn address_space_bytes(&self) -> Option<u64> {
        self.address_space_mb.map(|m| m.saturating_mul(1 << 20))
    }

    /// Checks every set value against its range; the error names the field and the range.
    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("nofile", self.nofile, Self::NOFILE_RANGE),
            ("nproc", self.nproc, Self::NPROC_RANGE),
            ("fsize_mb", self.fsize_mb, Self::FSIZE_MB_RANGE),
            (
                "address_space_mb",
                self.address_space_mb,
                Self::ADDRESS_SPACE_MB_RANGE,
            ),
        ];
        for (name, value, range) in fields {
            if let Some(v) = value.filter(|v| !range.contains(v)) {
                return Err(format!(
                    "limits.{name} is {v}, outside {}..={}",
                    range.start(),
                    range.end()
                ));
            }
        }
        Ok(())
    }
}

/// Security policy the guest enforces from the first accepted request on.
///
/// It is delivered in the boot parameters and/or the authenticated [`crate::Ping`]. A
/// handshake policy can only *narrow* what the boot parameters set (allowlists intersect,
/// limits take the minimum); defaults ([`ResourceLimits::DEFAULT`] and the guest's
/// timeouts) apply only where neither sets a value. The result holds for the lifetime of
/// the VM.
///
/// The allowlist governs what the guest agent itself executes (an `ExecRequest`'s or
/// `PtyOpen`'s program); a program outside it is refused with exit code 126 before anything
/// runs. It does not filter what an allowed program starts in turn: `sh -c "tr a-z A-Z"`
/// needs only `sh` on the list.
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

impl GuestPolicy {
    /// Checks what a guest can enforce: allowlist entries are bare names or absolute
    /// paths without whitespace or NUL ([`valid_allow_entry`]), limits are in range, timeouts
    /// and the concurrency cap are positive.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(bad) = self
            .allowlist
            .iter()
            .flatten()
            .find(|e| !valid_allow_entry(e))
        {
            return Err(format!(
                "allowlist entry `{}` must be a bare program name or an absolute path",
                bad.escape_debug()
            ));
        }
        self.rlimits.validate()?;
        if self.default_timeout_secs == Some(0) || self.max_timeout_secs == Some(0) {
            return Err("policy timeouts must be positive".into());
        }
        if self.max_concurrent_execs == Some(0) {
            return Err("max_concurrent_execs must be positive".into());
        }
        Ok(())
    }
}

/// `true` when `s` can be an allowlist entry: a non-empty bare program name or an absolute
/// path, without NUL or whitespace.
pub fn valid_allow_entry(s: &str) -> bool {
    !s.is_empty()
        && (s.starts_with('/') || !s.contains('/'))
        && !s.chars().any(|c| c == '\0' || c.is_whitespace())
}

/// [`GuestInfo::capabilities`] entry: the guest serves [`crate::Rekey`] in full — it reseeds
/// its kernel RNG and sets its clock before rotating the secret (always so in a VM).
pub const CAP_REKEY: &str = "rekey";

/// [`GuestInfo::capabilities`] entry of a guest agent running as a host process for tests
/// and configured so: [`crate::Rekey`] rotates the secret only (no RNG reseed, no clock).
pub const CAP_REKEY_SECRET_ONLY: &str = "rekey_secret_only";

/// [`GuestInfo::capabilities`] entry: the guest serves held execs ([`crate::ExecRequest::hold`],
/// [`crate::ExecAttach`], [`crate::HeldQuery`]).
pub const CAP_HELD: &str = "held_exec";

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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(nofile: u64, nproc: u64, fsize_mb: u64, as_mb: Option<u64>) -> ResourceLimits {
        ResourceLimits {
            nofile: Some(nofile),
            nproc: Some(nproc),
            fsize_mb: Some(fsize_mb),
            address_space_mb: as_mb,
        }
    }

    #[test]
    fn policy_serde_round_trip_uses_spec_field_names() {
        let p = GuestPolicy {
            allowlist: Some(vec!["sh".into(), "/opt/x/bin/run".into()]),
            rlimits: limits(256, 64, 10, Some(2048)),
            max_timeout_secs: Some(7200),
            ..GuestPolicy::default()
        };
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(
            json["rlimits"],
            serde_json::json!({"nofile": 256, "nproc": 64, "fsize_mb": 10, "address_space_mb": 2048})
        );
        let back: GuestPolicy = serde_json::from_value(json).unwrap();
        assert_eq!(back, p);
        // Unset limits are omitted and read back as unset.
        let empty = serde_json::to_string(&ResourceLimits::default()).unwrap();
        assert_eq!(empty, "{}");
        let l: ResourceLimits = serde_json::from_str(r#"{"nofile": 64}"#).unwrap();
        assert_eq!(l.nofile, Some(64));
        assert_eq!(l.nproc, None);
    }

    #[test]
    fn defaults_fill_only_unset_limits_and_narrowing_takes_the_minimum() {
        let l = ResourceLimits {
            nofile: Some(4096),
            ..ResourceLimits::default()
        };
        let d = l.or_default();
        assert_eq!(d.nofile, Some(4096));
        assert_eq!(d.nproc, ResourceLimits::DEFAULT.nproc);
        assert_eq!(d.fsize_mb, Some(4096));
        assert_eq!(d.address_space_mb, None);
        let n = limits(100, 50, 10, None).narrow(limits(200, 20, 10, Some(512)));
        assert_eq!(n, limits(100, 20, 10, Some(512)));
        assert_eq!(d.fsize_bytes(), Some(4096 << 20));
        assert_eq!(
            ResourceLimits {
                address_space_mb: Some(u64::MAX),
                ..ResourceLimits::default()
            }
            .address_space_bytes(),
            Some(u64::MAX)
        );
    }

    #[test]
    fn validation_names_the_field_and_the_range() {
        assert!(ResourceLimits::DEFAULT.validate().is_ok());
        assert!(ResourceLimits::default().validate().is_ok());
        let e = limits(8, 64, 1, None).validate().unwrap_err();
        assert!(
            e.contains("limits.nofile is 8") && e.contains("16..=1048576"),
            "{e}"
        );
        let e = limits(64, 64, 0, None).validate().unwrap_err();
        assert!(e.contains("fsize_mb"), "{e}");
        let e = limits(64, 64, 1, Some(1)).validate().unwrap_err();
        assert!(e.contains("address_space_mb is 1"), "{e}");
        let ok = GuestPolicy {
            allowlist: Some(vec!["sh".into(), "/usr/bin/env".into()]),
            ..GuestPolicy::default()
        };
        assert!(ok.validate().is_ok());
        for bad in ["", "a/b", "two words", "nul\0"] {
            let p = GuestPolicy {
                allowlist: Some(vec![bad.into()]),
                ..GuestPolicy::default()
            };
            assert!(p.validate().is_err(), "{bad:?} accepted");
        }
        let p = GuestPolicy {
            max_timeout_secs: Some(0),
            ..GuestPolicy::default()
        };
        assert!(p.validate().is_err());
    }
}
