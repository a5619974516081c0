//! The node runner's overhead: one node of `examples/fan-out.yaml` (`words`, one input) run
//! alone by `voidbox apply SPEC --node words --inputs DIR --outputs DIR`, as a distributed
//! engine runs it, against the same node inside a whole `voidbox apply`.
//!
//! `cargo bench -p voidbox --bench node_runner` (`VOIDBOX_BENCH_RUNS` rounds, default 5).
//! Needs `/dev/kvm` and the guest image. Per round: a whole `apply --output json
//! --max-parallel 1` (the node's `duration_ms` in its report, with no sibling on its cores), then the runner as a process (its wall time, and the node's
//! `duration_ms` in its own `report.json`). The peak resident memory of the runner process
//! and of its VMM child is read from `/proc/PID/status` (`VmHWM`) while they run.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{env_usize, host_description};
use serde_json::Value;

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox");

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn node_ms(report: &Value, name: &str) -> f64 {
    report["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["name"] == name))
        .and_then(|n| n["duration_ms"].as_f64())
        .unwrap_or_else(|| panic!("no duration for `{name}` in {report}"))
}

/// `VmHWM` of `pid` in KiB (0 once it is gone).
fn hwm_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Children of every thread of `pid` (the VMM is started from a tokio worker).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Runs the node runner; (wall ms, its report, peak KiB of the runner, of its VMM).
fn runner(spec: &Path, inputs: &Path, out: &Path) -> (f64, Value, u64, u64) {
    let t0 = Instant::now();
    let mut child = Command::new(VOIDBOX)
        .arg("apply")
        .arg(spec)
        .args(["--node", "words", "--inputs"])
        .arg(inputs)
        .arg("--outputs")
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("voidbox");
    let (mut own, mut vmm) = (0, 0);
    let status = loop {
        own = own.max(hwm_kb(child.id()));
        for c in children(child.id()) {
            vmm = vmm.max(hwm_kb(c));
        }
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall = t0.elapsed().as_secs_f64() * 1000.0;
    assert!(status.success(), "the node runner failed: {status}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report"))
            .expect("report json");
    (wall, report, own, vmm)
}

fn main() {
    let runs = env_usize("VOIDBOX_BENCH_RUNS", 5).max(1);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let spec = root.join("examples/fan-out.yaml");
    let dir = tempfile::tempdir().expect("tempdir");
    let inputs = dir.path().join("in");
    std::fs::create_dir_all(inputs.join("seed")).expect("inputs");
    std::fs::write(
        inputs.join("seed/output"),
        "the quick brown fox\njumps over the lazy dog\n",
    )
    .expect("seed output");
    let (mut inside, mut wall, mut alone, mut own_kb, mut vmm_kb) =
        (vec![], vec![], vec![], 0u64, 0u64);
    for round in 0..=runs {
        let out = Command::new(VOIDBOX)
            .arg("apply")
            .arg(&spec)
            // One node at a time: the node is timed without its siblings on the same cores.
            .args(["--output", "json", "--max-parallel", "1"])
            .stderr(Stdio::null())
            .output()
            .expect("voidbox apply");
        assert!(out.status.success(), "voidbox apply failed");
        let report: Value = serde_json::from_slice(&out.stdout).expect("report");
        let (w, r, own, vmm) = runner(&spec, &inputs, &dir.path().join(format!("out-{round}")));
        if round == 0 {
            continue; // warm-up: golden snapshot, page cache
        }
        inside.push(node_ms(&report, "words"));
        wall.push(w);
        alone.push(node_ms(&r, "words"));
        own_kb = own_kb.max(own);
        vmm_kb = vmm_kb.max(vmm);
    }
    let (i50, w50, a50) = (
        pct(&mut inside, 0.5),
        pct(&mut wall, 0.5),
        pct(&mut alone, 0.5),
    );
    println!(
        "node runner vs a node inside apply ({runs} rounds; {})",
        host_description()
    );
    println!("{:<52} {:>10}", "measure", "p50 ms");
    println!(
        "{:<52} {:>10.0}",
        "node `words` inside `voidbox apply` (duration_ms)", i50
    );
    println!(
        "{:<52} {:>10.0}",
        "node `words` in the runner's report (duration_ms)", a50
    );
    println!("{:<52} {:>10.0}", "runner process, start to exit", w50);
    println!(
        "{:<52} {:>10.0}",
        "overhead: runner process − node inside apply",
        w50 - i50
    );
    println!(
        "peak RSS: runner {} MiB, its VMM {} MiB (guest memory_mb 128)",
        own_kb.div_ceil(1024),
        vmm_kb.div_ceil(1024)
    );
}
