//! Host directory shares (virtio-9p) against the guest's own tmpfs: sequential write and
//! read throughput and a stat-heavy walk (`find` over 1,000 files), in one real micro-VM.
//!
//! `cargo bench -p voidbox --bench shares` (env: `VOIDBOX_BENCH_MIB`, the file size, default
//! 64; `VOIDBOX_BENCH_RUNS`, default 3). Needs `/dev/kvm` and the guest image. Each
//! operation is one `sh -c` in the guest timed on the host, minus the median of an empty
//! `sh -c true` (a guest process start costs ≈0.7 s on a KVM that interprets guest kernel
//! code); medians of the runs. This binary doubles as its own VMM.

mod common;

use std::time::{Duration, Instant};

use common::{env_usize, host_description, self_vmm_config};

use voidbox::image::ProgressMode;
use voidbox::sandbox::shares::Share;
use voidbox::sandbox::{vmm_process, GuestImage, Sandbox, VMM_SUBCOMMAND};
use voidbox_protocol::ExecRequest;

const SHARE: &str = "/workspace/share";
const TMPFS: &str = "/tmp/bench";
const FILES: usize = 1000;

fn sh(sb: &mut Sandbox, script: &str) -> Duration {
    let t = Instant::now();
    let mut err = Vec::new();
    let r = sb
        .exec(
            ExecRequest {
                program: "sh".into(),
                args: vec!["-c".into(), script.into()],
                ..ExecRequest::default()
            },
            &mut |s, d| {
                if s == voidbox_protocol::OutputStream::Stderr {
                    err.extend_from_slice(d)
                }
            },
        )
        .unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    assert_eq!(
        r.exit_code,
        Some(0),
        "{script}: {}",
        String::from_utf8_lossy(&err)
    );
    t.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(VMM_SUBCOMMAND) {
        vmm_process::run_vmm_mode(args[2..].to_vec());
    }
    let mib = env_usize("VOIDBOX_BENCH_MIB", 64).max(1);
    let runs = env_usize("VOIDBOX_BENCH_RUNS", 3).max(1);
    let image = GuestImage::ensure(ProgressMode::Plain).unwrap_or_else(|e| panic!("{e}"));
    let host = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // The walk's files, made on the host side of the share.
    let tree = host.path().join("tree");
    std::fs::create_dir(&tree).unwrap_or_else(|e| panic!("{e}"));
    for i in 0..FILES {
        std::fs::write(tree.join(format!("f{i:04}")), b"x").unwrap_or_else(|e| panic!("{e}"));
    }
    let mut cfg = self_vmm_config(image.clone(), 512, Duration::from_secs(600));
    cfg.shares = vec![Share {
        host: host.path().to_path_buf(),
        guest: SHARE.into(),
        read_only: false,
    }];
    let mut sb = Sandbox::start(&cfg).unwrap_or_else(|e| panic!("VM: {e}"));
    // The same walk on the guest's tmpfs.
    sh(
        &mut sb,
        &format!("mkdir -p {TMPFS}/tree && cd {TMPFS}/tree && i=0; while [ $i -lt {FILES} ]; do : > f$i; i=$((i+1)); done"),
    );
    let base = median((0..5).map(|_| sh(&mut sb, "true").as_secs_f64()).collect());
    let time = |sb: &mut Sandbox, script: &str| -> f64 {
        median(
            (0..runs)
                .map(|_| (sh(sb, script).as_secs_f64() - base).max(1e-6))
                .collect(),
        )
    };
    let mut rows = Vec::new();
    for (name, dir) in [("virtio-9p share", SHARE), ("guest tmpfs", TMPFS)] {
        let f = format!("{dir}/big");
        let write = time(
            &mut sb,
            &format!("dd if=/dev/zero of={f} bs=1M count={mib} conv=fsync 2>/dev/null"),
        );
        let read = time(
            &mut sb,
            &format!("dd if={f} of=/dev/null bs=1M 2>/dev/null"),
        );
        let walk = time(&mut sb, &format!("find {dir}/tree | wc -l >/dev/null"));
        let stat = time(&mut sb, &format!("ls -l {dir}/tree >/dev/null"));
        rows.push((name, mib as f64 / write, mib as f64 / read, walk, stat));
        sh(&mut sb, &format!("rm -f {f}"));
    }
    sb.stop();
    println!(
        "voidbox shares benchmark: {mib} MiB file, {FILES}-file walk, {runs} runs (medians), 512 MiB VM, image profile {}",
        image.profile
    );
    println!("host: {}", host_description());
    println!(
        "empty `sh -c true` baseline subtracted: {:.0} ms",
        base * 1e3
    );
    println!();
    println!("| target | seq write MiB/s | seq read MiB/s | `find` 1,000 files, ms | `ls -l` 1,000 files, ms |");
    println!("|---|---:|---:|---:|---:|");
    for (name, w, r, walk, stat) in rows {
        println!(
            "| {name} | {w:.0} | {r:.0} | {:.0} | {:.0} |",
            walk * 1e3,
            stat * 1e3
        );
    }
}
