//! The agent's server: listener, per-connection handshake and request dispatch.
//!
//! One thread reads each connection's frames and answers quick requests (file RPCs,
//! telemetry, signals, re-keys) inline; execs, PTY sessions and file reads get a thread of
//! their own and share the connection's writer, whose mutex keeps frames whole. Requests are
//! told apart by request id; responses echo it. Malformed or unknown frames are answered
//! with an `Error` and the connection continues; oversized or truncated frames (after
//! which the stream cannot be resynchronised) end the connection, never the agent.
//! When a connection ends, everything it started is killed — except held execs, which
//! belong to the agent until an `ExecAttach` makes them a request of a connection
//! ([`crate::held`]).

use std::collections::HashMap;
use std::io::{self, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use voidbox_protocol::blocking::read_message;
use voidbox_protocol::{
    Ack, ErrorCode, ExecRequest, FileChunk, FileStatResponse, GuestInfo, GuestPolicy, Message,
    Ping, Pong, ProtocolError, Rekey, RequestId, SessionSecret, ShutdownAction, WriteFile,
    FILE_CHUNK_SIZE,
};

use crate::cmdline::ShutdownMode;
use crate::exec::{self, ActiveGuard, Command, ExecEnv, Sink, StdinChunk, StdinSource};
use crate::files::{FileWriter, Roots};
use crate::net::NetState;
use crate::policy::Policy;
use crate::reaper::ExitSlot;
use crate::rekey::{self, RekeyMode};
use crate::restore_page::RestorePage;
use crate::{auth, held, pty, telemetry};

/// Where the agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// AF_VSOCK on this port (any local CID).
    Vsock(u32),
    /// A Unix socket at this path (host tests).
    Unix(PathBuf),
}

/// Most connections served at once; further ones are closed immediately.
pub const MAX_CONNECTIONS: usize = 16;
/// Most requests in flight per connection (execs, PTYs, reads, writes).
pub const MAX_INFLIGHT: usize = 256;
/// Queued streamed-stdin chunks per exec before the connection reader waits.
const STDIN_QUEUE: usize = 16;

/// Static configuration of a running agent.
pub struct AgentConfig {
    /// Where to listen.
    pub listen: Listen,
    /// The session secret every connection must present, until a `Rekey` replaces it.
    pub secret: SessionSecret,
    /// Policy in force before any handshake (from boot parameters / flags).
    pub policy: Policy,
    /// How children are run (credentials, path relocation).
    pub exec_env: ExecEnv,
    /// `true` when PID 1 in a VM: Shutdown powers the VM off; otherwise it exits.
    pub is_init: bool,
    /// How Shutdown ends the VM when PID 1.
    pub shutdown_mode: ShutdownMode,
    /// Accept vsock connections from any CID, not only the host (CID 2).
    pub vsock_any_peer: bool,
    /// What `Rekey` does: always [`RekeyMode::System`] as PID 1; host processes choose
    /// explicitly (`--rekey`, default off).
    pub rekey: RekeyMode,
    /// What boot made of the network (re-applied by a [`RekeyMode::System`] `Rekey`).
    pub net: NetState,
    /// The restore page (PID 1: `/dev/mem`; host mode: `--restore-page FILE`), read before
    /// each connection is authenticated.
    pub restore_page: Option<RestorePage>,
}

/// The parts of [`AgentConfig`] that stay fixed while the agent runs.
struct Settings {
    listen: Listen,
    exec_env: ExecEnv,
    is_init: bool,
    shutdown_mode: ShutdownMode,
    vsock_any_peer: bool,
    rekey: RekeyMode,
    net: NetState,
}

/// Shared state of the agent.
pub struct Agent {
    cfg: Settings,
    /// The only copy of the session secret; a `Rekey` replaces (and so zeroes) it.
    secret: RwLock<SessionSecret>,
    /// Serializes re-keys: reseed, clock and rotation of one request are not interleaved
    /// with another's.
    rekeying: Mutex<()>,
    policy: RwLock<Arc<Policy>>,
    roots: Roots,
    connections: AtomicUsize,
    restore_page: Option<Mutex<RestorePage>>,
    /// Set when a restore page was refused: this VM then accepts no secret at all (the
    /// snapshot's is dropped), and every connection is told why.
    refused: Mutex<Option<String>>,
    /// Held execs (owned by the agent, not by a connection).
    held: held::Table,
}

impl Agent {
    /// Creates the agent (opens the confinement roots).
    pub fn new(cfg: AgentConfig) -> Arc<Agent> {
        let AgentConfig {
            listen,
            secret,
            policy,
            exec_env,
            is_init,
            shutdown_mode,
            vsock_any_peer,
            rekey,
            net,
            restore_page,
        } = cfg;
        let roots = Roots::open(
            &exec_env.base,
            exec_env.creds.unwrap_or(crate::spawn::SANDBOX),
        );
        Arc::new(Agent {
            cfg: Settings {
                listen,
                exec_env,
                is_init,
                shutdown_mode,
                vsock_any_peer,
                rekey,
                net,
            },
            secret: RwLock::new(secret),
            rekeying: Mutex::new(()),
            policy: RwLock::new(Arc::new(policy)),
            roots,
            connections: AtomicUsize::new(0),
            restore_page: restore_page.map(Mutex::new),
            refused: Mutex::new(None),
            held: held::Table::default(),
        })
    }

    /// Checks a handshake `Ping` against the current session secret (see
    /// [`auth::authenticate`]).
    fn authenticate(&self, first: Message) -> Result<Ping, Box<(ProtocolError, Message)>> {
        let secret = self.secret.read().unwrap_or_else(|e| e.into_inner());
        auth::authenticate(first, &secret)
    }

    /// Serves a `Rekey`: validates it, performs the system steps of the configured
    /// [`RekeyMode`], and only then replaces the secret. On error the secret is unchanged.
    fn rekey(&self, r: Rekey) -> Result<(), (ErrorCode, String)> {
        let _one_at_a_time = lock(&self.rekeying);
        let Rekey {
            secret,
            unix_time_ns,
            entropy,
            ..
        } = r;
        self.take_secret(secret, &entropy, unix_time_ns, None)?;
        crate::debug!(
            "re-keyed ({:?}): {} entropy bytes, session secret rotated",
            self.cfg.rekey,
            entropy.len()
        );
        Ok(())
    }

    /// What a `Rekey` and a restore page both do, in this order: refused unless this agent
    /// re-keys; the entropy and clock checked; in [`RekeyMode::System`] the kernel RNG
    /// reseeded, the clock set and the network re-applied (after a snapshot restore: the
    /// interface as configured, no stale neighbours); `policy` narrowed; and only then
    /// `secret` in force. On error the old secret is unchanged. The caller holds `rekeying`.
    fn take_secret(
        &self,
        secret: SessionSecret,
        entropy: &[u8],
        unix_time_ns: u64,
        policy: Option<&GuestPolicy>,
    ) -> Result<(), (ErrorCode, String)> {
        if self.cfg.rekey == RekeyMode::Off {
            return Err((
                ErrorCode::Unsupported,
                "re-key is disabled in this agent (a host process started without --rekey)".into(),
            ));
        }
        rekey::validate(entropy, unix_time_ns)?;
        if self.cfg.rekey == RekeyMode::System {
            rekey::apply_system(entropy, unix_time_ns)?;
            crate::net::reapply(&self.cfg.net)?;
        }
        if let Some(p) = policy {
            self.narrow_policy(p)
                .map_err(|e| (ErrorCode::InvalidRequest, format!("policy refused: {e}")))?;
        }
        // The old secret is dropped here, which zeroes it.
        *self.secret.write().unwrap_or_else(|e| e.into_inner()) = secret;
        Ok(())
    }

    /// Takes in a restore delivered on the restore page, if the VM was resumed since the last
    /// look: the RNG reseed and the clock (as a `Rekey` would), the network re-applied, the
    /// policy narrowed, and only then the new secret. Called before every handshake, so the
    /// snapshot's secret authenticates nothing after a resume. A refused page, or a delivery
    /// that cannot be applied, drops the secret altogether: `Err` says why, to every
    /// connection from then on.
    fn settle_restore(&self) -> Result<(), String> {
        let Some(page) = &self.restore_page else {
            return Ok(());
        };
        let _one_at_a_time = lock(&self.rekeying);
        if let Some(why) = lock(&self.refused).as_ref() {
            return Err(why.clone());
        }
        let result = match lock(page).take() {
            Ok(None) => return Ok(()),
            Ok(Some(d)) => self.apply_restore(d),
            Err(e) => Err(format!("restore page refused: {e}")),
        };
        if let Err(why) = &result {
            let why = format!("{why}; this VM accepts no secret");
            crate::log!("{why}");
            // The snapshot's secret goes; nothing can authenticate any more.
            if let Ok(s) = SessionSecret::random() {
                *self.secret.write().unwrap_or_else(|e| e.into_inner()) = s;
            }
            *lock(&self.refused) = Some(why.clone());
            return Err(why);
        }
        result
    }

    fn apply_restore(&self, d: voidbox_protocol::restore_page::Delivery) -> Result<(), String> {
        let voidbox_protocol::restore_page::Delivery {
            grant,
            unix_time_ns,
        } = d;
        let entropy_len = grant.entropy.len();
        self.take_secret(
            grant.secret,
            &grant.entropy,
            unix_time_ns,
            grant.policy.as_ref(),
        )
        .map_err(|(_, m)| format!("restore page: {m}"))?;
        crate::debug!(
            "restored: {entropy_len} entropy bytes, clock set, session secret replaced from the restore page"
        );
        Ok(())
    }

    /// Facts for the Pong: the guest's, plus how this agent serves `Rekey` and whether its
    /// network is configured ([`crate::net::CAP_NET`]).
    fn guest_info(&self) -> GuestInfo {
        let mut info = telemetry::guest_info();
        info.capabilities
            .extend(self.cfg.rekey.capability().map(String::from));
        info.capabilities
            .extend(self.cfg.net.capability().map(String::from));
        info.capabilities.push(voidbox_protocol::CAP_HELD.into());
        info
    }

    /// The policy currently in force.
    pub fn policy(&self) -> Arc<Policy> {
        Arc::clone(&self.policy.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Narrows the policy in force by a handshake's; a policy the guest cannot enforce is
    /// refused (nothing changes) with the reason.
    fn narrow_policy(&self, spec: &GuestPolicy) -> Result<(), String> {
        spec.validate()?;
        let mut p = self.policy.write().unwrap_or_else(|e| e.into_inner());
        *p = Arc::new(p.narrow(spec));
        Ok(())
    }

    /// Binds the listener and serves forever (returns only on a listener error).
    pub fn serve(self: &Arc<Self>) -> io::Result<std::convert::Infallible> {
        match &self.cfg.listen {
            Listen::Unix(path) => {
                let _ = std::fs::remove_file(path);
                let listener = UnixListener::bind(path)?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                crate::debug!("listening on unix:{}", path.display());
                loop {
                    match listener.accept() {
                        Ok((s, _)) => self.spawn_connection(s),
                        Err(e) => accept_error(e),
                    }
                }
            }
            Listen::Vsock(port) => {
                let listener = vsock_listen(*port)?;
                crate::debug!("listening on vsock port {port}");
                loop {
                    match vsock_accept(&listener) {
                        Ok((s, cid)) if self.cfg.vsock_any_peer || cid == libc::VMADDR_CID_HOST => {
                            self.spawn_connection(s)
                        }
                        Ok((_, cid)) => crate::log!("refused vsock connection from CID {cid}"),
                        Err(e) => accept_error(e),
                    }
                }
            }
        }
    }

    fn spawn_connection(self: &Arc<Self>, stream: UnixStream) {
        if self.connections.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            self.connections.fetch_sub(1, Ordering::AcqRel);
            crate::log!("too many connections; closing a new one");
            return;
        }
        let agent = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("conn".into())
            .spawn(move || {
                Connection::serve(&agent, stream);
                agent.connections.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            self.connections.fetch_sub(1, Ordering::AcqRel);
            crate::log!("cannot start a connection thread: {e}");
        }
    }

    fn shutdown(&self, action: ShutdownAction) -> ! {
        if self.cfg.is_init {
            let mode = match action {
                ShutdownAction::Reboot => ShutdownMode::Reboot,
                ShutdownAction::PowerOff => self.cfg.shutdown_mode,
            };
            crate::init::power_off(mode)
        }
        crate::log!("shutdown requested; exiting");
        std::process::exit(0)
    }
}

fn accept_error(e: io::Error) {
    crate::log!("accept: {e}");
    // EMFILE and friends: back off instead of spinning.
    std::thread::sleep(Duration::from_millis(100));
}

fn vsock_listen(port: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: freshly created fd owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_vm is plain data; all-zero is valid before the fields are set.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_cid = libc::VMADDR_CID_ANY;
    addr.svm_port = port;
    let len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
    // SAFETY: bind/listen on our socket with a correctly sized address.
    unsafe {
        if libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_vm).cast(),
            len,
        ) < 0
        {
            return Err(io::Error::last_os_error());
        }
        if libc::listen(fd.as_raw_fd(), 16) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

fn vsock_accept(listener: &OwnedFd) -> io::Result<(UnixStream, u32)> {
    // SAFETY: sockaddr_vm is plain data filled by accept4.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
    // SAFETY: accept4 writes at most `len` bytes into `addr`.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            (&mut addr as *mut libc::sockaddr_vm).cast(),
            &mut len,
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // A UnixStream is just a connected stream-socket fd for read/write/shutdown purposes.
    // SAFETY: freshly accepted fd owned by nothing else.
    Ok((unsafe { UnixStream::from_raw_fd(fd) }, addr.svm_cid))
}

/// The writing half of a connection, shared by every request thread.
pub struct Writer {
    stream: Mutex<UnixStream>,
    broken: AtomicBool,
}

impl Sink for Writer {
    fn send(&self, msg: &Message) -> io::Result<()> {
        if self.broken.load(Ordering::Acquire) {
            return Err(io::Error::from(io::ErrorKind::BrokenPipe));
        }
        let buf = msg
            .encode()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let mut s = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let r = s.write_all(&buf);
        if r.is_err() {
            self.broken.store(true, Ordering::Release);
        }
        r
    }
}

impl Writer {
    fn error(&self, id: RequestId, code: ErrorCode, message: impl Into<String>) {
        let _ = self.send(&Message::error(id, code, message));
    }
}

/// What a connection knows about one in-flight request.
#[derive(Default)]
struct Running {
    slot: Option<Arc<ExitSlot>>,
    stdin: Option<SyncSender<StdinChunk>>,
    pty: Option<pty::PtyHandle>,
}

struct Connection {
    agent: Arc<Agent>,
    writer: Arc<Writer>,
    stream: UnixStream,
    running: Arc<Mutex<HashMap<RequestId, Running>>>,
    writes: HashMap<RequestId, FileWriter>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Connection {
    fn serve(agent: &Arc<Agent>, stream: UnixStream) {
        let (read_half, write_half) = match (stream.try_clone(), stream.try_clone()) {
            (Ok(r), Ok(w)) => (r, w),
            _ => return,
        };
        let writer = Arc::new(Writer {
            stream: Mutex::new(write_half),
            broken: AtomicBool::new(false),
        });
        let mut reader = BufReader::with_capacity(64 * 1024, read_half);
        let mut conn = Connection {
            agent: Arc::clone(agent),
            writer,
            stream,
            running: Arc::new(Mutex::new(HashMap::new())),
            writes: HashMap::new(),
        };
        if conn.handshake(&mut reader) {
            conn.serve_requests(&mut reader);
        }
        conn.close();
    }

    /// Authenticates the connection; `false` means it must be closed.
    fn handshake(&mut self, reader: &mut BufReader<UnixStream>) -> bool {
        // First, before reading anything: a restore since the last connection replaces the
        // secret this one must present.
        if let Err(why) = self.agent.settle_restore() {
            self.writer
                .error(RequestId::RESERVED, ErrorCode::Unauthorized, why);
            return false;
        }
        let _ = self.stream.set_read_timeout(Some(auth::HANDSHAKE_TIMEOUT));
        let first = match read_message(reader) {
            Ok(m) => m,
            Err(e) => {
                crate::debug!("handshake: {e}");
                if !matches!(e, ProtocolError::Closed | ProtocolError::Io(_)) {
                    self.writer.error(
                        e.request_id().unwrap_or_default(),
                        ErrorCode::Unauthorized,
                        format!("handshake required: {e}"),
                    );
                }
                return false;
            }
        };
        match self.agent.authenticate(first) {
            Ok(ping) => {
                if let Some(Err(e)) = ping.policy.as_ref().map(|p| self.agent.narrow_policy(p)) {
                    crate::log!("refused a handshake policy: {e}");
                    self.writer.error(
                        ping.id,
                        ErrorCode::InvalidRequest,
                        format!("policy refused: {e}"),
                    );
                    return false;
                }
                let _ = self.stream.set_read_timeout(None);
                self.writer
                    .send(&Message::Pong(Pong::new(ping.id, self.agent.guest_info())))
                    .is_ok()
            }
            Err(rejected) => {
                let (e, reply) = *rejected;
                crate::log!("rejected connection: {e}");
                let _ = self.writer.send(&reply);
                false
            }
        }
    }

    fn serve_requests(&mut self, reader: &mut BufReader<UnixStream>) {
        loop {
            match read_message(reader) {
                Ok(msg) => self.dispatch(msg),
                Err(ProtocolError::Closed) => return,
                Err(e) if !e.is_fatal() => {
                    let code = match e {
                        ProtocolError::UnknownType(_) => ErrorCode::UnknownType,
                        _ => ErrorCode::Malformed,
                    };
                    self.writer
                        .error(e.request_id().unwrap_or_default(), code, e.to_string());
                }
                Err(e) => {
                    crate::debug!("closing connection: {e}");
                    let code = match e {
                        ProtocolError::Oversized { .. } => ErrorCode::TooLarge,
                        _ => ErrorCode::Malformed,
                    };
                    if !matches!(e, ProtocolError::Io(_)) {
                        self.writer.error(RequestId::RESERVED, code, e.to_string());
                    }
                    return;
                }
            }
        }
    }

    /// Kills everything this connection started and closes the socket.
    fn close(&mut self) {
        let running: Vec<Running> = lock(&self.running).drain().map(|(_, r)| r).collect();
        for r in running {
            if let Some(slot) = &r.slot {
                slot.signal_group(libc::SIGKILL);
            }
        }
        self.writes.clear();
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    fn is_busy(&self, id: RequestId) -> bool {
        lock(&self.running).contains_key(&id) || self.writes.contains_key(&id)
    }

    /// Registers an in-flight request id; answers the error itself on failure.
    fn register(&self, id: RequestId, entry: Running) -> bool {
        let mut running = lock(&self.running);
        if running.contains_key(&id) || self.writes.contains_key(&id) {
            drop(running);
            self.writer.error(
                id,
                ErrorCode::DuplicateId,
                format!("request {id} is already in flight"),
            );
            return false;
        }
        if running.len() + self.writes.len() >= MAX_INFLIGHT {
            drop(running);
            self.writer
                .error(id, ErrorCode::ResourceLimit, "too many requests in flight");
            return false;
        }
        running.insert(id, entry);
        true
    }

    fn dispatch(&mut self, msg: Message) {
        let id = msg.id();
        match msg {
            Message::Ping(ping) => self.ping(id, ping),
            // Like every request, only reached on an authenticated connection; this one
            // stays authenticated, later ones must present the new secret.
            Message::Rekey(r) => match self.agent.rekey(r) {
                Ok(()) => {
                    let _ = self.writer.send(&Message::Ack(Ack { id }));
                }
                Err((code, message)) => {
                    crate::log!("{message}");
                    self.writer.error(id, code, message);
                }
            },
            Message::ExecRequest(req) => self.exec(req),
            Message::ExecStdin(s) => self.exec_stdin(id, s),
            Message::ExecSignal(sig) => self.exec_signal(id, sig),
            Message::ExecAttach(a) => self.exec_attach(a),
            Message::HeldQuery(q) => match self.agent.held.get(&q.name) {
                Some(h) => {
                    let _ = self.writer.send(&Message::HeldInfo(h.info(id)));
                }
                None => self.writer.error(
                    id,
                    ErrorCode::NotFound,
                    format!("no held exec named `{}`", q.name),
                ),
            },
            Message::WriteFile(w) => self.write_file(w),
            Message::FileChunk(c) => self.file_chunk(c),
            Message::ReadFile(r) => self.read_file(id, r),
            Message::MkdirP(m) => match self.agent.roots.mkdir_p(&m.path, m.mode) {
                Ok(()) => {
                    let _ = self.writer.send(&Message::Ack(Ack { id }));
                }
                Err(e) => self.writer.error(id, e.code, e.message),
            },
            Message::FileStat(f) => self.file_stat(id, f),
            Message::ListDir(l) => self.list_dir(id, l),
            Message::MountShare(m) => self.mount_share(id, m),
            Message::PtyOpen(p) => self.pty_open(p),
            Message::PtyData(d) => self.pty_data(id, d),
            Message::PtyResize(r) => self.pty_resize(id, r),
            Message::PtyClose(_) => {
                let h = lock(&self.running).get(&id).and_then(|r| r.pty.clone());
                match h {
                    Some(h) => h.close(),
                    None => self.writer.error(
                        id,
                        ErrorCode::NoSuchRequest,
                        format!("no pty session {id}"),
                    ),
                }
            }
            Message::ProbePorts(p) => self.probe_ports(id, p),
            Message::TelemetryRequest(_) => {
                let _ = self
                    .writer
                    .send(&Message::Telemetry(telemetry::snapshot(id)));
            }
            Message::Shutdown(s) => {
                let _ = self.writer.send(&Message::Ack(Ack { id }));
                self.close();
                self.agent.shutdown(s.action);
            }
            other => self.writer.error(
                id,
                ErrorCode::InvalidRequest,
                format!("{} is not a request the guest serves", other.message_type()),
            ),
        }
    }

    /// A `Ping` after connecting: authentication, and the handshake's policy narrowing.
    fn ping(&mut self, id: RequestId, ping: Ping) {
        match self.agent.authenticate(Message::Ping(ping)) {
            Ok(ping) => match ping.policy.as_ref().map(|p| self.agent.narrow_policy(p)) {
                Some(Err(e)) => {
                    crate::log!("refused a handshake policy: {e}");
                    self.writer.error(
                        id,
                        ErrorCode::InvalidRequest,
                        format!("policy refused: {e}"),
                    );
                }
                _ => {
                    let _ = self
                        .writer
                        .send(&Message::Pong(Pong::new(id, self.agent.guest_info())));
                }
            },
            Err(rejected) => {
                let _ = self.writer.send(&rejected.1);
            }
        }
    }
    /// Streamed stdin for a running exec (blocks while the child is not reading: backpressure on the host).
    fn exec_stdin(&mut self, id: RequestId, s: voidbox_protocol::ExecStdin) {
        let tx = lock(&self.running).get_mut(&id).and_then(|r| {
            if s.eof {
                r.stdin.take()
            } else {
                r.stdin.clone()
            }
        });
        match tx {
            // Blocks when the child is not reading: backpressure on the host.
            Some(tx) => {
                let _ = tx.send(StdinChunk {
                    data: s.data,
                    eof: s.eof,
                });
            }
            None => self.writer.error(
                id,
                ErrorCode::NoSuchRequest,
                format!("no exec {id} with streamed stdin"),
            ),
        }
    }
    /// A signal for a running exec's process group.
    fn exec_signal(&mut self, id: RequestId, sig: voidbox_protocol::ExecSignal) {
        let slot = lock(&self.running).get(&id).and_then(|r| r.slot.clone());
        match slot {
            Some(_) if !(1..=64).contains(&sig.signal) => self.writer.error(
                id,
                ErrorCode::InvalidRequest,
                format!("invalid signal {}", sig.signal),
            ),
            Some(slot) => {
                slot.signal_group(sig.signal);
            }
            None => self.writer.error(
                id,
                ErrorCode::NoSuchRequest,
                format!("no running exec {id}"),
            ),
        }
    }
    /// A file read in chunks on a worker thread.
    fn read_file(&mut self, id: RequestId, r: voidbox_protocol::ReadFile) {
        if !self.register(id, Running::default()) {
            return;
        }
        let (agent, writer, running) = (
            Arc::clone(&self.agent),
            Arc::clone(&self.writer),
            Arc::clone(&self.running),
        );
        self.spawn_worker(id, "read-file", move || {
            if r.complete {
                if let Err((code, message)) = crate::probe::complete(&agent.roots, &r.path) {
                    writer.error(id, code, message);
                    lock(&running).remove(&id);
                    return;
                }
            }
            let chunk = r.chunk_size.map_or(FILE_CHUNK_SIZE, |c| c as usize);
            let res = agent.roots.read_chunks(
                &r.path,
                r.offset,
                r.max_len,
                chunk,
                |offset, data, last| {
                    writer.send(&Message::FileChunk(FileChunk {
                        id,
                        offset,
                        last,
                        data: data.to_vec(),
                    }))
                },
            );
            if let Err(e) = res {
                writer.error(id, e.code, e.message);
            }
            lock(&running).remove(&id);
        });
    }
    /// `stat` of a path under the file roots.
    fn file_stat(&mut self, id: RequestId, f: voidbox_protocol::FileStat) {
        match self.agent.roots.stat(&f.path) {
            Ok(st) => {
                let _ = self
                    .writer
                    .send(&Message::FileStatResponse(FileStatResponse {
                        id,
                        kind: st.kind,
                        size: st.size,
                        mode: st.mode,
                        uid: st.uid,
                        gid: st.gid,
                        mtime_secs: st.mtime_secs,
                    }));
            }
            Err(e) => self.writer.error(id, e.code, e.message),
        }
    }
    /// A directory listing under the file roots (bounded).
    fn list_dir(&mut self, id: RequestId, l: voidbox_protocol::ListDir) {
        match self
            .agent
            .roots
            .list_dir(&l.path, voidbox_protocol::MAX_DIR_ENTRIES)
        {
            Ok((entries, truncated)) => {
                let _ = self
                    .writer
                    .send(&Message::DirListing(voidbox_protocol::DirListing {
                        id,
                        entries,
                        truncated,
                    }));
            }
            Err(e) => self.writer.error(id, e.code, e.message),
        }
    }
    /// A host share mounted in the guest.
    fn mount_share(&mut self, id: RequestId, m: voidbox_protocol::MountShare) {
        let user = self
            .agent
            .cfg
            .exec_env
            .creds
            .unwrap_or(crate::spawn::SANDBOX);
        let root = &self.agent.cfg.exec_env.root;
        match crate::shares::mount(&m, root, user, self.agent.cfg.is_init) {
            Ok(()) => {
                let _ = self.writer.send(&Message::Ack(Ack { id }));
            }
            Err(e) => self.writer.error(id, e.code, e.message),
        }
    }
    /// Input for a PTY session.
    fn pty_data(&mut self, id: RequestId, d: voidbox_protocol::PtyData) {
        let h = lock(&self.running).get(&id).and_then(|r| r.pty.clone());
        match h.map(|h| h.input(d.data)) {
            Some(Ok(())) => {}
            Some(Err(e)) => self.writer.error(id, ErrorCode::ResourceLimit, e),
            None => self
                .writer
                .error(id, ErrorCode::NoSuchRequest, format!("no pty session {id}")),
        }
    }
    /// A PTY session's new window size.
    fn pty_resize(&mut self, id: RequestId, r: voidbox_protocol::PtyResize) {
        let h = lock(&self.running).get(&id).and_then(|r| r.pty.clone());
        match h {
            Some(h) => {
                if let Err(e) = h.resize(r.rows, r.cols) {
                    self.writer.error(id, ErrorCode::Io, format!("resize: {e}"));
                }
            }
            None => self
                .writer
                .error(id, ErrorCode::NoSuchRequest, format!("no pty session {id}")),
        }
    }

    /// A service's readiness probe, on a worker thread (each closed port may take up to a
    /// second to answer).
    fn probe_ports(&mut self, id: RequestId, p: voidbox_protocol::ProbePorts) {
        if !self.register(id, Running::default()) {
            return;
        }
        let (writer, running) = (Arc::clone(&self.writer), Arc::clone(&self.running));
        self.spawn_worker(id, "probe", move || {
            match crate::probe::open_ports(&p.ports, p.addr) {
                Ok(open) => {
                    let _ = writer.send(&Message::PortsOpen(voidbox_protocol::PortsOpen {
                        id,
                        open,
                    }));
                }
                Err((code, message)) => writer.error(id, code, message),
            }
            lock(&running).remove(&id);
        });
    }

    fn spawn_worker(&self, id: RequestId, name: &str, f: impl FnOnce() + Send + 'static) {
        if let Err(e) = std::thread::Builder::new().name(name.into()).spawn(f) {
            lock(&self.running).remove(&id);
            self.writer.error(
                id,
                ErrorCode::ResourceLimit,
                format!("cannot start a thread: {e}"),
            );
        }
    }

    fn exec(&mut self, req: ExecRequest) {
        let id = req.id;
        if req.hold.is_some() {
            return self.exec_hold(req);
        }
        if self.is_busy(id) {
            self.writer.error(
                id,
                ErrorCode::DuplicateId,
                format!("request {id} is already in flight"),
            );
            return;
        }
        let policy = self.agent.policy();
        let exec_env = &self.agent.cfg.exec_env;
        let cmd = match Command::build(
            &req.program,
            &req.args,
            &req.env,
            req.workdir.as_deref(),
            &policy,
            exec_env,
            &[],
        ) {
            Ok(c) => c,
            // Refused by the allowlist: answered like a shell would (exit 126), nothing ran.
            Err((ErrorCode::NotAllowed, msg)) => {
                crate::debug!("exec {id} refused: {msg}");
                let _ = self
                    .writer
                    .send(&Message::ExecResponse(exec::refused(id, msg)));
                return;
            }
            Err((code, msg)) => return self.writer.error(id, code, msg),
        };
        let guard = match ActiveGuard::acquire(policy.max_concurrent_execs) {
            Ok(g) => g,
            Err((code, msg)) => return self.writer.error(id, code, msg),
        };
        let mut req = req;
        let initial = std::mem::take(&mut req.stdin);
        let (stdin, tx) = if req.stdin_stream {
            let (tx, rx) = sync_channel(STDIN_QUEUE);
            (StdinSource::Stream(initial, rx), Some(tx))
        } else {
            (StdinSource::Fixed(initial), None)
        };
        if !self.register(
            id,
            Running {
                slot: None,
                stdin: tx,
                pty: None,
            },
        ) {
            return;
        }
        let (writer, running) = (Arc::clone(&self.writer), Arc::clone(&self.running));
        self.spawn_worker(id, "exec", move || {
            let _guard = guard;
            let resp = exec::run(&req, &cmd, &policy, stdin, writer.as_ref(), |slot| {
                if let Some(r) = lock(&running).get_mut(&id) {
                    r.slot = Some(Arc::clone(slot));
                }
            });
            lock(&running).remove(&id);
            let _ = writer.send(&Message::ExecResponse(resp));
        });
    }

    /// Starts a held exec ([`held`]): checked and spawned like an exec, answered `Ack` once
    /// it runs; the connection keeps nothing of it.
    fn exec_hold(&mut self, mut req: ExecRequest) {
        let id = req.id;
        let name = req.hold.take().unwrap_or_default();
        if self.is_busy(id) {
            return self.writer.error(
                id,
                ErrorCode::DuplicateId,
                format!("request {id} is already in flight"),
            );
        }
        let policy = self.agent.policy();
        let cmd = match Command::build(
            &req.program,
            &req.args,
            &req.env,
            req.workdir.as_deref(),
            &policy,
            &self.agent.cfg.exec_env,
            &[],
        ) {
            Ok(c) => c,
            Err((ErrorCode::NotAllowed, msg)) => {
                crate::debug!("held exec {id} refused: {msg}");
                let _ = self
                    .writer
                    .send(&Message::ExecResponse(exec::refused(id, msg)));
                return;
            }
            Err((code, msg)) => return self.writer.error(id, code, msg),
        };
        let guard = match ActiveGuard::acquire(policy.max_concurrent_execs) {
            Ok(g) => g,
            Err((code, msg)) => return self.writer.error(id, code, msg),
        };
        match self
            .agent
            .held
            .hold(&name, &cmd, std::mem::take(&mut req.stdin), guard)
        {
            Ok(_) => {
                let _ = self.writer.send(&Message::Ack(Ack { id }));
            }
            Err(held::HoldError::Refused(code, msg)) => self.writer.error(id, code, msg),
            Err(held::HoldError::NotStarted(mut resp)) => {
                resp.id = id;
                let _ = self.writer.send(&Message::ExecResponse(resp));
            }
        }
    }

    /// Makes a held exec request `a.id` of this connection ([`held`]).
    fn exec_attach(&mut self, a: voidbox_protocol::ExecAttach) {
        let id = a.id;
        if self.is_busy(id) {
            return self.writer.error(
                id,
                ErrorCode::DuplicateId,
                format!("request {id} is already in flight"),
            );
        }
        let Some(h) = self.agent.held.get(&a.name) else {
            return self.writer.error(
                id,
                ErrorCode::NotFound,
                format!("no held exec named `{}`", a.name),
            );
        };
        if !h.claim() {
            return self.writer.error(
                id,
                ErrorCode::Busy,
                format!("the held exec `{}` is attached already", a.name),
            );
        }
        let entry = Running {
            slot: Some(Arc::clone(h.slot())),
            stdin: None,
            pty: None,
        };
        if !self.register(id, entry) {
            h.unclaim();
            return;
        }
        let tx = h.attach_stdin(a.stdin, a.stdin_stream);
        if let Some(r) = lock(&self.running).get_mut(&id) {
            r.stdin = tx;
        }
        let policy = self.agent.policy();
        let deadline =
            std::time::Instant::now() + policy.timeout_for(a.timeout_secs.map(Duration::from_secs));
        let running = Arc::clone(&self.running);
        let attachment = held::Attachment::new(
            id,
            Arc::clone(&self.writer) as Arc<dyn Sink>,
            policy.max_output_bytes,
            Box::new(move || {
                lock(&running).remove(&id);
            }),
        );
        let table = self.agent.held.clone();
        let h2 = Arc::clone(&h);
        let spawned = std::thread::Builder::new()
            .name("attach".into())
            .spawn(move || h2.attach(&table, attachment, deadline));
        if let Err(e) = spawned {
            lock(&self.running).remove(&id);
            h.unclaim();
            self.writer.error(
                id,
                ErrorCode::ResourceLimit,
                format!("cannot start a thread: {e}"),
            );
        }
    }

    fn pty_open(&mut self, p: voidbox_protocol::PtyOpen) {
        let id = p.id;
        if self.is_busy(id) {
            return self.writer.error(
                id,
                ErrorCode::DuplicateId,
                format!("request {id} is already in flight"),
            );
        }
        let policy = self.agent.policy();
        if !policy.allow_pty {
            return self.writer.error(
                id,
                ErrorCode::NotAllowed,
                "PTY sessions are not allowed by the policy",
            );
        }
        let exec_env = &self.agent.cfg.exec_env;
        let cmd = match Command::build(
            &p.program,
            &p.args,
            &p.env,
            p.workdir.as_deref(),
            &policy,
            exec_env,
            &[("TERM", "xterm-256color")],
        ) {
            Ok(c) => c,
            Err((code, msg)) => return self.writer.error(id, code, msg),
        };
        let guard = match ActiveGuard::acquire(policy.max_concurrent_execs) {
            Ok(g) => g,
            Err((code, msg)) => return self.writer.error(id, code, msg),
        };
        if !self.register(id, Running::default()) {
            return;
        }
        let timeout = policy.timeout_for(p.timeout_secs.map(Duration::from_secs));
        let (session, handle) = match pty::start(id, &cmd, p.rows, p.cols, exec_env.creds, timeout)
        {
            Ok(s) => s,
            Err(e) => {
                lock(&self.running).remove(&id);
                return self.writer.error(id, ErrorCode::Io, e);
            }
        };
        if let Some(r) = lock(&self.running).get_mut(&id) {
            r.slot = Some(Arc::clone(handle.slot()));
            r.pty = Some(handle);
        }
        let _ = self.writer.send(&Message::Ack(Ack { id }));
        let (writer, running) = (Arc::clone(&self.writer), Arc::clone(&self.running));
        self.spawn_worker(id, "pty", move || {
            let _guard = guard;
            let resp = session.run(writer.as_ref());
            lock(&running).remove(&id);
            let _ = writer.send(&Message::ExecResponse(resp));
        });
    }

    fn write_file(&mut self, w: WriteFile) {
        let id = w.id;
        if self.is_busy(id) {
            return self.writer.error(
                id,
                ErrorCode::DuplicateId,
                format!("request {id} is already in flight"),
            );
        }
        let result = self
            .agent
            .roots
            .create_file(&w.path, w.mode, w.create_parents)
            .and_then(|f| {
                let mut fw = FileWriter::new(f, &w.path);
                fw.write_at(0, &w.contents)?;
                Ok(fw)
            });
        match result {
            Ok(fw) if w.more => {
                if lock(&self.running).len() + self.writes.len() >= MAX_INFLIGHT {
                    return self.writer.error(
                        id,
                        ErrorCode::ResourceLimit,
                        "too many requests in flight",
                    );
                }
                self.writes.insert(id, fw);
            }
            Ok(_) => {
                let _ = self.writer.send(&Message::Ack(Ack { id }));
            }
            Err(e) => self.writer.error(id, e.code, e.message),
        }
    }

    fn file_chunk(&mut self, c: FileChunk) {
        let id = c.id;
        let Some(fw) = self.writes.get_mut(&id) else {
            return self.writer.error(
                id,
                ErrorCode::NoSuchRequest,
                format!("no file transfer {id}"),
            );
        };
        match fw.write_at(c.offset, &c.data) {
            Ok(()) if c.last => {
                self.writes.remove(&id);
                let _ = self.writer.send(&Message::Ack(Ack { id }));
            }
            Ok(()) => {}
            Err(e) => {
                self.writes.remove(&id);
                self.writer.error(id, e.code, e.message);
            }
        }
    }
}
