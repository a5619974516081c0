//! `voidbox doctor`: what this host lacks for running pipelines, and how to fix it.
//!
//! Every check reports `ok`, `warn` or `fail`, a one-line finding and, when not ok, the fix.
//! Nothing here touches the network, boots a VM or builds anything; the one guest that runs
//! is the KVM probe's few-instruction real-mode loop ([`voidbox_vmm::probe`], milliseconds).
//! Exit code 0 when nothing fails (warnings allowed), 3 (environment) when a check fails.
//!
//! | check | module |
//! |---|---|
//! | `kvm`, `kvm-speed` | [`kvm`] |
//! | `guest-image`, `runtimes`, `snapshots`, `cache-writable`, `disk-space` | [`cache`] |
//! | `memory`, `vmm`, `tools-*`, `stale-run-dirs` | [`host`] |

pub mod cache;
pub mod host;
pub mod kvm;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use crate::image::Profile;
use crate::output::Format;

/// Every check's name, in report order.
pub const CHECK_NAMES: &[&str] = &[
    kvm::DEVICE,
    kvm::SPEED,
    cache::IMAGE,
    cache::RUNTIMES,
    cache::SNAPSHOTS,
    cache::WRITABLE,
    cache::DISK,
    host::MEMORY,
    host::VMM,
    host::TOOLS_IMAGE,
    host::TOOLS_OCI,
    host::TOOLS_RUNTIMES,
    host::TOOLS_GRAPHVIZ,
    host::STALE_DIRS,
];

/// Exit code when a check fails (the CLI's "environment" code).
pub const EXIT_FAILED: u8 = 3;

/// `voidbox doctor` arguments.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
}

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Nothing to do.
    Ok,
    /// Works, but slower, partly, or only after a download/build; or an optional feature
    /// is unavailable.
    Warn,
    /// Something voidbox needs is missing: VMs cannot run until it is fixed.
    Fail,
}

impl Status {
    /// The one-character mark of the human output.
    pub fn mark(self) -> char {
        match self {
            Status::Ok => '✓',
            Status::Warn => '!',
            Status::Fail => '✗',
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable name (one of [`CHECK_NAMES`]).
    pub name: &'static str,
    /// Verdict.
    pub status: Status,
    /// One line: what was found.
    pub detail: String,
    /// What to do about it (`None` when ok).
    pub fix: Option<String>,
}

impl Check {
    /// An ok finding.
    pub fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    /// A warning with its fix.
    pub fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// A failure with its fix.
    pub fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// The same finding with another status (the fix is kept).
    pub fn with_status(mut self, status: Status) -> Check {
        self.status = status;
        self
    }
}

/// Every check's finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// No check failed.
    pub ok: bool,
    /// The findings, in [`CHECK_NAMES`] order.
    pub checks: Vec<Check>,
}

impl Report {
    /// A report of `checks`.
    pub fn new(checks: Vec<Check>) -> Report {
        Report {
            ok: checks.iter().all(|c| c.status != Status::Fail),
            checks,
        }
    }

    /// 0 when nothing failed, else [`EXIT_FAILED`].
    pub fn exit_code(&self) -> u8 {
        if self.ok {
            0
        } else {
            EXIT_FAILED
        }
    }

    /// `{"ok": bool, "checks": [{"name", "status", "detail", "fix"}]}`, pretty-printed.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The human rendering: one line per check with its mark, the fix indented below it,
    /// and a summary line.
    pub fn to_human(&self) -> String {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!(
                "{} {:<width$}  {}\n",
                c.status.mark(),
                c.name,
                c.detail
            ));
            if let Some(fix) = &c.fix {
                out.push_str(&format!("  {:<width$}  fix: {fix}\n", ""));
            }
        }
        let count = |s| self.checks.iter().filter(|c| c.status == s).count();
        let (fails, warns) = (count(Status::Fail), count(Status::Warn));
        out.push('\n');
        out.push_str(&match (fails, warns) {
            (0, 0) => "all checks passed: this host can run voidbox pipelines".to_string(),
            (0, w) => format!(
                "no failures, {w} warning(s): voidbox can run here (see the warnings for what is slow or missing)"
            ),
            (f, w) => format!(
                "{f} check(s) failed, {w} warning(s): voidbox cannot run VMs here until the failures are fixed"
            ),
        });
        out.push('\n');
        out
    }
}

/// Runs every check against this host and the cache at `cache_root` (`Err`: no cache
/// location could be found, with why).
pub fn run_checks(cache_root: Result<PathBuf, String>) -> Report {
    let (device, usable) = kvm::device_check();
    let (speed, profile) = if usable {
        kvm::speed_check()
    } else {
        (kvm::speed_skipped(), None)
    };
    let build = host::BuildDeps::detect();
    let image = cache::image_check(&cache_root, profile, &build);
    let runtimes = cache::runtimes_check(&cache_root);
    let snapshots = cache::snapshots_check(&cache_root, image.current.as_deref());
    let pending = image.build_bytes + runtimes.build_bytes;
    let disk = cache::disk_check(&cache_root, pending);
    let checks = vec![
        device,
        speed,
        image.check,
        runtimes.check,
        snapshots,
        cache::writable_check(&cache_root),
        disk,
        host::memory_check(crate::apply::mem_available_mb()),
        host::vmm_check(),
        host::tools_image_check(&build, image.present),
        host::tools_oci_check(),
        host::tools_runtimes_check(),
        host::tools_graphviz_check(),
        host::stale_dirs_check(),
    ];
    Report::new(checks)
}

/// The profile the host needs, as the probe found it (`None`: unknown).
pub type HostProfile = Option<Profile>;

/// Runs `voidbox doctor`.
pub fn doctor_cmd(args: &DoctorArgs) -> ExitCode {
    let root = crate::image::Cache::default_root().map_err(|e| e.to_string());
    let report = run_checks(root);
    match args.format {
        Format::Json => println!("{}", report.to_json()),
        Format::Human => print!("{}", report.to_human()),
    }
    ExitCode::from(report.exit_code())
}
