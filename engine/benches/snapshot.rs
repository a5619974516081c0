//! Snapshot fast path against cold boots, in one run: restore → guest agent ready against
//! cold boot → guest agent ready, the same two to the end of a first `echo`, golden
//! snapshot size and creation time, and memory shared across concurrently restored VMs.
//!
//! Restores are measured two ways, interleaved: the restore page (the VMM hands the guest its
//! new secret, RNG seed, clock and policy in memory; the first exchange is the `echo`), and
//! the sequence voidbox used before it, replayed on a restored VM with the same messages,
//! each awaited: `CONNECT`, handshake, `Rekey` (RNG, clock, secret), policy `Ping`, then the
//! `echo`.
//!
//! `cargo bench -p voidbox --bench snapshot` (env: `VOIDBOX_BENCH_COLD` cold boots, default
//! 3; `VOIDBOX_BENCH_RESTORES` sequential restores, default 10; `VOIDBOX_BENCH_CONCURRENT`
//! VMs restored at once, default 4). Needs `/dev/kvm` and the guest image; uses a private
//! snapshot cache so the golden snapshot is created in this run. This binary doubles as
//! its own VMM (`snapshot __vmm …`).

mod common;

use std::time::{Duration, Instant};

use common::{env_usize, host_description, ms, private_golden, self_vmm_config};

use voidbox::image::ProgressMode;
use voidbox::sandbox::{
    vmm_process, GuestConn, GuestImage, Sandbox, SandboxConfig, VMM_SUBCOMMAND,
};
use voidbox_protocol::{ExecRequest, GuestPolicy, OutputStream, SessionSecret};

const MEMORY_MB: u32 = 128;

fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn echo() -> ExecRequest {
    ExecRequest {
        program: "echo".into(),
        args: vec!["hi".into()],
        ..ExecRequest::default()
    }
}

fn check_echo(
    r: Result<voidbox_protocol::ExecResponse, voidbox::sandbox::SandboxError>,
    out: &[u8],
) {
    let r = r.unwrap_or_else(|e| panic!("exec: {e}"));
    assert_eq!((r.exit_code, out), (Some(0), &b"hi\n"[..]));
}

/// Starts a VM and runs `echo`: (start → agent ready, start → echo done).
fn start_and_echo(cfg: &SandboxConfig) -> (Sandbox, Duration, Duration) {
    let t0 = Instant::now();
    let mut sb = Sandbox::start(cfg).unwrap_or_else(|e| panic!("start: {e}"));
    let ready = t0.elapsed();
    let mut out = Vec::new();
    let r = sb.exec(echo(), &mut |s, d| {
        if s == OutputStream::Stdout {
            out.extend_from_slice(d)
        }
    });
    check_echo(r, &out);
    (sb, ready, t0.elapsed())
}

/// The pre-restore-page sequence on a restored VM, each step awaited: `CONNECT` and the
/// handshake (a second connection), `Rekey` with a fresh secret, entropy and the clock, the
/// policy `Ping`, then `echo` on that connection: (start → agent ready, start → echo done).
fn start_and_echo_round_trips(
    cfg: &SandboxConfig,
    policy: &GuestPolicy,
) -> (Sandbox, Duration, Duration) {
    let t0 = Instant::now();
    let sb = Sandbox::start(cfg).unwrap_or_else(|e| panic!("start: {e}"));
    let mut conn: GuestConn = sb
        .side_connection(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("handshake: {e}"));
    let new = SessionSecret::random().expect("secret");
    conn.rekey(&new, Some(policy.clone()), Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("rekey: {e}"));
    let ready = t0.elapsed();
    let mut out = Vec::new();
    let r = conn.exec(echo(), &mut |s, d| {
        if s == OutputStream::Stdout {
            out.extend_from_slice(d)
        }
    });
    check_echo(r, &out);
    let echoed = t0.elapsed();
    drop(conn);
    (sb, ready, echoed)
}

/// `smaps_rollup` fields of a process, KiB.
fn rollup(pid: u32) -> std::collections::HashMap<String, u64> {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let kib = v.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some((k.to_string(), kib))
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(VMM_SUBCOMMAND) {
        vmm_process::run_vmm_mode(args[2..].to_vec());
    }
    let colds = env_usize("VOIDBOX_BENCH_COLD", 3).max(1);
    let restores = env_usize("VOIDBOX_BENCH_RESTORES", 10).max(1);
    let concurrent = env_usize("VOIDBOX_BENCH_CONCURRENT", 4).max(1);
    let image = GuestImage::ensure(ProgressMode::Plain).unwrap_or_else(|e| panic!("{e}"));
    let cfg = self_vmm_config(image.clone(), MEMORY_MB, Duration::from_secs(300));

    // Golden snapshot creation (one cold boot + the snapshot) in a private cache.
    let t = Instant::now();
    let (_cache, lease) = private_golden(&cfg);
    let create_total = t.elapsed();
    let meta = lease.entry.meta.clone();
    let disk = lease.entry.disk_bytes;

    let mut cold_ready = Vec::new();
    let mut cold_echo = Vec::new();
    for i in 0..colds {
        let (sb, ready, echo) = start_and_echo(&cfg);
        eprintln!(
            "cold {}/{colds}: ready {:.0} ms, echo done {:.0} ms",
            i + 1,
            ms(ready),
            ms(echo)
        );
        cold_ready.push(ms(ready));
        cold_echo.push(ms(echo));
        drop(sb);
    }

    let mut warm = cfg.clone();
    // What `apply` sends a command box (an allowlist and limits), so both paths carry one.
    let policy = GuestPolicy {
        allowlist: Some(vec!["echo".into(), "sh".into()]),
        ..GuestPolicy::default()
    };
    warm.policy = Some(policy.clone());
    warm.restore = Some(lease.restore.clone());
    let mut r_ready = Vec::new();
    let mut r_echo = Vec::new();
    let mut r_vmm = Vec::new();
    let mut o_ready = Vec::new();
    let mut o_echo = Vec::new();
    for i in 0..restores {
        let (sb, ready, echo) = start_and_echo(&warm);
        let vmm = sb.timings().restore.map_or(f64::NAN, ms);
        drop(sb);
        let (sb, old_ready, old_echo) = start_and_echo_round_trips(&warm, &policy);
        drop(sb);
        eprintln!(
            "restore {}/{restores}: page: ready {:.1} ms (VMM restore {vmm:.2} ms), echo done {:.0} ms; \
             round trips: ready {:.0} ms, echo done {:.0} ms",
            i + 1,
            ms(ready),
            ms(echo),
            ms(old_ready),
            ms(old_echo),
        );
        r_ready.push(ms(ready));
        r_echo.push(ms(echo));
        r_vmm.push(vmm);
        o_ready.push(ms(old_ready));
        o_echo.push(ms(old_echo));
    }

    // N restores alive at once: how much of their memory is shared (the snapshot's pages,
    // mapped copy-on-write from one file) versus private.
    let t = Instant::now();
    let vms: Vec<Sandbox> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..concurrent)
            .map(|_| s.spawn(|| start_and_echo(&warm).0))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("restore thread")))
            .collect()
    });
    let conc_wall = t.elapsed();
    let rolls: Vec<_> = vms.iter().map(|v| rollup(v.vmm_pid())).collect();
    let sum = |k: &str| {
        rolls
            .iter()
            .map(|r| r.get(k).copied().unwrap_or(0))
            .sum::<u64>()
    };
    let (rss, pss) = (sum("Rss"), sum("Pss"));
    let shared = sum("Shared_Clean") + sum("Shared_Dirty");
    let private = sum("Private_Clean") + sum("Private_Dirty");
    drop(vms);

    let (cr_min, cr_med, cr_max) = stats(&mut cold_ready);
    let (ce_min, ce_med, ce_max) = stats(&mut cold_echo);
    let (rr_min, rr_med, rr_max) = stats(&mut r_ready);
    let (re_min, re_med, re_max) = stats(&mut r_echo);
    let (rv_min, rv_med, rv_max) = stats(&mut r_vmm);
    let (or_min, or_med, or_max) = stats(&mut o_ready);
    let (oe_min, oe_med, oe_max) = stats(&mut o_echo);
    println!(
        "voidbox snapshot benchmark: {MEMORY_MB} MiB, 1 vCPU, image profile {}, {colds} cold boots, {restores} restores",
        image.profile
    );
    println!("host: {}", host_description());
    println!();
    println!("| measure (ms) | min | median | max |");
    println!("|---|---:|---:|---:|");
    println!("| cold boot → guest agent ready (authenticated, re-keyed) | {cr_min:.0} | {cr_med:.0} | {cr_max:.0} |");
    println!("| restore → ready, restore page (VMM restored, page filled, connection open) | {rr_min:.1} | {rr_med:.1} | {rr_max:.1} |");
    println!("| … of which the VMM's restore (state, devices, vCPUs, page) | {rv_min:.2} | {rv_med:.2} | {rv_max:.2} |");
    println!("| restore → ready, previous round trips (connect, handshake, re-key, policy) | {or_min:.0} | {or_med:.0} | {or_max:.0} |");
    println!("| cold boot → first `echo` done | {ce_min:.0} | {ce_med:.0} | {ce_max:.0} |");
    println!(
        "| restore → first `echo` done, restore page | {re_min:.0} | {re_med:.0} | {re_max:.0} |"
    );
    println!("| restore → first `echo` done, previous round trips | {oe_min:.0} | {oe_med:.0} | {oe_max:.0} |");
    println!();
    println!("| ratio (median cold / median restore) | value |");
    println!("|---|---:|");
    println!("| to guest agent ready | {:.0}× |", cr_med / rr_med);
    println!("| to end of first `echo` | {:.1}× |", ce_med / re_med);
    println!();
    println!("| golden snapshot | value |");
    println!("|---|---:|");
    println!(
        "| creation, total (cold boot + snapshot) | {:.1} s |",
        create_total.as_secs_f64()
    );
    println!(
        "| … snapshot request → files written | {} ms |",
        meta.snapshot_ms
    );
    println!("| … vCPUs paused | {} µs |", meta.pause_us);
    println!(
        "| size on disk (sparse memory file + state) | {:.1} MiB |",
        disk as f64 / 1048576.0
    );
    println!("| guest memory (file length) | {MEMORY_MB} MiB |");
    println!(
        "| state blob | {:.1} KiB |",
        meta.state_bytes as f64 / 1024.0
    );
    println!();
    println!("| {concurrent} VMs restored at once, each after one `echo` | value |");
    println!("|---|---:|");
    println!(
        "| wall time, all {concurrent} ready + echoed | {:.0} ms |",
        ms(conc_wall)
    );
    println!("| sum of RSS | {:.1} MiB |", rss as f64 / 1024.0);
    println!(
        "| sum of PSS (shared pages split between sharers) | {:.1} MiB |",
        pss as f64 / 1024.0
    );
    println!(
        "| shared (clean + dirty) | {:.1} MiB |",
        shared as f64 / 1024.0
    );
    println!(
        "| private (clean + dirty) | {:.1} MiB |",
        private as f64 / 1024.0
    );
    println!(
        "| private per VM | {:.1} MiB |",
        private as f64 / 1024.0 / concurrent as f64
    );
}
