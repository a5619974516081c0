//! Execution policy: command allowlist, resource limits and timeouts.
//!
//! The policy is fixed before the first request is served: it comes from the boot
//! parameters (or, on the host, the command line) and may only be *narrowed* by the
//! authenticated handshake. It is never read from a file that the host could write later.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use voidbox_protocol::{ErrorCode, GuestPolicy};

/// Search path used for bare program names of allowlist entries, and the default `PATH`
/// of every child.
pub const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

/// Default exec timeout when neither the policy nor the request names one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Hard cap on any exec timeout unless the policy sets its own.
pub const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// Resource limits applied to every child (`None` = inherit the agent's limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rlimits {
    /// `RLIMIT_NOFILE`: open file descriptors.
    pub nofile: Option<u64>,
    /// `RLIMIT_NPROC`: processes of uid 1000 (counted per user, not per exec).
    pub nproc: Option<u64>,
    /// `RLIMIT_FSIZE`: largest file a child may write, in bytes.
    pub fsize: Option<u64>,
    /// `RLIMIT_AS`: address-space size, in bytes.
    pub address_space: Option<u64>,
}

impl Rlimits {
    /// The limits every child gets when nothing else is configured.
    pub const DEFAULT: Rlimits = Rlimits {
        nofile: Some(1024),
        nproc: Some(1024),
        fsize: Some(4 << 30),
        address_space: None,
    };

    /// Field-wise minimum (a limit set on either side wins; the smaller one if both).
    pub fn narrow(self, other: Rlimits) -> Rlimits {
        fn min(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        Rlimits {
            nofile: min(self.nofile, other.nofile),
            nproc: min(self.nproc, other.nproc),
            fsize: min(self.fsize, other.fsize),
            address_space: min(self.address_space, other.address_space),
        }
    }
}

/// A partial policy as given by boot parameters, flags or the handshake.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySpec {
    /// Allowed programs: bare names (resolved through [`SYSTEM_PATH`]) or absolute paths.
    /// `None` = not specified.
    pub allow: Option<Vec<String>>,
    /// Resource limits; unset fields are not specified.
    pub rlimits: Rlimits,
    /// Default exec timeout.
    pub timeout: Option<Duration>,
    /// Largest timeout a request may ask for.
    pub max_timeout: Option<Duration>,
    /// Cap on stdout + stderr bytes streamed per exec.
    pub max_output_bytes: Option<u64>,
    /// Cap on execs/PTYs running at once.
    pub max_concurrent_execs: Option<u32>,
    /// Whether PTY sessions may be opened.
    pub allow_pty: Option<bool>,
}

impl PolicySpec {
    /// Converts the policy carried by the handshake.
    pub fn from_guest_policy(p: &GuestPolicy) -> PolicySpec {
        let secs = |s: Option<u64>| s.filter(|&s| s > 0).map(Duration::from_secs);
        PolicySpec {
            allow: p.allowlist.clone(),
            rlimits: Rlimits {
                nofile: p.rlimits.nofile,
                nproc: p.rlimits.nproc,
                fsize: p.rlimits.fsize,
                address_space: p.rlimits.as_bytes,
            },
            timeout: secs(p.default_timeout_secs),
            max_timeout: secs(p.max_timeout_secs),
            max_output_bytes: p.max_output_bytes,
            max_concurrent_execs: p.max_concurrent_execs,
            allow_pty: p.allow_pty,
        }
    }
}

/// Default cap on concurrently running execs/PTYs.
pub const DEFAULT_MAX_CONCURRENT: u32 = 64;

/// The effective policy enforced for every exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// `None` = every program may run; `Some(list)` = only these.
    allow: Option<Vec<String>>,
    /// Normalised absolute paths of the allowlist entries that exist.
    allowed_paths: Vec<PathBuf>,
    /// Limits applied to each child.
    pub rlimits: Rlimits,
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
        Policy::from_spec(&PolicySpec::default())
    }
}

impl Policy {
    /// Builds the effective policy from a spec, filling in defaults.
    pub fn from_spec(spec: &PolicySpec) -> Policy {
        let rlimits = Rlimits {
            nofile: spec.rlimits.nofile.or(Rlimits::DEFAULT.nofile),
            nproc: spec.rlimits.nproc.or(Rlimits::DEFAULT.nproc),
            fsize: spec.rlimits.fsize.or(Rlimits::DEFAULT.fsize),
            address_space: spec
                .rlimits
                .address_space
                .or(Rlimits::DEFAULT.address_space),
        };
        let max_timeout = spec.max_timeout.unwrap_or(DEFAULT_MAX_TIMEOUT);
        let default_timeout = spec.timeout.unwrap_or(DEFAULT_TIMEOUT).min(max_timeout);
        let mut p = Policy {
            allow: None,
            allowed_paths: Vec::new(),
            rlimits,
            default_timeout,
            max_timeout,
            max_output_bytes: spec.max_output_bytes,
            max_concurrent_execs: spec.max_concurrent_execs.unwrap_or(DEFAULT_MAX_CONCURRENT),
            allow_pty: spec.allow_pty.unwrap_or(true),
        };
        p.set_allow(spec.allow.clone());
        p
    }

    fn set_allow(&mut self, allow: Option<Vec<String>>) {
        self.allowed_paths = allow
            .iter()
            .flatten()
            .filter_map(|entry| resolve_program(entry, SYSTEM_PATH).ok())
            .collect();
        self.allow = allow;
    }

    /// Returns a policy that is at most as permissive as `self` and `spec` together:
    /// allowlists intersect, limits and timeouts take the minimum.
    pub fn narrow(&self, spec: &PolicySpec) -> Policy {
        let allow = match (&self.allow, &spec.allow) {
            (None, other) => other.clone(),
            (Some(mine), None) => Some(mine.clone()),
            (Some(mine), Some(theirs)) => {
                // Intersect by resolved path so `sh` and `/bin/sh` meet.
                let theirs_paths: Vec<PathBuf> = theirs
                    .iter()
                    .filter_map(|e| resolve_program(e, SYSTEM_PATH).ok())
                    .collect();
                Some(
                    mine.iter()
                        .filter(|e| {
                            resolve_program(e, SYSTEM_PATH)
                                .map(|p| theirs_paths.contains(&p))
                                .unwrap_or(false)
                        })
                        .cloned()
                        .collect(),
                )
            }
        };
        let max_timeout = spec
            .max_timeout
            .map_or(self.max_timeout, |t| t.min(self.max_timeout));
        let default_timeout = spec
            .timeout
            .map_or(self.default_timeout, |t| t.min(self.default_timeout))
            .min(max_timeout);
        let mut p = Policy {
            allow: None,
            allowed_paths: Vec::new(),
            rlimits: self.rlimits.narrow(spec.rlimits),
            default_timeout,
            max_timeout,
            max_output_bytes: match (self.max_output_bytes, spec.max_output_bytes) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            max_concurrent_execs: spec
                .max_concurrent_execs
                .map_or(self.max_concurrent_execs, |n| {
                    n.min(self.max_concurrent_execs)
                }),
            allow_pty: self.allow_pty && spec.allow_pty.unwrap_or(true),
        };
        p.set_allow(allow);
        p
    }

    /// The allowlist as configured (`None` = unrestricted).
    pub fn allowlist(&self) -> Option<&[String]> {
        self.allow.as_deref()
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
            if self.allow.is_some() && !self.is_listed_name(program) {
                (ErrorCode::NotAllowed, self.denial(program))
            } else {
                (ErrorCode::NotFound, e)
            }
        })?;
        if self.allow.is_some() && !self.allowed_paths.contains(&resolved) {
            return Err((ErrorCode::NotAllowed, self.denial(program)));
        }
        Ok(resolved)
    }

    fn is_listed_name(&self, program: &str) -> bool {
        self.allow.iter().flatten().any(|e| e == program)
    }

    fn denial(&self, program: &str) -> String {
        let list = self.allow.as_deref().unwrap_or_default();
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

/// `true` when `s` is a plausible program name for an allowlist entry.
pub fn valid_allow_entry(s: &str) -> bool {
    !s.is_empty()
        && !s.as_bytes().contains(&0)
        && (s.starts_with('/') || !s.contains('/'))
        && OsStr::new(s)
            .as_bytes()
            .iter()
            .all(|b| !b.is_ascii_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(list: &[&str]) -> Policy {
        Policy::from_spec(&PolicySpec {
            allow: Some(list.iter().map(|s| s.to_string()).collect()),
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
    fn unrestricted_without_allowlist() {
        let p = Policy::default();
        assert!(p.check_program("ls", SYSTEM_PATH).is_ok());
        assert!(p.check_program("relative/ls", SYSTEM_PATH).is_err());
    }

    #[test]
    fn narrowing_only_tightens() {
        let base = Policy::from_spec(&PolicySpec {
            allow: Some(vec!["sh".into(), "ls".into()]),
            rlimits: Rlimits {
                nofile: Some(100),
                ..Default::default()
            },
            timeout: Some(Duration::from_secs(10)),
            ..Default::default()
        });
        let n = base.narrow(&PolicySpec {
            allow: Some(vec!["/bin/sh".into(), "rm".into()]),
            rlimits: Rlimits {
                nofile: Some(1000),
                nproc: Some(5),
                ..Default::default()
            },
            timeout: Some(Duration::from_secs(60)),
            max_timeout: Some(Duration::from_secs(30)),
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
}
