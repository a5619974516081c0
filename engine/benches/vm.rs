//! Cold-start phases, VMM memory overhead and warm vsock latency of real micro-VMs.
//!
//! `cargo bench -p voidbox --bench vm` (env: `VOIDBOX_BENCH_VMS` cold starts, default 3;
//! `VOIDBOX_BENCH_PINGS`, default 100). Needs `/dev/kvm` and the guest image. This binary
//! doubles as its own VMM (`vm __vmm …`), like `voidbox`.

mod common;

use std::time::{Duration, Instant};

use common::{env_usize, host_description, ms};

use voidbox::image::ProgressMode;
use voidbox::sandbox::{vmm_process, GuestImage, Sandbox, SandboxConfig, VMM_SUBCOMMAND};
use voidbox_protocol::ExecRequest;

const MEMORY_MB: u32 = 128;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(f64::NAN)
}

/// (total RSS, RSS of the guest-memory mapping) in KiB, from `/proc/PID/smaps`.
fn rss_split(pid: u32, guest_kib: u64) -> Option<(u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let (mut total, mut guest) = (0u64, 0u64);
    let mut is_guest = false;
    for line in smaps.lines() {
        let kib = |l: &str, key: &str| -> Option<u64> {
            l.strip_prefix(key)?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        };
        if let Some(size) = kib(line, "Size:") {
            is_guest = size == guest_kib;
        } else if let Some(rss) = kib(line, "Rss:") {
            total += rss;
            if is_guest {
                guest += rss;
            }
        }
    }
    Some((total, guest))
}

fn exec_true(sb: &mut Sandbox) -> Duration {
    let t = Instant::now();
    let r = sb
        .exec(
            ExecRequest {
                program: "true".into(),
                ..ExecRequest::default()
            },
            &mut |_, _| {},
        )
        .unwrap_or_else(|e| panic!("exec: {e}"));
    assert_eq!(r.exit_code, Some(0));
    t.elapsed()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(VMM_SUBCOMMAND) {
        vmm_process::run_vmm_mode(args[2..].to_vec());
    }
    let vms = env_usize("VOIDBOX_BENCH_VMS", 3).max(1);
    let pings = env_usize("VOIDBOX_BENCH_PINGS", 100).max(1);
    let image = GuestImage::ensure(ProgressMode::Plain).unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = SandboxConfig::new(image.clone());
    cfg.memory_mb = MEMORY_MB;
    cfg.boot_timeout = Duration::from_secs(300);

    let cols = [
        "vmm_spawn",
        "vm_setup",
        "to_booting",
        "kernel_to_agent",
        "handshake",
        "cold_total",
        "first_exec",
        "rss_total_kib",
        "rss_guest_kib",
        "rss_vmm_kib",
    ];
    let mut rows: Vec<[f64; 10]> = Vec::new();
    let mut warm: Option<Sandbox> = None;
    for i in 0..vms {
        let mut sb = Sandbox::start(&cfg).unwrap_or_else(|e| panic!("VM {i}: {e}"));
        let t = sb.timings().clone();
        let first = exec_true(&mut sb);
        let (total, guest) =
            rss_split(sb.vmm_pid(), u64::from(MEMORY_MB) * 1024).unwrap_or_default();
        rows.push([
            ms(t.vmm_spawn),
            ms(t.vm_setup),
            ms(t.to_booting),
            ms(t.kernel_to_agent),
            ms(t.handshake),
            ms(t.total),
            ms(first),
            total as f64,
            guest as f64,
            total.saturating_sub(guest) as f64,
        ]);
        eprintln!(
            "cold start {}/{vms}: {:.0} ms to agent, first exec {:.0} ms",
            i + 1,
            ms(t.total),
            ms(first)
        );
        if i + 1 == vms {
            warm = Some(sb);
        } else {
            sb.stop();
        }
    }
    let mut sb = warm.unwrap_or_else(|| unreachable!());
    let mut ping: Vec<f64> = (0..pings)
        .map(|_| ms(sb.ping().unwrap_or_else(|e| panic!("ping: {e}"))))
        .collect();
    let mut execs: Vec<f64> = (0..10).map(|_| ms(exec_true(&mut sb))).collect();
    let stop_t = Instant::now();
    sb.stop();
    let stop = ms(stop_t.elapsed());

    println!(
        "voidbox VM benchmark: {vms} cold starts, {MEMORY_MB} MiB, 1 vCPU, image profile {}",
        image.profile
    );
    println!("host: {}", host_description());
    println!();
    println!("| phase (ms unless noted) | min | median | max |");
    println!("|---|---:|---:|---:|");
    for (c, name) in cols.iter().enumerate() {
        let mut v: Vec<f64> = rows.iter().map(|r| r[c]).collect();
        let med = median(&mut v);
        println!(
            "| {name} | {:.1} | {med:.1} | {:.1} |",
            v[0],
            v[v.len() - 1]
        );
    }
    println!();
    println!("| warm VM | median | p90 | p99 | max |");
    println!("|---|---:|---:|---:|---:|");
    let line = |name: &str, v: &mut Vec<f64>| {
        let (m, p90, p99) = (median(v), pct(v, 0.9), pct(v, 0.99));
        println!(
            "| {name} | {m:.2} | {p90:.2} | {p99:.2} | {:.2} |",
            v[v.len() - 1]
        );
    };
    line(&format!("Ping→Pong round trip, ms (n={pings})"), &mut ping);
    line("exec `true` round trip, ms (n=10)", &mut execs);
    println!("| graceful stop (Shutdown → VMM exit), ms | {stop:.0} | | | |");
}
