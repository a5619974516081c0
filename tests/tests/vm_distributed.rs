//! The node runner on real micro-VMs, as a distributed engine drives it.
//!
//! - Replay: the Argo export of `examples/fan-out.yaml` is run task by task, each task's own
//!   command line in dependency order, with its results moved into its dependents' inputs
//!   the way Argo's artifacts move them; then the same for the GitHub Actions export's jobs
//!   (their download, run and upload steps). Both final outputs are byte-identical to
//!   `voidbox apply`'s.
//! - A fan-in of three hand-written inputs is merged in declaration order inside the VM, and
//!   the node's box output is collected into `--outputs`.
//! - A failing node is retried by its runner and reported (attempts, JUnit, no output); its
//!   box input comes from the previous runner's results.
//! - A service across machines: one runner serves a `mode: service` node on a TCP address
//!   (`--service-listen`), another runner's node reaches it by name (`--service NAME=IP`).
//!
//! See `voidbox_tests::vm` for skipping without KVM.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use voidbox_tests::vm::guest_image;
use voidbox_tests::{assert_no_leftovers, repo_root};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");
const BOOT_TIMEOUT: &str = "400";

fn tag(what: &str) -> (String, String) {
    (
        "VOIDBOX_TEST_TAG".to_string(),
        format!(
            "distributed-{what}-{}-{:?}",
            std::process::id(),
            Instant::now()
        ),
    )
}

/// Runs `voidbox ARGS` in `cwd` with `env`; (exit code, stdout bytes, stderr).
fn voidbox(
    cwd: &Path,
    args: &[String],
    env: &[(String, String)],
) -> (Option<i32>, Vec<u8>, String) {
    let (k, v) = tag("run");
    let out = Command::new(VOIDBOX)
        .args(args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .env(&k, &v)
        .envs(env.iter().map(|(a, b)| (a.as_str(), b.as_str())))
        .output()
        .unwrap();
    assert_no_leftovers(&format!("{k}={v}"));
    (
        out.status.code(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

fn yaml(text: &str) -> Value {
    voidbox::spec::yaml::parse(text).unwrap().to_json()
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// What `voidbox apply SPEC` prints on stdout.
fn whole_apply(spec: &Path) -> Vec<u8> {
    let (code, out, err) = voidbox(
        &repo_root(),
        &[
            "apply".into(),
            spec.display().to_string(),
            "--boot-timeout".into(),
            BOOT_TIMEOUT.into(),
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    out
}

/// Runs the Argo DAG as Argo would: tasks once their `depends` are done, each with its
/// template's args, its input artifacts unpacked from the producing tasks' `results`.
/// Returns the final output.
fn replay_argo(text: &str, work: &Path) -> Vec<u8> {
    use base64::Engine as _;
    let spec_dir = work.join("spec");
    std::fs::create_dir_all(&spec_dir).unwrap();
    let wf = yaml(text);
    // The ConfigMap the first task creates, mounted at /voidbox/spec.
    let cm = wf["spec"]["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "voidbox-spec")
        .unwrap();
    let cm = yaml(cm["resource"]["manifest"].as_str().unwrap());
    for (key, b64) in cm["binaryData"].as_object().unwrap() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        std::fs::write(spec_dir.join(key), bytes).unwrap();
    }
    let templates: HashMap<String, Value> = wf["spec"]["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), t.clone()))
        .collect();
    let tasks = wf["spec"]["templates"][0]["dag"]["tasks"]
        .as_array()
        .unwrap()
        .clone();
    let mut done: Vec<String> = Vec::new();
    let mut last = String::new();
    while done.len() < tasks.len() {
        let before = done.len();
        for t in &tasks {
            let name = t["name"].as_str().unwrap().to_string();
            let deps: Vec<String> = t["depends"]
                .as_str()
                .map(|d| d.split(" && ").map(str::to_string).collect())
                .unwrap_or_default();
            if done.contains(&name) || !deps.iter().all(|d| done.contains(d)) {
                continue;
            }
            let tpl = &templates[t["template"].as_str().unwrap()];
            if tpl.get("resource").is_some() {
                // The ConfigMap (written above) or a NetworkPolicy: nothing to run here.
                done.push(name.clone());
                continue;
            }
            let root = work.join(&name);
            let map = |s: &str| {
                s.replace("/voidbox/spec", spec_dir.to_str().unwrap())
                    .replace("/voidbox/inputs", root.join("inputs").to_str().unwrap())
                    .replace("/voidbox/outputs", root.join("outputs").to_str().unwrap())
            };
            // Input artifacts: `from` a task's results, unpacked at the template's path.
            let from: HashMap<String, String> = t["arguments"]["artifacts"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|x| {
                            (
                                x["name"].as_str().unwrap().to_string(),
                                x["from"].as_str().unwrap().to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            for a in tpl["inputs"]["artifacts"].as_array().into_iter().flatten() {
                let src = &from[a["name"].as_str().unwrap()];
                let producer = src
                    .strip_prefix("{{tasks.")
                    .and_then(|s| s.strip_suffix(".outputs.artifacts.results}}"))
                    .unwrap();
                copy_dir(
                    &work.join(producer).join("outputs"),
                    Path::new(&map(a["path"].as_str().unwrap())),
                );
            }
            let c = &tpl["container"];
            assert_eq!(strs(&c["command"]), ["voidbox"]);
            let mut args: Vec<String> = strs(&c["args"]).iter().map(|a| map(a)).collect();
            if args.iter().any(|a| a == "--node") {
                args.extend(["--boot-timeout".into(), BOOT_TIMEOUT.into()]);
            }
            let env: Vec<(String, String)> = c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| {
                    Some((
                        e["name"].as_str()?.into(),
                        e["value"]
                            .as_str()?
                            .replace("{{workflow.uid}}", "replay-uid"),
                    ))
                })
                .collect();
            let (code, _, err) = voidbox(work, &args, &env);
            assert_eq!(code, Some(0), "task {name}: {args:?}\n{err}");
            assert!(
                root.join("outputs/report.json").is_file()
                    || args.contains(&"--final-output".to_string())
            );
            done.push(name.clone());
            last = name;
        }
        assert!(done.len() > before, "the DAG is stuck at {done:?}");
    }
    std::fs::read(work.join(last).join("outputs/output")).unwrap()
}

/// Runs the GitHub Actions jobs as GitHub would: in `needs` order, each in a fresh checkout
/// (the spec at its repository path), its download steps filled from the uploaded
/// artifacts, its `run` steps in bash with their `env`, its upload steps stored. The setup
/// steps (checkout, KVM, install, cache) are this machine's already. Returns the last job's
/// `voidbox-outputs/output`.
fn replay_github(
    text: &str,
    work: &Path,
    spec: &Path,
    spec_rel: &str,
    dispatch_input: &str,
) -> Vec<u8> {
    let wf = yaml(text);
    let jobs = wf["jobs"].as_object().unwrap();
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(VOIDBOX, bin.join("voidbox")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut artifacts: HashMap<String, PathBuf> = HashMap::new();
    let mut done: Vec<String> = Vec::new();
    let mut last = String::new();
    while done.len() < jobs.len() {
        let before = done.len();
        for (name, job) in jobs {
            let needs: Vec<String> = job["needs"]
                .as_array()
                .map(|_| strs(&job["needs"]))
                .unwrap_or_default();
            if done.contains(name) || !needs.iter().all(|d| done.contains(d)) {
                continue;
            }
            let dir = work.join("jobs").join(name);
            std::fs::create_dir_all(dir.join(Path::new(spec_rel).parent().unwrap())).unwrap();
            std::fs::copy(spec, dir.join(spec_rel)).unwrap();
            let steps = job["steps"].as_array().unwrap();
            assert_eq!(steps[0]["uses"], "actions/checkout@v5");
            for s in steps {
                let uses = s["uses"].as_str().unwrap_or("");
                if uses.starts_with("actions/download-artifact@") {
                    let a = &artifacts[s["with"]["name"].as_str().unwrap()];
                    copy_dir(a, &dir.join(s["with"]["path"].as_str().unwrap()));
                } else if uses.starts_with("actions/upload-artifact@") {
                    let p = dir.join(s["with"]["path"].as_str().unwrap());
                    artifacts.insert(s["with"]["name"].as_str().unwrap().to_string(), p);
                } else if s["env"]["VOIDBOX_SPEC"].is_string() {
                    let script = s["run"].as_str().unwrap().replace(
                        "voidbox apply \"$VOIDBOX_SPEC\" --node",
                        &format!(
                            "voidbox apply \"$VOIDBOX_SPEC\" --boot-timeout {BOOT_TIMEOUT} --node"
                        ),
                    );
                    let mut cmd = Command::new("bash");
                    cmd.args(["-e", "-c", &script])
                        .current_dir(&dir)
                        .env("PATH", &path)
                        .env("NO_COLOR", "1");
                    for (k, v) in s["env"].as_object().unwrap() {
                        let v = v
                            .as_str()
                            .unwrap()
                            .replace(
                                "${{ github.repository_id }}-${{ github.run_id }}-${{ github.run_attempt }}",
                                "1-2-1",
                            )
                            .replace("${{ inputs.input }}", dispatch_input);
                        // `${{ '${{' }}` is GitHub's escape: it evaluates to `${{`.
                        let escape = "${{ '${{' }}";
                        assert!(
                            !v.replace(escape, "").contains("${{"),
                            "{k}={v}: a secret in a test spec"
                        );
                        cmd.env(k, v.replace(escape, "${{"));
                    }
                    let (k, v) = tag("job");
                    let out = cmd.env(&k, &v).output().unwrap();
                    assert_no_leftovers(&format!("{k}={v}"));
                    assert!(
                        out.status.success(),
                        "job {name}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            done.push(name.clone());
            last = name.clone();
        }
        assert!(done.len() > before, "the jobs are stuck at {done:?}");
    }
    std::fs::read(work.join("jobs").join(last).join("voidbox-outputs/output")).unwrap()
}

#[test]
fn replayed_argo_and_github_exports_give_applys_output() {
    if guest_image().is_none() {
        return;
    }
    let spec = repo_root().join("examples/fan-out.yaml");
    let want = whole_apply(&spec);
    assert_eq!(
        want,
        b"[9,\"THE QUICK BROWN FOX\\nJUMPS OVER THE LAZY DOG\",2]"
    );
    let dir = tempfile::tempdir().unwrap();
    let (code, argo, err) = voidbox(
        &repo_root(),
        &[
            "export".into(),
            "examples/fan-out.yaml".into(),
            "--format".into(),
            "argo".into(),
            "--image".into(),
            "r.example/voidbox:1".into(),
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    let got = replay_argo(&String::from_utf8(argo).unwrap(), &dir.path().join("argo"));
    assert_eq!(got, want, "Argo replay");
    let (code, gh, err) = voidbox(
        &repo_root(),
        &[
            "export".into(),
            "examples/fan-out.yaml".into(),
            "--format".into(),
            "github-actions".into(),
            "--voidbox-repo".into(),
            "acme/voidbox".into(),
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    let got = replay_github(
        &String::from_utf8(gh).unwrap(),
        &dir.path().join("gh"),
        &spec,
        "examples/fan-out.yaml",
        "",
    );
    assert_eq!(got, want, "GitHub Actions replay");
}

/// `apply --input` on another engine: a root node (`cat`, its output is its stdin) gets the
/// run's input exported with `voidbox export --input` on Argo (from the run's ConfigMap) and
/// on GitHub Actions (the dispatch input's default), and on GitHub the input given at
/// dispatch instead, each byte for byte what `voidbox apply --input` gives it.
#[test]
fn the_run_input_reaches_a_root_node_on_both_engines() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = PathBuf::from(write_spec(
        dir.path(),
        "kind: workflow\nname: echo-input\nsandbox: {memory_mb: 128}\nworkflow:\n  steps:\n    - {name: root, run: {program: cat}}\n",
    ));
    // Text the engines could take for their own expressions, and a trailing newline.
    let input = "{\"q\": \"${{ github.token }} {{workflow.uid}}\"}\n";
    let file = dir.path().join("input.json");
    std::fs::write(&file, input).unwrap();
    let at_file = format!("@{}", file.display());
    let (code, want, err) = voidbox(
        dir.path(),
        &args(&[
            "apply",
            spec.to_str().unwrap(),
            "--input",
            &at_file,
            "--boot-timeout",
            BOOT_TIMEOUT,
        ]),
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(want, input.as_bytes());
    let export = |format: &[&str]| {
        let mut a = vec!["export", spec.to_str().unwrap(), "--input", &at_file];
        a.extend_from_slice(format);
        let (code, out, err) = voidbox(dir.path(), &args(&a), &[]);
        assert_eq!(code, Some(0), "{err}");
        String::from_utf8(out).unwrap()
    };
    let argo = export(&["--format", "argo", "--image", "r.example/voidbox:1"]);
    let got = replay_argo(&argo, &dir.path().join("argo"));
    assert_eq!(got, want, "Argo: the exported input");
    let gh = export(&[
        "--format",
        "github-actions",
        "--voidbox-repo",
        "acme/voidbox",
        "--spec-path",
        "ci/spec.yaml",
    ]);
    let got = replay_github(&gh, &dir.path().join("gh"), &spec, "ci/spec.yaml", "");
    assert_eq!(got, want, "GitHub Actions: the exported input");
    let got = replay_github(
        &gh,
        &dir.path().join("gh2"),
        &spec,
        "ci/spec.yaml",
        "[1, 2]",
    );
    assert_eq!(got, b"[1, 2]", "GitHub Actions: the dispatch input wins");
}

fn write_spec(dir: &Path, text: &str) -> String {
    let p = dir.join("spec.yaml");
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_fan_in_is_merged_in_order_and_a_failing_node_is_retried() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = write_spec(
        dir.path(),
        "api_version: v1\nkind: pipeline\nname: fan-in\nsandbox: {memory_mb: 128}\npipeline:\n  boxes:\n    - {name: c, run: {program: echo}}\n    - {name: a, run: {program: echo}}\n    - {name: b, run: {program: echo}}\n    - {name: join, run: {program: sh, args: [-c, \"cat; mkdir -p /workspace/output && printf art > /workspace/output/x.txt\"]}, outputs: [{name: rep}]}\n    - {name: flaky, retries: 2, inputs: [{from: rep, guest: /workspace/in}], run: {program: sh, args: [-c, \"cat /workspace/in/x.txt >&2; echo attempt-$VOIDBOX_ATTEMPT >&2; exit 3\"]}}\n  stages:\n    - {type: fan_out, boxes: [c, a, b]}\n    - {type: box, name: join}\n    - {type: box, name: flaky}\n",
    );
    let ins = dir.path().join("in");
    for (n, out) in [("b", "\"B\"\n"), ("a", "2\n"), ("c", "text\n")] {
        std::fs::create_dir_all(ins.join(n)).unwrap();
        std::fs::write(ins.join(n).join("output"), out).unwrap();
    }
    let out = dir.path().join("join-out");
    let (code, stdout, err) = voidbox(
        dir.path(),
        &args(&[
            "apply",
            &spec,
            "--node",
            "join",
            "--inputs",
            ins.to_str().unwrap(),
            "--outputs",
            out.to_str().unwrap(),
            "--boot-timeout",
            BOOT_TIMEOUT,
        ]),
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(stdout, br#"["text",2,"B"]"#);
    assert_eq!(
        std::fs::read(out.join("output")).unwrap(),
        br#"["text",2,"B"]"#
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["status"], "succeeded");
    assert_eq!(report["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(report["nodes"][0]["name"], "join");
    // Its box output is collected into --outputs, and the next runner reads it from there.
    assert_eq!(
        std::fs::read(out.join("artifacts/rep/x.txt")).unwrap(),
        b"art"
    );
    copy_dir(&out, &ins.join("join"));
    let out = dir.path().join("flaky-out");
    let junit = dir.path().join("flaky.xml");
    let (code, stdout, err) = voidbox(
        dir.path(),
        &args(&[
            "apply",
            &spec,
            "--node",
            "flaky",
            "--inputs",
            ins.to_str().unwrap(),
            "--outputs",
            out.to_str().unwrap(),
            "--junit",
            junit.to_str().unwrap(),
            "--boot-timeout",
            BOOT_TIMEOUT,
        ]),
        &[],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(stdout.is_empty());
    assert!(err.contains("attempt-3"), "{err}");
    assert!(
        err.contains("artattempt-3"),
        "the box input reached the VM: {err}"
    );
    assert!(
        !out.join("output").exists(),
        "a failed node leaves no output"
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    let node = &report["nodes"][0];
    assert_eq!(
        (
            node["name"].as_str(),
            node["status"].as_str(),
            node["attempts"].as_u64()
        ),
        (Some("flaky"), Some("failed"), Some(3))
    );
    assert_eq!(node["exit_code"], 3);
    let junit = std::fs::read_to_string(junit).unwrap();
    assert!(
        junit.contains("<failure") && junit.contains("flaky"),
        "{junit}"
    );
}

#[test]
fn a_service_is_reached_from_another_runner() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = voidbox_tests::free_port();
    let spec = write_spec(
        dir.path(),
        &format!("api_version: v1\nkind: workflow\nname: across\nsandbox: {{memory_mb: 128}}\nworkflow:\n  steps:\n    - name: web\n      mode: service\n      ports: [{port}]\n      ready_timeout_secs: 120\n      run:\n        program: sh\n        args: [\"-c\", \"mkdir -p /workspace/www && echo hello-across > /workspace/www/index.html && exec httpd -f -p {port} -h /workspace/www\"]\n    - name: check\n      depends_on: [web]\n      run: {{program: sh, args: [\"-c\", \"timeout 30 wget -q -O- http://web:{port}/index.html\"]}}\n"),
    );
    let svc_out = dir.path().join("web-out");
    let (k, v) = tag("service");
    let mut service = Command::new(VOIDBOX)
        .args(args(&[
            "apply",
            &spec,
            "--node",
            "web",
            "--outputs",
            svc_out.to_str().unwrap(),
            "--service-listen",
            "127.0.0.1",
            "--boot-timeout",
            BOOT_TIMEOUT,
        ]))
        .env("NO_COLOR", "1")
        .env(&k, &v)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !svc_out.join("ready").exists() {
        if let Some(status) = service.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(service.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("the service runner exited ({status}) before it was ready:\n{err}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(400),
            "the service never became ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = dir.path().join("check-out");
    let (code, stdout, err) = voidbox(
        dir.path(),
        &args(&[
            "apply",
            &spec,
            "--node",
            "check",
            "--outputs",
            out.to_str().unwrap(),
            "--service",
            "web=127.0.0.1",
            "--boot-timeout",
            BOOT_TIMEOUT,
        ]),
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(stdout, b"hello-across\n");
    // The engine stops a daemon when its dependents are done.
    // SAFETY-free: plain kill(2) of our own child.
    let _ = Command::new("kill")
        .args(["-TERM", &service.id().to_string()])
        .status();
    let status = service.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    assert_no_leftovers(&format!("{k}={v}"));
    let report: Value =
        serde_json::from_slice(&std::fs::read(svc_out.join("report.json")).unwrap()).unwrap();
    assert!(
        report["nodes"][0]["service"]["connections"]
            .as_u64()
            .unwrap_or(0)
            >= 1,
        "{report}"
    );
}
