//! Helpers shared by the VM benchmarks.

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
