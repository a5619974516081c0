//! 8250 UART on port 0x3f8 (IRQ 4, via irqfd). Output goes to a per-VM console log file, capped
//! to its newest output ([`CONSOLE_LOG_KEEP`]..[`CONSOLE_LOG_MAX`] bytes), and an in-memory
//! tail used in error reports; never to the user's terminal.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;
use crate::exit::VmEvent;

pub mod persist;

/// COM1 port base.
pub const SERIAL_PORT_BASE: u64 = 0x3f8;
/// COM1 register window.
pub const SERIAL_PORT_LEN: u64 = 8;
/// COM1 IRQ.
pub const SERIAL_IRQ: u32 = 4;
/// Lines kept in the in-memory tail.
pub const TAIL_LINES: usize = 64;
const MAX_LINE: usize = 4096;
/// Bytes of the newest console output the log keeps when it is cut down (from a line start).
pub const CONSOLE_LOG_KEEP: usize = 1 << 20;
/// Size at which the console log is cut down to its last [`CONSOLE_LOG_KEEP`] bytes.
pub const CONSOLE_LOG_MAX: u64 = 2 * CONSOLE_LOG_KEEP as u64;

/// Interrupt trigger backed by an irqfd.
pub struct EventFdTrigger(pub EventFd);

impl Trigger for EventFdTrigger {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Replaces the value of every `voidbox.secret=` parameter with `<redacted>`.
pub fn redact_secrets(line: &str) -> String {
    const KEY: &str = "voidbox.secret=";
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(pos) = rest.find(KEY) {
        out.push_str(&rest[..pos + KEY.len()]);
        out.push_str("<redacted>");
        let after = &rest[pos + KEY.len()..];
        let end = after.find(char::is_whitespace).unwrap_or(after.len());
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Shared, lock-protected tail of the console (secrets redacted).
#[derive(Default)]
pub struct ConsoleTail {
    lines: VecDeque<String>,
    partial: String,
}

impl ConsoleTail {
    /// The last lines (including an unterminated last line).
    pub fn lines(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lines.iter().cloned().collect();
        if !self.partial.is_empty() {
            v.push(self.partial.clone());
        }
        v
    }

    fn push_line(&mut self, line: String) {
        if self.lines.len() == TAIL_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }
}

/// `Write` sink of the UART: console log file + tail + panic detection. Output is handled
/// line by line so that `voidbox.secret=` values never reach the file or the tail.
///
/// The file is written at explicit offsets (`pwrite`) and capped: when it reaches
/// [`CONSOLE_LOG_MAX`] bytes, the newest [`CONSOLE_LOG_KEEP`] bytes (from the first line start
/// in them, kept in memory) are written at offset 0 and the file is truncated after them.
/// Until the truncation the file ends with those same bytes, so whenever it is read its end
/// is the newest output, whole and in order.
pub struct ConsoleLog {
    file: Option<File>,
    /// Where the next byte goes in the file.
    pos: u64,
    /// The file's last bytes (at most `keep`).
    recent: VecDeque<u8>,
    keep: usize,
    max: u64,
    line: Vec<u8>,
    tail: Arc<Mutex<ConsoleTail>>,
    events: Option<Sender<VmEvent>>,
    panic_seen: bool,
}

impl ConsoleLog {
    /// A sink writing to `file` (if any), reporting panics on `events`.
    pub fn new(file: Option<File>, events: Option<Sender<VmEvent>>) -> Self {
        Self::with_cap(file, events, CONSOLE_LOG_KEEP, CONSOLE_LOG_MAX)
    }

    /// As [`ConsoleLog::new`], cutting the file down to its last `keep` bytes when it reaches
    /// `max` (`max >= 2 * keep`). `file` must be empty and not opened in append mode.
    fn with_cap(
        file: Option<File>,
        events: Option<Sender<VmEvent>>,
        keep: usize,
        max: u64,
    ) -> Self {
        debug_assert!(max >= 2 * keep as u64);
        Self {
            file,
            pos: 0,
            recent: VecDeque::new(),
            keep,
            max,
            line: Vec::with_capacity(256),
            tail: Arc::new(Mutex::new(ConsoleTail::default())),
            events,
            panic_seen: false,
        }
    }

    /// Handle to the tail, readable from other threads.
    pub fn tail(&self) -> Arc<Mutex<ConsoleTail>> {
        self.tail.clone()
    }

    fn write_file(&mut self, bytes: &[u8]) {
        let Some(f) = self.file.as_ref() else {
            return;
        };
        let written = f.write_all_at(bytes, self.pos).map(|()| {
            self.pos += bytes.len() as u64;
            self.recent.extend(bytes);
            let excess = self.recent.len().saturating_sub(self.keep);
            self.recent.drain(..excess);
        });
        let result = match written {
            Ok(()) if self.pos >= self.max => self.cut_down(),
            other => other,
        };
        if result.is_err() {
            // Disk full or similar: keep the VM running, keep the tail. The file stays open
            // (and its fd taken), it is just not written any more.
            self.file_failed();
        }
    }

    fn file_failed(&mut self) {
        self.max = u64::MAX;
        self.pos = u64::MAX;
        self.recent = VecDeque::new();
        if let Some(f) = self.file.take() {
            // Keep the descriptor open so that its number (allowed by seccomp for pwrite and
            // ftruncate) is never reused for another file.
            std::mem::forget(f);
        }
    }

    /// Rewrites the file as its last `keep` bytes, starting at a line start when there is
    /// one (see the type's docs for why the file's end stays intact throughout).
    fn cut_down(&mut self) -> io::Result<()> {
        let Some(f) = self.file.as_ref() else {
            return Ok(());
        };
        if let Some(nl) = self.recent.iter().position(|&b| b == b'\n') {
            if nl + 1 < self.recent.len() {
                self.recent.drain(..=nl);
            }
        }
        let (a, b) = self.recent.as_slices();
        f.write_all_at(a, 0)?;
        f.write_all_at(b, a.len() as u64)?;
        let len = self.recent.len() as u64;
        f.set_len(len)?;
        self.pos = len;
        Ok(())
    }

    fn end_line(&mut self, newline: bool) {
        let raw = String::from_utf8_lossy(&self.line).into_owned();
        self.line.clear();
        let text = redact_secrets(raw.trim_end_matches('\r'));
        let mut out = redact_secrets(&raw);
        if newline {
            out.push('\n');
        }
        self.write_file(out.as_bytes());
        if !self.panic_seen && text.contains("Kernel panic") {
            self.panic_seen = true;
            if let Some(ev) = &self.events {
                // Receiver gone means the VMM is exiting.
                let _ = ev.send(VmEvent::PanicSeen);
            }
        }
        let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        tail.partial.clear();
        tail.push_line(text);
    }

    fn flush_file(&mut self) {
        if !self.line.is_empty() {
            self.end_line(false);
        }
    }
}

impl Write for ConsoleLog {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        for &b in data {
            if b == b'\n' {
                self.end_line(true);
            } else {
                self.line.push(b);
                if self.line.len() >= MAX_LINE {
                    self.end_line(true);
                }
            }
        }
        if !self.line.is_empty() {
            let partial = redact_secrets(&String::from_utf8_lossy(&self.line));
            self.tail.lock().unwrap_or_else(|p| p.into_inner()).partial = partial;
        }
        Ok(data.len())
    }

    /// vm-superio flushes after every byte; lines are completed on '\n' instead, and the
    /// partial last line is written by [`SerialDevice::flush`] at exit.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The COM1 device on the PIO bus.
pub struct SerialDevice {
    serial: Serial<EventFdTrigger, vm_superio::serial::NoEvents, ConsoleLog>,
}

impl SerialDevice {
    /// A UART raising `irq_evt` and writing to `out`.
    pub fn new(irq_evt: EventFd, out: ConsoleLog) -> Self {
        Self {
            serial: Serial::new(EventFdTrigger(irq_evt), out),
        }
    }

    /// Flushes buffered console output to the log file.
    pub fn flush(&mut self) {
        self.serial.writer_mut().flush_file();
    }
}

impl BusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let (Ok(off), [first, ..]) = (u8::try_from(offset), data) {
            *first = self.serial.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Ok(off), [value, ..]) = (u8::try_from(offset), data) {
            if let Err(e) = self.serial.write(off, *value) {
                log::debug!("serial write failed: {e:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn output_goes_to_file_and_tail_and_panic_is_detected() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let log = ConsoleLog::new(Some(file.reopen().unwrap()), Some(tx));
        let tail = log.tail();
        let mut dev = SerialDevice::new(EventFd::new(libc::EFD_NONBLOCK).unwrap(), log);
        for b in b"hello\r\nKernel panic - not syncing: VFS\nrest" {
            dev.write(0, &[*b]);
        }
        dev.flush();
        let mut s = String::new();
        file.reopen().unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello\r\nKernel panic - not syncing: VFS\nrest");
        let lines = tail.lock().unwrap().lines();
        assert_eq!(
            lines,
            vec!["hello", "Kernel panic - not syncing: VFS", "rest"]
        );
        assert_eq!(rx.try_recv().unwrap(), VmEvent::PanicSeen);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn tail_is_bounded() {
        let mut log = ConsoleLog::new(None, None);
        for i in 0..200 {
            writeln!(log, "line {i}").unwrap();
        }
        let lines = log.tail().lock().unwrap().lines();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines.last().unwrap(), "line 199");
        let long = vec![b'x'; 10_000];
        log.write_all(&long).unwrap();
        let lines = log.tail().lock().unwrap().lines();
        assert!(lines.iter().all(|l| l.len() <= MAX_LINE));
    }

    /// Checks that `text` is consecutive `line N` lines ending with `last`; returns the first N.
    fn consecutive_lines(text: &str, last: usize) -> usize {
        let nums: Vec<usize> = text
            .lines()
            .map(|l| {
                l.strip_prefix("line ")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("not a whole line: {l:?}"))
            })
            .collect();
        for w in nums.windows(2) {
            assert_eq!(w[1], w[0] + 1, "out of order");
        }
        assert_eq!(*nums.last().unwrap(), last);
        nums[0]
    }

    #[test]
    fn console_log_keeps_only_the_newest_output() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut log = ConsoleLog::new(Some(file.reopen().unwrap()), None);
        let mut written = 0usize;
        let mut i = 0;
        let mut max_seen = 0u64;
        while written < 3 * CONSOLE_LOG_KEEP + 12345 {
            let l = format!("line {i}\n");
            log.write_all(l.as_bytes()).unwrap();
            written += l.len();
            i += 1;
            if i % 1000 == 0 {
                let len = file.as_file().metadata().unwrap().len();
                max_seen = max_seen.max(len);
                // Read while it is being written: the end is always the newest lines.
                let s = std::fs::read_to_string(file.path()).unwrap();
                let tail: String = s.lines().rev().take(500).collect::<Vec<_>>().join("\n");
                let tail: String = tail.lines().rev().collect::<Vec<_>>().join("\n");
                consecutive_lines(&tail, i - 1);
            }
        }
        log.write_all(b"partial").unwrap();
        log.flush_file();
        assert!(max_seen <= CONSOLE_LOG_MAX, "{max_seen}");
        let s = std::fs::read_to_string(file.path()).unwrap();
        let len = s.len() as u64;
        assert!(len <= CONSOLE_LOG_MAX, "{len}");
        assert!(len >= CONSOLE_LOG_KEEP as u64 - MAX_LINE as u64, "{len}");
        let body = s.strip_suffix("partial").unwrap();
        let first = consecutive_lines(body, i - 1);
        assert!(first > 0, "nothing was dropped");
    }

    #[test]
    fn console_log_cut_keeps_a_whole_tail_in_order() {
        // Small limits: every cut is visible.
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut log = ConsoleLog::with_cap(Some(file.reopen().unwrap()), None, 100, 200);
        for i in 0..1000 {
            writeln!(log, "line {i}").unwrap();
            let s = std::fs::read_to_string(file.path()).unwrap();
            assert!(s.len() <= 200 + MAX_LINE, "{}", s.len());
            consecutive_lines(&s, i);
        }
        // A line longer than the kept size: the newest bytes are kept as they are.
        log.write_all(&[b'y'; 500]).unwrap();
        log.write_all(b"\n").unwrap();
        let s = std::fs::read_to_string(file.path()).unwrap();
        assert!(s.len() <= 100, "{}", s.len());
        assert!(s.bytes().all(|b| b == b'y' || b == b'\n'), "{s}");
        assert!(s.ends_with("y\n"));
    }

    #[test]
    fn secrets_are_redacted() {
        assert_eq!(
            redact_secrets("Command line: a voidbox.secret=00ff b voidbox.secret=aa"),
            "Command line: a voidbox.secret=<redacted> b voidbox.secret=<redacted>"
        );
        assert_eq!(redact_secrets("nothing"), "nothing");
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut log = ConsoleLog::new(Some(file.reopen().unwrap()), None);
        log.write_all(b"cmd: voidbox.secret=deadbeef quiet\nvoidbox.secret=cafe")
            .unwrap();
        let tail = log.tail().lock().unwrap().lines();
        assert_eq!(
            tail,
            vec![
                "cmd: voidbox.secret=<redacted> quiet",
                "voidbox.secret=<redacted>"
            ]
        );
        log.flush_file();
        let mut s = String::new();
        file.reopen().unwrap().read_to_string(&mut s).unwrap();
        assert!(!s.contains("deadbeef") && !s.contains("cafe"), "{s}");
    }

    #[test]
    fn line_status_register_reads() {
        let log = ConsoleLog::new(None, None);
        let mut dev = SerialDevice::new(EventFd::new(libc::EFD_NONBLOCK).unwrap(), log);
        let mut d = [0u8; 1];
        dev.read(5, &mut d);
        // THR empty + transmitter empty.
        assert_eq!(d[0] & 0x60, 0x60);
        let mut big = [0u8; 1];
        dev.read(300, &mut big);
        assert_eq!(big[0], 0);
    }
}
