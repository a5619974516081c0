//! Codex's `exec --json`: `thread.started`, `turn.started`, `item.started` /
//! `item.completed` (`agent_message`, `command_execution`, `mcp_tool_call`, `file_change`,
//! `web_search`, `error`, `reasoning`, ...), `turn.completed` (usage), `turn.failed` and
//! top-level `error`.
//!
//! Errors: an `error` item is a warning (an unknown model's metadata, say). A top-level
//! `error` is fatal unless a turn completes after it: Codex also sends one per stream
//! reconnect (`Reconnecting... 1/5 (...)`) and then carries on. `turn.failed` is fatal.

use std::collections::HashSet;

use serde_json::Value;

use super::{cap, num, push_capped, text, AgentOutcome, MAX_LIST, MAX_MESSAGE};

/// What the stream said so far beyond the outcome.
#[derive(Debug, Default)]
pub(super) struct State {
    /// Ids of the tool items counted (an item arrives started, then completed).
    counted: HashSet<String>,
    /// The last top-level `error` since the last completed turn.
    pending_error: Option<String>,
    /// The last `turn.failed` message, unless a turn completed after it.
    failed: Option<String>,
}

/// Takes one event.
pub(super) fn event(v: &Value, st: &mut State, out: &mut AgentOutcome) {
    match text(v, "/type") {
        Some("turn.started") => out.turns = out.turns.saturating_add(1),
        Some(kind @ ("item.started" | "item.completed")) => {
            if let Some(item) = v.get("item") {
                self::item(item, kind == "item.completed", st, out);
            }
        }
        Some("turn.completed") => {
            out.finished = true;
            st.pending_error = None;
            st.failed = None;
            out.input_tokens = out
                .input_tokens
                .saturating_add(num(v, "/usage/input_tokens"));
            out.cached_tokens = out
                .cached_tokens
                .saturating_add(num(v, "/usage/cached_input_tokens"));
            out.output_tokens = out
                .output_tokens
                .saturating_add(num(v, "/usage/output_tokens"));
        }
        Some("turn.failed") => {
            out.finished = true;
            let m = text(v, "/error/message").unwrap_or("the turn failed");
            st.failed = Some(cap(m, MAX_MESSAGE));
        }
        Some("error") => {
            let m = text(v, "/message").unwrap_or("error");
            push_capped(&mut out.warnings, m);
            st.pending_error = Some(cap(m, MAX_MESSAGE));
        }
        _ => {}
    }
}

fn item(item: &Value, completed: bool, st: &mut State, out: &mut AgentOutcome) {
    let tool = match text(item, "/type") {
        Some("agent_message") => {
            if completed {
                out.set_result(text(item, "/text"));
            }
            return;
        }
        Some("error") => {
            if completed {
                push_capped(&mut out.warnings, text(item, "/message").unwrap_or("error"));
            }
            return;
        }
        Some("command_execution") => "shell".to_string(),
        Some("mcp_tool_call") => format!(
            "mcp__{}__{}",
            text(item, "/server").unwrap_or("?"),
            text(item, "/tool").unwrap_or("?")
        ),
        Some(t @ ("file_change" | "web_search")) => t.to_string(),
        _ => return,
    };
    let id = text(item, "/id");
    if completed {
        // A completed item that never started (or has no id) starts and ends now.
        let open = out
            .tool_timings
            .iter()
            .any(|t| t.ended.is_none() && t.id.as_deref() == id.map(|i| cap(i, 200)).as_deref());
        if !open || id.is_none() {
            out.tool_started(&tool, id);
        }
        let failed = text(item, "/status") == Some("failed")
            || item
                .get("exit_code")
                .and_then(Value::as_i64)
                .is_some_and(|c| c != 0);
        out.tool_ended(id, failed);
    }
    // Counted once: at first sight of its id, or when completed if it has none.
    match id {
        Some(id) if st.counted.len() >= MAX_LIST || !st.counted.insert(cap(id, 200)) => return,
        Some(_) => {}
        None if !completed => return,
        None => {}
    }
    if !completed {
        out.tool_started(&tool, id);
    }
    push_capped(&mut out.tool_calls, &tool);
}

/// Ends the stream: a failed turn or an unanswered `error` fails the outcome.
pub(super) fn finish(st: &mut State, out: &mut AgentOutcome) {
    if let Some(m) = st.failed.take().or_else(|| st.pending_error.take()) {
        out.result_over_cap = None;
        out.fail(&m);
    }
}
