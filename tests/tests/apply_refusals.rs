//! `voidbox apply` refuses every field it cannot carry out before anything starts (exit 3,
//! naming the field and its line), `apply --dry-run` reports exactly the same refusals with
//! the same exit code, and nothing is left behind.

use std::path::Path;
use std::process::Command;

use voidbox_tests::{write_file as write, Run};

const BIN: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

/// Runs `voidbox` with state and cache under `home` (so a refused run could only leave
/// something behind there).
fn run(home: &Path, args: &[&str]) -> Run {
    Command::new(BIN)
        .args(args)
        .env("NO_COLOR", "1")
        .env("XDG_STATE_HOME", home.join("state"))
        .env("TMPDIR", home.join("tmp"))
        // Providers resolve keys from the environment: none here, whatever the host has.
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("VOIDBOX_LLM_PROVIDER")
        .env_remove("VOIDBOX_LLM_API_KEY_ENV")
        .env_remove("VOIDBOX_LLM_BASE_URL")
        .output()
        .expect("run voidbox")
        .into()
}

/// `apply` and `apply --dry-run` on `text`: both exit 3 with the same error lines, which
/// name each `field` with its `line`; nothing is created under the state or temp dirs.
fn assert_refused(text: &str, expected: &[(&str, usize)]) {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("tmp")).unwrap();
    let spec = write(home.path(), "spec.yaml", text);
    let real = run(home.path(), &["apply", &spec]);
    let dry = run(home.path(), &["apply", "--dry-run", &spec]);
    for (what, r) in [("apply", &real), ("apply --dry-run", &dry)] {
        assert_eq!(r.code, Some(3), "{what}: {}", r.stderr);
        assert!(r.stdout.is_empty(), "{what}: {}", r.stdout);
        for (field, line) in expected {
            let needle = format!("{spec}:{line}:");
            assert!(
                r.stderr
                    .lines()
                    .any(|l| l.contains(&needle) && l.contains(&format!("`{field}`"))),
                "{what}: no refusal of `{field}` at line {line}:\n{}",
                r.stderr
            );
        }
        let errors = r
            .stderr
            .lines()
            .filter(|l| l.starts_with("error: ") && l.contains(&format!("{spec}:")))
            .count();
        assert_eq!(errors, expected.len(), "{what}: {}", r.stderr);
        assert!(r.stderr.contains("nothing was started"), "{}", r.stderr);
    }
    assert_eq!(real.stderr, dry.stderr, "dry-run differs from apply");
    assert!(
        !home.path().join("state").exists(),
        "a run directory was created"
    );
    let tmp: Vec<_> = std::fs::read_dir(home.path().join("tmp"))
        .unwrap()
        .collect();
    assert!(tmp.is_empty(), "temp files left: {tmp:?}");
}

#[test]
fn sandbox_features_are_refused_with_field_and_line() {
    // `network:` (both forms) and mounts are provided: only a mount the VM cannot have
    // (a host file where a directory is shared) is refused. (A guest path the guest cannot
    // mount is a `validate` error: tests/tests/apply_cli.rs.)
    assert_refused(
        "kind: pipeline\nname: p\nsandbox:\n  network: true\n  guest_image: ghcr.io/x/kernel:1\npipeline:\n  boxes:\n    - name: a\n      run: {program: echo}\n      sandbox: {image: 'alpine:3.20', mounts: [{host: /, guest: /m}, {host: /etc/passwd, guest: /srv/m}]}\n    - name: b\n      run: {program: echo}\n      sandbox: {network: {allow_host_ports: [11434]}}\n",
        &[("pipeline.boxes[0].sandbox.mounts[1].host", 10)],
    );
}

#[test]
fn void_box_fields_not_built_yet_are_refused() {
    assert_refused(
        "kind: agent\nname: a\nllm: {provider: mock}\nobserve: {traces: true, logs: true, otlp_endpoint: 'localhost:4317'}\nagent:\n  prompt: hi\n  mode: interactive\n  messaging: {enabled: true}\n  skills: [\"mcp:github\"]\n",
        &[
            ("observe.otlp_endpoint", 4),
            ("agent.mode", 7),
            ("agent.messaging", 8),
            ("agent.skills[0]", 9),
        ],
    );
}

#[test]
fn providers_go_through_the_same_path() {
    assert_refused(
        "kind: pipeline\nname: p\nllm: {provider: claude}\npipeline:\n  boxes:\n    - {name: a, prompt: hi}\n    - {name: b, prompt: hi, llm: {provider: codex}}\n",
        &[("llm.provider", 3), ("pipeline.boxes[1].llm.provider", 7)],
    );
}

#[test]
fn artifact_directories_outside_the_file_roots_are_refused() {
    assert_refused(
        "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: a\n      run: {program: echo}\n      outputs: [{name: o, guest: /tmp/o}]\n    - name: b\n      run: {program: echo}\n      inputs: [{from: o, guest: /var/in}]\n",
        &[
            ("pipeline.boxes[0].outputs[0].guest", 7),
            ("pipeline.boxes[1].inputs[0].guest", 10),
        ],
    );
}

#[test]
fn a_runnable_spec_still_dry_runs() {
    let home = tempfile::tempdir().unwrap();
    let spec = write(
        home.path(),
        "ok.yaml",
        "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: a\n      run: {program: sh, args: [-c, 'mkdir -p /workspace/output; echo x > /workspace/output/f']}\n      outputs: [{name: o}]\n    - name: b\n      run: {program: ls, args: [/workspace/input]}\n      inputs: [{from: o}]\n",
    );
    let r = run(home.path(), &["apply", "--dry-run", &spec]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains('a') && r.stdout.contains('b'),
        "{}",
        r.stdout
    );
}

/// void-box's service steps (its OpenClaw examples: configure, then run a gateway for good)
/// and service boxes plan and dry-run: the sidecar and the foreground service are shown.
#[test]
fn service_steps_and_boxes_dry_run() {
    let home = tempfile::tempdir().unwrap();
    let spec = write(
        home.path(),
        "gateway.yaml",
        "api_version: v1\nkind: workflow\nname: gw\nworkflow:\n  steps:\n    - {name: configure, run: {program: sh, args: [-c, 'echo configured']}}\n    - name: gateway\n      mode: service\n      depends_on: [configure]\n      run: {program: sh, args: [-c, 'exec sleep 600']}\n  output_step: gateway\n",
    );
    let r = run(home.path(), &["apply", "--dry-run", &spec]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("service]"), "{}", r.stdout);
    let spec = write(
        home.path(),
        "sidecar.yaml",
        "api_version: v1\nkind: pipeline\nname: p\npipeline:\n  boxes:\n    - {name: db, mode: service, ports: [5432, 8080], run: {program: sleep, args: ['600']}}\n    - {name: test, run: {program: echo}}\n",
    );
    let r = run(
        home.path(),
        &["apply", "--dry-run", "--output", "json", &spec],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let plan: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        plan["nodes"][0]["service"],
        serde_json::json!({"ports": [5432, 8080], "ready_timeout_secs": 300})
    );
    assert_eq!(plan["nodes"][1]["service"], serde_json::Value::Null);
}
