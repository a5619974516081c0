//! Running programs for ExecRequest (and, via [`Command`], PtyOpen).
//!
//! * Policy first: the program is resolved and checked against the allowlist before
//!   anything is created. A program outside the allowlist gets an `ExecResponse` with exit
//!   code 126 and `error` naming it ([`refused`]); other failures are answered with an
//!   `Error` (`NotFound`, `InvalidRequest`, `ResourceLimit`). A program that passes but
//!   cannot be started (exec failure, bad workdir) gets an `ExecResponse` with `error` set
//!   and exit code 127. Children of an allowed program are not filtered.
//! * Every child runs as uid/gid 1000 (or `voidbox.user`) with no supplementary groups,
//!   the policy's rlimits, in a new session/process group ([`crate::spawn`]) — and, when the
//!   node has an image, inside it ([`crate::rootfs`]): the program is then looked up there.
//!   If the disks or the network failed at boot, every exec answers exit code 127 with the
//!   reason.
//! * The [`crate::watchdog`] SIGKILLs the whole process group at the deadline
//!   (`timed_out` in the response); when the leader exits the rest of its group is killed
//!   too, so an exec's processes never outlive it.
//! * stdout/stderr are streamed as `ExecOutputChunk`s of at most 64 KiB with one sequence
//!   counter per request. Chunks are written to the connection synchronously, so a slow
//!   host throttles the child through the pipe (bounded agent memory for any output size).
//! * A held exec (`ExecRequest::hold`) starts the same way but belongs to the agent until
//!   an `ExecAttach`: see [`crate::held`].

use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use voidbox_protocol::{
    ErrorCode, ExecOutputChunk, ExecRequest, ExecResponse, Message, OutputStream, RequestId,
    EXIT_NOT_ALLOWED, OUTPUT_CHUNK_SIZE,
};

use crate::policy::{Policy, SYSTEM_PATH};
use crate::reaper::{ExitSlot, ExitStatus, Reaper};
use crate::rootfs::ExecRoot;
use crate::spawn::{Credentials, SpawnPlan};

/// How long output is still drained after the leader exited (for pipes held open by a
/// process that escaped the process group).
pub const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Where responses go (implemented by the connection writer).
pub trait Sink: Send + Sync {
    /// Sends one message; an error means the connection is gone.
    fn send(&self, msg: &Message) -> io::Result<()>;
}

/// Environment-independent facts about how children are run.
#[derive(Debug, Clone)]
pub struct ExecEnv {
    /// Identity of children (`None` only with the explicit `--no-drop` host flag).
    pub creds: Option<Credentials>,
    /// Prefix for guest paths `/workspace`, `/home`, `/etc/voidbox` (`/` in the guest).
    pub base: PathBuf,
    /// The root filesystem children run in (the node's image, see [`crate::rootfs`]).
    pub root: ExecRoot,
}

impl ExecEnv {
    /// Maps a guest path to the one children see: under the confinement roots it is
    /// relocated below `base` (host tests), anything else — and everything in an image
    /// root, which has `/workspace` and `/home/sandbox` at their guest paths — is used as is.
    pub fn map_path(&self, guest: &str) -> PathBuf {
        if matches!(self.root, ExecRoot::Image(_)) {
            return PathBuf::from(guest);
        }
        for (root, _) in crate::files::ROOTS {
            if voidbox_protocol::guest_paths::at_or_under(guest, root) {
                return self.base.join(guest.trim_start_matches('/'));
            }
        }
        PathBuf::from(guest)
    }

    /// Home directory of the sandbox user.
    pub fn home(&self) -> PathBuf {
        self.map_path("/home/sandbox")
    }

    /// Default working directory of children.
    pub fn workspace(&self) -> PathBuf {
        self.map_path("/workspace")
    }
}

/// Number of execs/PTYs currently running (for the concurrency cap and telemetry).
static ACTIVE: AtomicU32 = AtomicU32::new(0);

/// Currently running execs and PTY sessions.
pub fn active_count() -> u32 {
    ACTIVE.load(Ordering::Relaxed)
}

/// A reservation of one concurrency slot; released on drop.
pub struct ActiveGuard(());

impl ActiveGuard {
    /// Takes a slot unless `max` are in use.
    pub fn acquire(max: u32) -> Result<ActiveGuard, (ErrorCode, String)> {
        ACTIVE
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| ActiveGuard(()))
            .map_err(|n| {
                (
                    ErrorCode::ResourceLimit,
                    format!("too many concurrent execs ({n} of {max})"),
                )
            })
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A validated, ready-to-spawn command.
pub struct Command {
    path: PathBuf,
    argv: Vec<String>,
    env: Vec<String>,
    cwd: PathBuf,
    creds: Option<Credentials>,
    rlimits: Vec<(libc::c_int, u64)>,
    root: ExecRoot,
}

impl Command {
    /// Validates a request against the policy and builds the command line, environment
    /// and working directory.
    pub fn build(
        program: &str,
        args: &[String],
        env: &[(String, String)],
        workdir: Option<&str>,
        policy: &Policy,
        exec_env: &ExecEnv,
        extra_env: &[(&str, &str)],
    ) -> Result<Command, (ErrorCode, String)> {
        let mut vars: Vec<(String, String)> = vec![
            ("PATH".into(), SYSTEM_PATH.into()),
            (
                "HOME".into(),
                exec_env.home().to_string_lossy().into_owned(),
            ),
            ("USER".into(), "sandbox".into()),
            ("LOGNAME".into(), "sandbox".into()),
            ("SHELL".into(), "/bin/sh".into()),
        ];
        vars.extend(
            extra_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        for (k, v) in env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err((
                    ErrorCode::InvalidRequest,
                    format!("invalid environment variable name `{k}`"),
                ));
            }
            match vars.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = v.clone(),
                None => vars.push((k.clone(), v.clone())),
            }
        }
        if args.iter().any(|a| a.contains('\0')) {
            return Err((
                ErrorCode::InvalidRequest,
                "argument contains a NUL byte".into(),
            ));
        }
        let search = vars
            .iter()
            .find(|(k, _)| k == "PATH")
            .map_or(SYSTEM_PATH, |(_, v)| v.as_str());
        let path = match &exec_env.root {
            ExecRoot::System => policy.check_program(program, search)?,
            // PATH lookup and the allowlist check happen inside the image.
            ExecRoot::Image(image) => {
                let (policy, program, search) =
                    (policy.clone(), program.to_string(), search.to_string());
                image
                    .run(move || policy.check_program(&program, &search))
                    .map_err(|e| (ErrorCode::Io, format!("image root: {e}")))??
            }
            // Never executed: `spawn` answers with the boot failure.
            ExecRoot::Broken(_) => PathBuf::from(program),
        };
        let cwd = match workdir {
            Some(w) if !w.is_empty() => {
                if !w.starts_with('/') {
                    return Err((
                        ErrorCode::InvalidRequest,
                        format!("workdir `{w}` must be absolute"),
                    ));
                }
                let cwd = exec_env.map_path(w);
                // In an image root, a missing working directory is made (the image's
                // `WorkingDir`, or a `run.workdir`), as Docker does; elsewhere it is an error.
                if let ExecRoot::Image(image) = &exec_env.root {
                    let (dir, user) =
                        (cwd.clone(), exec_env.creds.unwrap_or(crate::spawn::SANDBOX));
                    image
                        .run(move || {
                            if dir.is_dir() {
                                return Ok(());
                            }
                            crate::shares::ensure_dir(&dir, user)
                        })
                        .map_err(|e| (ErrorCode::Io, format!("image root: {e}")))?
                        .map_err(|e| (ErrorCode::Io, e))?;
                }
                cwd
            }
            _ => exec_env.workspace(),
        };
        vars.push(("PWD".into(), cwd.to_string_lossy().into_owned()));
        let r = policy.rlimits;
        let rlimits = [
            (libc::RLIMIT_NOFILE, r.nofile),
            (libc::RLIMIT_NPROC, r.nproc),
            (libc::RLIMIT_FSIZE, r.fsize_bytes()),
            (libc::RLIMIT_AS, r.address_space_bytes()),
        ]
        .into_iter()
        .filter_map(|(res, v)| v.map(|v| (res as libc::c_int, v)))
        .collect();
        let mut argv = Vec::with_capacity(args.len() + 1);
        argv.push(program.to_string());
        argv.extend(args.iter().cloned());
        Ok(Command {
            path,
            argv,
            env: vars.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
            cwd,
            creds: exec_env.creds,
            rlimits,
            root: exec_env.root.clone(),
        })
    }

    /// The resolved program path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Spawns the command with the given stdio fds, registered with the reaper.
    /// On failure after the child was created, the child is reaped by the reaper.
    pub fn spawn(&self, stdio: [RawFd; 3], controlling_tty: bool) -> Result<Arc<ExitSlot>, String> {
        let mut plan = self.plan(stdio, controlling_tty)?;
        let reaper = Reaper::get().ok_or("the reaper is not running")?;
        let (slot, result) = reaper
            .spawn_registered(true, || match plan.spawn() {
                Ok(pid) => (Some(pid), Ok(())),
                Err((pid, e)) => (pid, Err(e)),
            })
            .map_err(|e| format!("cannot prepare the child: {e}"))?;
        result.map_err(|e| format!("cannot run `{}`: {e}", self.path.display()))?;
        Ok(slot)
    }

    /// The spawn plan of this command (in the image root, if there is one); it refers to the
    /// image's namespace fd, so it must be spawned while `self` lives. Fails with the boot
    /// error when the node's disks or network could not be set up.
    pub(crate) fn plan(
        &self,
        stdio: [RawFd; 3],
        controlling_tty: bool,
    ) -> Result<SpawnPlan, String> {
        let mntns = match &self.root {
            ExecRoot::System => None,
            ExecRoot::Image(image) => Some(image.namespace_fd()),
            ExecRoot::Broken(why) => return Err(why.to_string()),
        };
        let mut plan = SpawnPlan::new(&self.path, &self.argv, &self.env, Some(&self.cwd), stdio)
            .map_err(|_| "string contains a NUL byte".to_string())?;
        plan.credentials(self.creds)
            .controlling_tty(controlling_tty)
            .mount_namespace(mntns);
        for &(res, v) in &self.rlimits {
            plan.rlimit(res, v);
        }
        Ok(plan)
    }
}

/// Creates a pipe; both ends close-on-exec. Returns (read, write).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Stdin for an exec: bytes from the request, then optionally streamed chunks.
pub enum StdinSource {
    /// Only the request's bytes, then EOF.
    Fixed(Vec<u8>),
    /// The request's bytes, then chunks from the channel until an empty `None`/closed.
    Stream(Vec<u8>, Receiver<StdinChunk>),
}

/// A piece of streamed stdin.
pub struct StdinChunk {
    /// Bytes to write.
    pub data: Vec<u8>,
    /// Close stdin after these bytes.
    pub eof: bool,
}

/// Writes `src` to the child's stdin `w` until it ends (or the child stops reading).
pub(crate) fn feed_stdin(w: OwnedFd, src: StdinSource) {
    let mut f = std::fs::File::from(w);
    let (initial, rx) = match src {
        StdinSource::Fixed(b) => (b, None),
        StdinSource::Stream(b, rx) => (b, Some(rx)),
    };
    if !initial.is_empty() && f.write_all(&initial).is_err() {
        return; // EPIPE: the child stopped reading
    }
    drop(initial);
    if let Some(rx) = rx {
        while let Ok(chunk) = rx.recv() {
            if f.write_all(&chunk.data).is_err() || chunk.eof {
                return;
            }
        }
    }
}

/// The response to an exec whose program is outside the command allowlist: nothing ran,
/// exit code [`EXIT_NOT_ALLOWED`] (126), `error` names the program.
pub fn refused(id: RequestId, message: String) -> ExecResponse {
    ExecResponse {
        id,
        exit_code: Some(EXIT_NOT_ALLOWED),
        error: Some(message),
        ..Default::default()
    }
}

/// Runs one ExecRequest to completion, streaming output through `sink`.
///
/// `on_start` is called with the child's slot once it runs (for ExecSignal and for
/// killing it when the connection drops). Returns the final message (ExecResponse).
pub fn run(
    req: &ExecRequest,
    cmd: &Command,
    policy: &Policy,
    stdin: StdinSource,
    sink: &dyn Sink,
    on_start: impl FnOnce(&Arc<ExitSlot>),
) -> ExecResponse {
    let started = Instant::now();
    let mut resp = ExecResponse {
        id: req.id,
        ..Default::default()
    };
    let pipes = (|| Ok::<_, io::Error>((pipe()?, pipe()?, pipe()?)))();
    let ((in_r, in_w), (out_r, out_w), (err_r, err_w)) = match pipes {
        Ok(p) => p,
        Err(e) => {
            resp.error = Some(format!("cannot create pipes: {e}"));
            return resp;
        }
    };
    let slot = match cmd.spawn(
        [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
        false,
    ) {
        Ok(slot) => slot,
        Err(e) => {
            resp.error = Some(e);
            resp.exit_code = Some(127);
            resp.duration_ms = started.elapsed().as_millis() as u64;
            return resp;
        }
    };
    drop((in_r, out_w, err_w));
    let deadline = started + policy.timeout_for(req.timeout_secs.map(Duration::from_secs));
    crate::watchdog::arm(&slot, deadline);
    on_start(&slot);

    match stdin {
        StdinSource::Fixed(b) if b.is_empty() => drop(in_w),
        src => {
            let spawned = std::thread::Builder::new()
                .name("exec-stdin".into())
                .stack_size(64 * 1024)
                .spawn(move || feed_stdin(in_w, src));
            if let Err(e) = spawned {
                crate::log!("cannot start a stdin thread: {e}");
            }
        }
    }

    let mut out = OutputPump::new(req.id, policy.max_output_bytes);
    let (stdout_bytes, stderr_bytes) = pump(
        &slot,
        [(out_r, OutputStream::Stdout), (err_r, OutputStream::Stderr)],
        &mut |stream, data| out.emit(sink, &slot, stream, data),
    );
    let status = slot.wait();
    resp.stdout_bytes = stdout_bytes;
    resp.stderr_bytes = stderr_bytes;
    resp.output_truncated = out.truncated;
    resp.timed_out = slot.timed_out();
    match status {
        ExitStatus::Exited(c) => resp.exit_code = Some(c),
        ExitStatus::Signaled { signal, .. } => resp.signal = Some(signal),
    }
    resp.duration_ms = started.elapsed().as_millis() as u64;
    resp
}

/// Sends an exec's output chunks (of an exec, or of a held exec's attach): one sequence per
/// request, the output cap enforced.
pub(crate) struct OutputPump {
    id: voidbox_protocol::RequestId,
    seq: u64,
    cap: Option<u64>,
    sent: u64,
    /// Output beyond the cap was dropped.
    pub(crate) truncated: bool,
    broken: bool,
}

impl OutputPump {
    /// Output of request `id`, at most `cap` bytes.
    pub(crate) fn new(id: voidbox_protocol::RequestId, cap: Option<u64>) -> OutputPump {
        OutputPump {
            id,
            seq: 0,
            cap,
            sent: 0,
            truncated: false,
            broken: false,
        }
    }

    /// Sends `data` to `sink`, within the cap; when nobody listens any more, the program's
    /// process group (`slot`) is killed and later output dropped.
    pub(crate) fn emit(
        &mut self,
        sink: &dyn Sink,
        slot: &ExitSlot,
        stream: OutputStream,
        data: &[u8],
    ) {
        if self.broken {
            return;
        }
        let allowed = match self.cap {
            Some(cap) => {
                let room = cap.saturating_sub(self.sent);
                if (data.len() as u64) > room {
                    self.truncated = true;
                }
                usize::try_from(room).unwrap_or(usize::MAX).min(data.len())
            }
            None => data.len(),
        };
        if allowed == 0 {
            return;
        }
        let msg = Message::ExecOutputChunk(ExecOutputChunk {
            id: self.id,
            stream,
            seq: self.seq,
            data: data[..allowed].to_vec(),
        });
        if sink.send(&msg).is_err() {
            // Nobody is listening any more: stop the program instead of running blind.
            self.broken = true;
            slot.signal_group(libc::SIGKILL);
            return;
        }
        self.seq += 1;
        self.sent += allowed as u64;
    }
}

/// Reads both pipes until EOF (or until [`DRAIN_GRACE`] after the leader exited),
/// handing each piece read to `emit`. Returns the byte counts (stdout, stderr) produced.
pub(crate) fn pump(
    slot: &ExitSlot,
    streams: [(OwnedFd, OutputStream); 2],
    emit: &mut dyn FnMut(OutputStream, &[u8]),
) -> (u64, u64) {
    let mut open: Vec<Option<(OwnedFd, OutputStream)>> = streams.into_iter().map(Some).collect();
    let mut counts = [0u64; 2];
    let mut buf = vec![0u8; OUTPUT_CHUNK_SIZE];
    let mut exited_at: Option<Instant> = slot.try_get().map(|_| Instant::now());
    loop {
        if open.iter().all(Option::is_none) {
            break;
        }
        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(3);
        let mut which: Vec<usize> = Vec::with_capacity(3);
        for (i, s) in open.iter().enumerate() {
            if let Some((fd, _)) = s {
                pfds.push(libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                which.push(i);
            }
        }
        let timeout = match exited_at {
            None => {
                pfds.push(libc::pollfd {
                    fd: slot.event_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                -1
            }
            Some(t) => {
                let left = DRAIN_GRACE.saturating_sub(t.elapsed());
                if left.is_zero() {
                    break; // something outside the group still holds the pipe
                }
                left.as_millis().min(i32::MAX as u128) as i32 + 1
            }
        };
        // SAFETY: `pfds` is a valid array of pollfd of the given length.
        let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
        if rc < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if exited_at.is_none() && pfds.len() > which.len() && pfds[which.len()].revents != 0 {
            exited_at = Some(Instant::now());
        }
        for (k, &i) in which.iter().enumerate() {
            if pfds[k].revents == 0 {
                continue;
            }
            let Some((fd, stream)) = &open[i] else {
                continue;
            };
            let stream = *stream;
            // SAFETY: reads into `buf`, which is valid for `buf.len()` bytes.
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) {
                    continue;
                }
                open[i] = None;
            } else if n == 0 {
                open[i] = None;
            } else {
                let n = n as usize;
                counts[i] += n as u64;
                emit(stream, &buf[..n]);
            }
        }
    }
    (counts[0], counts[1])
}
