//! The host terminal of `voidbox shell`: raw mode for the session, restored on every exit
//! path (the guard's `Drop`, a panic hook, and [`restore`] for the signal and error paths),
//! and the window size.

use std::sync::{Mutex, Once};

use rustix::termios::{self, OptionalActions, Termios};

/// Rows × columns used when stdin is not a terminal (or reports no size).
pub const DEFAULT_SIZE: (u16, u16) = (24, 80);

/// The settings raw mode replaced, while it is in force.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);
static PANIC_HOOK: Once = Once::new();

/// Whether stdin is a terminal.
pub fn stdin_is_tty() -> bool {
    termios::isatty(std::io::stdin())
}

/// The terminal's size as (rows, columns): stdin's, else stdout's, else [`DEFAULT_SIZE`].
pub fn size() -> (u16, u16) {
    let of = |w: rustix::io::Result<termios::Winsize>| {
        w.ok()
            .map(|w| (w.ws_row, w.ws_col))
            .filter(|&(r, c)| r > 0 && c > 0)
    };
    of(termios::tcgetwinsize(std::io::stdin()))
        .or_else(|| of(termios::tcgetwinsize(std::io::stdout())))
        .unwrap_or(DEFAULT_SIZE)
}

/// Raw mode on stdin while alive: every byte (Ctrl-C, Ctrl-Z, Ctrl-D…) goes to the guest
/// unprocessed and unechoed. Dropping it restores the saved settings.
pub struct RawMode(());

impl RawMode {
    /// Puts stdin in raw mode; `Ok(None)` when stdin is not a terminal. Installs (once) a
    /// panic hook that restores the terminal before the panic message is printed.
    pub fn enter() -> std::io::Result<Option<RawMode>> {
        let stdin = std::io::stdin();
        if !termios::isatty(&stdin) {
            return Ok(None);
        }
        let saved = termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        *lock() = Some(saved);
        PANIC_HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        if let Err(e) = termios::tcsetattr(&stdin, OptionalActions::Now, &raw) {
            lock().take();
            return Err(e.into());
        }
        Ok(Some(RawMode(())))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore();
    }
}

/// Restores the settings raw mode replaced (once; later calls do nothing). Safe to call
/// from any thread and from a panic hook.
pub fn restore() {
    if let Some(saved) = lock().take() {
        // On a hung-up terminal this fails, which is fine.
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &saved);
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<Termios>> {
    SAVED.lock().unwrap_or_else(|p| p.into_inner())
}
