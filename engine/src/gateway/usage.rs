//! Token usage read from upstream responses as they stream through the gateway, without
//! holding the body: SSE is split into lines in a bounded buffer and only events mentioning
//! `"usage"` are parsed; a JSON body is kept up to [`MAX_JSON`] bytes and parsed at its end.
//!
//! Shapes: Anthropic `message_start.message.usage` (`input_tokens`,
//! `cache_read_input_tokens`, `cache_creation_input_tokens`) and `message_delta.usage`
//! (`output_tokens`, cumulative); OpenAI Responses `response.completed` (also `.incomplete`,
//! `.failed`) → `response.usage` (`input_tokens`, `output_tokens`,
//! `input_tokens_details.cached_tokens`); chat completions' `usage` (`prompt_tokens`,
//! `completion_tokens`); a non-streamed body's top-level `usage` in any of these.
//! Input tokens include cached ones (Anthropic's three input counts are summed), as in the
//! agent report.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::Value;

use super::Counters;

/// Longest SSE event data kept (longer events are skipped).
pub const MAX_EVENT: usize = 4 << 20;
/// Longest non-streamed JSON body kept for its usage (longer ones are not counted).
pub const MAX_JSON: usize = 4 << 20;

/// Token counts of one response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Usage {
    input: u64,
    output: u64,
    cached: u64,
}

/// How a response body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Sse,
    Json,
    Ignore,
}

/// Reads one response body's usage and adds it to the gateway's counters as it is seen.
pub(crate) struct Sniffer {
    mode: Mode,
    /// The current SSE line, or the JSON body.
    buf: Vec<u8>,
    /// The current line (or body) overflowed its bound: skip to the next line (or give up).
    overflow: bool,
    /// Data of the current SSE event.
    data: Vec<u8>,
    data_overflow: bool,
    /// The usage seen for this response so far, and the part already added to the counters.
    seen: Usage,
    counted: Usage,
    counters: Arc<Counters>,
}

impl Sniffer {
    /// A sniffer for a body of `content_type`.
    pub(crate) fn new(content_type: Option<&str>, counters: Arc<Counters>) -> Sniffer {
        let ct = content_type
            .and_then(|c| c.split(';').next())
            .map(|c| c.trim().to_ascii_lowercase())
            .unwrap_or_default();
        let mode = if ct == "text/event-stream" {
            Mode::Sse
        } else if ct == "application/json" || ct.ends_with("+json") {
            Mode::Json
        } else {
            Mode::Ignore
        };
        Sniffer {
            mode,
            buf: Vec::new(),
            overflow: false,
            data: Vec::new(),
            data_overflow: false,
            seen: Usage::default(),
            counted: Usage::default(),
            counters,
        }
    }

    /// One chunk of the body.
    pub(crate) fn feed(&mut self, mut chunk: &[u8]) {
        match self.mode {
            Mode::Ignore => {}
            Mode::Json => {
                if !self.overflow && self.buf.len() + chunk.len() <= MAX_JSON {
                    self.buf.extend_from_slice(chunk);
                } else {
                    self.overflow = true;
                    self.buf = Vec::new();
                }
            }
            Mode::Sse => {
                while let Some(nl) = chunk.iter().position(|&b| b == b'\n') {
                    if self.overflow {
                        self.overflow = false;
                    } else if self.buf.is_empty() {
                        self.line(&chunk[..nl]);
                    } else {
                        let mut line = std::mem::take(&mut self.buf);
                        line.extend_from_slice(&chunk[..nl]);
                        self.line(&line);
                        line.clear();
                        self.buf = line;
                    }
                    chunk = &chunk[nl + 1..];
                }
                if !self.overflow {
                    if self.buf.len() + chunk.len() > MAX_EVENT {
                        self.overflow = true;
                        self.buf = Vec::new();
                    } else {
                        self.buf.extend_from_slice(chunk);
                    }
                }
            }
        }
    }

    /// The body ended.
    pub(crate) fn finish(&mut self) {
        match self.mode {
            Mode::Ignore => {}
            Mode::Json => {
                if !self.overflow {
                    if let Ok(v) = serde_json::from_slice::<Value>(&self.buf) {
                        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                            self.seen = usage_of(u);
                            self.commit();
                        }
                    }
                }
                self.buf = Vec::new();
            }
            Mode::Sse => {
                if !self.overflow && !self.buf.is_empty() {
                    let line = std::mem::take(&mut self.buf);
                    self.line(&line);
                }
                self.line(b"");
            }
        }
    }

    /// One SSE line (without its `\n`).
    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if !self.data_overflow && !self.data.is_empty() {
                let data = std::mem::take(&mut self.data);
                self.event(&data);
                self.data = data;
            }
            self.data.clear();
            self.data_overflow = false;
            return;
        }
        let Some(value) = line.strip_prefix(b"data:") else {
            return; // `event:`, `id:`, `retry:`, comments
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if self.data_overflow || self.data.len() + value.len() + 1 > MAX_EVENT {
            self.data_overflow = true;
            self.data.clear();
            return;
        }
        if !self.data.is_empty() {
            self.data.push(b'\n');
        }
        self.data.extend_from_slice(value);
    }

    /// One SSE event's data.
    fn event(&mut self, data: &[u8]) {
        if !contains(data, b"\"usage\"") {
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        match v.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(u) = v.pointer("/message/usage") {
                    // A new message: its counts start over.
                    self.counted = Usage::default();
                    self.seen = usage_of(u);
                }
            }
            Some("message_delta") => {
                if let Some(u) = v.get("usage") {
                    let d = usage_of(u);
                    if has_input(u) {
                        self.seen.input = d.input;
                        self.seen.cached = d.cached;
                    }
                    if u.get("output_tokens").is_some() {
                        self.seen.output = d.output;
                    }
                }
            }
            Some("response.completed" | "response.incomplete" | "response.failed") => {
                if let Some(u) = v.pointer("/response/usage").filter(|u| u.is_object()) {
                    self.seen = usage_of(u);
                }
            }
            _ => {
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    self.seen = usage_of(u);
                }
            }
        }
        self.commit();
    }

    /// Adds what was seen and not yet counted.
    fn commit(&mut self) {
        let add = |a: &std::sync::atomic::AtomicU64, seen: u64, counted: &mut u64| {
            if seen > *counted {
                a.fetch_add(seen - *counted, Ordering::Relaxed);
                *counted = seen;
            }
        };
        add(
            &self.counters.input_tokens,
            self.seen.input,
            &mut self.counted.input,
        );
        add(
            &self.counters.output_tokens,
            self.seen.output,
            &mut self.counted.output,
        );
        add(
            &self.counters.cached_tokens,
            self.seen.cached,
            &mut self.counted.cached,
        );
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn has_input(u: &Value) -> bool {
    [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ]
    .iter()
    .any(|k| u.get(k).is_some())
}

/// The counts of a `usage` object in any of the known shapes.
fn usage_of(u: &Value) -> Usage {
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let cache_read = n("/cache_read_input_tokens");
    Usage {
        input: n("/input_tokens")
            .saturating_add(cache_read)
            .saturating_add(n("/cache_creation_input_tokens"))
            .saturating_add(n("/prompt_tokens")),
        output: n("/output_tokens").saturating_add(n("/completion_tokens")),
        cached: cache_read
            .saturating_add(n("/input_tokens_details/cached_tokens"))
            .saturating_add(n("/prompt_tokens_details/cached_tokens")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::GatewayStats;

    /// Feeds `body` in chunks of `step` bytes and returns the counters.
    fn run(ct: &str, body: &str, step: usize) -> GatewayStats {
        let counters = Arc::new(Counters::default());
        let mut s = Sniffer::new(Some(ct), counters.clone());
        for c in body.as_bytes().chunks(step) {
            s.feed(c);
        }
        s.finish();
        counters.snapshot()
    }

    fn tokens(s: GatewayStats) -> (u64, u64, u64) {
        (s.input_tokens, s.output_tokens, s.cached_tokens)
    }

    const ANTHROPIC_SSE: &str = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":2000,\"output_tokens\":1}}}\r\n\r\nevent: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\r\n\r\nevent: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\nevent: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello, \\\"usage\\\" word\"}}\r\n\r\nevent: content_block_stop\r\ndata: {\"type\":\"content_block_stop\",\"index\":0}\r\n\r\nevent: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":57}}\r\n\r\nevent: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";

    const OPENAI_SSE: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"delta\":\"Hi\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":9,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\"}]}],\"usage\":{\"input_tokens\":328,\"input_tokens_details\":{\"cached_tokens\":256},\"output_tokens\":52,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":380}}}\n\n";

    #[test]
    fn anthropic_sse_in_any_chunking() {
        for step in [1, 3, 7, 64, 4096] {
            assert_eq!(
                tokens(run("text/event-stream; charset=utf-8", ANTHROPIC_SSE, step)),
                (2112, 57, 2000),
                "chunks of {step}"
            );
        }
    }

    #[test]
    fn openai_responses_sse() {
        for step in [1, 5, 4096] {
            assert_eq!(
                tokens(run("text/event-stream", OPENAI_SSE, step)),
                (328, 52, 256)
            );
        }
    }

    #[test]
    fn json_bodies_and_other_types() {
        let anthropic = r#"{"id":"msg_2","type":"message","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":3}}"#;
        assert_eq!(tokens(run("application/json", anthropic, 8)), (15, 3, 5));
        let chat = r#"{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":8}}}"#;
        assert_eq!(tokens(run("application/json", chat, 4096)), (40, 9, 8));
        assert_eq!(tokens(run("text/plain", anthropic, 4096)), (0, 0, 0));
        assert_eq!(
            tokens(run("application/json", "{not json", 4096)),
            (0, 0, 0)
        );
    }

    /// A stream cut before `message_delta` still counts its input; an oversize event is
    /// skipped without losing the events after it.
    #[test]
    fn cut_streams_and_oversize_events() {
        let cut = &ANTHROPIC_SSE[..ANTHROPIC_SSE.find("event: content_block_start").unwrap()];
        assert_eq!(tokens(run("text/event-stream", cut, 10)), (2112, 1, 2000));
        let huge = format!(
            "data: {{\"type\":\"x\",\"usage\":{{\"input_tokens\":999}},\"pad\":\"{}\"}}\n\n{OPENAI_SSE}",
            "a".repeat(MAX_EVENT + 10)
        );
        assert_eq!(
            tokens(run("text/event-stream", &huge, 65536)),
            (328, 52, 256)
        );
    }
}
