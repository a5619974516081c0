//! `voidbox apply` checks that need no VM: usage and plan-time errors and their exit codes.

use voidbox_tests::{repo_root, run_in, write_file as write, Run};

const BIN: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

fn run(args: &[&str]) -> Run {
    run_in(BIN, &repo_root(), args)
}

#[test]
fn bad_input_is_a_usage_error() {
    let r = run(&["apply", "examples/fan-out.yaml", "--input", "{not json"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr.contains("--input is not valid JSON"),
        "{}",
        r.stderr
    );
    let r = run(&[
        "apply",
        "examples/fan-out.yaml",
        "--input",
        "@/nonexistent/in.json",
    ]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    let r = run(&["apply", "examples/fan-out.yaml", "--max-output", "5T"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stdout.is_empty());
}

#[test]
fn an_unavailable_llm_provider_is_refused_not_substituted() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write(
        dir.path(),
        "a.yaml",
        "api_version: v1\nkind: agent\nname: a\nllm: {provider: claude}\nagent:\n  prompt: hi\n",
    );
    let r = run(&["apply", &spec]);
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert!(
        r.stderr.contains("`llm.provider: claude`") && r.stderr.contains("provider: mock"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.is_empty());
}

#[test]
fn dry_run_still_prints_the_plan() {
    let r = run(&["apply", "--dry-run", "examples/fan-out.yaml"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("collect"), "{}", r.stdout);
}

#[test]
fn an_interactive_sandbox_has_nothing_to_apply() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write(
        dir.path(),
        "s.yaml",
        "api_version: v1\nkind: sandbox\nname: s\n",
    );
    let r = run(&["apply", &spec]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("interactive sandbox"), "{}", r.stderr);
}

#[test]
fn sandbox_features_that_cannot_work_are_refused_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write(
        dir.path(),
        "net.yaml",
        "api_version: v1\nkind: sandbox\nname: net\nsandbox: {network: true}\nrun: {program: echo}\n",
    );
    let r = run(&["apply", &spec]);
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert!(
        r.stderr
            .contains(":4:11: `sandbox.network`: `network: true` cannot be provided yet"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.is_empty());
}
