//! Host tests of the settings, the span tree built from scheduler events, and the OTLP JSON
//! document (the VM tests export real runs to Arize Phoenix: `tests/tests/vm_observe.rs`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use petgraph::graph::NodeIndex;
use serde_json::Value;

use super::config::{resolve, Protocol};
use super::*;
use crate::scheduler::progress::Silent;
use crate::scheduler::{AgentStats, Attempt, Event, NodeRecord, RunResult, Status as St};
use crate::spec::model::Observe;

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn nothing_is_recorded_without_an_endpoint_or_a_trace_file() {
    let s = resolve(None, &env(&[]), None).unwrap();
    assert!(s.is_off() && s.endpoint.is_none() && s.metrics_endpoint.is_none());
    let s = resolve(None, &env(&[]), Some("t.json".into())).unwrap();
    assert!(s.traces && !s.metrics && s.endpoint.is_none());
}

#[test]
fn endpoints_come_from_the_spec_then_voidbox_then_the_standard_variables() {
    let spec = Observe {
        otlp_endpoint: Some("http://collector:4317".into()),
        ..Observe::default()
    };
    let vars = [
        ("VOIDBOX_OTLP_ENDPOINT", "http://mine:4318/"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://std:4318"),
    ];
    let s = resolve(Some(&spec), &env(&vars), None).unwrap();
    let e = s.endpoint.unwrap();
    assert_eq!(
        (e.url.as_str(), e.protocol),
        ("http://collector:4317", Protocol::Grpc)
    );
    assert_eq!(e.source, "observe.otlp_endpoint");
    let s = resolve(None, &env(&vars), None).unwrap();
    assert_eq!(s.endpoint.unwrap().url, "http://mine:4318/v1/traces");
    assert_eq!(
        s.metrics_endpoint.unwrap().url,
        "http://mine:4318/v1/metrics"
    );
    let s = resolve(None, &env(&vars[1..]), None).unwrap();
    assert_eq!(s.endpoint.unwrap().url, "http://std:4318/v1/traces");
    // A signal's own variable is used as it is, with its own protocol.
    let s = resolve(
        None,
        &env(&[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9999/custom"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://std:4318"),
        ]),
        None,
    )
    .unwrap();
    let t = s.endpoint.unwrap();
    assert_eq!(
        (t.url.as_str(), t.protocol),
        ("http://t:9999/custom", Protocol::Grpc)
    );
    let m = s.metrics_endpoint.unwrap();
    assert_eq!(
        (m.url.as_str(), m.protocol),
        ("http://std:4318/v1/metrics", Protocol::HttpProtobuf)
    );
}

#[test]
fn switches_and_exporter_variables_turn_signals_off() {
    let vars = [("VOIDBOX_OTLP_ENDPOINT", "http://c:4318")];
    let off = Observe {
        metrics: Some(false),
        ..Observe::default()
    };
    let s = resolve(Some(&off), &env(&vars), None).unwrap();
    assert!(s.traces && !s.metrics);
    let s = resolve(
        None,
        &env(&[vars[0], ("OTEL_TRACES_EXPORTER", "none")]),
        None,
    )
    .unwrap();
    assert!(!s.traces && s.metrics);
    // Logs are opt-in: the spec's switch or OTEL_LOGS_EXPORTER=otlp.
    assert!(resolve(None, &env(&vars), None)
        .unwrap()
        .logs_endpoint
        .is_none());
    let logs = Observe {
        logs: Some(true),
        ..Observe::default()
    };
    let s = resolve(Some(&logs), &env(&vars), None).unwrap();
    assert_eq!(s.logs_endpoint.unwrap().url, "http://c:4318/v1/logs");
    let s = resolve(None, &env(&[vars[0], ("OTEL_LOGS_EXPORTER", "otlp")]), None).unwrap();
    assert!(s.logs_endpoint.is_some());
    let s = resolve(None, &env(&[vars[0], ("OTEL_SDK_DISABLED", "true")]), None).unwrap();
    assert!(s.is_off());
    // --trace FILE still gets the spans with export off.
    let s = resolve(
        None,
        &env(&[vars[0], ("OTEL_SDK_DISABLED", "true")]),
        Some("f".into()),
    )
    .unwrap();
    assert!(s.traces && s.endpoint.is_none());
}

#[test]
fn bad_values_are_errors_naming_their_source() {
    for (vars, needle) in [
        (
            vec![("VOIDBOX_OTLP_ENDPOINT", "localhost:4317")],
            "VOIDBOX_OTLP_ENDPOINT=localhost:4317",
        ),
        (
            vec![("VOIDBOX_OTLP_ENDPOINT", "ftp://x")],
            "http:// or https://",
        ),
        (
            vec![
                ("VOIDBOX_OTLP_ENDPOINT", "http://x"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "udp"),
            ],
            "OTEL_EXPORTER_OTLP_PROTOCOL=udp",
        ),
        (
            vec![("OTEL_METRICS_EXPORTER", "prometheus")],
            "OTEL_METRICS_EXPORTER=prometheus",
        ),
        (
            vec![
                ("VOIDBOX_OTLP_ENDPOINT", "http://x"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
            ],
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ),
    ] {
        let e = resolve(None, &env(&vars), None).unwrap_err();
        assert!(e.contains(needle), "{e}");
    }
}

#[test]
fn the_service_name_prefers_the_standard_variable() {
    let spec = Observe {
        service_name: Some("from-spec".into()),
        ..Observe::default()
    };
    let s = resolve(Some(&spec), &env(&[]), None).unwrap();
    assert_eq!(s.service_name, "from-spec");
    let s = resolve(Some(&spec), &env(&[("VOIDBOX_SERVICE_NAME", "vb")]), None).unwrap();
    assert_eq!(s.service_name, "vb");
    let s = resolve(
        Some(&spec),
        &env(&[
            ("VOIDBOX_SERVICE_NAME", "vb"),
            ("OTEL_SERVICE_NAME", "otel"),
        ]),
        None,
    )
    .unwrap();
    assert_eq!(s.service_name, "otel");
}

fn plan() -> Plan {
    let src = "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - {name: a, run: {program: echo}}\n    - {name: b, run: {program: echo}}\n    - {name: c, prompt: hi, llm: {provider: mock}}\n    - {name: d, run: {program: echo}}\n  stages:\n    - {type: box, name: a}\n    - {type: fan_out, boxes: [b, c]}\n    - {type: box, name: d}\n";
    let v = crate::validate::validate_source("p.yaml", src.to_string(), Path::new("."));
    let spec = v
        .spec
        .unwrap_or_else(|| panic!("{:?}", v.report.diagnostics));
    Plan::compile(&spec, Path::new("/")).expect("plan")
}

fn spans_of(doc: &Value) -> Vec<Value> {
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Drives an observer with scheduler events (as `apply` does) and reads the `--trace` file.
#[test]
fn scheduler_events_become_the_run_stage_node_attempt_tree_in_otlp_json() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.json");
    let settings = resolve(None, &env(&[]), Some(file.clone())).unwrap();
    let plan = plan();
    let obs = Observer::start(settings, &plan, Arc::new(Silent))
        .unwrap()
        .unwrap();
    obs.scheduling();
    let t0 = SystemTime::now();
    let ok = |agent: bool| {
        let mut a = Attempt::ok(b"out".to_vec());
        a.boot = Some(Duration::from_millis(500));
        a.restored = Some(true);
        a.phases.vm_start = Some((t0, t0 + Duration::from_millis(500)));
        a.phases.exec = Some((t0 + Duration::from_millis(600), t0 + Duration::from_secs(2)));
        a.phases.snapshot = Some("abc".into());
        if agent {
            a.agent = Some(AgentStats {
                runtime: "mock".into(),
                provider: "mock".into(),
                model: Some("m".into()),
                input_tokens: 12,
                output_tokens: 5,
                tool_calls: vec!["Read".into()],
                tool_timings: vec![crate::agent_output::ToolTiming {
                    name: "Read".into(),
                    id: Some("t1".into()),
                    started: t0 + Duration::from_secs(1),
                    ended: Some(t0 + Duration::from_millis(1500)),
                    is_error: false,
                }],
                ..AgentStats::default()
            });
        }
        a
    };
    let record = |a: Attempt, attempts: u32| NodeRecord {
        status: a.status,
        attempts,
        started: Some(Duration::ZERO),
        duration: Some(Duration::from_secs(2)),
        queue_wait: Some(Duration::from_millis(7)),
        last: Some(a),
    };
    let n = NodeIndex::new;
    // a: one attempt; b: fails once, then succeeds; c: the agent; d: skipped after c fails.
    obs.event(
        &plan,
        &Event::Started {
            node: n(0),
            attempt: 1,
        },
        None,
    );
    obs.attempt_ended(&plan, n(0), 1, t0, &ok(false));
    obs.event(
        &plan,
        &Event::Finished { node: n(0) },
        Some(&record(ok(false), 1)),
    );
    obs.event(
        &plan,
        &Event::Started {
            node: n(1),
            attempt: 1,
        },
        None,
    );
    obs.event(
        &plan,
        &Event::Started {
            node: n(2),
            attempt: 1,
        },
        None,
    );
    let failed = Attempt::failed(St::Failed, "echo failed: exit code 1");
    obs.attempt_ended(&plan, n(1), 1, t0, &failed);
    obs.event(
        &plan,
        &Event::Started {
            node: n(1),
            attempt: 2,
        },
        None,
    );
    obs.attempt_ended(&plan, n(1), 2, t0, &ok(false));
    obs.event(
        &plan,
        &Event::Finished { node: n(1) },
        Some(&record(ok(false), 2)),
    );
    let mut agent_failed = ok(true);
    agent_failed.status = St::Failed;
    agent_failed.error = Some("the agent runtime failed: no".into());
    obs.attempt_ended(&plan, n(2), 1, t0, &agent_failed);
    obs.event(
        &plan,
        &Event::Finished { node: n(2) },
        Some(&record(agent_failed, 1)),
    );
    let skipped = NodeRecord {
        status: St::Skipped,
        attempts: 0,
        started: None,
        duration: None,
        queue_wait: None,
        last: None,
    };
    obs.event(&plan, &Event::Finished { node: n(3) }, Some(&skipped));
    let result = RunResult {
        nodes: vec![],
        output: None,
        abort: None,
        duration: Duration::from_secs(3),
    };
    obs.end_run(&plan, &result, 1);
    let f = obs.shutdown();
    assert!(f.trace_file_error.is_none() && !f.timed_out, "{f:?}");

    let doc: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let spans = spans_of(&doc);
    let by_id: HashMap<&str, &Value> = spans
        .iter()
        .map(|s| (s["spanId"].as_str().unwrap(), s))
        .collect();
    let attr = |s: &Value, k: &str| -> Value {
        s["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|kv| kv["key"] == k)
            .map(|kv| kv["value"].clone())
            .unwrap_or(Value::Null)
    };
    // The path of names from the root to each span.
    let path = |s: &Value| -> String {
        let mut names = vec![s["name"].as_str().unwrap().to_string()];
        let mut cur = s;
        while let Some(p) = cur["parentSpanId"].as_str().filter(|p| !p.is_empty()) {
            cur = by_id[p];
            names.push(cur["name"].as_str().unwrap().to_string());
        }
        names.reverse();
        names.join(" > ")
    };
    let mut paths: Vec<String> = spans.iter().map(path).collect();
    paths.sort();
    let expected = [
        "voidbox apply p",
        "voidbox apply p > prepare",
        "voidbox apply p > stage a",
        "voidbox apply p > stage a > node a",
        "voidbox apply p > stage a > node a > attempt 1",
        "voidbox apply p > stage a > node a > attempt 1 > exec echo",
        "voidbox apply p > stage a > node a > attempt 1 > vm.start",
        "voidbox apply p > stage d",
        "voidbox apply p > stage d > node d",
        "voidbox apply p > stage fan_out[b, c]",
        "voidbox apply p > stage fan_out[b, c] > node b",
        "voidbox apply p > stage fan_out[b, c] > node b > attempt 1",
        "voidbox apply p > stage fan_out[b, c] > node b > attempt 2",
        "voidbox apply p > stage fan_out[b, c] > node b > attempt 2 > exec echo",
        "voidbox apply p > stage fan_out[b, c] > node b > attempt 2 > vm.start",
        "voidbox apply p > stage fan_out[b, c] > node c",
        "voidbox apply p > stage fan_out[b, c] > node c > attempt 1",
        "voidbox apply p > stage fan_out[b, c] > node c > attempt 1 > invoke_agent c",
        "voidbox apply p > stage fan_out[b, c] > node c > attempt 1 > invoke_agent c > execute_tool Read",
        "voidbox apply p > stage fan_out[b, c] > node c > attempt 1 > vm.start",
    ];
    assert_eq!(paths, expected);
    let named = |n: &str| spans.iter().find(|s| s["name"] == n).unwrap();
    let llm = named("invoke_agent c");
    assert_eq!(attr(llm, "openinference.span.kind")["stringValue"], "LLM");
    assert_eq!(attr(llm, "llm.token_count.prompt")["intValue"], "12");
    assert_eq!(attr(llm, "gen_ai.usage.output_tokens")["intValue"], "5");
    assert_eq!(attr(llm, "gen_ai.request.model")["stringValue"], "m");
    let tool = named("execute_tool Read");
    assert_eq!(attr(tool, "gen_ai.tool.call.id")["stringValue"], "t1");
    let dur = |s: &Value| {
        let n = |k: &str| s[k].as_str().unwrap().parse::<u64>().unwrap();
        n("endTimeUnixNano") - n("startTimeUnixNano")
    };
    assert_eq!(dur(tool), 500_000_000);
    let vm = named("vm.start");
    assert_eq!(attr(vm, "voidbox.vm.snapshot")["stringValue"], "abc");
    assert_eq!(dur(vm), 500_000_000);
    // Statuses: the failed attempt and agent are errors with their reason; the fan-out stage
    // failed; the skipped node is unset; the run failed with its exit code.
    let status = |s: &Value| s["status"]["code"].as_i64().unwrap_or(0);
    let root = named("voidbox apply p");
    assert_eq!(status(root), 2);
    assert_eq!(attr(root, "voidbox.run.exit_code")["intValue"], "1");
    assert!(root["parentSpanId"].as_str().unwrap_or("").is_empty());
    assert_eq!(status(named("stage fan_out[b, c]")), 2);
    assert_eq!(status(named("stage a")), 1);
    assert_eq!(status(named("node d")), 0);
    assert_eq!(
        attr(named("node b"), "voidbox.node.attempts")["intValue"],
        "2"
    );
    let first = spans
        .iter()
        .find(|s| s["name"] == "attempt 1" && path(s).contains("node b"))
        .unwrap();
    assert_eq!(status(first), 2);
    assert_eq!(first["status"]["message"], "echo failed: exit code 1");
    // One trace.
    let traces: std::collections::HashSet<&str> = spans
        .iter()
        .map(|s| s["traceId"].as_str().unwrap())
        .collect();
    assert_eq!(traces.len(), 1);
}

#[test]
fn a_traceparent_makes_the_run_a_child_and_a_bad_one_is_ignored() {
    for (tp, child) in [
        (
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            true,
        ),
        ("00-zz-00f067aa0ba902b7-01", false),
    ] {
        let root = early_run_span(&[("TRACEPARENT", tp)], 3);
        assert_eq!(root["status"]["code"], 2);
        if child {
            assert_eq!(root["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
            assert_eq!(root["parentSpanId"], "00f067aa0ba902b7");
        } else {
            assert!(root["parentSpanId"].as_str().unwrap_or("").is_empty());
        }
    }
}

/// The run span of a run that ended early with exit `code`, under the variables `vars`,
/// read back from its trace file.
fn early_run_span(vars: &[(&str, &str)], code: u8) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.json");
    let settings = resolve(None, &env(vars), Some(file.clone())).unwrap();
    let obs = Observer::start(settings, &plan(), Arc::new(Silent))
        .unwrap()
        .unwrap();
    obs.end_early(code);
    obs.shutdown();
    let doc: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    spans_of(&doc)
        .into_iter()
        .find(|s| s["name"] == "voidbox apply p")
        .unwrap()
        .clone()
}

/// Runners of one distributed run share `VOIDBOX_RUN_ID`: their traces are one, under one
/// parent; another run id is another trace; `TRACEPARENT` wins over it.
#[test]
fn a_run_id_gives_every_runner_of_the_run_one_trace() {
    let tp = |vars: &[(&str, &str)]| resolve(None, &env(vars), None).unwrap().traceparent;
    let a = tp(&[("VOIDBOX_RUN_ID", "3f2c-uid")]).unwrap().0;
    assert_eq!(tp(&[("VOIDBOX_RUN_ID", "3f2c-uid")]).unwrap().0, a);
    assert_ne!(tp(&[("VOIDBOX_RUN_ID", "3f2c-uid2")]).unwrap().0, a);
    let parts: Vec<&str> = a.split('-').collect();
    assert_eq!(parts.len(), 4, "{a}");
    assert_eq!(
        (parts[0], parts[1].len(), parts[2].len(), parts[3]),
        ("00", 32, 16, "01")
    );
    assert!(parts[1].chars().all(|c| c.is_ascii_hexdigit()) && parts[1] != "0".repeat(32));
    let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let both = tp(&[("VOIDBOX_RUN_ID", "3f2c-uid"), ("TRACEPARENT", given)]);
    assert_eq!(both.unwrap().0, given);
    // The derived parent is valid W3C: a run's spans hang under it.
    let root = early_run_span(&[("VOIDBOX_RUN_ID", "3f2c-uid")], 0);
    assert_eq!(root["traceId"], parts[1]);
    assert_eq!(root["parentSpanId"], parts[2]);
}

#[test]
fn an_unwritable_trace_file_is_reported() {
    let settings = resolve(None, &env(&[]), Some("/nonexistent-dir/t.json".into())).unwrap();
    let obs = Observer::start(settings, &plan(), Arc::new(Silent))
        .unwrap()
        .unwrap();
    obs.end_early(0);
    let f = obs.shutdown();
    assert!(f
        .trace_file_error
        .unwrap()
        .contains("/nonexistent-dir/t.json"));
}
