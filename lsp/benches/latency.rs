//! `voidbox lsp` latency: an edit to a 500-line spec until its diagnostics are published,
//! and hover / completion / definition answers, through the server's real loop over an
//! in-memory connection. Prints a table (milliseconds).
//!
//!     cargo bench -p voidbox-lsp --bench latency

use std::time::{Duration, Instant};

use lsp_server::{Connection, Message, Notification, Request, RequestId};
use serde_json::{json, Value};
use voidbox_spec::validate::HostFacts;

/// A pipeline of `boxes` boxes (8 lines each) and its stages.
fn spec(boxes: usize, edit: usize) -> String {
    let mut s = String::from(
        "api_version: v1\nkind: pipeline\nname: big\non_failure: continue\npipeline:\n  boxes:\n",
    );
    for i in 0..boxes {
        s.push_str(&format!(
            "    - name: b{i}\n      run:\n        program: sh\n        args: [-c, 'echo {i} {edit}']\n        env: {{N: \"{i}\"}}\n      timeout_secs: 60\n      retries: 1\n      sandbox: {{memory_mb: 256}}\n"
        ));
    }
    s.push_str("  stages:\n    - {type: box, name: b0}\n");
    let rest: Vec<String> = (1..boxes).map(|i| format!("b{i}")).collect();
    s.push_str(&format!(
        "    - {{type: fan_out, boxes: [{}]}}\n",
        rest.join(", ")
    ));
    s
}

fn recv(c: &Connection) -> Message {
    c.receiver
        .recv_timeout(Duration::from_secs(10))
        .expect("server answers")
}

fn request(c: &Connection, id: i32, method: &str, params: Value) -> Duration {
    let t = Instant::now();
    c.sender
        .send(Message::Request(Request::new(
            RequestId::from(id),
            method.into(),
            params,
        )))
        .unwrap();
    loop {
        if let Message::Response(r) = recv(c) {
            assert!(r.error.is_none(), "{method}: {:?}", r.error);
            return t.elapsed();
        }
    }
}

fn stats(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let p = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    println!(
        "| {name:<44} | {:>5} | {:>7.2} | {:>7.2} | {:>7.2} | {:>7.2} |",
        v.len(),
        ms(v[0]),
        ms(p(0.5)),
        ms(p(0.95)),
        ms(v[v.len() - 1])
    );
}

fn main() {
    let (server, client) = Connection::memory();
    let handle = std::thread::spawn(move || {
        voidbox_lsp::server::serve(&server, HostFacts::NONE).unwrap();
    });
    request(&client, 0, "initialize", json!({"capabilities": {}}));
    let note = |method: &str, params: Value| {
        client
            .sender
            .send(Message::Notification(Notification::new(
                method.into(),
                params,
            )))
            .unwrap();
    };
    note("initialized", json!({}));
    let uri = "file:///bench/big.yaml";
    let text = spec(62, 0);
    let lines = text.lines().count();
    let wait_diagnostics = || loop {
        if let Message::Notification(n) = recv(&client) {
            if n.method == "textDocument/publishDiagnostics" {
                return n.params;
            }
        }
    };
    note(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "yaml", "version": 0, "text": text}}),
    );
    let d = wait_diagnostics();
    assert_eq!(d["diagnostics"], json!([]), "the bench spec is valid");
    let mut edits = Vec::new();
    for n in 1..=200 {
        let text = spec(62, n);
        let t = Instant::now();
        note(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": n}, "contentChanges": [{"text": text}]}),
        );
        let d = wait_diagnostics();
        edits.push(t.elapsed());
        assert_eq!(d["version"], n);
    }
    // One with errors: every box's `retries` misspelt.
    let broken = spec(62, 0).replace("retries:", "retrys:");
    let mut errs = Vec::new();
    for n in 201..=300 {
        let t = Instant::now();
        note(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": n}, "contentChanges": [{"text": broken}]}),
        );
        let d = wait_diagnostics();
        errs.push(t.elapsed());
        assert_eq!(d["diagnostics"].as_array().map(Vec::len), Some(62));
    }
    note(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri, "version": 301}, "contentChanges": [{"text": spec(62, 0)}]}),
    );
    wait_diagnostics();
    let pos = |line: u32, character: u32| json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}});
    let (mut hovers, mut completions, mut defs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..200 {
        let id = 1000 + 3 * i;
        hovers.push(request(&client, id, "textDocument/hover", pos(8, 10)));
        completions.push(request(
            &client,
            id + 1,
            "textDocument/completion",
            pos(7, 6),
        ));
        defs.push(request(
            &client,
            id + 2,
            "textDocument/definition",
            pos(lines as u32 - 1, 30),
        ));
    }
    println!("voidbox lsp, a {lines}-line spec (62 boxes), in-memory connection:");
    println!();
    println!("| operation | n | min ms | median ms | p95 ms | max ms |");
    println!("|---|---|---|---|---|---|");
    stats("edit → diagnostics published (valid)", edits);
    stats("edit → diagnostics published (62 errors)", errs);
    stats("hover", hovers);
    stats("completion (field names)", completions);
    stats("definition", defs);
    request(&client, 9999, "shutdown", Value::Null);
    note("exit", Value::Null);
    handle.join().unwrap();
}
