//! Run reports: the summary table (stderr), the JSON report (`--output json`) and JUnit XML
//! (`--junit PATH`).
//!
//! JSON report, version 1 (stable; fields are only ever added):
//! ```text
//! { "version": 1, "name": str, "kind": str,
//!   "status": "succeeded"|"failed"|"timed_out"|"cancelled", "exit_code": int,
//!   "abort": null|"fail_fast"|"timeout"|"signal", "duration_ms": int,
//!   "output": any|null,            // final output (JSON kept, else a string)
//!   "nodes": [ { "name": str, "status": "succeeded"|"failed"|"timed_out"|"cancelled"|"skipped",
//!                "attempts": int, "started_ms": int|null, "duration_ms": int|null,
//!                "boot_ms": int|null, "vm_start": null|"snapshot"|"cold",
//!                "exec_ms": int|null, "exit_code": int|null,
//!                "signal": int|null, "output_bytes": int|null, "console_log": str|null,
//!                "error": str|null,
//!                "agent": null|{ "model", "input_tokens", "output_tokens", "cost_usd",
//!                                "num_turns", "tool_calls": [str], "result" } } ] }
//! ```

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use super::data::element;
use super::scheduler::{Abort, RunResult, Status};
use crate::plan::Plan;

/// Report format version.
pub const REPORT_VERSION: u64 = 1;

/// `12.3s`.
pub fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn ms(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| json!(d.as_millis() as u64))
}

/// The run's overall status word.
pub fn run_status(r: &RunResult) -> &'static str {
    match r.abort {
        Some(Abort::Timeout) => "timed_out",
        Some(Abort::Signal(_)) => "cancelled",
        _ if r.success() => "succeeded",
        _ => "failed",
    }
}

/// The JSON report.
pub fn json_report(plan: &Plan, r: &RunResult, exit_code: u8) -> Value {
    let nodes: Vec<Value> = plan
        .graph
        .node_indices()
        .zip(&r.nodes)
        .map(|(idx, n)| {
            let a = n.last.as_ref();
            json!({
                "name": plan.graph[idx].name,
                "status": n.status.as_str(),
                "attempts": n.attempts,
                "started_ms": ms(n.started),
                "duration_ms": ms(n.duration),
                "boot_ms": ms(a.and_then(|a| a.boot)),
                "vm_start": a.and_then(|a| a.restored).map(|r| if r { "snapshot" } else { "cold" }),
                "exec_ms": ms(a.and_then(|a| a.exec)),
                "exit_code": a.and_then(|a| a.exit_code),
                "signal": a.and_then(|a| a.signal),
                "output_bytes": a.filter(|_| n.status == Status::Succeeded).map(|a| a.output.len()),
                "console_log": a.and_then(|a| a.console_log.as_ref()).map(|p| p.display().to_string()),
                "error": a.and_then(|a| a.error.clone()),
                "agent": a.and_then(|a| a.agent.as_ref()).map_or(Value::Null, |s| json!(s)),
            })
        })
        .collect();
    json!({
        "version": REPORT_VERSION,
        "name": plan.name,
        "kind": plan.kind.as_str(),
        "status": run_status(r),
        "exit_code": exit_code,
        "abort": match r.abort {
            None => Value::Null,
            Some(Abort::FailFast) => json!("fail_fast"),
            Some(Abort::Timeout) => json!("timeout"),
            Some(Abort::Signal(_)) => json!("signal"),
        },
        "duration_ms": r.duration.as_millis() as u64,
        "output": r.output.as_deref().map_or(Value::Null, element),
        "nodes": nodes,
    })
}

/// The summary table (node, status, attempts, duration), for stderr.
pub fn summary_table(plan: &Plan, r: &RunResult) -> String {
    let names: Vec<&str> = plan.graph.node_weights().map(|n| n.name.as_str()).collect();
    let w = names.iter().map(|n| n.len()).max().unwrap_or(4).max(4);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<w$}  {:<10}  {:>8}  {:>9}",
        "NODE", "STATUS", "ATTEMPTS", "DURATION"
    );
    for (name, n) in names.iter().zip(&r.nodes) {
        let d = n.duration.map_or_else(|| "-".to_string(), secs);
        let _ = writeln!(
            s,
            "{name:<w$}  {:<10}  {:>8}  {d:>9}",
            n.status.as_str(),
            n.attempts
        );
        if let Some(e) = n
            .last
            .as_ref()
            .and_then(|a| a.error.as_deref())
            .filter(|_| n.status != Status::Succeeded && n.status != Status::Cancelled)
        {
            for l in e.lines().take(6) {
                let _ = writeln!(s, "{:w$}  {l}", "");
            }
        }
        if let Some(st) = n.last.as_ref().and_then(|a| a.agent.as_ref()) {
            let _ = writeln!(
                s,
                "{:w$}  agent: {} in / {} out tokens, ${:.6}, {} tool calls",
                "",
                st.input_tokens,
                st.output_tokens,
                st.cost_usd,
                st.tool_calls.len()
            );
        }
    }
    let _ = writeln!(
        s,
        "{}: {} in {}",
        plan.name,
        run_status(r),
        secs(r.duration)
    );
    s
}

/// XML text escaping (also drops characters XML 1.0 forbids).
pub fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            '\t' | '\n' | '\r' => o.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {}
            c => o.push(c),
        }
    }
    o
}

/// JUnit XML: one `<testsuite>` for the run, one `<testcase>` per node; failures and time-outs
/// carry the error and the stderr tail, skipped and cancelled nodes are `<skipped/>`.
pub fn junit(plan: &Plan, r: &RunResult) -> String {
    let count = |s: Status| r.nodes.iter().filter(|n| n.status == s).count();
    let failures = count(Status::Failed) + count(Status::TimedOut);
    let skipped = count(Status::Skipped) + count(Status::Cancelled);
    let name = xml_escape(&plan.name);
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        "<testsuites name=\"voidbox\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"{:.3}\">",
        r.nodes.len(),
        r.duration.as_secs_f64()
    );
    let _ = writeln!(
        x,
        "  <testsuite name=\"{name}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"{:.3}\">",
        r.nodes.len(),
        r.duration.as_secs_f64()
    );
    for (node, n) in plan.graph.node_weights().zip(&r.nodes) {
        let t = n.duration.map_or(0.0, |d| d.as_secs_f64());
        let _ = write!(
            x,
            "    <testcase name=\"{}\" classname=\"{name}\" time=\"{t:.3}\"",
            xml_escape(&node.name)
        );
        let err = n
            .last
            .as_ref()
            .and_then(|a| a.error.clone())
            .unwrap_or_default();
        let tail = n
            .last
            .as_ref()
            .map(|a| a.stderr_tail.clone())
            .unwrap_or_default();
        match n.status {
            Status::Succeeded => x.push_str("/>\n"),
            Status::Failed | Status::TimedOut => {
                let _ = writeln!(
                    x,
                    ">\n      <failure message=\"{}\" type=\"{}\">{}</failure>\n      <system-err>{}</system-err>\n    </testcase>",
                    xml_escape(err.lines().next().unwrap_or("failed")),
                    n.status.as_str(),
                    xml_escape(&err),
                    xml_escape(&tail)
                );
            }
            Status::Skipped | Status::Cancelled => {
                let _ = writeln!(
                    x,
                    ">\n      <skipped message=\"{}\"/>\n    </testcase>",
                    n.status.as_str()
                );
            }
        }
    }
    x.push_str("  </testsuite>\n</testsuites>\n");
    x
}
