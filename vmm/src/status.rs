//! Machine-readable progress: one JSON object per line on stdout (or a status fd).

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

use serde_json::Value;

/// Writes JSON status lines; write errors are ignored (the engine may have gone away).
pub struct StatusWriter {
    out: Mutex<File>,
}

impl StatusWriter {
    /// Writes to `out`.
    pub fn new(out: File) -> Self {
        Self {
            out: Mutex::new(out),
        }
    }

    /// Emits `value` as one line.
    pub fn emit(&self, value: &Value) {
        let mut line = value.to_string();
        line.push('\n');
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = out.write_all(line.as_bytes());
    }
}
