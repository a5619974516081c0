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
        "mounts.yaml",
        "api_version: v1\nkind: sandbox\nname: m\nsandbox: {network: true, mounts: [{host: /, guest: /proc/m}]}\nrun: {program: echo}\n",
    );
    // The guest's own mount rule, applied by `validate`: an invalid spec (exit 2), located.
    let r = run(&["apply", &spec]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("mounts.yaml:4:52: share guest path `/proc/m` must not be inside /proc"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("sandbox.network"), "{}", r.stderr);
    assert!(r.stdout.is_empty());
}

/// `apply` with `VOIDBOX_DNS_UPSTREAMS` set to `upstreams`.
fn apply_with_upstreams(spec: &str, upstreams: &str, dry_run: bool) -> Run {
    let mut args = vec!["apply"];
    if dry_run {
        args.push("--dry-run");
    }
    args.push(spec);
    std::process::Command::new(BIN)
        .args(&args)
        .current_dir(repo_root())
        .env("NO_COLOR", "1")
        .env("VOIDBOX_DNS_UPSTREAMS", upstreams)
        .output()
        .expect("run voidbox")
        .into()
}

#[test]
fn a_bad_dns_upstream_is_a_usage_error_before_any_vm() {
    let dir = tempfile::tempdir().unwrap();
    let net = write(
        dir.path(),
        "net.yaml",
        "api_version: v1\nkind: sandbox\nname: net\nsandbox: {network: {allow_host_ports: [8080]}}\nrun: {program: echo}\n",
    );
    for dry_run in [false, true] {
        let r = apply_with_upstreams(&net, "127.0.0.1:5353,dns.example", dry_run);
        assert_eq!(r.code, Some(2), "{}", r.stderr);
        assert!(
            r.stderr
                .contains("VOIDBOX_DNS_UPSTREAMS: `dns.example` is not `IP[:PORT]`"),
            "{}",
            r.stderr
        );
        assert!(r.stdout.is_empty(), "{}", r.stdout);
    }
    // Read only when a node has network.
    let r = apply_with_upstreams("examples/fan-out.yaml", "nonsense", true);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = apply_with_upstreams(&net, "127.0.0.1:5353, [::1]", true);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("network(host ports 8080)"),
        "{}",
        r.stdout
    );
}

/// Telemetry settings that cannot work are errors before anything starts (exit 2), in
/// `apply` and `apply --dry-run` alike; `--trace` has nothing to write in a dry run.
#[test]
fn bad_telemetry_settings_are_usage_errors() {
    let with = |vars: &[(&str, &str)], args: &[&str]| -> Run {
        let mut c = std::process::Command::new(BIN);
        c.args(args).current_dir(repo_root()).env("NO_COLOR", "1");
        for k in [
            "VOIDBOX_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            c.env_remove(k);
        }
        for (k, v) in vars {
            c.env(k, v);
        }
        c.output().unwrap().into()
    };
    for dry in [true, false] {
        let args: &[&str] = if dry {
            &["apply", "--dry-run", "examples/fan-out.yaml"]
        } else {
            &["apply", "examples/fan-out.yaml"]
        };
        let r = with(&[("VOIDBOX_OTLP_ENDPOINT", "localhost:4317")], args);
        assert_eq!(r.code, Some(2), "{}", r.stderr);
        assert!(
            r.stderr.contains("VOIDBOX_OTLP_ENDPOINT=localhost:4317"),
            "{}",
            r.stderr
        );
        let r = with(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "udp"),
            ],
            args,
        );
        assert_eq!(r.code, Some(2), "{}", r.stderr);
        assert!(
            r.stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL=udp"),
            "{}",
            r.stderr
        );
        assert!(r.stdout.is_empty());
    }
    let r = with(
        &[],
        &[
            "apply",
            "--dry-run",
            "--trace",
            "t.json",
            "examples/fan-out.yaml",
        ],
    );
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("--trace"), "{}", r.stderr);
}
