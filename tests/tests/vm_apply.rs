//! `voidbox apply` end to end on real micro-VMs: one fresh VM per node (each boot takes
//! ~10–25 s on an interpreting KVM host, more under load), so the specs are small and
//! several behaviours share one run. See `voidbox_tests::vm` for skipping without KVM.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use voidbox_tests::vm::guest_image;
use voidbox_tests::{assert_no_leftovers, assert_tmp_clean, repo_root, tagged};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");
/// Generous: several VMs boot at once on a loaded, interpreting 2-core host.
const BOOT_TIMEOUT: &str = "400";

/// A tag in the environment of `apply` and everything it starts, to find leftovers.
fn tag() -> String {
    format!(
        "VOIDBOX_TEST_TAG=apply-{}-{:?}",
        std::process::id(),
        Instant::now()
    )
}

struct Apply {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

fn apply(dir: &Path, tag: &str, args: &[&str]) -> Apply {
    apply_env(dir, tag, args, &[])
}

/// [`apply`] with extra environment variables.
fn apply_env(dir: &Path, tag: &str, args: &[&str], env: &[(&str, &str)]) -> Apply {
    let (k, v) = tag.split_once('=').unwrap();
    let t0 = Instant::now();
    let out = Command::new(VOIDBOX)
        .arg("apply")
        .args(args)
        .arg("--logs-dir")
        .arg(dir.join("logs"))
        .args(["--boot-timeout", BOOT_TIMEOUT])
        .env("NO_COLOR", "1")
        .env("TMPDIR", dir)
        .env(k, v)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    Apply {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: t0.elapsed(),
    }
}

fn write_spec(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn fan_out_example_merges_in_order_and_reports_validate() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tag = tag();
    let junit = dir.path().join("junit.xml");
    let spec = repo_root().join("examples/fan-out.yaml");
    let r = apply(
        dir.path(),
        &tag,
        &[
            spec.to_str().unwrap(),
            "--max-parallel",
            "3",
            "--output",
            "json",
            "--junit",
            junit.to_str().unwrap(),
        ],
    );
    assert_eq!(r.code, Some(0), "stderr:\n{}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).expect("stdout is the JSON report");
    assert_eq!(
        doc["output"],
        json!([9, "THE QUICK BROWN FOX\nJUMPS OVER THE LAZY DOG", 2])
    );
    assert_eq!(
        (doc["version"].clone(), doc["status"].clone()),
        (json!(1), json!("succeeded"))
    );
    let nodes = doc["nodes"].as_array().unwrap();
    let names: Vec<&str> = nodes.iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["seed", "words", "upper", "lines", "collect"]);
    for n in nodes {
        assert_eq!(n["status"], "succeeded", "{n}");
        assert_eq!(n["attempts"], 1);
        assert_eq!(n["exit_code"], 0);
        assert!(
            n["boot_ms"].as_u64().unwrap() > 0 && n["exec_ms"].is_u64(),
            "{n}"
        );
        assert_eq!(n["vm_start"], "snapshot", "{n}");
        assert!(n["output_bytes"].as_u64().unwrap() > 0, "{n}");
        let log = n["console_log"].as_str().expect("console log kept");
        assert!(Path::new(log).is_file(), "{log}");
    }
    // The three branches ran concurrently.
    let start = |i: usize| nodes[i]["started_ms"].as_u64().unwrap();
    let end = |i: usize| start(i) + nodes[i]["duration_ms"].as_u64().unwrap();
    assert!(
        start(2) < end(1) && start(3) < end(1),
        "branches did not overlap: {doc}"
    );
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(x.starts_with("<?xml"), "{x}");
    assert!(
        x.contains("tests=\"5\" failures=\"0\" errors=\"0\" skipped=\"0\""),
        "{x}"
    );
    assert_eq!(x.matches("<testcase ").count(), 5, "{x}");
    assert!(
        r.stderr.contains("NODE") && r.stderr.contains("text-stats: succeeded"),
        "{}",
        r.stderr
    );
    assert_no_leftovers(&tag);
    assert_tmp_clean(dir.path());
}

/// The same pipeline gives the same output whether its VMs cold-boot or are restored from
/// the golden snapshot (the other tests here use snapshots, the default).
#[test]
fn cold_boots_and_snapshot_restores_give_identical_outputs() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tag = tag();
    let spec = repo_root().join("examples/fan-out.yaml");
    let spec = spec.to_str().unwrap();
    let warm = apply(dir.path(), &tag, &[spec, "--max-parallel", "3"]);
    assert_eq!(warm.code, Some(0), "stderr:\n{}", warm.stderr);
    let cold = apply(
        dir.path(),
        &tag,
        &[spec, "--max-parallel", "3", "--no-snapshot"],
    );
    assert_eq!(cold.code, Some(0), "stderr:\n{}", cold.stderr);
    assert_eq!(warm.stdout, cold.stdout);
    assert_eq!(
        serde_json::from_str::<Value>(&warm.stdout).unwrap(),
        json!([9, "THE QUICK BROWN FOX\nJUMPS OVER THE LAZY DOG", 2])
    );
    assert!(
        !cold.stderr.contains("snapshot"),
        "--no-snapshot must not touch snapshots:\n{}",
        cold.stderr
    );
    // Redirected, stdout is the output byte for byte; on a terminal (a pty from `script`) it
    // ends with a newline, so the prompt does not stick to `…,2]`.
    assert_eq!(
        warm.stdout,
        "[9,\"THE QUICK BROWN FOX\\nJUMPS OVER THE LAZY DOG\",2]"
    );
    let (k, v) = tag.split_once('=').unwrap();
    let cmd = format!(
        "{VOIDBOX} apply {spec} --logs-dir {} --boot-timeout {BOOT_TIMEOUT} 2>/dev/null",
        dir.path().join("logs").display()
    );
    let tty = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("NO_COLOR", "1")
        .env("TMPDIR", dir.path())
        .env(k, v)
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux) runs apply on a pty");
    assert_eq!(tty.status.code(), Some(0));
    let shown = String::from_utf8_lossy(&tty.stdout);
    assert!(
        shown.ends_with("LAZY DOG\",2]\r\n"),
        "on a terminal the output ends with a newline: {shown:?}"
    );
    eprintln!(
        "fan-out example: {:.1}s restored from snapshots, {:.1}s cold",
        warm.took.as_secs_f64(),
        cold.took.as_secs_f64()
    );
    assert_no_leftovers(&tag);
    assert_tmp_clean(dir.path());
}

#[test]
fn fail_fast_cancels_a_sleeping_sibling_and_kills_its_vm() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tag = tag();
    let spec = write_spec(
        dir.path(),
        "ff.yaml",
        r#"api_version: v1
kind: pipeline
name: ff
sandbox: {memory_mb: 128}
pipeline:
  boxes:
    - name: sleeper
      run: {program: sleep, args: ["600"]}
    - name: bad
      run: {program: sh, args: [-c, "echo broken >&2; printf 'key %s \\033]0;pwned\\007\\n' \"$FF_SECRET\" >&2; exit 3"]}
      sandbox: {env: {FF_SECRET: ""}}
    - name: after
      run: {program: "true"}
  stages:
    - {type: fan_out, boxes: [sleeper, bad]}
    - {type: box, name: after}
"#,
    );
    let junit = dir.path().join("junit.xml");
    // The host value `sandbox.env` passes on: a secret that no report may show.
    let secret = "ff-secret-5c1d0e9a7b";
    let r = apply_env(
        dir.path(),
        &tag,
        &[
            spec.to_str().unwrap(),
            "--max-parallel",
            "2",
            "--output",
            "json",
            "--junit",
            junit.to_str().unwrap(),
        ],
        &[("FF_SECRET", secret)],
    );
    assert_eq!(r.code, Some(1), "stderr:\n{}", r.stderr);
    assert!(r.took < Duration::from_secs(300), "took {:?}", r.took);
    // The failed node's stderr, under it in the summary: redacted, escapes made visible.
    for want in [
        "sleeper  cancelled",
        "cancelled: sibling 'bad' failed (on_failure: fail_fast)",
        "bad      failed",
        "after    skipped",
        "exit code 3",
        "stderr, last 2 lines:",
        "| broken",
        "| key [REDACTED] \\u{1b}]0;pwned\\u{7}",
    ] {
        assert!(
            r.stderr.contains(want),
            "missing `{want}` in:\n{}",
            r.stderr
        );
    }
    assert!(
        !r.stderr.contains('\u{1b}'),
        "a raw escape reached the terminal"
    );
    assert!(
        !r.stderr.contains("died"),
        "a cancellation is not a crash:\n{}",
        r.stderr
    );
    let doc: Value = serde_json::from_str(&r.stdout).expect("the JSON report on stdout");
    let nodes = doc["nodes"].as_array().unwrap();
    assert_eq!(
        nodes[1]["stderr_tail"], "broken\nkey [REDACTED] \u{1b}]0;pwned\u{7}\n",
        "{doc}"
    );
    assert_eq!(nodes[0]["stderr_tail"], Value::Null, "only failed nodes");
    assert_eq!(
        nodes[0]["error"],
        "cancelled: sibling 'bad' failed (on_failure: fail_fast)"
    );
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(
        x.contains("<failure message=\"sh failed: exit code 3\""),
        "{x}"
    );
    assert!(
        x.contains("<system-err>broken\nkey [REDACTED] ]0;pwned\n</system-err>"),
        "stderr tail in JUnit: {x}"
    );
    assert!(
        x.contains("<skipped message=\"cancelled: sibling &apos;bad&apos; failed"),
        "{x}"
    );
    for text in [&r.stdout, &r.stderr, &x] {
        assert!(!text.contains(secret), "the secret leaked:\n{text}");
    }
    assert_no_leftovers(&tag);
    assert_tmp_clean(dir.path());
}

#[test]
fn continue_retry_and_node_timeout() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tag = tag();
    let spec = write_spec(
        dir.path(),
        "wf.yaml",
        r#"api_version: v1
kind: workflow
name: wf
on_failure: continue
sandbox: {memory_mb: 128}
workflow:
  steps:
    - name: flaky
      run: {program: sh, args: [-c, "test \"$VOIDBOX_ATTEMPT\" -ge 2 || exit 1; echo '{\"attempt\": 2}'"]}
      retries: 2
    - name: slow
      run: {program: sleep, args: ["600"]}
      timeout_secs: 3
    - name: after_slow
      run: {program: "true"}
      depends_on: [slow]
"#,
    );
    let r = apply(
        dir.path(),
        &tag,
        &[
            spec.to_str().unwrap(),
            "--max-parallel",
            "2",
            "--output",
            "json",
        ],
    );
    assert_eq!(r.code, Some(1), "stderr:\n{}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).expect("JSON report");
    let node = |name: &str| {
        doc["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .cloned()
            .unwrap()
    };
    let flaky = node("flaky");
    assert_eq!(
        (flaky["status"].as_str(), flaky["attempts"].as_u64()),
        (Some("succeeded"), Some(2)),
        "{doc}"
    );
    let slow = node("slow");
    assert_eq!(slow["status"], "timed_out", "{doc}");
    assert!(slow["exec_ms"].as_u64().unwrap() < 30_000, "{slow}");
    assert_eq!(
        slow["timeout"],
        json!({"limit": "node timeout_secs", "secs": 3}),
        "{slow}"
    );
    let error = slow["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("timed out: node timeout_secs=3 s fired"),
        "{slow}"
    );
    assert_eq!(node("after_slow")["status"], "skipped");
    assert_eq!(doc["status"], "failed");
    assert_no_leftovers(&tag);
    assert_tmp_clean(dir.path());
}

#[test]
fn sigint_stops_every_vm_and_leaves_nothing_behind() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tag = tag();
    let (k, v) = tag.split_once('=').unwrap();
    let spec = write_spec(
        dir.path(),
        "int.yaml",
        r#"api_version: v1
kind: pipeline
name: int
sandbox: {memory_mb: 128}
pipeline:
  boxes:
    - name: a
      run: {program: sleep, args: ["600"]}
    - name: b
      run: {program: sleep, args: ["600"]}
  stages:
    - {type: fan_out, boxes: [a, b]}
"#,
    );
    // Both VMs must be running when the signal comes: make sure they restore from the golden
    // snapshot rather than wait for its (possibly concurrent) creation.
    let pre = Command::new(VOIDBOX)
        .args(["snapshot", "create", "--memory-mb", "128"])
        .args(["--boot-timeout", BOOT_TIMEOUT])
        .env(k, v)
        .output()
        .unwrap();
    assert!(
        pre.status.success(),
        "{}",
        String::from_utf8_lossy(&pre.stderr)
    );
    let mut child = Command::new(VOIDBOX)
        .args([
            "apply",
            spec.to_str().unwrap(),
            "--max-parallel",
            "2",
            "--logs-dir",
        ])
        .arg(dir.path().join("logs"))
        .args(["--boot-timeout", BOOT_TIMEOUT])
        .env("NO_COLOR", "1")
        .env("TMPDIR", dir.path())
        .env(k, v)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let seen = voidbox_tests::read_until(&mut err, |s| s.contains("b: started"));
    // Let the VMMs come up (booting or running, both must die).
    std::thread::sleep(Duration::from_secs(3));
    assert!(tagged(&tag).len() >= 3, "apply + 2 VMMs expected");
    let t0 = Instant::now();
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = child.wait().unwrap();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "slow to stop: {:?}",
        t0.elapsed()
    );
    assert_eq!(status.code(), Some(130), "stderr:\n{seen}{rest}");
    assert!(rest.contains("stopped by SIGINT"), "{rest}");
    // The killed VMs read as what happened to them, not as crashes.
    assert!(rest.contains("cancelled: interrupted (SIGINT)"), "{rest}");
    assert!(!rest.contains("died"), "{rest}");
    assert_no_leftovers(&tag);
    assert_tmp_clean(dir.path());
}

/// An agent box with `llm.provider: mock` runs the mock runtime shipped in the guest image.
#[test]
fn mock_agent_reports_tokens_and_tool_calls() {
    let Some(image) = guest_image() else { return };
    let disk = std::fs::read(&image.system_disk).unwrap_or_default();
    let needle = b"voidbox-mock-llm";
    assert!(
        disk.windows(needle.len()).any(|w| w == needle),
        "the guest image {} has no mock LLM runtime; rebuild it with `voidbox image build`",
        image.system_disk.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let tag = tag();
    let spec = repo_root().join("examples/agent-skill.yaml");
    let r = apply(
        dir.path(),
        &tag,
        &[
            spec.to_str().unwrap(),
            "--output",
            "json",
            "--input",
            "{\"text\": \"hello\"}",
        ],
    );
    assert_eq!(r.code, Some(0), "stderr:\n{}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).unwrap();
    let agent = &doc["nodes"][0]["agent"];
    assert!(agent["input_tokens"].as_u64().unwrap() > 0, "{doc}");
    assert!(agent["output_tokens"].as_u64().unwrap() > 0, "{doc}");
    // The mock spends nothing, whatever its script says.
    assert_eq!(agent["cost_usd"].as_f64(), Some(0.0), "{doc}");
    assert!(
        !r.stderr.contains('$'),
        "no dollar figure for the mock:\n{}",
        r.stderr
    );
    let tools: Vec<&str> = agent["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(tools, ["Skill", "Read", "Write"], "{doc}");
    assert_eq!(doc["output"]["skills"], json!(["summarize"]), "{doc}");
    assert_no_leftovers(&tag);
}

#[test]
fn command_steps_find_codex_and_claude_on_the_runtimes_disk() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tag = tag();
    // By name (`codex`), and as a command of a `sh -c` script (`claude`): each step gets the
    // runtimes disk, as void-box's guest ships both.
    let spec = write_spec(
        dir.path(),
        "runtimes.yaml",
        "api_version: v1\nkind: workflow\nname: runtimes\nsandbox: {memory_mb: 1024}\nworkflow:\n  steps:\n    - name: codex\n      timeout_secs: 900\n      run: {program: codex, args: [--version]}\n    - name: claude\n      timeout_secs: 900\n      run: {program: sh, args: [-c, 'claude --version']}\n",
    );
    let a = apply(dir.path(), &tag, &[spec.to_str().unwrap()]);
    eprintln!("apply took {:?}", a.took);
    assert_eq!(
        a.code,
        Some(0),
        "stdout: {}\nstderr: {}",
        a.stdout,
        a.stderr
    );
    assert!(a.stdout.contains("codex-cli "), "{}", a.stdout);
    assert!(a.stdout.contains("(Claude Code)"), "{}", a.stdout);
    assert_no_leftovers(&tag);
    assert_tmp_clean(dir.path());
}
