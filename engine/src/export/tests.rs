//! The exports' structure, from compiled plans (the engines' own schemas, hera and
//! actionlint check every example in `tests/tests/export_engines.rs`).

use clap::Parser;
use serde_json::Value;

use super::*;
use crate::plan::compile_for_test;

fn args(extra: &[&str]) -> ExportArgs {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: ExportArgs,
    }
    let mut argv = vec!["export", "/specs/t.yaml"];
    argv.extend_from_slice(extra);
    Cli::parse_from(argv).a
}

fn yaml_docs(text: &str) -> Vec<Value> {
    text.split("\n---\n")
        .map(|d| voidbox_spec::yaml::parse(d).unwrap().to_json())
        .collect()
}

const FAN: &str = "kind: pipeline\nname: fan\non_failure: continue\nsandbox: {memory_mb: 256, vcpus: 2}\npipeline:\n  boxes:\n    - {name: seed, run: {program: echo}, retries: 2, timeout_secs: 60}\n    - {name: a_1, run: {program: echo}}\n    - {name: a-1, run: {program: echo}}\n    - {name: 9lives, run: {program: echo}, sandbox: {env: {TOKEN: \"\", MODE: fast}}}\n  stages:\n    - {type: box, name: seed}\n    - {type: fan_out, boxes: [a_1, a-1, 9lives]}\n";

#[test]
fn engine_names_are_safe_unique_and_avoid_reserved_ones() {
    let names = engine_names(
        ["a_1", "a-1", "9lives", "voidbox", "-x-", "ünï"],
        &["voidbox"],
    );
    assert_eq!(names, ["a-1", "a-1-2", "n-9lives", "voidbox-2", "x", "n"]);
    assert_eq!(
        engine_names(["Build", "build", "VOIDBOX"], &["voidbox"]),
        ["Build", "build-2", "VOIDBOX-2"]
    );
    let long = "x".repeat(200);
    assert!(engine_names([long.as_str()], &[])[0].len() <= 60);
}

#[test]
fn argo_dag_carries_dependencies_artifacts_retries_and_resources() {
    let plan = compile_for_test(FAN);
    let text = argo::export(
        &plan,
        FAN,
        &args(&[
            "--format",
            "argo",
            "--image",
            "r/v:1",
            "--max-parallel",
            "4",
        ]),
    )
    .unwrap();
    let docs = yaml_docs(&text);
    assert_eq!(
        docs.len(),
        1,
        "one document: the ConfigMap is the run's own"
    );
    let wf = &docs[0];
    assert_eq!(wf["kind"], "Workflow");
    assert_eq!(wf["spec"]["parallelism"], 4);
    let tpls = wf["spec"]["templates"].as_array().unwrap();
    let dag = &tpls[0]["dag"];
    assert_eq!(dag["failFast"], false, "on_failure: continue");
    let tasks = dag["tasks"].as_array().unwrap();
    let names: Vec<&str> = tasks.iter().map(|t| t["name"].as_str().unwrap()).collect();
    // The plan's output is the fan-out's merge: one more task builds it.
    assert_eq!(
        names,
        [
            "voidbox-spec",
            "seed",
            "a-1",
            "a-1-2",
            "n-9lives",
            "final-output"
        ]
    );
    assert_eq!(tasks[1]["depends"], "voidbox-spec");
    assert_eq!(tasks[2]["depends"], "voidbox-spec && seed");
    assert_eq!(tasks[5]["depends"], "a-1 && a-1-2 && n-9lives");
    assert_eq!(
        tasks[2]["arguments"]["artifacts"][0]["from"],
        "{{tasks.seed.outputs.artifacts.results}}"
    );
    let tpl = |n: &str| tpls.iter().find(|t| t["name"] == n).unwrap();
    let seed = tpl("seed");
    assert_eq!(seed["retryStrategy"]["limit"], "2");
    assert_eq!(
        seed["activeDeadlineSeconds"],
        (3 * (60 + 600) + 2 * 30).to_string()
    );
    let c = &seed["container"];
    assert_eq!(
        c["resources"]["requests"]["memory"],
        format!("{}Mi", 256 + 32 + RUNNER_OVERHEAD_MB)
    );
    assert_eq!(c["resources"]["requests"]["cpu"], "2");
    assert_eq!(c["resources"]["limits"]["devices.kubevirt.io/kvm"], "1");
    assert_eq!(c["args"][3], "seed");
    // The fan-out member reads seed's results where the runner looks for them.
    let a1 = tpl("a-1");
    assert_eq!(a1["inputs"]["artifacts"][0]["path"], "/voidbox/inputs/seed");
    assert_eq!(
        a1["container"]["args"][3], "a_1",
        "the runner gets the plan's name"
    );
    // A copied variable comes from the Secret, never as a literal.
    let env = &tpl("n-9lives")["container"]["env"];
    assert_eq!(env[1]["name"], "TOKEN");
    assert_eq!(env[1]["valueFrom"]["secretKeyRef"]["name"], "voidbox");
    assert!(
        !text.contains("MODE: fast\n      "),
        "literal env stays in the spec only"
    );
    let fin = tpl("final-output");
    assert_eq!(fin["container"]["args"][2], "--final-output");
    // Privileged: a hostPath /dev/kvm instead of the resource.
    let text = argo::export(
        &plan,
        FAN,
        &args(&[
            "--format",
            "argo",
            "--image",
            "r/v:1",
            "--privileged",
            "--kind",
            "workflow-template",
        ]),
    )
    .unwrap();
    let wf = &yaml_docs(&text)[0];
    assert_eq!(wf["kind"], "WorkflowTemplate");
    assert_eq!(wf["spec"]["volumes"][1]["hostPath"]["path"], "/dev/kvm");
    let c = &wf["spec"]["templates"][1]["container"];
    assert_eq!(c["securityContext"]["privileged"], true);
    assert!(c["resources"]["requests"]
        .get("devices.kubevirt.io/kvm")
        .is_none());
}

#[test]
fn argo_sidecars_are_daemons_reached_at_their_pod_ip() {
    let src = "kind: workflow\nname: w\nworkflow:\n  steps:\n    - {name: web, mode: service, ports: [8080], ready_timeout_secs: 9, run: {program: httpd}}\n    - {name: check, depends_on: [web, quiet], run: {program: wget}}\n    - {name: quiet, mode: service, run: {program: sleep}}\n";
    let plan = compile_for_test(src);
    let wf = &yaml_docs(
        &argo::export(&plan, src, &args(&["--format", "argo", "--image", "r/v:1"])).unwrap(),
    )[0];
    let tpls = wf["spec"]["templates"].as_array().unwrap();
    let web = &tpls[1];
    assert_eq!(web["daemon"], true);
    assert!(web.get("outputs").is_none() && web.get("activeDeadlineSeconds").is_none());
    assert_eq!(web["container"]["readinessProbe"]["failureThreshold"], 9);
    assert_eq!(web["container"]["ports"][0]["containerPort"], 8080);
    let args: Vec<&str> = web["container"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.windows(2)
            .any(|w| w == ["--service-listen", "0.0.0.0"]),
        "{args:?}"
    );
    let check: Vec<&str> = tpls[2]["container"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        check
            .windows(2)
            .any(|w| w == ["--service", "web={{tasks.web.ip}}"]),
        "{check:?}"
    );
    assert!(!check.contains(&"--inputs"), "a sidecar hands no results");
    assert!(!check.iter().any(|a| a.starts_with("quiet=")), "{check:?}");
    // A sidecar without ports is a daemon its dependents wait for, reached by nobody.
    let quiet = &tpls[3];
    assert_eq!(
        (quiet["name"].as_str(), &quiet["daemon"]),
        (Some("quiet"), &Value::Bool(true))
    );
    let args = quiet["container"]["args"].as_array().unwrap();
    assert!(!args.iter().any(|a| a == "--service-listen"), "{args:?}");
    let dag = &wf["spec"]["templates"][0]["dag"]["tasks"];
    assert_eq!(dag[4]["name"], "check");
    assert_eq!(dag[4]["depends"], "voidbox-spec && web && quiet");
    // Each service starts after its NetworkPolicy exists.
    assert_eq!(dag[3]["depends"], "voidbox-spec && web-policy");
}

/// The run's ConfigMap: made by the first task, named after the Workflow, owned by it, and
/// carrying the spec and the run's input as base64 that Argo's `{{…}}` expansion cannot touch;
/// only the nodes taking the run's input read it.
#[test]
fn argo_config_map_is_the_runs_own_and_carries_the_input() {
    use base64::Engine as _;
    let src = "kind: workflow\nname: w\nworkflow:\n  steps:\n    - {name: a, run: {program: cat}}\n    - {name: b, run: {program: echo, args: [\"{{workflow.name}}\"]}}\n    - {name: c, depends_on: [a, b], run: {program: cat}}\n";
    let plan = compile_for_test(src);
    let input = "{\"q\": \"{{workflow.uid}}\"}";
    let text = argo::export(
        &plan,
        src,
        &args(&["--format", "argo", "--image", "r/v:1", "--input", input]),
    )
    .unwrap();
    let wf = &yaml_docs(&text)[0];
    let tpls = wf["spec"]["templates"].as_array().unwrap();
    let tpl = |n: &str| tpls.iter().find(|t| t["name"] == n).unwrap();
    let res = &tpl("voidbox-spec")["resource"];
    assert_eq!(res["action"], "create");
    assert_eq!(res["setOwnerReference"], true);
    let cm = voidbox_spec::yaml::parse(res["manifest"].as_str().unwrap())
        .unwrap()
        .to_json();
    assert_eq!(cm["kind"], "ConfigMap");
    assert_eq!(cm["metadata"]["name"], "{{workflow.name}}-spec");
    assert_eq!(
        wf["spec"]["volumes"][0]["configMap"]["name"],
        "{{workflow.name}}-spec"
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    let decode = |k: &str| b64.decode(cm["binaryData"][k].as_str().unwrap()).unwrap();
    assert_eq!(decode("spec.yaml"), src.as_bytes());
    assert_eq!(decode("input"), input.as_bytes());
    // Argo expands `{{…}}` in a manifest: none of the user's text is there as text.
    assert_eq!(res["manifest"].as_str().unwrap().matches("{{").count(), 1);
    let has_input = |n: &str| {
        let a = &tpl(n)["container"]["args"];
        a.as_array()
            .unwrap()
            .windows(2)
            .any(|w| w[0] == "--input" && w[1] == "@/voidbox/spec/input")
    };
    assert!(has_input("a") && has_input("b") && !has_input("c"));
    // Without --input no node reads one and the ConfigMap has no input key.
    let text = argo::export(&plan, src, &args(&["--format", "argo", "--image", "r/v:1"])).unwrap();
    assert!(!text.contains("- \"--input\"\n") && !text.contains("  input:"));
    let e = argo::export(
        &plan,
        src,
        &args(&["--format", "argo", "--image", "r/v:1", "--input", "{x"]),
    )
    .unwrap_err();
    assert!(e[0].contains("--input is not valid JSON"), "{e:?}");
}

#[test]
fn what_cannot_leave_this_machine_is_refused_per_node() {
    let src = "kind: pipeline\nname: w\npipeline:\n  boxes:\n    - {name: web, mode: service, ports: [80], run: {program: httpd}}\n    - {name: m, run: {program: ls}, sandbox: {mounts: [{host: /srv, guest: /srv}]}}\n    - name: ag\n      prompt: hi\n      llm: {provider: claude-personal}\n    - {name: \"x{{y}}\", run: {program: ls}}\n  stages:\n    - {type: box, name: web}\n    - {type: fan_out, boxes: [m, ag, \"x{{y}}\"]}\n";
    let plan = compile_for_test(src);
    let e = Export::new(&plan, Format::GithubActions, &[]).unwrap_err();
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e[0].starts_with("node `web`") && e[0].contains("GitHub Actions"),
        "{e:?}"
    );
    assert!(
        e[1].contains("sandbox.mounts") && e[1].contains("/srv"),
        "{e:?}"
    );
    assert!(e[2].contains("claude-personal"), "{e:?}");
    let e = Export::new(&plan, Format::Argo, &[]).unwrap_err();
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(e[2].contains("`{{`"), "{e:?}");
    let e = argo::export(&plan, src, &args(&["--format", "argo"])).unwrap_err();
    assert!(e[0].contains("--image"), "{e:?}");
}

#[test]
fn github_jobs_need_their_upstream_and_never_evaluate_user_text() {
    let src = "kind: pipeline\nname: w\non_failure: fail_fast\npipeline:\n  boxes:\n    - {name: \"a ${{ secrets.X }}\", run: {program: ls}}\n    - {name: b, run: {program: ls}}\n    - name: ag\n      prompt: hi\n      llm: {provider: codex}\n  stages:\n    - {type: box, name: \"a ${{ secrets.X }}\"}\n    - {type: box, name: b}\n    - {type: box, name: ag}\n";
    let plan = compile_for_test(src);
    let a = args(&[
        "--format",
        "github-actions",
        "--voidbox-repo",
        "acme/voidbox",
        "--spec-path",
        "ci/w.yaml",
    ]);
    let text = github::export(&plan, &a).unwrap();
    let wf = &yaml_docs(&text)[0];
    let jobs = wf["jobs"].as_object().unwrap();
    assert_eq!(jobs.keys().collect::<Vec<_>>(), ["a-secrets-X", "b", "ag"]);
    assert_eq!(wf["jobs"]["b"]["needs"][0], "a-secrets-X");
    assert_eq!(
        wf["permissions"]["actions"], "write",
        "fail-fast cancels the run"
    );
    let steps = wf["jobs"]["a-secrets-X"]["steps"].as_array().unwrap();
    let run = steps
        .iter()
        .find(|s| s["env"]["VOIDBOX_NODE"].is_string())
        .unwrap();
    assert_eq!(run["env"]["VOIDBOX_NODE"], "a ${{ '${{' }} secrets.X }}");
    assert_eq!(run["env"]["VOIDBOX_SPEC"], "ci/w.yaml");
    assert!(run["run"]
        .as_str()
        .unwrap()
        .contains("--node \"$VOIDBOX_NODE\""));
    let ag = wf["jobs"]["ag"]["steps"].as_array().unwrap();
    let run = ag
        .iter()
        .find(|s| s["env"]["VOIDBOX_NODE"].is_string())
        .unwrap();
    assert_eq!(
        run["env"]["OPENAI_API_KEY"],
        "${{ secrets.OPENAI_API_KEY }}"
    );
    let dl = ag
        .iter()
        .find(|s| s["uses"] == "actions/download-artifact@v7")
        .unwrap();
    assert_eq!(dl["with"]["name"], "voidbox-b");
    assert_eq!(dl["with"]["path"], "voidbox-inputs/b");
    // The run's input: a dispatch input for the root node only, the exported one as its
    // default (escaped, so never evaluated).
    let a = args(&[
        "--format",
        "github-actions",
        "--voidbox-repo",
        "acme/voidbox",
        "--spec-path",
        "ci/w.yaml",
        "--input",
        "{\"k\": \"${{ secrets.X }}\"}",
    ]);
    let wf = &yaml_docs(&github::export(&plan, &a).unwrap())[0];
    assert_eq!(
        wf["on"]["workflow_dispatch"]["inputs"]["input"]["type"],
        "string"
    );
    let run_of = |job: &str| {
        wf["jobs"][job]["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["env"]["VOIDBOX_NODE"].is_string())
            .unwrap()
            .clone()
    };
    let root = run_of("a-secrets-X");
    assert_eq!(root["env"]["VOIDBOX_INPUT"], "${{ inputs.input }}");
    assert_eq!(
        root["env"]["VOIDBOX_EXPORTED_INPUT"],
        "{\"k\": \"${{ '${{' }} secrets.X }}\"}"
    );
    assert!(root["run"].as_str().unwrap().contains("\"$@\""));
    assert!(run_of("b")["env"].get("VOIDBOX_INPUT").is_none());
    let e = github::export(&plan, &args(&["--format", "github-actions"])).unwrap_err();
    assert!(e[0].contains("--voidbox-repo"), "{e:?}");
    let e = github::export(
        &plan,
        &args(&["--format", "github-actions", "--voidbox-repo", "a/b/c"]),
    )
    .unwrap_err();
    assert!(e[0].contains("OWNER/NAME"), "{e:?}");
}
