//! Test harness (cargo feature `testing`): a real DNS resolver on loopback.
//!
//! Needs Debian's `dnsmasq` (package `dnsmasq-base`, binary `/usr/sbin/dnsmasq`).
//!
//! ```no_run
//! use voidbox_net::testing::Dnsmasq;
//! let dns = Dnsmasq::start(&[("allowed.test", "127.0.0.1".parse().unwrap())]).unwrap();
//! let upstream = dns.addr(); // 127.0.0.1:<free port>, UDP and TCP
//! ```

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};

/// Where the harness looks for dnsmasq.
pub const DNSMASQ: &str = "/usr/sbin/dnsmasq";

/// How long [`Dnsmasq::start`] waits for the resolver to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The dnsmasq binary, or an error naming the Debian package.
pub fn require_dnsmasq() -> io::Result<PathBuf> {
    let path = PathBuf::from(DNSMASQ);
    if path.is_file() {
        Ok(path)
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{DNSMASQ} missing: apt-get install -y dnsmasq-base"),
        ))
    }
}

/// A dnsmasq answering only for its `--address` records (no upstream, no hosts file), on
/// `127.0.0.1:<free port>` (UDP and TCP); killed on drop.
pub struct Dnsmasq {
    child: Child,
    addr: SocketAddr,
}

impl Dnsmasq {
    /// Starts dnsmasq with one `--address=/name/ip` per record and waits until it answers.
    pub fn start(records: &[(&str, IpAddr)]) -> io::Result<Dnsmasq> {
        Dnsmasq::start_with(records, &[])
    }

    /// Like [`Dnsmasq::start`], with extra dnsmasq options (`--cname=…`, `--host-record=…`).
    pub fn start_with(records: &[(&str, IpAddr)], extra: &[&str]) -> io::Result<Dnsmasq> {
        let bin = require_dnsmasq()?;
        let mut last = None;
        for _ in 0..5 {
            let port = free_port()?;
            // A name only this instance knows: a dnsmasq of another test that raced onto
            // the same port (UDP binds with SO_REUSEADDR may share it) cannot pass as ours.
            let ready = ready_name(port);
            let mut cmd = Command::new(&bin);
            cmd.args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--user=root",
                "--pid-file",
                "--log-facility=-",
            ])
            .arg(format!("--port={port}"));
            for (name, ip) in records {
                cmd.arg(format!("--address=/{name}/{ip}"));
            }
            cmd.arg(format!("--address=/{ready}/{READY_IP}"));
            cmd.args(extra);
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = cmd.spawn()?;
            let mut dns = Dnsmasq {
                child,
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
            };
            match dns.wait_ready(&ready) {
                Ok(()) => return Ok(dns),
                Err(e) => last = Some(e), // port raced away, or dnsmasq failed: retry
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("dnsmasq did not start")))
    }

    /// The resolver's address (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until this instance answers `ready` with [`READY_IP`] over UDP and accepts TCP
    /// connections, and is still running (one that lost the port to another exits).
    fn wait_ready(&mut self, ready: &str) -> io::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!("dnsmasq exited: {status}")));
            }
            let ours = query_udp(self.addr, ready, RecordType::A, Duration::from_millis(200))
                .is_ok_and(|m| {
                    m.answers
                        .iter()
                        .any(|r| r.data.ip_addr() == Some(IpAddr::from(READY_IP)))
                });
            if ours
                && TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
                && self.child.try_wait()?.is_none()
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "dnsmasq did not answer",
        ))
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address every instance gives its own ready name.
const READY_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 53);

/// A name no other instance (in this or another test process) answers.
fn ready_name(port: u16) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("ready-{}-{n}-{port}.voidbox.test", std::process::id())
}

/// A port free on 127.0.0.1 for both UDP and TCP (at the time of the call).
fn free_port() -> io::Result<u16> {
    for _ in 0..20 {
        let udp = UdpSocket::bind("127.0.0.1:0")?;
        let port = udp.local_addr()?.port();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(io::Error::other("no free port"))
}

/// Encodes a recursive query for `name`/`rtype` with id `id`.
pub fn query_message(id: u16, name: &str, rtype: RecordType) -> io::Result<Vec<u8>> {
    let name = Name::from_ascii(name).map_err(|e| io::Error::other(e.to_string()))?;
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name, rtype));
    m.to_vec().map_err(|e| io::Error::other(e.to_string()))
}

/// Asks `server` over UDP (straight, not through a NAT) and returns the answer.
pub fn query_udp(
    server: SocketAddr,
    name: &str,
    rtype: RecordType,
    timeout: Duration,
) -> io::Result<Message> {
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    sock.set_read_timeout(Some(timeout))?;
    sock.connect(server)?;
    sock.send(&query_message(0x5151, name, rtype)?)?;
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf)?;
    Message::from_vec(&buf[..n]).map_err(|e| io::Error::other(e.to_string()))
}
