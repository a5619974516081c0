//! 8250 UART on port 0x3f8 (IRQ 4, via irqfd). Output goes to a per-VM console log file and an
//! in-memory tail used in error reports; never to the user's terminal.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
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
pub struct ConsoleLog {
    file: Option<File>,
    line: Vec<u8>,
    tail: Arc<Mutex<ConsoleTail>>,
    events: Option<Sender<VmEvent>>,
    panic_seen: bool,
}

impl ConsoleLog {
    /// A sink writing to `file` (if any), reporting panics on `events`.
    pub fn new(file: Option<File>, events: Option<Sender<VmEvent>>) -> Self {
        Self {
            file,
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
        if let Some(f) = self.file.as_mut() {
            if f.write_all(bytes).is_err() {
                // Disk full or similar: keep the VM running, keep the tail.
                self.file = None;
            }
        }
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
