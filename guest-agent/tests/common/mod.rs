//! Test harness: runs the real agent binary as a host process on a Unix socket.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use voidbox_protocol::blocking::{client_handshake, read_message, write_message};
use voidbox_protocol::*;

pub const SECRET_HEX: &str = "5f3c0e8a9b7d6c5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e";

pub fn secret() -> SessionSecret {
    SessionSecret::from_hex(SECRET_HEX).unwrap()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The agent binary under test: `$VOIDBOX_AGENT_BIN` (e.g. the static image build) or the
/// one Cargo built for this test run.
pub fn agent_bin() -> std::ffi::OsString {
    std::env::var_os("VOIDBOX_AGENT_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_voidbox-guest-agent").into())
}

/// A running agent process with its own temporary root.
pub struct Agent {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
}

impl Agent {
    pub fn start() -> Agent {
        Agent::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Agent {
        Agent::start_as(extra, None)
    }

    /// Starts the agent, as user/group `uid` when given (the caller must be root for that).
    pub fn start_as(extra: &[&str], uid: Option<u32>) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        // An agent of another uid creates its socket and root in the directory.
        let mode = if uid.is_some() { 0o777 } else { 0o755 };
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        let sock = dir.path().join("agent.sock");
        let root = dir.path().join("root");
        let mut cmd = Command::new(agent_bin());
        cmd.arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--secret-hex")
            .arg(SECRET_HEX)
            .arg("--root")
            .arg(&root)
            .args(extra)
            .stdin(Stdio::null());
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        if !is_root() || uid.is_some() {
            cmd.arg("--no-drop");
        }
        let child = cmd.spawn().expect("spawn agent");
        let agent = Agent { child, dir, sock };
        let start = Instant::now();
        while !agent.sock.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "agent did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        agent
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn raw(&self) -> UnixStream {
        // The socket file appears at bind(), a moment before listen(): until then a connect
        // is refused.
        let start = Instant::now();
        let s = loop {
            match UnixStream::connect(&self.sock) {
                Ok(s) => break s,
                Err(e)
                    if e.kind() == std::io::ErrorKind::ConnectionRefused
                        && start.elapsed() < Duration::from_secs(10) =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("connect {}: {e}", self.sock.display()),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    pub fn connect(&self) -> Client {
        self.connect_with(None)
    }

    pub fn connect_with(&self, policy: Option<GuestPolicy>) -> Client {
        let mut s = self.raw();
        let pong = client_handshake(&mut s, &secret(), policy).expect("handshake");
        Client {
            stream: s,
            next: 1,
            pong,
        }
    }

    /// Asserts the agent process is still alive.
    pub fn assert_alive(&mut self) {
        assert!(self.child.try_wait().unwrap().is_none(), "agent died");
    }

    /// VmHWM (peak RSS) of the agent in KiB.
    pub fn vm_hwm_kb(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An authenticated connection.
pub struct Client {
    pub stream: UnixStream,
    pub next: u64,
    pub pong: Pong,
}

/// Collected result of one exec.
#[derive(Debug, Default)]
pub struct ExecResult {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub response: Option<ExecResponse>,
    pub error: Option<ErrorResponse>,
}

impl ExecResult {
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn resp(&self) -> &ExecResponse {
        self.response
            .as_ref()
            .unwrap_or_else(|| panic!("no ExecResponse: {:?}", self.error))
    }
}

/// Asserts that an exec was refused by the allowlist (exit 126, nothing ran) and returns
/// the guest's message.
pub fn refusal(r: &ExecResult) -> String {
    let resp = r.resp();
    assert_eq!(resp.exit_code, Some(EXIT_NOT_ALLOWED), "{resp:?}");
    assert!(r.stdout.is_empty() && r.stderr.is_empty(), "{r:?}");
    resp.error.clone().expect("a refusal names the program")
}

pub fn sh(script: &str) -> ExecRequest {
    ExecRequest {
        program: "sh".into(),
        args: vec!["-c".into(), script.into()],
        ..Default::default()
    }
}

impl Client {
    pub fn id(&mut self) -> RequestId {
        let id = RequestId(self.next);
        self.next += 1;
        id
    }

    pub fn send(&mut self, msg: &Message) {
        write_message(&mut self.stream, msg).expect("send");
    }

    pub fn recv(&mut self) -> Message {
        read_message(&mut self.stream).expect("recv")
    }

    pub fn request(&mut self, msg: Message) -> Message {
        let id = msg.id();
        self.send(&msg);
        let reply = self.recv();
        assert_eq!(reply.id(), id, "reply for another request: {reply:?}");
        reply
    }

    /// Runs one exec and collects everything up to its final message.
    pub fn exec(&mut self, mut req: ExecRequest) -> ExecResult {
        req.id = self.id();
        self.send(&Message::ExecRequest(req));
        self.collect_one()
    }

    /// Reads messages of a single outstanding exec until it ends.
    pub fn collect_one(&mut self) -> ExecResult {
        let mut r = ExecResult::default();
        let mut seq = 0;
        loop {
            match self.recv() {
                Message::ExecOutputChunk(c) => {
                    assert_eq!(c.seq, seq, "sequence gap");
                    seq += 1;
                    match c.stream {
                        OutputStream::Stdout => r.stdout.extend_from_slice(&c.data),
                        OutputStream::Stderr => r.stderr.extend_from_slice(&c.data),
                    }
                }
                Message::ExecResponse(resp) => {
                    r.response = Some(resp);
                    return r;
                }
                Message::Error(e) => {
                    r.error = Some(e);
                    return r;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Runs several execs concurrently on this connection.
    pub fn exec_many(&mut self, reqs: Vec<ExecRequest>) -> Vec<ExecResult> {
        let mut ids = Vec::new();
        for mut req in reqs {
            req.id = self.id();
            ids.push(req.id);
            self.send(&Message::ExecRequest(req));
        }
        let mut results: HashMap<RequestId, ExecResult> = HashMap::new();
        let mut seqs: HashMap<RequestId, u64> = HashMap::new();
        let mut done = 0;
        while done < ids.len() {
            let msg = self.recv();
            let id = msg.id();
            let r = results.entry(id).or_default();
            match msg {
                Message::ExecOutputChunk(c) => {
                    let s = seqs.entry(id).or_default();
                    assert_eq!(c.seq, *s);
                    *s += 1;
                    r.stdout.extend_from_slice(&c.data);
                }
                Message::ExecResponse(resp) => {
                    r.response = Some(resp);
                    done += 1;
                }
                Message::Error(e) => {
                    r.error = Some(e);
                    done += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        ids.iter().map(|id| results.remove(id).unwrap()).collect()
    }
}

/// Whether `pid` exists and is not a zombie.
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}

/// Whether `pid` exists at all (zombie included).
pub fn process_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Zombie children of `parent`.
pub fn zombies_of(parent: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = s.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.first() == Some(&"Z") && f.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent) {
            out.push(pid);
        }
    }
    out
}

/// Waits until `cond` holds or `limit` passes.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Writes raw bytes.
pub fn write_raw(s: &mut UnixStream, bytes: &[u8]) {
    s.write_all(bytes).unwrap();
}

/// Reads until EOF (or error); returns whether the peer closed the connection.
pub fn closed_by_peer(s: &mut UnixStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Soft and hard value of the `/proc/self/limits` row starting with `name` in `out`.
pub fn limit_of(out: &str, name: &str) -> Vec<String> {
    let line = out
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("{name} in {out}"));
    line[name.len()..]
        .split_whitespace()
        .take(2)
        .map(String::from)
        .collect()
}
