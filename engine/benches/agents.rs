//! One-turn agent boxes with the real runtimes: where the time of a Claude Code box and a
//! Codex box goes, and how much guest memory each touches.
//!
//! `cargo bench -p voidbox --bench agents`. Needs `/dev/kvm`, the guest image and the
//! runtimes disk (both built on first use). Each runtime runs one agent box through `apply`'s
//! own executor — its credential gateway, the gateway-only NAT, the runtimes disk, a VM
//! restored from the golden snapshot — against `voidbox-llm-script`, a scripted model on
//! loopback that answers every request with one text turn at once. A warm-up node first
//! makes sure that golden snapshot exists, so no measured run pays for creating it.
//!
//! Per run it reports:
//! - **VM ready**: the attempt's boot (`boot_ms` in the report: the restore, or a cold boot);
//! - **first model request**: when the scripted server received the runtime's first model
//!   call, measured from VM ready (writing the runtime's config file, the runtime's start);
//! - **first token**: the scripted server sends its whole streamed answer as soon as a
//!   request arrives, so this is the first request plus the trip back through the gateway
//!   and the NAT; with a real model, add the model's own time to first token;
//! - **done**: `exec_ms` (exec request → the runtime exits), and last request → exit;
//! - **memory**: from the VMM's `/proc/PID/smaps`, sampled every 200 ms (the largest
//!   sample: guest memory is never given back): the resident part of the guest-memory
//!   mapping — the guest pages this VM touched, read from the restored snapshot or written
//!   — and its anonymous part, the pages written since the restore; and the VMM's whole RSS.
//!   This is the host's view of guest memory (what the VM costs the host); the guest's own
//!   accounting (`/proc/meminfo` in that VM) is not read.
//!
//! Times are taken on the bench's clock: the server's arrival times are polled every 10 ms,
//! and "VM ready" is the attempt's start plus its boot (the host work before the boot —
//! starting the gateway, staging the kit — is a few ms and is printed separately).
//!
//! Each runtime runs twice per round: in the guest image's own root, and with an OCI image as
//! its root (`sandbox.image`: a busybox image from a local registry, pulled and converted as
//! `apply` does, the runtimes disk and its loader inside it) — the same scripted model, so
//! the difference is what the image root costs.
//!
//! `VOIDBOX_BENCH_RUNS` (default 1) runs per runtime and root, `VOIDBOX_BENCH_MEMORY_MB`
//! (default 2048) the guest memory, `VOIDBOX_BENCH_ROOTS` (`guest,image`, the default; or
//! one of them). This binary doubles as its own VMM.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use voidbox::apply::executor::VmExecutor;
use voidbox::apply::{run_with_signals, VM_OVERHEAD_MB};
use voidbox::image::ProgressMode;
use voidbox::plan::Plan;
use voidbox::sandbox::disks::{DiskRole, ImageDisk};
use voidbox::sandbox::{vmm_process, GuestImage, VmmLauncher, VMM_SUBCOMMAND};
use voidbox::scheduler::cancel::NodeControl;
use voidbox::scheduler::progress::Silent;
use voidbox::scheduler::{Attempt, Executor, Job, RunResult, SchedOptions};
use voidbox_llm_script::{Script, Server, Turn};

use common::{env_usize, host_description};

/// The scripted model's one answer.
const REPLY: &str = "Hello from the scripted model.";

/// `apply`'s executor, recording when each attempt starts and ends.
struct Timed {
    inner: VmExecutor,
    spans: Mutex<Vec<(String, Instant, Instant)>>,
}

impl Executor for Timed {
    fn run(&self, job: &Job, ctl: &NodeControl) -> Attempt {
        let t0 = Instant::now();
        let a = self.inner.run(job, ctl);
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        spans.push((job.node.name.clone(), t0, Instant::now()));
        a
    }

    fn abort_all(&self) {
        self.inner.abort_all();
    }
}

fn plan(src: &str) -> Plan {
    let v = voidbox::validate::validate_source("bench.yaml", src.to_string(), Path::new("."));
    let spec = v
        .spec
        .unwrap_or_else(|| panic!("{:?}", v.report.diagnostics));
    Plan::compile(&spec, Path::new(".")).unwrap_or_else(|e| panic!("{e}"))
}

/// A one-turn agent box for `llm` (a flow mapping).
fn agent_spec(name: &str, llm: &str, memory_mb: usize) -> String {
    format!(
        "api_version: v1\nkind: agent\nname: {name}\nsandbox: {{memory_mb: {memory_mb}}}\nllm: {llm}\nagent: {{prompt: \"Say hello in one short sentence.\", timeout_secs: 1500}}\n"
    )
}

/// A command node with the agents' VM shape (memory, network device, runtimes disk): it
/// restores from — or first creates — the golden snapshot the agent boxes restore from.
fn warm_up_spec(memory_mb: usize) -> String {
    format!(
        "api_version: v1\nkind: sandbox\nname: warm-up\nsandbox: {{memory_mb: {memory_mb}, network: {{allow_host_ports: [9]}}}}\nrun: {{program: \"true\"}}\n"
    )
}

fn sched() -> SchedOptions {
    SchedOptions {
        max_parallel: 1,
        memory_budget_mb: u64::MAX / 2,
        vm_overhead_mb: VM_OVERHEAD_MB,
        max_output: 16 << 20,
        retry_base: Duration::from_secs(1),
        run_input: None,
        given_input: None,
    }
}

/// The executor for `plan`: its endpoints resolved (no overrides from this environment),
/// the runtimes disk attached to every node (after `root`, the image root, when given),
/// golden snapshots on.
fn executor(
    image: &GuestImage,
    disk: &ImageDisk,
    root: Option<&voidbox_oci::PulledImage>,
    plan: &Plan,
    logs: &Path,
) -> Arc<Timed> {
    let endpoints = voidbox::node::launch::endpoints(plan, &|_| None).unwrap_or_else(|f| {
        panic!(
            "{:?}",
            f.iter().map(|f| f.message.clone()).collect::<Vec<_>>()
        )
    });
    let mut node_vms = std::collections::HashMap::new();
    for n in plan.graph.node_weights() {
        let mut vm = voidbox::node::oci_images::NodeVm::default();
        if let Some(p) = root {
            vm.disks.images.push(ImageDisk {
                path: p.rootfs_disk.clone(),
                digest: p.manifest_digest.clone(),
                role: DiskRole::Rootfs,
            });
            vm.disks.user = Some(voidbox::node::oci_images::SANDBOX_USER);
            vm.env = voidbox::node::oci_images::image_env(&p.config);
            vm.workdir = p.config.working_dir.clone();
        }
        vm.disks.images.push(disk.clone());
        node_vms.insert(n.name.clone(), vm);
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    Arc::new(Timed {
        inner: VmExecutor {
            node_vms,
            image: image.clone(),
            launcher: VmmLauncher::Program {
                path: exe,
                args: vec![VMM_SUBCOMMAND.into()],
            },
            boot_timeout: Duration::from_secs(600),
            logs_dir: logs.to_path_buf(),
            artifacts_dir: logs.to_path_buf(),
            given_artifacts: Default::default(),
            runtime_dir: None,
            spec_dir: ".".into(),
            remotes: Default::default(),
            guest_telemetry: false,
            telemetry_buffer: 0,
            services: Default::default(),
            warm_runtimes: true,
            kill_children_on_abort: false,
            snapshots: voidbox::snapshot::Snapshots::new(
                true,
                voidbox::snapshot::CreateOptions {
                    launcher: VmmLauncher::CurrentExe,
                    boot_timeout: Duration::from_secs(600),
                    runtime_dir: None,
                },
                ".".into(),
                Arc::new(|m: &str| eprintln!("{m}")),
            )
            .unwrap_or_else(|e| panic!("{e}")),
            dns_upstreams: Vec::new(),
            endpoints,
        },
        spans: Mutex::new(Vec::new()),
    })
}

/// The pid of the (one) VMM child of this process.
fn vmm_pid() -> Option<String> {
    let me = std::process::id().to_string();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e
            .file_name()
            .to_str()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            .map(String::from)
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The fields after the command name (which may hold spaces): state, ppid, …
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().nth(1));
        if ppid != Some(me.as_str()) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains(VMM_SUBCOMMAND) || cmdline.contains("voidbox-vmm") {
            return Some(pid);
        }
    }
    None
}

/// Resident KiB of a VMM, from `/proc/PID/smaps`: (whole process, the guest-memory mapping
/// (`guest_kib` in size), the anonymous part of that mapping: guest pages written since the
/// restore, copied out of the snapshot file).
fn vmm_memory(pid: &str, guest_kib: u64) -> Option<(u64, u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let (mut total, mut guest, mut anon) = (0u64, 0u64, 0u64);
    let (mut is_guest, mut snapshot_file) = (false, false);
    for line in smaps.lines() {
        // A mapping's header: `START-END PERMS OFFSET DEV INODE [PATH]`. A layered
        // snapshot's guest memory is its base's memory file with the diff mapped over parts.
        if line.split_whitespace().next().is_some_and(|r| {
            r.split_once('-').is_some_and(|(a, b)| {
                u64::from_str_radix(a, 16).is_ok() && u64::from_str_radix(b, 16).is_ok()
            })
        }) {
            let path = line.split_whitespace().nth(5).unwrap_or("");
            snapshot_file = path.ends_with("/memory.bin") || path.ends_with("/memory.diff");
            continue;
        }
        let kib = |key: &str| -> Option<u64> {
            line.strip_prefix(key)?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        };
        if let Some(size) = kib("Size:") {
            is_guest = snapshot_file || size == guest_kib;
        } else if let Some(rss) = kib("Rss:") {
            total += rss;
            if is_guest {
                guest += rss;
            }
        } else if let Some(a) = kib("Anonymous:") {
            if is_guest {
                anon += a;
            }
        }
    }
    Some((total, guest, anon))
}

/// What one measured run saw.
struct Sample {
    runtime: &'static str,
    root: &'static str,
    vm_start: &'static str,
    /// How the runtime started: `cold`, `warm`, or `warm (created)` (this run made the
    /// warm snapshot first).
    start: String,
    /// Attempt start (the executor called) → first model request.
    start_to_first: Duration,
    boot: Duration,
    first_request: Duration,
    last_request: Duration,
    exec: Duration,
    post_exec: Duration,
    requests: usize,
    vmm_kib: u64,
    guest_kib: u64,
    written_kib: u64,
    result: String,
}

#[allow(clippy::too_many_arguments)]
fn measure(
    runtime: &'static str,
    llm: &str,
    server: &Server,
    image: &GuestImage,
    disk: &ImageDisk,
    root: Option<&voidbox_oci::PulledImage>,
    memory_mb: usize,
    logs: &Path,
    warm: bool,
) -> Sample {
    let p = Arc::new(plan(&agent_spec(runtime, llm, memory_mb)));
    let mut exec = executor(image, disk, root, &p, logs);
    if let Some(e) = Arc::get_mut(&mut exec) {
        e.inner.warm_runtimes = warm;
    }
    let seen_before = server.model_calls().len();
    let done = Arc::new(AtomicBool::new(false));
    // Arrival times of model calls, polled on this thread while the run goes on.
    let mut calls = Vec::<Instant>::new();
    let mem = Arc::new(Mutex::new((0u64, 0u64, 0u64)));
    let sampler = {
        let done = done.clone();
        let mem = mem.clone();
        let guest_kib = memory_mb as u64 * 1024;
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Some(m) = vmm_pid().and_then(|p| vmm_memory(&p, guest_kib)) {
                    // Guest memory is never given back: keep the largest sample.
                    let mut cur = mem.lock().unwrap_or_else(|e| e.into_inner());
                    if m.1 >= cur.1 {
                        *cur = m;
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let runner = {
        let exec = exec.clone();
        let p = p.clone();
        std::thread::spawn(move || {
            run_with_signals(p, exec, sched(), Arc::new(Silent)).unwrap_or_else(|e| panic!("{e}"))
        })
    };
    let mut seen = seen_before;
    while !runner.is_finished() {
        let n = server.model_calls().len();
        if n > seen {
            calls.extend(std::iter::repeat_n(Instant::now(), n - seen));
            seen = n;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let r: RunResult = runner.join().unwrap_or_else(|_| panic!("run panicked"));
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let rec = &r.nodes[0];
    let a = rec
        .last
        .as_ref()
        .unwrap_or_else(|| panic!("{runtime}: no attempt"));
    assert!(
        r.success(),
        "{runtime}: {:?} {:?}\n{}",
        rec.status,
        a.error,
        a.stderr_tail
    );
    let spans = exec.spans.lock().unwrap_or_else(|e| e.into_inner());
    let (_, t_enter, t_exit) = spans
        .last()
        .cloned()
        .unwrap_or_else(|| panic!("{runtime}: no span"));
    let boot = a.boot.unwrap_or_default();
    let exec_t = a.exec.unwrap_or_default();
    let ready = t_enter + boot;
    let first = calls
        .first()
        .copied()
        .unwrap_or_else(|| panic!("{runtime}: no model call"));
    let last = calls.last().copied().unwrap_or(first);
    let (vmm_kib, guest_kib, written_kib) = *mem.lock().unwrap_or_else(|e| e.into_inner());
    let total = t_exit.duration_since(t_enter);
    Sample {
        runtime,
        root: if root.is_some() { "image" } else { "guest" },
        vm_start: if a.restored == Some(true) {
            "snapshot"
        } else {
            "cold"
        },
        start: match &a.runtime_start {
            Some(voidbox::scheduler::RuntimeStart::Warm { created: true, .. }) => {
                "warm (created)".into()
            }
            Some(s) => s.kind().into(),
            None => "?".into(),
        },
        start_to_first: first.saturating_duration_since(t_enter),
        boot,
        first_request: first.saturating_duration_since(ready),
        last_request: last.saturating_duration_since(ready),
        exec: exec_t,
        post_exec: total.saturating_sub(boot + exec_t),
        requests: calls.len(),
        vmm_kib,
        guest_kib,
        written_kib,
        result: a
            .agent
            .as_ref()
            .and_then(|s| s.result.clone())
            .unwrap_or_default(),
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn mib(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(VMM_SUBCOMMAND) {
        vmm_process::run_vmm_mode(args[2..].to_vec());
    }
    if std::env::var("VOIDBOX_BENCH_SKIP_VMS").as_deref() == Ok("1") {
        return;
    }
    let runs = env_usize("VOIDBOX_BENCH_RUNS", 1).max(1);
    let memory_mb = env_usize("VOIDBOX_BENCH_MEMORY_MB", 2048);
    println!("# one-turn agent boxes\n\nhost: {}\n", host_description());
    let image = GuestImage::ensure(ProgressMode::Plain).unwrap_or_else(|e| panic!("{e}"));
    let rt = voidbox::runtimes::ensure(&mut |l| eprintln!("runtimes: {l}"))
        .unwrap_or_else(|e| panic!("{e}"));
    println!("runtimes disk: {}\n", rt.versions());
    // As `apply` attaches it (the golden snapshot then runs each runtime once).
    let disk = rt.image_disk();
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let roots = std::env::var("VOIDBOX_BENCH_ROOTS").unwrap_or_else(|_| "guest,image".into());
    // The image root: busybox from a local registry, pulled into a scratch cache.
    let registry = voidbox_oci::testing::Registry::start().unwrap_or_else(|e| panic!("{e}"));
    let cache = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let pulled = {
        voidbox_oci::testing::ImageBuilder::busybox()
            .and_then(|b| b.working_dir("/project").push(&registry, "bench-root:1"))
            .unwrap_or_else(|e| panic!("{e}"));
        let store = voidbox_oci::Store::open(cache.path()).unwrap_or_else(|e| panic!("{e}"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        rt.block_on(store.pull(
            &registry.reference("bench-root:1"),
            &voidbox_oci::PullOptions::default(),
            &voidbox_oci::NoProgress,
        ))
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let mut variants: Vec<Option<&voidbox_oci::PulledImage>> = Vec::new();
    for r in roots.split(',') {
        match r.trim() {
            "guest" => variants.push(None),
            "image" => variants.push(Some(&pulled)),
            other => panic!("VOIDBOX_BENCH_ROOTS: unknown root `{other}`"),
        }
    }

    // The golden snapshot of each VM shape (created here if missing, not in a measured run).
    let warm = Arc::new(plan(&warm_up_spec(memory_mb)));
    for root in &variants {
        let t = Instant::now();
        let r = run_with_signals(
            warm.clone(),
            executor(&image, &disk, *root, &warm, logs.path()),
            sched(),
            Arc::new(Silent),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(r.success(), "warm-up: {:?}", r.nodes[0].last);
        println!(
            "warm-up node, {} root (golden snapshot {}): {}\n",
            if root.is_some() { "image" } else { "guest" },
            if r.nodes[0].last.as_ref().and_then(|a| a.restored) == Some(true) {
                "cached"
            } else {
                "created"
            },
            secs(t.elapsed())
        );
    }

    // Host work before the boot: starting one credential gateway.
    let server = Server::start(Script::new([Turn::text(REPLY)]));
    let gw_start = {
        let e = voidbox::providers::resolve(
            &voidbox::spec::model::Llm {
                provider: voidbox::spec::model::Provider::Custom,
                model: None,
                base_url: Some(server.base_url()),
                api_key_env: None,
                credential_proxy: false,
            },
            &|_| None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let t = Instant::now();
        let g = voidbox::gateway::Gateway::start(&e).unwrap_or_else(|e| panic!("{e}"));
        let d = t.elapsed();
        drop(g);
        d
    };

    let claude_llm = format!(
        "{{provider: custom, base_url: \"{}\", model: scripted}}",
        server.base_url()
    );
    let codex_llm = format!(
        "{{provider: codex, base_url: \"{}\", model: scripted}}",
        server.openai_base_url()
    );
    // `cold`: the runtime starts in its VM; `warm`: restored already running (the first warm
    // run of a configuration makes its snapshot, and is shown as such).
    let starts: Vec<bool> = std::env::var("VOIDBOX_BENCH_START")
        .unwrap_or_else(|_| "cold,warm".into())
        .split(',')
        .map(|s| match s.trim() {
            "cold" => false,
            "warm" => true,
            other => panic!("VOIDBOX_BENCH_START: unknown start `{other}`"),
        })
        .collect();
    let mut samples = Vec::new();
    for &warm_start in &starts {
        // A configuration's first warm run makes its snapshot: run it once more.
        let rounds = if warm_start { runs + 1 } else { runs };
        for _ in 0..rounds {
            for (runtime, llm) in [("claude-code", &claude_llm), ("codex", &codex_llm)] {
                for root in &variants {
                    let s = measure(
                        runtime,
                        llm,
                        &server,
                        &image,
                        &disk,
                        *root,
                        memory_mb,
                        logs.path(),
                        warm_start,
                    );
                    eprintln!(
                        "{runtime} ({} root, {}): start → first request {}, exec {} ({} model requests)",
                        s.root,
                        s.start,
                        secs(s.start_to_first),
                        secs(s.exec),
                        s.requests
                    );
                    samples.push(s);
                }
            }
        }
    }

    println!("## one turn, {memory_mb} MiB, 1 vCPU (times from VM ready unless said)\n");
    println!("| runtime | root | runtime start | VM start | attempt start → first model request | VM ready (boot) | first model request | first token | last model request | done (exec) | last request → exit | host after exec | requests | guest memory touched | … written since restore | VMM RSS |");
    println!("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in &samples {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {}* | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.runtime,
            s.root,
            s.start,
            s.vm_start,
            secs(s.start_to_first),
            secs(s.boot),
            secs(s.first_request),
            secs(s.first_request),
            secs(s.last_request),
            secs(s.exec),
            secs(s.exec.saturating_sub(s.last_request)),
            secs(s.post_exec),
            s.requests,
            mib(s.guest_kib),
            mib(s.written_kib),
            mib(s.vmm_kib),
        );
    }
    println!(
        "\n\\* the scripted model answers at once: first token = first request + the way back \
         through the gateway and NAT. Host work before each boot (one credential gateway start): \
         {:.1} ms. Results: {:?}",
        gw_start.as_secs_f64() * 1e3,
        samples
            .iter()
            .map(|s| s.result.as_str())
            .collect::<Vec<_>>()
    );
}
