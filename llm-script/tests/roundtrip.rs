//! Real HTTP round trips against the scripted server: streamed events parse back into the
//! scripted turns, requests are recorded, errors carry the provider's JSON.

use std::io::{BufRead, BufReader};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use voidbox_llm_script::{Script, Server, Turn, Usage};

struct Answer {
    status: u16,
    content_type: String,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    /// The SSE events as (event name, data JSON).
    fn events(&self) -> Vec<(String, Value)> {
        assert_eq!(self.content_type, "text/event-stream");
        let text = String::from_utf8(self.body.clone()).unwrap();
        text.split("\n\n")
            .filter(|b| !b.trim().is_empty())
            .map(|b| {
                let mut name = None;
                let mut data = None;
                for l in b.lines() {
                    if let Some(n) = l.strip_prefix("event: ") {
                        name = Some(n.to_string());
                    } else if let Some(d) = l.strip_prefix("data: ") {
                        data = Some(serde_json::from_str(d).unwrap());
                    }
                }
                let (name, data): (String, Value) = (name.unwrap(), data.unwrap());
                assert_eq!(data["type"], name.as_str(), "event type matches its name");
                (name, data)
            })
            .collect()
    }
}

async fn call(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", format!("127.0.0.1:{port}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::copy_from_slice(body))).unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Answer {
        status,
        content_type,
        body,
    }
}

async fn post(port: u16, path: &str, key: &str, body: &Value) -> Answer {
    call(
        port,
        "POST",
        path,
        &[("content-type", "application/json"), ("x-api-key", key)],
        body.to_string().as_bytes(),
    )
    .await
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

#[tokio::test]
async fn anthropic_stream_text_then_tool_round_trip() {
    let server = Server::start(Script {
        turns: vec![
            Turn::shell("echo hi-$((1+1))"),
            Turn::text("Done: hi-2, \u{e9}t\u{e9}!"),
        ],
        usage: Usage {
            input_tokens: 11,
            output_tokens: 7,
            cached_tokens: 3,
        },
        expect_key: None,
    });
    let first = json!({"model": "claude-x", "stream": true, "max_tokens": 100,
        "messages": [{"role": "user", "content": "run it"}]});
    let a = post(server.port(), "/v1/messages?beta=true", "k1", &first).await;
    assert_eq!(a.status, 200);
    let ev = a.events();
    let n = names(&ev);
    assert_eq!(
        (n[0], n[1], n[n.len() - 3], n[n.len() - 2], n[n.len() - 1]),
        (
            "message_start",
            "content_block_start",
            "content_block_stop",
            "message_delta",
            "message_stop"
        )
    );
    assert_eq!(ev[0].1["message"]["model"], "claude-x");
    assert_eq!(ev[0].1["message"]["usage"]["cache_read_input_tokens"], 3);
    let block = &ev[1].1["content_block"];
    assert_eq!(
        (&block["type"], &block["name"]),
        (&json!("tool_use"), &json!("Bash"))
    );
    let partial: String = ev
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "input_json_delta");
            d["delta"]["partial_json"].as_str().unwrap().to_string()
        })
        .collect();
    assert!(
        ev.iter()
            .filter(|(n, _)| n == "content_block_delta")
            .count()
            > 1
    );
    let input: Value = serde_json::from_str(&partial).unwrap();
    assert_eq!(input, json!({"command": "echo hi-$((1+1))"}));
    let delta = &ev[n.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"]["output_tokens"], 7);

    // The tool result goes back; position 1 answers the text turn.
    let id = block["id"].as_str().unwrap();
    let second = json!({"model": "claude-x", "stream": true, "messages": [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "Bash", "input": input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "hi-2"}]},
    ]});
    let a = post(server.port(), "/v1/messages", "k2", &second).await;
    let ev = a.events();
    let text: String = ev
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, "Done: hi-2, \u{e9}t\u{e9}!");
    assert_eq!(ev[1].1["content_block"]["type"], "text");
    assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "end_turn");

    let seen = server.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].path, "/v1/messages?beta=true");
    assert_eq!((seen[0].position, seen[0].turn), (Some(0), Some(0)));
    assert_eq!((seen[1].position, seen[1].turn), (Some(1), Some(1)));
    assert_eq!(
        (seen[0].credential(), seen[1].credential()),
        (Some("k1"), Some("k2"))
    );
    assert!(!seen[0].body_contains("hi-2") && seen[1].body_contains("hi-2"));
    assert_eq!(seen[1].header("Content-Type"), Some("application/json"));
    assert_eq!(server.model_calls().len(), 2);
}

#[tokio::test]
async fn anthropic_plain_json_and_named_tools() {
    let server = Server::start(Script::new([
        Turn::Tool {
            name: Some("Read".into()),
            input: json!({"file_path": "/etc/hostname"}),
        },
        Turn::text("ok"),
    ]));
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let a = post(server.port(), "/v1/messages", "k", &body).await;
    assert_eq!(
        (a.status, a.content_type.as_str()),
        (200, "application/json")
    );
    let m = a.json();
    assert_eq!(m["type"], "message");
    assert_eq!(m["stop_reason"], "tool_use");
    assert_eq!(m["content"][0]["name"], "Read");
    assert_eq!(m["content"][0]["input"]["file_path"], "/etc/hostname");
    assert_eq!(m["usage"]["input_tokens"], 20);
    let a = call(
        server.port(),
        "POST",
        "/v1/messages/count_tokens",
        &[],
        b"{\"messages\":[]}",
    )
    .await;
    assert_eq!(a.status, 200);
    assert!(a.json()["input_tokens"].is_u64());
}

fn responses_request(tools: &[&str], input: Value) -> Value {
    let tools: Vec<Value> = tools
        .iter()
        .map(|t| json!({"type": "function", "name": t, "parameters": {}}))
        .collect();
    json!({"model": "gpt-x", "stream": true, "input": input, "tools": tools})
}

#[tokio::test]
async fn openai_responses_stream_function_calls_and_text() {
    let server = Server::start(Script::new([
        Turn::shell("ls -l"),
        Turn::shell("pwd"),
        Turn::Tool {
            name: Some("mcp__echo__echo".into()),
            input: json!({"text": "t"}),
        },
        Turn::text("all done here"),
    ]));
    let user = json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]});
    let call_item = |n: u32| json!({"type": "function_call", "name": "x", "arguments": "{}", "call_id": format!("c{n}")});
    let out_item = |n: u32| json!({"type": "function_call_output", "call_id": format!("c{n}"), "output": format!("out-{n}")});

    // Position 0: Codex's unified exec tool.
    let a = post(
        server.port(),
        "/v1/responses",
        "k",
        &responses_request(&["exec_command", "shell"], json!([user])),
    )
    .await;
    let ev = a.events();
    let n = names(&ev);
    assert_eq!(n[0], "response.created");
    assert_eq!(n[n.len() - 1], "response.completed");
    assert!(n.contains(&"response.output_item.added") && n.contains(&"response.output_item.done"));
    let done = &ev
        .iter()
        .find(|(n, _)| n == "response.output_item.done")
        .unwrap()
        .1["item"];
    assert_eq!(done["type"], "function_call");
    assert_eq!(done["name"], "exec_command");
    let args: Value = serde_json::from_str(done["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"cmd": "ls -l"}));
    let streamed: String = ev
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, done["arguments"].as_str().unwrap());
    let seqs: Vec<u64> = ev
        .iter()
        .map(|(_, d)| d["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..ev.len() as u64).collect::<Vec<_>>());
    let usage = &ev[n.len() - 1].1["response"]["usage"];
    assert_eq!(
        (
            usage["input_tokens"].as_u64(),
            usage["output_tokens"].as_u64()
        ),
        (Some(20), Some(5))
    );
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 0);

    // Position 1: the older `shell` tool takes an argv.
    let input = json!([user, call_item(1), out_item(1)]);
    let a = post(
        server.port(),
        "/v1/responses",
        "k",
        &responses_request(&["shell"], input),
    )
    .await;
    let done = a
        .events()
        .into_iter()
        .find(|(n, _)| n == "response.output_item.done")
        .unwrap()
        .1;
    assert_eq!(done["item"]["name"], "shell");
    let args: Value = serde_json::from_str(done["item"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"command": ["bash", "-lc", "pwd"]}));

    // Position 2: an MCP tool inside the namespace Codex offers for its server.
    let mut req = responses_request(
        &["exec_command"],
        json!([user, call_item(1), out_item(1), call_item(2), out_item(2)]),
    );
    req["tools"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "namespace", "name": "mcp__echo",
        "tools": [{"type": "function", "name": "echo", "parameters": {}}]}));
    let a = post(server.port(), "/v1/responses", "k", &req).await;
    let done = a
        .events()
        .into_iter()
        .find(|(n, _)| n == "response.output_item.done")
        .unwrap()
        .1;
    assert_eq!(
        (&done["item"]["namespace"], &done["item"]["name"]),
        (&json!("mcp__echo"), &json!("echo"))
    );

    // Position 3: text, streamed in deltas.
    let input = json!([
        user,
        call_item(1),
        out_item(1),
        call_item(2),
        out_item(2),
        call_item(3),
        out_item(3)
    ]);
    let a = post(
        server.port(),
        "/v1/responses",
        "k",
        &responses_request(&[], input),
    )
    .await;
    let ev = a.events();
    let text: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, "all done here");
    let completed = &ev.last().unwrap().1["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(
        completed["output"][0]["content"][0]["text"],
        "all done here"
    );

    let seen = server.requests();
    let positions: Vec<Option<usize>> = seen.iter().map(|r| r.position).collect();
    assert_eq!(positions, [Some(0), Some(1), Some(2), Some(3)]);
    assert!(seen[3].body_contains("out-3") && !seen[0].body_contains("out-1"));
}

#[tokio::test]
async fn openai_plain_json() {
    let server = Server::start(Script::new([Turn::text("hello")]));
    let mut req = responses_request(&[], json!("hi"));
    req["stream"] = json!(false);
    let a = post(server.port(), "/v1/responses", "k", &req).await;
    assert_eq!(a.status, 200);
    let r = a.json();
    assert_eq!(
        (&r["object"], &r["status"]),
        (&json!("response"), &json!("completed"))
    );
    assert_eq!(r["output"][0]["content"][0]["text"], "hello");
}

#[tokio::test]
async fn error_turns_carry_the_providers_json_then_give_way() {
    let server = Server::start(Script::new([
        Turn::Error {
            status: 500,
            message: "boom".into(),
            times: Some(1),
        },
        Turn::Error {
            status: 429,
            message: "slow down".into(),
            times: Some(1),
        },
        Turn::text("after errors"),
        Turn::error(401, "bad key"),
    ]));
    let msg = |assistants: usize| {
        let mut m = vec![json!({"role": "user", "content": "x"})];
        for _ in 0..assistants {
            m.push(json!({"role": "assistant", "content": "y"}));
            m.push(json!({"role": "user", "content": "z"}));
        }
        json!({"model": "m", "stream": true, "messages": m})
    };
    let a = post(server.port(), "/v1/messages", "k", &msg(0)).await;
    assert_eq!(a.status, 500);
    let e = a.json();
    assert_eq!(
        (&e["type"], &e["error"]["type"], &e["error"]["message"]),
        (&json!("error"), &json!("api_error"), &json!("boom"))
    );
    let a = post(server.port(), "/v1/messages", "k", &msg(0)).await;
    assert_eq!(
        (a.status, a.json()["error"]["type"].clone()),
        (429, json!("rate_limit_error"))
    );
    let a = post(server.port(), "/v1/messages", "k", &msg(0)).await;
    assert_eq!(a.status, 200);
    // The 401 has no limit: every request at its position gets it.
    for _ in 0..2 {
        let a = post(server.port(), "/v1/messages", "k", &msg(1)).await;
        assert_eq!(
            (a.status, a.json()["error"]["type"].clone()),
            (401, json!("authentication_error"))
        );
    }
    // OpenAI's error shape at the same position.
    let a = post(
        server.port(),
        "/v1/responses",
        "k",
        &json!({"input": [
        {"type": "message", "role": "assistant", "content": []}]}),
    )
    .await;
    assert_eq!(a.status, 401);
    assert_eq!(a.json()["error"]["code"], "invalid_api_key");
    assert_eq!(a.json()["error"]["message"], "bad key");
    // Beyond the script: a 400 naming the position.
    let a = post(server.port(), "/v1/messages", "k", &msg(2)).await;
    assert_eq!(a.status, 400);
    assert!(a.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("position 2"));
    let statuses: Vec<u16> = server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [500, 429, 200, 401, 401, 401, 400]);
}

#[tokio::test]
async fn expect_key_refuses_other_credentials() {
    let server = Server::start(Script {
        expect_key: Some("sk-real".into()),
        ..Script::new([Turn::text("hi")])
    });
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let a = post(server.port(), "/v1/messages", "placeholder", &body).await;
    assert_eq!(
        (a.status, a.json()["error"]["type"].clone()),
        (401, json!("authentication_error"))
    );
    let a = post(server.port(), "/v1/messages", "sk-real", &body).await;
    assert_eq!(a.status, 200);
    let a = call(
        server.port(),
        "POST",
        "/v1/responses",
        &[("authorization", "Bearer sk-real")],
        json!({"input": "x"}).to_string().as_bytes(),
    )
    .await;
    assert_eq!(a.status, 200);
    let creds: Vec<Option<String>> = server
        .requests()
        .iter()
        .map(|r| r.credential().map(str::to_string))
        .collect();
    assert_eq!(
        creds,
        [
            Some("placeholder".into()),
            Some("sk-real".into()),
            Some("sk-real".into())
        ]
    );
}

#[tokio::test]
async fn probes_models_and_junk() {
    let server = Server::start(Script::new([Turn::text("hi")]));
    let p = server.port();
    assert_eq!(call(p, "HEAD", "/", &[], b"").await.status, 200);
    assert_eq!(call(p, "GET", "/health", &[], b"").await.status, 200);
    let m = call(p, "GET", "/v1/models", &[], b"").await;
    assert_eq!(m.json()["data"][0]["id"], "voidbox-script");
    assert_eq!(call(p, "GET", "/nope", &[], b"").await.status, 404);
    assert_eq!(
        call(p, "POST", "/v1/messages", &[], b"not json")
            .await
            .status,
        400
    );
    let seen = server.requests();
    assert_eq!(seen.len(), 5);
    assert!(!seen[3].is_model_call() && seen[4].body.is_null());
}

#[test]
fn the_bin_serves_a_script_file_and_records() {
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("s.json");
    let record = d.path().join("rec.jsonl");
    std::fs::write(&script, r#"[{"text": "from the bin"}]"#).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_voidbox-llm-script"))
        .arg(&script)
        .arg("--record")
        .arg(&record)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let a = rt.block_on(post(port, "/v1/messages", "k", &body));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(a.json()["content"][0]["text"], "from the bin");
    let rec: Value =
        serde_json::from_str(std::fs::read_to_string(&record).unwrap().trim()).unwrap();
    assert_eq!(
        (&rec["path"], &rec["status"], &rec["position"]),
        (&json!("/v1/messages"), &json!(200), &json!(0))
    );
    // A bad script is refused with exit 2.
    std::fs::write(&script, "[{\"nope\": 1}]").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_voidbox-llm-script"))
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
async fn the_hook_sees_each_request_before_its_answer_without_holding_others() {
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// What the hook saw: position, turn, status, when.
    type Seen = (Option<usize>, Option<usize>, u16, Instant);
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let (tx, rx) = mpsc::channel::<()>();
    let (tx, rx) = (Mutex::new(tx), Mutex::new(rx));
    let log = seen.clone();
    let server = Server::start_with_hook(
        Script {
            expect_key: Some("sk-real".into()),
            ..Script::new([Turn::shell("echo x"), Turn::text("done")])
        },
        move |r: &voidbox_llm_script::Recorded| {
            // The first conversation's hook waits until the second one's hook has run: a
            // server that ran hooks in line would never get there.
            let entry = || (r.position, r.turn, r.status, Instant::now());
            if r.position == Some(0) {
                let released = rx
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(20))
                    .is_ok();
                assert!(released, "the hook of the first request was never released");
                log.lock().unwrap().push(entry());
            } else {
                log.lock().unwrap().push(entry());
                let _ = tx.lock().unwrap().send(());
            }
        },
    );
    let port = server.port();
    let msg = |n: usize| {
        let mut m = vec![json!({"role": "user", "content": "go"})];
        for _ in 0..n {
            m.push(json!({"role": "assistant", "content": "ok"}));
            m.push(json!({"role": "user", "content": "next"}));
        }
        json!({"model": "m", "messages": m})
    };
    let first = tokio::spawn(async move {
        let a = post(port, "/v1/messages", "sk-real", &msg(0)).await;
        (a, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = post(port, "/v1/messages", "sk-real", &msg(1)).await;
    let (first, first_at) = first.await.unwrap();
    assert_eq!((first.status, second.status), (200, 200));
    assert_eq!(first.json()["content"][0]["name"], "Bash");
    assert_eq!(second.json()["content"][0]["text"], "done");
    // A refused key reaches the hook too.
    let refused = post(port, "/v1/messages", "wrong", &msg(1)).await;
    assert_eq!(refused.status, 401);
    let seen = seen.lock().unwrap().clone();
    let summary: Vec<_> = seen.iter().map(|(p, t, s, _)| (*p, *t, *s)).collect();
    assert_eq!(
        summary,
        [
            (Some(1), Some(1), 200),
            (Some(0), Some(0), 200),
            (Some(1), None, 401)
        ]
    );
    // The first answer was sent only after its hook returned.
    assert!(seen[1].3 <= first_at);
    assert_eq!(server.requests().len(), 3);
}
