//! Observability end to end: real `voidbox apply` runs on real micro-VMs export their trace
//! to a real Arize Phoenix (OTLP/HTTP and OTLP/gRPC, read back through Phoenix's REST API)
//! and their metrics to an OTLP/HTTP receiver built on the official protobuf definitions
//! (`scripts/otlp_sink.py`; Phoenix takes no metrics). Also: `TRACEPARENT`, `--trace FILE`,
//! and a collector that is down or never answers (the run succeeds, one warning, bounded).
//!
//! Needs Phoenix installed (`scripts/phoenix.sh install`, done by `scripts/test.sh`).

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use voidbox_tests::vm::guest_image;
use voidbox_tests::{free_port, otlp_sink, repo_root, KillOnDrop};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// A child process killed when dropped.
/// `GET path` on 127.0.0.1:`port` (HTTP/1.0, so the body is not chunked): (status, body).
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

fn phoenix(dir: &Path) -> (KillOnDrop, u16, u16) {
    let (http, grpc) = (free_port(), free_port());
    let work = dir.join("phoenix");
    std::fs::create_dir_all(&work).unwrap();
    let log = std::fs::File::create(dir.join("phoenix.log")).unwrap();
    let child = Command::new(repo_root().join("scripts/phoenix.sh"))
        .arg("serve")
        .arg(&work)
        .args([http.to_string(), grpc.to_string()])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("scripts/phoenix.sh (install Phoenix with `scripts/phoenix.sh install`)");
    let server = KillOnDrop(child);
    let t0 = Instant::now();
    while get(http, "/healthz").map(|r| r.0) != Some(200) {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "Phoenix did not come up: {}",
            std::fs::read_to_string(dir.join("phoenix.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    (server, http, grpc)
}

/// `seed` writes 300 kB, so `count` gets its stdin streamed while the guest is sampled (both
/// write frames on the connection at once); `count` runs long enough for several samples,
/// of which the spec keeps 1.
const SPEC: &str = "api_version: v1
kind: pipeline
name: observed
sandbox: {memory_mb: 256}
observe: {telemetry_buffer_size: 1}
pipeline:
  boxes:
    - name: seed
      run:
        program: sh
        args:
          - -c
          - |
            printf '{\"pad\": \"'; head -c 300000 /dev/zero | tr '\\0' a; printf '\"}'
    - name: count
      run: {program: sh, args: [-c, 'sleep 11; wc -c']}
    - name: think
      prompt: Summarise the input.
      llm: {provider: mock}
  stages:
    - {type: box, name: seed}
    - {type: fan_out, boxes: [count, think]}
";

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

fn apply(dir: &Path, spec: &str, args: &[&str], env: &[(&str, String)]) -> Run {
    let file = dir.join(format!("spec-{}.yaml", free_port()));
    std::fs::write(&file, spec).unwrap();
    let mut cmd = Command::new(VOIDBOX);
    cmd.arg("apply")
        .arg(&file)
        .args(args)
        .arg("--logs-dir")
        .arg(dir.join("logs"))
        .args(["--boot-timeout", "400"])
        .env("NO_COLOR", "1")
        .env("TMPDIR", dir)
        .stdin(Stdio::null());
    for k in [
        "VOIDBOX_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "TRACEPARENT",
        "OTEL_SERVICE_NAME",
        "OTEL_METRICS_EXPORTER",
        "OTEL_TRACES_EXPORTER",
        "OTEL_LOGS_EXPORTER",
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
        "OTEL_SDK_DISABLED",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let out = cmd.output().unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: t0.elapsed(),
    }
}

/// Every span of `project` in Phoenix once the run's root span is there.
fn phoenix_spans(port: u16, project: &str, root: &str) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let path = format!("/v1/projects/{project}/spans?limit=1000");
        if let Some((200, body)) = get(port, &path) {
            let v: Value = serde_json::from_str(&body).unwrap();
            let spans = v["data"].as_array().cloned().unwrap_or_default();
            if spans.iter().any(|s| s["name"] == root) {
                return spans;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no `{root}` span reached Phoenix project {project}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn by_name<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn one<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    let v = by_name(spans, name);
    assert_eq!(v.len(), 1, "spans named `{name}`: {v:#?}");
    v[0]
}

fn id(s: &Value) -> &str {
    s["context"]["span_id"].as_str().unwrap()
}

fn children<'a>(spans: &'a [Value], parent: &Value) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["parent_id"].as_str() == Some(id(parent)))
        .collect()
}

fn child<'a>(spans: &'a [Value], parent: &Value, name: &str) -> &'a Value {
    let c: Vec<&Value> = children(spans, parent)
        .into_iter()
        .filter(|s| s["name"] == name)
        .collect();
    assert_eq!(c.len(), 1, "`{name}` under `{}`: {c:#?}", parent["name"]);
    c[0]
}

/// The `think` node's agent statistics in the JSON report.
fn think_agent(report: &Value) -> Value {
    report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "think")
        .unwrap()["agent"]
        .clone()
}

/// Checks the run → stage → node → attempt → phases tree of one run, and the agent's LLM
/// span against the JSON report; returns the trace's span ids.
fn check_tree(
    spans: &[Value],
    report: &Value,
    traceparent: bool,
    sampled: bool,
) -> HashSet<String> {
    let root = one(spans, "voidbox apply observed");
    let trace = root["context"]["trace_id"].as_str().unwrap();
    let spans: Vec<Value> = spans
        .iter()
        .filter(|s| s["context"]["trace_id"] == trace)
        .cloned()
        .collect();
    if traceparent {
        assert_eq!(trace, TRACE_ID, "the run continues the caller's trace");
        assert_eq!(root["parent_id"], PARENT_ID);
    } else {
        assert!(root["parent_id"].is_null(), "{root:#}");
    }
    assert_eq!(root["status_code"], "OK");
    assert_eq!(root["attributes"]["voidbox.run.exit_code"], 0);
    assert_eq!(root["attributes"]["voidbox.nodes.succeeded"], 3);
    child(&spans, root, "prepare");
    let seed_stage = child(&spans, root, "stage seed");
    let fan = child(&spans, root, "stage fan_out[count, think]");
    assert_eq!(fan["attributes"]["voidbox.stage.kind"], "fan_out");
    let seed = child(&spans, seed_stage, "node seed");
    let count = child(&spans, fan, "node count");
    let think = child(&spans, fan, "node think");
    for n in [seed, count, think] {
        assert_eq!(n["status_code"], "OK", "{n:#}");
        assert_eq!(n["attributes"]["voidbox.node.attempts"], 1);
        assert!(n["attributes"]["voidbox.node.queue_wait_ms"].is_number());
        let attempt = child(&spans, n, "attempt 1");
        assert_eq!(attempt["attributes"]["process.exit.code"], 0);
        let vm = child(&spans, attempt, "vm.start");
        let kind = vm["attributes"]["voidbox.vm.start.kind"].as_str().unwrap();
        assert!(kind == "restore" || kind == "cold_boot", "{vm:#}");
        if kind == "restore" {
            assert!(
                vm["attributes"]["voidbox.vm.snapshot"].is_string(),
                "{vm:#}"
            );
        }
        assert_eq!(vm["attributes"]["voidbox.vm.memory_mb"], 256);
        child(&spans, attempt, "provision");
        child(&spans, attempt, "collect");
    }
    child(&spans, child(&spans, seed, "attempt 1"), "exec sh");
    let wc = child(&spans, child(&spans, count, "attempt 1"), "exec sh");
    // The fan-out's merged output: `count`'s (a JSON number) first.
    let out = report["output"][0].to_string();
    assert_eq!(
        out.trim_matches('"').trim(),
        "300011",
        "count's streamed stdin arrived whole: {report:#}"
    );
    if sampled {
        // Sampled every 5 s during `sleep 11`: at least 2 taken, the last one kept as an event.
        let a = &wc["attributes"];
        assert!(a["voidbox.guest.samples"].as_u64().unwrap() >= 2, "{wc:#}");
        assert!(a["voidbox.guest.memory_peak_bytes"].as_u64().unwrap() > 1 << 20);
        let events: Vec<&Value> = wc["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "guest.telemetry")
            .collect();
        assert_eq!(events.len(), 1, "{wc:#}");
        assert!(events
            .iter()
            .all(|e| e["attributes"]["voidbox.guest.memory_used_bytes"].as_u64() > Some(0)));
    }
    // The agent: an AGENT node whose runtime call is an LLM span with the report's tokens.
    assert_eq!(think["span_kind"], "AGENT");
    let llm = child(
        &spans,
        child(&spans, think, "attempt 1"),
        "invoke_agent think",
    );
    assert_eq!(llm["span_kind"], "LLM");
    let agent = think_agent(report);
    let input = agent["input_tokens"].as_u64().unwrap();
    let output = agent["output_tokens"].as_u64().unwrap();
    assert!(input > 0 && output > 0, "{agent:#}");
    let a = &llm["attributes"];
    assert_eq!(a["llm.token_count.prompt"], input);
    assert_eq!(a["llm.token_count.completion"], output);
    assert_eq!(a["gen_ai.usage.input_tokens"], input);
    assert_eq!(a["gen_ai.usage.output_tokens"], output);
    assert_eq!(a["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(a["gen_ai.provider.name"], "mock");
    assert_eq!(a["llm.provider"], "mock");
    assert_eq!(a["llm.cost.total"], agent["cost_usd"]);
    // Each tool call the runtime made is a TOOL span under the LLM span, in the report's order.
    let tools: Vec<&Value> = children(&spans, llm);
    let called: Vec<String> = agent["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| format!("execute_tool {}", t.as_str().unwrap()))
        .collect();
    assert!(
        !called.is_empty(),
        "the mock runtime calls tools: {agent:#}"
    );
    let mut names: Vec<String> = tools
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    let mut expected = called.clone();
    expected.sort();
    assert_eq!(names, expected);
    assert!(tools.iter().all(|t| t["span_kind"] == "TOOL"));
    spans
        .iter()
        .map(|s| s["context"]["span_id"].as_str().unwrap().to_string())
        .collect()
}

/// Every log record the sink received (OTLP JSON, ids as hex).
fn log_records(sink: &Path) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(sink).unwrap_or_default();
        let mut out = Vec::new();
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            if v["signal"] != "logs" {
                continue;
            }
            for rl in v["body"]["resourceLogs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                for sl in rl["scopeLogs"].as_array().cloned().unwrap_or_default() {
                    out.extend(sl["logRecords"].as_array().cloned().unwrap_or_default());
                }
            }
        }
        if out.iter().any(|r| {
            r["body"]["stringValue"]
                .as_str()
                .is_some_and(|b| b.contains("exit code"))
        }) || t0.elapsed() > Duration::from_secs(30)
        {
            // protobuf's JSON mapping writes ids as base64; OTLP JSON wants hex.
            for r in &mut out {
                for k in ["traceId", "spanId"] {
                    if let Some(b) = r[k].as_str() {
                        r[k] = Value::String(hex_of_base64(b));
                    }
                }
            }
            return out;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn hex_of_base64(b: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(b)
        .unwrap()
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A data point: its attributes and value (a histogram's sum).
type Point = (HashMap<String, Value>, f64);

/// The metrics of the last export the sink received, by name: every data point.
fn metrics(sink: &Path) -> HashMap<String, Vec<Point>> {
    let mut out: HashMap<String, Vec<Point>> = HashMap::new();
    let text = std::fs::read_to_string(sink).unwrap_or_default();
    // Cumulative temporality: the last export holds every series' final value.
    let last = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .rfind(|v| v["signal"] == "metrics");
    if let Some(v) = last {
        let rms = v["body"]["resourceMetrics"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for rm in rms {
            for sm in rm["scopeMetrics"].as_array().cloned().unwrap_or_default() {
                for m in sm["metrics"].as_array().cloned().unwrap_or_default() {
                    let name = m["name"].as_str().unwrap().to_string();
                    let data = ["sum", "gauge", "histogram"]
                        .iter()
                        .find_map(|k| m.get(*k))
                        .cloned()
                        .unwrap_or_default();
                    for p in data["dataPoints"].as_array().cloned().unwrap_or_default() {
                        let attrs: HashMap<String, Value> = p["attributes"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default()
                            .iter()
                            .map(|kv| {
                                let val = kv["value"].as_object().unwrap();
                                let (_, x) = val.iter().next().unwrap();
                                (kv["key"].as_str().unwrap().to_string(), x.clone())
                            })
                            .collect();
                        let num = |x: &Value| {
                            x.as_f64()
                                .or_else(|| x.as_str().and_then(|s| s.parse().ok()))
                                .unwrap_or(f64::NAN)
                        };
                        let value = if p.get("sum").is_some() && p.get("count").is_some() {
                            num(&p["sum"])
                        } else {
                            p.get("asDouble")
                                .or(p.get("asInt"))
                                .map(num)
                                .unwrap_or(f64::NAN)
                        };
                        out.entry(name.clone()).or_default().push((attrs, value));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn a_fan_out_run_with_an_agent_reaches_phoenix_over_http_and_grpc_with_its_metrics() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_phoenix, http, grpc) = phoenix(dir.path());
    let (_sink, sink_port, sink_out) = otlp_sink(dir.path());

    // OTLP/HTTP through the standard per-signal variables: traces to Phoenix, metrics to the
    // sink; the caller's TRACEPARENT; the spans also written with --trace.
    let project = format!("vbx-http-{}", std::process::id());
    let trace_file = dir.path().join("trace.json");
    let r = apply(
        dir.path(),
        SPEC,
        &["--output", "json", "--trace", trace_file.to_str().unwrap()],
        &[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                format!("http://127.0.0.1:{http}/v1/traces"),
            ),
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                format!("http://127.0.0.1:{sink_port}/v1/metrics"),
            ),
            (
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
                format!("http://127.0.0.1:{sink_port}/v1/logs"),
            ),
            ("OTEL_LOGS_EXPORTER", "otlp".into()),
            // The standard headers variable reaches the collector.
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-vbx-test=observed".into()),
            ("OTEL_SERVICE_NAME", project.clone()),
            ("TRACEPARENT", format!("00-{TRACE_ID}-{PARENT_ID}-01")),
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(!r.stderr.contains("warning: cannot export"), "{}", r.stderr);
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    let spans = phoenix_spans(http, &project, "voidbox apply observed");
    let ids = check_tree(&spans, &report, true, true);

    // --trace FILE: OTLP JSON holding the same spans.
    let doc: Value = serde_json::from_slice(&std::fs::read(&trace_file).unwrap()).unwrap();
    let mut in_file = HashSet::new();
    for rs in doc["resourceSpans"].as_array().unwrap() {
        let service = rs["resource"]["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|kv| kv["key"] == "service.name")
            .unwrap()["value"]["stringValue"]
            .clone();
        assert_eq!(service, project.as_str());
        for ss in rs["scopeSpans"].as_array().unwrap() {
            for s in ss["spans"].as_array().unwrap() {
                assert_eq!(s["traceId"], TRACE_ID);
                assert!(s["startTimeUnixNano"].is_string());
                in_file.insert(s["spanId"].as_str().unwrap().to_string());
            }
        }
    }
    assert_eq!(in_file, ids, "--trace holds exactly the exported spans");

    // Metrics, per node, from the official OTLP decoding of what the sink received.
    let t0 = Instant::now();
    let mut m = metrics(&sink_out);
    while !m.contains_key("voidbox.run.duration") && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(300));
        m = metrics(&sink_out);
    }
    let names: Vec<&String> = m.keys().collect();
    for name in [
        "voidbox.run.duration",
        "voidbox.node.duration",
        "voidbox.node.queue_wait",
        "voidbox.node.attempts",
        "voidbox.vm.start.duration",
        "gen_ai.client.token.usage",
        "voidbox.llm.cost",
        "voidbox.guest.cpu.time",
        "voidbox.guest.memory.usage",
    ] {
        assert!(m.contains_key(name), "metric {name} missing from {names:?}");
    }
    let nodes: HashSet<String> = m["voidbox.node.duration"]
        .iter()
        .filter_map(|(a, _)| a.get("voidbox.node.name")?.as_str().map(String::from))
        .collect();
    assert_eq!(nodes, ["seed", "count", "think"].map(String::from).into());
    let agent = think_agent(&report);
    let input_sum: f64 = m["gen_ai.client.token.usage"]
        .iter()
        .filter(|(a, _)| a.get("gen_ai.token.type").and_then(Value::as_str) == Some("input"))
        .map(|(_, v)| *v)
        .sum();
    assert_eq!(input_sum as u64, agent["input_tokens"].as_u64().unwrap());
    let mem: Vec<f64> = m["voidbox.guest.memory.usage"]
        .iter()
        .map(|(_, v)| *v)
        .collect();
    assert!(
        mem.len() >= 3 && mem.iter().all(|v| *v > 1e6),
        "guest memory: {mem:?}"
    );

    // Every request carried the headers of OTEL_EXPORTER_OTLP_HEADERS.
    let sent = std::fs::read_to_string(&sink_out).unwrap();
    assert!(sent.lines().count() >= 2);
    for line in sent.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["headers"]["x-vbx-test"], "observed", "{}", v["signal"]);
    }

    // Log records, each in the trace of the span it is about.
    let think = one(&spans, "node think");
    let records = log_records(&sink_out);
    let body = |r: &Value| r["body"]["stringValue"].as_str().unwrap_or("").to_string();
    let done = records
        .iter()
        .find(|r| body(r) == "think: succeeded")
        .unwrap_or_else(|| panic!("no `think: succeeded` record in {records:#?}"));
    assert_eq!(done["traceId"], TRACE_ID);
    assert_eq!(done["spanId"], id(think));
    assert_eq!(done["severityText"], "INFO");
    assert!(records
        .iter()
        .any(|r| body(r) == "observed: succeeded (exit code 0)"));
    assert!(records.iter().any(|r| body(r) == "seed: attempt 1 started"));

    // OTLP/gRPC with nothing but VOIDBOX_OTLP_ENDPOINT (and the protocol, as the port is not
    // 4317); Phoenix takes no metrics, so they are off.
    let project = format!("vbx-grpc-{}", std::process::id());
    let r = apply(
        dir.path(),
        SPEC,
        &["--output", "json"],
        &[
            ("VOIDBOX_OTLP_ENDPOINT", format!("http://127.0.0.1:{grpc}")),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".into()),
            ("OTEL_METRICS_EXPORTER", "none".into()),
            ("OTEL_SERVICE_NAME", project.clone()),
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(!r.stderr.contains("warning"), "{}", r.stderr);
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    let spans = phoenix_spans(http, &project, "voidbox apply observed");
    check_tree(&spans, &report, false, false);
}

#[test]
fn a_collector_that_is_down_or_silent_neither_fails_nor_holds_the_run() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on `down`; `silent` accepts connections and never answers.
    let down = free_port();
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        while let Ok((c, _)) = silent.accept() {
            conns.push(c);
            if conns.len() > 64 {
                break;
            }
        }
    });
    let spec = "api_version: v1\nkind: sandbox\nname: quiet\nsandbox: {memory_mb: 128}\nrun: {program: echo, args: [hi]}\n";
    let trace_file = dir.path().join("t.json");
    let r = apply(
        dir.path(),
        spec,
        &["--trace", trace_file.to_str().unwrap()],
        &[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                format!("http://127.0.0.1:{down}/v1/traces"),
            ),
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                format!("http://127.0.0.1:{silent_port}/v1/metrics"),
            ),
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stdout.trim(), "hi");
    let warnings = r.stderr.matches("warning: cannot export").count();
    assert_eq!(warnings, 1, "one warning: {}", r.stderr);
    assert!(
        r.stderr.contains(&format!("127.0.0.1:{down}")),
        "{}",
        r.stderr
    );
    // The spans are still written, whole, to --trace.
    let doc: Value = serde_json::from_slice(&std::fs::read(&trace_file).unwrap()).unwrap();
    let names: Vec<String> = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    for n in [
        "voidbox apply quiet",
        "node quiet",
        "attempt 1",
        "vm.start",
        "exec echo",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    // The run took its own time plus at most the flush budget (5 s), with a wide margin for
    // this loaded host: nothing waits on the silent collector's 10 s export timeout twice.
    eprintln!("run with a dead and a silent collector took {:?}", r.took);
    assert!(r.took < Duration::from_secs(240), "{:?}", r.took);
    drop(held);
}
