//! Codex's `app-server` JSON-RPC stream (one JSON object a line), as a warm runtime writes it
//! (voidbox's warm Codex conversation): responses to our requests (`initialize`, `thread/start`,
//! `turn/start`), and notifications — `turn/started`, `item/started` / `item/completed`
//! (`agentMessage`, `commandExecution`, `mcpToolCall`, `fileChange`, `webSearch`,
//! `dynamicToolCall`, ...), `thread/tokenUsage/updated` (the thread's running total),
//! `error` (`willRetry`), `warning`, `mcpServer/startupStatus/updated` and `turn/completed`
//! (`turn.status`: `completed`, `failed` with `turn.error`, `interrupted`).
//!
//! The outcome has the stats `codex exec --json` gives ([`super::codex`]): an `error`
//! notification is a warning, and fatal unless a turn completes after it; a failed or
//! interrupted turn is fatal; so is an error answer to one of our requests.

use std::collections::HashSet;

use serde_json::Value;

use super::{cap, num, push_capped, text, AgentOutcome, MAX_LIST, MAX_MESSAGE, MAX_NAME};

/// What the stream said so far beyond the outcome.
#[derive(Debug, Default)]
pub(super) struct State {
    /// Ids of the tool items counted (an item arrives started, then completed).
    counted: HashSet<String>,
    /// The last `error` notification since the last completed turn.
    pending_error: Option<String>,
    /// Why the last turn failed, unless a turn completed after it.
    failed: Option<String>,
    /// MCP servers by name, in order of first report, with their last status.
    mcp: Vec<(String, String)>,
}

/// Takes one message.
pub(super) fn event(v: &Value, st: &mut State, out: &mut AgentOutcome) {
    let Some(method) = text(v, "/method") else {
        // A response: an error answer to one of our requests ends the conversation.
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            let what = match v.get("id").and_then(Value::as_u64) {
                Some(id) => request_name(id),
                None => "a request",
            };
            let m = text(e, "/message").unwrap_or("error");
            out.finished = true;
            st.failed = Some(cap(
                &format!("codex app-server refused {what}: {m}"),
                MAX_MESSAGE,
            ));
        } else if let Some(m) = text(v, "/result/model").or_else(|| text(v, "/result/thread/model"))
        {
            out.model = Some(cap(m, MAX_NAME));
        }
        return;
    };
    if v.get("id").is_some() {
        // A request of the server's (approvals, user input): the conversation answers it.
        return;
    }
    let p = v.get("params").unwrap_or(&Value::Null);
    match method {
        "turn/started" => out.turns = out.turns.saturating_add(1),
        "item/started" | "item/completed" => {
            if let Some(item) = p.get("item") {
                self::item(item, method == "item/completed", st, out);
            }
        }
        "thread/tokenUsage/updated" => {
            // The thread's running total (one thread per conversation).
            out.input_tokens = num(p, "/tokenUsage/total/inputTokens");
            out.cached_tokens = num(p, "/tokenUsage/total/cachedInputTokens");
            out.output_tokens = num(p, "/tokenUsage/total/outputTokens");
        }
        "turn/completed" => {
            out.finished = true;
            match text(p, "/turn/status") {
                Some("completed") => {
                    st.pending_error = None;
                    st.failed = None;
                }
                status => {
                    let m = text(p, "/turn/error/message")
                        .map(str::to_string)
                        .or_else(|| st.pending_error.clone())
                        .unwrap_or_else(|| {
                            format!("the turn ended {}", cap(status.unwrap_or("unfinished"), 40))
                        });
                    st.failed = Some(cap(&m, MAX_MESSAGE));
                }
            }
        }
        "error" => {
            // As `exec --json` words it: a retry names its cause (`Reconnecting... 1/2 (...)`).
            let m = text(p, "/error/message").unwrap_or("error");
            let m = match text(p, "/error/additionalDetails").filter(|d| !d.is_empty()) {
                Some(d) => format!("{m} ({d})"),
                None => m.to_string(),
            };
            push_capped(&mut out.warnings, &m);
            st.pending_error = Some(cap(&m, MAX_MESSAGE));
        }
        "warning" | "configWarning" => {
            let m = text(p, "/message")
                .or_else(|| text(p, "/summary"))
                .unwrap_or("warning");
            push_capped(&mut out.warnings, m);
        }
        "mcpServer/startupStatus/updated" => {
            let name = cap(text(p, "/name").unwrap_or("?"), MAX_NAME);
            let status = cap(
                text(p, "/status")
                    .or_else(|| text(p, "/status/type"))
                    .unwrap_or("unknown"),
                MAX_NAME,
            );
            if let Some(s) = st.mcp.iter_mut().find(|(n, _)| *n == name) {
                s.1 = status;
            } else if st.mcp.len() < MAX_LIST {
                st.mcp.push((name, status));
            }
            out.mcp_servers = st.mcp.iter().map(|(n, s)| format!("{n}:{s}")).collect();
        }
        _ => {}
    }
}

fn item(item: &Value, completed: bool, st: &mut State, out: &mut AgentOutcome) {
    let tool = match text(item, "/type") {
        Some("agentMessage") => {
            if completed {
                out.set_result(text(item, "/text"));
            }
            return;
        }
        Some("commandExecution") => "shell".to_string(),
        Some("mcpToolCall") => format!(
            "mcp__{}__{}",
            text(item, "/server").unwrap_or("?"),
            text(item, "/tool").unwrap_or("?")
        ),
        Some("dynamicToolCall") => text(item, "/tool").unwrap_or("dynamic_tool").to_string(),
        Some("fileChange") => "file_change".into(),
        Some("webSearch") => "web_search".into(),
        _ => return,
    };
    let id = text(item, "/id");
    if completed {
        // A completed item that never started (or has no id) starts and ends now.
        let open = out.tool_timings.iter().any(|t| {
            t.ended.is_none() && t.id.as_deref() == id.map(|i| cap(i, MAX_NAME)).as_deref()
        });
        if !open || id.is_none() {
            out.tool_started(&tool, id);
        }
        let failed = matches!(text(item, "/status"), Some("failed" | "declined"))
            || item
                .get("exitCode")
                .and_then(Value::as_i64)
                .is_some_and(|c| c != 0)
            || item.get("success").and_then(Value::as_bool) == Some(false);
        out.tool_ended(id, failed);
    }
    // Counted once: at first sight of its id, or when completed if it has none.
    match id {
        Some(id) if st.counted.len() >= MAX_LIST || !st.counted.insert(cap(id, MAX_NAME)) => return,
        Some(_) => {}
        None if !completed => return,
        None => {}
    }
    if !completed {
        out.tool_started(&tool, id);
    }
    push_capped(&mut out.tool_calls, &tool);
}

/// Ends the stream: a failed turn, a refused request or an unanswered `error` fails the
/// outcome.
pub(super) fn finish(st: &mut State, out: &mut AgentOutcome) {
    if let Some(m) = st.failed.take().or_else(|| st.pending_error.take()) {
        out.result_over_cap = None;
        out.fail(&m);
    }
}

/// The JSON-RPC ids of the warm Codex conversation's requests.
pub(crate) const INITIALIZE_ID: u64 = 0;
/// `thread/start`'s id.
pub(crate) const THREAD_START_ID: u64 = 1;
/// `turn/start`'s id.
pub(crate) const TURN_START_ID: u64 = 2;

/// The method of our request `id`, for messages.
pub(crate) fn request_name(id: u64) -> &'static str {
    match id {
        INITIALIZE_ID => "initialize",
        THREAD_START_ID => "thread/start",
        TURN_START_ID => "turn/start",
        _ => "a request",
    }
}
