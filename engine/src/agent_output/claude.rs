//! Claude Code's stream-json: `system` (`init`: model, tools, skills, MCP servers;
//! `api_retry`), `assistant` (content blocks: `tool_use`), `user` (tool results) and
//! `result`. `result.is_error` decides failure, never `subtype`: an API error arrives as
//! `subtype: "success"` with `is_error: true`, and `error_max_turns` and the like carry
//! `is_error: true` too.

use serde_json::Value;

use super::{cap, num, push_capped, text, AgentOutcome, MAX_LIST, MAX_MESSAGE, MAX_NAME};

/// Takes one event.
pub(super) fn event(v: &Value, out: &mut AgentOutcome) {
    match text(v, "/type") {
        Some("system") => system(v, out),
        Some("assistant") => {
            if out.model.is_none() {
                out.model = text(v, "/message/model")
                    .filter(|m| !m.starts_with('<'))
                    .map(|m| cap(m, MAX_NAME));
            }
            let content = v.pointer("/message/content").and_then(Value::as_array);
            for c in content.into_iter().flatten() {
                if text(c, "/type") == Some("tool_use") {
                    let name = text(c, "/name").unwrap_or("?");
                    push_capped(&mut out.tool_calls, name);
                    out.tool_started(name, text(c, "/id"));
                }
            }
        }
        Some("user") => {
            let content = v.pointer("/message/content").and_then(Value::as_array);
            for c in content.into_iter().flatten() {
                if text(c, "/type") == Some("tool_result") {
                    let is_error = c.get("is_error").and_then(Value::as_bool) == Some(true);
                    out.tool_ended(text(c, "/tool_use_id"), is_error);
                }
            }
        }
        Some("result") => result(v, out),
        _ => {}
    }
}

fn system(v: &Value, out: &mut AgentOutcome) {
    match text(v, "/subtype") {
        Some("init") => {
            if let Some(m) = text(v, "/model") {
                out.model = Some(cap(m, MAX_NAME));
            }
            let strings = |key: &str| -> Vec<String> {
                v.get(key)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .take(MAX_LIST)
                    .map(|s| cap(s, MAX_NAME))
                    .collect()
            };
            out.tools = strings("tools");
            out.skills = strings("skills");
            out.mcp_servers = v
                .get("mcp_servers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .take(MAX_LIST)
                .map(|s| {
                    let name = text(s, "/name").unwrap_or("?");
                    let status = text(s, "/status").unwrap_or("unknown");
                    format!("{}:{}", cap(name, MAX_NAME), cap(status, MAX_NAME))
                })
                .collect();
        }
        Some("api_retry") => {
            let status = v
                .get("error_status")
                .and_then(Value::as_u64)
                .map_or_else(|| "no status".to_string(), |s| format!("HTTP {s}"));
            let w = format!(
                "API retry {}/{}: {} {}",
                num(v, "/attempt"),
                num(v, "/max_retries"),
                status,
                text(v, "/error").unwrap_or("")
            );
            push_capped(&mut out.warnings, w.trim_end());
        }
        _ => {}
    }
}

fn result(v: &Value, out: &mut AgentOutcome) {
    out.finished = true;
    out.input_tokens = num(v, "/usage/input_tokens")
        .saturating_add(num(v, "/usage/cache_read_input_tokens"))
        .saturating_add(num(v, "/usage/cache_creation_input_tokens"));
    out.cached_tokens = num(v, "/usage/cache_read_input_tokens");
    out.output_tokens = num(v, "/usage/output_tokens");
    out.turns = num(v, "/num_turns");
    out.cost_usd = v
        .get("total_cost_usd")
        .and_then(Value::as_f64)
        .filter(|c| c.is_finite() && *c >= 0.0)
        .unwrap_or(0.0);
    let result = text(v, "/result");
    // `is_error` decides; only a stream without it falls back on the subtype.
    let is_error = match v.get("is_error").and_then(Value::as_bool) {
        Some(b) => b,
        None => text(v, "/subtype").is_some_and(|s| s != "success"),
    };
    if !is_error {
        out.is_error = false;
        out.error = None;
        out.set_result(result);
        return;
    }
    // The message: the result text (API errors), else `errors` (max turns, budget), else
    // the subtype.
    let errors: Vec<&str> = v
        .get("errors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .take(16)
        .collect();
    let message = match result.filter(|r| !r.trim().is_empty()) {
        Some(r) => cap(r, MAX_MESSAGE),
        None if !errors.is_empty() => errors.join("; "),
        None => match text(v, "/subtype") {
            Some(s) => format!("the agent runtime failed: {}", cap(s, MAX_NAME)),
            None => "the agent runtime reported an error".into(),
        },
    };
    out.result_over_cap = None;
    out.fail(&message);
}
