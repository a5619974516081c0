//! One interactive session: host stdin → guest terminal, guest terminal → host stdout,
//! SIGWINCH → resize, SIGINT / SIGTERM / SIGHUP → hang-up.
//!
//! Stdin is read on its own thread (in raw mode every byte is forwarded as it comes; when
//! stdin is not a terminal, its end is sent as Ctrl-D, the guest terminal's end of file).
//! Signals are taken by a small tokio runtime on a second thread, registered before the
//! terminal goes raw so none can kill the process with the terminal left raw. A stopping
//! signal hangs the session up (the guest sends SIGHUP to its processes); if the session
//! has not ended [`HANG_UP_GRACE`] later, or on a second signal, the connection is shut
//! down.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use voidbox_protocol::{ErrorCode, ExecResponse, PtyOpen};

use super::terminal;
use crate::sandbox::guest::{PtyEvent, PtyInput};
use crate::sandbox::{Sandbox, SandboxError};

/// Bytes read from stdin at once (one `PtyData` frame each).
const STDIN_CHUNK: usize = 32 * 1024;
/// How long a hung-up session may take to end before the connection is shut down.
pub const HANG_UP_GRACE: Duration = Duration::from_secs(3);
/// End of file on the guest terminal (VEOF, Ctrl-D).
const EOF_BYTE: u8 = 0x04;

/// How a session ended.
pub struct SessionEnd {
    /// The guest's final status, or why the session broke.
    pub result: Result<ExecResponse, SandboxError>,
    /// The stopping signal that ended it, if one did.
    pub signal: Option<i32>,
}

/// The signals a session handles, registered up front.
pub struct Signals {
    rt: tokio::runtime::Runtime,
    winch: Signal,
    stops: [(i32, Signal); 3],
}

impl Signals {
    /// Registers SIGWINCH, SIGINT, SIGTERM and SIGHUP (from here on they no longer end
    /// the process by themselves).
    pub fn register() -> std::io::Result<Signals> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let entered = rt.enter();
        let winch = signal(SignalKind::window_change())?;
        let stops = [
            (libc::SIGINT, signal(SignalKind::interrupt())?),
            (libc::SIGTERM, signal(SignalKind::terminate())?),
            (libc::SIGHUP, signal(SignalKind::hangup())?),
        ];
        drop(entered);
        Ok(Signals { rt, winch, stops })
    }
}

/// Runs `open` on `sb` until it ends; `tty`: stdin is a terminal (in raw mode).
pub fn run(sb: &mut Sandbox, open: PtyOpen, tty: bool, signals: Signals) -> SessionEnd {
    let stopped = Arc::new(AtomicI32::new(0));
    let opened = (open.rows, open.cols);
    let mut signals = Some(signals);
    let mut on_open = |input: PtyInput| {
        if tty && terminal::size() != opened {
            let (rows, cols) = terminal::size();
            let _ = input.resize(rows, cols);
        }
        spawn_stdin(input.clone(), tty);
        if let Some(s) = signals.take() {
            spawn_signals(s, input, tty, Arc::clone(&stopped));
        }
    };
    let mut out = std::io::stdout().lock();
    let mut out_ok = true;
    let mut warned = false;
    let mut on_event = |e: PtyEvent<'_>| match e {
        PtyEvent::Output(data) => {
            if out_ok {
                out_ok = out.write_all(data).and_then(|()| out.flush()).is_ok();
            }
        }
        PtyEvent::Refused { code, message } => {
            // Input dropped by a full guest queue is worth one notice; the rest (a resize
            // or input racing the session's end) is not.
            if code == ErrorCode::ResourceLimit && !warned {
                warned = true;
                let _ = write!(out, "\r\nvoidbox: the guest dropped input: {message}\r\n");
            }
        }
    };
    let result = sb.pty(open, &mut on_open, &mut on_event);
    let sig = stopped.load(Ordering::Acquire);
    SessionEnd {
        result,
        signal: (sig != 0).then_some(sig),
    }
}

/// Forwards stdin to the guest until it ends or the session does. The thread is left
/// blocked in `read` when the session ends first; the process exits soon after.
fn spawn_stdin(input: PtyInput, tty: bool) {
    let pump = move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; STDIN_CHUNK];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => {
                    // A terminal that ends has hung up; a pipe or file has no more input.
                    let _ = if tty {
                        input.close()
                    } else {
                        input.data(&[EOF_BYTE])
                    };
                    return;
                }
                Ok(n) => {
                    if input.data(&buf[..n]).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    let _ = input.close();
                    return;
                }
            }
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("shell-stdin".into())
        .spawn(pump)
    {
        eprint!("\r\nvoidbox: cannot read stdin: {e}\r\n");
    }
}

/// Handles the registered signals for the rest of the process's life.
fn spawn_signals(s: Signals, input: PtyInput, tty: bool, stopped: Arc<AtomicI32>) {
    let Signals {
        rt,
        mut winch,
        stops,
    } = s;
    let task = move || {
        rt.block_on(async move {
            let [(a, mut sa), (b, mut sb), (c, mut sc)] = stops;
            let hung_up = Arc::new(AtomicBool::new(false));
            loop {
                let sig = tokio::select! {
                    _ = winch.recv() => {
                        if tty {
                            let (rows, cols) = terminal::size();
                            let _ = input.resize(rows, cols);
                        }
                        continue;
                    }
                    _ = sa.recv() => a,
                    _ = sb.recv() => b,
                    _ = sc.recv() => c,
                };
                if stopped
                    .compare_exchange(0, sig, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    // First stopping signal: hang up, then give the guest a moment.
                    let _ = input.close();
                    let (input, hung_up) = (input.clone(), Arc::clone(&hung_up));
                    tokio::spawn(async move {
                        tokio::time::sleep(HANG_UP_GRACE).await;
                        hung_up.store(true, Ordering::Release);
                        input.hang_up();
                    });
                } else if !hung_up.swap(true, Ordering::AcqRel) {
                    input.hang_up();
                }
            }
        })
    };
    if let Err(e) = std::thread::Builder::new()
        .name("shell-signals".into())
        .spawn(task)
    {
        eprint!("\r\nvoidbox: cannot watch signals: {e}\r\n");
    }
}
