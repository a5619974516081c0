//! Anthropic Messages API (`POST /v1/messages`): streamed (SSE) and plain JSON answers, and
//! the API's error bodies.

use serde_json::{json, Value};

use crate::sse::{chunks, Sse};
use crate::Usage;

/// The shell tool of Claude Code.
const SHELL_TOOL: &str = "Bash";

/// A reply resolved for this API.
pub(crate) enum Reply<'a> {
    Text(&'a str),
    Tool { name: &'a str, input: Value },
}

/// The position of a request: the assistant messages it carries.
pub(crate) fn position(body: &Value) -> usize {
    body.get("messages")
        .and_then(Value::as_array)
        .map_or(0, |m| {
            m.iter()
                .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
                .count()
        })
}

/// The reply for a tool turn: `name` or the shell tool.
pub(crate) fn tool<'a>(name: Option<&'a str>, input: &Value) -> Reply<'a> {
    Reply::Tool {
        name: name.unwrap_or(SHELL_TOOL),
        input: input.clone(),
    }
}

fn usage_json(u: &Usage, output: u64) -> Value {
    json!({
        "input_tokens": u.input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": output,
    })
}

fn stop_reason(r: &Reply<'_>) -> &'static str {
    match r {
        Reply::Text(_) => "end_turn",
        Reply::Tool { .. } => "tool_use",
    }
}

/// The whole message, for `stream: false`.
pub(crate) fn message(r: &Reply<'_>, model: &str, seq: u64, u: &Usage) -> Value {
    let block = match r {
        Reply::Text(t) => json!({"type": "text", "text": t}),
        Reply::Tool { name, input } => json!({
            "type": "tool_use", "id": format!("toolu_vbx_{seq}"), "name": name, "input": input,
        }),
    };
    json!({
        "id": format!("msg_vbx_{seq}"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": stop_reason(r),
        "stop_sequence": null,
        "usage": usage_json(u, u.output_tokens),
    })
}

/// The SSE events of the message, for `stream: true`.
pub(crate) fn stream(r: &Reply<'_>, model: &str, seq: u64, u: &Usage) -> Sse {
    let mut s = Sse::default();
    s.event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": format!("msg_vbx_{seq}"), "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage_json(u, 1),
        }}),
    );
    match r {
        Reply::Text(t) => {
            s.event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
            );
            s.event("ping", json!({"type": "ping"}));
            for c in chunks(t, 8) {
                s.event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": c}}),
                );
            }
        }
        Reply::Tool { name, input } => {
            s.event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {
                    "type": "tool_use", "id": format!("toolu_vbx_{seq}"), "name": name,
                    "input": {},
                }}),
            );
            let args = input.to_string();
            for c in chunks(&args, 16) {
                s.event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "input_json_delta", "partial_json": c}}),
                );
            }
        }
    }
    s.event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    );
    s.event(
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": stop_reason(r), "stop_sequence": null},
               "usage": {"output_tokens": u.output_tokens}}),
    );
    s.event("message_stop", json!({"type": "message_stop"}));
    s
}

/// The API's error body for `status`.
pub(crate) fn error(status: u16, message: &str, seq: u64) -> Value {
    let kind = match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    };
    json!({
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": format!("req_vbx_{seq}"),
    })
}

/// `POST /v1/messages/count_tokens`: a rough count (4 bytes a token).
pub(crate) fn count_tokens(raw_len: usize) -> Value {
    json!({"input_tokens": raw_len / 4})
}
