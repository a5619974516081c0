//! Host → guest requests through a published port (`voidbox run --publish`): busybox `httpd`
//! in a VM restored from the golden snapshot, and one HTTP/1.0 request per connection
//! (connect, `GET`, read to EOF, close) from the host, against the same request to a host
//! server on loopback (the floor: what the host's own TCP costs).
//!
//! `cargo bench -p voidbox --bench publish` (`VOIDBOX_BENCH_RR` requests per path, default
//! 100). Needs `/dev/kvm` and the guest image. The guest side of each connection is opened
//! by the NAT and served by the guest kernel's TCP stack and `httpd` (one process start per
//! request: busybox `httpd -f` forks per connection), so on a host that interprets guest
//! kernel code the figures mostly measure the guest.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{env_usize, host_description, ms};

const BODY: &str = "published-ok\n";

/// One request: connect, GET, read the whole answer; its latency.
fn request(addr: SocketAddr) -> std::io::Result<(Duration, String)> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(b"GET /index.html HTTP/1.0\r\nHost: bench\r\n\r\n")?;
    let mut r = String::new();
    s.read_to_string(&mut r)?;
    Ok((t0.elapsed(), r))
}

/// A host server answering every connection like `httpd` (status line, headers, body).
fn host_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let mut buf = [0u8; 512];
            let _ = c.read(&mut buf);
            let _ = write!(
                c,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{BODY}",
                BODY.len()
            );
        }
    });
    addr
}

fn measure(addr: SocketAddr, n: usize) -> Vec<f64> {
    let mut v: Vec<f64> = (0..n)
        .map(|_| {
            let (d, r) = request(addr).unwrap_or_else(|e| panic!("request to {addr}: {e}"));
            assert!(r.ends_with(BODY), "unexpected answer: {r}");
            ms(d)
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

fn pct(v: &[f64], p: f64) -> f64 {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let n = env_usize("VOIDBOX_BENCH_RR", 100).max(1);
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let mut vm = Command::new(env!("CARGO_BIN_EXE_voidbox"))
        .args(["run", "--memory-mb", "128", "--timeout", "900", "--publish"])
        .arg(format!("127.0.0.1:{port}:8080"))
        .args([
            "--",
            "sh",
            "-c",
            "mkdir -p /tmp/www && printf 'published-ok\\n' > /tmp/www/index.html && echo serving && exec httpd -f -p 8080 -h /tmp/www",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("voidbox run");
    let mut line = String::new();
    BufReader::new(vm.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert_eq!(line, "serving\n", "the guest server did not start");
    let published: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    // Ready once the first request is answered.
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        match request(published) {
            Ok((d, r)) if r.ends_with(BODY) => break d,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            other => panic!("no answer on the published port: {other:?}"),
        }
    };
    let guest = measure(published, n);
    let host = measure(host_server(), n);
    let _ = vm.kill();
    let _ = vm.wait();
    println!("host: {}", host_description());
    println!("{n} requests per path (connect, GET, read to EOF, close), latency in ms");
    println!("| path | p50 | p95 | max |");
    println!("|---|---:|---:|---:|");
    for (name, v) in [
        ("host → published port → guest httpd", &guest),
        ("host → host server on loopback (floor)", &host),
    ] {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} |",
            pct(v, 0.5),
            pct(v, 0.95),
            pct(v, 1.0)
        );
    }
    println!(
        "first request after `serving` (the server's start included): {:.1} ms",
        ms(first)
    );
}
