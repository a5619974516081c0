//! Interactive sessions on a pseudo-terminal (PtyOpen / PtyData / PtyResize / PtyClose).
//!
//! The master side stays in the agent; the child gets the slave as stdin/stdout/stderr
//! and as the controlling terminal of its new session. Terminal output flows to the host
//! as `PtyData` (≤ 64 KiB each), input is written by a per-session thread so a child that
//! does not read its terminal cannot stall the connection. The session ends with an
//! `ExecResponse`. PtyClose sends SIGHUP to the session's process group and SIGKILL one
//! second later if it is still there.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use voidbox_protocol::{ExecResponse, Message, PtyData, RequestId, OUTPUT_CHUNK_SIZE};

use crate::exec::{Command, Sink, DRAIN_GRACE};
use crate::reaper::{ExitSlot, ExitStatus};
use crate::spawn::Credentials;

/// Queued input chunks per session before PtyData input is refused.
const INPUT_QUEUE: usize = 64;

/// A master/slave pseudo-terminal pair.
pub struct Pty {
    /// Master side (agent).
    pub master: OwnedFd,
    /// Slave side (child).
    pub slave: OwnedFd,
}

/// Opens a new pty with the given size; the slave is handed to `owner` if set.
pub fn open(rows: u16, cols: u16, owner: Option<Credentials>) -> io::Result<Pty> {
    // SAFETY: plain open of the ptmx multiplexer.
    let m = unsafe {
        libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if m < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: freshly opened fd owned by nothing else.
    let master = unsafe { OwnedFd::from_raw_fd(m) };
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK takes a pointer to an int; `unlock` lives across the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: TIOCGPTPEER returns a new fd for the slave without a path lookup.
    let s = unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: freshly returned fd owned by nothing else.
    let slave = unsafe { OwnedFd::from_raw_fd(s) };
    if let Some(c) = owner {
        // SAFETY: fchown on an fd we own; failure (non-root host) is harmless.
        unsafe { libc::fchown(slave.as_raw_fd(), c.uid, c.gid) };
    }
    resize(&master, rows, cols)?;
    Ok(Pty { master, slave })
}

/// Sets the terminal size (the kernel sends SIGWINCH to the foreground group).
pub fn resize(master: &OwnedFd, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows.max(1),
        ws_col: cols.max(1),
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize struct that lives across the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Handle for routing host messages to a running session.
#[derive(Clone)]
pub struct PtyHandle {
    master: Arc<OwnedFd>,
    input: SyncSender<Vec<u8>>,
    slot: Arc<ExitSlot>,
}

impl PtyHandle {
    /// Queues terminal input. Fails when the session is gone or its input queue is full.
    pub fn input(&self, data: Vec<u8>) -> Result<(), String> {
        self.input.try_send(data).map_err(|e| match e {
            TrySendError::Full(_) => "terminal input queue is full".to_string(),
            TrySendError::Disconnected(_) => "session has ended".to_string(),
        })
    }

    /// Changes the terminal size.
    pub fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        resize(&self.master, rows, cols)
    }

    /// Hangs up: SIGHUP now, SIGKILL in one second.
    pub fn close(&self) {
        self.slot.signal_group(libc::SIGHUP);
        crate::watchdog::kill_at(&self.slot, Instant::now() + Duration::from_secs(1));
    }

    /// The session's exit slot (for ExecSignal).
    pub fn slot(&self) -> &Arc<ExitSlot> {
        &self.slot
    }
}

/// A started session; [`Session::run`] pumps its output until it ends.
pub struct Session {
    id: RequestId,
    master: Arc<OwnedFd>,
    slot: Arc<ExitSlot>,
    started: Instant,
}

/// Starts `cmd` on a new pty. Returns the session (to run on its own thread) and the
/// handle for input/resize/close.
pub fn start(
    id: RequestId,
    cmd: &Command,
    rows: u16,
    cols: u16,
    owner: Option<Credentials>,
    timeout: Duration,
) -> Result<(Session, PtyHandle), String> {
    let started = Instant::now();
    let pty = open(rows, cols, owner).map_err(|e| format!("cannot open a pty: {e}"))?;
    let fd = pty.slave.as_raw_fd();
    let slot = cmd.spawn([fd, fd, fd], true)?;
    drop(pty.slave);
    crate::watchdog::arm(&slot, started + timeout);
    let master = Arc::new(pty.master);
    let (tx, rx) = sync_channel::<Vec<u8>>(INPUT_QUEUE);
    let writer_master = Arc::clone(&master);
    let spawned = std::thread::Builder::new()
        .name("pty-input".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            // Borrow the master fd as a File without taking ownership.
            let mut f = std::mem::ManuallyDrop::new(
                // SAFETY: the fd stays open while `writer_master` (an Arc) is alive.
                unsafe { std::fs::File::from_raw_fd(writer_master.as_raw_fd()) },
            );
            while let Ok(data) = rx.recv() {
                if f.write_all(&data).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = spawned {
        slot.signal_group(libc::SIGKILL);
        return Err(format!("cannot start the pty input thread: {e}"));
    }
    let handle = PtyHandle {
        master: Arc::clone(&master),
        input: tx,
        slot: Arc::clone(&slot),
    };
    Ok((
        Session {
            id,
            master,
            slot,
            started,
        },
        handle,
    ))
}

impl Session {
    /// Streams terminal output until the session ends; returns the final ExecResponse.
    pub fn run(self, sink: &dyn Sink) -> ExecResponse {
        let mut buf = vec![0u8; OUTPUT_CHUNK_SIZE];
        let mut exited_at: Option<Instant> = None;
        let mut broken = false;
        let mut out_bytes = 0u64;
        loop {
            let mut pfds = [
                libc::pollfd {
                    fd: self.master.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.slot.event_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let (n, timeout) = match exited_at {
                None => (2, -1),
                Some(t) => {
                    let left = DRAIN_GRACE.saturating_sub(t.elapsed());
                    if left.is_zero() {
                        break;
                    }
                    (1, left.as_millis().min(i32::MAX as u128) as i32 + 1)
                }
            };
            // SAFETY: `pfds` holds at least `n` valid pollfd entries.
            let rc = unsafe { libc::poll(pfds.as_mut_ptr(), n, timeout) };
            if rc < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            if n == 2 && pfds[1].revents != 0 {
                exited_at = Some(Instant::now());
            }
            if pfds[0].revents != 0 {
                // SAFETY: reads into `buf`, valid for its length.
                let r = unsafe {
                    libc::read(self.master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
                };
                if r <= 0 {
                    // EIO: every slave fd is closed (the session is over).
                    if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    break;
                }
                out_bytes += r as u64;
                if !broken {
                    let msg = Message::PtyData(PtyData {
                        id: self.id,
                        data: buf[..r as usize].to_vec(),
                    });
                    if sink.send(&msg).is_err() {
                        broken = true;
                        self.slot.signal_group(libc::SIGKILL);
                    }
                }
            }
        }
        let status = self.slot.wait();
        let mut resp = ExecResponse {
            id: self.id,
            timed_out: self.slot.timed_out(),
            stdout_bytes: out_bytes,
            duration_ms: self.started.elapsed().as_millis() as u64,
            ..Default::default()
        };
        match status {
            ExitStatus::Exited(c) => resp.exit_code = Some(c),
            ExitStatus::Signaled { signal, .. } => resp.signal = Some(signal),
        }
        resp
    }
}
