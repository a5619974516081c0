//! OpenAI Responses API (`POST /v1/responses`): streamed (SSE) and plain JSON answers, and
//! the API's error bodies.

use serde_json::{json, Value};

use crate::sse::{chunks, Sse};
use crate::Usage;

/// Shell tools Codex may offer, most preferred first.
const SHELL_TOOLS: [&str; 3] = ["exec_command", "shell_command", "shell"];

/// A reply resolved for this API.
pub(crate) enum Reply<'a> {
    Text(&'a str),
    Call {
        name: String,
        namespace: Option<String>,
        arguments: String,
    },
}

/// The position of a request: the assistant messages and tool calls in its `input`.
pub(crate) fn position(body: &Value) -> usize {
    let Some(items) = body.get("input").and_then(Value::as_array) else {
        return 0;
    };
    items
        .iter()
        .filter(|i| match i.get("type").and_then(Value::as_str) {
            Some("function_call" | "custom_tool_call" | "local_shell_call") => true,
            Some("message") => i.get("role").and_then(Value::as_str) == Some("assistant"),
            _ => false,
        })
        .count()
}

/// The names of the function tools the request offers.
fn tool_names(body: &Value) -> Vec<&str> {
    body.get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("name").and_then(Value::as_str))
        .collect()
}

/// The reply for a tool turn: `name` with `input` as its arguments, or the request's shell
/// tool running `input.command`.
pub(crate) fn tool<'a>(name: Option<&str>, input: &Value, body: &Value) -> Reply<'a> {
    if let Some(n) = name {
        let (namespace, name) = split_namespace(n, body);
        return Reply::Call {
            name,
            namespace,
            arguments: input.to_string(),
        };
    }
    let offered = tool_names(body);
    let shell = SHELL_TOOLS
        .iter()
        .find(|t| offered.contains(t))
        .copied()
        .unwrap_or(SHELL_TOOLS[0]);
    let arguments = match input.get("command").and_then(Value::as_str) {
        Some(cmd) => match shell {
            "exec_command" => json!({ "cmd": cmd }),
            "shell_command" => json!({ "command": cmd }),
            _ => json!({ "command": ["bash", "-lc", cmd] }),
        },
        None => input.clone(),
    };
    Reply::Call {
        name: shell.to_string(),
        namespace: None,
        arguments: arguments.to_string(),
    }
}

/// `NS__TOOL` for a tool of a `namespace` tool `NS` the request offers (Codex groups each
/// MCP server's tools so: `mcp__SERVER` holding `TOOL`) becomes (`NS`, `TOOL`).
fn split_namespace(name: &str, body: &Value) -> (Option<String>, String) {
    let namespaces = body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|t| t.get("type").and_then(Value::as_str) == Some("namespace"));
    for ns in namespaces {
        let Some(ns_name) = ns.get("name").and_then(Value::as_str) else {
            continue;
        };
        let Some(inner) = name
            .strip_prefix(ns_name)
            .and_then(|r| r.strip_prefix("__"))
        else {
            continue;
        };
        let offered = ns
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|t| t.get("name").and_then(Value::as_str) == Some(inner));
        if offered {
            return (Some(ns_name.to_string()), inner.to_string());
        }
    }
    (None, name.to_string())
}

fn usage_json(u: &Usage) -> Value {
    let input = u.input_tokens.saturating_add(u.cached_tokens);
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input.saturating_add(u.output_tokens),
    })
}

/// The finished output item.
fn item(r: &Reply<'_>, seq: u64) -> Value {
    match r {
        Reply::Text(t) => json!({
            "id": format!("msg_vbx_{seq}"), "type": "message", "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": t, "annotations": []}],
        }),
        Reply::Call {
            name,
            namespace,
            arguments,
        } => {
            let mut v = json!({
                "id": format!("fc_vbx_{seq}"), "type": "function_call", "status": "completed",
                "call_id": format!("call_vbx_{seq}"), "name": name, "arguments": arguments,
            });
            if let (Some(ns), Some(o)) = (namespace, v.as_object_mut()) {
                o.insert("namespace".into(), json!(ns));
            }
            v
        }
    }
}

fn response(model: &str, seq: u64, status: &str, output: Value, usage: Value) -> Value {
    json!({
        "id": format!("resp_vbx_{seq}"), "object": "response", "created_at": 1_700_000_000u64,
        "status": status, "model": model, "output": output, "error": null,
        "incomplete_details": null, "usage": usage,
    })
}

/// The whole response, for `stream: false`.
pub(crate) fn body(r: &Reply<'_>, model: &str, seq: u64, u: &Usage) -> Value {
    response(
        model,
        seq,
        "completed",
        json!([item(r, seq)]),
        usage_json(u),
    )
}

/// The SSE events of the response, for `stream: true`.
pub(crate) fn stream(r: &Reply<'_>, model: &str, seq: u64, u: &Usage) -> Sse {
    let mut s = Sse::default();
    let mut n = 0u64;
    let mut ev = |s: &mut Sse, name: &str, mut data: Value| {
        if let Some(o) = data.as_object_mut() {
            o.insert("type".into(), json!(name));
            o.insert("sequence_number".into(), json!(n));
        }
        n += 1;
        s.event(name, data);
    };
    let pending = response(model, seq, "in_progress", json!([]), Value::Null);
    ev(&mut s, "response.created", json!({ "response": pending }));
    ev(
        &mut s,
        "response.in_progress",
        json!({ "response": pending }),
    );
    let done = item(r, seq);
    match r {
        Reply::Text(t) => {
            let id = format!("msg_vbx_{seq}");
            ev(
                &mut s,
                "response.output_item.added",
                json!({"output_index": 0, "item": {
                    "id": id, "type": "message", "status": "in_progress", "role": "assistant",
                    "content": [],
                }}),
            );
            let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
            ev(
                &mut s,
                "response.content_part.added",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "part": part("")}),
            );
            for c in chunks(t, 8) {
                ev(
                    &mut s,
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": 0, "content_index": 0, "delta": c}),
                );
            }
            ev(
                &mut s,
                "response.output_text.done",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "text": t}),
            );
            ev(
                &mut s,
                "response.content_part.done",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "part": part(t)}),
            );
        }
        Reply::Call { arguments, .. } => {
            let id = format!("fc_vbx_{seq}");
            let mut added = done.clone();
            if let Some(o) = added.as_object_mut() {
                o.insert("status".into(), json!("in_progress"));
                o.insert("arguments".into(), json!(""));
            }
            ev(
                &mut s,
                "response.output_item.added",
                json!({"output_index": 0, "item": added}),
            );
            for c in chunks(arguments, 16) {
                ev(
                    &mut s,
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": 0, "delta": c}),
                );
            }
            ev(
                &mut s,
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": 0, "arguments": arguments}),
            );
        }
    }
    ev(
        &mut s,
        "response.output_item.done",
        json!({"output_index": 0, "item": done}),
    );
    let completed = response(model, seq, "completed", json!([done]), usage_json(u));
    ev(
        &mut s,
        "response.completed",
        json!({ "response": completed }),
    );
    s
}

/// The API's error body for `status`.
pub(crate) fn error(status: u16, message: &str) -> Value {
    let (kind, code) = match status {
        401 => ("invalid_request_error", json!("invalid_api_key")),
        429 => ("rate_limit_error", json!("rate_limit_exceeded")),
        400..=499 => ("invalid_request_error", Value::Null),
        _ => ("server_error", Value::Null),
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// `GET /v1/models`: one model per known name.
pub(crate) fn models(names: &[&str]) -> Value {
    let data: Vec<Value> = names
        .iter()
        .map(|n| json!({"id": n, "object": "model", "created": 1_700_000_000u64, "owned_by": "voidbox", "type": "model", "display_name": n}))
        .collect();
    json!({"object": "list", "data": data, "has_more": false, "first_id": names.first(), "last_id": names.last()})
}
