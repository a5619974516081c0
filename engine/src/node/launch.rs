//! How an agent node's runtime starts in its VM: the exec request, the configuration files
//! it reads and the environment it gets, for Claude Code and Codex (from the runtimes disk,
//! [`crate::runtimes`]) and for the offline mock runtime.
//!
//! A real runtime never sees the API key: it talks to its node's credential gateway
//! ([`crate::gateway`]) at `http://10.0.2.2:PORT` with a per-VM placeholder token, and the
//! gateway adds the real credential on the host.

use std::collections::HashMap;

use voidbox_protocol::ExecRequest;

use super::agent::{GuestFile, MOCK_RUNTIME};
use super::refusals::NodeField;
use crate::agent_output::Format;
use crate::plan::{Action, AgentAction, Plan};
use crate::providers::{Endpoint, Runtime};
use crate::spec::model::{McpSkill, SkillEntry};

/// The sandbox user's home (uid 1000 owns it).
pub const HOME: &str = "/home/sandbox";
/// The working directory of every runtime.
pub const WORKDIR: &str = "/workspace";
/// Codex's configuration directory (`CODEX_HOME`); it must be writable.
pub const CODEX_HOME: &str = "/home/sandbox/.codex";
/// The variable holding the gateway token for Codex (its `env_key`).
pub const CODEX_TOKEN_ENV: &str = "VOIDBOX_GATEWAY_TOKEN";
/// Retries a runtime makes on a failed model request (their defaults retry for minutes).
pub const MAX_RETRIES: u32 = 2;
/// Claude Code's MCP configuration (`--mcp-config`), written per VM.
pub const CLAUDE_MCP_CONFIG: &str = "/home/sandbox/.voidbox/mcp.json";
/// `PATH` of the runtimes: their own directory first, then the system's.
const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

/// An agent node that cannot run on this host, with the field to blame.
#[derive(Debug, Clone)]
pub struct EndpointFailure {
    /// The node.
    pub node: String,
    /// The field.
    pub field: NodeField<'static>,
    /// What is wrong (never a secret).
    pub message: String,
    /// How to proceed.
    pub help: &'static str,
}

/// Resolves every agent node's `llm` ([`crate::providers::resolve`], overrides and keys read
/// through `env`) before any VM starts; a node that cannot run is a failure (exit 3).
pub fn endpoints(
    plan: &Plan,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<HashMap<String, Endpoint>, Vec<EndpointFailure>> {
    let mut out = HashMap::new();
    let mut failures = Vec::new();
    for n in plan.graph.node_weights() {
        let Action::Agent(a) = &n.action else {
            continue;
        };
        let fail = |field, message: String, help| EndpointFailure {
            node: n.name.clone(),
            field,
            message,
            help,
        };
        let e = match crate::providers::resolve(&a.llm, env) {
            Ok(e) => e,
            Err(e) => {
                failures.push(fail(
                    NodeField::Provider,
                    e.to_string(),
                    "set what the message names, or use another provider (`provider: mock` needs nothing)",
                ));
                continue;
            }
        };
        if e.runtime == Runtime::Mock {
            if let Some(i) = a
                .skills
                .iter()
                .position(|s| matches!(s, SkillEntry::Mcp(_)))
            {
                failures.push(fail(
                    NodeField::Skill(i),
                    "the mock runtime starts no MCP servers".into(),
                    "use a real runtime (`provider: claude`, `codex`, …) for MCP server skills",
                ));
            }
        }
        // `sandbox.env: {NAME: ""}` copies a host variable into the guest: never the key.
        if let Some(secret) = e.credential.as_ref().map(|c| c.secret().expose()) {
            let copied = n
                .sandbox
                .env
                .iter()
                .filter(|(_, v)| v.is_empty())
                .find(|(k, _)| env(k).is_some_and(|v| !v.is_empty() && v == secret));
            if let Some((k, _)) = copied {
                failures.push(fail(
                    NodeField::Sandbox("env"),
                    format!("`{k}` would copy the provider's API key into the guest, which voidbox never does (the credential gateway adds it on the host)"),
                    "remove it from `env`: the runtime reaches its model through the gateway without it",
                ));
            }
        }
        out.insert(n.name.clone(), e);
    }
    if failures.is_empty() {
        Ok(out)
    } else {
        Err(failures)
    }
}

/// [`endpoints`]' failures as located refusals of the spec `src`.
pub fn endpoint_refusals(
    plan: &Plan,
    src: &super::refusals::SpecSource,
    failures: Vec<EndpointFailure>,
) -> Vec<super::refusals::Refusal> {
    failures
        .into_iter()
        .map(|f| super::refusals::locate(plan, src, &f.node, f.field, f.message, f.help))
        .collect()
}

/// Whether any endpoint needs the runtimes disk (a real runtime).
pub fn needs_runtimes(endpoints: &HashMap<String, Endpoint>) -> bool {
    endpoints.values().any(|e| e.runtime != Runtime::Mock)
}

/// How the guest reaches the node's gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayAccess {
    /// Base URL as the guest sees it (`http://10.0.2.2:PORT` + the upstream's path).
    pub base_url: String,
    /// The per-VM placeholder token (not a credential outside this VM's gateway).
    pub token: String,
}

/// What starts the runtime: the request, the files it reads, how its output is parsed.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The exec request (environment and working directory set; the caller adds the
    /// node's environment).
    pub request: ExecRequest,
    /// Configuration files, written before the request (owned by the sandbox user).
    pub files: Vec<GuestFile>,
    /// The runtime's output format.
    pub format: Format,
    /// Where the node's kit goes for this runtime (skills, instructions).
    pub layout: crate::kit::Layout,
}

/// The launch of `agent`'s runtime; `gateway` is required for real runtimes (the caller
/// starts one per VM) and ignored by the mock.
pub fn launch(
    agent: &AgentAction,
    endpoint: &Endpoint,
    gateway: Option<&GatewayAccess>,
    output_file: &str,
    timeout: Option<u64>,
) -> Result<Launch, String> {
    let runtime = endpoint.runtime;
    let base = ExecRequest {
        workdir: Some(WORKDIR.into()),
        timeout_secs: timeout,
        ..ExecRequest::default()
    };
    let need_gateway = || {
        gateway.ok_or_else(|| {
            format!(
                "internal: the {} runtime needs its credential gateway",
                runtime_name(runtime)
            )
        })
    };
    match runtime {
        Runtime::Mock => Ok(Launch {
            request: ExecRequest {
                program: MOCK_RUNTIME.into(),
                args: vec![
                    "-p".into(),
                    agent.prompt.clone(),
                    "--output-format".into(),
                    "stream-json".into(),
                    "--verbose".into(),
                    "--skills-dir".into(),
                    crate::kit::Layout::of(runtime).skills_dir(),
                    "--output-file".into(),
                    output_file.into(),
                ],
                env: vec![("HOME".into(), HOME.into())],
                ..base
            },
            files: Vec::new(),
            format: Format::ClaudeStreamJson,
            layout: crate::kit::Layout::of(runtime),
        }),
        Runtime::ClaudeCode => {
            let gw = need_gateway()?;
            let args = vec![
                "-p".to_string(),
                agent.prompt.clone(),
                "--output-format".into(),
                "stream-json".into(),
                "--verbose".into(),
                // The VM is the sandbox: the runtime runs its tools without asking (as uid
                // 1000, which Claude Code requires for this flag).
                "--dangerously-skip-permissions".into(),
            ];
            let (request, files) = claude_headless(agent, endpoint, gw, args, base);
            Ok(Launch {
                request,
                files,
                format: Format::ClaudeStreamJson,
                layout: crate::kit::Layout::of(runtime),
            })
        }
        Runtime::Codex => {
            let gw = need_gateway()?;
            let mut args = vec![
                "exec".to_string(),
                "--json".into(),
                "--skip-git-repo-check".into(),
            ];
            if let Some(m) = &endpoint.model {
                args.extend(["-m".into(), m.clone()]);
            }
            args.extend(["--".into(), agent.prompt.clone()]);
            Ok(Launch {
                request: ExecRequest {
                    program: crate::runtimes::CODEX_BIN.into(),
                    args,
                    env: codex_env(gw),
                    ..base
                },
                files: vec![codex_config_file(codex_config(
                    endpoint.model.as_deref(),
                    &gw.base_url,
                    &mcp_servers(agent),
                ))],
                format: Format::CodexExecJson,
                layout: crate::kit::Layout::of(runtime),
            })
        }
    }
}

/// How an interactive session of `agent`'s runtime starts (`voidbox shell AGENT_SPEC`):
/// the runtime's own terminal UI in `workdir`, with the environment, gateway and MCP
/// servers of [`launch`] and the spec's prompt (if any) as the session's first message.
/// Claude Code gets no `-p`/`--output-format`, and its first-run dialogs (onboarding,
/// trust of `workdir`, the bypass-permissions warning, the API key in its environment —
/// the gateway's placeholder) answered in its configuration; Codex its TUI (no `exec`,
/// `--no-daemon`: the guest runs no background server), `workdir` trusted. The mock
/// runtime has no interactive mode.
pub fn launch_interactive(
    agent: &AgentAction,
    endpoint: &Endpoint,
    gw: &GatewayAccess,
    workdir: &str,
) -> Result<Launch, String> {
    let runtime = endpoint.runtime;
    let base = ExecRequest {
        workdir: Some(workdir.into()),
        ..ExecRequest::default()
    };
    // The prompt after `--`, so that one that looks like a flag stays the prompt.
    let prompt = || {
        (!agent.prompt.trim().is_empty())
            .then(|| ["--".to_string(), agent.prompt.clone()])
            .into_iter()
            .flatten()
    };
    match runtime {
        Runtime::Mock => Err(MOCK_NOT_INTERACTIVE.into()),
        Runtime::ClaudeCode => {
            let mut args = vec!["--dangerously-skip-permissions".to_string()];
            if let Some(m) = &endpoint.model {
                args.extend(["--model".into(), m.clone()]);
            }
            let mut files = vec![
                GuestFile {
                    path: format!("{HOME}/.claude.json"),
                    data: claude_interactive_state(&gw.token, workdir).into_bytes(),
                    mode: 0o600,
                },
                GuestFile {
                    path: format!("{HOME}/.claude/settings.json"),
                    data: br#"{"skipDangerousModePermissionPrompt":true}"#.to_vec(),
                    mode: 0o600,
                },
            ];
            claude_mcp(agent, &mut args, &mut files);
            args.extend(prompt());
            Ok(Launch {
                request: ExecRequest {
                    program: crate::runtimes::CLAUDE_BIN.into(),
                    args,
                    env: claude_env(gw),
                    ..base
                },
                files,
                format: Format::ClaudeStreamJson,
                layout: crate::kit::Layout::of(runtime),
            })
        }
        Runtime::Codex => {
            let mut args = vec!["--no-daemon".to_string()];
            if let Some(m) = &endpoint.model {
                args.extend(["-m".into(), m.clone()]);
            }
            args.extend(prompt());
            let mut config =
                codex_config(endpoint.model.as_deref(), &gw.base_url, &mcp_servers(agent));
            config.push_str(&format!(
                "\n[projects.{}]\ntrust_level = \"trusted\"\n",
                toml_string(workdir)
            ));
            Ok(Launch {
                request: ExecRequest {
                    program: crate::runtimes::CODEX_BIN.into(),
                    args,
                    env: codex_env(gw),
                    ..base
                },
                files: vec![codex_config_file(config)],
                format: Format::CodexExecJson,
                layout: crate::kit::Layout::of(runtime),
            })
        }
    }
}

/// Why an agent on the mock runtime cannot be opened interactively.
pub const MOCK_NOT_INTERACTIVE: &str =
    "the mock runtime (`provider: mock`) has no interactive mode: it only answers a task's prompt";

/// Claude Code run headless with `args` (its mode flags): the model, the onboarding answered
/// in `~/.claude.json` (Claude Code rewrites it as it runs), the MCP servers, the gateway
/// environment, on top of `base`.
pub(crate) fn claude_headless(
    agent: &AgentAction,
    endpoint: &Endpoint,
    gw: &GatewayAccess,
    mut args: Vec<String>,
    base: ExecRequest,
) -> (ExecRequest, Vec<GuestFile>) {
    if let Some(m) = &endpoint.model {
        args.extend(["--model".into(), m.clone()]);
    }
    let mut files = vec![GuestFile {
        path: format!("{HOME}/.claude.json"),
        data: br#"{"hasCompletedOnboarding":true}"#.to_vec(),
        mode: 0o600,
    }];
    claude_mcp(agent, &mut args, &mut files);
    let request = ExecRequest {
        program: crate::runtimes::CLAUDE_BIN.into(),
        args,
        env: claude_env(gw),
        ..base
    };
    (request, files)
}

/// Claude Code's environment: the gateway, bash for its Bash tool, no traffic of its own.
pub(crate) fn claude_env(gw: &GatewayAccess) -> Vec<(String, String)> {
    vec![
        ("HOME".into(), HOME.into()),
        (
            "PATH".into(),
            format!(
                "{}:{}",
                path_with(crate::runtimes::CLAUDE_BIN),
                crate::runtimes::BASH_BIN_DIR
            ),
        ),
        // Its Bash tool needs bash (the guest image has only busybox `sh`).
        ("SHELL".into(), crate::runtimes::BASH_BIN.into()),
        ("ANTHROPIC_BASE_URL".into(), gw.base_url.clone()),
        ("ANTHROPIC_API_KEY".into(), gw.token.clone()),
        (
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
            "1".into(),
        ),
        ("DISABLE_AUTOUPDATER".into(), "1".into()),
        ("DISABLE_TELEMETRY".into(), "1".into()),
        ("DISABLE_ERROR_REPORTING".into(), "1".into()),
        ("CLAUDE_CODE_MAX_RETRIES".into(), MAX_RETRIES.to_string()),
        ("TMPDIR".into(), "/tmp".into()),
    ]
}

/// Codex's environment: its home and the gateway token ([`CODEX_TOKEN_ENV`]).
pub(crate) fn codex_env(gw: &GatewayAccess) -> Vec<(String, String)> {
    vec![
        ("HOME".into(), HOME.into()),
        ("CODEX_HOME".into(), CODEX_HOME.into()),
        ("PATH".into(), path_with(crate::runtimes::CODEX_BIN)),
        (CODEX_TOKEN_ENV.into(), gw.token.clone()),
        ("TMPDIR".into(), "/tmp".into()),
    ]
}

/// Claude Code's MCP flags and configuration file, when the agent has MCP servers.
pub(crate) fn claude_mcp(agent: &AgentAction, args: &mut Vec<String>, files: &mut Vec<GuestFile>) {
    let servers = mcp_servers(agent);
    if !servers.is_empty() {
        // Only the spec's servers: none from elsewhere in the guest.
        args.extend([
            "--mcp-config".into(),
            CLAUDE_MCP_CONFIG.into(),
            "--strict-mcp-config".into(),
        ]);
        files.push(GuestFile {
            path: CLAUDE_MCP_CONFIG.into(),
            data: claude_mcp_config(&servers).into_bytes(),
            mode: 0o600,
        });
    }
}

/// Codex's `config.toml` as a guest file.
pub(crate) fn codex_config_file(config: String) -> GuestFile {
    GuestFile {
        path: format!("{CODEX_HOME}/config.toml"),
        data: config.into_bytes(),
        mode: 0o600,
    }
}

/// Claude Code's `~/.claude.json` for an interactive session: onboarding done, the
/// bypass-permissions warning accepted, `workdir` trusted, and the API key in its
/// environment (the gateway's placeholder `token`, which Claude Code knows by its last 20
/// characters) approved.
pub fn claude_interactive_state(token: &str, workdir: &str) -> String {
    let tail: String = {
        let chars: Vec<char> = token.chars().collect();
        chars[chars.len().saturating_sub(20)..].iter().collect()
    };
    let mut projects = serde_json::Map::new();
    projects.insert(
        workdir.to_string(),
        serde_json::json!({ "hasTrustDialogAccepted": true }),
    );
    serde_json::json!({
        "hasCompletedOnboarding": true,
        "bypassPermissionsModeAccepted": true,
        "customApiKeyResponses": { "approved": [tail], "rejected": [] },
        "projects": projects,
    })
    .to_string()
}

/// The runtime's name in messages and reports.
pub fn runtime_name(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::ClaudeCode => "claude-code",
        Runtime::Codex => "codex",
        Runtime::Mock => "mock",
    }
}

/// `PATH` with the directory of `bin` first.
/// `runtime`'s variables, then those of `extra` (the node's: an image's `Env`, the spec's
/// `env`) the runtime does not set. `PATH` is joined: the runtime's own directories first,
/// then `extra`'s `PATH` in place of the system default — so an agent in an image finds the
/// image's programs (its `python3`, its compilers) as well as its runtime and bash.
pub fn merge_env(
    runtime: Vec<(String, String)>,
    extra: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let own: Vec<String> = runtime.iter().map(|(k, _)| k.clone()).collect();
    let node_path = extra
        .iter()
        .rev()
        .find(|(k, v)| k == "PATH" && !v.is_empty())
        .map(|(_, v)| v.clone());
    let mut env = runtime;
    if let Some(node_path) = node_path {
        if let Some((_, path)) = env.iter_mut().find(|(k, _)| k == "PATH") {
            let dirs: Vec<&str> = path
                .split(':')
                .filter(|d| !d.is_empty() && !SYSTEM_PATH.split(':').any(|s| s == *d))
                .collect();
            *path = dirs
                .into_iter()
                .chain(std::iter::once(node_path.as_str()))
                .collect::<Vec<_>>()
                .join(":");
        }
    }
    env.extend(extra.into_iter().filter(|(k, _)| !own.contains(k)));
    env
}

fn path_with(bin: &str) -> String {
    match bin.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}:{SYSTEM_PATH}"),
        None => SYSTEM_PATH.into(),
    }
}

/// Codex's `config.toml`: the gateway as its only model provider (Responses API, the token
/// in [`CODEX_TOKEN_ENV`]), no approvals and no sandbox of its own inside the VM, no
/// analytics, few retries.
pub fn codex_config(model: Option<&str>, base_url: &str, mcp: &[&McpSkill]) -> String {
    let mut s = String::new();
    if let Some(m) = model {
        s.push_str(&format!("model = {}\n", toml_string(m)));
    }
    s.push_str(&format!(
        "model_provider = \"voidbox\"\napproval_policy = \"never\"\nsandbox_mode = \"danger-full-access\"\n\n[analytics]\nenabled = false\n\n[model_providers.voidbox]\nname = \"voidbox gateway\"\nbase_url = {}\nwire_api = \"responses\"\nenv_key = \"{CODEX_TOKEN_ENV}\"\nrequest_max_retries = {MAX_RETRIES}\nstream_max_retries = {MAX_RETRIES}\n",
        toml_string(base_url)
    ));
    for m in mcp {
        s.push_str(&format!(
            "\n[mcp_servers.{}]\ncommand = {}\nargs = [{}]\n",
            toml_string(&m.mcp),
            toml_string(&m.command),
            m.args
                .iter()
                .map(|a| toml_string(a))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        if !m.env.is_empty() {
            let env: Vec<String> = m
                .env
                .iter()
                .map(|(k, v)| format!("{} = {}", toml_string(k), toml_string(v)))
                .collect();
            s.push_str(&format!("env = {{ {} }}\n", env.join(", ")));
        }
    }
    s
}

/// The agent's MCP server skills, in spec order.
pub(crate) fn mcp_servers(agent: &AgentAction) -> Vec<&McpSkill> {
    agent
        .skills
        .iter()
        .filter_map(|s| match s {
            SkillEntry::Mcp(m) => Some(m),
            _ => None,
        })
        .collect()
}

/// Claude Code's `--mcp-config` file: every server on stdio.
pub fn claude_mcp_config(mcp: &[&McpSkill]) -> String {
    let servers: serde_json::Map<String, serde_json::Value> = mcp
        .iter()
        .map(|m| {
            (
                m.mcp.clone(),
                serde_json::json!({
                    "type": "stdio",
                    "command": m.command,
                    "args": m.args,
                    "env": m.env,
                }),
            )
        })
        .collect();
    serde_json::json!({ "mcpServers": servers }).to_string()
}

/// A TOML basic string (quotes, backslashes and control characters escaped).
fn toml_string(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\t' => s.push_str("\\t"),
            '\r' => s.push_str("\\r"),
            c if c.is_control() => s.push_str(&format!("\\u{:04X}", c as u32)),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests;
