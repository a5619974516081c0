//! Box artifacts (void-box `outputs` / `inputs`) on real micro-VMs: a box writes a directory
//! tree, `apply` copies it out of its VM into the run directory, and a later box reads it at
//! its `inputs` path. See `voidbox_tests::vm` for skipping without KVM.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use voidbox_tests::vm::guest_image;

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

const SPEC: &str = r#"api_version: v1
kind: pipeline
name: artifacts
sandbox: {memory_mb: 128}
pipeline:
  boxes:
    - name: produce
      run:
        program: sh
        args: [-c, "mkdir -p /workspace/output/sub && printf alpha > /workspace/output/a.txt && printf 'beta gamma' > /workspace/output/sub/b.txt && ln -s /etc/passwd /workspace/output/leak && echo done"]
      outputs: [{name: reports}]
    - name: consume
      run:
        program: sh
        args: [-c, "cat /workspace/in/a.txt /workspace/in/sub/b.txt; test ! -e /workspace/in/leak && echo ' no-link'"]
      inputs: [{from: reports, guest: /workspace/in}]
"#;

fn apply(dir: &Path, spec: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(VOIDBOX)
        .arg("apply")
        .arg(spec)
        .args(["--output", "json", "--boot-timeout", "400"])
        .arg("--logs-dir")
        .arg(dir.join("run"))
        .env("NO_COLOR", "1")
        .env("TMPDIR", dir)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn outputs_flow_to_later_boxes_inputs_and_are_reported() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("artifacts.yaml");
    std::fs::write(&spec, SPEC).unwrap();
    let (code, stdout, stderr) = apply(dir.path(), &spec);
    assert_eq!(code, Some(0), "stderr:\n{stderr}");
    let doc: Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(doc["output"], "alphabeta gamma no-link", "{stdout}");
    let produce = &doc["nodes"][0];
    assert_eq!(produce["name"], "produce");
    let a = &produce["artifacts"][0];
    assert_eq!(a["name"], "reports", "{produce}");
    assert_eq!(a["files"], 2, "{produce}");
    assert_eq!(a["bytes"], 15, "{produce}");
    assert_eq!(a["skipped"], 1, "the symlink is not followed: {produce}");
    assert_eq!(doc["nodes"][1]["artifacts"], serde_json::json!([]));
    // Stored under the run directory, by (encoded) output name; the link is not there.
    let stored = dir.path().join("run/artifacts/reports");
    assert_eq!(
        std::fs::read(stored.join("sub/b.txt")).unwrap(),
        b"beta gamma"
    );
    assert!(std::fs::symlink_metadata(stored.join("leak")).is_err());
}

#[test]
fn a_missing_output_directory_fails_the_box() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("missing.yaml");
    std::fs::write(
        &spec,
        "kind: pipeline\nname: missing\nsandbox: {memory_mb: 128}\npipeline:\n  boxes:\n    - name: lazy\n      run: {program: echo, args: [hi]}\n      outputs: [{name: nothing, guest: /workspace/nothing}]\n",
    )
    .unwrap();
    let (code, stdout, stderr) = apply(dir.path(), &spec);
    assert_eq!(code, Some(1), "stderr:\n{stderr}");
    let doc: Value = serde_json::from_str(&stdout).expect("JSON report");
    let err = doc["nodes"][0]["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("did not create its directory /workspace/nothing"),
        "{err}"
    );
}
