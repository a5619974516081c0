//! Scheduler tests with a fake executor (no VMs): ordering, merging, cancellation, retries,
//! timeouts, budgets; and report rendering.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::watch;

use super::*;
use crate::plan::{Action, Plan};
use crate::scheduler::cancel::NodeControl;
use crate::scheduler::progress::Silent;
use crate::scheduler::{
    backoff, run_plan, Abort, Attempt, Executor, Job, RunResult, SchedOptions, Status,
};

fn plan(src: &str) -> Plan {
    crate::plan::compile_for_test(src)
}

/// Programs: `echo TEXT` outputs TEXT; `cat` outputs its stdin; `sleep MS` sleeps (until
/// stopped) then outputs `slept`; `fail` fails; `flaky N` fails before attempt N;
/// `input` outputs its input.json; `serve MS` (a service) is ready at once with the output
/// `ready`, then exits with 0 after MS unless stopped first.
#[derive(Default)]
struct Fake {
    log: Mutex<Vec<String>>,
    running: Mutex<(usize, usize)>,
}

impl Executor for Fake {
    fn run(&self, job: &Job, ctl: &NodeControl) -> Attempt {
        let Action::Command(c) = &job.node.action else {
            return Attempt::failed(Status::Failed, "not a command");
        };
        {
            let mut r = self.running.lock().unwrap();
            r.0 += 1;
            r.1 = r.1.max(r.0);
        }
        self.log
            .lock()
            .unwrap()
            .push(format!("start {}#{}", job.node.name, job.attempt));
        if let Some(t) = job.node.timeout_secs {
            ctl.arm_deadline(Duration::from_millis(t * 100));
        }
        let arg = c.args.first().cloned().unwrap_or_default();
        let a = match c.program.as_deref().unwrap_or_default() {
            "echo" => Attempt::ok(arg.into_bytes()),
            "cat" => Attempt::ok(job.input.stdin.clone().unwrap_or_default()),
            "input" => Attempt::ok(job.input.file.clone().unwrap_or_default()),
            "sleep" => {
                let ms = arg.parse().unwrap_or(0);
                match ctl.wait_stopped(Duration::from_millis(ms)) {
                    Some(_) => Attempt::failed(Status::Failed, "killed"),
                    None => Attempt::ok(b"slept".to_vec()),
                }
            }
            "flaky" if job.attempt >= arg.parse().unwrap_or(1) => Attempt::ok(b"ok".to_vec()),
            "serve" => {
                ctl.ready(b"ready".to_vec());
                let mut a = match ctl.wait_stopped(Duration::from_millis(arg.parse().unwrap_or(0)))
                {
                    Some(_) => Attempt::failed(Status::Failed, "killed"),
                    None => Attempt::ok(b"exited".to_vec()),
                };
                a.service = Some(crate::scheduler::ServiceStats::default());
                a
            }
            "big" => Attempt::failed(
                Status::Failed,
                crate::capped::over_cap("stdout", 99, job.max_output),
            ),
            _ => Attempt::failed(Status::Failed, "exit code 1"),
        };
        self.running.lock().unwrap().0 -= 1;
        self.log
            .lock()
            .unwrap()
            .push(format!("end {}#{}", job.node.name, job.attempt));
        a
    }
}

fn opts(max_parallel: usize) -> SchedOptions {
    SchedOptions {
        max_parallel,
        memory_budget_mb: 1 << 20,
        vm_overhead_mb: 0,
        max_output: 1 << 20,
        retry_base: Duration::from_millis(5),
        run_input: None,
        given_input: None,
    }
}

fn run(p: Plan, exec: Arc<Fake>, o: SchedOptions) -> RunResult {
    run_cancel(p, exec, o, None)
}

fn run_cancel(
    p: Plan,
    exec: Arc<Fake>,
    o: SchedOptions,
    cancel_after: Option<Duration>,
) -> RunResult {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let (tx, rx) = watch::channel(None);
        if let Some(d) = cancel_after {
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                let _ = tx.send(Some(Abort::Signal(libc::SIGINT)));
            });
        } else {
            std::mem::forget(tx);
        }
        run_plan(Arc::new(p), exec, o, Arc::new(Silent), rx).await
    })
}

fn pipeline(boxes: &str, stages: &str, extra: &str) -> Plan {
    plan(&format!(
        "api_version: v1\nkind: pipeline\nname: t\n{extra}pipeline:\n  boxes:\n{boxes}  stages:\n{stages}"
    ))
}

fn bx(name: &str, program: &str, arg: &str, more: &str) -> String {
    format!("    - name: {name}\n      run: {{program: {program}, args: [\"{arg}\"]}}\n{more}")
}

fn statuses(r: &RunResult) -> Vec<Status> {
    r.nodes.iter().map(|n| n.status).collect()
}

#[test]
fn fan_out_merges_in_declaration_order_whatever_finishes_first() {
    let boxes = [
        bx("seed", "echo", "hello", ""),
        bx("a", "sleep", "80", ""),
        bx("b", "cat", "", ""),
        bx("c", "echo", "{\\\"k\\\": 1}", ""),
        bx("collect", "input", "", ""),
    ]
    .concat();
    let stages = "    - {type: box, name: seed}\n    - {type: fan_out, boxes: [a, b, c]}\n    - {type: box, name: collect}\n";
    let exec = Arc::new(Fake::default());
    let r = run(pipeline(&boxes, stages, ""), exec.clone(), opts(8));
    assert!(r.success(), "{r:?}");
    let out: Value = serde_json::from_slice(r.output.as_ref().unwrap()).unwrap();
    assert_eq!(out, json!(["slept", "hello", {"k": 1}]));
    // collect started only after every branch ended; the branches overlapped.
    let log = exec.log.lock().unwrap().clone();
    let collect = log.iter().position(|l| l == "start collect#1").unwrap();
    assert!(log[..collect].contains(&"end a#1".to_string()), "{log:?}");
    let end_a = log.iter().position(|l| l == "end a#1").unwrap();
    for b in ["start a#1", "start b#1", "start c#1"] {
        assert!(log[..end_a].contains(&b.to_string()), "{log:?}");
    }
}

#[test]
fn max_parallel_caps_running_nodes_and_memory_budget_too() {
    let boxes = [
        bx("a", "sleep", "30", ""),
        bx("b", "sleep", "30", ""),
        bx("c", "sleep", "30", ""),
        bx("d", "sleep", "30", ""),
    ]
    .concat();
    let stages = "    - {type: fan_out, boxes: [a, b, c, d]}\n";
    let exec = Arc::new(Fake::default());
    let r = run(pipeline(&boxes, stages, ""), exec.clone(), opts(2));
    assert!(r.success());
    assert_eq!(exec.running.lock().unwrap().1, 2);
    let exec = Arc::new(Fake::default());
    let mut o = opts(8);
    o.memory_budget_mb = 300; // 128 MiB each: two fit
    let r = run(
        pipeline(&boxes, stages, "sandbox: {memory_mb: 128}\n"),
        exec.clone(),
        o,
    );
    assert!(r.success());
    assert_eq!(exec.running.lock().unwrap().1, 2);
}

#[test]
fn fail_fast_cancels_running_siblings_and_skips_the_rest() {
    let boxes = [
        bx("slow", "sleep", "20000", ""),
        bx("bad", "fail", "", ""),
        bx("after", "echo", "x", ""),
    ]
    .concat();
    let stages = "    - {type: fan_out, boxes: [slow, bad]}\n    - {type: box, name: after}\n";
    let t0 = Instant::now();
    let r = run(
        pipeline(&boxes, stages, ""),
        Arc::new(Fake::default()),
        opts(8),
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(
        statuses(&r),
        vec![Status::Cancelled, Status::Failed, Status::Skipped]
    );
    assert_eq!(r.abort, Some(Abort::FailFast));
    assert_eq!(exit_code(&r), 1);
    assert!(r.output.is_none());
    // The killed sibling says why it was killed, not that its VM died.
    assert_eq!(
        error_of(&r, 0).as_deref(),
        Some("cancelled: sibling 'bad' failed (on_failure: fail_fast)")
    );
}

fn error_of(r: &RunResult, i: usize) -> Option<String> {
    r.nodes[i].last.as_ref().and_then(|a| a.error.clone())
}

#[test]
fn continue_keeps_independent_branches() {
    let src = "api_version: v1\nkind: workflow\nname: w\non_failure: continue\nworkflow:\n  steps:\n    - name: a\n      run: {program: fail}\n    - name: b\n      run: {program: sleep, args: [\"50\"]}\n    - name: c\n      run: {program: echo, args: [x]}\n      depends_on: [a]\n    - name: d\n      run: {program: cat}\n      depends_on: [b]\n      stdin_from: b\n";
    let r = run(plan(src), Arc::new(Fake::default()), opts(8));
    assert_eq!(
        statuses(&r),
        vec![
            Status::Failed,
            Status::Succeeded,
            Status::Skipped,
            Status::Succeeded
        ]
    );
    assert_eq!(r.nodes[3].last.as_ref().unwrap().output, b"slept");
    assert_eq!(exit_code(&r), 1);
}

#[test]
fn retries_until_success_with_attempt_numbers() {
    let boxes = bx("f", "flaky", "3", "      retries: 3\n");
    let exec = Arc::new(Fake::default());
    let r = run(
        pipeline(&boxes, "    - {type: box, name: f}\n", ""),
        exec.clone(),
        opts(1),
    );
    assert!(r.success());
    assert_eq!(r.nodes[0].attempts, 3);
    let starts: Vec<String> = exec
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("start"))
        .cloned()
        .collect();
    assert_eq!(starts, vec!["start f#1", "start f#2", "start f#3"]);
    let boxes = bx("f", "flaky", "5", "      retries: 1\n");
    let r = run(
        pipeline(&boxes, "    - {type: box, name: f}\n", ""),
        Arc::new(Fake::default()),
        opts(1),
    );
    assert_eq!(
        (r.nodes[0].status, r.nodes[0].attempts),
        (Status::Failed, 2)
    );
}

#[test]
fn node_deadline_reports_timed_out() {
    // timeout_secs 1 → the fake arms a 100 ms deadline.
    let boxes = bx("s", "sleep", "20000", "      timeout_secs: 1\n");
    let t0 = Instant::now();
    let r = run(
        pipeline(&boxes, "    - {type: box, name: s}\n", ""),
        Arc::new(Fake::default()),
        opts(1),
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(r.nodes[0].status, Status::TimedOut);
    assert_eq!(exit_code(&r), 1);
    let error = r.nodes[0].last.as_ref().and_then(|a| a.error.clone());
    assert_eq!(
        error.as_deref(),
        Some("timed out: node timeout_secs=1 s fired (host deadline; the VM was killed)")
    );
}

#[test]
fn pipeline_timeout_and_signals_stop_everything() {
    let boxes = [bx("a", "sleep", "20000", ""), bx("b", "echo", "x", "")].concat();
    let stages = "    - {type: box, name: a}\n    - {type: box, name: b}\n";
    let t0 = Instant::now();
    let r = run(
        pipeline(&boxes, stages, "timeout_secs: 1\n"),
        Arc::new(Fake::default()),
        opts(1),
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(r.abort, Some(Abort::Timeout));
    assert_eq!(statuses(&r), vec![Status::Cancelled, Status::Skipped]);
    assert_eq!(
        error_of(&r, 0).as_deref(),
        Some("cancelled: pipeline timeout_secs=1 s fired")
    );
    let r = run_cancel(
        pipeline(&boxes, stages, ""),
        Arc::new(Fake::default()),
        opts(1),
        Some(Duration::from_millis(50)),
    );
    assert_eq!(r.abort, Some(Abort::Signal(libc::SIGINT)));
    assert_eq!(exit_code(&r), 130);
    assert_eq!(
        error_of(&r, 0).as_deref(),
        Some("cancelled: interrupted (SIGINT)")
    );
}

#[test]
fn run_input_and_workflow_inputs() {
    let src = "api_version: v1\nkind: workflow\nname: w\nworkflow:\n  steps:\n    - name: a\n      run: {program: cat}\n    - name: b\n      run: {program: echo, args: [\"2\"]}\n    - name: c\n      run: {program: input}\n      depends_on: [a, b]\n";
    let mut o = opts(4);
    o.run_input = Some(b"{\"x\":1}".to_vec());
    let r = run(plan(src), Arc::new(Fake::default()), o);
    assert!(r.success());
    let out: Value = serde_json::from_slice(r.output.as_ref().unwrap()).unwrap();
    assert_eq!(out, json!({"a": {"x": 1}, "b": 2}));
}

#[test]
fn backoff_doubles_with_bounded_jitter() {
    let b = Duration::from_secs(1);
    assert_eq!(backoff(b, 1, 0.5), Duration::from_secs(1));
    assert_eq!(backoff(b, 3, 0.5), Duration::from_secs(4));
    assert_eq!(backoff(b, 30, 0.5), Duration::from_secs(30));
    assert_eq!(backoff(b, 2, 0.0), Duration::from_millis(1500));
    assert_eq!(backoff(b, 2, 1.0), Duration::from_millis(2500));
}

#[test]
fn memory_budget_rejects_nodes_that_never_fit() {
    let p = pipeline(
        &bx("a", "echo", "x", ""),
        "    - {type: box, name: a}\n",
        "sandbox: {memory_mb: 2048}\n",
    );
    assert!(memory_budget(&p, 1024)
        .unwrap_err()
        .contains("needs 2080 MiB"));
    assert_eq!(memory_budget(&p, 8192).unwrap(), 8192 - HOST_MARGIN_MB);
}

#[test]
fn input_flag_parsing() {
    assert_eq!(parse_input("{\"a\":1}").unwrap(), b"{\"a\":1}");
    assert!(parse_input("{oops").is_err());
    assert!(parse_input("@/nonexistent/x").is_err());
}

#[test]
fn reports_have_the_documented_shape() {
    let boxes = [
        bx("ok", "echo", "1", ""),
        bx("bad", "fail", "", ""),
        bx("next", "echo", "x", ""),
    ]
    .concat();
    let stages = "    - {type: fan_out, boxes: [ok, bad]}\n    - {type: box, name: next}\n";
    let p = pipeline(&boxes, stages, "on_failure: continue\n");
    let r = run(p.clone(), Arc::new(Fake::default()), opts(4));
    let doc = report::json_report(&p, &crate::kit::Remotes::new(), &r, exit_code(&r));
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["status"], "failed");
    assert_eq!(doc["exit_code"], 1);
    let nodes = doc["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    for n in nodes {
        for k in [
            "name",
            "status",
            "attempts",
            "started_ms",
            "duration_ms",
            "boot_ms",
            "vm_start",
            "exec_ms",
            "exit_code",
            "signal",
            "output_bytes",
            "console_log",
            "error",
            "agent",
        ] {
            assert!(n.get(k).is_some(), "missing {k} in {n}");
        }
    }
    assert_eq!(nodes[0]["output_bytes"], 1);
    assert_eq!(nodes[1]["error"], "exit code 1");
    assert_eq!(nodes[2]["status"], "skipped");
    let table = report::summary_table(&p, &r);
    assert!(
        table.contains("NODE") && table.contains("bad   failed"),
        "{table}"
    );
    let x = report::junit(&p, &r);
    assert!(
        x.contains("tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\""),
        "{x}"
    );
    assert!(x.contains("<testcase name=\"bad\" classname=\"t\""));
    assert!(x.contains("<failure message=\"exit code 1\" type=\"failed\">"));
    assert_eq!(report::xml_escape("a<&\"\u{1}b"), "a&lt;&amp;&quot;b");
}

fn workflow(steps: &str, extra: &str) -> Plan {
    plan(&format!(
        "api_version: v1\nkind: workflow\nname: w\n{extra}workflow:\n  steps:\n{steps}"
    ))
}

fn ended(r: &RunResult, i: usize) -> Option<crate::scheduler::ServiceEnd> {
    r.nodes[i].last.as_ref()?.service.as_ref().map(|s| s.ended)
}

#[test]
fn a_sidecar_serves_its_dependents_and_stops_after_the_last_one() {
    // One slot: the ready sidecar leaves it to its dependents (no deadlock).
    let p = workflow(
        "    - {name: web, mode: service, ports: [8080], run: {program: serve, args: [\"60000\"]}}\n    - {name: a, depends_on: [web], run: {program: echo, args: [a]}}\n    - {name: b, depends_on: [web], run: {program: sleep, args: [\"50\"]}}\n    - {name: after, depends_on: [a, b], run: {program: echo, args: [done]}}\n",
        "",
    );
    let exec = Arc::new(Fake::default());
    let t0 = Instant::now();
    let r = run(p, exec.clone(), opts(1));
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "the sidecar was not stopped"
    );
    assert!(r.success(), "{:?}", statuses(&r));
    assert_eq!(ended(&r, 0), Some(crate::scheduler::ServiceEnd::Stopped));
    let log = exec.log.lock().unwrap().clone();
    let at = |e: &str| log.iter().position(|l| l == e).unwrap();
    assert!(
        at("end web#1") > at("end a#1") && at("end web#1") > at("end b#1"),
        "{log:?}"
    );
    // `after` does not depend on the service: it may run after it stopped.
    assert_eq!(r.output.as_deref(), Some(&b"done"[..]));
}

#[test]
fn a_sidecar_that_exits_early_fails_the_run_and_cancels_its_dependents() {
    let p = workflow(
        "    - {name: web, mode: service, run: {program: serve, args: [\"100\"]}}\n    - {name: test, depends_on: [web], run: {program: sleep, args: [\"30000\"]}}\n",
        "on_failure: continue\n",
    );
    let t0 = Instant::now();
    let r = run(p, Arc::new(Fake::default()), opts(2));
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert_eq!(statuses(&r), [Status::Failed, Status::Cancelled]);
    assert_eq!(ended(&r, 0), Some(crate::scheduler::ServiceEnd::Died));
    let err = |i: usize| {
        r.nodes[i]
            .last
            .as_ref()
            .unwrap()
            .error
            .clone()
            .unwrap_or_default()
    };
    assert_eq!(
        err(0),
        "service `web` ended before its dependents finished (exit code 0)"
    );
    assert!(
        err(1).starts_with("cancelled: service `web` ended"),
        "{}",
        err(1)
    );
}

#[test]
fn a_service_without_dependents_runs_in_the_foreground_until_it_exits() {
    let p = workflow(
        "    - {name: first, run: {program: echo, args: [x]}}\n    - {name: web, mode: service, depends_on: [first], run: {program: serve, args: [\"100\"]}}\n",
        "",
    );
    let r = run(p, Arc::new(Fake::default()), opts(2));
    assert!(r.success(), "{:?}", statuses(&r));
    assert_eq!(ended(&r, 1), Some(crate::scheduler::ServiceEnd::Exited));
    // Its own output at exit, not the ready one.
    assert_eq!(r.output.as_deref(), Some(&b"exited"[..]));
}

/// A command service box hands the next stage no output (its ready output is not kept as
/// input): the stage gets the run input, as a first stage does.
#[test]
fn a_command_service_box_gives_the_next_stage_the_run_input() {
    let p = pipeline(
        &[
            bx("web", "serve", "60000", "      mode: service\n"),
            bx("use", "input", "", ""),
        ]
        .concat(),
        "    - {type: box, name: web}\n    - {type: box, name: use}\n",
        "",
    );
    let mut o = opts(1);
    o.run_input = Some(b"run-input".to_vec());
    let r = run(p, Arc::new(Fake::default()), o);
    assert!(r.success(), "{:?}", statuses(&r));
    assert_eq!(ended(&r, 0), Some(crate::scheduler::ServiceEnd::Stopped));
    assert_eq!(r.output.as_deref(), Some(&b"run-input"[..]));
}
