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
//!                "stderr_tail": str|null,   // failed / timed-out nodes: the last 8 KiB of
//!                                           // stderr, the node's secrets redacted
//!                "timeout": null|{ "limit": str, "secs": int },
//!                "agent": null|{ "runtime": "claude-code"|"codex"|"mock", "provider": str,
//!                                "model", "input_tokens", "output_tokens", "cached_tokens",
//!                                "cost_usd", "num_turns", "tool_calls": [str],
//!                                "skills": [str], "mcp_servers": [str], "warnings": [str],
//!                                "result" (whole) },
//!                "gateway": null|{ "requests": int, "refused": int,
//!                                  "upstream_errors": int, "input_tokens": int,
//!                                  "output_tokens": int, "cached_tokens": int },
//!                "artifacts": [ { "name": str, "files": int, "bytes": int,
//!                                 "skipped": int } ],
//!                "network": null|{ "policy": { "allow_host_ports": [int],
//!                                    "allow_domains": [str], "allow": [str],
//!                                    "deny": [str], "max_connections": int,
//!                                    "connections_per_second": int,
//!                                    "public_egress": bool },
//!                                  "denials": [ { "destination": str, "port": int,
//!                                                 "protocol": "tcp"|"udp"|"icmp"|"dns",
//!                                                 "reason": str, "count": int } ] },
//!                "service": null|{ "ready_ms": int|null, "ports": [int],
//!                                  "connections": int,
//!                                  "ended": "exited"|"stopped"|"died"|"not_ready"|"cancelled" },
//!                "kit": null|{ "skills": [ { "name": str, "files": int, "bytes": int,
//!                                            "redactions": int, "binary_files": int } ],
//!                              "instructions": null|{ "path": str, "sources": [str],
//!                                                     "bytes": int, "redactions": int },
//!                              "error": str (only when the kit cannot be staged) } } ],
//!   "timeout": null|{ "limit": "pipeline timeout_secs", "secs": int } }
//! ```
//!
//! `network` is `null` for a node without a network device; else its effective policy and
//! what the NAT of its last attempt's VM denied (cumulative counts per destination, port,
//! protocol and reason; `destination` is the queried name for `dns`). An agent box with a
//! real runtime and no `network` has a device that reaches its credential gateway only:
//! `{"policy": null, "gateway_only": true, "denials": [...]}`.
//!
//! `gateway` is what the node's credential gateway ([`crate::gateway`]) forwarded to the
//! model for its last attempt (requests with the VM's token, refused ones, upstream
//! failures, and the token counts read from the responses); `null` for other nodes.
//!
//! `kit` is `null` for a node that is not an agent; else its skills kit ([`crate::kit`]):
//! per skill the files staged into the guest, their bytes after redaction, the secrets
//! redacted and the binary files copied untouched, and the instructions file made of the
//! spec's `prompt_files` (its guest path, the files by name, bytes, redactions) — as
//! recorded by the last attempt that
//! staged it into a VM; a node that never got that far (skipped, cancelled, or the kit
//! failed) shows the kit staged from the spec, or, when that fails, empty `skills` and
//! `error` saying why.
//!
//! `timeout` names the limit that fired and its value: on a `timed_out` node its own
//! (`"node timeout_secs"` or `"default node timeout"`), on the run and on the nodes it
//! cancelled the spec's `"pipeline timeout_secs"`.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use crate::limits::Timeout;
use crate::plan::{Plan, PlanNode};
use crate::scheduler::data::element;
use crate::scheduler::{Abort, NodeRecord, RunResult, Status};

/// Report format version.
pub const REPORT_VERSION: u64 = 1;

use crate::units::secs;

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

/// The pipeline limit that stopped the run, when it did.
pub fn run_timeout(plan: &Plan, r: &RunResult) -> Option<Timeout> {
    match (r.abort, plan.timeout_secs) {
        (Some(Abort::Timeout), Some(secs)) => Some(Timeout::pipeline(secs)),
        _ => None,
    }
}

/// The limit that ended a node: its own for a timed-out node, the pipeline's for a node the
/// pipeline timeout cancelled.
pub fn node_timeout(
    plan: &Plan,
    r: &RunResult,
    node: &PlanNode,
    n: &NodeRecord,
) -> Option<Timeout> {
    match n.status {
        Status::TimedOut => Some(node.timeout()),
        Status::Cancelled => run_timeout(plan, r),
        _ => None,
    }
}

/// The JSON report.
pub fn json_report(
    plan: &Plan,
    remotes: &crate::kit::Remotes,
    r: &RunResult,
    exit_code: u8,
) -> Value {
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
                "stderr_tail": a
                    .filter(|a| failed(n.status) && !a.stderr_tail.is_empty())
                    .map(|a| a.stderr_tail.clone()),
                "timeout": node_timeout(plan, r, &plan.graph[idx], n).map_or(Value::Null, |t| t.to_json()),
                "agent": a.and_then(|a| a.agent.as_ref()).map_or(Value::Null, |s| json!(s)),
                "runtime": a.and_then(|a| a.runtime_start.as_ref()).map_or(Value::Null, |s| json!(s)),
                "artifacts": a.map_or(json!([]), |a| json!(a.artifacts)),
                "network": network(&plan.graph[idx], a),
                "kit": kit(plan, remotes, &plan.graph[idx], a),
                "gateway": a.and_then(|a| a.gateway.as_ref()).map_or(Value::Null, |g| json!(g)),
                "service": a.and_then(|a| a.service.as_ref()).map_or(Value::Null, |s| json!(s)),
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
        "timeout": run_timeout(plan, r).map_or(Value::Null, |t| t.to_json()),
    })
}

/// A node that failed or timed out (whose error and stderr the reports show).
fn failed(s: Status) -> bool {
    matches!(s, Status::Failed | Status::TimedOut)
}

/// Lines of a failed node's stderr tail shown in the summary.
const SUMMARY_STDERR_LINES: usize = 10;
/// Characters of one such line shown (the JSON report and JUnit keep it whole).
const SUMMARY_STDERR_WIDTH: usize = 240;

/// The last [`SUMMARY_STDERR_LINES`] non-blank lines of `tail`, each cut to
/// [`SUMMARY_STDERR_WIDTH`] characters and made [`visible`](crate::diagnostic::visible) (a
/// guest's escape sequences never reach the terminal).
fn stderr_lines(tail: &str) -> Vec<String> {
    let lines: Vec<&str> = tail.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(SUMMARY_STDERR_LINES)..]
        .iter()
        .map(|l| {
            let cut: String = l.chars().take(SUMMARY_STDERR_WIDTH).collect();
            let more = if cut.len() < l.len() { " …" } else { "" };
            format!("{}{more}", crate::diagnostic::visible(&cut))
        })
        .collect()
}

/// A node's `network` entry: its policy and its last attempt's denials; `null` without a
/// network device.
fn network(node: &PlanNode, a: Option<&crate::scheduler::Attempt>) -> Value {
    match &node.sandbox.network {
        None if a.is_some_and(|a| a.gateway.is_some()) => json!({
            "policy": Value::Null,
            "gateway_only": true,
            "denials": a.map_or(json!([]), |a| json!(a.net_denials)),
        }),
        None => Value::Null,
        Some(policy) => json!({
            "policy": policy,
            "denials": a.map_or(json!([]), |a| json!(a.net_denials)),
        }),
    }
}

/// A node's `kit` entry: the skills kit its last attempt staged into its VM; for an agent
/// node that never got that far, the kit staged from the spec (or why it cannot be); `null`
/// for a node that is not an agent.
fn kit(
    plan: &Plan,
    remotes: &crate::kit::Remotes,
    node: &PlanNode,
    a: Option<&crate::scheduler::Attempt>,
) -> Value {
    if let Some(k) = a.and_then(|a| a.kit.as_ref()) {
        return json!(k);
    }
    match crate::kit::for_node(plan, remotes, node, &|k| std::env::var(k).ok()) {
        None => Value::Null,
        Some(Ok(k)) => json!(k.report()),
        Some(Err(e)) => json!({ "skills": [], "instructions": null, "error": e.to_string() }),
    }
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
            .filter(|_| n.status != Status::Succeeded)
        {
            for l in e.lines().take(6) {
                let _ = writeln!(s, "{:w$}  {}", "", crate::diagnostic::visible(l));
            }
        }
        if let Some(a) = n.last.as_ref().filter(|_| failed(n.status)) {
            let lines = stderr_lines(&a.stderr_tail);
            if !lines.is_empty() {
                let plural = if lines.len() == 1 { "line" } else { "lines" };
                let _ = writeln!(s, "{:w$}  stderr, last {} {plural}:", "", lines.len());
                for l in lines {
                    let _ = writeln!(s, "{:w$}  | {l}", "");
                }
            }
        }
        if let Some(d) = n
            .last
            .as_ref()
            .map(|a| &a.net_denials)
            .filter(|d| !d.is_empty())
        {
            let _ = writeln!(
                s,
                "{:w$}  network: {} connection attempt{} denied",
                "",
                crate::network::denial_total(d),
                if crate::network::denial_total(d) == 1 {
                    ""
                } else {
                    "s"
                }
            );
            for l in crate::network::denial_lines(d, 5) {
                let _ = writeln!(s, "{:w$}    {l}", "");
            }
        }
        if let Some(st) = n.last.as_ref().and_then(|a| a.agent.as_ref()) {
            // A runtime that spent nothing (the mock, a local model) shows no dollar figure.
            let cost = if st.cost_usd > 0.0 {
                format!(", ${:.6}", st.cost_usd)
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "{:w$}  agent ({}): {} in / {} out tokens{cost}, {} tool calls",
                "",
                st.runtime,
                st.input_tokens,
                st.output_tokens,
                st.tool_calls.len()
            );
        }
    }
    let fired = run_timeout(plan, r).map_or(String::new(), |t| format!(" ({t} fired)"));
    let _ = writeln!(
        s,
        "{}: {} in {}{fired}",
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
                let why = match node_timeout(plan, r, node, n) {
                    Some(t) => format!("{}: {t} fired", n.status.as_str()),
                    None if n.status == Status::Cancelled && err.starts_with("cancelled") => {
                        err.lines().next().unwrap_or("cancelled").to_string()
                    }
                    None => n.status.as_str().to_string(),
                };
                let _ = writeln!(
                    x,
                    ">\n      <skipped message=\"{}\"/>\n    </testcase>",
                    xml_escape(&why)
                );
            }
        }
    }
    x.push_str("  </testsuite>\n</testsuites>\n");
    x
}

#[cfg(test)]
mod timeout_tests {
    use std::path::Path;

    use super::*;
    use crate::scheduler::Attempt;

    fn plan(src: &str) -> Plan {
        let v = crate::validate::validate_source("t.yaml", src.to_string(), Path::new("."));
        let spec = v
            .spec
            .unwrap_or_else(|| panic!("{:?}", v.report.diagnostics));
        Plan::compile(&spec, Path::new("/")).expect("plan")
    }

    fn record(status: Status, error: &str) -> NodeRecord {
        NodeRecord {
            status,
            attempts: 1,
            started: Some(Duration::ZERO),
            duration: Some(Duration::from_secs(1)),
            queue_wait: None,
            last: Some(Attempt::failed(status, error)),
        }
    }

    const TWO: &str = "kind: pipeline\nname: p\ntimeout_secs: 60\npipeline:\n  boxes:\n    - {name: own, run: {program: sleep}, timeout_secs: 30}\n    - {name: dflt, run: {program: sleep}}\n  stages:\n    - {type: fan_out, boxes: [own, dflt]}\n";

    #[test]
    fn a_timed_out_node_names_its_limit() {
        let p = plan(TWO);
        let own = p.graph.node_weights().next().expect("node").timeout();
        let dflt = p.graph.node_weights().nth(1).expect("node").timeout();
        let r = RunResult {
            nodes: vec![
                record(
                    Status::TimedOut,
                    &format!("timed out: {own} fired (the guest killed the command)"),
                ),
                record(
                    Status::TimedOut,
                    &format!("timed out: {dflt} fired (host deadline; the VM was killed)"),
                ),
            ],
            output: None,
            abort: Some(Abort::FailFast),
            duration: Duration::from_secs(2),
        };
        let doc = json_report(&p, &crate::kit::Remotes::new(), &r, 1);
        assert_eq!(
            doc["nodes"][0]["timeout"],
            json!({"limit": "node timeout_secs", "secs": 30})
        );
        assert_eq!(
            doc["nodes"][1]["timeout"],
            json!({"limit": "default node timeout", "secs": crate::limits::DEFAULT_NODE_TIMEOUT_SECS})
        );
        assert_eq!(doc["timeout"], Value::Null);
        let table = summary_table(&p, &r);
        assert!(
            table.contains("timed out: node timeout_secs=30 s fired"),
            "{table}"
        );
        assert!(
            table.contains("timed out: default node timeout 1800 s fired"),
            "{table}"
        );
        assert!(!table.contains("after 0s"), "{table}");
        let x = junit(&p, &r);
        assert!(
            x.contains("message=\"timed out: node timeout_secs=30 s fired"),
            "{x}"
        );
    }

    #[test]
    fn network_nodes_report_their_policy_and_the_vmm_s_denials() {
        let p = plan("kind: pipeline\nname: p\nsandbox:\n  network: {allow_host_ports: [11434], deny: [198.51.100.0/24]}\npipeline:\n  boxes:\n    - {name: net, run: {program: curl}}\n    - {name: off, run: {program: echo}, sandbox: {network: false}}\n");
        // What the VMM reported, as the engine reads it from its status stream.
        let log = crate::sandbox::status::StatusLog::default();
        crate::sandbox::status::pump(
            &b"{\"event\":\"net_denials\",\"denials\":[{\"destination\":\"10.0.2.2\",\"port\":22,\"protocol\":\"tcp\",\"reason\":\"host port not allowed\",\"count\":2},{\"destination\":\"169.254.169.254\",\"port\":80,\"protocol\":\"tcp\",\"reason\":\"metadata\",\"count\":1}]}\n"[..],
            &log,
        );
        let mut failed = Attempt::failed(Status::Failed, "curl failed: exit code 7");
        failed.net_denials = log.net_denials();
        let r = RunResult {
            nodes: vec![
                NodeRecord {
                    last: Some(failed),
                    ..record(Status::Failed, "")
                },
                record(Status::Skipped, "skipped"),
            ],
            output: None,
            abort: Some(Abort::FailFast),
            duration: Duration::from_secs(2),
        };
        let doc = json_report(&p, &crate::kit::Remotes::new(), &r, 1);
        assert_eq!(
            doc["nodes"][0]["network"],
            json!({
                "policy": {
                    "allow_host_ports": [11434],
                    "allow_domains": [],
                    "allow": [],
                    "deny": ["198.51.100.0/24"],
                    "max_connections": voidbox_net::DEFAULT_MAX_CONNECTIONS,
                    "connections_per_second": voidbox_net::DEFAULT_CONNECTIONS_PER_SECOND,
                    "public_egress": true,
                },
                "denials": [
                    {"destination": "10.0.2.2", "port": 22, "protocol": "tcp", "reason": "host port not allowed", "count": 2},
                    {"destination": "169.254.169.254", "port": 80, "protocol": "tcp", "reason": "metadata", "count": 1},
                ],
            })
        );
        assert_eq!(doc["nodes"][1]["network"], Value::Null);
        let table = summary_table(&p, &r);
        assert!(
            table.contains("network: 3 connection attempts denied"),
            "{table}"
        );
        assert!(
            table.contains("10.0.2.2:22/tcp: host port not allowed ×2"),
            "{table}"
        );
    }

    #[test]
    fn a_pipeline_timeout_names_the_pipeline_limit() {
        let p = plan(TWO);
        let r = RunResult {
            nodes: vec![
                record(Status::Cancelled, "cancelled"),
                record(Status::Cancelled, "cancelled"),
            ],
            output: None,
            abort: Some(Abort::Timeout),
            duration: Duration::from_secs(60),
        };
        let doc = json_report(&p, &crate::kit::Remotes::new(), &r, 1);
        let want = json!({"limit": "pipeline timeout_secs", "secs": 60});
        assert_eq!(doc["timeout"], want);
        assert_eq!(doc["nodes"][1]["timeout"], want);
        assert_eq!(doc["status"], "timed_out");
        let table = summary_table(&p, &r);
        assert!(
            table.contains("p: timed_out in 60.0s (pipeline timeout_secs=60 s fired)"),
            "{table}"
        );
        let x = junit(&p, &r);
        assert!(
            x.contains("<skipped message=\"cancelled: pipeline timeout_secs=60 s fired\"/>"),
            "{x}"
        );
    }

    #[test]
    fn agent_nodes_report_their_kit_and_other_nodes_none() {
        let p = plan("kind: pipeline\nname: p\nllm: {provider: mock}\npipeline:\n  boxes:\n    - name: a\n      prompt: hi\n      skills: [{name: s, content: \"token xoxb-123456789012-abc\"}]\n    - {name: c, run: {program: echo}}\n    - {name: bad, prompt: hi, skills: [\"remote:o/r/s\"]}\n");
        let r = RunResult {
            nodes: vec![
                record(Status::Succeeded, ""),
                record(Status::Succeeded, ""),
                record(Status::Failed, "x"),
            ],
            output: None,
            abort: None,
            duration: Duration::from_secs(1),
        };
        let doc = json_report(&p, &crate::kit::Remotes::new(), &r, 1);
        assert_eq!(
            doc["nodes"][0]["kit"],
            json!({"skills": [{"name": "s", "files": 1, "bytes": doc["nodes"][0]["kit"]["skills"][0]["bytes"], "redactions": 1, "binary_files": 0}], "instructions": null})
        );
        assert!(
            doc["nodes"][0]["kit"]["skills"][0]["bytes"]
                .as_u64()
                .unwrap()
                > 0
        );
        assert_eq!(doc["nodes"][1]["kit"], Value::Null);
        // What an attempt staged into its VM wins over staging the spec again.
        let mut staged = r.clone();
        if let Some(a) = staged.nodes[0].last.as_mut() {
            a.kit = Some(crate::kit::KitSummary {
                skills: vec![crate::kit::SkillSummary {
                    name: "as-staged".into(),
                    files: 3,
                    bytes: 7,
                    redactions: 2,
                    binary_files: 0,
                    remote: None,
                }],
                instructions: None,
            });
        }
        let doc2 = json_report(&p, &crate::kit::Remotes::new(), &staged, 1);
        assert_eq!(
            doc2["nodes"][0]["kit"],
            json!({"skills": [{"name": "as-staged", "files": 3, "bytes": 7, "redactions": 2, "binary_files": 0}], "instructions": null})
        );
        let e = doc["nodes"][2]["kit"]["error"].as_str().unwrap();
        assert!(
            e.starts_with("skill `remote:o/r/s`: internal: `remote:o/r/s` was not fetched"),
            "{e}"
        );
    }
}
