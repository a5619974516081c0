//! `mode: service` end to end on real micro-VMs: a sidecar its dependents reach by name and
//! nothing else does, stopped after its last dependent; a sidecar that dies early and one
//! that never becomes ready fail the run, naming themselves; a foreground service stopped
//! with SIGINT exits 130 with no VMM left. See `voidbox_tests::vm` for skipping without KVM.

use std::io::BufReader;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use voidbox_tests::vm::guest_image;
use voidbox_tests::{assert_no_leftovers, tagged};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");
/// Generous: several VMs start at once on a loaded, interpreting 2-core host.
const BOOT_TIMEOUT: &str = "400";

fn tag(what: &str) -> (String, String) {
    (
        "VOIDBOX_TEST_TAG".to_string(),
        format!(
            "services-{what}-{}-{:?}",
            std::process::id(),
            Instant::now()
        ),
    )
}

fn apply_json(dir: &Path, spec: &str, extra: &[&str]) -> (Option<i32>, Value, String) {
    let (k, v) = tag("apply");
    let path = dir.join("spec.yaml");
    std::fs::write(&path, spec).unwrap();
    let out = Command::new(VOIDBOX)
        .arg("apply")
        .arg(&path)
        .args([
            "--output",
            "json",
            "--boot-timeout",
            BOOT_TIMEOUT,
            "--logs-dir",
        ])
        .arg(dir.join("logs"))
        .args(extra)
        .env("NO_COLOR", "1")
        .env("TMPDIR", dir)
        .env(&k, &v)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not the JSON report ({e}); stderr:\n{stderr}"));
    assert_no_leftovers(&format!("{k}={v}"));
    (out.status.code(), doc, stderr)
}

fn node<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name)
        .unwrap_or_else(|| panic!("no node {name}: {doc}"))
}

#[test]
fn a_sidecar_is_reached_by_name_from_its_dependents_only_and_stopped_after_them() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // `web` serves a page, listening on its NIC address only (where its dependents'
    // connections arrive: it is ready although nothing listens on its loopback); `a` and `b`
    // fetch it by name, and get the run input (`web` hands them no output), as their file
    // and stdin; `outsider` (with network of its own) does not depend on `web`: neither its
    // name nor its address reaches it.
    let spec = r#"
kind: workflow
name: sidecar
workflow:
  steps:
    - name: web
      mode: service
      ports: [8080]
      run:
        program: sh
        args: ["-c", "mkdir -p /workspace/www && echo hello-from-web > /workspace/www/index.html && exec httpd -f -p 10.0.2.15:8080 -h /workspace/www"]
    - name: a
      depends_on: [web]
      run: {program: sh, args: ["-c", "timeout 30 wget -q -O- http://web:8080/index.html; echo input=$(cat /workspace/input.json)"]}
    - name: b
      depends_on: [web]
      run: {program: sh, args: ["-c", "timeout 30 wget -q -O- http://WEB:8080/index.html; echo stdin=$(cat)"]}
    - name: outsider
      sandbox: {network: true}
      run:
        program: sh
        args: ["-c", "timeout 30 wget -q -O- http://web:8080/ >/dev/null 2>&1 || echo name-unreached; timeout 30 wget -q -O- http://10.0.3.1:8080/ 2>&1 | grep -q refused && echo address-refused; true"]
"#;
    let (code, doc, stderr) = apply_json(
        dir.path(),
        spec,
        &["--max-parallel", "4", "--input", "4242"],
    );
    assert_eq!(code, Some(0), "stderr:\n{stderr}\n{doc}");
    for dep in ["a", "b"] {
        let n = node(&doc, dep);
        assert_eq!(n["status"], "succeeded", "{n}");
    }
    let out = doc["output"].to_string();
    assert_eq!(out.matches("hello-from-web").count(), 2, "{doc}");
    assert!(
        out.contains("input=4242") && out.contains("stdin=4242"),
        "{doc}"
    );
    assert!(
        out.contains("name-unreached") && out.contains("address-refused"),
        "{doc}"
    );
    let web = node(&doc, "web");
    assert_eq!(web["status"], "succeeded", "{web}");
    let svc = &web["service"];
    assert_eq!(svc["ended"], "stopped", "{web}");
    assert_eq!(svc["ports"], serde_json::json!([8080]));
    assert_eq!(svc["connections"], 2, "{web}");
    assert!(svc["ready_ms"].is_u64(), "{web}");
    // The outsider's NAT refused the service's address.
    let denied = node(&doc, "outsider")["network"]["denials"].to_string();
    assert!(denied.contains("10.0.3.1"), "{denied}");
    assert!(
        stderr.contains("web: service ready (ports 8080 accept connections)")
            && stderr.contains("web: succeeded (service stopped, 2 connections)"),
        "{stderr}"
    );
}

#[test]
fn services_that_die_early_or_never_become_ready_fail_the_run_naming_them() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = r#"
kind: workflow
name: broken
on_failure: continue
workflow:
  steps:
    - name: flaky
      mode: service
      ports: [8080]
      run: {program: sh, args: ["-c", "httpd -p 8080 -h /workspace; sleep 20; exit 7"]}
    - name: slow
      depends_on: [flaky]
      run: {program: sleep, args: ["300"]}
    - name: mute
      mode: service
      ports: [9]
      ready_timeout_secs: 5
      run: {program: sleep, args: ["300"]}
    - name: never
      depends_on: [mute]
      run: {program: echo, args: [unreachable]}
"#;
    let t0 = Instant::now();
    let (code, doc, stderr) = apply_json(dir.path(), spec, &["--max-parallel", "4"]);
    assert_eq!(code, Some(1), "stderr:\n{stderr}\n{doc}");
    assert!(
        t0.elapsed() < Duration::from_secs(200),
        "{:?}",
        t0.elapsed()
    );
    let flaky = node(&doc, "flaky");
    assert_eq!(flaky["status"], "failed", "{flaky}");
    assert_eq!(flaky["service"]["ended"], "died", "{flaky}");
    assert_eq!(
        flaky["error"],
        "service `flaky` ended before its dependents finished (exit code 7)"
    );
    let slow = node(&doc, "slow");
    assert!(
        slow["status"] == "cancelled" || slow["status"] == "skipped",
        "{slow}"
    );
    let mute = node(&doc, "mute");
    assert_eq!(mute["status"], "failed", "{mute}");
    assert_eq!(mute["service"]["ended"], "not_ready", "{mute}");
    assert_eq!(
        mute["error"],
        "service not ready within ready_timeout_secs=5 s: port 9 accepted no connection at 10.0.2.15, the address its dependents reach (listen on 0.0.0.0 or 10.0.2.15)"
    );
    assert_eq!(node(&doc, "never")["status"], "skipped");
}

#[test]
fn a_foreground_service_streams_and_stops_on_sigint_with_130() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (k, v) = tag("foreground");
    let spec = dir.path().join("fg.yaml");
    std::fs::write(
        &spec,
        "kind: workflow\nname: fg\nworkflow:\n  steps:\n    - name: gateway\n      mode: service\n      run: {program: sh, args: [-c, 'echo gateway-up >&2; exec sleep 600']}\n",
    )
    .unwrap();
    let mut child = Command::new(VOIDBOX)
        .arg("apply")
        .arg(&spec)
        .args(["--boot-timeout", BOOT_TIMEOUT, "--logs-dir"])
        .arg(dir.path().join("logs"))
        .env("NO_COLOR", "1")
        .env("TMPDIR", dir.path())
        .env(&k, &v)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let seen = voidbox_tests::read_until(&mut err, |s| {
        s.contains("gateway: service ready") && s.contains("gateway-up")
    });
    // Ready once its process runs, and its output streams.
    assert!(seen.contains("gateway: service ready"), "{seen}");
    assert!(seen.contains("gateway-up"), "{seen}");
    assert!(
        tagged(&format!("{k}={v}")).len() >= 2,
        "apply + its VMM expected"
    );
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    let status = child.wait().unwrap();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert_eq!(status.code(), Some(130), "stderr:\n{seen}{rest}");
    assert!(rest.contains("cancelled: interrupted (SIGINT)"), "{rest}");
    assert_no_leftovers(&format!("{k}={v}"));
}

/// `examples/ci-services.yaml` with its service image served by a local registry: the
/// service box in a busybox image, the two test boxes reaching it by name, the service
/// stopped after them. The example's last stage, a Claude Code agent in a Python image,
/// is left out here (an agent in an image is `vm_agents.rs`'s; the example's structure,
/// agent included, passes `validate` and `apply --dry-run` in `cli.rs`).
#[test]
fn the_ci_example_serves_its_tests_from_an_image() {
    if guest_image().is_none() {
        return;
    }
    use voidbox_oci::testing::{ImageBuilder, Layer, Registry};
    let reg = Registry::start().expect("registry");
    ImageBuilder::busybox()
        .unwrap()
        .layer(Layer::new().symlink("bin/httpd", "busybox"))
        .unwrap()
        .push(&reg, "busybox:1.36")
        .unwrap();
    let text =
        std::fs::read_to_string(voidbox_tests::repo_root().join("examples/ci-services.yaml"))
            .unwrap();
    let review = text.find("    - name: review").expect("review box");
    let stages = text.find("  stages:").expect("stages");
    let text = format!("{}{}", &text[..review], &text[stages..])
        .replace("    - {type: box, name: review}\n", "")
        .replace(
            "\"busybox:1.36\"",
            &format!("\"{}\"", reg.reference("busybox:1.36")),
        );
    let dir = tempfile::tempdir().unwrap();
    let (code, doc, stderr) = apply_json(dir.path(), &text, &["--max-parallel", "3"]);
    assert_eq!(code, Some(0), "stderr:\n{stderr}\n{doc}");
    assert_eq!(
        doc["output"],
        serde_json::json!(["health: pass", "items: pass"]),
        "{doc}"
    );
    let api = node(&doc, "api");
    assert_eq!(api["service"]["ended"], "stopped", "{api}");
    assert_eq!(api["service"]["connections"], 2, "{api}");
}
