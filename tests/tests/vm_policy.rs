//! The guest policy on real micro-VMs: every child runs as uid 1000 with the policy's
//! rlimits, and a program outside the allowlist is refused with exit code 126 naming it.
//! See `voidbox_tests::vm` for skipping without KVM.

use std::process::Command;

use voidbox::sandbox::Sandbox;
use voidbox_protocol::{ExecRequest, GuestPolicy, OutputStream, ResourceLimits};
use voidbox_tests::vm::{guest_image, sandbox_config};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

fn run(sb: &mut Sandbox, program: &str, args: &[&str]) -> (String, voidbox_protocol::ExecResponse) {
    let mut out = Vec::new();
    let r = sb
        .exec(
            ExecRequest {
                program: program.into(),
                args: args.iter().map(|s| s.to_string()).collect(),
                timeout_secs: Some(60),
                ..ExecRequest::default()
            },
            &mut |s, d| {
                if s == OutputStream::Stdout {
                    out.extend_from_slice(d)
                }
            },
        )
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    (String::from_utf8_lossy(&out).into_owned(), r)
}

#[test]
fn policy_drops_to_uid_1000_applies_rlimits_and_refuses_other_programs() {
    let Some(image) = guest_image() else { return };
    let mut cfg = sandbox_config(image, VOIDBOX);
    cfg.policy = Some(GuestPolicy {
        allowlist: Some(vec!["sh".into()]),
        rlimits: ResourceLimits {
            nofile: Some(256),
            nproc: Some(300),
            fsize_mb: Some(8),
            address_space_mb: None,
        },
        ..GuestPolicy::default()
    });
    let mut sb = Sandbox::start(&cfg).unwrap_or_else(|e| panic!("VM: {e}"));
    let (out, r) = run(
        &mut sb,
        "sh",
        &["-c", "id -u; id -g; ulimit -n; cat /proc/self/limits"],
    );
    assert_eq!(r.exit_code, Some(0), "{out} {r:?}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("1000"), "{out}");
    assert_eq!(lines.next(), Some("1000"), "{out}");
    assert_eq!(lines.next(), Some("256"), "{out}");
    let limit = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(name))
            .map(|l| {
                l[name.len()..]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .unwrap_or_else(|| panic!("{name} in {out}"))
    };
    assert_eq!(limit("Max processes"), "300");
    assert_eq!(limit("Max file size"), (8u64 << 20).to_string());
    // Outside the allowlist: refused before it runs, exit 126, the message names it.
    let (out, r) = run(&mut sb, "ls", &["/"]);
    assert_eq!(r.exit_code, Some(126), "{r:?}");
    assert!(out.is_empty(), "{out}");
    let msg = r.error.unwrap_or_default();
    assert!(msg.contains("`ls`") && msg.contains("allowlist"), "{msg}");
    // Children of an allowed program are not filtered.
    let (out, r) = run(&mut sb, "sh", &["-c", "echo hi | tr a-z A-Z"]);
    assert_eq!((out.as_str(), r.exit_code), ("HI\n", Some(0)));
    sb.stop();
}

#[test]
fn apply_sends_the_specs_limits_and_run_the_defaults() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("limits.yaml");
    std::fs::write(
        &spec,
        r#"api_version: v1
kind: pipeline
name: limits
sandbox:
  memory_mb: 128
  limits: {nofile: 512}
pipeline:
  boxes:
    - name: probe
      run: {program: sh, args: [-c, "id -u; ulimit -n"]}
  stages:
    - {type: box, name: probe}
"#,
    )
    .unwrap();
    let out = Command::new(VOIDBOX)
        .arg("apply")
        .arg(&spec)
        .arg("--logs-dir")
        .arg(dir.path().join("logs"))
        .args(["--boot-timeout", "400"])
        .env("NO_COLOR", "1")
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1000\n512\n",
        "{stderr}"
    );
    // `voidbox run`: the command only, default limits.
    let out = Command::new(VOIDBOX)
        .args([
            "run",
            "--memory-mb",
            "128",
            "--",
            "sh",
            "-c",
            "id -u; ulimit -n",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let nofile = ResourceLimits::DEFAULT.nofile.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("1000\n{nofile}\n"),
        "{stderr}"
    );
}
