//! `voidbox apply` overheads.
//!
//! `cargo bench -p voidbox --bench apply`. Part 1 (always): the real scheduler with a fake
//! executor that does nothing — the engine's own cost per node (scheduling, data passing,
//! merging, blocking-pool hand-off). Part 2 (needs `/dev/kvm` and the guest image; skipped
//! with `VOIDBOX_BENCH_SKIP_VMS=1`): real VMs — host time around each node (everything
//! but boot and command), and an N-wide fan_out against N sequential nodes
//! (`VOIDBOX_BENCH_WIDTH`, default 2). This binary doubles as its own VMM.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use voidbox::apply::cancel::NodeControl;
use voidbox::apply::executor::VmExecutor;
use voidbox::apply::progress::Silent;
use voidbox::apply::scheduler::{run_plan, Attempt, Executor, Job, RunResult, SchedOptions};
use voidbox::apply::{run_with_signals, VM_OVERHEAD_MB};
use voidbox::image::ProgressMode;
use voidbox::plan::Plan;
use voidbox::sandbox::{vmm_process, GuestImage, VmmLauncher, VMM_SUBCOMMAND};

struct Nothing;

impl Executor for Nothing {
    fn run(&self, job: &Job, _: &NodeControl) -> Attempt {
        Attempt::ok(job.input.stdin.clone().unwrap_or_else(|| b"1\n".to_vec()))
    }
}

fn plan(src: &str) -> Plan {
    let v = voidbox::validate::validate_source("bench.yaml", src.to_string(), Path::new("."));
    let spec = v
        .spec
        .unwrap_or_else(|| panic!("{:?}", v.report.diagnostics));
    Plan::compile(&spec, Path::new(".")).unwrap_or_else(|e| panic!("{e}"))
}

/// `width` parallel `cat` boxes fed by a seed and collected by one box.
fn fan_out_spec(width: usize, memory_mb: u64) -> String {
    let mut boxes = String::from("    - name: seed\n      run: {program: echo, args: [\"1\"]}\n");
    let mut names = Vec::new();
    for i in 0..width {
        boxes.push_str(&format!("    - name: b{i}\n      run: {{program: cat}}\n"));
        names.push(format!("b{i}"));
    }
    boxes.push_str("    - name: collect\n      run: {program: cat}\n");
    format!(
        "api_version: v1\nkind: pipeline\nname: fan\nsandbox: {{memory_mb: {memory_mb}}}\npipeline:\n  boxes:\n{boxes}  stages:\n    - {{type: box, name: seed}}\n    - {{type: fan_out, boxes: [{}]}}\n    - {{type: box, name: collect}}\n",
        names.join(", ")
    )
}

/// `n` sequential `cat` boxes.
fn chain_spec(n: usize, memory_mb: u64) -> String {
    let mut boxes = String::new();
    for i in 0..n {
        boxes.push_str(&format!("    - name: s{i}\n      run: {{program: cat}}\n"));
    }
    format!("api_version: v1\nkind: pipeline\nname: chain\nsandbox: {{memory_mb: {memory_mb}}}\npipeline:\n  boxes:\n{boxes}")
}

fn opts(max_parallel: usize) -> SchedOptions {
    SchedOptions {
        max_parallel,
        memory_budget_mb: u64::MAX / 2,
        vm_overhead_mb: VM_OVERHEAD_MB,
        max_output: 16 << 20,
        retry_base: Duration::from_secs(1),
        run_input: Some(b"{\"x\": 1}".to_vec()),
    }
}

fn fake_run(p: &Arc<Plan>, max_parallel: usize) -> Duration {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let t0 = Instant::now();
    let (_tx, rx) = tokio::sync::watch::channel(None);
    let r = rt.block_on(run_plan(
        p.clone(),
        Arc::new(Nothing),
        opts(max_parallel),
        Arc::new(Silent),
        rx,
    ));
    assert!(r.success());
    t0.elapsed()
}

fn part1() {
    println!("## engine overhead per node (real scheduler, executor that does nothing)\n");
    println!("| plan | nodes | runs | median total | per node |");
    println!("|---|---:|---:|---:|---:|");
    for (name, src, par) in [
        ("chain of 100", chain_spec(100, 128), 1),
        ("fan_out 100 wide", fan_out_spec(100, 128), 16),
        ("fan_out 1000 wide", fan_out_spec(1000, 128), 16),
    ] {
        let p = Arc::new(plan(&src));
        let nodes = p.graph.node_count();
        let mut v: Vec<Duration> = (0..9).map(|_| fake_run(&p, par)).collect();
        v.sort();
        let med = v[v.len() / 2];
        println!(
            "| {name} | {nodes} | {} | {:.2} ms | {:.1} µs |",
            v.len(),
            med.as_secs_f64() * 1e3,
            med.as_secs_f64() * 1e6 / nodes as f64
        );
    }
    println!();
}

fn vm_run(exec: &Arc<VmExecutor>, src: &str, max_parallel: usize) -> RunResult {
    let p = Arc::new(plan(src));
    let r = run_with_signals(p, exec.clone(), opts(max_parallel), Arc::new(Silent))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.success(), "{r:?}");
    r
}

fn part2() {
    let image = GuestImage::ensure(ProgressMode::Plain).unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let exec = Arc::new(VmExecutor {
        node_vms: Default::default(),
        image,
        launcher: VmmLauncher::Program {
            path: exe,
            args: vec![VMM_SUBCOMMAND.into()],
        },
        boot_timeout: Duration::from_secs(300),
        logs_dir: logs.path().to_path_buf(),
        runtime_dir: None,
        spec_dir: ".".into(),
        remotes: Default::default(),
        guest_telemetry: false,
        kill_children_on_abort: false,
        snapshots: voidbox::snapshot::Snapshots::new(
            false,
            voidbox::snapshot::CreateOptions {
                launcher: VmmLauncher::CurrentExe,
                boot_timeout: Duration::from_secs(300),
                runtime_dir: None,
            },
            ".".into(),
            Arc::new(|m: &str| eprintln!("{m}")),
        )
        .unwrap_or_else(|e| panic!("{e}")),
        dns_upstreams: Vec::new(),
        endpoints: Default::default(),
    });
    let width = std::env::var("VOIDBOX_BENCH_WIDTH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2usize)
        .max(1);
    let seq = vm_run(&exec, &chain_spec(width, 128), 1);
    let fan = vm_run(&exec, &fan_out_spec(width, 128), width);
    println!("## host time around real nodes (128 MiB, 1 vCPU)\n");
    println!("| node | boot | command | host overhead (rest) | total |");
    println!("|---|---:|---:|---:|---:|");
    let mut over = Vec::new();
    for (r, p) in [
        (&seq, plan(&chain_spec(width, 128))),
        (&fan, plan(&fan_out_spec(width, 128))),
    ] {
        for (n, rec) in p.graph.node_weights().zip(&r.nodes) {
            let a = rec.last.as_ref();
            let boot = a.and_then(|a| a.boot).unwrap_or_default();
            let cmd = a.and_then(|a| a.exec).unwrap_or_default();
            let total = rec.duration.unwrap_or_default();
            let rest = total.saturating_sub(boot + cmd);
            over.push(rest);
            println!(
                "| {}/{} | {:.2} s | {:.0} ms | {:.0} ms | {:.2} s |",
                p.name,
                n.name,
                boot.as_secs_f64(),
                cmd.as_secs_f64() * 1e3,
                rest.as_secs_f64() * 1e3,
                total.as_secs_f64()
            );
        }
    }
    over.sort();
    println!(
        "\nmedian host overhead per node: {:.0} ms\n",
        over[over.len() / 2].as_secs_f64() * 1e3
    );
    // Compare like with like: the fan_out run has a seed and a collect around its branches.
    let branch_wall = {
        let nodes = &fan.nodes[1..=width];
        let start = nodes
            .iter()
            .filter_map(|n| n.started)
            .min()
            .unwrap_or_default();
        let end = nodes
            .iter()
            .filter_map(|n| Some(n.started? + n.duration?))
            .max()
            .unwrap_or_default();
        end.saturating_sub(start)
    };
    println!("## {width}-wide fan_out vs {width} sequential nodes\n");
    println!("| run | wall |");
    println!("|---|---:|");
    println!(
        "| {width} sequential nodes (chain) | {:.1} s |",
        seq.duration.as_secs_f64()
    );
    println!(
        "| {width} fan_out branches (seed/collect excluded) | {:.1} s |",
        branch_wall.as_secs_f64()
    );
    println!(
        "| speed-up | {:.2}× |",
        seq.duration.as_secs_f64() / branch_wall.as_secs_f64().max(1e-9)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(VMM_SUBCOMMAND) {
        vmm_process::run_vmm_mode(args[2..].to_vec());
    }
    part1();
    if std::env::var("VOIDBOX_BENCH_SKIP_VMS").as_deref() == Ok("1") {
        return;
    }
    part2();
}
