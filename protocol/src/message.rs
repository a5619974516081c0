//! The message set: one struct per message type and the [`Message`] enum over all of them.
//!
//! Every message carries a [`RequestId`]; responses echo the id of the request they
//! answer, which lets many requests share one connection (see [`crate::mux`]).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::handshake::SessionSecret;
use crate::policy::{GuestInfo, GuestPolicy};
use crate::redact::{ByteLen, RedactedEnv};

/// Identifier tying responses to their request. `0` is reserved for the handshake and for
/// unsolicited messages; [`crate::RequestIdAllocator`] never hands it out.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct RequestId(pub u64);

impl RequestId {
    /// The reserved id `0`.
    pub const RESERVED: RequestId = RequestId(0);
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

impl From<u64> for RequestId {
    fn from(v: u64) -> Self {
        RequestId(v)
    }
}

macro_rules! message_types {
    ($( $(#[$doc:meta])* $name:ident = $byte:literal, $binary:literal; )*) => {
        /// The frame type byte of every message.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum MessageType {
            $( $(#[$doc])* $name = $byte, )*
        }

        impl MessageType {
            /// Every message type, in type-byte order.
            pub const ALL: &'static [MessageType] = &[$(MessageType::$name),*];

            /// Maps a raw type byte to a message type.
            pub fn from_u8(b: u8) -> Option<Self> {
                match b {
                    $( $byte => Some(MessageType::$name), )*
                    _ => None,
                }
            }

            /// The raw type byte.
            pub fn as_u8(self) -> u8 {
                self as u8
            }

            /// The message type's name (as used in errors and logs).
            pub fn name(self) -> &'static str {
                match self {
                    $( MessageType::$name => stringify!($name), )*
                }
            }

            /// `true` for types with a compact binary payload, `false` for JSON payloads.
            pub fn is_binary(self) -> bool {
                match self {
                    $( MessageType::$name => $binary, )*
                }
            }

            /// `true` for the types whose payload carries a session secret ([`Ping`],
            /// [`Rekey`]): I/O adapters zero their encoded bytes after use.
            pub fn carries_secret(self) -> bool {
                matches!(self, MessageType::Ping | MessageType::Rekey)
            }
        }
    };
}

message_types! {
    /// Host → guest handshake: version, session secret, optional policy. Binary.
    Ping = 0x01, true;
    /// Guest → host handshake reply: version and guest info. Binary.
    Pong = 0x02, true;
    /// Host → guest: sync and power off (or reboot). Answered by `Ack`.
    Shutdown = 0x03, false;
    /// Generic success reply without data.
    Ack = 0x04, false;
    /// Generic failure reply: code + message.
    Error = 0x05, false;
    /// Host → guest: rotate the session secret, reseed the RNG, set the clock. Binary.
    Rekey = 0x06, true;
    /// Host → guest: run a program.
    ExecRequest = 0x10, false;
    /// Guest → host: a piece of stdout/stderr. Binary.
    ExecOutputChunk = 0x11, true;
    /// Guest → host: an exec (or PTY session) finished.
    ExecResponse = 0x12, false;
    /// Host → guest: a piece of a streamed stdin. Binary.
    ExecStdin = 0x13, true;
    /// Host → guest: deliver a signal to a running exec's process group.
    ExecSignal = 0x14, false;
    /// Host → guest: attach a held exec to this request id.
    ExecAttach = 0x15, false;
    /// Host → guest: ask about a held exec. Answered by `HeldInfo`.
    HeldQuery = 0x16, false;
    /// Guest → host: the state of a held exec.
    HeldInfo = 0x17, false;
    /// Host → guest: write a file (optionally followed by `FileChunk`s).
    WriteFile = 0x20, false;
    /// Either direction: a piece of file contents. Binary.
    FileChunk = 0x21, true;
    /// Host → guest: read a file; answered by `FileChunk`s.
    ReadFile = 0x22, false;
    /// Host → guest: create a directory and its parents. Answered by `Ack`.
    MkdirP = 0x23, false;
    /// Host → guest: stat a path. Answered by `FileStatResponse`.
    FileStat = 0x24, false;
    /// Guest → host: metadata of a path.
    FileStatResponse = 0x25, false;
    /// Host → guest: list a directory. Answered by `DirListing`.
    ListDir = 0x26, false;
    /// Guest → host: the entries of a directory.
    DirListing = 0x27, false;
    /// Host → guest: mount a host directory share (a virtio-9p slot) at a guest path.
    /// Answered by `Ack`.
    MountShare = 0x28, false;
    /// Host → guest: open an interactive PTY session. Answered by `Ack`.
    PtyOpen = 0x30, false;
    /// Either direction: terminal bytes. Binary.
    PtyData = 0x31, true;
    /// Host → guest: change the terminal size.
    PtyResize = 0x32, false;
    /// Host → guest: hang up a PTY session.
    PtyClose = 0x33, false;
    /// Host → guest: ask for resource statistics.
    TelemetryRequest = 0x40, false;
    /// Guest → host: resource statistics.
    Telemetry = 0x41, false;
    /// Host → guest: which of these TCP ports accept a connection in the guest (a service's
    /// readiness). Answered by `PortsOpen`.
    ProbePorts = 0x42, false;
    /// Guest → host: the probed ports that accepted a connection.
    PortsOpen = 0x43, false;
}

impl fmt::Display for MessageType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Handshake request (host → guest), always the first frame on a connection.
#[derive(Clone, PartialEq, Eq)]
pub struct Ping {
    /// Request id (conventionally [`RequestId::RESERVED`]).
    pub id: RequestId,
    /// The host's [`crate::PROTOCOL_VERSION`].
    pub version: u32,
    /// The per-VM session secret; compared in constant time by the guest.
    pub secret: SessionSecret,
    /// Security policy to enforce from now on (if not already given at boot).
    pub policy: Option<GuestPolicy>,
}

impl fmt::Debug for Ping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ping")
            .field("id", &self.id)
            .field("version", &self.version)
            .field("secret", &self.secret)
            .field("policy", &self.policy)
            .finish()
    }
}

/// Handshake reply (guest → host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pong {
    /// Echoed request id.
    pub id: RequestId,
    /// The guest's [`crate::PROTOCOL_VERSION`].
    pub version: u32,
    /// Facts about the guest.
    pub info: GuestInfo,
}

/// Fewest entropy bytes a [`Rekey`] may carry.
pub const REKEY_ENTROPY_MIN: usize = 32;
/// Most entropy bytes a [`Rekey`] may carry.
pub const REKEY_ENTROPY_MAX: usize = 256;

/// Re-key an authenticated session (host → guest): rotate the session secret, reseed the
/// guest's kernel RNG with host entropy and set the guest's wall clock. Answered by [`Ack`]
/// or an [`ErrorResponse`].
///
/// Meant for VMs restored from a shared snapshot, whose clones all start with the same
/// secret, the same RNG state and a stale clock. The guest reseeds and sets the clock
/// *before* rotating the secret; if either fails it answers with an error and keeps the old
/// secret. Afterwards new connections must present `secret`; connections that are already
/// authenticated stay so. The secret is redacted and the entropy shown as its length in
/// `Debug`; both are zeroed on drop.
#[derive(Clone, PartialEq, Eq)]
pub struct Rekey {
    /// Request id.
    pub id: RequestId,
    /// The new session secret.
    pub secret: SessionSecret,
    /// The host's wall-clock time (`CLOCK_REALTIME`), nanoseconds since the Unix epoch.
    pub unix_time_ns: u64,
    /// Host entropy for the guest RNG: [`REKEY_ENTROPY_MIN`]..=[`REKEY_ENTROPY_MAX`] bytes
    /// (enforced on encode and decode).
    pub entropy: Zeroizing<Vec<u8>>,
}

impl Rekey {
    /// Builds a re-key request, refusing an entropy length outside
    /// [`REKEY_ENTROPY_MIN`]..=[`REKEY_ENTROPY_MAX`].
    pub fn new(
        id: RequestId,
        secret: SessionSecret,
        unix_time_ns: u64,
        entropy: Zeroizing<Vec<u8>>,
    ) -> crate::Result<Self> {
        check_rekey_entropy(entropy.len())
            .map_err(|d| crate::ProtocolError::malformed("Rekey", Some(id), d))?;
        Ok(Rekey {
            id,
            secret,
            unix_time_ns,
            entropy,
        })
    }
}

/// `Err(reason)` when `len` is not a valid [`Rekey::entropy`] length.
pub(crate) fn check_rekey_entropy(len: usize) -> Result<(), String> {
    if (REKEY_ENTROPY_MIN..=REKEY_ENTROPY_MAX).contains(&len) {
        Ok(())
    } else {
        Err(format!(
            "entropy must be {REKEY_ENTROPY_MIN}..={REKEY_ENTROPY_MAX} bytes, got {len}"
        ))
    }
}

impl fmt::Debug for Rekey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rekey")
            .field("id", &self.id)
            .field("secret", &self.secret)
            .field("unix_time_ns", &self.unix_time_ns)
            .field("entropy", &ByteLen(&self.entropy))
            .finish()
    }
}

/// What [`Shutdown`] should do after syncing filesystems.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShutdownAction {
    /// Power the VM off.
    #[default]
    PowerOff,
    /// Reboot the VM.
    Reboot,
}

/// Ask the guest to sync and power off. Answered by [`Ack`] before the guest goes down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shutdown {
    /// Request id.
    pub id: RequestId,
    /// Power off (default) or reboot.
    #[serde(default)]
    pub action: ShutdownAction,
}

/// Generic success reply (to `Shutdown`, `Rekey`, `WriteFile`, `MkdirP`, `MountShare`,
/// `PtyOpen`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Echoed request id.
    pub id: RequestId,
}

/// Machine-readable error category of an [`ErrorResponse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// Handshake missing or secret wrong.
    Unauthorized,
    /// Incompatible protocol version.
    VersionMismatch,
    /// Program not in the allowlist (or PTY not allowed).
    NotAllowed,
    /// Path outside the permitted roots or escaping them.
    PathDenied,
    /// No such file or directory.
    NotFound,
    /// Target already exists.
    AlreadyExists,
    /// OS permission error.
    PermissionDenied,
    /// Request is well-formed but invalid (bad argument, bad state).
    InvalidRequest,
    /// Frame payload could not be decoded.
    Malformed,
    /// Unknown frame type.
    UnknownType,
    /// Something exceeded a size limit.
    TooLarge,
    /// A request with this id is already in flight.
    DuplicateId,
    /// No in-flight request with this id (e.g. stdin for a finished exec).
    NoSuchRequest,
    /// A resource limit (concurrency, memory...) was hit.
    ResourceLimit,
    /// Operation timed out.
    Timeout,
    /// Other I/O failure.
    Io,
    /// Operation not supported by this guest.
    Unsupported,
    /// Bug or unexpected failure in the agent.
    Internal,
    /// The file is still open for writing by a guest process (a [`ReadFile`] with
    /// `complete`): not yet complete.
    Busy,
    /// A code this version does not know (forward compatibility).
    #[serde(other)]
    Unknown,
}

/// Generic failure reply, echoing the id of the failed request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// Echoed request id ([`RequestId::RESERVED`] when it could not be determined).
    pub id: RequestId,
    /// Error category.
    pub code: ErrorCode,
    /// Human-readable detail.
    pub message: String,
}

/// Run a program in the guest. The guest chooses the uid (there is deliberately no field
/// for it). Output arrives as [`ExecOutputChunk`]s, completion as [`ExecResponse`].
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Request id.
    pub id: RequestId,
    /// Program name (resolved through `PATH`) or absolute path.
    pub program: String,
    /// Arguments, excluding `argv[0]`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment as ordered `(name, value)` pairs. Values of sensitive names are redacted in `Debug`.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory (guest default when `None`).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Bytes written to stdin before it is closed (unless `stdin_stream` is set).
    #[serde(default, with = "crate::b64")]
    pub stdin: Vec<u8>,
    /// When `true`, stdin stays open after `stdin` and more bytes follow as [`ExecStdin`]
    /// frames until one with `eof` set.
    #[serde(default)]
    pub stdin_stream: bool,
    /// Wall-clock timeout; the guest kills the whole process group when it expires.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Hold the process under this name ([`valid_held_name`]): it starts like any exec
    /// (same checks and refusals), with stdin kept open after `stdin` and no deadline
    /// (`stdin_stream` and `timeout_secs` are ignored), and the guest answers [`Ack`] once
    /// it runs. The process then belongs to the agent, not to this connection: closing the
    /// connection does not kill it. Its output is kept in a bounded buffer
    /// ([`HELD_BUFFER_BYTES`]; when full the guest stops reading it) until an
    /// [`ExecAttach`] takes it over. A taken name is refused with
    /// [`ErrorCode::AlreadyExists`], more than [`MAX_HELD`] with [`ErrorCode::ResourceLimit`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
}

/// Most held execs ([`ExecRequest::hold`]) a guest keeps at once.
pub const MAX_HELD: usize = 4;
/// Output bytes a held exec buffers before the guest stops reading its pipes.
pub const HELD_BUFFER_BYTES: usize = 1 << 20;
/// Longest held-exec name.
pub const MAX_HELD_NAME: usize = 64;

/// Whether `name` is a valid held-exec name: 1..=[`MAX_HELD_NAME`] of `[a-z0-9._-]`.
pub fn valid_held_name(name: &str) -> bool {
    (1..=MAX_HELD_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
}

impl fmt::Debug for ExecRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecRequest")
            .field("id", &self.id)
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &RedactedEnv(&self.env))
            .field("workdir", &self.workdir)
            .field("stdin", &ByteLen(&self.stdin))
            .field("stdin_stream", &self.stdin_stream)
            .field("timeout_secs", &self.timeout_secs)
            .field("hold", &self.hold)
            .finish()
    }
}

/// Attach the held exec `name` ([`ExecRequest::hold`]) to request `id` of this connection.
/// The buffered output is replayed as [`ExecOutputChunk`]s of `id` (`seq` from 0), `stdin`
/// is written (and stdin closed after it unless `stdin_stream`), and from then on the
/// process is an exec started by `id`: [`ExecStdin`] and [`ExecSignal`] name `id`, the
/// deadline runs from now (`timeout_secs`, `timed_out` in the response), its
/// [`ExecResponse`] (of `id`) comes at exit, and closing the connection kills it. A process
/// that exited while held is answered with its replayed output and its status at once.
/// Errors: unknown name [`ErrorCode::NotFound`]; attached already [`ErrorCode::Busy`].
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecAttach {
    /// Request id the held exec takes over.
    pub id: RequestId,
    /// The held exec's name.
    pub name: String,
    /// Bytes written to stdin once the output is replayed.
    #[serde(default, with = "crate::b64")]
    pub stdin: Vec<u8>,
    /// When `true`, stdin stays open after `stdin` (more as [`ExecStdin`] frames of `id`).
    #[serde(default)]
    pub stdin_stream: bool,
    /// Deadline from the attach; the guest kills the process group when it expires.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

impl fmt::Debug for ExecAttach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecAttach")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("stdin", &ByteLen(&self.stdin))
            .field("stdin_stream", &self.stdin_stream)
            .field("timeout_secs", &self.timeout_secs)
            .finish()
    }
}

/// Ask about the held exec `name` (attached or not). Answered by [`HeldInfo`], or
/// [`ErrorCode::NotFound`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldQuery {
    /// Request id.
    pub id: RequestId,
    /// The held exec's name.
    pub name: String,
}

/// The state of a held exec (guest → host): hosts poll it to see a held program settle
/// (its CPU time stops growing, no thread runs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldInfo {
    /// Echoed request id.
    pub id: RequestId,
    /// The process (and process-group) id.
    pub pid: u32,
    /// CPU time (user + system, including reaped children's) of every process of its
    /// process group, in milliseconds; never decreases.
    #[serde(default)]
    pub cpu_ms: u64,
    /// Threads of the process group in state `R` (running or runnable) or `D`
    /// (uninterruptible sleep: disk I/O, a page fault on a file).
    #[serde(default)]
    pub running_threads: u32,
    /// `true` once the process has exited (its status waits for the attach).
    #[serde(default)]
    pub exited: bool,
    /// Output bytes buffered for the attach.
    #[serde(default)]
    pub buffered_bytes: u64,
}

/// Which output stream a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    /// Standard output (wire value 1).
    Stdout,
    /// Standard error (wire value 2).
    Stderr,
}

impl OutputStream {
    /// Wire byte (1 = stdout, 2 = stderr, like the file descriptors).
    pub fn as_u8(self) -> u8 {
        match self {
            OutputStream::Stdout => 1,
            OutputStream::Stderr => 2,
        }
    }

    /// Parses the wire byte.
    pub fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(OutputStream::Stdout),
            2 => Some(OutputStream::Stderr),
            _ => None,
        }
    }
}

/// A piece of an exec's output. `seq` starts at 0 and increases by one per chunk of the
/// same request (across both streams), so the host can detect loss or reordering.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecOutputChunk {
    /// Id of the [`ExecRequest`].
    pub id: RequestId,
    /// stdout or stderr.
    pub stream: OutputStream,
    /// Per-request sequence number.
    pub seq: u64,
    /// Raw output bytes.
    pub data: Vec<u8>,
}

impl fmt::Debug for ExecOutputChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecOutputChunk")
            .field("id", &self.id)
            .field("stream", &self.stream)
            .field("seq", &self.seq)
            .field("data", &ByteLen(&self.data))
            .finish()
    }
}

/// [`ExecResponse::exit_code`] of an exec the guest refused because its program is outside
/// the command allowlist (the shell's "found but cannot execute").
pub const EXIT_NOT_ALLOWED: i32 = 126;

/// Final status of an exec or PTY session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResponse {
    /// Id of the [`ExecRequest`] / [`PtyOpen`].
    pub id: RequestId,
    /// Exit status when the process exited normally.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Terminating signal number when the process was killed by a signal.
    #[serde(default)]
    pub signal: Option<i32>,
    /// `true` when the guest killed the process group because the timeout expired.
    #[serde(default)]
    pub timed_out: bool,
    /// Wall-clock run time in milliseconds.
    #[serde(default)]
    pub duration_ms: u64,
    /// Set when nothing ran: the program is outside the command allowlist (`exit_code`
    /// [`EXIT_NOT_ALLOWED`], the message names the program), or it passed the policy but
    /// could not be started (exec error, bad workdir; `exit_code` 127). Invalid requests and
    /// other refusals are answered with [`ErrorResponse`] instead (`InvalidRequest`,
    /// `NotFound`, `ResourceLimit`, ...).
    #[serde(default)]
    pub error: Option<String>,
    /// Total stdout bytes produced (including any dropped beyond the output cap).
    #[serde(default)]
    pub stdout_bytes: u64,
    /// Total stderr bytes produced (including any dropped beyond the output cap).
    #[serde(default)]
    pub stderr_bytes: u64,
    /// `true` when output beyond the policy's `max_output_bytes` was dropped.
    #[serde(default)]
    pub output_truncated: bool,
}

impl ExecResponse {
    /// The run time as a [`Duration`].
    pub fn duration(&self) -> Duration {
        Duration::from_millis(self.duration_ms)
    }

    /// `true` when the process exited with status 0 and was not signalled or timed out.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
            && self.signal.is_none()
            && !self.timed_out
            && self.error.is_none()
    }
}

/// A piece of streamed stdin for an exec started with `stdin_stream: true`.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecStdin {
    /// Id of the [`ExecRequest`].
    pub id: RequestId,
    /// When `true`, stdin is closed after `data`.
    pub eof: bool,
    /// Bytes to write.
    pub data: Vec<u8>,
}

impl fmt::Debug for ExecStdin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecStdin")
            .field("id", &self.id)
            .field("eof", &self.eof)
            .field("data", &ByteLen(&self.data))
            .finish()
    }
}

/// Send a signal to the process group of a running exec or PTY session (`id` is that
/// request's id). No reply on success; [`ErrorResponse`] with `NoSuchRequest` otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSignal {
    /// Id of the running [`ExecRequest`] / [`PtyOpen`].
    pub id: RequestId,
    /// Signal number (e.g. 15 for SIGTERM).
    pub signal: i32,
}

/// Write a file. When `more` is `false` the file is complete and the guest answers with
/// [`Ack`]; otherwise [`FileChunk`]s with the same id follow and the `Ack` comes after
/// the chunk marked `last`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFile {
    /// Request id.
    pub id: RequestId,
    /// Absolute guest path (confined by the guest to its permitted roots).
    pub path: String,
    /// Permission bits (guest default, typically 0o644, when `None`).
    #[serde(default)]
    pub mode: Option<u32>,
    /// Initial contents (the whole file unless `more`).
    #[serde(default, with = "crate::b64")]
    pub contents: Vec<u8>,
    /// `true` when [`FileChunk`]s follow.
    #[serde(default)]
    pub more: bool,
    /// Create missing parent directories.
    #[serde(default)]
    pub create_parents: bool,
}

impl fmt::Debug for WriteFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteFile")
            .field("id", &self.id)
            .field("path", &self.path)
            .field("mode", &self.mode.map(|m| format!("{m:o}")))
            .field("contents", &ByteLen(&self.contents))
            .field("more", &self.more)
            .field("create_parents", &self.create_parents)
            .finish()
    }
}

impl WriteFile {
    /// Splits a file transfer into protocol messages: a single inline `WriteFile` when
    /// `data` fits in `chunk_size` (clamped to 1..=[`crate::FILE_CHUNK_SIZE`]), otherwise a
    /// `WriteFile` with `more: true` followed by binary [`FileChunk`]s, the last flagged.
    pub fn chunked<'a>(
        id: RequestId,
        path: impl Into<String>,
        mode: Option<u32>,
        data: &'a [u8],
        chunk_size: usize,
    ) -> impl Iterator<Item = Message> + 'a {
        let chunk_size = chunk_size.clamp(1, crate::FILE_CHUNK_SIZE);
        let inline = data.len() <= chunk_size;
        let head = WriteFile {
            id,
            path: path.into(),
            mode,
            contents: if inline { data.to_vec() } else { Vec::new() },
            more: !inline,
            create_parents: false,
        };
        let chunks = if inline {
            None
        } else {
            Some(data.chunks(chunk_size))
        };
        let n = data.len().div_ceil(chunk_size);
        std::iter::once(Message::WriteFile(head)).chain(
            chunks.into_iter().flatten().enumerate().map(move |(i, c)| {
                Message::FileChunk(FileChunk {
                    id,
                    offset: (i * chunk_size) as u64,
                    last: i + 1 == n,
                    data: c.to_vec(),
                })
            }),
        )
    }
}

/// A piece of file contents: the continuation of a [`WriteFile`] (host → guest) or the
/// reply to a [`ReadFile`] (guest → host). `offset` is the position of `data` in the file.
#[derive(Clone, PartialEq, Eq)]
pub struct FileChunk {
    /// Id of the [`WriteFile`] / [`ReadFile`].
    pub id: RequestId,
    /// Byte offset of `data` within the file.
    pub offset: u64,
    /// `true` on the final chunk of the transfer.
    pub last: bool,
    /// Contents.
    pub data: Vec<u8>,
}

impl fmt::Debug for FileChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileChunk")
            .field("id", &self.id)
            .field("offset", &self.offset)
            .field("last", &self.last)
            .field("data", &ByteLen(&self.data))
            .finish()
    }
}

/// Read a file. The guest replies with one or more [`FileChunk`]s (the final one has
/// `last` set; an empty file yields one empty last chunk) or an [`ErrorResponse`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadFile {
    /// Request id.
    pub id: RequestId,
    /// Absolute guest path.
    pub path: String,
    /// Start reading at this offset.
    #[serde(default)]
    pub offset: u64,
    /// Read at most this many bytes (whole file when `None`).
    #[serde(default)]
    pub max_len: Option<u64>,
    /// Preferred chunk size (guest default when `None`; capped by the guest).
    #[serde(default)]
    pub chunk_size: Option<u32>,
    /// Only a complete file: refused with [`ErrorCode::Busy`] while any guest process holds
    /// it open for writing (a service's ready file is read once it is written and closed, or
    /// renamed into place).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub complete: bool,
}

/// Create a directory and any missing parents (`mkdir -p`). Answered by [`Ack`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MkdirP {
    /// Request id.
    pub id: RequestId,
    /// Absolute guest path.
    pub path: String,
    /// Permission bits for created directories (guest default, typically 0o755, when `None`).
    #[serde(default)]
    pub mode: Option<u32>,
}

/// Stat a path (without following a final symlink). Answered by [`FileStatResponse`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// Request id.
    pub id: RequestId,
    /// Absolute guest path.
    pub path: String,
}

/// Kind of filesystem object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// Regular file.
    #[default]
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Anything else (device, fifo, socket).
    Other,
}

/// Metadata of a path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStatResponse {
    /// Echoed request id.
    pub id: RequestId,
    /// Object kind.
    pub kind: FileKind,
    /// Size in bytes.
    #[serde(default)]
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    #[serde(default)]
    pub mode: u32,
    /// Owner uid.
    #[serde(default)]
    pub uid: u32,
    /// Owner gid.
    #[serde(default)]
    pub gid: u32,
    /// Modification time, seconds since the Unix epoch.
    #[serde(default)]
    pub mtime_secs: i64,
}

/// List a directory's entries without following symlinks in it (host → guest). Answered by
/// [`DirListing`] or an [`ErrorResponse`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDir {
    /// Request id.
    pub id: RequestId,
    /// Absolute guest path of the directory.
    pub path: String,
}

/// One entry of a [`DirListing`]. The name comes from the guest: hosts must treat it as
/// untrusted (it is checked to be one path component, but hosts check again).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// File name (one component; entries whose name is not UTF-8 are listed as
    /// [`FileKind::Other`] with a lossy name).
    pub name: String,
    /// Object kind (`lstat`: a symlink is reported as such, never followed).
    pub kind: FileKind,
    /// Size in bytes (regular files).
    #[serde(default)]
    pub size: u64,
}

/// The entries of a directory (guest → host), sorted by name, without `.` and `..`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirListing {
    /// Echoed request id.
    pub id: RequestId,
    /// The entries (at most [`MAX_DIR_ENTRIES`]).
    pub entries: Vec<DirEntry>,
    /// Set when the directory held more than [`MAX_DIR_ENTRIES`] entries.
    #[serde(default)]
    pub truncated: bool,
}

/// Most entries one [`DirListing`] carries (keeps the frame far below the message limit).
pub const MAX_DIR_ENTRIES: usize = 65_536;

/// Mount a host directory share at a guest path (host → guest): the VMM serves share slot
/// `slot` as the virtio-9p device with mount tag `voidbox<slot>`; the guest agent mounts it
/// (9P2000.L) at `path` in every root its commands run in, creating the directory when
/// missing. `path` must be absolute and normalized, not `/` nor at or under the guest's
/// system or agent paths (`/proc`, `/sys`, `/dev`, `/run`, `/etc/voidbox`, …). Answered by
/// [`Ack`], or an [`ErrorResponse`] saying why not (the VMM refuses the attach of a slot it
/// has not bound: [`ErrorCode::NotFound`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountShare {
    /// Request id.
    pub id: RequestId,
    /// The share slot (`0..`[`MAX_SHARE_SLOTS`]).
    pub slot: u8,
    /// Absolute guest path of the mount point.
    pub path: String,
    /// Mount read-only (the VMM refuses writes to a read-only share in any case). A message
    /// without the field mounts read-only.
    #[serde(default = "default_true")]
    pub read_only: bool,
}

/// Share slots a VM has (tags `voidbox0` … `voidbox3`).
pub const MAX_SHARE_SLOTS: u8 = 4;

fn default_true() -> bool {
    true
}

/// Open an interactive session on a pseudo-terminal. Answered by [`Ack`]; terminal output
/// then flows as [`PtyData`] and the end of the session as [`ExecResponse`].
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyOpen {
    /// Request id; names the session in later PTY messages.
    pub id: RequestId,
    /// Program to run (e.g. `/bin/sh`).
    pub program: String,
    /// Arguments, excluding `argv[0]`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment (sensitive values redacted in `Debug`).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Terminal rows.
    pub rows: u16,
    /// Terminal columns.
    pub cols: u16,
    /// Session timeout.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

impl fmt::Debug for PtyOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PtyOpen")
            .field("id", &self.id)
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &RedactedEnv(&self.env))
            .field("workdir", &self.workdir)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("timeout_secs", &self.timeout_secs)
            .finish()
    }
}

/// Terminal bytes for a PTY session (host → guest: input; guest → host: output).
#[derive(Clone, PartialEq, Eq)]
pub struct PtyData {
    /// Id of the [`PtyOpen`].
    pub id: RequestId,
    /// Raw terminal bytes.
    pub data: Vec<u8>,
}

impl fmt::Debug for PtyData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PtyData")
            .field("id", &self.id)
            .field("data", &ByteLen(&self.data))
            .finish()
    }
}

/// Resize a PTY session's terminal. No reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyResize {
    /// Id of the [`PtyOpen`].
    pub id: RequestId,
    /// New rows.
    pub rows: u16,
    /// New columns.
    pub cols: u16,
}

/// Hang up a PTY session (the guest sends SIGHUP and later SIGKILL to its process group);
/// the session's [`ExecResponse`] follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyClose {
    /// Id of the [`PtyOpen`].
    pub id: RequestId,
}

/// Ask the guest for a [`Telemetry`] snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelemetryRequest {
    /// Request id.
    pub id: RequestId,
}

/// Most ports one [`ProbePorts`] may name (the guest refuses more).
pub const MAX_PROBE_PORTS: usize = 64;

/// Ask the guest which of `ports` accept a TCP connection at `addr` (its loopback when
/// `None`): a service is ready when all of them do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbePorts {
    /// Request id.
    pub id: RequestId,
    /// The ports (at most [`MAX_PROBE_PORTS`], none zero).
    pub ports: Vec<u16>,
    /// Where to connect: one of the guest's own addresses (the one its dependents reach it
    /// at); `127.0.0.1` when `None`. Any other address is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<std::net::Ipv4Addr>,
}

/// The answer to a [`ProbePorts`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortsOpen {
    /// Echoed request id.
    pub id: RequestId,
    /// The probed ports that accepted a connection, in the request's order.
    pub open: Vec<u16>,
}

/// Guest resource statistics (from `/proc`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Telemetry {
    /// Echoed request id.
    pub id: RequestId,
    /// Time since guest boot, in milliseconds.
    #[serde(default)]
    pub uptime_ms: u64,
    /// Cumulative CPU time in user mode, all CPUs, milliseconds.
    #[serde(default)]
    pub cpu_user_ms: u64,
    /// Cumulative CPU time in kernel mode, all CPUs, milliseconds.
    #[serde(default)]
    pub cpu_system_ms: u64,
    /// Cumulative idle CPU time, all CPUs, milliseconds.
    #[serde(default)]
    pub cpu_idle_ms: u64,
    /// `MemTotal` in KiB.
    #[serde(default)]
    pub mem_total_kb: u64,
    /// `MemAvailable` in KiB.
    #[serde(default)]
    pub mem_available_kb: u64,
    /// 1, 5 and 15 minute load averages × 1000.
    #[serde(default)]
    pub load_avg_milli: [u32; 3],
    /// Number of processes in the guest.
    #[serde(default)]
    pub processes: u32,
    /// Number of execs / PTY sessions currently running under the agent.
    #[serde(default)]
    pub active_execs: u32,
}

/// Any protocol message. Variant names match the [`MessageType`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // each variant is documented on its payload type
pub enum Message {
    Ping(Ping),
    Pong(Pong),
    Shutdown(Shutdown),
    Ack(Ack),
    Error(ErrorResponse),
    Rekey(Rekey),
    ExecRequest(ExecRequest),
    ExecOutputChunk(ExecOutputChunk),
    ExecResponse(ExecResponse),
    ExecStdin(ExecStdin),
    ExecSignal(ExecSignal),
    ExecAttach(ExecAttach),
    HeldQuery(HeldQuery),
    HeldInfo(HeldInfo),
    WriteFile(WriteFile),
    FileChunk(FileChunk),
    ReadFile(ReadFile),
    MkdirP(MkdirP),
    FileStat(FileStat),
    FileStatResponse(FileStatResponse),
    ListDir(ListDir),
    DirListing(DirListing),
    MountShare(MountShare),
    PtyOpen(PtyOpen),
    PtyData(PtyData),
    PtyResize(PtyResize),
    PtyClose(PtyClose),
    TelemetryRequest(TelemetryRequest),
    Telemetry(Telemetry),
    ProbePorts(ProbePorts),
    PortsOpen(PortsOpen),
}

macro_rules! for_each_variant {
    ($self:expr, $m:ident => $body:expr) => {
        match $self {
            Message::Ping($m) => $body,
            Message::Pong($m) => $body,
            Message::Shutdown($m) => $body,
            Message::Ack($m) => $body,
            Message::Error($m) => $body,
            Message::Rekey($m) => $body,
            Message::ExecRequest($m) => $body,
            Message::ExecOutputChunk($m) => $body,
            Message::ExecResponse($m) => $body,
            Message::ExecStdin($m) => $body,
            Message::ExecSignal($m) => $body,
            Message::ExecAttach($m) => $body,
            Message::HeldQuery($m) => $body,
            Message::HeldInfo($m) => $body,
            Message::WriteFile($m) => $body,
            Message::FileChunk($m) => $body,
            Message::ReadFile($m) => $body,
            Message::MkdirP($m) => $body,
            Message::FileStat($m) => $body,
            Message::FileStatResponse($m) => $body,
            Message::ListDir($m) => $body,
            Message::DirListing($m) => $body,
            Message::MountShare($m) => $body,
            Message::PtyOpen($m) => $body,
            Message::PtyData($m) => $body,
            Message::PtyResize($m) => $body,
            Message::PtyClose($m) => $body,
            Message::TelemetryRequest($m) => $body,
            Message::Telemetry($m) => $body,
            Message::ProbePorts($m) => $body,
            Message::PortsOpen($m) => $body,
        }
    };
}

impl Message {
    /// The request id this message belongs to.
    pub fn id(&self) -> RequestId {
        for_each_variant!(self, m => m.id)
    }

    /// The message's type (and frame type byte).
    pub fn message_type(&self) -> MessageType {
        match self {
            Message::Ping(_) => MessageType::Ping,
            Message::Pong(_) => MessageType::Pong,
            Message::Shutdown(_) => MessageType::Shutdown,
            Message::Ack(_) => MessageType::Ack,
            Message::Error(_) => MessageType::Error,
            Message::Rekey(_) => MessageType::Rekey,
            Message::ExecRequest(_) => MessageType::ExecRequest,
            Message::ExecOutputChunk(_) => MessageType::ExecOutputChunk,
            Message::ExecResponse(_) => MessageType::ExecResponse,
            Message::ExecStdin(_) => MessageType::ExecStdin,
            Message::ExecSignal(_) => MessageType::ExecSignal,
            Message::ExecAttach(_) => MessageType::ExecAttach,
            Message::HeldQuery(_) => MessageType::HeldQuery,
            Message::HeldInfo(_) => MessageType::HeldInfo,
            Message::WriteFile(_) => MessageType::WriteFile,
            Message::FileChunk(_) => MessageType::FileChunk,
            Message::ReadFile(_) => MessageType::ReadFile,
            Message::MkdirP(_) => MessageType::MkdirP,
            Message::FileStat(_) => MessageType::FileStat,
            Message::FileStatResponse(_) => MessageType::FileStatResponse,
            Message::ListDir(_) => MessageType::ListDir,
            Message::DirListing(_) => MessageType::DirListing,
            Message::MountShare(_) => MessageType::MountShare,
            Message::PtyOpen(_) => MessageType::PtyOpen,
            Message::PtyData(_) => MessageType::PtyData,
            Message::PtyResize(_) => MessageType::PtyResize,
            Message::PtyClose(_) => MessageType::PtyClose,
            Message::TelemetryRequest(_) => MessageType::TelemetryRequest,
            Message::Telemetry(_) => MessageType::Telemetry,
            Message::ProbePorts(_) => MessageType::ProbePorts,
            Message::PortsOpen(_) => MessageType::PortsOpen,
        }
    }

    /// `true` when this message, sent by the guest, ends the exchange for its request id:
    /// `Pong`, `Ack`, `Error`, `ExecResponse`, `FileStatResponse`, `Telemetry`, `PortsOpen`,
    /// `HeldInfo`, or a
    /// `FileChunk` with `last` set. The demultiplexer drops its route after delivering it.
    ///
    /// Note: `Ack` to a [`PtyOpen`] is *not* final for the session; hosts that open PTYs
    /// should use [`Message::is_terminal_for`] with the request's type.
    pub fn is_terminal(&self) -> bool {
        match self {
            Message::Pong(_)
            | Message::Ack(_)
            | Message::Error(_)
            | Message::ExecResponse(_)
            | Message::FileStatResponse(_)
            | Message::DirListing(_)
            | Message::Telemetry(_)
            | Message::PortsOpen(_)
            | Message::HeldInfo(_) => true,
            Message::FileChunk(c) => c.last,
            _ => false,
        }
    }

    /// Like [`Message::is_terminal`], but knowing which request type the id was opened
    /// with: for a `PtyOpen`, only `ExecResponse` or `Error` end the session.
    pub fn is_terminal_for(&self, request: MessageType) -> bool {
        match request {
            MessageType::PtyOpen => matches!(self, Message::ExecResponse(_) | Message::Error(_)),
            _ => self.is_terminal(),
        }
    }

    /// Builds an [`ErrorResponse`] message.
    pub fn error(id: RequestId, code: ErrorCode, message: impl Into<String>) -> Message {
        Message::Error(ErrorResponse {
            id,
            code,
            message: message.into(),
        })
    }
}

macro_rules! impl_from {
    ($($v:ident),*) => {$(
        impl From<$v> for Message {
            fn from(m: $v) -> Message {
                Message::$v(m)
            }
        }
    )*};
}

impl_from!(
    Ping,
    Pong,
    Shutdown,
    Ack,
    Rekey,
    ExecRequest,
    ExecOutputChunk,
    ExecResponse,
    ExecStdin,
    ExecSignal,
    ExecAttach,
    HeldQuery,
    HeldInfo,
    WriteFile,
    FileChunk,
    ReadFile,
    MkdirP,
    FileStat,
    FileStatResponse,
    ListDir,
    DirListing,
    MountShare,
    PtyOpen,
    PtyData,
    PtyResize,
    PtyClose,
    TelemetryRequest,
    Telemetry,
    ProbePorts,
    PortsOpen
);

impl From<ErrorResponse> for Message {
    fn from(m: ErrorResponse) -> Message {
        Message::Error(m)
    }
}
