//! The parser on real output of both CLIs (testdata/, recorded against the scripted LLM
//! server: see testdata/README.md) and on hostile streams.

use super::*;

const CLAUDE_TEXT: &str = include_str!("testdata/claude/text.jsonl");
const CLAUDE_TOOL: &str = include_str!("testdata/claude/tool.jsonl");
const CLAUDE_500: &str = include_str!("testdata/claude/error-500.jsonl");
const CLAUDE_401: &str = include_str!("testdata/claude/error-401.jsonl");
const CLAUDE_MAX_TURNS: &str = include_str!("testdata/claude/max-turns.jsonl");
const CLAUDE_RETRY: &str = include_str!("testdata/claude/retry-then-ok.jsonl");
const CODEX_TEXT: &str = include_str!("testdata/codex/text.jsonl");
const CODEX_TOOL: &str = include_str!("testdata/codex/tool.jsonl");
const CODEX_500: &str = include_str!("testdata/codex/error-500.jsonl");
const CODEX_401: &str = include_str!("testdata/codex/error-401.jsonl");
const CODEX_RETRY: &str = include_str!("testdata/codex/retry-then-ok.jsonl");
const CLAUDE_HELD_TEXT: &str = include_str!("testdata/claude-held/text.jsonl");
const CLAUDE_HELD_TOOL: &str = include_str!("testdata/claude-held/tool.jsonl");
const APP_TEXT: &str = include_str!("testdata/codex-app/text.jsonl");
const APP_TOOL: &str = include_str!("testdata/codex-app/tool.jsonl");
const APP_500: &str = include_str!("testdata/codex-app/error-500.jsonl");
const APP_401: &str = include_str!("testdata/codex-app/error-401.jsonl");
const APP_RETRY: &str = include_str!("testdata/codex-app/retry-then-ok.jsonl");
/// The mock runtime's stream (claude-code style), parsed by the parser this one replaces.
const MOCK: &str = include_str!("../apply/testdata/mock-stream.jsonl");

const CODEX_MODEL_WARNING: &str = "Model metadata for `gpt-5.1-codex` not found. Defaulting to fallback metadata; this can degrade performance and cause issues.";

fn parse(format: Format, data: &str) -> AgentOutcome {
    let mut p = OutputParser::with_default_cap(format);
    p.push(data.as_bytes());
    p.finish()
}

#[test]
fn every_recording_parses_the_same_in_any_chunking() {
    let all = [
        (Format::ClaudeStreamJson, CLAUDE_TEXT),
        (Format::ClaudeStreamJson, CLAUDE_TOOL),
        (Format::ClaudeStreamJson, CLAUDE_500),
        (Format::ClaudeStreamJson, CLAUDE_401),
        (Format::ClaudeStreamJson, CLAUDE_MAX_TURNS),
        (Format::ClaudeStreamJson, CLAUDE_RETRY),
        (Format::CodexExecJson, CODEX_TEXT),
        (Format::CodexExecJson, CODEX_TOOL),
        (Format::CodexExecJson, CODEX_500),
        (Format::CodexExecJson, CODEX_401),
        (Format::CodexExecJson, CODEX_RETRY),
        (Format::ClaudeStreamJson, CLAUDE_HELD_TEXT),
        (Format::ClaudeStreamJson, CLAUDE_HELD_TOOL),
        (Format::CodexAppServer, APP_TEXT),
        (Format::CodexAppServer, APP_TOOL),
        (Format::CodexAppServer, APP_500),
        (Format::CodexAppServer, APP_401),
        (Format::CodexAppServer, APP_RETRY),
    ];
    for (format, data) in all {
        let whole = parse(format, data);
        assert_eq!(whole.events, data.lines().count() as u64);
        assert_eq!(whole.skipped_lines, 0);
        assert!(whole.finished);
        for chunk in [1usize, 7, 4096] {
            let mut p = OutputParser::with_default_cap(format);
            for c in data.as_bytes().chunks(chunk) {
                p.push(c);
            }
            assert_eq!(
                untimed(p.finish()),
                untimed(whole.clone()),
                "chunks of {chunk}"
            );
        }
    }
}

/// `o` with its tool timings' clock readings zeroed (they are when the host read a line).
fn untimed(mut o: AgentOutcome) -> AgentOutcome {
    for t in &mut o.tool_timings {
        t.started = std::time::UNIX_EPOCH;
        t.ended = t.ended.map(|_| std::time::UNIX_EPOCH);
    }
    o
}

/// Every tool call has a timing, in order, ended by its result after its start, with an id.
fn assert_timed(o: &AgentOutcome) {
    let names: Vec<&str> = o.tool_timings.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, o.tool_calls);
    for t in &o.tool_timings {
        assert!(t.id.is_some(), "{t:?}");
        assert!(t.ended.is_some_and(|e| e >= t.started), "{t:?}");
        assert!(!t.is_error, "{t:?}");
    }
}

#[test]
fn claude_text_turn_reports_init_usage_and_result() {
    let o = parse(Format::ClaudeStreamJson, CLAUDE_TEXT);
    assert!(!o.is_error && o.error.is_none() && o.failure().is_none());
    assert_eq!(o.result.as_deref(), Some("All checks passed."));
    assert_eq!(o.model.as_deref(), Some("claude-sonnet-4-5"));
    // The staged skill first, then Claude Code's bundled ones.
    assert_eq!(o.skills.first().map(String::as_str), Some("greet"));
    assert!(o.skills.iter().any(|s| s == "code-review"));
    assert_eq!(o.mcp_servers, ["echo:connected"]);
    assert!(o.tools.iter().any(|t| t == "Bash"));
    assert!(o.tools.iter().any(|t| t == "mcp__echo__echo"));
    assert_eq!(o.tools.len(), 27);
    // Usage: 120 uncached + 30 cache read in, 9 out (the scripted server's numbers).
    assert_eq!(
        (o.input_tokens, o.cached_tokens, o.output_tokens),
        (150, 30, 9)
    );
    assert_eq!(o.turns, 1);
    assert!((o.cost_usd - 0.000504).abs() < 1e-12);
    assert!(o.tool_calls.is_empty() && o.warnings.is_empty());
}

#[test]
fn claude_tool_turns_list_the_calls() {
    let o = parse(Format::ClaudeStreamJson, CLAUDE_TOOL);
    assert!(!o.is_error);
    assert_eq!(o.tool_calls, ["Bash", "mcp__echo__echo"]);
    assert_timed(&o);
    assert_eq!(
        o.result.as_deref(),
        Some("The command printed tool-output-42.")
    );
    assert_eq!(o.turns, 3);
    assert_eq!(
        (o.input_tokens, o.cached_tokens, o.output_tokens),
        (450, 90, 27)
    );
    assert!((o.cost_usd - 0.001512).abs() < 1e-9);
}

#[test]
fn claude_api_errors_arrive_as_success_with_is_error() {
    let o = parse(Format::ClaudeStreamJson, CLAUDE_500);
    assert!(o.finished && o.is_error && o.result.is_none());
    let e = o.error.as_deref().unwrap_or_default();
    assert!(
        e.starts_with("API Error: 500 scripted upstream failure."),
        "{e}"
    );
    assert_eq!(o.failure().as_deref(), Some(e));
    assert_eq!((o.input_tokens, o.output_tokens, o.cost_usd), (0, 0, 0.0));
    // The synthetic error message names no model.
    assert_eq!(o.model.as_deref(), Some("claude-sonnet-4-5"));

    let o = parse(Format::ClaudeStreamJson, CLAUDE_401);
    assert!(o.is_error && o.result.is_none());
    assert_eq!(
        o.error.as_deref(),
        Some("Invalid API key \u{b7} Fix external API key")
    );
}

#[test]
fn claude_max_turns_fails_with_its_errors() {
    let o = parse(Format::ClaudeStreamJson, CLAUDE_MAX_TURNS);
    assert!(o.is_error && o.result.is_none());
    assert_eq!(
        o.error.as_deref(),
        Some("Reached maximum number of turns (1)")
    );
    assert_eq!(o.tool_calls, ["Bash"]);
    assert_eq!((o.turns, o.output_tokens), (2, 9));
}

#[test]
fn claude_retries_are_warnings() {
    let o = parse(Format::ClaudeStreamJson, CLAUDE_RETRY);
    assert!(!o.is_error);
    assert_eq!(o.result.as_deref(), Some("Recovered."));
    assert_eq!(o.warnings, ["API retry 1/1: HTTP 500 server_error"]);
}

#[test]
fn codex_text_turn_reports_usage_and_result() {
    let o = parse(Format::CodexExecJson, CODEX_TEXT);
    assert!(!o.is_error && o.failure().is_none());
    assert_eq!(o.result.as_deref(), Some("All checks passed."));
    // Codex counts cached tokens inside input_tokens.
    assert_eq!(
        (o.input_tokens, o.cached_tokens, o.output_tokens),
        (150, 30, 9)
    );
    assert_eq!((o.turns, o.cost_usd), (1, 0.0));
    // An unknown model's metadata is a warning, not a failure.
    assert_eq!(o.warnings, [CODEX_MODEL_WARNING]);
    // Codex names no model, skills or MCP servers in its stream.
    assert!(o.model.is_none() && o.skills.is_empty() && o.mcp_servers.is_empty());
}

#[test]
fn codex_tool_items_are_counted_once() {
    let o = parse(Format::CodexExecJson, CODEX_TOOL);
    assert!(!o.is_error);
    assert_eq!(o.tool_calls, ["shell", "mcp__echo__echo"]);
    assert_timed(&o);
    assert_eq!(
        o.result.as_deref(),
        Some("The command printed tool-output-42.")
    );
    assert_eq!(
        (o.input_tokens, o.cached_tokens, o.output_tokens),
        (450, 90, 27)
    );
    assert_eq!(o.turns, 1);
}

/// The stats a report shows, without what only one of Codex's formats tells (the model, MCP
/// servers), the clock readings and the runtime's ids of tool calls.
fn stats(o: &AgentOutcome) -> AgentOutcome {
    let mut o = untimed(o.clone());
    for t in &mut o.tool_timings {
        t.id = None;
    }
    AgentOutcome {
        model: None,
        mcp_servers: Vec::new(),
        events: 0,
        ..o
    }
}

#[test]
fn a_warm_codex_reports_what_codex_exec_reports() {
    // Recorded against the same scripts (testdata/README.md).
    for (app, exec) in [(APP_TEXT, CODEX_TEXT), (APP_TOOL, CODEX_TOOL)] {
        let a = parse(Format::CodexAppServer, app);
        assert_eq!(stats(&a), stats(&parse(Format::CodexExecJson, exec)));
        assert!(a.finished && a.failure().is_none());
        assert_eq!(
            a.model.as_deref(),
            Some("gpt-5.1-codex"),
            "from thread/start"
        );
    }
    let o = parse(Format::CodexAppServer, APP_TOOL);
    assert_eq!(o.tool_calls, ["shell", "mcp__echo__echo"]);
    assert_timed(&o);
    assert_eq!(
        (o.input_tokens, o.cached_tokens, o.output_tokens, o.turns),
        (450, 90, 27, 1)
    );
    assert_eq!(o.warnings, [CODEX_MODEL_WARNING]);
    // Its MCP servers' last status.
    assert_eq!(o.mcp_servers, ["echo:ready"]);
    // The failures fail alike (app-server retried, as `config.toml` allowed).
    for (app, exec) in [(APP_500, CODEX_500), (APP_401, CODEX_401)] {
        let a = parse(Format::CodexAppServer, app);
        let e = parse(Format::CodexExecJson, exec);
        assert!(a.finished && a.is_error && a.result.is_none(), "{a:?}");
        assert_eq!(
            a.error,
            e.error.map(|m| m.replace(&port_of(exec), &port_of(app)))
        );
        assert_eq!((a.input_tokens, a.output_tokens, a.turns), (0, 0, 1));
    }
    let o = parse(Format::CodexAppServer, APP_500);
    assert_eq!(
        o.warnings[..3],
        [
            CODEX_MODEL_WARNING,
            "Reconnecting... 1/2 (We\u{2019}re currently experiencing high demand, which may cause temporary errors.)",
            "Reconnecting... 2/2 (We\u{2019}re currently experiencing high demand, which may cause temporary errors.)",
        ]
    );
    let o = parse(Format::CodexAppServer, APP_RETRY);
    assert!(o.failure().is_none(), "{o:?}");
    assert_eq!(o.result.as_deref(), Some("Recovered."));
}

/// The scripted server's port a recording names (`127.0.0.1:PORT`), or "".
fn port_of(recording: &str) -> String {
    recording
        .split("127.0.0.1:")
        .nth(1)
        .map(|r| r.chars().take_while(char::is_ascii_digit).collect())
        .unwrap_or_default()
}

#[test]
fn a_warm_codex_fails_on_refused_requests_and_unfinished_turns() {
    // A refused request ends it, named.
    let o = parse(
        Format::CodexAppServer,
        r#"{"id":1,"error":{"code":-32600,"message":"invalid cwd"}}"#,
    );
    assert!(o.finished && o.is_error);
    assert_eq!(
        o.error.as_deref(),
        Some("codex app-server refused thread/start: invalid cwd")
    );
    // An interrupted turn without an error of its own.
    let o = parse(
        Format::CodexAppServer,
        r#"{"method":"turn/completed","params":{"turn":{"id":"t","items":[],"status":"interrupted"}}}"#,
    );
    assert_eq!(o.error.as_deref(), Some("the turn ended interrupted"));
    // The stream cut before turn/completed.
    let first: String = APP_TOOL.lines().take(14).collect::<Vec<_>>().join("\n");
    let o = parse(Format::CodexAppServer, &first);
    assert!(!o.finished && !o.is_error, "{o:?}");
    assert_eq!(o.tool_calls, ["shell"]);
    assert!(o
        .failure()
        .unwrap_or_default()
        .contains("without reporting a result"));
    // Requests of the server's are not the parser's.
    let o = parse(
        Format::CodexAppServer,
        r#"{"id":5,"method":"item/tool/requestUserInput","params":{"item":{"type":"commandExecution","id":"x"}}}"#,
    );
    assert!(o.tool_calls.is_empty() && !o.is_error);
}

#[test]
fn a_held_claude_code_reports_like_a_cold_one() {
    // Held on stream-json input, it writes the same events once its user message arrives
    // (the cold recordings had a skill too; held, it offers no TaskCreate/TaskGet/TaskList/
    // TaskUpdate tools).
    for (held, cold) in [
        (CLAUDE_HELD_TEXT, CLAUDE_TEXT),
        (CLAUDE_HELD_TOOL, CLAUDE_TOOL),
    ] {
        let h = parse(Format::ClaudeStreamJson, held);
        assert!(h.finished && h.failure().is_none(), "{h:?}");
        assert!(h.tools.iter().any(|t| t == "Bash"), "{h:?}");
        let c = parse(Format::ClaudeStreamJson, cold);
        let common = |o: &AgentOutcome| AgentOutcome {
            skills: Vec::new(),
            tools: Vec::new(),
            ..stats(o)
        };
        assert_eq!(common(&h), common(&c));
    }
    let o = parse(Format::ClaudeStreamJson, CLAUDE_HELD_TOOL);
    assert_eq!(o.tool_calls, ["Bash", "mcp__echo__echo"]);
    assert_eq!(o.mcp_servers, ["echo:connected"]);
    assert_timed(&o);
}

#[test]
fn codex_failed_turns_fail_with_their_message() {
    let o = parse(Format::CodexExecJson, CODEX_500);
    assert!(o.finished && o.is_error && o.result.is_none());
    assert_eq!(
        o.error.as_deref(),
        Some("We\u{2019}re currently experiencing high demand, which may cause temporary errors.")
    );
    let o = parse(Format::CodexExecJson, CODEX_401);
    assert!(o.is_error);
    let e = o.failure().unwrap_or_default();
    assert!(
        e.starts_with("unexpected status 401 Unauthorized: invalid x-api-key"),
        "{e}"
    );
    assert_eq!((o.input_tokens, o.output_tokens), (0, 0));
}

#[test]
fn codex_reconnects_followed_by_a_completed_turn_are_warnings() {
    let o = parse(Format::CodexExecJson, CODEX_RETRY);
    assert!(!o.is_error && o.failure().is_none());
    assert_eq!(o.result.as_deref(), Some("Recovered."));
    assert_eq!(o.warnings.len(), 2);
    assert!(o.warnings[1].starts_with("Reconnecting... 1/1"));
    // The same stream cut before the turn completed: the error stands.
    let cut: String = CODEX_RETRY
        .lines()
        .take(4)
        .map(|l| format!("{l}\n"))
        .collect();
    let o = parse(Format::CodexExecJson, &cut);
    assert!(o.is_error && !o.finished);
    assert!(o
        .error
        .unwrap_or_default()
        .starts_with("Reconnecting... 1/1"));
    // A top-level error alone (Codex failing before any turn) fails too.
    let o = parse(
        Format::CodexExecJson,
        "{\"type\":\"error\",\"message\":\"no provider\"}",
    );
    assert_eq!(o.failure().as_deref(), Some("no provider"));
}

#[test]
fn the_mock_runtime_stream_still_parses() {
    let o = parse(Format::ClaudeStreamJson, MOCK);
    assert!(o.finished && !o.is_error);
    assert_eq!(o.model.as_deref(), Some("voidbox-mock-1"));
    assert_eq!(o.tool_calls, ["Skill", "Read", "Write"]);
    assert!(o.input_tokens > 0 && o.output_tokens > 0 && o.cost_usd > 0.0);
    assert!(o.result.unwrap_or_default().starts_with("mock result for"));
}

#[test]
fn a_stream_without_its_final_event_fails() {
    let first: String = CLAUDE_TOOL.lines().take(3).collect::<Vec<_>>().join("\n");
    let o = parse(Format::ClaudeStreamJson, &first);
    assert!(!o.finished && !o.is_error);
    assert_eq!(o.tool_calls, ["Bash"]);
    assert!(o
        .failure()
        .unwrap_or_default()
        .contains("without reporting a result"));
    let first: String = CODEX_TOOL.lines().take(5).collect::<Vec<_>>().join("\n");
    let o = parse(Format::CodexExecJson, &first);
    assert!(!o.finished && !o.is_error);
    assert_eq!(o.tool_calls, ["shell"]);
    assert!(o.failure().is_some());
}

#[test]
fn without_is_error_the_subtype_decides() {
    let o = parse(
        Format::ClaudeStreamJson,
        "{\"type\":\"result\",\"subtype\":\"error_during_execution\",\"total_cost_usd\":-1}\n",
    );
    assert!(o.is_error && o.cost_usd == 0.0);
    assert_eq!(
        o.error.as_deref(),
        Some("the agent runtime failed: error_during_execution")
    );
    // With is_error, the subtype is not trusted either way.
    let o = parse(
        Format::ClaudeStreamJson,
        "{\"type\":\"result\",\"subtype\":\"error_x\",\"is_error\":false,\"result\":\"ok\"}",
    );
    assert!(!o.is_error && o.result.as_deref() == Some("ok"));
}

#[test]
fn hostile_streams_are_bounded() {
    for format in [
        Format::ClaudeStreamJson,
        Format::CodexExecJson,
        Format::CodexAppServer,
    ] {
        let mut p = OutputParser::with_default_cap(format);
        p.push(&vec![
            b'{';
            2 * DEFAULT_MAX_OUTPUT as usize + (64 << 10) + 10
        ]);
        p.push(b"\nnot json\n[1,2]\n\"s\"\n\xff\xfe\n{\"type\":7}\n");
        let name = "n".repeat(10_000);
        let many: Vec<serde_json::Value> = (0..1000)
            .map(|i| serde_json::json!({"name": format!("{name}{i}"), "status": "ok"}))
            .collect();
        let init = serde_json::json!({"type": "system", "subtype": "init", "model": name,
            "skills": vec![name.clone(); 1000], "mcp_servers": many});
        p.push(format!("{init}\n").as_bytes());
        for i in 0..1000 {
            let l = match format {
                Format::ClaudeStreamJson => serde_json::json!({"type": "assistant", "message":
                    {"content": [{"type": "tool_use", "name": name}]}}),
                Format::CodexExecJson => serde_json::json!({"type": "item.started", "item":
                    {"id": format!("i{i}"), "type": "command_execution"}}),
                Format::CodexAppServer => serde_json::json!({"method": "item/started",
                    "params": {"item": {"id": format!("i{i}"), "type": "mcpToolCall",
                    "server": name, "tool": "t"}}}),
            };
            p.push(format!("{l}\n").as_bytes());
        }
        let o = p.finish();
        assert_eq!(o.skipped_lines, 1);
        assert_eq!(o.events, 1 + 1 + 1000);
        assert_eq!(o.tool_calls.len(), MAX_LIST);
        assert!(o.tool_calls.iter().all(|t| t.chars().count() <= MAX_NAME));
        assert!(o.failure().is_some());
        if format == Format::ClaudeStreamJson {
            assert_eq!(o.skills.len(), MAX_LIST);
            assert_eq!(o.mcp_servers.len(), MAX_LIST);
            assert!(o.mcp_servers[0].ends_with(":ok") && o.mcp_servers[0].len() < 2 * MAX_NAME);
            assert_eq!(o.model.map(|m| m.len()), Some(MAX_NAME));
        }
    }
}

fn claude_result(text: &str) -> Vec<u8> {
    let mut l = serde_json::to_vec(&serde_json::json!({
        "type": "result", "subtype": "success", "is_error": false, "result": text
    }))
    .unwrap_or_default();
    l.push(b'\n');
    l
}

fn codex_result(text: &str) -> Vec<u8> {
    let mut l = serde_json::to_vec(&serde_json::json!({
        "type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": text}
    }))
    .unwrap_or_default();
    l.extend_from_slice(b"\n{\"type\":\"turn.completed\",\"usage\":{}}\n");
    l
}

#[test]
fn the_result_is_kept_whole_up_to_the_output_cap() {
    // Characters that JSON escapes, far beyond any small cut.
    let text: String = "line \"quoted\"\t\u{e9}\n".repeat(40_000);
    for (format, line) in [
        (
            Format::ClaudeStreamJson,
            claude_result as fn(&str) -> Vec<u8>,
        ),
        (Format::CodexExecJson, codex_result),
    ] {
        let mut p = OutputParser::new(format, text.len() as u64);
        for c in line(&text).chunks(65536) {
            p.push(c);
        }
        let o = p.finish();
        assert!(o.finished && o.failure().is_none());
        assert_eq!(o.result.as_deref(), Some(text.as_str()));
        // One byte over the cap: an error naming the cap, never a cut result.
        let mut p = OutputParser::new(format, text.len() as u64 - 1);
        p.push(&line(&text));
        let o = p.finish();
        assert_eq!(
            (o.result.as_deref(), o.result_over_cap),
            (None, Some(text.len() as u64))
        );
        let e = o.failure().unwrap_or_default();
        assert!(
            e.contains("the agent's result") && e.contains("--max-output"),
            "{e}"
        );
        // A result line beyond twice the cap is skipped and said so.
        let mut p = OutputParser::new(format, 10);
        p.push(&line(&"x".repeat(MAX_LINE + 1)));
        let o = p.finish();
        assert_eq!((o.result.as_deref(), o.skipped_lines), (None, 1));
        if format == Format::ClaudeStreamJson {
            assert!(!o.finished);
            assert!(o.failure().unwrap_or_default().contains("--max-output"));
        }
    }
}
