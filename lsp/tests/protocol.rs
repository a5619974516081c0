//! The server on the protocol level: a client on the other end of an in-memory connection
//! (lsp-server's own transport) sends what an editor sends and reads what comes back.

use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

use lsp_server::{Connection, Message, Notification, Request, RequestId, Response};
use serde_json::{json, Value};
use voidbox_spec::validate::{validate_source, HostFacts};

/// An invalid pipeline: an unknown field (`timeout_sec`), and a stage naming a box that
/// does not exist.
const INVALID: &str = "api_version: v1
kind: pipeline
name: p
pipeline:
  boxes:
    - name: seed
      run: {program: sh, args: [-c, 'echo 1']}
      timeout_sec: 5
    - name: count
      run: {program: wc}
  stages:
    - {type: box, name: seed}
    - {type: box, name: cuont}
";

struct Client {
    conn: Connection,
    server: Option<JoinHandle<()>>,
    next: i32,
}

impl Client {
    fn start() -> Client {
        let (server, client) = Connection::memory();
        let handle = std::thread::spawn(move || {
            voidbox_lsp::server::serve(&server, HostFacts::NONE).expect("serves");
        });
        let mut c = Client {
            conn: client,
            server: Some(handle),
            next: 1,
        };
        let init = c.request("initialize", json!({"capabilities": {}}));
        let caps = &init["capabilities"];
        assert_eq!(
            caps["textDocumentSync"],
            json!(2),
            "incremental sync: {init}"
        );
        assert_eq!(caps["hoverProvider"], json!(true));
        assert_eq!(caps["definitionProvider"], json!(true));
        assert_eq!(caps["documentSymbolProvider"], json!(true));
        assert!(caps["completionProvider"].is_object());
        c.notify("initialized", json!({}));
        c
    }

    fn send_request(&mut self, method: &str, params: Value) -> RequestId {
        let id = RequestId::from(self.next);
        self.next += 1;
        self.conn
            .sender
            .send(Message::Request(Request::new(
                id.clone(),
                method.into(),
                params,
            )))
            .unwrap();
        id
    }

    fn response(&self, id: RequestId) -> Response {
        loop {
            match self.recv() {
                Message::Response(r) if r.id == id => return r,
                _ => continue,
            }
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send_request(method, params);
        let r = self.response(id);
        assert!(r.error.is_none(), "{method}: {:?}", r.error);
        r.result.unwrap_or(Value::Null)
    }

    fn notify(&self, method: &str, params: Value) {
        self.conn
            .sender
            .send(Message::Notification(Notification::new(
                method.into(),
                params,
            )))
            .unwrap();
    }

    fn recv(&self) -> Message {
        self.conn
            .receiver
            .recv_timeout(Duration::from_secs(10))
            .expect("a message from the server within 10 s")
    }

    /// The next `publishDiagnostics` notification's params.
    fn diagnostics(&self) -> Value {
        loop {
            if let Message::Notification(n) = self.recv() {
                if n.method == "textDocument/publishDiagnostics" {
                    return n.params;
                }
            }
        }
    }

    fn open(&self, uri: &str, text: &str) {
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": text}}),
        );
    }

    fn change(&self, uri: &str, version: i32, text: &str) {
        self.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]}),
        );
    }

    /// Ranged changes `(start line, start UTF-16 character, end line, end character, text)`,
    /// applied in order, in one notification.
    fn edit(&self, uri: &str, version: i32, changes: &[(u32, u32, u32, u32, &str)]) {
        let changes: Vec<Value> = changes
            .iter()
            .map(|&(l0, c0, l1, c1, text)| {
                json!({"range": {"start": {"line": l0, "character": c0},
                                 "end": {"line": l1, "character": c1}}, "text": text})
            })
            .collect();
        self.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": changes}),
        );
    }

    fn at(uri: &str, text: &str, needle: &str, plus: usize) -> Value {
        let off = text.find(needle).expect(needle) + plus;
        let line = text[..off].matches('\n').count();
        let col = off - text[..off].rfind('\n').map_or(0, |i| i + 1);
        json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": col}})
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let id = self.send_request("shutdown", Value::Null);
        let _ = self.response(id);
        self.notify("exit", Value::Null);
        if let Some(h) = self.server.take() {
            h.join().expect("the server thread ends after exit");
        }
    }
}

/// `(code, line, column, end line, end column)` of each diagnostic `validate` reports.
fn validate_says(text: &str) -> Vec<(String, usize, usize)> {
    let v = validate_source("/specs/p.yaml", text.to_string(), Path::new("/specs"));
    v.report
        .diagnostics
        .iter()
        .map(|d| {
            let line = text[..d.span.offset].matches('\n').count();
            let col = d.span.offset - text[..d.span.offset].rfind('\n').map_or(0, |i| i + 1);
            (d.code.to_string(), line, col)
        })
        .collect()
}

#[test]
fn diagnostics_are_validate_s_on_open_and_after_each_edit() {
    let c = Client::start();
    let uri = "file:///specs/p.yaml";
    c.open(uri, INVALID);
    let d = c.diagnostics();
    assert_eq!(d["uri"], uri);
    assert_eq!(d["version"], 1);
    let got: Vec<(String, usize, usize)> = d["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["code"].as_str().unwrap().to_string(),
                x["range"]["start"]["line"].as_u64().unwrap() as usize,
                x["range"]["start"]["character"].as_u64().unwrap() as usize,
            )
        })
        .collect();
    let want = validate_says(INVALID);
    assert!(want.len() >= 2, "{want:?}");
    assert_eq!(got, want);
    let unknown = d["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["code"] == "voidbox::unknown_field")
        .expect("unknown field");
    assert_eq!(unknown["severity"], 1);
    assert_eq!(unknown["source"], "voidbox");
    assert!(
        unknown["message"]
            .as_str()
            .unwrap()
            .contains("help: did you mean `timeout_secs`?"),
        "{unknown}"
    );
    // Fixed: nothing left.
    let fixed = INVALID
        .replace("timeout_sec:", "timeout_secs:")
        .replace("cuont", "count");
    c.change(uri, 2, &fixed);
    let d = c.diagnostics();
    assert_eq!(d["version"], 2);
    assert_eq!(d["diagnostics"], json!([]));
    // Broken YAML mid-edit: the syntax error, located.
    c.change(uri, 3, "api_version: v1\nkind: [pipeline\n");
    let d = c.diagnostics();
    assert_eq!(d["diagnostics"][0]["code"], "voidbox::yaml_syntax");
    c.notify(
        "textDocument/didClose",
        json!({"textDocument": {"uri": uri}}),
    );
    assert_eq!(c.diagnostics()["diagnostics"], json!([]));
}

/// Field `key` of each element of the array `v`.
fn strings<'a>(v: &'a Value, key: &str) -> Vec<&'a str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x[key].as_str().unwrap())
        .collect()
}

#[test]
fn hover_completion_definition_and_symbols() {
    let mut c = Client::start();
    let uri = "file:///specs/p.yaml";
    c.open(uri, INVALID);
    c.diagnostics();
    // Hover: the field's description, and the accepted values of an enumeration.
    let h = c.request(
        "textDocument/hover",
        Client::at(uri, INVALID, "program: sh", 2),
    );
    let text = h["contents"]["value"].as_str().unwrap();
    assert!(
        text.contains("pipeline.boxes[].run.program") && text.contains("Program name"),
        "{text}"
    );
    let h = c.request("textDocument/hover", Client::at(uri, INVALID, "kind:", 1));
    let text = h["contents"]["value"].as_str().unwrap();
    assert!(
        text.contains("`workflow`") && text.contains("`pipeline`"),
        "{text}"
    );
    assert_eq!(
        c.request(
            "textDocument/hover",
            Client::at(uri, INVALID, "\n  boxes", 0)
        ),
        Value::Null,
        "nothing on a newline"
    );
    // Definition: a stage's box name goes to the box.
    let d = c.request(
        "textDocument/definition",
        Client::at(uri, INVALID, "name: seed}", 7),
    );
    assert_eq!(d["uri"], uri);
    assert_eq!(d["range"]["start"], json!({"line": 5, "character": 12}));
    // A misspelt name has no definition.
    let d = c.request(
        "textDocument/definition",
        Client::at(uri, INVALID, "cuont", 1),
    );
    assert_eq!(d, Value::Null);
    // Completion of a box's fields (those it has are not offered), and of enum values.
    let typing = "api_version: v1\nkind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: a\n      ti\non_failure: \n";
    c.change(uri, 2, typing);
    c.diagnostics();
    let items = c.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": uri}, "position": {"line": 6, "character": 8}}),
    );
    let labels = strings(&items, "label");
    assert_eq!(labels, ["timeout_secs"]);
    let items = c.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": uri}, "position": {"line": 7, "character": 12}}),
    );
    let labels = strings(&items, "label");
    assert!(
        labels.contains(&"fail_fast") && labels.contains(&"continue"),
        "{labels:?}"
    );
    // Symbols: the sections, with the boxes and stages.
    c.change(uri, 3, INVALID);
    c.diagnostics();
    let s = c.request(
        "textDocument/documentSymbol",
        json!({"textDocument": {"uri": uri}}),
    );
    let top = strings(&s, "name");
    assert_eq!(top, ["api_version", "kind", "name", "pipeline"]);
    let inner = strings(&s[3]["children"], "name");
    assert_eq!(inner, ["seed", "count", "1: box seed", "2: box cuont"]);
    // An unknown request is an error, not silence.
    let id = c.send_request("textDocument/formatting", json!({}));
    let r = c.response(id);
    assert_eq!(r.error.map(|e| e.code), Some(-32601));
}

/// The UTF-16 position (line, character) just after the first `needle` in `text`.
fn utf16_after(text: &str, needle: &str) -> (u32, u32) {
    let off = text.find(needle).expect(needle) + needle.len();
    let line_start = text[..off].rfind('\n').map_or(0, |i| i + 1);
    let line = text[..off].matches('\n').count() as u32;
    (line, text[line_start..off].encode_utf16().count() as u32)
}

fn codes(d: &Value) -> Vec<&str> {
    strings(&d["diagnostics"], "code")
}

#[test]
fn incremental_changes_apply_utf16_ranges_in_order() {
    // A box in flow style whose unknown field (`timeout_sec`) comes after characters that
    // are 1 UTF-16 unit and 2 bytes (`é`), and 2 units and 4 bytes (`𝄞`).
    let text = "api_version: v1
kind: pipeline
name: p
pipeline:
  boxes:
    - {name: seed, run: {program: sh, args: [-c, 'echo é𝄞']}, timeout_sec: 5}
    - name: count
      run: {program: wc}
  stages:
    - {type: box, name: seed}
    - {type: box, name: cuont}
";
    let mut c = Client::start();
    let uri = "file:///specs/p.yaml";
    c.open(uri, text);
    let d = c.diagnostics();
    assert!(codes(&d).contains(&"voidbox::unknown_field"), "{d}");
    // One notification, two changes: the second's range is in the text the first left (a
    // line inserted above shifts it by one). Counted in bytes or in chars, the `s` would land
    // inside the string and the field would stay unknown.
    let (line, ch) = utf16_after(text, "timeout_sec");
    assert_eq!(ch, 74, "`é𝄞` count 3 UTF-16 units (chars: 73, bytes: 77)");
    let (stage, name) = utf16_after(text, "name: cu");
    c.edit(
        uri,
        2,
        &[
            (line, ch, line, ch, "s"),
            (0, 0, 0, 0, "# 𝄞 first\n"),
            (stage + 1, name - 2, stage + 1, name + 3, "count"),
        ],
    );
    let d = c.diagnostics();
    assert_eq!(d["version"], 2);
    assert_eq!(d["diagnostics"], json!([]), "{d}");
    // The server's text is the editor's: a definition lands on the shifted line.
    let def = c.request(
        "textDocument/definition",
        json!({"textDocument": {"uri": uri}, "position": {"line": stage + 1, "character": name}}),
    );
    assert_eq!(
        def["range"]["start"],
        json!({"line": 7, "character": 12}),
        "{def}"
    );
    // A deletion spanning lines, and a range past the line's end (clamped to it).
    c.edit(uri, 3, &[(0, 0, 1, 0, ""), (1, 99, 1, 99, "x")]);
    let d = c.diagnostics();
    assert_eq!(d["version"], 3);
    let d = d["diagnostics"].as_array().unwrap();
    assert!(
        d.iter().any(|x| x["range"]["start"]["line"] == 1),
        "`kind: pipelinex` is no kind: {d:?}"
    );
}

#[test]
fn completion_inside_flow_mappings() {
    let mut c = Client::start();
    let uri = "file:///specs/p.yaml";
    let text = "api_version: v1
kind: pipeline
name: p
pipeline:
  boxes:
    - {name: a, run: {program: sh, ar
  stages:
    - {type: box, na
    - {type: 
";
    c.open(uri, text);
    c.diagnostics();
    let complete = |c: &mut Client, line: u32, character: u32| {
        let items = c.request(
            "textDocument/completion",
            json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}),
        );
        strings(&items, "label")
            .into_iter()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // A stage's fields, without the `type` it has.
    assert_eq!(complete(&mut c, 7, 20), ["name"]);
    assert_eq!(
        complete(&mut c, 7, 18).len(),
        2,
        "`name` and `boxes` after `, `"
    );
    // A stage type's values.
    assert_eq!(complete(&mut c, 8, 13), ["box", "fan_out"]);
    // A nested flow mapping: `run`'s fields.
    assert_eq!(complete(&mut c, 5, 37), ["args"]);
    // What the item takes after `name: a, `.
    let fields = complete(&mut c, 5, 16);
    assert!(
        fields.contains(&"run".to_string()) && !fields.contains(&"name".to_string()),
        "{fields:?}"
    );
}

/// A Kubernetes ConfigMap: `validate <dir>` skips it; `validate` on it alone reports its
/// fields as unknown.
const CONFIG_MAP: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  mode: fast
";

#[test]
fn yaml_that_is_not_a_spec_gets_no_diagnostics_as_validate_dir_skips_it() {
    assert!(
        validate_says(CONFIG_MAP).len() >= 3,
        "validated as a spec, a ConfigMap is all errors"
    );
    let mut c = Client::start();
    let uri = "file:///deploy/configmap.yaml";
    c.open(uri, CONFIG_MAP);
    assert_eq!(c.diagnostics()["diagnostics"], json!([]));
    let h = c.request("textDocument/hover", Client::at(uri, CONFIG_MAP, "kind", 1));
    assert_eq!(
        h,
        Value::Null,
        "no spec documentation on a manifest's `kind`"
    );
    let workflow = "on: push\njobs:\n  test: {runs-on: ubuntu-latest}\n";
    c.open("file:///repo/.github/workflows/ci.yaml", workflow);
    assert_eq!(c.diagnostics()["diagnostics"], json!([]));
    // Once it says it is a spec (`apiVersion` becomes `api_version`), it is validated.
    c.edit(uri, 2, &[(0, 0, 0, 10, "api_version")]);
    let d = c.diagnostics();
    assert_eq!(d["version"], 2);
    assert!(codes(&d).len() >= 2, "{d}");
}
