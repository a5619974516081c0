//! The host side of the guest-agent connection: the hybrid-vsock `CONNECT` exchange, the
//! authenticated handshake, and request/response exchanges. Everything the guest sends is
//! hostile: frames are size-checked by the protocol crate, replies for other ids are
//! bounded, file reads are capped.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use voidbox_protocol::blocking::{client_handshake, read_message, write_message};
use voidbox_protocol::handshake::check_pong;
use voidbox_protocol::{
    ErrorCode, ExecAttach, ExecRequest, ExecResponse, ExecSignal, ExecStdin, GuestPolicy, HeldInfo,
    HeldQuery, Message, OutputStream, Ping, Pong, ProtocolError, PtyClose, PtyData, PtyOpen,
    PtyResize, ReadFile, Rekey, RequestIdAllocator, SessionSecret, Shutdown, ShutdownAction,
    WriteFile, Zeroizing, CAP_HELD, CAP_REKEY, FILE_CHUNK_SIZE,
};

use super::error::SandboxError;

/// vsock port of the guest agent.
pub const AGENT_PORT: u32 = 1234;
/// Messages for unknown request ids tolerated per exchange before giving up.
const MAX_STRAY_MESSAGES: usize = 1024;
/// Bytes of host entropy a [`GuestConn::rekey`] sends to reseed the guest RNG.
pub const REKEY_ENTROPY_LEN: usize = 64;
/// Largest stdin sent inline in an `ExecRequest`; larger ones are streamed.
pub const INLINE_STDIN_MAX: usize = 256 * 1024;
/// Bytes per streamed `ExecStdin` frame.
pub const STDIN_CHUNK: usize = 256 * 1024;

/// One `CONNECT` attempt on the VMM's hybrid-vsock socket. `Ok(None)`: the guest is not
/// listening yet (or the socket does not exist yet) — retry.
pub fn try_connect(
    uds: &Path,
    port: u32,
    timeout: Duration,
) -> Result<Option<UnixStream>, SandboxError> {
    let mut s = match UnixStream::connect(uds) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(SandboxError::io(format!("connect {}", uds.display()))(e)),
    };
    s.set_read_timeout(Some(timeout))
        .map_err(SandboxError::io("socket timeout"))?;
    if s.write_all(format!("CONNECT {port}\n").as_bytes()).is_err() {
        return Ok(None);
    }
    let Ok(line) = read_line(&mut s, 64) else {
        return Ok(None);
    };
    if line.starts_with(b"OK ") {
        s.set_read_timeout(None)
            .map_err(SandboxError::io("socket timeout"))?;
        Ok(Some(s))
    } else {
        Ok(None)
    }
}

/// An authenticated connection to the guest agent. Requests are sequential (`&mut self`).
pub struct GuestConn {
    stream: UnixStream,
    ids: RequestIdAllocator,
    /// A resumed guest's connection ([`GuestConn::resume`]) whose `CONNECT` reply and
    /// handshake `Pong` are read before the first reply to a request.
    pending: Option<Pending>,
    /// What the guest reported in its handshake (`None` until a resumed one answered).
    info: Option<voidbox_protocol::GuestInfo>,
}

/// The unread start of a resumed guest's connection.
struct Pending {
    ping: voidbox_protocol::RequestId,
    timeout: Duration,
}

/// What an exec produced besides the streamed output.
pub type ExecResult = ExecResponse;

impl GuestConn {
    /// Authenticates on a connected stream. A refused secret is [`SandboxError::AuthRejected`].
    pub fn handshake(
        mut stream: UnixStream,
        secret: &SessionSecret,
        policy: Option<GuestPolicy>,
        timeout: Duration,
    ) -> Result<(GuestConn, Pong), SandboxError> {
        stream
            .set_read_timeout(Some(timeout))
            .map_err(SandboxError::io("socket timeout"))?;
        let pong = client_handshake(&mut stream, secret, policy).map_err(|e| match e {
            ProtocolError::AuthFailed => SandboxError::AuthRejected,
            e => protocol("handshake", e),
        })?;
        stream
            .set_read_timeout(None)
            .map_err(SandboxError::io("socket timeout"))?;
        Ok((
            GuestConn {
                stream,
                ids: RequestIdAllocator::new(),
                pending: None,
                info: Some(pong.info.clone()),
            },
            pong,
        ))
    }

    /// Opens a connection to a guest just resumed from a snapshot, without waiting for it:
    /// `CONNECT` and a `Ping` under `secret` (the one its restore page delivered) go out in
    /// one write, and the caller's first request follows at once. The VMM's `OK` and the
    /// `Pong` are read before that request's reply ([`GuestConn::settle`]), within `timeout`;
    /// so the guest's first exchange is the caller's request, authenticated under the new
    /// secret, and no round trip comes before it.
    pub fn resume(
        uds: &Path,
        port: u32,
        secret: &SessionSecret,
        timeout: Duration,
    ) -> Result<GuestConn, SandboxError> {
        let mut stream = UnixStream::connect(uds)
            .map_err(SandboxError::io(format!("connect {}", uds.display())))?;
        let ids = RequestIdAllocator::new();
        let ping_id = ids.next_id();
        let mut ping = Ping::new(secret.clone(), None);
        ping.id = ping_id;
        let mut first = Zeroizing::new(format!("CONNECT {port}\n").into_bytes());
        first.extend_from_slice(&Zeroizing::new(
            Message::Ping(ping)
                .encode()
                .map_err(|e| protocol("handshake", e))?,
        ));
        stream
            .write_all(&first)
            .map_err(SandboxError::io("writing to the resumed guest"))?;
        Ok(GuestConn {
            stream,
            ids,
            pending: Some(Pending {
                ping: ping_id,
                timeout,
            }),
            info: None,
        })
    }

    /// Reads what [`GuestConn::resume`] left unread: the VMM's `CONNECT` reply, then the
    /// handshake's `Pong`. A refused handshake is [`SandboxError::Guest`] with the guest's
    /// reason (a wrong secret, or a restore page it refused).
    fn settle(&mut self) -> Result<(), SandboxError> {
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        let saved = self
            .stream
            .read_timeout()
            .map_err(SandboxError::io("socket timeout"))?;
        self.set_timeout(Some(p.timeout))?;
        let r = self.settle_exchange(p.ping, p.timeout);
        self.set_timeout(saved)?;
        r
    }

    fn settle_exchange(
        &mut self,
        ping: voidbox_protocol::RequestId,
        timeout: Duration,
    ) -> Result<(), SandboxError> {
        let during = "the resumed guest's handshake";
        match read_line(&mut self.stream, 64) {
            Ok(line) if line.starts_with(b"OK ") => {}
            Ok(_) => {
                return Err(protocol(
                    during,
                    ProtocolError::UnexpectedMessage {
                        expected: "OK <port>",
                        got: "another CONNECT reply",
                    },
                ))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(SandboxError::Timeout(during.into(), timeout))
            }
            Err(e) => {
                return Err(SandboxError::io(format!(
                    "{during}: the guest did not accept the connection"
                ))(e))
            }
        }
        let reply = match read_reply(&mut self.stream, during, timeout)? {
            Message::Error(e) if e.id == ping || e.id == voidbox_protocol::RequestId::RESERVED => {
                return Err(SandboxError::Guest {
                    what: during.into(),
                    code: e.code,
                    message: e.message,
                })
            }
            m => m,
        };
        let pong = check_pong(reply).map_err(|e| protocol(during, e))?;
        self.info = Some(pong.info);
        Ok(())
    }

    /// What the guest reported in its handshake (`None` for a resumed guest that has not
    /// answered a request yet).
    pub fn guest_info(&self) -> Option<&voidbox_protocol::GuestInfo> {
        self.info.as_ref()
    }

    fn send(&mut self, during: &str, msg: &Message) -> Result<(), SandboxError> {
        write_message(&mut self.stream, msg).map_err(|e| protocol(during, e))
    }

    /// Reads the next message for `id`, skipping (a bounded number of) others.
    fn recv_for(
        &mut self,
        during: &str,
        id: voidbox_protocol::RequestId,
    ) -> Result<Message, SandboxError> {
        self.settle()?;
        for _ in 0..MAX_STRAY_MESSAGES {
            let m = read_reply(&mut self.stream, during, Duration::ZERO)?;
            if m.id() == id {
                return Ok(m);
            }
        }
        Err(too_many_strays(during))
    }

    fn set_timeout(&self, t: Option<Duration>) -> Result<(), SandboxError> {
        self.stream
            .set_read_timeout(t)
            .map_err(SandboxError::io("socket timeout"))
    }

    /// Re-authenticating `Ping` → `Pong` round trip (a cheap liveness check).
    pub fn ping(
        &mut self,
        secret: &SessionSecret,
        timeout: Duration,
    ) -> Result<Duration, SandboxError> {
        let id = self.ids.next_id();
        let mut ping = Ping::new(secret.clone(), None);
        ping.id = id;
        let t0 = Instant::now();
        self.set_timeout(Some(timeout))?;
        self.send("ping", &Message::Ping(ping))?;
        let reply = self.recv_for("ping", id);
        self.set_timeout(None)?;
        match reply? {
            Message::Pong(_) => Ok(t0.elapsed()),
            other => Err(unexpected("ping", "Pong", other)),
        }
    }

    /// Re-keys the session (for VMs restored from a shared snapshot, whose clones share the
    /// secret, the RNG state and a stale clock): sends `Rekey` with `new_secret`,
    /// [`REKEY_ENTROPY_LEN`] bytes of host entropy and the host's current time, and waits for
    /// the `Ack` — the guest acknowledges only after reseeding its RNG and setting its clock,
    /// and only then rotates the secret. It then re-authenticates this connection with a
    /// `Ping` under `new_secret` carrying `policy` (which can only narrow the guest's policy)
    /// and returns its `Pong`, whose capabilities must confirm a full re-key
    /// ([`CAP_REKEY`]). Every reply is awaited for at most `timeout`.
    ///
    /// Errors: the guest's refusal is [`SandboxError::Guest`] (the old secret is then still
    /// valid); a refused `Ping` is [`SandboxError::AuthRejected`]; a guest that rotated the
    /// secret without reseeding and setting the clock is [`SandboxError::Guest`] with
    /// [`ErrorCode::Unsupported`]; no answer is [`SandboxError::Timeout`].
    pub fn rekey(
        &mut self,
        new_secret: &SessionSecret,
        policy: Option<GuestPolicy>,
        timeout: Duration,
    ) -> Result<Pong, SandboxError> {
        let entropy = host_entropy()?;
        self.set_timeout(Some(timeout))?;
        let result = self.rekey_exchange(new_secret, entropy, policy, timeout);
        self.set_timeout(None)?;
        result
    }

    fn rekey_exchange(
        &mut self,
        new_secret: &SessionSecret,
        entropy: Zeroizing<Vec<u8>>,
        policy: Option<GuestPolicy>,
        timeout: Duration,
    ) -> Result<Pong, SandboxError> {
        let in_time = |r: Result<Message, SandboxError>| match r {
            Err(SandboxError::Timeout(w, _)) => Err(SandboxError::Timeout(w, timeout)),
            r => r,
        };
        let id = self.ids.next_id();
        let rekey = Rekey::new(id, new_secret.clone(), unix_time_ns()?, entropy)
            .map_err(|e| protocol("rekey", e))?;
        self.send("rekey", &Message::Rekey(rekey))?;
        match in_time(self.recv_for("rekey", id))? {
            Message::Ack(_) => {}
            Message::Error(e) => {
                return Err(SandboxError::Guest {
                    what: "rekey".into(),
                    code: e.code,
                    message: e.message,
                })
            }
            other => return Err(unexpected("rekey", "Ack", other)),
        }
        let id = self.ids.next_id();
        let mut ping = Ping::new(new_secret.clone(), policy);
        ping.id = id;
        self.send("rekey ping", &Message::Ping(ping))?;
        let pong = check_pong(in_time(self.recv_for("rekey ping", id))?).map_err(|e| match e {
            ProtocolError::AuthFailed => SandboxError::AuthRejected,
            ProtocolError::Remote { code, message } => SandboxError::Guest {
                what: "rekey ping".into(),
                code,
                message,
            },
            e => protocol("rekey ping", e),
        })?;
        if !pong.info.capabilities.iter().any(|c| c == CAP_REKEY) {
            return Err(SandboxError::Guest {
                what: "rekey".into(),
                code: ErrorCode::Unsupported,
                message: format!(
                    "the guest rotated its secret without confirming an RNG reseed and clock \
                     set (no `{CAP_REKEY}` capability; it has {:?})",
                    pong.info.capabilities
                ),
            });
        }
        Ok(pong)
    }

    /// Runs a command; output chunks go to `on_output` as they arrive. `timeout` is
    /// enforced by the guest (which kills the process group); the host waits that long
    /// plus a grace period.
    ///
    /// A `stdin` larger than [`INLINE_STDIN_MAX`] does not ride in the request (whose JSON
    /// must fit one frame): it is streamed in [`STDIN_CHUNK`]-byte `ExecStdin` frames from a
    /// second thread while this one reads the output, so a child that writes while it reads
    /// never deadlocks against us, and any size works.
    pub fn exec(
        &mut self,
        req: ExecRequest,
        on_output: &mut dyn FnMut(OutputStream, &[u8]),
    ) -> Result<ExecResult, SandboxError> {
        self.exec_sampled(req, on_output, None)
    }

    /// [`GuestConn::exec`], asking the guest for its [`Telemetry`] every `sampling.every`
    /// while the command runs (from a second thread; each sample goes to
    /// `sampling.on_sample` as it arrives).
    ///
    /// [`Telemetry`]: voidbox_protocol::Telemetry
    pub fn exec_sampled(
        &mut self,
        mut req: ExecRequest,
        on_output: &mut dyn FnMut(OutputStream, &[u8]),
        sampling: Option<Sampling<'_>>,
    ) -> Result<ExecResult, SandboxError> {
        let id = self.ids.next_id();
        req.id = id;
        let streamed = (req.stdin.len() > INLINE_STDIN_MAX && !req.stdin_stream).then(|| {
            req.stdin_stream = true;
            std::mem::take(&mut req.stdin)
        });
        let host_timeout = req
            .timeout_secs
            .map(|s| Duration::from_secs(s.saturating_add(10)));
        self.set_timeout(host_timeout)?;
        self.send("exec", &Message::ExecRequest(req))?;
        if let Err(e) = self.settle() {
            self.set_timeout(None)?;
            return Err(e);
        }
        if streamed.is_none() && sampling.is_none() {
            let r = exec_replies(&mut self.stream, id, host_timeout, on_output, None);
            self.set_timeout(None)?;
            return r;
        }
        // Frames from the stdin feeder and the sampler go through one lock, whole.
        let writer = Mutex::new(
            self.stream
                .try_clone()
                .map_err(SandboxError::io("cloning the guest connection for stdin"))?,
        );
        let stop = AtomicBool::new(false);
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let ids = &self.ids;
        let stream = &mut self.stream;
        let (every, on_sample) = match sampling {
            Some(s) => (Some(s.every), Some(s.on_sample)),
            None => (None, None),
        };
        let result = std::thread::scope(|scope| {
            let feeder = streamed
                .as_ref()
                .map(|stdin| scope.spawn(|| feed_stdin(&writer, id, stdin, &stop)));
            let writer = &writer;
            let sampler = every.map(|every| {
                scope.spawn(move || {
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        stop_rx.recv_timeout(every)
                    {
                        let m = Message::TelemetryRequest(voidbox_protocol::TelemetryRequest {
                            id: ids.next_id(),
                        });
                        let mut w = writer.lock().unwrap_or_else(|e| e.into_inner());
                        if write_message(&mut *w, &m).is_err() {
                            return;
                        }
                    }
                })
            });
            let result = exec_replies(stream, id, host_timeout, on_output, on_sample);
            // The exec is over (or the connection is): stop feeding and sampling. A writer
            // stuck on a dead exchange is released by closing the connection.
            stop.store(true, Ordering::Release);
            drop(stop_tx);
            let stuck = feeder.as_ref().is_some_and(|f| !f.is_finished());
            if result.is_err() && stuck {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
            if let Some(f) = feeder {
                let _ = f.join();
            }
            if let Some(s) = sampler {
                let _ = s.join();
            }
            result
        });
        self.set_timeout(None)?;
        result
    }

    /// Writes a file in the guest (confined by the guest to its permitted roots).
    pub fn write_file(
        &mut self,
        path: &str,
        data: &[u8],
        mode: Option<u32>,
    ) -> Result<(), SandboxError> {
        let id = self.ids.next_id();
        for (i, mut m) in WriteFile::chunked(id, path, mode, data, FILE_CHUNK_SIZE).enumerate() {
            if let (0, Message::WriteFile(w)) = (i, &mut m) {
                w.create_parents = true;
            }
            self.send("write_file", &m)?;
        }
        match self.recv_for("write_file", id)? {
            Message::Ack(_) => Ok(()),
            Message::Error(e) => Err(SandboxError::Guest {
                what: format!("write_file {path}"),
                code: e.code,
                message: e.message,
            }),
            other => Err(unexpected("write_file", "Ack", other)),
        }
    }

    /// Reads a guest file, failing if it is larger than `max_len` bytes.
    pub fn read_file(&mut self, path: &str, max_len: u64) -> Result<Vec<u8>, SandboxError> {
        self.read_file_as(path, max_len, false)
    }

    /// Reads a guest file once it is complete: while any guest process holds it open for
    /// writing, the guest refuses with [`ErrorCode::Busy`](voidbox_protocol::ErrorCode).
    pub fn read_complete_file(
        &mut self,
        path: &str,
        max_len: u64,
    ) -> Result<Vec<u8>, SandboxError> {
        self.read_file_as(path, max_len, true)
    }

    fn read_file_as(
        &mut self,
        path: &str,
        max_len: u64,
        complete: bool,
    ) -> Result<Vec<u8>, SandboxError> {
        let id = self.ids.next_id();
        self.send(
            "read_file",
            &Message::ReadFile(ReadFile {
                id,
                path: path.to_string(),
                offset: 0,
                max_len: Some(max_len.saturating_add(1)),
                chunk_size: None,
                complete,
            }),
        )?;
        let mut out = Vec::new();
        loop {
            match self.recv_for("read_file", id)? {
                Message::FileChunk(c) => {
                    if c.offset != out.len() as u64 || (out.len() + c.data.len()) as u64 > max_len {
                        return Err(protocol(
                            "read_file",
                            ProtocolError::UnexpectedMessage {
                                expected: "in-order chunks within max_len",
                                got: "an out-of-order or oversized chunk",
                            },
                        ));
                    }
                    out.extend_from_slice(&c.data);
                    if c.last {
                        return Ok(out);
                    }
                }
                Message::Error(e) => {
                    return Err(SandboxError::Guest {
                        what: format!("read_file {path}"),
                        code: e.code,
                        message: e.message,
                    })
                }
                other => return Err(unexpected("read_file", "FileChunk", other)),
            }
        }
    }

    /// Lists a guest directory (entries `lstat`ed, sorted by name; the flag says whether
    /// the guest capped the list).
    pub fn list_dir(
        &mut self,
        path: &str,
    ) -> Result<(Vec<voidbox_protocol::DirEntry>, bool), SandboxError> {
        let id = self.ids.next_id();
        self.send(
            "list_dir",
            &Message::ListDir(voidbox_protocol::ListDir {
                id,
                path: path.to_string(),
            }),
        )?;
        match self.recv_for("list_dir", id)? {
            Message::DirListing(l) => Ok((l.entries, l.truncated)),
            Message::Error(e) => Err(SandboxError::Guest {
                what: format!("list_dir {path}"),
                code: e.code,
                message: e.message,
            }),
            other => Err(unexpected("list_dir", "DirListing", other)),
        }
    }

    /// Creates a guest directory and its parents (`mkdir -p`).
    pub fn mkdir_p(&mut self, path: &str) -> Result<(), SandboxError> {
        let id = self.ids.next_id();
        self.send(
            "mkdir_p",
            &Message::MkdirP(voidbox_protocol::MkdirP {
                id,
                path: path.to_string(),
                mode: None,
            }),
        )?;
        match self.recv_for("mkdir_p", id)? {
            Message::Ack(_) => Ok(()),
            Message::Error(e) => Err(SandboxError::Guest {
                what: format!("mkdir_p {path}"),
                code: e.code,
                message: e.message,
            }),
            other => Err(unexpected("mkdir_p", "Ack", other)),
        }
    }

    /// The guest's resource statistics (its agent reads `/proc`; no process starts).
    pub fn telemetry(&mut self) -> Result<voidbox_protocol::Telemetry, SandboxError> {
        let id = self.ids.next_id();
        self.send(
            "telemetry",
            &Message::TelemetryRequest(voidbox_protocol::TelemetryRequest { id }),
        )?;
        match self.recv_for("telemetry", id)? {
            Message::Telemetry(t) => Ok(t),
            Message::Error(e) => Err(SandboxError::Guest {
                what: "telemetry".into(),
                code: e.code,
                message: e.message,
            }),
            other => Err(unexpected("telemetry", "Telemetry", other)),
        }
    }

    /// Which of `ports` accept a TCP connection in the guest at `addr`, one of its own
    /// addresses (its loopback when `None`): a service's readiness; no process starts.
    pub fn probe_ports(
        &mut self,
        ports: &[u16],
        addr: Option<std::net::Ipv4Addr>,
    ) -> Result<Vec<u16>, SandboxError> {
        let id = self.ids.next_id();
        self.send(
            "probe_ports",
            &Message::ProbePorts(voidbox_protocol::ProbePorts {
                id,
                ports: ports.to_vec(),
                addr,
            }),
        )?;
        match self.recv_for("probe_ports", id)? {
            // Only ports that were asked about count.
            Message::PortsOpen(p) => Ok(p.open.into_iter().filter(|p| ports.contains(p)).collect()),
            Message::Error(e) => Err(SandboxError::Guest {
                what: "probe_ports".into(),
                code: e.code,
                message: e.message,
            }),
            other => Err(unexpected("probe_ports", "PortsOpen", other)),
        }
    }

    /// Mounts host share slot `slot` at guest path `path` (see [`super::shares`]).
    pub fn mount_share(
        &mut self,
        slot: u8,
        path: &str,
        read_only: bool,
    ) -> Result<(), SandboxError> {
        let id = self.ids.next_id();
        self.send(
            "mount_share",
            &Message::MountShare(voidbox_protocol::MountShare {
                id,
                slot,
                path: path.to_string(),
                read_only,
            }),
        )?;
        match self.recv_for("mount_share", id)? {
            Message::Ack(_) => Ok(()),
            Message::Error(e) => Err(SandboxError::Guest {
                what: format!("mounting share {slot} at {path}"),
                code: e.code,
                message: e.message,
            }),
            other => Err(unexpected("mount_share", "Ack", other)),
        }
    }

    /// Asks the guest to shut down (it answers `Ack`, then reboots, which ends the VMM).
    pub fn shutdown(&mut self, timeout: Duration) -> Result<(), SandboxError> {
        let id = self.ids.next_id();
        self.set_timeout(Some(timeout))?;
        self.send(
            "shutdown",
            &Message::Shutdown(Shutdown {
                id,
                action: ShutdownAction::Reboot,
            }),
        )?;
        match self.recv_for("shutdown", id)? {
            Message::Ack(_) => Ok(()),
            other => Err(unexpected("shutdown", "Ack", other)),
        }
    }
}

/// How long the guest may take to answer a held exec's start or a `HeldQuery`.
const HOLD_TIMEOUT: Duration = Duration::from_secs(60);

/// What [`GuestConn::exec_attach`]'s output callback wants next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attach {
    /// Keep reading.
    Continue,
    /// Write these bytes to the program's stdin (which stays open during an attach).
    Write(Vec<u8>),
    /// Done: stop the program's process group (`SIGSTOP`) and return [`Attached::Finished`]
    /// at once.
    Finish,
}

/// How an attach ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attached {
    /// The program ended on its own (or at its deadline: `timed_out`).
    Exited(ExecResponse),
    /// The callback said [`Attach::Finish`]: the program was stopped, not waited for; the
    /// connection serves other requests (which skip the attach's late frames).
    Finished {
        /// From the attach to the stop.
        duration: Duration,
    },
}

impl GuestConn {
    /// Starts `req` as the held exec `name` ([`ExecRequest::hold`]): the guest checks and
    /// starts it like any exec, with stdin open after `req.stdin` and no deadline, and it
    /// outlives this connection; its output is buffered (bounded) until
    /// [`GuestConn::exec_attach`]. Returns once it runs.
    ///
    /// Errors: a refusal is [`SandboxError::Guest`] (`AlreadyExists` for a taken name,
    /// `ResourceLimit`, `InvalidRequest` for a bad name, `NotAllowed` for a program outside
    /// the allowlist, `Io` for one that could not start; `Unsupported` from a guest agent
    /// without held execs).
    pub fn exec_hold(&mut self, name: &str, mut req: ExecRequest) -> Result<(), SandboxError> {
        let what = || format!("holding `{name}`");
        if let Some(info) = &self.info {
            if !info.capabilities.iter().any(|c| c == CAP_HELD) {
                return Err(SandboxError::Guest {
                    what: what(),
                    code: ErrorCode::Unsupported,
                    message: format!(
                        "this guest agent ({}) has no held execs: its image predates them \
                         (rebuild it with `voidbox image build`)",
                        info.agent_version
                    ),
                });
            }
        }
        let id = self.ids.next_id();
        req.id = id;
        req.hold = Some(name.to_string());
        self.set_timeout(Some(HOLD_TIMEOUT))?;
        let reply = self
            .send("exec_hold", &Message::ExecRequest(req))
            .and_then(|()| self.recv_for("exec_hold", id));
        self.set_timeout(None)?;
        match in_time(reply, HOLD_TIMEOUT)? {
            Message::Ack(_) => Ok(()),
            Message::Error(e) => Err(SandboxError::Guest {
                what: what(),
                code: e.code,
                message: e.message,
            }),
            // Refused by the allowlist (126) or not started (127), as an exec would be.
            Message::ExecResponse(r) => Err(SandboxError::Guest {
                what: what(),
                code: if r.exit_code == Some(voidbox_protocol::EXIT_NOT_ALLOWED) {
                    ErrorCode::NotAllowed
                } else {
                    ErrorCode::Io
                },
                message: r.error.unwrap_or_else(|| {
                    format!(
                        "it ended at once (exit {:?}, signal {:?})",
                        r.exit_code, r.signal
                    )
                }),
            }),
            other => Err(unexpected("exec_hold", "Ack", other)),
        }
    }

    /// The state of the held exec `name` (CPU time of its process group, running threads,
    /// whether it exited, output buffered): hosts poll it to see it settle.
    pub fn held_info(&mut self, name: &str) -> Result<HeldInfo, SandboxError> {
        let id = self.ids.next_id();
        self.set_timeout(Some(HOLD_TIMEOUT))?;
        let reply = self
            .send(
                "held_info",
                &Message::HeldQuery(HeldQuery {
                    id,
                    name: name.to_string(),
                }),
            )
            .and_then(|()| self.recv_for("held_info", id));
        self.set_timeout(None)?;
        match in_time(reply, HOLD_TIMEOUT)? {
            Message::HeldInfo(i) => Ok(i),
            Message::Error(e) => Err(SandboxError::Guest {
                what: format!("held_info `{name}`"),
                code: e.code,
                message: e.message,
            }),
            other => Err(unexpected("held_info", "HeldInfo", other)),
        }
    }

    /// Attaches the held exec `name` ([`voidbox_protocol::ExecAttach`]) and runs it as an
    /// exec of this connection: its buffered output, then what follows, goes to
    /// `on_output`, whose answer says what next ([`Attach`]); `stdin` is written first and
    /// stdin stays open. `timeout_secs` is the deadline from now, enforced by the guest (the
    /// host waits that long plus a grace period per read). With `sampling`, guest telemetry
    /// is asked for meanwhile, as in [`GuestConn::exec_sampled`].
    ///
    /// On [`Attach::Finish`] the process group is stopped (`ExecSignal` `SIGSTOP`) and the
    /// attach returns at once: a program's exit — tearing down its memory — takes tens of
    /// seconds where the guest kernel is interpreted, and the caller stops the VM anyway once
    /// it has read what it needs. Frames of the attach still in flight are skipped by the
    /// requests that follow, as any reply to another request is.
    ///
    /// Errors: an unknown name is [`SandboxError::Guest`] with `NotFound`, one attached
    /// already `Busy`; a guest that breaks the protocol is [`SandboxError::Protocol`].
    pub fn exec_attach(
        &mut self,
        name: &str,
        stdin: Vec<u8>,
        timeout_secs: Option<u64>,
        on_output: &mut dyn FnMut(OutputStream, &[u8]) -> Attach,
        sampling: Option<Sampling<'_>>,
    ) -> Result<Attached, SandboxError> {
        let id = self.ids.next_id();
        let t0 = Instant::now();
        let (inline, rest) = if stdin.len() > INLINE_STDIN_MAX {
            (Vec::new(), stdin)
        } else {
            (stdin, Vec::new())
        };
        let host_timeout = timeout_secs.map(|s| Duration::from_secs(s.saturating_add(10)));
        self.set_timeout(host_timeout)?;
        let sent = self.send(
            "exec_attach",
            &Message::ExecAttach(ExecAttach {
                id,
                name: name.to_string(),
                stdin: inline,
                stdin_stream: true,
                timeout_secs,
            }),
        );
        if let Err(e) = sent.and_then(|()| self.settle()) {
            self.set_timeout(None)?;
            return Err(e);
        }
        let mut w = self
            .stream
            .try_clone()
            .map_err(SandboxError::io("cloning the guest connection for stdin"))?;
        let (tx, rx) = std::sync::mpsc::channel::<Message>();
        for chunk in rest.chunks(STDIN_CHUNK) {
            let _ = tx.send(stdin_frame(id, chunk));
        }
        let ids = &self.ids;
        let stream = &mut self.stream;
        let (every, on_sample) = match sampling {
            Some(s) => (Some(s.every), Some(s.on_sample)),
            None => (None, None),
        };
        let result = std::thread::scope(|scope| {
            // Every frame this attach sends after the request goes through one writer
            // thread, so reading the output never waits on a write.
            let writer = scope.spawn(move || loop {
                let next = match every {
                    Some(every) => rx.recv_timeout(every),
                    None => rx
                        .recv()
                        .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected),
                };
                let m = match next {
                    Ok(m) => m,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        Message::TelemetryRequest(voidbox_protocol::TelemetryRequest {
                            id: ids.next_id(),
                        })
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                };
                if write_message(&mut w, &m).is_err() {
                    return;
                }
            });
            let result = attach_replies(stream, id, host_timeout, &tx, on_output, on_sample, t0);
            drop(tx);
            // A writer stuck on a guest that stopped reading is released by closing (a
            // guest that answered with a refusal still reads: its connection stays).
            let broken = matches!(&result, Err(e) if !matches!(e, SandboxError::Guest { .. }));
            if broken && !writer.is_finished() {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
            let _ = writer.join();
            result
        });
        self.set_timeout(None)?;
        result
    }
}

/// An `ExecStdin` frame (stdin stays open) for exec `id`.
fn stdin_frame(id: voidbox_protocol::RequestId, data: &[u8]) -> Message {
    Message::ExecStdin(ExecStdin {
        id,
        eof: false,
        data: data.to_vec(),
    })
}

/// Reads an attach's replies until its `ExecResponse` (see [`GuestConn::exec_attach`]);
/// frames to send go to `tx`. Messages for other requests are skipped (telemetry goes to
/// `on_sample`), a bounded number of times in a row, as are "no such request" errors for
/// stdin or the kill that crossed the program's end.
fn attach_replies(
    stream: &mut UnixStream,
    id: voidbox_protocol::RequestId,
    host_timeout: Option<Duration>,
    tx: &std::sync::mpsc::Sender<Message>,
    on_output: &mut dyn FnMut(OutputStream, &[u8]) -> Attach,
    mut on_sample: Option<&mut dyn FnMut(voidbox_protocol::Telemetry)>,
    t0: Instant,
) -> Result<Attached, SandboxError> {
    let mut strays = 0usize;
    let mut wrote = false;
    loop {
        let m = read_reply(stream, "exec_attach", host_timeout.unwrap_or_default())?;
        if m.id() != id {
            match (m, on_sample.as_mut()) {
                (Message::Telemetry(t), Some(f)) => f(t),
                _ => {
                    strays += 1;
                    if strays > MAX_STRAY_MESSAGES {
                        return Err(too_many_strays("exec_attach"));
                    }
                }
            }
            continue;
        }
        match m {
            Message::ExecOutputChunk(c) => {
                strays = 0;
                match on_output(c.stream, &c.data) {
                    Attach::Continue => {}
                    Attach::Write(bytes) => {
                        wrote = true;
                        for chunk in bytes.chunks(STDIN_CHUNK) {
                            let _ = tx.send(stdin_frame(id, chunk));
                        }
                    }
                    Attach::Finish => {
                        let _ = tx.send(Message::ExecSignal(ExecSignal {
                            id,
                            signal: libc::SIGSTOP,
                        }));
                        return Ok(Attached::Finished {
                            duration: t0.elapsed(),
                        });
                    }
                }
            }
            Message::ExecResponse(r) => return Ok(Attached::Exited(r)),
            Message::Error(e) if wrote && e.code == ErrorCode::NoSuchRequest => {
                strays += 1;
                if strays > MAX_STRAY_MESSAGES {
                    return Err(too_many_strays("exec_attach"));
                }
            }
            Message::Error(e) => {
                return Err(SandboxError::Guest {
                    what: "exec_attach".into(),
                    code: e.code,
                    message: e.message,
                })
            }
            other => return Err(unexpected("exec_attach", "ExecResponse", other)),
        }
    }
}

/// A read timeout from [`GuestConn::recv_for`] (reported without a limit) as one of `limit`.
fn in_time(r: Result<Message, SandboxError>, limit: Duration) -> Result<Message, SandboxError> {
    match r {
        Err(SandboxError::Timeout(w, _)) => Err(SandboxError::Timeout(w, limit)),
        r => r,
    }
}

/// How long the guest may take to answer a `PtyOpen` (it starts the program first).
const PTY_OPEN_TIMEOUT: Duration = Duration::from_secs(60);
/// Error replies tolerated during one PTY session (dropped input, a failed resize)
/// before the host gives up on it.
const MAX_PTY_ERRORS: usize = 1024;

/// What a PTY session reports while it runs ([`GuestConn::pty`]).
#[derive(Debug)]
pub enum PtyEvent<'a> {
    /// Terminal output (at most one frame's worth).
    Output(&'a [u8]),
    /// The guest refused some input or a resize (e.g. its input queue was full); the
    /// session goes on.
    Refused {
        /// Error category.
        code: ErrorCode,
        /// The guest's message.
        message: &'a str,
    },
}

/// The host-to-guest side of an open PTY session: input, resizes, hang-up. Clones share
/// one connection (frames are written whole under a lock), so other threads can use it
/// while [`GuestConn::pty`] reads the output.
#[derive(Clone)]
pub struct PtyInput {
    stream: std::sync::Arc<std::sync::Mutex<UnixStream>>,
    id: voidbox_protocol::RequestId,
}

impl PtyInput {
    fn send(&self, during: &str, msg: &Message) -> Result<(), SandboxError> {
        let mut s = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        write_message(&mut *s, msg).map_err(|e| protocol(during, e))
    }

    /// Sends terminal input (split into frames of at most
    /// [`voidbox_protocol::OUTPUT_CHUNK_SIZE`] bytes).
    pub fn data(&self, bytes: &[u8]) -> Result<(), SandboxError> {
        for chunk in bytes.chunks(voidbox_protocol::OUTPUT_CHUNK_SIZE) {
            let m = Message::PtyData(PtyData {
                id: self.id,
                data: chunk.to_vec(),
            });
            self.send("pty input", &m)?;
        }
        Ok(())
    }

    /// Resizes the guest terminal.
    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), SandboxError> {
        let m = Message::PtyResize(PtyResize {
            id: self.id,
            rows,
            cols,
        });
        self.send("pty resize", &m)
    }

    /// Hangs the session up: the guest sends SIGHUP (then SIGKILL) to its process group,
    /// and the session's end follows.
    pub fn close(&self) -> Result<(), SandboxError> {
        self.send("pty close", &Message::PtyClose(PtyClose { id: self.id }))
    }

    /// Shuts the connection down in both directions, so [`GuestConn::pty`] returns at once
    /// (with an error) even when the guest no longer answers.
    pub fn hang_up(&self) {
        let s = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
}

impl GuestConn {
    /// Runs an interactive session on a guest pseudo-terminal: sends `open` (its id is
    /// assigned here) and waits for the guest to start the program (at most
    /// [`PTY_OPEN_TIMEOUT`]), then hands a [`PtyInput`] to `on_open` and reports terminal
    /// output and refusals to `on_event` until the session's `ExecResponse`, which is
    /// returned. No read timeout applies once the session is open (it may sit idle).
    ///
    /// Errors: a refused open is [`SandboxError::Guest`] (`NotAllowed` for a program outside
    /// the allowlist or PTYs disabled); more than [`MAX_PTY_ERRORS`] error replies, or any
    /// other message for the session, is a protocol error.
    pub fn pty(
        &mut self,
        mut open: PtyOpen,
        on_open: &mut dyn FnMut(PtyInput),
        on_event: &mut dyn FnMut(PtyEvent<'_>),
    ) -> Result<ExecResponse, SandboxError> {
        let id = self.ids.next_id();
        open.id = id;
        self.set_timeout(Some(PTY_OPEN_TIMEOUT))?;
        self.send("pty_open", &Message::PtyOpen(open))?;
        let first = match self.recv_for("pty_open", id) {
            Err(SandboxError::Timeout(w, _)) => Err(SandboxError::Timeout(w, PTY_OPEN_TIMEOUT)),
            r => r,
        };
        self.set_timeout(None)?;
        match first? {
            Message::Ack(_) => {}
            Message::ExecResponse(r) => return Ok(r),
            Message::Error(e) => {
                return Err(SandboxError::Guest {
                    what: "pty_open".into(),
                    code: e.code,
                    message: e.message,
                })
            }
            other => return Err(unexpected("pty_open", "Ack", other)),
        }
        let writer = self.stream.try_clone().map_err(SandboxError::io(
            "cloning the guest connection for pty input",
        ))?;
        on_open(PtyInput {
            stream: std::sync::Arc::new(std::sync::Mutex::new(writer)),
            id,
        });
        let mut errors = 0usize;
        loop {
            match self.recv_for("pty", id)? {
                Message::PtyData(d) => on_event(PtyEvent::Output(&d.data)),
                Message::ExecResponse(r) => return Ok(r),
                Message::Error(e) if errors < MAX_PTY_ERRORS => {
                    errors += 1;
                    on_event(PtyEvent::Refused {
                        code: e.code,
                        message: &e.message,
                    });
                }
                other => return Err(unexpected("pty", "PtyData or ExecResponse", other)),
            }
        }
    }
}

/// Sends `data` as `ExecStdin` frames for exec `id` (the last one flagged EOF) until done,
/// `stop` is set or the connection fails.
fn feed_stdin(
    w: &Mutex<UnixStream>,
    id: voidbox_protocol::RequestId,
    data: &[u8],
    stop: &AtomicBool,
) {
    let n = data.len().div_ceil(STDIN_CHUNK);
    for (i, chunk) in data.chunks(STDIN_CHUNK).enumerate() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let m = Message::ExecStdin(ExecStdin {
            id,
            eof: i + 1 == n,
            data: chunk.to_vec(),
        });
        let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
        if write_message(&mut *w, &m).is_err() {
            return;
        }
    }
}

/// Periodic guest telemetry during an exec ([`GuestConn::exec_sampled`]).
pub struct Sampling<'a> {
    /// Time between samples.
    pub every: Duration,
    /// Receives each sample.
    pub on_sample: &'a mut dyn FnMut(voidbox_protocol::Telemetry),
}

/// Reads an exec's output chunks and its final reply; telemetry replies go to `on_sample`
/// (any other message for another request is skipped, a bounded number of times in a row).
fn exec_replies(
    stream: &mut UnixStream,
    id: voidbox_protocol::RequestId,
    host_timeout: Option<Duration>,
    on_output: &mut dyn FnMut(OutputStream, &[u8]),
    mut on_sample: Option<&mut dyn FnMut(voidbox_protocol::Telemetry)>,
) -> Result<ExecResult, SandboxError> {
    let mut strays = 0usize;
    loop {
        let m = read_reply(stream, "exec", host_timeout.unwrap_or_default())?;
        if m.id() != id {
            match (m, on_sample.as_mut()) {
                (Message::Telemetry(t), Some(f)) => f(t),
                _ => {
                    strays += 1;
                    if strays > MAX_STRAY_MESSAGES {
                        return Err(too_many_strays("exec"));
                    }
                }
            }
            continue;
        }
        strays = 0;
        match m {
            Message::ExecOutputChunk(c) => on_output(c.stream, &c.data),
            Message::ExecResponse(r) => return Ok(r),
            Message::Error(e) => {
                return Err(SandboxError::Guest {
                    what: "exec".into(),
                    code: e.code,
                    message: e.message,
                })
            }
            other => return Err(unexpected("exec", "ExecResponse", other)),
        }
    }
}

/// Reads one `\n`-terminated line of at most `max` bytes, byte by byte so nothing after it
/// is consumed. EOF or an over-long line is an error.
fn read_line(stream: &mut UnixStream, max: usize) -> std::io::Result<Vec<u8>> {
    let mut line = Vec::with_capacity(32);
    let mut b = [0u8; 1];
    while line.len() < max {
        match stream.read(&mut b)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            _ if b[0] == b'\n' => return Ok(line),
            _ => line.push(b[0]),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "CONNECT reply too long",
    ))
}

/// Reads the next message; a read timeout (the socket's) is a [`SandboxError::Timeout`]
/// saying `during` and `limit`.
fn read_reply(
    stream: &mut UnixStream,
    during: &str,
    limit: Duration,
) -> Result<Message, SandboxError> {
    read_message(stream).map_err(|e| match e {
        ProtocolError::Io(ref io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            SandboxError::Timeout(during.to_string(), limit)
        }
        e => protocol(during, e),
    })
}

/// More than [`MAX_STRAY_MESSAGES`] messages in a row for other requests.
fn too_many_strays(during: &str) -> SandboxError {
    protocol(
        during,
        ProtocolError::UnexpectedMessage {
            expected: "a reply to the request",
            got: "too many messages for other requests",
        },
    )
}

/// [`REKEY_ENTROPY_LEN`] bytes from the host's CSPRNG, zeroed on drop.
pub(crate) fn host_entropy() -> Result<Zeroizing<Vec<u8>>, SandboxError> {
    let mut entropy = Zeroizing::new(vec![0u8; REKEY_ENTROPY_LEN]);
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut entropy))
        .map_err(SandboxError::io("reading host entropy from /dev/urandom"))?;
    Ok(entropy)
}

/// The host's wall-clock time in nanoseconds since the Unix epoch.
fn unix_time_ns() -> Result<u64, SandboxError> {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_nanos()).ok())
        .ok_or_else(|| {
            SandboxError::Environment(
                "the host clock is outside 1970..2554; cannot set the guest clock".into(),
            )
        })
}

fn protocol(during: &str, source: ProtocolError) -> SandboxError {
    SandboxError::Protocol {
        during: during.to_string(),
        source,
    }
}

fn unexpected(during: &str, expected: &'static str, got: Message) -> SandboxError {
    protocol(
        during,
        ProtocolError::UnexpectedMessage {
            expected,
            got: got.message_type().name(),
        },
    )
}

#[cfg(test)]
mod tests;
