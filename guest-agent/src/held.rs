//! Held execs: processes that outlive the connection that started them.
//!
//! An `ExecRequest` with `hold` starts its program exactly like an exec (policy, identity,
//! image root, rlimits: [`crate::exec::Command`]) but with stdin kept open and no deadline,
//! and registers it in the agent's [`Table`] under a name. Nothing of it belongs to the
//! connection: closing that connection kills nothing. Its output goes to a swappable sink:
//! while held, into a buffer of at most [`HELD_BUFFER_BYTES`] (when full, the pump stops
//! reading the pipes and the program blocks on its writes: backpressure); once an
//! `ExecAttach` takes it over, the buffer is replayed as that request's output and later
//! output is streamed like an exec's. From the attach on it is an exec of the attaching
//! request: its deadline starts then, signals and stdin name that request, its
//! `ExecResponse` ends it, and the attaching connection's end kills it. A program that exits
//! while held keeps its status (and its buffered output) for the attach.
//!
//! The use: a snapshot taken while a program waits on its stdin, restored into clones that
//! each attach to their own copy on a new connection.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use voidbox_protocol::{
    valid_held_name, ErrorCode, ExecResponse, HeldInfo, Message, OutputStream, RequestId,
    HELD_BUFFER_BYTES, MAX_HELD, OUTPUT_CHUNK_SIZE,
};

use crate::exec::{self, ActiveGuard, Command, Sink, StdinChunk, StdinSource};
use crate::reaper::{ExitSlot, ExitStatus};

/// Queued stdin chunks of a held exec before the writer waits.
const STDIN_QUEUE: usize = 16;
/// Most `/proc` entries looked at for one [`HeldInfo`].
const MAX_PROC_ENTRIES: usize = 1 << 16;
/// Most threads of one process looked at for one [`HeldInfo`].
const MAX_TASKS: usize = 4096;

/// Why a hold was not done.
#[derive(Debug)]
pub enum HoldError {
    /// Answered with an `Error`.
    Refused(ErrorCode, String),
    /// The program could not be started: answered like an exec that could not start.
    NotStarted(ExecResponse),
}

/// The agent's held execs, by name.
#[derive(Clone, Default)]
pub struct Table {
    map: Arc<Mutex<HashMap<String, Arc<Held>>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Table {
    /// Starts `cmd` as the held exec `name`, its stdin fed `stdin` first. `guard` (its
    /// concurrency slot) is kept until it exits.
    pub fn hold(
        &self,
        name: &str,
        cmd: &Command,
        stdin: Vec<u8>,
        guard: ActiveGuard,
    ) -> Result<u32, HoldError> {
        if !valid_held_name(name) {
            return Err(HoldError::Refused(
                ErrorCode::InvalidRequest,
                format!("invalid held exec name {name:?}: 1 to 64 of [a-z0-9._-]"),
            ));
        }
        // Locked across the spawn: two holds of one name cannot both start.
        let mut map = lock(&self.map);
        if map.contains_key(name) {
            return Err(HoldError::Refused(
                ErrorCode::AlreadyExists,
                format!("a held exec named `{name}` exists already"),
            ));
        }
        if map.len() >= MAX_HELD {
            return Err(HoldError::Refused(
                ErrorCode::ResourceLimit,
                format!("too many held execs ({MAX_HELD})"),
            ));
        }
        let started = Instant::now();
        let not_started = |e: String| {
            HoldError::NotStarted(ExecResponse {
                exit_code: Some(127),
                error: Some(e),
                duration_ms: started.elapsed().as_millis() as u64,
                ..Default::default()
            })
        };
        let pipes = (|| Ok::<_, std::io::Error>((exec::pipe()?, exec::pipe()?, exec::pipe()?)))();
        let ((in_r, in_w), (out_r, out_w), (err_r, err_w)) =
            pipes.map_err(|e| not_started(format!("cannot create pipes: {e}")))?;
        let slot = cmd
            .spawn(
                [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
                false,
            )
            .map_err(not_started)?;
        drop((in_r, out_w, err_w));
        let (tx, rx) = sync_channel(STDIN_QUEUE);
        let held = Arc::new(Held {
            name: name.to_string(),
            slot: Arc::clone(&slot),
            stdin: Mutex::new(Some(tx)),
            claimed: AtomicBool::new(false),
            out: Mutex::new(OutState::default()),
            cv: Condvar::new(),
            buffered: AtomicU64::new(0),
            cpu_ms: AtomicU64::new(0),
        });
        let threads = spawn_thread("held-stdin", move || {
            exec::feed_stdin(in_w, StdinSource::Stream(stdin, rx))
        })
        .and_then(|()| {
            let (held, table) = (Arc::clone(&held), self.clone());
            spawn_thread("held", move || {
                let _guard = guard;
                held.run(&table, out_r, err_r)
            })
        });
        if let Err(e) = threads {
            slot.signal_group(libc::SIGKILL);
            return Err(HoldError::Refused(
                ErrorCode::ResourceLimit,
                format!("cannot start a thread: {e}"),
            ));
        }
        map.insert(name.to_string(), held);
        crate::debug!("holding `{name}` (pid {})", slot.pid());
        Ok(u32::try_from(slot.pid()).unwrap_or(0))
    }

    /// The held exec `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Held>> {
        lock(&self.map).get(name).cloned()
    }

    /// Forgets `held` (once its status went to an attached request).
    fn remove(&self, held: &Arc<Held>) {
        let mut map = lock(&self.map);
        if map.get(&held.name).is_some_and(|h| Arc::ptr_eq(h, held)) {
            map.remove(&held.name);
        }
    }

    /// Number of held execs (attached or not, exited or not).
    pub fn len(&self) -> usize {
        lock(&self.map).len()
    }

    /// Whether no exec is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .stack_size(256 * 1024)
        .spawn(f)
        .map(drop)
}

/// One held exec.
pub struct Held {
    name: String,
    slot: Arc<ExitSlot>,
    /// The stdin queue; taken (closing stdin) by an attach without `stdin_stream`.
    stdin: Mutex<Option<SyncSender<StdinChunk>>>,
    /// Set by the (only) attach.
    claimed: AtomicBool,
    out: Mutex<OutState>,
    /// Signalled when the buffer drains or an attachment arrives.
    cv: Condvar,
    buffered: AtomicU64,
    /// The highest CPU time reported so far (so it never decreases).
    cpu_ms: AtomicU64,
}

/// Where the output goes, and what is kept for the attach.
#[derive(Default)]
struct OutState {
    buf: VecDeque<(OutputStream, Vec<u8>)>,
    buffered: usize,
    attached: Option<Attachment>,
    /// Set when the program ended while held.
    ended: Option<Ended>,
}

struct Ended {
    status: ExitStatus,
    stdout_bytes: u64,
    stderr_bytes: u64,
}

/// The request that took a held exec over.
pub struct Attachment {
    id: RequestId,
    sink: Arc<dyn Sink>,
    out: crate::exec::OutputPump,
    since: Instant,
    /// Run once the process ended, before its `ExecResponse` is sent.
    on_done: Option<Box<dyn FnOnce() + Send>>,
}

impl Attachment {
    /// An attachment of request `id` on a connection writing to `sink`, output capped at
    /// `cap` bytes from the attach on; `on_done` runs when the exec ends.
    pub fn new(
        id: RequestId,
        sink: Arc<dyn Sink>,
        cap: Option<u64>,
        on_done: Box<dyn FnOnce() + Send>,
    ) -> Attachment {
        Attachment {
            id,
            sink,
            out: crate::exec::OutputPump::new(id, cap),
            since: Instant::now(),
            on_done: Some(on_done),
        }
    }

    fn emit(&mut self, stream: OutputStream, data: &[u8], slot: &ExitSlot) {
        self.out.emit(&*self.sink, slot, stream, data);
    }

    /// Sends the final `ExecResponse` (after `on_done`).
    fn finish(mut self, ended: Ended, timed_out: bool) {
        if let Some(f) = self.on_done.take() {
            f();
        }
        let mut resp = ExecResponse {
            id: self.id,
            timed_out,
            duration_ms: self.since.elapsed().as_millis() as u64,
            stdout_bytes: ended.stdout_bytes,
            stderr_bytes: ended.stderr_bytes,
            output_truncated: self.out.truncated,
            ..Default::default()
        };
        match ended.status {
            ExitStatus::Exited(c) => resp.exit_code = Some(c),
            ExitStatus::Signaled { signal, .. } => resp.signal = Some(signal),
        }
        let _ = self.sink.send(&Message::ExecResponse(resp));
    }
}

impl Held {
    /// The process (and process group) of the held exec.
    pub fn slot(&self) -> &Arc<ExitSlot> {
        &self.slot
    }

    /// Claims the held exec for an attach; `false` when one has it already.
    pub fn claim(&self) -> bool {
        !self.claimed.swap(true, Ordering::AcqRel)
    }

    /// Gives a claim back (the attach could not go ahead).
    pub fn unclaim(&self) {
        self.claimed.store(false, Ordering::Release);
    }

    /// Queues the attach's `stdin` for the process (closing stdin after it unless
    /// `stream`); with `stream`, returns the queue for later `ExecStdin`s. Only the attach
    /// writes to the queue, which is empty until then, so this never waits.
    pub fn attach_stdin(&self, data: Vec<u8>, stream: bool) -> Option<SyncSender<StdinChunk>> {
        let mut q = lock(&self.stdin);
        let tx = if stream { q.clone() } else { q.take() }?;
        if !data.is_empty() || !stream {
            // A process that is gone has dropped its end: nothing to deliver.
            let _ = tx.try_send(StdinChunk { data, eof: !stream });
        }
        stream.then_some(tx)
    }

    /// Makes `a` the held exec's output: replays the buffer into it, arms the deadline,
    /// and answers at once (with the kept status) if the program ended while held.
    pub fn attach(self: &Arc<Self>, table: &Table, mut a: Attachment, deadline: Instant) {
        let mut st = lock(&self.out);
        let buf = std::mem::take(&mut st.buf);
        st.buffered = 0;
        self.buffered.store(0, Ordering::Release);
        for (stream, data) in buf {
            a.emit(stream, &data, &self.slot);
        }
        crate::watchdog::arm(&self.slot, deadline);
        match st.ended.take() {
            Some(ended) => {
                drop(st);
                // The name is free before the response says the exec ended.
                table.remove(self);
                a.finish(ended, self.slot.timed_out());
            }
            None => st.attached = Some(a),
        }
        self.cv.notify_all();
    }

    /// Output of the program: to the attachment, or into the buffer, waiting while it is
    /// full (the pipes are not read meanwhile).
    fn emit(&self, stream: OutputStream, mut data: &[u8]) {
        let mut st = lock(&self.out);
        loop {
            if let Some(a) = st.attached.as_mut() {
                a.emit(stream, data, &self.slot);
                return;
            }
            let room = HELD_BUFFER_BYTES.saturating_sub(st.buffered);
            if room > 0 {
                let n = room.min(data.len());
                let (now, rest) = data.split_at(n);
                match st.buf.back_mut() {
                    Some((s, b)) if *s == stream && b.len() + n <= OUTPUT_CHUNK_SIZE => {
                        b.extend_from_slice(now)
                    }
                    _ => st.buf.push_back((stream, now.to_vec())),
                }
                st.buffered += n;
                self.buffered.store(st.buffered as u64, Ordering::Release);
                data = rest;
                if data.is_empty() {
                    return;
                }
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The held exec's life after the spawn: its output until the pipes close, then its
    /// status to the attached request or kept for the attach.
    fn run(self: Arc<Self>, table: &Table, out_r: OwnedFd, err_r: OwnedFd) {
        let (stdout_bytes, stderr_bytes) = exec::pump(
            &self.slot,
            [(out_r, OutputStream::Stdout), (err_r, OutputStream::Stderr)],
            &mut |stream, data| self.emit(stream, data),
        );
        let status = self.slot.wait();
        let ended = Ended {
            status,
            stdout_bytes,
            stderr_bytes,
        };
        crate::debug!("held exec `{}` ended: {status:?}", self.name);
        let mut st = lock(&self.out);
        match st.attached.take() {
            Some(a) => {
                drop(st);
                // The name is free before the response says the exec ended.
                table.remove(&self);
                a.finish(ended, self.slot.timed_out());
            }
            None => st.ended = Some(ended),
        }
        // The stdin writer ends once nobody can queue more.
        lock(&self.stdin).take();
    }

    /// The state of the held exec for a `HeldQuery` `id`.
    pub fn info(&self, id: RequestId) -> HeldInfo {
        let pid = self.slot.pid();
        let exited = self.slot.try_get().is_some();
        // Once the leader is reaped its id may name another group: nothing is counted.
        let (cpu_ms, running_threads) = if exited || pid <= 0 {
            (0, 0)
        } else {
            group_usage(pid)
        };
        let cpu_ms = self.cpu_ms.fetch_max(cpu_ms, Ordering::AcqRel).max(cpu_ms);
        HeldInfo {
            id,
            pid: u32::try_from(pid).unwrap_or(0),
            cpu_ms,
            running_threads,
            exited,
            buffered_bytes: self.buffered.load(Ordering::Acquire),
        }
    }
}

/// CPU time (ms; user + system, own and reaped children's) and running threads of the
/// processes of process group `pgid`, from `/proc`.
fn group_usage(pgid: libc::pid_t) -> (u64, u32) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return (0, 0);
    };
    let mut ticks = 0u64;
    let mut running = 0u32;
    for entry in dir.take(MAX_PROC_ENTRIES).flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Some(stat) = read_stat(&format!("/proc/{pid}/stat")) else {
            continue;
        };
        if stat.pgrp != i64::from(pgid) {
            continue;
        }
        ticks = ticks.saturating_add(stat.ticks);
        running = running.saturating_add(running_tasks(pid));
    }
    let hz = clock_ticks_per_sec();
    (ticks.saturating_mul(1000) / hz, running)
}

/// Threads of process `pid` in state `R` or `D`.
fn running_tasks(pid: u32) -> u32 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    let mut n = 0u32;
    for entry in dir.take(MAX_TASKS).flatten() {
        let path = entry.path().join("stat");
        if let Some(s) = path.to_str().and_then(read_stat) {
            // Runnable, or in uninterruptible sleep (reading a disk, a page fault on a
            // file): not waiting for its input.
            if s.state == 'R' || s.state == 'D' {
                n = n.saturating_add(1);
            }
        }
    }
    n
}

/// The fields of a `/proc/…/stat` line used here.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    state: char,
    pgrp: i64,
    /// utime + stime + cutime + cstime, in clock ticks.
    ticks: u64,
}

fn read_stat(path: &str) -> Option<Stat> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(512);
    std::fs::File::open(path)
        .ok()?
        .take(4096)
        .read_to_end(&mut buf)
        .ok()?;
    parse_stat(&String::from_utf8_lossy(&buf))
}

/// Parses a `/proc/…/stat` line; `None` when it is not one. The command name (field 2)
/// may hold anything, spaces and parentheses included: the fields start after its last `)`.
fn parse_stat(s: &str) -> Option<Stat> {
    let (_, rest) = s.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().take(15).collect();
    let state = f.first()?.chars().next()?;
    let pgrp = f.get(2)?.parse().ok()?;
    let mut ticks = 0u64;
    // utime, stime, cutime, cstime: fields 14..=17 of the line.
    for i in 11..15 {
        let v: i64 = f.get(i)?.parse().ok()?;
        ticks = ticks.saturating_add(u64::try_from(v).unwrap_or(0));
    }
    Some(Stat { state, pgrp, ticks })
}

fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines_and_refuses_odd_ones() {
        let line = "42 (a) b) c) R 1 42 42 0 -1 4194560 100 0 0 0 250 30 7 3 20 0 1 0 5 0 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'R',
                pgrp: 42,
                ticks: 290
            })
        );
        for bad in [
            "",
            "42 (x",
            "42 (x) S",
            "42 (x) S 1 notanumber 1 0 -1 0 0 0 0 0 1 1 0 0",
            "42 (x) S 1 42 1 0 -1 0 0 0 0 0 1",
            "\u{0}\u{ff})",
        ] {
            assert_eq!(parse_stat(bad), None, "{bad:?}");
        }
        // Negative or huge tick counts do not overflow.
        let odd = "1 (x) S 1 1 1 0 -1 0 0 0 0 0 -5 9223372036854775807 9223372036854775807 9223372036854775807";
        assert_eq!(parse_stat(odd).map(|s| s.ticks), Some(u64::MAX));
        let huge = "1 (x) S 1 1 1 0 -1 0 0 0 0 0 1 18446744073709551616 1 1";
        assert_eq!(parse_stat(huge), None);
    }

    #[test]
    fn own_process_group_is_counted() {
        // SAFETY: getpgrp has no preconditions.
        let pgid = unsafe { libc::getpgrp() };
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(100) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let (cpu, running) = group_usage(pgid);
        assert!(cpu >= 50, "cpu {cpu} ms after a 100 ms spin ({x})");
        assert!(running >= 1, "this thread runs");
    }
}
