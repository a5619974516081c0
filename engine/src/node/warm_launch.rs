//! What runs warm: an agent runtime started with nothing per node, blocked on its input
//! (a held exec, [`crate::sandbox`]), and the conversation that gives it the node's prompt
//! after a restore.
//!
//! - Claude Code: `claude -p --input-format stream-json --output-format stream-json
//!   --verbose ...` with no prompt argument. Held, it writes nothing and sends no request;
//!   one user message line starts the work, and the `result` event ends it. Its session id
//!   (the `X-Claude-Code-Session-Id` header and `metadata.user_id`'s `session_id`) is chosen
//!   at process start: every clone of one held process sends the same one unless the
//!   gateway replaces it.
//! - Codex: `codex app-server` (JSON-RPC, one object a line), its `initialize` request and
//!   `initialized` notification in the held exec's initial stdin, so the snapshot holds it
//!   initialised (its answer is in the held output, replayed at attach). After the restore
//!   `thread/start` makes a fresh thread — its id is the `session-id` header, the
//!   `prompt_cache_key` and the `session_id` of `x-codex-turn-metadata` — and `turn/start`
//!   gives the prompt; `turn/completed` ends it. Fixed at process start: the configuration
//!   (`config.toml`: model, provider, MCP servers), the environment (the gateway's base URL
//!   and placeholder token), `installation_id` (sent in every request's metadata) and the
//!   client name of `initialize` (its `originator` header and user agent).

use std::fmt;

use serde_json::{json, Value};
use voidbox_protocol::ExecRequest;

use super::agent::GuestFile;
use super::launch::{
    claude_headless, codex_config, codex_config_file, codex_env, mcp_servers, GatewayAccess,
    WORKDIR,
};
use crate::agent_output::Format;
use crate::kit::Layout;
use crate::plan::AgentAction;
use crate::providers::{Endpoint, Runtime};
use crate::spec::model::AgentMode;

/// The name the warm runtime is held under in its guest.
pub const HELD_NAME: &str = "agent-runtime";

/// Why the mock runtime is never held warm.
pub const MOCK_COLD: &str = "the mock runtime starts in milliseconds: nothing to keep warm";
/// Why an interactive agent is never held warm.
pub const INTERACTIVE_COLD: &str =
    "an interactive session runs the runtime's own terminal UI, not a held process waiting for one prompt";

/// The client name Codex gets in `initialize`: its `originator` header and user agent.
const CODEX_CLIENT: &str = "voidbox";
/// Codex notifications the warm conversation opts out of: streaming deltas and status
/// chatter the report does not use (they would fill the held output and the attach).
const CODEX_OPT_OUT: &[&str] = &[
    "item/agentMessage/delta",
    "item/commandExecution/outputDelta",
    "item/fileChange/outputDelta",
    "item/plan/delta",
    "item/reasoning/textDelta",
    "item/reasoning/summaryTextDelta",
    "item/reasoning/summaryPartAdded",
    "item/mcpToolCall/progress",
    "command/exec/outputDelta",
    "account/rateLimits/updated",
    "thread/status/changed",
];
// Request ids of the Codex conversation.
use crate::agent_output::codex_app::{INITIALIZE_ID, THREAD_START_ID, TURN_START_ID};

/// How a warm runtime starts: the held process and what it needs.
#[derive(Debug, Clone)]
pub struct WarmLaunch {
    /// The held process (its `hold` name is the caller's): nothing per node in it — no
    /// prompt, no node name. Codex's carries `initialize` on stdin.
    pub request: ExecRequest,
    /// Configuration files, written before the request (the kit's files are the caller's).
    pub files: Vec<GuestFile>,
    /// The runtime's output format once attached.
    pub format: Format,
    /// Where the kit goes for this runtime.
    pub layout: Layout,
    /// The runtime.
    pub runtime: Runtime,
}

/// Why a node cannot use a warm runtime (it starts its runtime cold).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdReason(pub String);

impl fmt::Display for ColdReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The warm launch of `agent`'s runtime, talking to its gateway `gw` (the fixed address and
/// placeholder token every clone's gateway accepts), or why it has none.
pub fn warm_launch(
    agent: &AgentAction,
    endpoint: &Endpoint,
    gw: &GatewayAccess,
) -> Result<WarmLaunch, ColdReason> {
    if agent.mode == AgentMode::Interactive {
        return Err(ColdReason(INTERACTIVE_COLD.into()));
    }
    let runtime = endpoint.runtime;
    let base = ExecRequest {
        workdir: Some(WORKDIR.into()),
        stdin_stream: true,
        ..ExecRequest::default()
    };
    match runtime {
        Runtime::Mock => Err(ColdReason(MOCK_COLD.into())),
        Runtime::ClaudeCode => {
            let args: Vec<String> = [
                "-p",
                "--input-format",
                "stream-json",
                "--output-format",
                "stream-json",
                "--verbose",
                "--dangerously-skip-permissions",
            ]
            .map(String::from)
            .into();
            let (request, files) = claude_headless(agent, endpoint, gw, args, base);
            Ok(WarmLaunch {
                request,
                files,
                format: Format::ClaudeStreamJson,
                layout: Layout::of(runtime),
                runtime,
            })
        }
        Runtime::Codex => Ok(WarmLaunch {
            request: ExecRequest {
                program: crate::runtimes::CODEX_BIN.into(),
                args: vec!["app-server".into()],
                env: codex_env(gw),
                stdin: codex_initialize(),
                ..base
            },
            files: vec![codex_config_file(codex_config(
                endpoint.model.as_deref(),
                &gw.base_url,
                &mcp_servers(agent),
            ))],
            format: Format::CodexAppServer,
            layout: Layout::of(runtime),
            runtime,
        }),
    }
}

/// Codex's `initialize` request and `initialized` notification, one line each.
fn codex_initialize() -> Vec<u8> {
    let init = json!({
        "jsonrpc": "2.0",
        "id": INITIALIZE_ID,
        "method": "initialize",
        "params": {
            "clientInfo": { "name": CODEX_CLIENT, "version": env!("CARGO_PKG_VERSION") },
            "capabilities": { "optOutNotificationMethods": CODEX_OPT_OUT },
        },
    });
    let mut out = line(&init);
    out.extend(line(&json!({ "jsonrpc": "2.0", "method": "initialized" })));
    out
}

/// Drives a warm runtime's conversation: what to write at attach and in answer to each line
/// of its output (the held output replayed first).
pub trait Conversation: Send {
    /// The first input, written at attach.
    fn start(&mut self) -> Vec<u8>;
    /// Input to write in answer to one output line (without its newline); empty: none.
    fn on_line(&mut self, line: &[u8]) -> Vec<u8>;
    /// The runtime's final event arrived: the process can be ended.
    fn finished(&self) -> bool;
}

/// The conversation giving `prompt` to a warm `runtime` (`model`: the endpoint's, for
/// Codex's thread; `cwd`: the directory its thread works in, the held process's — an image's
/// `WorkingDir` — else [`WORKDIR`]). The mock runtime is never warm: it gets Claude Code's.
pub fn conversation(
    runtime: Runtime,
    prompt: &str,
    model: Option<&str>,
    cwd: Option<&str>,
) -> Box<dyn Conversation> {
    match runtime {
        Runtime::Codex => Box::new(CodexConversation::new(
            prompt,
            model,
            cwd.unwrap_or(WORKDIR),
        )),
        Runtime::ClaudeCode | Runtime::Mock => Box::new(ClaudeConversation::new(prompt)),
    }
}

/// Claude Code: one user message; done at `result`.
struct ClaudeConversation {
    prompt: String,
    done: bool,
}

impl ClaudeConversation {
    fn new(prompt: &str) -> ClaudeConversation {
        ClaudeConversation {
            prompt: prompt.into(),
            done: false,
        }
    }
}

impl Conversation for ClaudeConversation {
    fn start(&mut self) -> Vec<u8> {
        line(&json!({
            "type": "user",
            "message": {
                "role": "user",
                "content": [{ "type": "text", "text": self.prompt }],
            },
        }))
    }

    fn on_line(&mut self, l: &[u8]) -> Vec<u8> {
        if let Ok(v) = serde_json::from_slice::<Value>(l) {
            if v.get("type").and_then(Value::as_str) == Some("result") {
                self.done = true;
            }
        }
        Vec::new()
    }

    fn finished(&self) -> bool {
        self.done
    }
}

/// Codex app-server: `thread/start`, then `turn/start` with the prompt on its answer; done
/// at `turn/completed` or when either request is refused.
struct CodexConversation {
    prompt: String,
    model: Option<String>,
    cwd: String,
    done: bool,
}

impl CodexConversation {
    fn new(prompt: &str, model: Option<&str>, cwd: &str) -> CodexConversation {
        CodexConversation {
            prompt: prompt.into(),
            model: model.map(String::from),
            cwd: cwd.into(),
            done: false,
        }
    }
}

impl Conversation for CodexConversation {
    fn start(&mut self) -> Vec<u8> {
        // As `config.toml` says (`launch::codex_config`): no approvals, no sandbox of its own.
        let mut params = json!({
            "cwd": self.cwd,
            "approvalPolicy": "never",
            "sandbox": "danger-full-access",
        });
        if let Some(m) = &self.model {
            params["model"] = json!(m);
        }
        line(&json!({
            "jsonrpc": "2.0",
            "id": THREAD_START_ID,
            "method": "thread/start",
            "params": params,
        }))
    }

    fn on_line(&mut self, l: &[u8]) -> Vec<u8> {
        let Ok(v) = serde_json::from_slice::<Value>(l) else {
            return Vec::new();
        };
        let id = v.get("id");
        match v.get("method").and_then(Value::as_str) {
            // A request of the server's (an approval, user input): nobody is there to answer.
            Some(method) if id.is_some() => line(&json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {
                    "code": -32601,
                    "message": format!("voidbox runs this agent unattended: nothing answers `{method}`"),
                },
            })),
            Some("turn/completed") => {
                self.done = true;
                Vec::new()
            }
            Some(_) => Vec::new(),
            None => {
                let id = id.and_then(Value::as_u64);
                if v.get("error").is_some_and(|e| !e.is_null()) {
                    // A refused request ends the conversation (the parser says why).
                    self.done |= id.is_some();
                    return Vec::new();
                }
                let thread = v.pointer("/result/thread/id").and_then(Value::as_str);
                match (id, thread) {
                    (Some(THREAD_START_ID), Some(thread)) => line(&json!({
                        "jsonrpc": "2.0",
                        "id": TURN_START_ID,
                        "method": "turn/start",
                        "params": {
                            "threadId": thread,
                            "input": [{ "type": "text", "text": self.prompt }],
                        },
                    })),
                    (Some(THREAD_START_ID), None) => {
                        self.done = true;
                        Vec::new()
                    }
                    _ => Vec::new(),
                }
            }
        }
    }

    fn finished(&self) -> bool {
        self.done
    }
}

/// `v` as one JSON line.
fn line(v: &Value) -> Vec<u8> {
    let mut out = v.to_string().into_bytes();
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests;
