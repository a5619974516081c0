//! `voidbox apply` overheads.
//!
//! `cargo bench -p voidbox --bench apply`. Part 1 (always): the real scheduler with a fake
//! executor that does nothing — the engine's own cost per node (scheduling, data passing,
//! merging, blocking-pool hand-off) — then the same runs with OpenTelemetry export off and
//! on (traces and metrics over OTLP/HTTP to `scripts/otlp_sink.py`, a real receiver the
//! bench starts through `scripts/phoenix.sh python`; without the Phoenix venv those rows
//! say "skipped"), and the time the final flush (`end_run` + `shutdown`) adds to a run's
//! exit with a live receiver, one that is down (connection refused) and one that accepts
//! and never answers (bounded by `FLUSH_BUDGET`). Part 2 (needs `/dev/kvm` and the guest
//! image; skipped with `VOIDBOX_BENCH_SKIP_VMS=1`): real VMs — host time around each node
//! (everything but boot and command), and an N-wide fan_out against N sequential nodes
//! (`VOIDBOX_BENCH_WIDTH`, default 2), all cold boots (skipped with
//! `VOIDBOX_BENCH_SKIP_COLD=1`); then a chain of `VOIDBOX_BENCH_OBS_NODES` (default 3)
//! nodes restored from the golden snapshot, run with export off and on, alternately
//! (`VOIDBOX_BENCH_OBS_REPS` times each, default 3). This binary doubles as its own VMM.

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use voidbox::apply::executor::VmExecutor;
use voidbox::apply::{run_with_signals, VM_OVERHEAD_MB};
use voidbox::image::ProgressMode;
use voidbox::observe::{config, Flushed, Observer, Settings};
use voidbox::plan::Plan;
use voidbox::sandbox::{vmm_process, GuestImage, VmmLauncher, VMM_SUBCOMMAND};
use voidbox::scheduler::cancel::NodeControl;
use voidbox::scheduler::progress::{Progress, Silent};
use voidbox::scheduler::{run_plan, Attempt, Executor, Job, RunResult, SchedOptions};

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
        given_input: None,
    }
}

fn fake_run(p: &Arc<Plan>, max_parallel: usize) -> Duration {
    timed_run(p, max_parallel, Arc::new(Silent)).0
}

/// The scheduler's wall time for one run of `p` with the fake executor, reporting to
/// `progress`, and the result.
fn timed_run(
    p: &Arc<Plan>,
    max_parallel: usize,
    progress: Arc<dyn Progress>,
) -> (Duration, RunResult) {
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
        progress,
        rx,
    ));
    let took = t0.elapsed();
    assert!(r.success());
    (took, r)
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

/// `scripts/otlp_sink.py` on a free loopback port: a real OTLP/HTTP receiver that decodes
/// every request with the official protobuf definitions and appends it to `out`.
struct Sink {
    child: Child,
    port: u16,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Sink {
    /// Starts the receiver and waits until it accepts connections; why not, as an error.
    fn start() -> Result<Sink, String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = dir.path().join("otlp.jsonl");
        let log = dir.path().join("sink.log");
        let port = free_port();
        let log_file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut child = Command::new("bash")
            .arg(root.join("scripts/phoenix.sh"))
            .arg("python")
            .arg(root.join("scripts/otlp_sink.py"))
            .arg(port.to_string())
            .arg(&out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot run scripts/phoenix.sh: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(Sink {
                    child,
                    port,
                    out,
                    _dir: dir,
                });
            }
            if let Ok(Some(status)) = child.try_wait() {
                let why = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "otlp_sink.py exited ({status}): {} (is the Phoenix venv installed? scripts/phoenix.sh install)",
                    why.trim().lines().last().unwrap_or("no output")
                ));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("otlp_sink.py did not listen within 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Forgets what was received so far.
    fn clear(&self) {
        std::fs::write(&self.out, b"").unwrap_or_else(|e| panic!("{e}"));
    }

    /// Spans and metric export requests received since the last [`Sink::clear`].
    fn received(&self) -> (usize, usize) {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let (mut spans, mut metrics) = (0, 0);
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            match v["signal"].as_str() {
                Some("traces") => {
                    let body = &v["body"]["resourceSpans"];
                    for rs in body.as_array().into_iter().flatten() {
                        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                            spans += ss["spans"].as_array().map_or(0, Vec::len);
                        }
                    }
                }
                Some("metrics") => metrics += 1,
                _ => {}
            }
        }
        (spans, metrics)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nobody listens on (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("{e}"))
        .port()
}

/// The settings `voidbox apply` resolves from `VOIDBOX_OTLP_ENDPOINT=http://127.0.0.1:PORT`:
/// traces and metrics over OTLP/HTTP (protobuf).
fn export_to(port: u16) -> Settings {
    let env = HashMap::from([(
        "VOIDBOX_OTLP_ENDPOINT".to_string(),
        format!("http://127.0.0.1:{port}"),
    )]);
    let s = config::resolve(None, &|k| env.get(k).cloned(), None).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        s.endpoint.is_some() && s.metrics_endpoint.is_some(),
        "{s:?}"
    );
    s
}

/// CPU time (user + system) of this process so far, all threads.
fn cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    use nix::sys::time::TimeValLike;
    let u = getrusage(UsageWho::RUSAGE_SELF).unwrap_or_else(|e| panic!("{e}"));
    Duration::from_micros(
        (u.user_time().num_microseconds() + u.system_time().num_microseconds()) as u64,
    )
}

/// One fake-executor run of `p` observed as `voidbox apply` does, exporting to `settings`.
struct Observed {
    /// `Observer::start` (exporters, HTTP clients, the run's span).
    start: Duration,
    /// The scheduler's run.
    run: Duration,
    /// `end_run` + `shutdown` (the final flush).
    flush: Duration,
    /// CPU time of this process from `Observer::start` to the observer's drop.
    cpu: Duration,
    flushed: Flushed,
}

fn observed_run(p: &Arc<Plan>, max_parallel: usize, settings: &Settings) -> Observed {
    let cpu0 = cpu();
    let t0 = Instant::now();
    let obs = Observer::start(settings.clone(), p, Arc::new(Silent))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("export is on: {settings:?}"));
    let start = t0.elapsed();
    obs.scheduling();
    let (run, r) = timed_run(p, max_parallel, obs.clone());
    obs.finish();
    let t1 = Instant::now();
    obs.end_run(p, &r, 0);
    let flushed = obs.shutdown();
    let flush = t1.elapsed();
    if flushed.timed_out {
        // As `voidbox apply` does: a provider whose export is stuck would block its drop.
        std::mem::forget(obs);
    } else {
        drop(obs);
    }
    Observed {
        start,
        run,
        flush,
        cpu: cpu() - cpu0,
        flushed,
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Runs of each plan, per setting, in part 1's export comparison.
const RUNS: usize = 21;

fn part1_observe(sink: &Result<Sink, String>) {
    println!("## engine overhead per node, telemetry export off vs on\n");
    let sink = match sink {
        Ok(s) => s,
        Err(e) => {
            println!("export on: skipped: {e}\n");
            return;
        }
    };
    let settings = export_to(sink.port);
    println!(
        "export on: traces + metrics over OTLP/HTTP (protobuf) to scripts/otlp_sink.py on 127.0.0.1:{}; runs alternate off/on, medians\n",
        sink.port
    );
    println!("| plan | nodes | runs | run, off | run, on | per node, off | per node, on | added per node | CPU per node, off | CPU per node, on | CPU added per node | Observer::start | end_run + shutdown | spans received per run |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, src, par) in [
        ("chain of 100", chain_spec(100, 128), 1),
        ("chain of 1000", chain_spec(1000, 128), 1),
        ("fan_out 100 wide", fan_out_spec(100, 128), 16),
        ("fan_out 1000 wide", fan_out_spec(1000, 128), 16),
    ] {
        let p = Arc::new(plan(&src));
        let nodes = p.graph.node_count();
        let (mut off, mut off_cpu, mut on, mut on_cpu) = (vec![], vec![], vec![], vec![]);
        let (mut start, mut flush, mut spans, mut failures) = (vec![], vec![], vec![], 0);
        for i in 0..RUNS {
            // Alternate which goes first, so drift and warm-up fall on both.
            for on_now in [i % 2 == 1, i % 2 == 0] {
                if on_now {
                    sink.clear();
                    let o = observed_run(&p, par, &settings);
                    assert!(!o.flushed.timed_out, "flush timed out on a live receiver");
                    failures += o.flushed.export_failures;
                    spans.push(sink.received().0);
                    on.push(o.run);
                    on_cpu.push(o.cpu);
                    start.push(o.start);
                    flush.push(o.flush);
                } else {
                    let c0 = cpu();
                    off.push(fake_run(&p, par));
                    off_cpu.push(cpu() - c0);
                }
            }
        }
        let per = |d: Duration| d.as_secs_f64() * 1e6 / nodes as f64;
        let (off, on) = (median(off), median(on));
        let (off_cpu, on_cpu) = (median(off_cpu), median(on_cpu));
        spans.sort();
        spans.dedup();
        let spans = spans
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("/");
        println!(
            "| {name} | {nodes} | {RUNS}+{RUNS} | {} | {} | {:.1} µs | {:.1} µs | {:+.1} µs | {:.1} µs | {:.1} µs | {:+.1} µs | {} | {} | {spans}{} |",
            ms(off),
            ms(on),
            per(off),
            per(on),
            per(on) - per(off),
            per(off_cpu),
            per(on_cpu),
            per(on_cpu) - per(off_cpu),
            ms(median(start)),
            ms(median(flush)),
            if failures > 0 {
                format!(" ({failures} failed exports)")
            } else {
                String::new()
            }
        );
    }
    println!("\n(run: the scheduler's wall time only; CPU: this process, all threads — off: the run; on: Observer::start to the observer's drop, export threads included, the receiver's own CPU not)\n");
}

/// The observer's own work per node, without a scheduler around it: the callbacks a node
/// makes (attempt started, attempt ended, node finished) called directly on this thread —
/// the time the scheduler spends in them — and this process's CPU time from
/// `Observer::start` to its drop, exports included.
fn part1_callbacks(sink: &Result<Sink, String>) {
    let Ok(sink) = sink else {
        return;
    };
    use voidbox::scheduler::{Event, NodeRecord, Status};
    println!("## the observer's callbacks per node, called directly (no scheduler)\n");
    println!("| plan | nodes | runs | callbacks per node (calling thread) | CPU per node, start to drop (export included) |");
    println!("|---|---:|---:|---:|---:|");
    let settings = export_to(sink.port);
    for (name, src) in [
        ("chain of 1000", chain_spec(1000, 128)),
        ("fan_out 1000 wide", fan_out_spec(1000, 128)),
    ] {
        let p = Arc::new(plan(&src));
        let nodes = p.graph.node_count();
        let attempt = Attempt::ok(b"1\n".to_vec());
        let record = NodeRecord {
            status: Status::Succeeded,
            attempts: 1,
            started: Some(Duration::ZERO),
            duration: Some(Duration::from_micros(10)),
            queue_wait: Some(Duration::ZERO),
            last: Some(attempt.clone()),
        };
        let (mut calls, mut cpus) = (vec![], vec![]);
        for _ in 0..RUNS {
            let c0 = cpu();
            let obs = Observer::start(settings.clone(), &p, Arc::new(Silent))
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("export is on: {settings:?}"));
            obs.scheduling();
            let t0 = Instant::now();
            for node in p.graph.node_indices() {
                let started = std::time::SystemTime::now();
                obs.event(&p, &Event::Started { node, attempt: 1 }, None);
                obs.attempt_ended(&p, node, 1, started, &attempt);
                obs.event(&p, &Event::Finished { node }, Some(&record));
            }
            calls.push(t0.elapsed());
            let r = RunResult {
                nodes: vec![record.clone(); nodes],
                output: None,
                abort: None,
                duration: Duration::from_millis(1),
            };
            obs.end_run(&p, &r, 0);
            let flushed = obs.shutdown();
            assert!(
                !flushed.timed_out && flushed.export_failures == 0,
                "{flushed:?}"
            );
            drop(obs);
            cpus.push(cpu() - c0);
        }
        let per = |d: Duration| d.as_secs_f64() * 1e6 / nodes as f64;
        println!(
            "| {name} | {nodes} | {RUNS} | {:.1} µs | {:.1} µs |",
            per(median(calls)),
            per(median(cpus))
        );
    }
    println!();
}

/// What the final flush adds to a run's exit, by receiver state.
fn part1_flush(sink: &Result<Sink, String>) {
    println!(
        "## the final flush: end_run + shutdown after a run (FLUSH_BUDGET {} s)\n",
        config::FLUSH_BUDGET.as_secs()
    );
    let silent = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let silent_port = silent.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
    let mut receivers: Vec<(String, u16, usize)> = Vec::new();
    match sink {
        Ok(s) => receivers.push(("live (otlp_sink.py)".into(), s.port, 5)),
        Err(e) => println!("live receiver: skipped: {e}\n"),
    }
    receivers.push(("down (connection refused)".into(), free_port(), 5));
    receivers.push(("silent (accepts, never answers)".into(), silent_port, 1));
    println!("| receiver | nodes | runs | median run (scheduler) | median end_run + shutdown | max | timed out | failed exports per run | spans received per run |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (label, port, runs) in receivers {
        let settings = export_to(port);
        for width in [48, 498, 1998] {
            let p = Arc::new(plan(&fan_out_spec(width, 128)));
            let nodes = p.graph.node_count();
            let (mut run, mut flush, mut timed_out, mut failures, mut spans) =
                (vec![], vec![], 0, vec![], vec![]);
            for _ in 0..runs {
                if let Ok(s) = sink {
                    s.clear();
                }
                let o = observed_run(&p, 16, &settings);
                run.push(o.run);
                flush.push(o.flush);
                timed_out += usize::from(o.flushed.timed_out);
                failures.push(o.flushed.export_failures);
                spans.push(match sink {
                    Ok(s) if s.port == port => s.received().0,
                    _ => 0,
                });
            }
            let max = flush.iter().max().copied().unwrap_or_default();
            failures.sort();
            spans.sort();
            println!(
                "| {label} | {nodes} | {runs} | {} | {} | {} | {timed_out}/{runs} | {} | {} |",
                ms(median(run)),
                ms(median(flush)),
                ms(max),
                failures[failures.len() / 2],
                spans[spans.len() / 2],
            );
        }
    }
    drop(silent);
    println!();
}

fn vm_run(exec: &Arc<VmExecutor>, src: &str, max_parallel: usize) -> RunResult {
    let p = Arc::new(plan(src));
    let r = run_with_signals(p, exec.clone(), opts(max_parallel), Arc::new(Silent))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.success(), "{r:?}");
    r
}

/// The executor `voidbox apply` builds, with this binary as the VMM; `snapshots`: restore
/// from (and create) golden snapshots; `guest_telemetry`: ask the guest what each command
/// used (as `apply` does when metrics are exported).
fn vm_executor(
    image: &GuestImage,
    logs: &Path,
    snapshots: bool,
    guest_telemetry: bool,
) -> Arc<VmExecutor> {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    Arc::new(VmExecutor {
        node_vms: Default::default(),
        image: image.clone(),
        launcher: VmmLauncher::Program {
            path: exe,
            args: vec![VMM_SUBCOMMAND.into()],
        },
        boot_timeout: Duration::from_secs(300),
        logs_dir: logs.to_path_buf(),
        artifacts_dir: logs.to_path_buf(),
        given_artifacts: Default::default(),
        runtime_dir: None,
        spec_dir: ".".into(),
        remotes: Default::default(),
        guest_telemetry,
        telemetry_buffer: if guest_telemetry {
            voidbox::apply::executor::DEFAULT_TELEMETRY_BUFFER
        } else {
            0
        },
        kill_children_on_abort: false,
        services: Default::default(),
        warm_runtimes: true,
        snapshots: voidbox::snapshot::Snapshots::new(
            snapshots,
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
    })
}

fn part2() {
    let image = GuestImage::ensure(ProgressMode::Plain).unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let exec = vm_executor(&image, logs.path(), false, false);
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

/// Per-node figures of real runs.
#[derive(Default)]
struct NodeTimes {
    start: Vec<Duration>,
    command: Vec<Duration>,
    rest: Vec<Duration>,
    provision: Vec<Duration>,
    collect: Vec<Duration>,
    total: Vec<Duration>,
    restored: usize,
    guest_usage: usize,
    walls: Vec<Duration>,
    flushes: Vec<Duration>,
    spans: Vec<usize>,
}

impl NodeTimes {
    fn add(&mut self, r: &RunResult, wall: Duration) {
        assert!(r.success(), "{r:?}");
        for rec in &r.nodes {
            let a = rec.last.as_ref();
            let start = a.and_then(|a| a.boot).unwrap_or_default();
            let command = a.and_then(|a| a.exec).unwrap_or_default();
            let total = rec.duration.unwrap_or_default();
            self.start.push(start);
            self.command.push(command);
            self.rest.push(total.saturating_sub(start + command));
            let span = |ph: Option<(std::time::SystemTime, std::time::SystemTime)>| {
                ph.and_then(|(s, e)| e.duration_since(s).ok())
                    .unwrap_or_default()
            };
            self.provision
                .push(span(a.and_then(|a| a.phases.provision)));
            self.collect.push(span(a.and_then(|a| a.phases.collect)));
            self.total.push(total);
            self.restored += usize::from(a.and_then(|a| a.restored) == Some(true));
            self.guest_usage += usize::from(a.is_some_and(|a| a.guest.is_some()));
        }
        self.walls.push(wall);
    }
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// A chain of real nodes restored from the golden snapshot, export off and on alternately.
fn part2_observe(sink: &Result<Sink, String>) {
    println!("## real nodes, telemetry export off vs on (snapshot restore, 128 MiB, 1 vCPU)\n");
    let sink = match sink {
        Ok(s) => s,
        Err(e) => {
            println!("skipped: {e}\n");
            return;
        }
    };
    let n = env_usize("VOIDBOX_BENCH_OBS_NODES", 3);
    let reps = env_usize("VOIDBOX_BENCH_OBS_REPS", 3);
    let image = GuestImage::ensure(ProgressMode::Plain).unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let off_exec = vm_executor(&image, logs.path(), true, false);
    let on_exec = vm_executor(&image, logs.path(), true, true);
    let settings = export_to(sink.port);
    let p = Arc::new(plan(&chain_spec(n, 128)));
    // Creates the golden snapshot when the cache has none; not counted.
    let warm = Arc::new(plan(&chain_spec(1, 128)));
    run_with_signals(warm, off_exec.clone(), opts(1), Arc::new(Silent))
        .unwrap_or_else(|e| panic!("{e}"));
    let (mut off, mut on) = (NodeTimes::default(), NodeTimes::default());
    for _ in 0..reps {
        let t0 = Instant::now();
        let r = run_with_signals(p.clone(), off_exec.clone(), opts(1), Arc::new(Silent))
            .unwrap_or_else(|e| panic!("{e}"));
        off.add(&r, t0.elapsed());
        sink.clear();
        let obs = Observer::start(settings.clone(), &p, Arc::new(Silent))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("export is on: {settings:?}"));
        assert!(obs.wants_guest_telemetry());
        obs.scheduling();
        let t0 = Instant::now();
        let r = run_with_signals(p.clone(), on_exec.clone(), opts(1), obs.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        let wall = t0.elapsed();
        obs.finish();
        let t1 = Instant::now();
        obs.end_run(&p, &r, 0);
        let flushed = obs.shutdown();
        on.flushes.push(t1.elapsed());
        assert!(
            !flushed.timed_out && flushed.export_failures == 0,
            "{flushed:?}"
        );
        on.spans.push(sink.received().0);
        on.add(&r, wall);
    }
    println!("| export | nodes | restored | guest usage recorded | VM start | command | rest (host) | … provision | … collect | node total | run wall | end_run + shutdown | spans received per run |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (label, t) in [("off", off), ("on", on)] {
        let count = t.total.len();
        let flush = if t.flushes.is_empty() {
            "—".to_string()
        } else {
            ms(median(t.flushes.clone()))
        };
        let spans = t
            .spans
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("/");
        println!(
            "| {label} | {count} ({reps} runs × {n}) | {}/{count} | {}/{count} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.2} s | {flush} | {} |",
            t.restored,
            t.guest_usage,
            median(t.start).as_secs_f64() * 1e3,
            median(t.command).as_secs_f64() * 1e3,
            median(t.rest).as_secs_f64() * 1e3,
            median(t.provision).as_secs_f64() * 1e3,
            median(t.collect).as_secs_f64() * 1e3,
            median(t.total).as_secs_f64() * 1e3,
            median(t.walls).as_secs_f64(),
            if spans.is_empty() { "—".into() } else { spans },
        );
    }
    println!("\n(medians per node; \"rest\" = node total − VM start − command; with export on, the guest's telemetry is read at the end of provision and at the start of collect)\n");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(VMM_SUBCOMMAND) {
        vmm_process::run_vmm_mode(args[2..].to_vec());
    }
    part1();
    let sink = Sink::start();
    part1_observe(&sink);
    part1_callbacks(&sink);
    part1_flush(&sink);
    if std::env::var("VOIDBOX_BENCH_SKIP_VMS").as_deref() == Ok("1") {
        return;
    }
    if std::env::var("VOIDBOX_BENCH_SKIP_COLD").as_deref() != Ok("1") {
        part2();
    }
    part2_observe(&sink);
}
