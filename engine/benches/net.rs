//! Guest→host TCP through the user-mode NAT, against the same workload over the guest's own
//! loopback (the in-guest baseline: this host interprets guest kernel code, so absolute
//! figures mostly measure the guest kernel).
//!
//! `cargo bench -p voidbox --bench net` (env: `VOIDBOX_BENCH_MIB` bytes per throughput run,
//! default 8; `VOIDBOX_BENCH_RR` connect+request+close round trips, default 100). Needs
//! `/dev/kvm`, the guest image and gcc (the guest client `benches/guest/netbench.c` is built
//! static). This binary doubles as its own VMM (`net __vmm …`).
//!
//! The split: CPU time of the VMM's `net` thread (virtio-net + NAT + host sockets) and of its
//! `vcpu0` thread (the guest: its kernel's TCP stack, interpreted, and the client), read from
//! `/proc/PID/task/*/stat` around each workload.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{env_usize, host_description, self_vmm_config};

use voidbox::image::ProgressMode;
use voidbox::sandbox::{vmm_process, GuestImage, Sandbox, VMM_SUBCOMMAND};
use voidbox_protocol::{ExecRequest, OutputStream};

/// The host server: first byte 'T' → read to EOF, answer "OK"; 'G' → answer 128 bytes.
fn serve(listener: TcpListener) {
    for conn in listener.incoming() {
        let Ok(mut c) = conn else { continue };
        std::thread::spawn(move || {
            let mut kind = [0u8; 1];
            if c.read_exact(&mut kind).is_err() {
                return;
            }
            if kind[0] == b'T' {
                let _ = std::io::copy(&mut c, &mut std::io::sink());
                let _ = c.write_all(b"OK");
            } else {
                let mut req = [0u8; 1]; // the "\n" after 'G'
                let _ = c.read_exact(&mut req);
                let _ = c.write_all(&[b'r'; 128]);
            }
        });
    }
}

/// Static guest client.
fn build_client(dir: &Path) -> Vec<u8> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/guest/netbench.c");
    let out = dir.join("netbench");
    let st = Command::new("gcc")
        .args(["-O2", "-static", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("gcc is needed to build the guest client: {e}"));
    assert!(st.success(), "gcc failed on {}", src.display());
    std::fs::read(&out).unwrap_or_else(|e| panic!("{e}"))
}

/// CPU seconds (user + system) of the VMM's threads named `net` and `vcpu0`.
fn thread_cpu(pid: u32) -> (f64, f64) {
    let tick = 100.0; // USER_HZ
    let (mut net, mut vcpu) = (0.0, 0.0);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (net, vcpu);
    };
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        // After "pid (comm) ": state is field 0, utime 11, stime 12.
        let cpu = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        let secs = (cpu(11) + cpu(12)) / tick;
        match comm {
            "net" => net += secs,
            "vcpu0" => vcpu += secs,
            _ => {}
        }
    }
    (net, vcpu)
}

/// Runs `/workspace/netbench ARGS` and returns its stdout lines as numbers (microseconds).
fn run(sb: &mut Sandbox, args: &[String]) -> Vec<f64> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let r = sb
        .exec(
            ExecRequest {
                program: "/workspace/netbench".into(),
                args: args.to_vec(),
                timeout_secs: Some(1800),
                ..ExecRequest::default()
            },
            &mut |s, d| match s {
                OutputStream::Stdout => out.extend_from_slice(d),
                OutputStream::Stderr => err.extend_from_slice(d),
            },
        )
        .unwrap_or_else(|e| panic!("exec: {e}"));
    assert_eq!(
        r.exit_code,
        Some(0),
        "netbench {args:?}: {} after {} lines; NAT denials: {:?}",
        String::from_utf8_lossy(&err),
        String::from_utf8_lossy(&out).lines().count(),
        sb.net_denials()
    );
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(f64::NAN)
}

struct Row {
    name: String,
    value: String,
    net_cpu_ms: f64,
    vcpu_cpu_ms: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(VMM_SUBCOMMAND) {
        vmm_process::run_vmm_mode(args[2..].to_vec());
    }
    let mib = env_usize("VOIDBOX_BENCH_MIB", 8).max(1);
    let n_rr = env_usize("VOIDBOX_BENCH_RR", 100).max(1);
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let client = build_client(tmp.path());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = listener.local_addr().map_or(0, |a| a.port());
    std::thread::spawn(move || serve(listener));

    let image = GuestImage::ensure(ProgressMode::Plain).unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = self_vmm_config(image.clone(), 256, Duration::from_secs(300));
    cfg.network = Some(voidbox_net::NatConfig {
        policy: voidbox_net::NetworkPolicy {
            allow_host_ports: vec![port],
            connections_per_second: 10_000,
            ..voidbox_net::NetworkPolicy::default()
        },
        // No DNS in this workload; a closed local port keeps the NAT off the host's resolver.
        dns_upstreams: vec!["127.0.0.1:9".parse().unwrap_or_else(|e| panic!("{e}"))],
        guest_mac: voidbox_net::DEFAULT_GUEST_MAC,
        publish: Vec::new(),
        publish_unix: Vec::new(),
        services: Vec::new(),
    });
    let mut sb = Sandbox::start(&cfg).unwrap_or_else(|e| panic!("VM: {e}"));
    sb.write_file("/workspace/netbench", &client, Some(0o755))
        .unwrap_or_else(|e| panic!("copy client: {e}"));
    let pid = sb.vmm_pid();
    let gw = voidbox_net::GATEWAY_IP.to_string();

    let mut rows = Vec::new();
    let mut measure = |name: &str, args: Vec<String>, summarize: &dyn Fn(Vec<f64>) -> String| {
        let (n0, v0) = thread_cpu(pid);
        let v = run(&mut sb, &args);
        let (n1, v1) = thread_cpu(pid);
        eprintln!("{name}: done");
        rows.push(Row {
            name: name.to_string(),
            value: summarize(v),
            net_cpu_ms: (n1 - n0) * 1e3,
            vcpu_cpu_ms: (v1 - v0) * 1e3,
        });
    };
    let tput = |v: Vec<f64>| {
        let us = v.first().copied().unwrap_or(f64::NAN);
        format!("{:.1} MiB/s", mib as f64 / (us / 1e6))
    };
    let rr = |mut v: Vec<f64>| {
        format!(
            "p50 {:.2} ms, p90 {:.2} ms",
            pct(&mut v, 0.5) / 1e3,
            pct(&mut v, 0.9) / 1e3
        )
    };
    let (m, n) = (mib.to_string(), n_rr.to_string());
    // A VM's first TCP connection (its kernel's first `connect`) before anything else, then
    // its second: the gap is the one-time work of the first connect.
    let one = |v: Vec<f64>| format!("{:.2} ms", v.first().copied().unwrap_or(f64::NAN) / 1e3);
    for which in ["first", "second"] {
        measure(
            &format!("the VM's {which} connect+request+close via NAT"),
            vec!["rr".into(), gw.clone(), port.to_string(), "1".into()],
            &one,
        );
    }
    measure(
        &format!("throughput guest→host via NAT ({mib} MiB)"),
        vec!["tput".into(), gw.clone(), port.to_string(), m.clone()],
        &tput,
    );
    measure(
        &format!("throughput guest loopback ({mib} MiB)"),
        vec!["local".into(), "tput".into(), m],
        &tput,
    );
    measure(
        &format!("connect+request+close via NAT (n={n_rr})"),
        vec!["rr".into(), gw, port.to_string(), n.clone()],
        &rr,
    );
    measure(
        &format!("connect+request+close guest loopback (n={n_rr})"),
        vec!["local".into(), "rr".into(), n],
        &rr,
    );
    sb.stop();

    println!(
        "voidbox network benchmark: guest→host TCP through the NAT vs the guest's loopback, \
         256 MiB, 1 vCPU, image profile {}",
        image.profile
    );
    println!("host: {}", host_description());
    println!();
    println!("| workload | result | VMM `net` thread CPU (NAT + virtio-net), ms | `vcpu0` CPU (guest), ms |");
    println!("|---|---|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.0} | {:.0} |",
            r.name, r.value, r.net_cpu_ms, r.vcpu_cpu_ms
        );
    }
}
