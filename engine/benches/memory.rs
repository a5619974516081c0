//! What a VM's memory size costs, to choose the default `memory_mb` (issue #23): for each
//! size, a cold boot to "guest agent ready", the golden snapshot made from it (creation time
//! and size on disk), a restore to "ready", the guest's own view after boot (`MemTotal`,
//! `MemAvailable`) and the VMM's resident memory once restored, plus how many such VMs the
//! scheduler's memory budget lets run at once per GiB of host memory.
//!
//! `cargo bench -p voidbox --bench memory` (env: `VOIDBOX_BENCH_SIZES`, MiB, comma-separated,
//! default `128,256,512,1024`). Needs `/dev/kvm` and the guest image; golden snapshots go to a
//! private cache. This binary doubles as its own VMM (`memory __vmm …`).

mod common;

use std::time::{Duration, Instant};

use common::{host_description, ms, private_golden, self_vmm_config};

use voidbox::apply::VM_OVERHEAD_MB;
use voidbox::image::ProgressMode;
use voidbox::sandbox::{vmm_process, GuestImage, Sandbox, VMM_SUBCOMMAND};
use voidbox_protocol::{ExecRequest, OutputStream};

/// `/proc/meminfo` of the guest, in MiB: (MemTotal, MemAvailable).
fn guest_meminfo(sb: &mut Sandbox) -> (u64, u64) {
    let mut out = Vec::new();
    sb.exec(
        ExecRequest {
            program: "cat".into(),
            args: vec!["/proc/meminfo".into()],
            ..ExecRequest::default()
        },
        &mut |s, d| {
            if s == OutputStream::Stdout {
                out.extend_from_slice(d)
            }
        },
    )
    .unwrap_or_else(|e| panic!("exec: {e}"));
    let text = String::from_utf8_lossy(&out);
    let field = |k: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(k)?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map_or(0, |kib| kib / 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// Resident memory of a process, MiB.
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

struct Row {
    mb: u32,
    cold_ms: f64,
    create_ms: f64,
    disk_mib: f64,
    restore_ms: f64,
    total: u64,
    available: u64,
    rss: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(VMM_SUBCOMMAND) {
        vmm_process::run_vmm_mode(args[2..].to_vec());
    }
    let sizes: Vec<u32> = std::env::var("VOIDBOX_BENCH_SIZES")
        .unwrap_or_else(|_| "128,256,512,1024".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|e| panic!("VOIDBOX_BENCH_SIZES: {s}: {e}"))
        })
        .collect();
    let image = GuestImage::ensure(ProgressMode::Plain).unwrap_or_else(|e| panic!("{e}"));
    let mut rows = Vec::new();
    for mb in sizes {
        let cfg = self_vmm_config(image.clone(), mb, Duration::from_secs(300));
        let t = Instant::now();
        let sb = Sandbox::start(&cfg).unwrap_or_else(|e| panic!("cold boot {mb} MiB: {e}"));
        let cold = t.elapsed();
        drop(sb);
        let t = Instant::now();
        let (_cache, lease) = private_golden(&cfg);
        let create = t.elapsed();
        let mut warm = cfg.clone();
        warm.restore = Some(lease.restore.clone());
        let t = Instant::now();
        let mut sb = Sandbox::start(&warm).unwrap_or_else(|e| panic!("restore {mb} MiB: {e}"));
        let restore = t.elapsed();
        let (total, available) = guest_meminfo(&mut sb);
        let rss = rss_mib(sb.vmm_pid());
        drop(sb);
        eprintln!(
            "{mb} MiB: cold {:.1} s, snapshot created in {:.1} s, restore {:.0} ms",
            cold.as_secs_f64(),
            create.as_secs_f64(),
            ms(restore)
        );
        rows.push(Row {
            mb,
            cold_ms: ms(cold),
            create_ms: ms(create),
            disk_mib: lease.entry.disk_bytes as f64 / (1 << 20) as f64,
            restore_ms: ms(restore),
            total,
            available,
            rss,
        });
    }
    println!(
        "voidbox guest memory sizes: cold boot, golden snapshot, restore, guest and host memory; image profile {}, 1 vCPU",
        image.profile
    );
    println!("host: {}", host_description());
    println!();
    println!("| memory_mb | cold boot → ready | snapshot creation (boot + snapshot) | snapshot on disk | restore → ready | guest MemTotal / MemAvailable | VMM RSS after restore + `cat` | VMs per GiB of budget |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.1} s | {:.1} s | {:.1} MiB | {:.0} ms | {} / {} MiB | {:.1} MiB | {:.1} |",
            r.mb,
            r.cold_ms / 1e3,
            r.create_ms / 1e3,
            r.disk_mib,
            r.restore_ms,
            r.total,
            r.available,
            r.rss,
            1024.0 / (u64::from(r.mb) + VM_OVERHEAD_MB) as f64
        );
    }
}
