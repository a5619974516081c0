//! The config fd: its first line is the JSON [`crate::config::VmConfig`]; with
//! `snapshot_control`, each further line is a JSON control command, read by the control
//! thread and handed to the main thread as [`VmEvent::Control`].
//!
//! Commands (one JSON object per line):
//!
//! * `{"snapshot":{"dir":"/abs/dir"}}`: pause, write a snapshot into `dir`, resume.
//! * `{"snapshot":{"dir":"/abs/dir","base":"/abs/base"}}`: the same, as a layered snapshot
//!   (only the memory pages written since the VM was restored from the full snapshot in
//!   `base`; refused for a VM restored from anything else).
//!
//! A malformed or unknown command, or a line longer than [`MAX_CONTROL_LINE`], is rejected
//! (logged and reported as [`VmEvent::ControlRejected`]); the channel stays usable. EOF ends
//! the control thread quietly and the VM keeps running.

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::mpsc::Sender;

use serde::Deserialize;

use crate::exit::VmEvent;

/// Longest control line accepted (a snapshot path is at most 4 KiB).
pub const MAX_CONTROL_LINE: usize = 16 * 1024;
const READ_CHUNK: usize = 4096;

/// One line read from a [`LineReader`].
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line, without its `\n` (the last line may lack one).
    Text(Vec<u8>),
    /// A line longer than the limit; it was skipped up to its `\n`.
    TooLong,
    /// End of input.
    Eof,
}

/// Reads `\n`-terminated lines from a byte stream, holding at most the limit per line.
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    eof: bool,
}

impl<R: Read> LineReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            eof: false,
        }
    }

    fn fill(&mut self) -> io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            match self.inner.read(&mut chunk) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The next line of at most `max` bytes (without the `\n`).
    pub fn read_line(&mut self, max: usize) -> io::Result<Line> {
        let mut skipping = false;
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).take(pos).collect();
                return Ok(if skipping || line.len() > max {
                    Line::TooLong
                } else {
                    Line::Text(line)
                });
            }
            if self.buf.len() > max {
                // Keep memory bounded: drop what we have and skip to the next newline.
                skipping = true;
                self.buf.clear();
            }
            if !self.fill()? {
                if skipping || self.buf.len() > max {
                    self.buf.clear();
                    return Ok(Line::TooLong);
                }
                if self.buf.is_empty() {
                    return Ok(Line::Eof);
                }
                return Ok(Line::Text(std::mem::take(&mut self.buf)));
            }
        }
    }

    /// The wrapped reader.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// `{"snapshot":{"dir":…, "base":…}}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCommand {
    /// Absolute directory to write the snapshot into (created if missing).
    pub dir: PathBuf,
    /// Absolute directory of the full snapshot this VM was restored from: write a layered
    /// snapshot (a memory diff over it) instead of a full one.
    #[serde(default)]
    pub base: Option<PathBuf>,
}

/// A control command.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ControlCommand {
    /// Write a snapshot and resume.
    Snapshot(SnapshotCommand),
}

/// Parses one control line.
pub fn parse_command(line: &[u8]) -> Result<ControlCommand, String> {
    let cmd: ControlCommand =
        serde_json::from_slice(line).map_err(|e| format!("invalid control command: {e}"))?;
    match &cmd {
        ControlCommand::Snapshot(s) => {
            for (what, p) in [("dir", Some(&s.dir)), ("base", s.base.as_ref())] {
                let Some(p) = p else { continue };
                if !p.is_absolute() {
                    return Err(format!("snapshot {what} must be an absolute path"));
                }
                if p.as_os_str().len() > 4096 {
                    return Err(format!("snapshot {what} is too long"));
                }
                if p.as_os_str().as_encoded_bytes().contains(&0) {
                    return Err(format!("snapshot {what} contains a NUL byte"));
                }
            }
            if s.base.as_ref() == Some(&s.dir) {
                return Err("a layered snapshot cannot overwrite its base".into());
            }
        }
    }
    Ok(cmd)
}

/// Body of the control thread: forwards commands from `reader` to `events` until EOF (or a
/// read error, or the main thread is gone).
pub fn run<R: Read>(mut reader: LineReader<R>, events: Sender<VmEvent>) {
    loop {
        let ev = match reader.read_line(MAX_CONTROL_LINE) {
            Ok(Line::Eof) => return,
            Ok(Line::TooLong) => VmEvent::ControlRejected(format!(
                "control line longer than {MAX_CONTROL_LINE} bytes"
            )),
            Ok(Line::Text(t)) if t.iter().all(u8::is_ascii_whitespace) => continue,
            Ok(Line::Text(t)) => match parse_command(&t) {
                Ok(c) => VmEvent::Control(c),
                Err(e) => VmEvent::ControlRejected(e),
            },
            Err(e) => {
                log::warn!("control channel: read failed: {e}");
                return;
            }
        };
        if let VmEvent::ControlRejected(why) = &ev {
            log::warn!("control channel: {why}");
        }
        if events.send(ev).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    fn lines(input: &[u8], max: usize) -> Vec<Line> {
        let mut r = LineReader::new(input);
        let mut out = Vec::new();
        loop {
            let l = r.read_line(max).unwrap();
            if l == Line::Eof {
                return out;
            }
            out.push(l);
        }
    }

    fn text(s: &str) -> Line {
        Line::Text(s.as_bytes().to_vec())
    }

    #[test]
    fn line_reader_bounds_and_eof() {
        assert_eq!(lines(b"", 10), []);
        assert_eq!(lines(b"{}", 10), [text("{}")]);
        assert_eq!(lines(b"{}\n", 10), [text("{}")]);
        assert_eq!(lines(b"a\n\nb", 10), [text("a"), text(""), text("b")]);
        assert_eq!(lines(b"0123456789\n", 10), [text("0123456789")]);
        assert_eq!(lines(b"0123456789x\nok\n", 10), [Line::TooLong, text("ok")]);
        assert_eq!(lines(b"0123456789x", 10), [Line::TooLong]);
        // A line far beyond the read chunk is skipped without holding it.
        let mut big = vec![b'x'; 3 * READ_CHUNK + 17];
        big.extend_from_slice(b"\nafter\n");
        assert_eq!(lines(&big, 100), [Line::TooLong, text("after")]);
    }

    #[test]
    fn config_then_commands_share_one_reader() {
        let input = b"{\"kernel\":\"/k\"}\n{\"snapshot\":{\"dir\":\"/s\"}}\n";
        let mut r = LineReader::new(&input[..]);
        assert_eq!(r.read_line(1 << 20).unwrap(), text("{\"kernel\":\"/k\"}"));
        let (tx, rx) = channel();
        run(r, tx);
        let evs: Vec<VmEvent> = rx.try_iter().collect();
        assert_eq!(
            evs,
            [VmEvent::Control(ControlCommand::Snapshot(
                SnapshotCommand {
                    dir: "/s".into(),
                    base: None
                }
            ))]
        );
    }

    #[test]
    fn commands_parse_strictly() {
        assert_eq!(
            parse_command(br#"{"snapshot":{"dir":"/tmp/snap"}}"#),
            Ok(ControlCommand::Snapshot(SnapshotCommand {
                dir: "/tmp/snap".into(),
                base: None
            }))
        );
        assert_eq!(
            parse_command(br#"{"snapshot":{"dir":"/tmp/d","base":"/tmp/b"}}"#),
            Ok(ControlCommand::Snapshot(SnapshotCommand {
                dir: "/tmp/d".into(),
                base: Some("/tmp/b".into())
            }))
        );
        for bad in [
            &br#"{"snapshot":{"dir":"rel/dir"}}"#[..],
            br#"{"snapshot":{"dir":""}}"#,
            br#"{"snapshot":{"dir":"/a\u0000b"}}"#,
            br#"{"snapshot":{"dir":"/a","x":1}}"#,
            br#"{"snapshot":{"dir":"/a","base":"rel"}}"#,
            br#"{"snapshot":{"dir":"/a","base":"/a"}}"#,
            br#"{"snapshot":{"dir":"/a","base":"/b\u0000"}}"#,
            br#"{"snapshot":{"dir":"/a","base":7}}"#,
            br#"{"snapshot":{}}"#,
            br#"{"snapshot":"/a"}"#,
            br#"{"restore":{"dir":"/a"}}"#,
            br#"{"snapshot":{"dir":"/a"},"snapshot2":{}}"#,
            br#"[]"#,
            b"null",
            b"\xff\xfe",
            b"{",
        ] {
            assert!(
                parse_command(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn bad_lines_are_reported_and_the_channel_survives() {
        let mut input = b"garbage\n\n   \n{\"frobnicate\":1}\n".to_vec();
        input.extend(vec![b'{'; MAX_CONTROL_LINE + 1]);
        input.extend_from_slice(b"\n{\"snapshot\":{\"dir\":\"/ok\"}}");
        let (tx, rx) = channel();
        run(LineReader::new(&input[..]), tx);
        let evs: Vec<VmEvent> = rx.try_iter().collect();
        assert_eq!(evs.len(), 4, "{evs:?}");
        assert!(evs[..3]
            .iter()
            .all(|e| matches!(e, VmEvent::ControlRejected(_))));
        assert!(
            matches!(&evs[3], VmEvent::Control(ControlCommand::Snapshot(s)) if s.dir.as_os_str() == "/ok")
        );
    }
}
