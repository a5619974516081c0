//! Typed errors of the sandbox layer.

use std::fmt;
use std::time::Duration;

use voidbox_protocol::{ErrorCode, ProtocolError};

/// Console lines quoted in an error message (the full tail stays in the value).
const QUOTED_TAIL_LINES: usize = 25;

/// How a VMM process ended, with what it reported.
#[derive(Debug, Clone, Default)]
pub struct VmmExit {
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Terminating signal, when it was killed.
    pub signal: Option<i32>,
    /// `reason` of the VMM's `exited` status event (`kernel_panic`, `boot_timeout`, …).
    pub reason: Option<String>,
    /// `detail` of the `exited` event.
    pub detail: Option<String>,
    /// Last guest console lines (from the `exited` event, else read from the console log).
    pub console_tail: Vec<String>,
    /// Last lines the VMM wrote to stderr (its own log).
    pub stderr_tail: Vec<String>,
    /// The NAT's final denial counts (empty without a network device).
    pub net_denials: Vec<voidbox_net::Denial>,
    /// Connections the NAT accepted on its published ports and sockets (a service's
    /// dependents' connections), as last reported (0 without a network device).
    pub net_inbound: u64,
}

impl VmmExit {
    /// `exit code 10 (kernel_panic)` / `killed by signal 9 (SIGKILL)`.
    pub fn status_text(&self) -> String {
        let base = match (self.code, self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by signal {s} ({})", signal_name(s)),
            (None, None) => "unknown status".to_string(),
        };
        match &self.reason {
            Some(r) => format!("{base}, {r}"),
            None => base,
        }
    }
}

impl fmt::Display for VmmExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VMM {}", self.status_text())?;
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        if !self.stderr_tail.is_empty() && self.console_tail.is_empty() {
            write!(f, "\n  VMM log:")?;
            for l in self.stderr_tail.iter().rev().take(5).rev() {
                write!(f, "\n    {l}")?;
            }
        }
        write_tail(f, &self.console_tail)
    }
}

fn write_tail(f: &mut fmt::Formatter<'_>, tail: &[String]) -> fmt::Result {
    if tail.is_empty() {
        return Ok(());
    }
    let skip = tail.len().saturating_sub(QUOTED_TAIL_LINES);
    write!(f, "\n  guest console (last {} lines):", tail.len() - skip)?;
    for l in &tail[skip..] {
        write!(f, "\n    {l}")?;
    }
    if let Some(why) = super::diagnose::diagnose(tail) {
        write!(f, "\n  likely cause: {why}")?;
    }
    Ok(())
}

/// The hint for a guest that printed nothing at all (a non-empty tail carries its own).
fn silent_hint(tail: &ConsoleTail) -> String {
    match super::diagnose::diagnose(&tail.0) {
        Some(why) if tail.0.is_empty() => format!("\n  likely cause: {why}"),
        _ => String::new(),
    }
}

/// Console tail wrapper so `thiserror` messages can quote it.
#[derive(Debug, Clone, Default)]
pub struct ConsoleTail(pub Vec<String>);

impl fmt::Display for ConsoleTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_tail(f, &self.0)
    }
}

/// Errors of [`crate::sandbox::Sandbox`].
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The host cannot run VMs: no `/dev/kvm`, no permission, no guest image, VMM not
    /// startable. The CLI maps it to exit code 3.
    #[error("{0}")]
    Environment(String),
    /// The VMM exited before the guest agent answered.
    #[error("the VM failed to boot: {0}")]
    BootFailed(Box<VmmExit>),
    /// The guest agent did not answer within the boot deadline (the VMM was killed).
    #[error("the guest agent was not ready within {}s{tail}{}", after.as_secs_f64(), silent_hint(tail))]
    BootTimeout {
        /// The deadline.
        after: Duration,
        /// Last console lines.
        tail: ConsoleTail,
    },
    /// The VMM died while the VM was in use.
    #[error("the VM died during {during}: {exit}")]
    VmmDied {
        /// What the host was doing (`exec`, `read_file`, …).
        during: String,
        /// How the VMM ended.
        exit: Box<VmmExit>,
    },
    /// The VMM refused to restore a snapshot (corrupt, mismatched or unreadable); no vCPU
    /// ran.
    #[error("snapshot refused: {0}")]
    SnapshotRefused(String),
    /// The VMM could not write a requested snapshot (the guest kept running).
    #[error("writing the snapshot failed: {0}")]
    SnapshotFailed(String),
    /// The VM's start was cancelled (the run is stopping).
    #[error("cancelled {0}")]
    Cancelled(String),
    /// The guest agent refused the session secret.
    #[error("the guest agent refused the session secret")]
    AuthRejected,
    /// The guest answered a request with an error.
    #[error("guest refused {what}: {code:?}: {message}")]
    Guest {
        /// The request.
        what: String,
        /// Error category.
        code: ErrorCode,
        /// Guest's message.
        message: String,
    },
    /// The guest broke the protocol (or the stream failed).
    #[error("guest connection ({during}): {source}")]
    Protocol {
        /// What the host was doing.
        during: String,
        /// The protocol error.
        source: ProtocolError,
    },
    /// A request got no answer in time.
    #[error("{0} got no answer within {1:?}")]
    Timeout(String, Duration),
    /// The VM's host directory shares cannot be used (see [`super::shares::check`]).
    #[error("{0}")]
    Share(String),
    /// Host-side I/O.
    #[error("{what}: {source}")]
    Io {
        /// What failed.
        what: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl SandboxError {
    /// Exit code for the CLI: 3 for environment problems (a refused snapshot included), 125
    /// for every other sandbox failure (the guest's own exit codes pass through unchanged).
    pub fn exit_code(&self) -> u8 {
        match self {
            // A snapshot the VMM refuses (corrupt, mismatched, its base missing or different)
            // is a problem of this host's cache, like a missing image.
            SandboxError::Environment(_) | SandboxError::SnapshotRefused(_) => 3,
            _ => 125,
        }
    }

    /// An [`SandboxError::Io`] constructor for `map_err`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SandboxError {
        let what = what.into();
        move |source| SandboxError::Io { what, source }
    }
}

/// Short name of a signal number.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSYS => "SIGSYS",
        _ => "signal",
    }
}

/// The shell-style exit code and message of the guest refusing to start `program`: 127 and
/// "cannot run" when it does not exist (`NotFound`: not on the guest's `PATH`, or not
/// executable), 126 when the guest policy refuses it (`NotAllowed`). `None` for any other
/// failure, which is the VM's (125).
pub fn refused_exec(program: &str, e: &SandboxError) -> Option<(u8, String)> {
    match e {
        SandboxError::Guest {
            what,
            code: ErrorCode::NotFound,
            message,
        } if what == "exec" || what == "pty_open" => {
            Some((127, format!("cannot run {program}: {message}")))
        }
        SandboxError::Guest {
            code: ErrorCode::NotAllowed,
            message,
            ..
        } => Some((
            126,
            format!("{program}: refused by the guest policy: {message}"),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_exec_codes() {
        let guest = |what: &str, code| SandboxError::Guest {
            what: what.into(),
            code,
            message: "program `nosuchcmd` not found in PATH (/usr/bin:/bin)".into(),
        };
        let (code, why) = refused_exec("nosuchcmd", &guest("exec", ErrorCode::NotFound)).unwrap();
        assert_eq!(code, 127);
        assert!(
            why.starts_with("cannot run nosuchcmd: program `nosuchcmd` not found"),
            "{why}"
        );
        assert_eq!(
            refused_exec("x", &guest("exec", ErrorCode::NotAllowed)).map(|r| r.0),
            Some(126)
        );
        assert_eq!(
            refused_exec("x", &guest("pty_open", ErrorCode::NotFound)).map(|r| r.0),
            Some(127)
        );
        // Anything else is the VM's failure (125), a missing file included.
        assert_eq!(
            refused_exec("x", &guest("read_file /a", ErrorCode::NotFound)),
            None
        );
        assert_eq!(refused_exec("x", &guest("exec", ErrorCode::Io)), None);
        assert_eq!(
            refused_exec("x", &SandboxError::Environment("no kvm".into())),
            None
        );
    }

    #[test]
    fn exit_text_quotes_console_tail() {
        let e = SandboxError::BootFailed(Box::new(VmmExit {
            code: Some(10),
            reason: Some("kernel_panic".into()),
            detail: Some("Kernel panic - not syncing".into()),
            console_tail: (0..40).map(|i| format!("line {i}")).collect(),
            ..VmmExit::default()
        }));
        let s = e.to_string();
        assert!(s.contains("exit code 10, kernel_panic"), "{s}");
        assert!(s.contains("line 39") && !s.contains("line 14\n"), "{s}");
        assert_eq!(e.exit_code(), 125);
        assert_eq!(SandboxError::Environment("x".into()).exit_code(), 3);
        let sys = VmmExit {
            signal: Some(libc::SIGSYS),
            ..VmmExit::default()
        };
        assert!(sys.status_text().contains("SIGSYS"));
    }
}
