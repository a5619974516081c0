//! Machine-readable progress: one JSON object per line on stdout (or a status fd).

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;

/// Writes JSON status lines; write errors are ignored (the engine may have gone away).
/// Clones write to the same file, one whole line at a time (the net thread reports its
/// denial counts through a clone).
#[derive(Clone)]
pub struct StatusWriter {
    out: Arc<Mutex<File>>,
}

impl StatusWriter {
    /// Writes to `out`.
    pub fn new(out: File) -> Self {
        Self {
            out: Arc::new(Mutex::new(out)),
        }
    }

    /// Emits `value` as one line.
    pub fn emit(&self, value: &Value) {
        self.write_line(value.to_string());
    }

    /// Emits any serializable `value` as one line, without building a [`Value`] (whose maps
    /// seed std's hasher with `getrandom` on first use in a thread: the net thread's seccomp
    /// filter does not allow it). A value that cannot be serialized is dropped.
    pub fn emit_serialized<T: Serialize>(&self, value: &T) {
        match serde_json::to_string(value) {
            Ok(line) => self.write_line(line),
            Err(e) => log::warn!("status line not serializable: {e}"),
        }
    }

    fn write_line(&self, mut line: String) {
        line.push('\n');
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = out.write_all(line.as_bytes());
    }
}
