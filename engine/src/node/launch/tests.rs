use super::*;
use crate::spec::model::{Llm, Provider};

fn agent(prompt: &str) -> AgentAction {
    AgentAction {
        prompt: prompt.into(),
        skills: Vec::new(),
        prompt_files: Vec::new(),
        llm: Llm {
            provider: Provider::Custom,
            model: None,
            base_url: None,
            api_key_env: None,
            credential_proxy: false,
        },
        output_file: None,
        mode: Default::default(),
    }
}

fn endpoint(runtime: Runtime, model: Option<&str>) -> Endpoint {
    Endpoint {
        provider: Provider::Custom,
        runtime,
        upstream: Some("http://127.0.0.1:8091/v1".parse().unwrap()),
        credential: None,
        model: model.map(String::from),
        local: true,
    }
}

fn gw() -> GatewayAccess {
    GatewayAccess {
        base_url: "http://10.0.2.2:4321/v1".into(),
        token: "vbx-placeholder".into(),
    }
}

#[test]
fn claude_code_talks_to_the_gateway_with_the_placeholder() {
    let l = launch(
        &agent("-do it"),
        &endpoint(Runtime::ClaudeCode, Some("gemma")),
        Some(&gw()),
        "/workspace/output.json",
        Some(60),
    )
    .unwrap();
    assert_eq!(l.request.program, crate::runtimes::CLAUDE_BIN);
    assert_eq!(&l.request.args[..2], ["-p", "-do it"]);
    assert!(l
        .request
        .args
        .ends_with(&["--model".into(), "gemma".into()]));
    let env = |k: &str| {
        l.request
            .env
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(env("ANTHROPIC_BASE_URL"), Some("http://10.0.2.2:4321/v1"));
    assert_eq!(env("ANTHROPIC_API_KEY"), Some("vbx-placeholder"));
    assert_eq!(env("HOME"), Some(HOME));
    assert!(env("PATH")
        .unwrap()
        .starts_with("/opt/voidbox/runtimes/npm/claude/bin:"));
    assert!(env("PATH")
        .unwrap()
        .ends_with(":/opt/voidbox/runtimes/npm/bash/bin"));
    assert_eq!(
        env("SHELL"),
        Some("/opt/voidbox/runtimes/npm/bash/bin/bash")
    );
    assert_eq!(l.request.workdir.as_deref(), Some(WORKDIR));
    assert_eq!(l.format, Format::ClaudeStreamJson);
    assert_eq!(l.files[0].path, "/home/sandbox/.claude.json");
    assert_eq!(l.layout.skills_dir(), "/home/sandbox/.claude/skills");
}

#[test]
fn codex_gets_a_config_naming_the_gateway() {
    let l = launch(
        &agent("--help"),
        &endpoint(Runtime::Codex, Some("m\"x")),
        Some(&gw()),
        "/workspace/output.json",
        None,
    )
    .unwrap();
    assert_eq!(l.request.program, crate::runtimes::CODEX_BIN);
    // A prompt that looks like a flag stays the prompt.
    assert_eq!(l.request.args[l.request.args.len() - 2..], ["--", "--help"]);
    let cfg = String::from_utf8(l.files[0].data.clone()).unwrap();
    assert!(cfg.contains("model = \"m\\\"x\"\n"), "{cfg}");
    assert!(
        cfg.contains("base_url = \"http://10.0.2.2:4321/v1\""),
        "{cfg}"
    );
    assert!(cfg.contains("wire_api = \"responses\""), "{cfg}");
    assert!(cfg.contains("env_key = \"VOIDBOX_GATEWAY_TOKEN\""), "{cfg}");
    assert!(
        !cfg.contains("vbx-placeholder"),
        "the token is in the environment only"
    );
    assert!(l
        .request
        .env
        .contains(&(CODEX_TOKEN_ENV.into(), "vbx-placeholder".into())));
    assert_eq!(l.format, Format::CodexExecJson);
    assert_eq!(l.layout.skills_dir(), "/home/sandbox/.codex/skills");
}

#[test]
fn real_runtimes_need_a_gateway_and_the_mock_does_not() {
    let e = launch(
        &agent("x"),
        &endpoint(Runtime::Codex, None),
        None,
        "/workspace/o",
        None,
    )
    .unwrap_err();
    assert!(e.contains("gateway"), "{e}");
    let l = launch(
        &agent("x"),
        &endpoint(Runtime::Mock, None),
        None,
        "/workspace/o",
        None,
    )
    .unwrap();
    assert_eq!(l.request.program, MOCK_RUNTIME);
    assert!(l.files.is_empty());
}

#[test]
fn mcp_servers_reach_both_runtimes_configs() {
    let mut a = agent("x");
    a.skills = vec![
        SkillEntry::Simple("file:s".into()),
        SkillEntry::Mcp(McpSkill {
            mcp: "echo".into(),
            command: "/home/sandbox/.claude/skills/echo/scripts/server.sh".into(),
            args: vec!["--stdio".into()],
            env: [("LEVEL".to_string(), "1".to_string())].into(),
        }),
    ];
    let l = launch(
        &a,
        &endpoint(Runtime::ClaudeCode, None),
        Some(&gw()),
        "/workspace/o",
        None,
    )
    .unwrap();
    let i = l
        .request
        .args
        .iter()
        .position(|x| x == "--mcp-config")
        .unwrap();
    assert_eq!(l.request.args[i + 1], CLAUDE_MCP_CONFIG);
    assert_eq!(l.request.args[i + 2], "--strict-mcp-config");
    let cfg: serde_json::Value = serde_json::from_slice(&l.files[1].data).unwrap();
    assert_eq!(
        cfg["mcpServers"]["echo"],
        serde_json::json!({"type": "stdio", "command": "/home/sandbox/.claude/skills/echo/scripts/server.sh", "args": ["--stdio"], "env": {"LEVEL": "1"}})
    );
    let l = launch(
        &a,
        &endpoint(Runtime::Codex, None),
        Some(&gw()),
        "/workspace/o",
        None,
    )
    .unwrap();
    let cfg = String::from_utf8(l.files[0].data.clone()).unwrap();
    assert!(
        cfg.contains("\n[mcp_servers.\"echo\"]\ncommand = \"/home/sandbox/.claude/skills/echo/scripts/server.sh\"\nargs = [\"--stdio\"]\nenv = { \"LEVEL\" = \"1\" }\n"),
        "{cfg}"
    );
    // Without MCP servers Claude Code gets no MCP flags.
    let l = launch(
        &agent("x"),
        &endpoint(Runtime::ClaudeCode, None),
        Some(&gw()),
        "/workspace/o",
        None,
    )
    .unwrap();
    assert!(!l.request.args.iter().any(|x| x == "--mcp-config"));
}

#[test]
fn claude_code_opens_its_terminal_ui_with_the_prompt_and_no_dialogs() {
    let task = launch(
        &agent("-do it"),
        &endpoint(Runtime::ClaudeCode, Some("gemma")),
        Some(&gw()),
        "/workspace/o",
        None,
    )
    .unwrap();
    let l = launch_interactive(
        &agent("-do it"),
        &endpoint(Runtime::ClaudeCode, Some("gemma")),
        &gw(),
        WORKDIR,
    )
    .unwrap();
    assert_eq!(l.request.program, crate::runtimes::CLAUDE_BIN);
    // No headless flags; the prompt is the first message, after `--`.
    assert_eq!(
        l.request.args,
        [
            "--dangerously-skip-permissions",
            "--model",
            "gemma",
            "--",
            "-do it"
        ]
    );
    // The same environment (gateway, placeholder, bash) as a task, and no timeout.
    assert_eq!(l.request.env, task.request.env);
    assert_eq!(l.request.workdir.as_deref(), Some(WORKDIR));
    assert_eq!(l.request.timeout_secs, None);
    let state: serde_json::Value = serde_json::from_slice(&l.files[0].data).unwrap();
    assert_eq!(l.files[0].path, "/home/sandbox/.claude.json");
    assert_eq!(state["hasCompletedOnboarding"], true);
    assert_eq!(state["bypassPermissionsModeAccepted"], true);
    assert_eq!(
        state["projects"]["/workspace"]["hasTrustDialogAccepted"],
        true
    );
    // Claude Code remembers an approved key by its last 20 characters.
    assert_eq!(
        state["customApiKeyResponses"]["approved"],
        serde_json::json!(["vbx-placeholder"])
    );
    let long = claude_interactive_state("sk-0123456789abcdefghijklmnop", "/w");
    let long: serde_json::Value = serde_json::from_str(&long).unwrap();
    assert_eq!(
        long["customApiKeyResponses"]["approved"],
        serde_json::json!(["6789abcdefghijklmnop"])
    );
    assert_eq!(long["projects"]["/w"]["hasTrustDialogAccepted"], true);
    assert_eq!(l.files[1].path, "/home/sandbox/.claude/settings.json");
    assert_eq!(l.layout.skills_dir(), "/home/sandbox/.claude/skills");
    // An empty prompt opens an empty session; MCP servers keep their strict config.
    let mut a = agent("  ");
    a.skills = vec![SkillEntry::Mcp(McpSkill {
        mcp: "echo".into(),
        command: "/bin/echo-server".into(),
        args: Vec::new(),
        env: Default::default(),
    })];
    let l = launch_interactive(&a, &endpoint(Runtime::ClaudeCode, None), &gw(), "/src").unwrap();
    assert_eq!(
        l.request.args,
        [
            "--dangerously-skip-permissions",
            "--mcp-config",
            CLAUDE_MCP_CONFIG,
            "--strict-mcp-config"
        ]
    );
    assert_eq!(l.request.workdir.as_deref(), Some("/src"));
    assert!(l.files.iter().any(|f| f.path == CLAUDE_MCP_CONFIG));
}

#[test]
fn codex_opens_its_tui_and_the_mock_cannot() {
    let l = launch_interactive(
        &agent("--help"),
        &endpoint(Runtime::Codex, Some("gpt-x")),
        &gw(),
        WORKDIR,
    )
    .unwrap();
    assert_eq!(l.request.program, crate::runtimes::CODEX_BIN);
    assert_eq!(
        l.request.args,
        ["--no-daemon", "-m", "gpt-x", "--", "--help"]
    );
    assert!(!l.request.args.iter().any(|a| a == "exec" || a == "--json"));
    assert!(l
        .request
        .env
        .contains(&(CODEX_TOKEN_ENV.into(), "vbx-placeholder".into())));
    let cfg = String::from_utf8(l.files[0].data.clone()).unwrap();
    assert_eq!(l.files[0].path, "/home/sandbox/.codex/config.toml");
    // The task's configuration, with the working directory trusted.
    assert!(
        cfg.starts_with(&codex_config(Some("gpt-x"), "http://10.0.2.2:4321/v1", &[])),
        "{cfg}"
    );
    assert!(
        cfg.ends_with("\n[projects.\"/workspace\"]\ntrust_level = \"trusted\"\n"),
        "{cfg}"
    );
    assert!(!cfg.contains("vbx-placeholder"));
    let l =
        launch_interactive(&agent(""), &endpoint(Runtime::Codex, None), &gw(), WORKDIR).unwrap();
    assert_eq!(l.request.args, ["--no-daemon"]);
    let e = launch_interactive(&agent("x"), &endpoint(Runtime::Mock, None), &gw(), WORKDIR)
        .unwrap_err();
    assert!(e.contains("no interactive mode"), "{e}");
}

#[test]
fn toml_strings_are_escaped() {
    assert_eq!(toml_string("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
}

#[test]
fn an_image_path_follows_the_runtimes_directories() {
    let runtime = vec![
        ("HOME".to_string(), HOME.to_string()),
        (
            "PATH".to_string(),
            format!("/opt/voidbox/runtimes/npm/claude/bin:{SYSTEM_PATH}:/opt/voidbox/runtimes/npm/bash/bin"),
        ),
    ];
    let image = vec![
        (
            "PATH".to_string(),
            "/usr/local/python/bin:/usr/bin:/bin".to_string(),
        ),
        ("LANG".to_string(), "C.UTF-8".to_string()),
        ("HOME".to_string(), "/root".to_string()),
    ];
    let env = merge_env(runtime.clone(), image);
    assert_eq!(
        env,
        [
            ("HOME".to_string(), HOME.to_string()),
            (
                "PATH".to_string(),
                "/opt/voidbox/runtimes/npm/claude/bin:/opt/voidbox/runtimes/npm/bash/bin:/usr/local/python/bin:/usr/bin:/bin".to_string()
            ),
            ("LANG".to_string(), "C.UTF-8".to_string()),
        ]
    );
    // Without a node PATH the runtime's stays whole.
    assert_eq!(merge_env(runtime.clone(), vec![]), runtime);
}
