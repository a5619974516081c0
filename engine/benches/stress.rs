//! Guest process stability under contention (issue #10, item 0): N VMs at once, each
//! starting M processes the way `apply` does — the input file written over the file RPC
//! and the same bytes piped to the child's stdin while it starts — on cold-booted and on
//! snapshot-restored VMs. Reports every process killed by a signal (the random SIGSEGVs
//! this guards against), every wrong output and every error.
//!
//! `cargo bench -p voidbox --bench stress` (env: `VOIDBOX_STRESS_VMS`, default 4;
//! `VOIDBOX_STRESS_EXECS` process starts per VM, default 10). Needs `/dev/kvm` and the guest
//! image; the golden snapshot is created in a private cache in this run. This binary doubles
//! as its own VMM (`stress __vmm …`). Exits 1 if any process crashed or answered wrongly.

mod common;

use std::time::{Duration, Instant};

use common::{env_usize, host_description, private_golden, self_vmm_config};

use voidbox::image::ProgressMode;
use voidbox::sandbox::{vmm_process, GuestImage, Sandbox, SandboxConfig, VMM_SUBCOMMAND};
use voidbox_protocol::{ExecRequest, OutputStream};

const MEMORY_MB: u32 = 128;

/// What one VM saw.
#[derive(Default)]
struct Tally {
    starts: usize,
    signaled: Vec<String>,
    wrong: usize,
    errors: Vec<String>,
}

/// The programs each VM cycles through: (argv, expected stdout for `input`).
fn programs(input: &str) -> Vec<(Vec<&'static str>, String)> {
    let upper = input.to_uppercase();
    vec![
        (vec!["tr", "a-z", "A-Z"], upper.clone()),
        (vec!["wc", "-c"], format!("{}\n", input.len())),
        (vec!["sh", "-c", "echo started >&2; exec tr a-z A-Z"], upper),
        (
            vec!["sh", "-c", "cat /workspace/input.json"],
            input.to_string(),
        ),
    ]
}

fn run_vm(cfg: &SandboxConfig, execs: usize, input: &str) -> Tally {
    let mut t = Tally::default();
    let mut sb = match Sandbox::start(cfg) {
        Ok(sb) => sb,
        Err(e) => {
            t.errors.push(format!("start: {e}"));
            return t;
        }
    };
    let progs = programs(input);
    for i in 0..execs {
        if let Err(e) = sb.write_file("/workspace/input.json", input.as_bytes(), None) {
            t.errors.push(format!("write_file: {e}"));
            continue;
        }
        let (argv, want) = &progs[i % progs.len()];
        let mut out = Vec::new();
        t.starts += 1;
        let r = sb.exec(
            ExecRequest {
                program: argv[0].into(),
                args: argv[1..].iter().map(|s| s.to_string()).collect(),
                stdin: input.as_bytes().to_vec(),
                timeout_secs: Some(120),
                ..ExecRequest::default()
            },
            &mut |s, d| {
                if s == OutputStream::Stdout {
                    out.extend_from_slice(d)
                }
            },
        );
        match r {
            Err(e) => t.errors.push(format!("exec {}: {e}", argv.join(" "))),
            Ok(r) if r.signal.is_some() => t.signaled.push(format!(
                "`{}` killed by signal {}",
                argv.join(" "),
                r.signal.unwrap_or_default()
            )),
            Ok(r) if r.exit_code != Some(0) || out != want.as_bytes() => t.wrong += 1,
            Ok(_) => {}
        }
    }
    sb.stop();
    t
}

fn round(name: &str, cfg: &SandboxConfig, vms: usize, execs: usize, input: &str) -> bool {
    let t0 = Instant::now();
    let tallies: Vec<Tally> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..vms)
            .map(|_| s.spawn(|| run_vm(cfg, execs, input)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let wall = t0.elapsed();
    let starts: usize = tallies.iter().map(|t| t.starts).sum();
    let signaled: Vec<&String> = tallies.iter().flat_map(|t| &t.signaled).collect();
    let wrong: usize = tallies.iter().map(|t| t.wrong).sum();
    let errors: Vec<&String> = tallies.iter().flat_map(|t| &t.errors).collect();
    println!(
        "| {name:<8} | {vms:>3} | {starts:>15} | {:>16} | {wrong:>12} | {:>6} | {:>8.1} |",
        signaled.len(),
        errors.len(),
        wall.as_secs_f64()
    );
    for m in signaled.iter().chain(errors.iter()) {
        eprintln!("  {name}: {m}");
    }
    signaled.is_empty() && wrong == 0 && errors.is_empty()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(VMM_SUBCOMMAND) {
        vmm_process::run_vmm_mode(args[2..].to_vec());
    }
    if args.iter().any(|a| a == "--list") {
        return; // `cargo test --benches` lists benches; nothing to list here.
    }
    let vms = env_usize("VOIDBOX_STRESS_VMS", 4).max(1);
    let execs = env_usize("VOIDBOX_STRESS_EXECS", 10).max(1);
    let image = GuestImage::ensure(ProgressMode::Plain).unwrap_or_else(|e| panic!("{e}"));
    let cold = self_vmm_config(image.clone(), MEMORY_MB, Duration::from_secs(600));
    let (_cache, lease) = private_golden(&cold);
    let mut restored = cold.clone();
    restored.restore = Some(lease.restore.clone());
    // 64 KiB of text: big enough that piping it overlaps the child's start.
    let input: String = "the quick brown fox jumps over the lazy dog\n"
        .repeat(1490)
        .chars()
        .take(64 * 1024)
        .collect();

    println!("host: {}", host_description());
    println!(
        "guest image {} ({MEMORY_MB} MiB, 1 vCPU)",
        &image.hash[..12]
    );
    println!();
    println!("| VMs from | VMs | process starts  | killed by signal | wrong output | errors | wall (s) |");
    println!("|----------|----:|----------------:|-----------------:|-------------:|-------:|---------:|");
    let ok_restored = round("snapshot", &restored, vms, execs, &input);
    let ok_cold = round("cold", &cold, vms, execs, &input);
    drop(lease);
    if !(ok_restored && ok_cold) {
        std::process::exit(1);
    }
}
