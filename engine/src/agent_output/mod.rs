//! One report shape for both agent runtimes: Claude Code's `--output-format stream-json`
//! ([`claude`]), Codex's `exec --json` ([`codex`]) and a warm Codex's `app-server` stream
//! ([`codex_app`]) parsed into an [`AgentOutcome`].
//!
//! The stream is hostile input: lines are bounded (a longer one is skipped and counted),
//! anything that is not a JSON object of a known type is ignored, names and lists are capped,
//! and the result text is kept whole up to the node's output cap, never cut.

mod claude;
mod codex;
pub(crate) mod codex_app;
#[cfg(test)]
mod tests;

use serde_json::Value;

use crate::capped::{over_cap, DEFAULT_MAX_OUTPUT};

/// Longest line parsed at least (longer ones are skipped); a parser for a larger output cap
/// allows a line of twice the cap (JSON escaping) plus 64 KiB.
const MAX_LINE: usize = 1 << 20;
/// Entries kept in each list of the outcome (tool calls, skills, ...).
const MAX_LIST: usize = 256;
/// Characters kept of a name (tool, skill, model, MCP server).
const MAX_NAME: usize = 200;
/// Characters kept of an error or warning message.
const MAX_MESSAGE: usize = 4096;

/// Which runtime wrote the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Claude Code: `claude -p ... --output-format stream-json --verbose`.
    ClaudeStreamJson,
    /// Codex: `codex exec --json ...`.
    CodexExecJson,
    /// Codex held warm: `codex app-server`'s JSON-RPC messages
    /// (the warm Codex conversation).
    CodexAppServer,
}

/// What an agent runtime reported, in one shape for both runtimes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentOutcome {
    /// The final answer (Claude: the `result` event's text; Codex: the last
    /// `agent_message`), whole; `None` on error or when over the output cap.
    pub result: Option<String>,
    /// The runtime reported an error (Claude: `result.is_error`, whatever the subtype;
    /// Codex: `turn.failed`, or a top-level `error` not followed by a completed turn).
    pub is_error: bool,
    /// The runtime's error message, when `is_error`.
    pub error: Option<String>,
    /// The runtime's final event arrived (Claude: `result`; Codex: `turn.completed` or
    /// `turn.failed`).
    pub finished: bool,
    /// Input tokens, cached ones included (Claude: input + cache creation + cache read;
    /// Codex: `input_tokens` summed over turns).
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache (part of `input_tokens`).
    pub cached_tokens: u64,
    /// Cost in USD as the runtime computed it (Claude's `total_cost_usd`, at list price
    /// even for a local endpoint); Codex reports none: 0.
    pub cost_usd: f64,
    /// Turns: Claude's `num_turns` (model round trips); Codex's turns started.
    pub turns: u64,
    /// Tool calls in order (capped). Claude: the `tool_use` names (`Bash`,
    /// `mcp__SERVER__TOOL`); Codex: `shell` for a command, `mcp__SERVER__TOOL`,
    /// `file_change`, `web_search`.
    pub tool_calls: Vec<String>,
    /// When each tool call started and ended, as seen on the host while the stream arrived
    /// (capped like `tool_calls`; for traces).
    pub tool_timings: Vec<ToolTiming>,
    /// The tools the runtime offered the model at start (Claude's init; Codex reports none).
    pub tools: Vec<String>,
    /// The skills the runtime reported at start (Claude's init; Codex reports none).
    pub skills: Vec<String>,
    /// The MCP servers the runtime reported at start, as `name:status` (Claude's init;
    /// Codex reports none).
    pub mcp_servers: Vec<String>,
    /// The model the runtime named.
    pub model: Option<String>,
    /// Non-fatal problems the runtime reported (API retries, Codex `error` items and
    /// reconnect notices).
    pub warnings: Vec<String>,
    /// JSON events parsed.
    pub events: u64,
    /// Lines skipped for being longer than the parser's limit.
    pub skipped_lines: u64,
    /// The result text was larger than the output cap: its size in bytes.
    pub result_over_cap: Option<u64>,
    /// The output cap the result was held to.
    pub max_result: u64,
}

/// One tool call's timing: from its call (Claude's `tool_use`, Codex's `item.started`) to its
/// result (`tool_result`, `item.completed`), stamped when the host read each line.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolTiming {
    /// The tool's name, as in [`AgentOutcome::tool_calls`].
    pub name: String,
    /// The runtime's id of the call (capped), when it gave one.
    pub id: Option<String>,
    /// When the call was seen.
    pub started: std::time::SystemTime,
    /// When its result was seen (`None`: never).
    pub ended: Option<std::time::SystemTime>,
    /// The result was an error (`tool_result.is_error`, a failed Codex item).
    pub is_error: bool,
}

impl AgentOutcome {
    /// Records the start of a tool call.
    fn tool_started(&mut self, name: &str, id: Option<&str>) {
        if self.tool_timings.len() < MAX_LIST {
            self.tool_timings.push(ToolTiming {
                name: cap(name, MAX_NAME),
                id: id.map(|i| cap(i, MAX_NAME)),
                started: std::time::SystemTime::now(),
                ended: None,
                is_error: false,
            });
        }
    }

    /// Records the end of the open tool call with `id` (the last open one without an id
    /// when `id` is `None`); a result for no known call is ignored.
    fn tool_ended(&mut self, id: Option<&str>, is_error: bool) {
        let id = id.map(|i| cap(i, MAX_NAME));
        let open = self
            .tool_timings
            .iter_mut()
            .rev()
            .find(|t| t.ended.is_none() && t.id == id);
        if let Some(t) = open {
            t.ended = Some(std::time::SystemTime::now());
            t.is_error = is_error;
        }
    }

    /// Why the node fails, if it does: the runtime's error, a missing final event, or a
    /// result over the output cap.
    pub fn failure(&self) -> Option<String> {
        if self.is_error {
            return Some(
                self.error
                    .clone()
                    .unwrap_or_else(|| "the agent runtime reported an error".into()),
            );
        }
        if let Some(n) = self.result_over_cap {
            return Some(over_cap("the agent's result", n, self.max_result));
        }
        if !self.finished {
            let mut m = String::from("the agent runtime ended without reporting a result");
            if self.skipped_lines > 0 {
                m.push_str(&format!(
                    " ({} stream line(s) longer than twice the output cap were skipped; raise it with --max-output)",
                    self.skipped_lines
                ));
            }
            return Some(m);
        }
        None
    }

    /// Sets the result text, whole if within the cap.
    fn set_result(&mut self, text: Option<&str>) {
        self.result_over_cap = text
            .map(|r| r.len() as u64)
            .filter(|&n| n > self.max_result);
        self.result = text
            .filter(|_| self.result_over_cap.is_none())
            .map(str::to_string);
    }

    fn fail(&mut self, message: &str) {
        self.is_error = true;
        self.error = Some(cap(message, MAX_MESSAGE));
        self.result = None;
    }
}

/// Incremental parser of a runtime's JSON-lines output.
#[derive(Debug)]
pub struct OutputParser {
    format: Format,
    line: Vec<u8>,
    skipping: bool,
    max_line: usize,
    out: AgentOutcome,
    codex: codex::State,
    codex_app: codex_app::State,
}

impl OutputParser {
    /// A parser for `format` whose result may be up to `max_result` bytes (the node's
    /// output cap).
    pub fn new(format: Format, max_result: u64) -> OutputParser {
        let line = max_result.saturating_mul(2).saturating_add(64 << 10);
        OutputParser {
            format,
            line: Vec::new(),
            skipping: false,
            max_line: usize::try_from(line).unwrap_or(usize::MAX).max(MAX_LINE),
            out: AgentOutcome {
                max_result,
                ..AgentOutcome::default()
            },
            codex: codex::State::default(),
            codex_app: codex_app::State::default(),
        }
    }

    /// A parser with the default output cap.
    pub fn with_default_cap(format: Format) -> OutputParser {
        OutputParser::new(format, DEFAULT_MAX_OUTPUT)
    }

    /// Feeds bytes (any chunking).
    pub fn push(&mut self, data: &[u8]) {
        let mut rest = data;
        while !rest.is_empty() {
            let nl = rest.iter().position(|&b| b == b'\n');
            let (part, next) = match nl {
                Some(i) => (&rest[..i], Some(&rest[i + 1..])),
                None => (rest, None),
            };
            if !self.skipping {
                if self.line.len().saturating_add(part.len()) > self.max_line {
                    self.skipping = true;
                    self.out.skipped_lines += 1;
                    self.line = Vec::new();
                } else {
                    self.line.extend_from_slice(part);
                }
            }
            match next {
                Some(n) => {
                    if !self.skipping {
                        let line = std::mem::take(&mut self.line);
                        self.line_done(&line);
                    }
                    self.line.clear();
                    self.skipping = false;
                    rest = n;
                }
                None => rest = &[],
            }
        }
    }

    /// Ends the stream (a last line without newline counts).
    pub fn finish(mut self) -> AgentOutcome {
        if !self.skipping && !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line);
        }
        match self.format {
            Format::CodexExecJson => codex::finish(&mut self.codex, &mut self.out),
            Format::CodexAppServer => codex_app::finish(&mut self.codex_app, &mut self.out),
            Format::ClaudeStreamJson => {}
        }
        self.out
    }

    fn line_done(&mut self, line: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            return;
        };
        if !v.is_object() {
            return;
        }
        self.out.events += 1;
        match self.format {
            Format::ClaudeStreamJson => claude::event(&v, &mut self.out),
            Format::CodexExecJson => codex::event(&v, &mut self.codex, &mut self.out),
            Format::CodexAppServer => codex_app::event(&v, &mut self.codex_app, &mut self.out),
        }
    }
}

/// The first `n` characters of `s`.
fn cap(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Appends `item` (capped to a name) unless the list is full.
fn push_capped(list: &mut Vec<String>, item: &str) {
    if list.len() < MAX_LIST {
        list.push(cap(item, MAX_NAME));
    }
}

/// A non-negative integer at `pointer`, else 0.
fn num(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

/// The string at `pointer`.
fn text<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}
