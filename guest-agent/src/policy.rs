//! Execution policy: command allowlist, resource limits and timeouts.
//!
//! The policy is fixed before the first request is served: it comes from the boot
//! parameters (or, on the host, the command line) and may only be *narrowed* by the
//! authenticated handshake. It is never read from a file that the host could write later.
//! Its one wire/config type is [`GuestPolicy`] (from `voidbox-protocol`, shared with the
//! engine); [`Policy`] is the compiled form: defaults filled in, allowlist resolved.
//!
//! The allowlist governs what the agent itself executes. Children of an allowed program
//! are not filtered: `sh -c "tr a-z A-Z"` needs only `sh` on the list.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use voidbox_protocol::valid_allow_entry;
use voidbox_protocol::{ErrorCode, GuestPolicy, ResourceLimits};

/// Search path used for bare program names of allowlist entries, and the default `PATH`
/// of every child.
pub const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

/// Default exec timeout when neither the policy nor the request names one.
pub const DEFAULT_TIMEOUT: Duration =
    Duration::from_secs(voidbox_protocol::DEFAULT_EXEC_TIMEOUT_SECS);

/// Hard cap on any exec timeout unless the policy sets its own: the spec schema's maximum
/// `timeout_secs`, so a timeout `validate` accepts is never clamped.
pub const DEFAULT_MAX_TIMEOUT: Duration =
    Duration::from_secs(voidbox_protocol::MAX_EXEC_TIMEOUT_SECS);

/// Default cap on concurrently running execs/PTYs.
pub const DEFAULT_MAX_CONCURRENT: u32 = 64;

/// The effective policy enforced for every exec, compiled from a [`GuestPolicy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// What was explicitly set (boot parameters, narrowed by handshakes); defaults are not
    /// part of it, so a later handshake may still set a value the boot parameters left open.
    spec: GuestPolicy,
    /// Limits applied to each child ([`ResourceLimits::DEFAULT`] where unset).
    pub rlimits: ResourceLimits,
    /// Timeout used when the request gives none.
    pub default_timeout: Duration,
    /// Cap on requested timeouts.
    pub max_timeout: Duration,
    /// Cap on streamed output bytes per exec (`None` = unlimited).
    pub max_output_bytes: Option<u64>,
    /// Cap on execs/PTYs running at once.
    pub max_concurrent_execs: u32,
    /// Whether PTY sessions may be opened.
    pub allow_pty: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::from_spec(&GuestPolicy::default())
    }
}

impl Policy {
    /// Builds the effective policy from a spec, filling in defaults.
    pub fn from_spec(spec: &GuestPolicy) -> Policy {
        let secs = |s: Option<u64>| s.filter(|&s| s > 0).map(Duration::from_secs);
        let max_timeout = secs(spec.max_timeout_secs).unwrap_or(DEFAULT_MAX_TIMEOUT);
        let default_timeout = secs(spec.default_timeout_secs)
            .unwrap_or(DEFAULT_TIMEOUT)
            .min(max_timeout);
        Policy {
            spec: spec.clone(),
            rlimits: spec.rlimits.or_default(),
            default_timeout,
            max_timeout,
            max_output_bytes: spec.max_output_bytes,
            max_concurrent_execs: spec.max_concurrent_execs.unwrap_or(DEFAULT_MAX_CONCURRENT),
            allow_pty: spec.allow_pty.unwrap_or(true),
        }
    }

    /// Returns a policy that is at most as permissive as `self` and `other` together:
    /// allowlists intersect, limits and timeouts take the minimum of what either sets.
    /// Defaults fill in only what neither sets.
    pub fn narrow(&self, other: &GuestPolicy) -> Policy {
        let mine = &self.spec;
        let allowlist = match (&mine.allowlist, &other.allowlist) {
            (None, theirs) => theirs.clone(),
            (Some(mine), None) => Some(mine.clone()),
            (Some(mine), Some(theirs)) => {
                // Intersect by name and by resolved path so `sh` and `/bin/sh` meet.
                let theirs_paths: Vec<PathBuf> = theirs
                    .iter()
                    .filter_map(|e| resolve_program(e, SYSTEM_PATH).ok())
                    .collect();
                Some(
                    mine.iter()
                        .filter(|e| {
                            theirs.contains(e)
                                || resolve_program(e, SYSTEM_PATH)
                                    .map(|p| theirs_paths.contains(&p))
                                    .unwrap_or(false)
                        })
                        .cloned()
                        .collect(),
                )
            }
        };
        fn min<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        let pos = |s: Option<u64>| s.filter(|&s| s > 0);
        Policy::from_spec(&GuestPolicy {
            allowlist,
            rlimits: mine.rlimits.narrow(other.rlimits),
            default_timeout_secs: min(
                pos(mine.default_timeout_secs),
                pos(other.default_timeout_secs),
            ),
            max_timeout_secs: min(pos(mine.max_timeout_secs), pos(other.max_timeout_secs)),
            max_output_bytes: min(mine.max_output_bytes, other.max_output_bytes),
            max_concurrent_execs: min(mine.max_concurrent_execs, other.max_concurrent_execs),
            allow_pty: match (mine.allow_pty, other.allow_pty) {
                (Some(a), Some(b)) => Some(a && b),
                (a, b) => a.or(b),
            },
        })
    }

    /// The allowlist as configured (`None` = unrestricted).
    pub fn allowlist(&self) -> Option<&[String]> {
        self.spec.allowlist.as_deref()
    }

    /// Resolves `program` (bare names through `search_path`) and checks it against the
    /// allowlist. Returns the absolute path to execute, or the error code and message to
    /// answer with (`NotAllowed` names the program and the allowlist).
    pub fn check_program(
        &self,
        program: &str,
        search_path: &str,
    ) -> Result<PathBuf, (ErrorCode, String)> {
        if program.is_empty() || program.as_bytes().contains(&0) {
            return Err((
                ErrorCode::InvalidRequest,
                "empty program name or NUL byte in it".into(),
            ));
        }
        if program.contains('/') && !program.starts_with('/') {
            return Err((
                ErrorCode::InvalidRequest,
                format!("program `{program}` must be a bare name or an absolute path"),
            ));
        }
        let resolved = resolve_program(program, search_path).map_err(|e| {
            if self.spec.allowlist.is_some() && !self.is_listed_name(program) {
                (ErrorCode::NotAllowed, self.denial(program))
            } else {
                (ErrorCode::NotFound, e)
            }
        })?;
        if self.spec.allowlist.is_some() && !self.allows(&resolved) {
            return Err((ErrorCode::NotAllowed, self.denial(program)));
        }
        Ok(resolved)
    }

    /// Whether an allowlist entry resolves to `resolved`. Entries are resolved now, not when
    /// the policy arrived, so a listed program that appears later (an input, a mount) runs.
    fn allows(&self, resolved: &Path) -> bool {
        self.spec
            .allowlist
            .iter()
            .flatten()
            .any(|e| resolve_program(e, SYSTEM_PATH).is_ok_and(|p| p == resolved))
    }

    fn is_listed_name(&self, program: &str) -> bool {
        self.spec.allowlist.iter().flatten().any(|e| e == program)
    }

    fn denial(&self, program: &str) -> String {
        let list = self.spec.allowlist.as_deref().unwrap_or_default();
        if list.is_empty() {
            format!("program `{program}` is not allowed: the command allowlist is empty")
        } else {
            format!(
                "program `{program}` is not in the command allowlist (allowed: {})",
                list.join(", ")
            )
        }
    }

    /// The timeout for a request that asked for `requested` (capped by the policy).
    pub fn timeout_for(&self, requested: Option<Duration>) -> Duration {
        match requested {
            Some(t) if !t.is_zero() => t.min(self.max_timeout),
            _ => self.default_timeout,
        }
    }
}

/// Resolves a program to a normalised absolute path: names containing `/` must be
/// absolute; bare names are searched in `search_path`. The directory part is
/// canonicalised (so `/bin/sh` and `/usr/bin/sh` agree on merged-/usr systems) but the
/// file name is kept, because multi-call binaries (busybox) dispatch on it.
pub fn resolve_program(program: &str, search_path: &str) -> Result<PathBuf, String> {
    if program.contains('/') {
        let p = Path::new(program);
        if !p.is_absolute() {
            return Err(format!(
                "program `{program}` must be a bare name or an absolute path"
            ));
        }
        if !is_executable(p) {
            return Err(format!("program `{program}` not found or not executable"));
        }
        return normalise(p).ok_or_else(|| format!("program `{program}` not found"));
    }
    for dir in search_path.split(':').filter(|d| d.starts_with('/')) {
        let candidate = Path::new(dir).join(program);
        if is_executable(&candidate) {
            if let Some(p) = normalise(&candidate) {
                return Ok(p);
            }
        }
    }
    Err(format!(
        "program `{program}` not found in PATH ({search_path})"
    ))
}

fn normalise(p: &Path) -> Option<PathBuf> {
    let name = p.file_name()?;
    if name == OsStr::new("..") || name == OsStr::new(".") {
        return None;
    }
    let dir = p.parent()?.canonicalize().ok()?;
    Some(dir.join(name))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(p) {
        Ok(m) => m.is_file() && m.permissions().mode() & 0o111 != 0,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(list: &[&str]) -> Policy {
        Policy::from_spec(&GuestPolicy {
            allowlist: Some(list.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        })
    }

    #[test]
    fn allowlist_by_name_and_path() {
        let p = allow(&["sh", "/bin/cat"]);
        assert!(p.check_program("sh", SYSTEM_PATH).is_ok());
        assert!(p.check_program("/bin/sh", SYSTEM_PATH).is_ok());
        assert!(p.check_program("cat", SYSTEM_PATH).is_ok());
        let (code, err) = p.check_program("rm", SYSTEM_PATH).unwrap_err();
        assert_eq!(code, ErrorCode::NotAllowed);
        assert!(
            err.contains("`rm`") && err.contains("sh, /bin/cat"),
            "{err}"
        );
        let (_, err) = p.check_program("nonexistent-xyz", SYSTEM_PATH).unwrap_err();
        assert!(err.contains("allowlist"), "{err}");
        // A look-alike found through a different PATH is not the allowed program.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("sh");
        std::fs::write(&fake, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().to_str().unwrap();
        assert!(p.check_program("sh", path).is_err());
        assert!(p
            .check_program(fake.to_str().unwrap(), SYSTEM_PATH)
            .is_err());
    }

    #[test]
    fn entries_resolve_when_checked_not_when_set() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("tool");
        let p = allow(&[tool.to_str().unwrap()]);
        let (code, _) = p
            .check_program(tool.to_str().unwrap(), SYSTEM_PATH)
            .unwrap_err();
        assert_eq!(code, ErrorCode::NotFound);
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(p.check_program(tool.to_str().unwrap(), SYSTEM_PATH).is_ok());
    }

    #[test]
    fn unrestricted_without_allowlist() {
        let p = Policy::default();
        assert!(p.check_program("ls", SYSTEM_PATH).is_ok());
        assert!(p.check_program("relative/ls", SYSTEM_PATH).is_err());
    }

    #[test]
    fn narrowing_only_tightens() {
        let base = Policy::from_spec(&GuestPolicy {
            allowlist: Some(vec!["sh".into(), "ls".into()]),
            rlimits: ResourceLimits {
                nofile: Some(100),
                ..Default::default()
            },
            default_timeout_secs: Some(10),
            ..Default::default()
        });
        let n = base.narrow(&GuestPolicy {
            allowlist: Some(vec!["/bin/sh".into(), "rm".into()]),
            rlimits: ResourceLimits {
                nofile: Some(1000),
                nproc: Some(5),
                ..Default::default()
            },
            default_timeout_secs: Some(60),
            max_timeout_secs: Some(30),
            allow_pty: Some(false),
            ..Default::default()
        });
        assert!(!n.allow_pty && base.allow_pty);
        assert_eq!(n.allowlist(), Some(&["sh".to_string()][..]));
        assert_eq!(n.rlimits.nofile, Some(100));
        assert_eq!(n.rlimits.nproc, Some(5));
        assert_eq!(n.default_timeout, Duration::from_secs(10));
        assert_eq!(
            n.timeout_for(Some(Duration::from_secs(100))),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn defaults_are_not_ceilings() {
        // Nothing set at boot: the handshake may raise a limit above the default, and may
        // allow a timeout longer than the default cap.
        let p = Policy::default();
        assert_eq!(p.rlimits, ResourceLimits::DEFAULT);
        let n = p.narrow(&GuestPolicy {
            rlimits: ResourceLimits {
                nofile: Some(65536),
                address_space_mb: Some(2048),
                ..Default::default()
            },
            max_timeout_secs: Some(7200),
            ..Default::default()
        });
        assert_eq!(n.rlimits.nofile, Some(65536));
        assert_eq!(n.rlimits.nproc, ResourceLimits::DEFAULT.nproc);
        assert_eq!(n.rlimits.address_space_mb, Some(2048));
        assert_eq!(
            n.timeout_for(Some(Duration::from_secs(5000))),
            Duration::from_secs(5000)
        );
        // What the boot parameters set stays a ceiling.
        let boot = Policy::from_spec(&GuestPolicy {
            rlimits: ResourceLimits {
                nofile: Some(64),
                ..Default::default()
            },
            ..Default::default()
        });
        let n = boot.narrow(&GuestPolicy {
            rlimits: ResourceLimits {
                nofile: Some(65536),
                ..Default::default()
            },
            ..Default::default()
        });
        assert_eq!(n.rlimits.nofile, Some(64));
    }
}
