//! Host checks: memory for a default VM, and the host programs each feature needs, grouped
//! by feature (the lists are the features' own: [`deps::PACKAGES`], the OCI converter's
//! tools, the runtimes disk's Debian files).

use std::path::PathBuf;

use super::Check;
use crate::apply::{HOST_MARGIN_MB, VM_OVERHEAD_MB};
use crate::image::{deps, guest_agent};
use crate::limits::{DEFAULT_AGENT_MEMORY_MB, DEFAULT_RUN_MEMORY_MB};

/// Name of the memory check.
pub const MEMORY: &str = "memory";
/// Name of the image builder's packages check.
pub const TOOLS_IMAGE: &str = "tools-image-build";
/// Name of the OCI converter's tools check.
pub const TOOLS_OCI: &str = "tools-oci";
/// Name of the runtimes disk's Debian files check.
pub const TOOLS_RUNTIMES: &str = "tools-runtimes";
/// Name of the check that sweeps temporary directories left by dead runs.
pub const STALE_DIRS: &str = "stale-run-dirs";
/// Name of the check that says which VMM program VMs start with.
pub const VMM: &str = "vmm";
/// Name of the graphviz check.
pub const TOOLS_GRAPHVIZ: &str = "tools-graphviz";

/// What building the guest image needs from this host.
#[derive(Debug, Clone)]
pub struct BuildDeps {
    /// The builder's Debian packages that are not installed (`Err`: not a Debian host).
    pub missing: Result<Vec<&'static str>, String>,
    /// This process is root (the builder then installs missing packages with apt-get).
    pub root: bool,
    /// `apt-get` is on `PATH`.
    pub apt: bool,
    /// Where the guest agent comes from, or (why there is none, the fix).
    pub agent: Result<String, (String, String)>,
}

/// Whether `voidbox image build` (and so `apply`'s first run) can build the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Everything is here.
    Ready,
    /// The builder installs these packages itself first (root with apt-get; needs network).
    AfterApt(Vec<&'static str>),
    /// It cannot: why, and the fix.
    Blocked(String, String),
}

impl BuildDeps {
    /// This host's state (dpkg-query per package: ≈10 ms each).
    pub fn detect() -> BuildDeps {
        BuildDeps {
            missing: deps::missing_packages().map_err(|e| e.to_string()),
            root: deps::is_root(),
            apt: deps::which("apt-get").is_some(),
            agent: agent_source(),
        }
    }

    /// What the builder would do with this host.
    pub fn readiness(&self) -> Readiness {
        if let Err((why, fix)) = &self.agent {
            return Readiness::Blocked(why.clone(), fix.clone());
        }
        match &self.missing {
            Err(why) => Readiness::Blocked(
                why.clone(),
                "build the image on a Debian/Ubuntu host (or in a Debian container) and copy its \
                 ~/.cache/voidbox/images/<hash> directory here"
                    .into(),
            ),
            Ok(m) if m.is_empty() => Readiness::Ready,
            Ok(m) if self.root && self.apt => Readiness::AfterApt(m.clone()),
            Ok(m) => Readiness::Blocked(
                format!("missing build packages: {}", m.join(" ")),
                apt_install(m),
            ),
        }
    }
}

fn apt_install(pkgs: &[&str]) -> String {
    format!(
        "sudo apt-get install --no-install-recommends {}",
        pkgs.join(" ")
    )
}

/// The guest agent the builder would use, found the way [`guest_agent::resolve`] looks (without
/// building it).
fn agent_source() -> Result<String, (String, String)> {
    let fix = format!(
        "set {} to a static voidbox-guest-agent binary, or build voidbox from its source tree",
        guest_agent::AGENT_ENV
    );
    if let Some(p) = std::env::var_os(guest_agent::AGENT_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(format!("guest agent {}", p.display()))
        } else {
            Err((
                format!("{}={} does not exist", guest_agent::AGENT_ENV, p.display()),
                fix,
            ))
        };
    }
    if let Some(ws) = guest_agent::source_tree() {
        let cargo = std::env::var_os("CARGO").map(PathBuf::from);
        return if cargo.is_some_and(|c| c.is_file()) || deps::which("cargo").is_some() {
            Ok(format!(
                "guest agent built with cargo from {}",
                ws.display()
            ))
        } else {
            Err((
                format!(
                    "the guest agent is built from {} but cargo is not on PATH",
                    ws.display()
                ),
                format!("install Rust (https://rustup.rs), or {fix}"),
            ))
        };
    }
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(guest_agent::AGENT_PACKAGE)))
        .filter(|p| p.is_file())
        .map(|p| format!("guest agent {}", p.display()))
        .ok_or_else(|| ("no guest agent binary next to voidbox".to_string(), fix))
}

/// The image builder's Debian packages; `image_present`: a current image is cached, so
/// only a rebuild needs them.
pub fn tools_image_check(build: &BuildDeps, image_present: bool) -> Check {
    let n = deps::PACKAGES.len();
    let agent = build.agent.as_deref().unwrap_or("no guest agent");
    match build.readiness() {
        Readiness::Ready => Check::ok(
            TOOLS_IMAGE,
            format!("the image builder's {n} Debian packages are installed; {agent}"),
        ),
        Readiness::AfterApt(m) => Check::warn(
            TOOLS_IMAGE,
            format!(
                "missing build packages: {}; the image build installs them with apt-get first (needs network)",
                m.join(" ")
            ),
            apt_install(&m),
        ),
        Readiness::Blocked(why, fix) if image_present => Check::warn(
            TOOLS_IMAGE,
            format!("{why}: only rebuilding the (cached) guest image needs them"),
            fix,
        ),
        Readiness::Blocked(why, fix) => Check::fail(
            TOOLS_IMAGE,
            format!("{why}: the guest image cannot be built"),
            fix,
        ),
    }
}

/// `mkfs.erofs` under `fakeroot` converts pulled OCI images (`sandbox.image`, `voidbox
/// pull`) into disks.
pub fn tools_oci_check() -> Check {
    let missing: Vec<(String, String)> = [("fakeroot", "fakeroot"), ("mkfs.erofs", "erofs-utils")]
        .into_iter()
        .filter_map(
            |(tool, pkg)| match voidbox_oci::erofs::find_tool(tool, pkg) {
                Ok(_) => None,
                Err(_) => Some((tool.to_string(), pkg.to_string())),
            },
        )
        .collect();
    if missing.is_empty() {
        return Check::ok(
            TOOLS_OCI,
            "fakeroot and mkfs.erofs found: OCI images (`sandbox.image`, `voidbox pull`) can be converted",
        );
    }
    let tools: Vec<&str> = missing.iter().map(|(t, _)| t.as_str()).collect();
    let pkgs: Vec<&str> = missing.iter().map(|(_, p)| p.as_str()).collect();
    Check::warn(
        TOOLS_OCI,
        format!(
            "{} not found: OCI images (`sandbox.image`, `voidbox pull`) are unavailable",
            tools.join(", ")
        ),
        apt_install(&pkgs),
    )
}

/// Debian's musl and bash-static, which the runtimes disk (Claude Code, Codex) ships.
pub fn tools_runtimes_check() -> Check {
    use crate::runtimes::{BASH_PACKAGE, BASH_STATIC, MUSL_LIBC, MUSL_PACKAGE};
    if crate::runtimes::current_key().is_some() {
        return Check::ok(
            TOOLS_RUNTIMES,
            format!(
                "{MUSL_PACKAGE} and {BASH_PACKAGE} installed: the agent runtimes disk can be built"
            ),
        );
    }
    let missing: Vec<&str> = [(MUSL_PACKAGE, MUSL_LIBC), (BASH_PACKAGE, BASH_STATIC)]
        .into_iter()
        .filter(|(pkg, file)| {
            deps::installed_version(pkg).is_none() || !std::path::Path::new(file).is_file()
        })
        .map(|(pkg, _)| pkg)
        .collect();
    let missing = if missing.is_empty() {
        vec![MUSL_PACKAGE, BASH_PACKAGE]
    } else {
        missing
    };
    Check::warn(
        TOOLS_RUNTIMES,
        format!(
            "{} not installed: agent nodes running Claude Code or Codex are unavailable",
            missing.join(", ")
        ),
        apt_install(&missing),
    )
}

/// graphviz `dot`, to render `voidbox graph --format dot` (optional).
pub fn tools_graphviz_check() -> Check {
    match deps::which("dot") {
        Some(p) => Check::ok(
            TOOLS_GRAPHVIZ,
            format!(
                "{} found: `voidbox graph --format dot | dot -Tsvg` renders DAGs",
                p.display()
            ),
        ),
        None => Check::warn(
            TOOLS_GRAPHVIZ,
            "graphviz `dot` not found (optional): `voidbox graph --format dot` output cannot be rendered to an image here",
            "sudo apt-get install graphviz",
        ),
    }
}

/// MemAvailable (MiB; `None`: unreadable) against the VMs `apply` and `run` start by
/// default, with the same margin and per-VM overhead as `apply`'s memory budget.
pub fn memory_check(available_mb: Option<u64>) -> Check {
    let Some(avail) = available_mb else {
        return Check::warn(
            MEMORY,
            "cannot read MemAvailable from /proc/meminfo",
            "run on Linux with /proc mounted",
        );
    };
    let budget = avail.saturating_sub(HOST_MARGIN_MB);
    // One default for `run` and command nodes; agent nodes default to more.
    let default_vm = u64::from(DEFAULT_RUN_MEMORY_MB) + VM_OVERHEAD_MB;
    let agent_vm = DEFAULT_AGENT_MEMORY_MB + VM_OVERHEAD_MB;
    if budget < default_vm {
        Check::fail(
            MEMORY,
            format!(
                "{avail} MiB available: not even a default {DEFAULT_RUN_MEMORY_MB} MiB VM fits \
                 ({default_vm} MiB with overhead, after a {HOST_MARGIN_MB} MiB host margin)"
            ),
            "free memory (stop other programs) or use a host with more RAM",
        )
    } else if budget < agent_vm {
        Check::warn(
            MEMORY,
            format!(
                "{avail} MiB available: room for {} default VM(s) ({DEFAULT_RUN_MEMORY_MB} MiB), but \
                 not for an agent node with its default {DEFAULT_AGENT_MEMORY_MB} MiB ({agent_vm} MiB \
                 with overhead, after a {HOST_MARGIN_MB} MiB host margin)",
                budget / default_vm
            ),
            format!(
                "give agent nodes a smaller `sandbox.memory_mb` (at most {} here), or free memory",
                budget - VM_OVERHEAD_MB
            ),
        )
    } else {
        Check::ok(
            MEMORY,
            format!(
                "{avail} MiB available: room for {} default VM(s) ({DEFAULT_RUN_MEMORY_MB} MiB) or {} \
                 agent VM(s) ({DEFAULT_AGENT_MEMORY_MB} MiB) at once",
                budget / default_vm,
                budget / agent_vm
            ),
        )
    }
}

/// Removes the temporary directories of runs that died without cleaning up (a SIGKILLed
/// `apply`), as every `apply`/`run` does at its start ([`crate::sandbox::rundir::sweep`]).
pub fn stale_dirs_check() -> Check {
    stale_dirs_verdict(&crate::sandbox::rundir::sweep())
}

/// The verdict on what a sweep found.
pub fn stale_dirs_verdict(swept: &[crate::sandbox::rundir::Stale]) -> Check {
    let failed: Vec<String> = swept
        .iter()
        .filter(|s| s.removed.is_err())
        .map(crate::sandbox::rundir::describe)
        .collect();
    if let Some(first) = failed.first() {
        return Check::warn(
            STALE_DIRS,
            format!("{} left by dead runs: {first}", failed.len()),
            "remove it by hand (no run uses it: its lock is free)",
        );
    }
    match swept.len() {
        0 => Check::ok(STALE_DIRS, "no temporary directory left by a dead run"),
        n => Check::ok(
            STALE_DIRS,
            format!(
                "removed {n} temporary director{} left by dead runs: {}",
                if n == 1 { "y" } else { "ies" },
                swept
                    .iter()
                    .map(|s| s.path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
    }
}

/// Which VMM program VMs start with ([`crate::sandbox::vmm_process::vmm_program`]), and
/// whether a standalone one is from this build (a mismatch fails: every VM launch would be
/// refused).
pub fn vmm_check() -> Check {
    use crate::sandbox::vmm_process::{check_same_build, vmm_program, VmmProgram};
    let program = match vmm_program() {
        Ok(p) => p,
        Err(e) => return Check::fail(VMM, e.to_string(), "reinstall voidbox"),
    };
    let VmmProgram::Standalone { path, from_env } = &program else {
        return Check::ok(VMM, program.describe());
    };
    match check_same_build(path, *from_env) {
        Ok(()) => Check::ok(
            VMM,
            format!(
                "{}, build {}",
                program.describe(),
                voidbox_vmm::build_id::build_id()
            ),
        ),
        Err(e) => Check::fail(
            VMM,
            e.to_string(),
            format!(
                "install voidbox and voidbox-vmm from one release, or remove {}",
                path.display()
            ),
        ),
    }
}
