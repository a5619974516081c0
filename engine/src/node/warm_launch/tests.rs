//! The warm launches, the conversation drivers on recorded real output
//! (`agent_output/testdata/{claude-held,codex-app}/`), and the real runtimes held and driven
//! on the host against the scripted model server.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::node::launch::HOME;
use voidbox_llm_script::{Script, Server, Turn, Usage};

use super::*;
use crate::agent_output::{AgentOutcome, OutputParser};
use crate::spec::model::{Llm, McpSkill, Provider, SkillEntry};

const PROMPT: &str = "Run the check.";

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
        base_url: "http://10.0.3.254/v1".into(),
        token: "vbx-placeholder".into(),
    }
}

fn env<'a>(r: &'a ExecRequest, k: &str) -> Option<&'a str> {
    r.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

/// Nothing of the prompt anywhere in the held process or its files.
fn assert_no_prompt(w: &WarmLaunch, prompt: &str) {
    let r = &w.request;
    assert!(!r.args.iter().any(|a| a.contains(prompt)), "{:?}", r.args);
    assert!(!r
        .env
        .iter()
        .any(|(k, v)| v.contains(prompt) || k == "VOIDBOX_NODE"));
    assert!(!String::from_utf8_lossy(&r.stdin).contains(prompt));
    for f in &w.files {
        assert!(
            !String::from_utf8_lossy(&f.data).contains(prompt),
            "{}",
            f.path
        );
    }
    assert_eq!(
        r.timeout_secs, None,
        "a held process has no deadline of its own"
    );
}

#[test]
fn claude_code_is_held_on_stream_json_input_without_its_prompt() {
    let prompt = "xyzzy-prompt-4711";
    let w = warm_launch(
        &agent(prompt),
        &endpoint(Runtime::ClaudeCode, Some("gemma")),
        &gw(),
    )
    .unwrap();
    assert_eq!(w.request.program, crate::runtimes::CLAUDE_BIN);
    assert_eq!(
        w.request.args,
        [
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            "--model",
            "gemma"
        ]
    );
    assert_eq!(
        env(&w.request, "ANTHROPIC_BASE_URL"),
        Some("http://10.0.3.254/v1")
    );
    assert_eq!(
        env(&w.request, "ANTHROPIC_API_KEY"),
        Some("vbx-placeholder")
    );
    assert_eq!(w.request.workdir.as_deref(), Some(WORKDIR));
    assert!(w.request.stdin.is_empty());
    assert_eq!(w.format, Format::ClaudeStreamJson);
    assert_eq!(w.layout, Layout::of(Runtime::ClaudeCode));
    assert_eq!(w.runtime, Runtime::ClaudeCode);
    assert_eq!(w.files[0].path, format!("{HOME}/.claude.json"));
    assert_no_prompt(&w, prompt);

    // MCP servers as in the cold launch.
    let mut a = agent(prompt);
    a.skills.push(SkillEntry::Mcp(McpSkill {
        mcp: "echo".into(),
        command: "echo-server".into(),
        args: Vec::new(),
        env: BTreeMap::new(),
    }));
    let w = warm_launch(&a, &endpoint(Runtime::ClaudeCode, None), &gw()).unwrap();
    assert!(w.request.args.ends_with(&[
        "--mcp-config".into(),
        super::super::launch::CLAUDE_MCP_CONFIG.into(),
        "--strict-mcp-config".into()
    ]));
    assert!(w
        .files
        .iter()
        .any(|f| f.path == super::super::launch::CLAUDE_MCP_CONFIG));
}

#[test]
fn codex_is_held_as_an_initialised_app_server() {
    let prompt = "xyzzy-prompt-4711";
    let w = warm_launch(
        &agent(prompt),
        &endpoint(Runtime::Codex, Some("gpt-x")),
        &gw(),
    )
    .unwrap();
    assert_eq!(w.request.program, crate::runtimes::CODEX_BIN);
    assert_eq!(w.request.args, ["app-server"]);
    assert_eq!(
        env(&w.request, "CODEX_HOME"),
        Some(super::super::launch::CODEX_HOME)
    );
    assert_eq!(
        env(&w.request, super::super::launch::CODEX_TOKEN_ENV),
        Some("vbx-placeholder")
    );
    assert_eq!(w.format, Format::CodexAppServer);
    assert_eq!(w.layout, Layout::of(Runtime::Codex));
    let stdin = String::from_utf8(w.request.stdin.clone()).unwrap();
    let lines: Vec<Value> = stdin
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["method"], "initialize");
    assert_eq!(lines[0]["id"], 0);
    assert_eq!(lines[0]["params"]["clientInfo"]["name"], "voidbox");
    assert!(
        lines[0]["params"]["capabilities"]["optOutNotificationMethods"]
            .as_array()
            .unwrap()
            .contains(&json!("item/agentMessage/delta"))
    );
    assert_eq!(lines[1], json!({"jsonrpc": "2.0", "method": "initialized"}));
    let config = String::from_utf8(w.files[0].data.clone()).unwrap();
    assert!(
        config.contains("base_url = \"http://10.0.3.254/v1\""),
        "{config}"
    );
    assert!(config.contains("approval_policy = \"never\""), "{config}");
    assert!(
        config.contains("sandbox_mode = \"danger-full-access\""),
        "{config}"
    );
    assert_no_prompt(&w, prompt);
}

#[test]
fn the_mock_and_interactive_agents_start_cold() {
    let e = warm_launch(&agent("p"), &endpoint(Runtime::Mock, None), &gw()).unwrap_err();
    assert_eq!(e, ColdReason(MOCK_COLD.into()));
    assert_eq!(
        e.to_string(),
        "the mock runtime starts in milliseconds: nothing to keep warm"
    );
    for runtime in [Runtime::ClaudeCode, Runtime::Codex] {
        let mut a = agent("p");
        a.mode = AgentMode::Interactive;
        let e = warm_launch(&a, &endpoint(runtime, None), &gw()).unwrap_err();
        assert_eq!(e.0, INTERACTIVE_COLD);
        a.mode = AgentMode::Service;
        assert!(warm_launch(&a, &endpoint(runtime, None), &gw()).is_ok());
    }
}

/// Lines the conversation writes when fed `transcript` line by line, and whether it finished
/// (and after which line).
fn replay(c: &mut dyn Conversation, transcript: &str) -> (Vec<Value>, Option<usize>) {
    let mut written = Vec::new();
    let mut done_at = None;
    let take = |bytes: Vec<u8>, written: &mut Vec<Value>| {
        for l in String::from_utf8(bytes).unwrap().lines() {
            written.push(serde_json::from_str(l).unwrap());
        }
    };
    take(c.start(), &mut written);
    for (i, l) in transcript.lines().enumerate() {
        assert!(!c.finished(), "finished before line {i}");
        let out = c.on_line(l.as_bytes());
        take(out, &mut written);
        if c.finished() && done_at.is_none() {
            done_at = Some(i);
            break;
        }
    }
    (written, done_at)
}

const CLAUDE_HELD_TOOL: &str = include_str!("../../agent_output/testdata/claude-held/tool.jsonl");
const CLAUDE_HELD_TEXT: &str = include_str!("../../agent_output/testdata/claude-held/text.jsonl");
const CODEX_APP_TOOL: &str = include_str!("../../agent_output/testdata/codex-app/tool.jsonl");
const CODEX_APP_500: &str = include_str!("../../agent_output/testdata/codex-app/error-500.jsonl");

#[test]
fn claude_conversation_is_one_user_message_until_the_result() {
    for transcript in [CLAUDE_HELD_TEXT, CLAUDE_HELD_TOOL] {
        let mut c = conversation(Runtime::ClaudeCode, "say \"hi\"\nthen stop", None, None);
        let (written, done_at) = replay(c.as_mut(), transcript);
        assert_eq!(
            written,
            [
                json!({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "say \"hi\"\nthen stop"}]}})
            ]
        );
        // Done at the last line: the `result` event.
        assert_eq!(done_at, Some(transcript.lines().count() - 1));
        assert!(c.finished());
    }
}

#[test]
fn codex_conversation_starts_a_thread_then_the_turn() {
    for (transcript, label) in [(CODEX_APP_TOOL, "tool"), (CODEX_APP_500, "500")] {
        let mut c = conversation(Runtime::Codex, PROMPT, Some("gpt-x"), None);
        let (written, done_at) = replay(c.as_mut(), transcript);
        let thread = transcript
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|v| v["id"] == 1)
            .unwrap()["result"]["thread"]["id"]
            .clone();
        assert!(thread.is_string());
        assert_eq!(
            written,
            [
                json!({"jsonrpc": "2.0", "id": 1, "method": "thread/start", "params": {"cwd": WORKDIR, "approvalPolicy": "never", "sandbox": "danger-full-access", "model": "gpt-x"}}),
                json!({"jsonrpc": "2.0", "id": 2, "method": "turn/start", "params": {"threadId": thread, "input": [{"type": "text", "text": PROMPT}]}}),
            ],
            "{label}"
        );
        let last = transcript.lines().count() - 1;
        assert_eq!(done_at, Some(last), "{label}: done at turn/completed");
        assert!(transcript
            .lines()
            .nth(last)
            .unwrap()
            .contains("\"turn/completed\""));
    }
}

#[test]
fn codex_conversation_answers_server_requests_and_ends_on_refusals() {
    let mut c = conversation(Runtime::Codex, PROMPT, None, None);
    let _ = c.start();
    // Replayed held output: the initialize answer needs nothing.
    assert!(c
        .on_line(br#"{"id":0,"result":{"userAgent":"voidbox/0.169.0"}}"#)
        .is_empty());
    assert!(c.on_line(b"not json").is_empty());
    let out = c.on_line(
        br#"{"id":7,"method":"item/commandExecution/requestApproval","params":{"itemId":"x"}}"#,
    );
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["id"], 7);
    assert_eq!(v["error"]["code"], -32601);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("item/commandExecution/requestApproval"));
    assert!(!c.finished());
    assert!(c
        .on_line(br#"{"id":1,"error":{"code":-32600,"message":"bad cwd"}}"#)
        .is_empty());
    assert!(c.finished());

    let mut c = conversation(Runtime::Codex, PROMPT, None, None);
    let _ = c.start();
    c.on_line(br#"{"id":0,"error":{"code":-32600,"message":"Not initialized"}}"#);
    assert!(c.finished(), "a refused initialize (replayed) ends it too");
}

// ---- the real runtimes on the host ----

/// One held run of a real runtime on the host.
struct Case {
    name: &'static str,
    runtime: Runtime,
    script: Script,
    /// With the python3 MCP server `echo` (recordings only).
    mcp: bool,
}

/// What a held run gave.
struct Run {
    outcome: AgentOutcome,
    /// Output while held (before the conversation started).
    held_output: Vec<Value>,
    /// The whole output, as a transcript.
    transcript: Vec<u8>,
    /// From the start to the last CPU use while held (blocked on stdin).
    settle: Duration,
    /// From the first input to the final event.
    answer: Duration,
    /// Model requests made while held.
    requests_while_held: usize,
    server: Server,
}

const USAGE: Usage = Usage {
    input_tokens: 120,
    output_tokens: 9,
    cached_tokens: 30,
};

fn script(turns: Vec<Turn>) -> Script {
    Script {
        usage: USAGE,
        ..Script::new(turns)
    }
}

fn tool_turns() -> Vec<Turn> {
    vec![
        Turn::shell("echo tool-output-$((6*7))"),
        Turn::text("The command printed tool-output-42."),
    ]
}

/// CPU ticks (utime + stime) of all of `pid`'s threads.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let mut total = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(t.ok()?.path().join("stat")).ok()?;
        let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        total += f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Runs `case` held on the host from the runtimes extracted in `rt`, under `dir`.
fn run_held(case: &Case, rt: &Path, dir: &Path) -> Run {
    let server = Server::start(case.script.clone());
    let home = dir.join("home");
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let base_url = match case.runtime {
        Runtime::Codex => server.openai_base_url(),
        _ => server.base_url(),
    };
    let gw = GatewayAccess {
        base_url,
        token: "sk-vbx-test".into(),
    };
    let mut a = agent(PROMPT);
    if case.mcp {
        let py = dir.join("mcp.py");
        std::fs::write(&py, MCP_PY).unwrap();
        a.skills.push(SkillEntry::Mcp(McpSkill {
            mcp: "echo".into(),
            command: "python3".into(),
            args: vec![py.display().to_string()],
            env: BTreeMap::new(),
        }));
    }
    // The models of the cold recordings (testdata/record.sh).
    let model = match case.runtime {
        Runtime::Codex => "gpt-5.1-codex",
        _ => "claude-sonnet-4-5",
    };
    let w = warm_launch(&a, &endpoint(case.runtime, Some(model)), &gw).unwrap();
    // Guest paths to host paths.
    let host = |p: &str| -> PathBuf {
        match p.strip_prefix(HOME) {
            Some(rest) => home.join(rest.trim_start_matches('/')),
            None => PathBuf::from(p),
        }
    };
    for f in &w.files {
        let p = host(&f.path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &f.data).unwrap();
    }
    let mut args = w.request.args.clone();
    for a in &mut args {
        if a.starts_with(HOME) {
            *a = host(a).display().to_string();
        }
    }
    let mut cmd = match case.runtime {
        Runtime::Codex => Command::new(rt.join(crate::runtimes::CODEX_PATH)),
        _ => {
            let mut c = Command::new(rt.join(crate::runtimes::LOADER_PATH));
            c.arg(rt.join(crate::runtimes::CLAUDE_PATH));
            c
        }
    };
    cmd.args(&args).current_dir(&work).env_clear();
    for (k, v) in &w.request.env {
        let v = match k.as_str() {
            "HOME" | "CODEX_HOME" => host(v).display().to_string(),
            "PATH" => std::env::var("PATH").unwrap_or_default(),
            "SHELL" => "/bin/bash".into(),
            _ => v.clone(),
        };
        cmd.env(k, v);
    }
    // As root (CI), Claude Code accepts --dangerously-skip-permissions only in a sandbox.
    cmd.env("IS_SANDBOX", "1");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&w.request.stdin).unwrap();
    stdin.flush().unwrap();
    let (tx, lines) = mpsc::channel::<Vec<u8>>();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for l in BufReader::new(stdout).split(b'\n') {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });

    // Held: wait until it stops using CPU (0.5 s without a tick; 1 tick/s of timers
    // remains for Claude Code), at most 30 s.
    let pid = child.id();
    let (mut last, mut last_change) = (cpu_ticks(pid), t0.elapsed());
    while t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
        let now = cpu_ticks(pid);
        if now != last {
            (last, last_change) = (now, t0.elapsed());
        } else if t0.elapsed() - last_change > Duration::from_millis(500) {
            break;
        }
    }
    let settle = last_change;
    let requests_while_held = server.model_calls().len();
    let mut transcript = Vec::new();
    let mut held_output = Vec::new();
    let mut parser = OutputParser::with_default_cap(w.format);
    let mut conv: Box<dyn Conversation> = match case.runtime {
        Runtime::Codex => Box::new(CodexConversation::new(
            PROMPT,
            None,
            &work.display().to_string(),
        )),
        r => conversation(r, PROMPT, None, None),
    };
    let mut feed =
        |l: Vec<u8>, conv: &mut Box<dyn Conversation>, stdin: &mut std::process::ChildStdin| {
            transcript.extend_from_slice(&l);
            transcript.push(b'\n');
            parser.push(&l);
            parser.push(b"\n");
            let answer = conv.on_line(&l);
            stdin.write_all(&answer).unwrap();
            stdin.flush().unwrap();
        };
    // The held output comes first (replayed at attach in a VM).
    let t1 = Instant::now();
    stdin.write_all(&conv.start()).unwrap();
    stdin.flush().unwrap();
    while let Ok(l) = lines.try_recv() {
        held_output.push(serde_json::from_slice(&l).unwrap());
        feed(l, &mut conv, &mut stdin);
    }
    while !conv.finished() {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => feed(l, &mut conv, &mut stdin),
            Err(e) => panic!("{}: no final event: {e}", case.name),
        }
    }
    let answer = t1.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    drop(stdin);
    let _ = reader.join();
    Run {
        outcome: parser.finish(),
        held_output,
        transcript,
        settle,
        answer,
        requests_while_held,
        server,
    }
}

/// A stdio MCP server with one tool `echo` (as `agent_output/testdata/record.sh`'s).
const MCP_PY: &str = r#"import sys, json
for line in sys.stdin:
    try: m = json.loads(line)
    except Exception: continue
    i = m.get("id"); meth = m.get("method")
    if i is None: continue
    if meth == "initialize":
        r = {"protocolVersion": m["params"].get("protocolVersion", "2024-11-05"),
             "capabilities": {"tools": {}}, "serverInfo": {"name": "echo", "version": "1"}}
    elif meth == "tools/list":
        r = {"tools": [{"name": "echo", "description": "Echo text", "inputSchema":
             {"type": "object", "properties": {"text": {"type": "string"}}}}]}
    elif meth == "tools/call":
        r = {"content": [{"type": "text", "text": m["params"]["arguments"].get("text", "")}]}
    else:
        r = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": i, "result": r}) + "\n"); sys.stdout.flush()
"#;

/// The cases of the test; with `VOIDBOX_RECORD_WARM` set, also the recordings' (MCP needs
/// python3).
fn cases(record: bool) -> Vec<Case> {
    let mut c = vec![
        Case {
            name: "claude-held/tool",
            runtime: Runtime::ClaudeCode,
            script: script(tool_turns()),
            mcp: record,
        },
        Case {
            name: "codex-app/tool",
            runtime: Runtime::Codex,
            script: script(tool_turns()),
            mcp: record,
        },
        Case {
            name: "codex-app/error-500",
            runtime: Runtime::Codex,
            script: script(vec![Turn::error(500, "scripted upstream failure")]),
            mcp: false,
        },
    ];
    if record {
        let mcp_tools = || {
            let mut t = tool_turns();
            t.insert(
                1,
                Turn::Tool {
                    name: Some("mcp__echo__echo".into()),
                    input: json!({"text": "via-mcp"}),
                },
            );
            t
        };
        c[0].script = script(mcp_tools());
        c[1].script = script(mcp_tools());
        c.extend([
            Case {
                name: "claude-held/text",
                runtime: Runtime::ClaudeCode,
                script: script(vec![Turn::text("All checks passed.")]),
                mcp: true,
            },
            Case {
                name: "codex-app/text",
                runtime: Runtime::Codex,
                script: script(vec![Turn::text("All checks passed.")]),
                mcp: true,
            },
            Case {
                name: "codex-app/error-401",
                runtime: Runtime::Codex,
                script: script(vec![Turn::error(401, "invalid x-api-key")]),
                mcp: false,
            },
            Case {
                name: "codex-app/retry-then-ok",
                runtime: Runtime::Codex,
                script: script(vec![
                    Turn::Error {
                        status: 500,
                        message: "scripted upstream failure".into(),
                        times: Some(1),
                    },
                    Turn::text("Recovered."),
                ]),
                mcp: false,
            },
        ]);
    }
    c
}

/// The real thing: Claude Code and Codex from the runtimes disk (the cached one, else
/// fetched like `runtimes_real_pinned_disk_runs_both_clis`), extracted on the host, held
/// with nothing on their input, then driven by the conversations against the scripted
/// model server. `VOIDBOX_RECORD_WARM=DIR` writes the transcripts under DIR (the testdata).
#[test]
fn warm_runtimes_wait_for_their_prompt_then_answer() {
    let disk = crate::runtimes::ensure(&mut |l: &str| eprintln!("runtimes: {l}")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let rt = tmp.path().join("rt");
    let st = Command::new("fsck.erofs")
        .arg(format!("--extract={}", rt.display()))
        .arg(&disk.path)
        .status()
        .unwrap();
    assert!(st.success());
    let record = std::env::var_os("VOIDBOX_RECORD_WARM").map(PathBuf::from);
    for (i, case) in cases(record.is_some()).iter().enumerate() {
        let r = run_held(case, &rt, &tmp.path().join(i.to_string()));
        eprintln!(
            "{}: blocked on stdin {:.2} s after start, final event {:.3} s after the first input",
            case.name,
            r.settle.as_secs_f64(),
            r.answer.as_secs_f64()
        );
        assert_eq!(
            r.requests_while_held, 0,
            "{}: no request while held",
            case.name
        );
        let o = &r.outcome;
        let calls = r.server.model_calls();
        match (case.runtime, case.name.rsplit('/').next().unwrap()) {
            (Runtime::ClaudeCode, _) => {
                assert!(r.held_output.is_empty(), "{:?}", r.held_output);
                // Its session id, chosen at start, in every request.
                let session = calls[0].header("x-claude-code-session-id").unwrap();
                assert!(calls
                    .iter()
                    .all(|c| c.header("x-claude-code-session-id") == Some(session)));
            }
            (Runtime::Codex, _) => {
                // Held: the initialize answer (and status chatter), nothing of a thread.
                assert_eq!(r.held_output[0]["id"], 0, "{:?}", r.held_output);
                assert!(r.held_output[0]["result"]["userAgent"]
                    .as_str()
                    .unwrap()
                    .starts_with("voidbox/"));
                assert!(r
                    .held_output
                    .iter()
                    .all(|v| v.get("params").and_then(|p| p.get("threadId")).is_none()));
                // The thread started after the hold is the session the model sees.
                let t: Value = r
                    .transcript
                    .split(|&b| b == b'\n')
                    .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
                    .find(|v| v["id"] == 1)
                    .unwrap();
                let thread = t["result"]["thread"]["id"].as_str().unwrap();
                assert!(calls.iter().all(|c| c.header("session-id") == Some(thread)));
                assert!(calls
                    .iter()
                    .all(|c| c.header("originator") == Some("voidbox")));
            }
            _ => unreachable!(),
        }
        match case.name.rsplit('/').next().unwrap() {
            "tool" => {
                assert!(o.failure().is_none(), "{}: {o:?}", case.name);
                assert_eq!(
                    o.result.as_deref(),
                    Some("The command printed tool-output-42.")
                );
                let shell = if case.runtime == Runtime::Codex {
                    "shell"
                } else {
                    "Bash"
                };
                assert_eq!(o.tool_calls[0], shell, "{o:?}");
                assert!(
                    o.tool_timings
                        .iter()
                        .all(|t| t.ended.is_some() && !t.is_error),
                    "{o:?}"
                );
                assert!(o.output_tokens >= 18, "{o:?}");
            }
            "error-500" => {
                assert!(o.is_error, "{o:?}");
                assert!(o.finished);
                // Retried as `config.toml` allows, then failed.
                assert!(calls.len() > 1, "{}", calls.len());
                assert!(o.error.as_deref().is_some_and(|e| !e.is_empty()), "{o:?}");
            }
            _ => {}
        }
        if let Some(dir) = &record {
            let path = dir.join(format!("{}.jsonl", case.name));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &r.transcript).unwrap();
        }
    }
}
