//! Helpers shared by the VM benchmarks. Each bench binary compiles this module and uses a
//! subset of it.
#![allow(dead_code)]

use std::time::Duration;

/// `name` parsed from the environment, else `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// CPU, core count and what the KVM probe says about this host.
pub fn host_description() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let kvm = voidbox_vmm::probe::probe()
        .map(|r| {
            format!(
                "{} (≈{:.0} ns per guest-kernel instruction)",
                r.kind, r.cpl0_ns_per_insn
            )
        })
        .unwrap_or_else(|e| format!("probe failed: {e}"));
    format!("{cpu}, {n} CPUs, KVM: {kvm}")
}

/// A VM config of `memory_mb` for `image` whose VMM is this bench binary itself
/// (`<bench> __vmm …`, served by `vmm_process::run_vmm_mode` at the top of `main`).
pub fn self_vmm_config(
    image: voidbox::sandbox::GuestImage,
    memory_mb: u32,
    boot_timeout: Duration,
) -> voidbox::sandbox::SandboxConfig {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = voidbox::sandbox::SandboxConfig::new(image);
    cfg.memory_mb = memory_mb;
    cfg.boot_timeout = boot_timeout;
    cfg.launcher = voidbox::sandbox::VmmLauncher::Program {
        path: exe,
        args: vec![voidbox::sandbox::VMM_SUBCOMMAND.into()],
    };
    cfg
}

/// Creates the golden snapshot of `cfg` (one cold boot + the snapshot) in a private cache,
/// which lives as long as the returned directory.
pub fn private_golden(
    cfg: &voidbox::sandbox::SandboxConfig,
) -> (tempfile::TempDir, voidbox::snapshot::Lease) {
    use voidbox::snapshot::{ensure_golden, CreateOptions, GoldenSpec, Store};
    let cache = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = Store::open(Some(cache.path())).unwrap_or_else(|e| panic!("{e}"));
    let opts = CreateOptions {
        launcher: cfg.launcher.clone(),
        boot_timeout: cfg.boot_timeout,
        runtime_dir: None,
    };
    let lease = ensure_golden(&store, &GoldenSpec::of(cfg), &opts, u64::MAX, &|m| {
        eprintln!("{m}")
    })
    .unwrap_or_else(|e| panic!("golden snapshot: {e}"));
    (cache, lease)
}
