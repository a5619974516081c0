//! Edges of the CLI contract that need no VM (issue #23): a closed stdout, a misspelt flag
//! before `run`'s command, `validate`'s verdict independent of the image cache (a
//! `run.program` the guest image lacks is `apply`'s to refuse), and terminal escapes in a
//! spec.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use voidbox_tests::{repo_root, run_isolated, write_file, Run};

const BIN: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

/// The fixed image cache of the corpus tests: one guest image manifest listing the busybox
/// programs on `PATH` (`echo`, `sh`, … but no `ehco`, `python3` or `make`).
fn fixture_cache() -> std::path::PathBuf {
    repo_root().join("tests/fixtures/image-cache")
}

/// Runs `voidbox` in the repository root against the fixture image cache, HOME in `home`.
fn run_fixture(home: &Path, args: &[&str]) -> Run {
    let xdg = fixture_cache();
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(repo_root())
        .env("NO_COLOR", "1")
        .env("XDG_CACHE_HOME", &xdg)
        .env("HOME", home)
        .env_remove("VOIDBOX_DNS_UPSTREAMS");
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {BIN}: {e}"))
        .into()
}

/// Runs `voidbox ARGS` with stdout a pipe whose read end is already closed (as
/// `voidbox image ls | head -1` once `head` has exited), so that every write to stdout fails
/// with `EPIPE`; returns the exit code and stderr.
fn with_closed_stdout(home: &Path, args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(BIN)
        .args(args)
        .current_dir(repo_root())
        .env("NO_COLOR", "1")
        .env("XDG_CACHE_HOME", fixture_cache())
        .env("HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {BIN}: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn closed_stdout_exits_quietly_with_0() {
    let home = tempfile::tempdir().expect("home");
    // Each of these writes to stdout (against the fixture image cache); `schema`, `graph`
    // and `apply --dry-run` use `print!`, which panics on EPIPE unless the binary handles it.
    let skills_spec = write_file(
        home.path(),
        "skills.yaml",
        "kind: agent\nname: s\nllm: {provider: mock}\nagent:\n  prompt: hi\n  skills: [\"cli:awk\"]\n",
    );
    let commands: Vec<Vec<&str>> = vec![
        vec!["schema"],
        vec!["image", "ls"],
        vec!["image", "verify"],
        vec!["snapshot", "ls"],
        vec!["runtimes", "ls"],
        vec!["oci", "ls"],
        vec!["doctor"],
        vec!["graph", "examples/fan-out.yaml"],
        vec!["graph", "--format", "mermaid", "examples/workflow.yaml"],
        vec!["skills", &skills_spec],
        vec!["apply", "--dry-run", "examples/fan-out.yaml"],
        vec!["validate", "examples"],
        vec!["--help"],
    ];
    for args in commands {
        let (code, stderr) = with_closed_stdout(home.path(), &args);
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "voidbox {args:?} on a closed stdout:\n{stderr}"
        );
        // 0, as ripgrep: the reader stopped reading on purpose (`| head -1`), so under
        // `set -o pipefail` the pipeline must not fail; never 101 (a panic).
        assert_eq!(code, Some(0), "voidbox {args:?}: {stderr}");
    }
}

#[test]
fn misspelt_run_flag_is_a_usage_error_not_the_command() {
    let xdg = tempfile::tempdir().expect("xdg");
    let home = tempfile::tempdir().expect("home");
    let t0 = Instant::now();
    let r = run_isolated(
        BIN,
        xdg.path(),
        home.path(),
        &["run", "--memory", "512", "--", "true"],
        &[],
        &[],
    );
    assert_eq!(r.code, Some(2), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("unexpected argument '--memory'"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("tip: a similar argument exists: '--memory-mb'"),
        "{}",
        r.stderr
    );
    // Refused while parsing: no guest image is looked for or built, no VM is started.
    assert!(
        !r.stderr.contains("guest") && !r.stderr.contains("image"),
        "{}",
        r.stderr
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    // The command still takes hyphens after its first word, and anything after `--`.
    let r = run_isolated(
        BIN,
        xdg.path(),
        home.path(),
        &["run", "--vcpus", "0", "ls", "-la"],
        &[],
        &[],
    );
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("--vcpus"), "{}", r.stderr);
}

/// The shape of void-box's `examples/specs/codex_workflow_smoke.yaml`: a workflow step
/// running `codex --version`.
const CODEX_SMOKE: &str = "api_version: v1\nkind: workflow\nname: codex-workflow-smoke\nsandbox:\n  mode: auto\n  memory_mb: 1024\n  vcpus: 1\n  network: true\nworkflow:\n  steps:\n    - name: codex-version\n      run:\n        program: codex\n        args: [\"--version\"]\n  output_step: codex-version\n";

/// An `XDG_CACHE_HOME` in `dir` whose `voidbox` is this machine's real cache (a link), when
/// it has one.
fn real_cache(dir: &Path) -> Option<std::path::PathBuf> {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let xdg = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| home.map(|h| h.join(".cache")))?;
    let real = xdg.join("voidbox");
    real.join("images").is_dir().then_some(())?;
    let at = dir.join("real-xdg");
    std::fs::create_dir_all(&at).expect("mkdir");
    std::os::unix::fs::symlink(&real, at.join("voidbox")).expect("symlink");
    Some(at)
}

#[test]
fn validate_gives_the_same_verdict_with_and_without_a_cached_image() {
    let home = tempfile::tempdir().expect("home");
    let dir = home.path();
    let empty = tempfile::tempdir().expect("empty cache");
    let real = real_cache(dir);
    // No image; the fixture's image manifest (busybox's programs, no `codex`, no `ehco`);
    // this machine's real cache, when it has one.
    let caches: Vec<std::path::PathBuf> = [empty.path().to_path_buf(), fixture_cache()]
        .into_iter()
        .chain(real.clone())
        .collect();
    let specs = [
        write_file(dir, "codex_workflow_smoke.yaml", CODEX_SMOKE),
        write_file(
            dir,
            "typo.yaml",
            "kind: sandbox\nname: typo\nrun:\n  program: ehco\n  args: [hi]\n",
        ),
        write_file(
            dir,
            "cli.yaml",
            "kind: agent\nname: a\nllm: {provider: mock}\nagent:\n  prompt: hi\n  skills: [\"cli:nosuchtool-4e1f\"]\n",
        ),
    ];
    for spec in &specs {
        for format in ["human", "json", "github"] {
            let runs: Vec<(Option<i32>, String, String)> = caches
                .iter()
                .map(|xdg| {
                    let r = run_isolated(
                        BIN,
                        xdg,
                        dir,
                        &["validate", "--format", format, spec],
                        &[],
                        &[],
                    );
                    (r.code, r.stdout, r.stderr)
                })
                .collect();
            for (xdg, r) in caches.iter().zip(&runs) {
                assert_eq!(
                    r,
                    &runs[0],
                    "{spec} --format {format} with {}",
                    xdg.display()
                );
            }
            // What depends on the image is left to `apply`: each spec is valid.
            assert_eq!(runs[0].0, Some(0), "{spec}: {runs:?}");
        }
    }
    let r = run_isolated(BIN, empty.path(), dir, &["validate", &specs[0]], &[], &[]);
    assert!(r.stdout.contains("1 spec file valid"), "{}", r.stdout);
    // `apply --dry-run` checks them against the image it would boot, at the value. Without
    // an image it says they wait for one.
    let r = run_isolated(
        BIN,
        empty.path(),
        dir,
        &["apply", "--dry-run", &specs[1]],
        &[],
        &[],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stderr.contains("`run.program`, `cli:` skills"),
        "{}",
        r.stderr
    );
    let Some(real) = real else {
        eprintln!("no guest image is cached here: the dry-run checks against one are skipped");
        return;
    };
    let dry = |spec: &str| run_isolated(BIN, &real, dir, &["apply", "--dry-run", spec], &[], &[]);
    let r = dry(&specs[1]);
    if r.stderr.contains("no guest image is cached yet") {
        eprintln!("no usable guest image is cached here: the dry-run checks are skipped");
        return;
    }
    assert_eq!(r.code, Some(3), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "error: {}:4:12: `run.program`: program `ehco` is not on the guest image's PATH",
            specs[1]
        )),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("did you mean `echo`?"), "{}", r.stderr);
    let r = dry(&specs[2]);
    assert_eq!(r.code, Some(3), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains(&format!("error: {}:6:12: `agent.skills[0]`", specs[2]))
            && r.stderr
                .contains("`nosuchtool-4e1f` is not on the guest image's PATH"),
        "{}",
        r.stderr
    );
    // `codex` comes with the runtimes disk, which a step running it gets.
    let r = dry(&specs[0]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
}

#[test]
fn terminal_escapes_in_a_spec_are_shown_not_sent() {
    let home = tempfile::tempdir().expect("home");
    let dir = home.path();
    // ESC ] 0 ; … BEL retitles a terminal; ESC [ 2 J clears it.
    let in_string = write_file(
        dir,
        "name.yaml",
        "kind: sandbox\nname: \"\u{1b}]0;pwned\u{7}\"\nrun: {program: echo}\n",
    );
    let in_key = write_file(
        dir,
        "key.yaml",
        "kind: sandbox\nname: ok\n\"ke\u{1b}]0;x\u{7}y\": 1\nrun: {program: echo, args: [\"\u{1b}[2J\"]}\n",
    );
    for format in ["human", "github", "json"] {
        for spec in [&in_string, &in_key] {
            let r = run_fixture(dir, &["validate", "--format", format, spec]);
            assert_eq!(r.code, Some(1), "{format} {spec}: {}{}", r.stdout, r.stderr);
            let all = format!("{}{}", r.stdout, r.stderr);
            assert!(
                !all.contains('\u{1b}') && !all.contains('\u{7}'),
                "{format} {spec}: raw control characters in {all:?}"
            );
        }
    }
    let r = run_fixture(dir, &["validate", &in_string]);
    assert!(
        r.stdout.contains("name: \"\\u{1b}]0;pwned\\u{7}\""),
        "{}",
        r.stdout
    );
    let r = run_fixture(dir, &["validate", &in_key]);
    assert!(
        r.stdout.contains("unknown field `ke\\u{1b}]0;x\\u{7}y`"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("\"ke\\u{1b}]0;x\\u{7}y\": 1"),
        "{}",
        r.stdout
    );
    // JSON keeps the text, escaped by JSON itself.
    let r = run_fixture(dir, &["validate", "--format", "json", &in_key]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    let msg = doc["files"][0]["diagnostics"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(msg.contains("ke\u{1b}]0;x\u{7}y"), "{msg:?}");
    // The same diagnostics on stderr, from `graph` and `apply --dry-run`.
    for cmd in ["graph", "apply"] {
        let mut args = vec![cmd];
        if cmd == "apply" {
            args.push("--dry-run");
        }
        args.push(&in_string);
        let r = run_fixture(dir, &args);
        assert!(r.code != Some(0), "{}", r.stderr);
        assert!(
            !r.stderr.contains('\u{1b}') && r.stderr.contains("\\u{1b}"),
            "{:?}",
            r.stderr
        );
    }
}

/// A directory like a real repository's: one spec among YAML that is not voidbox's.
fn mixed_repo(dir: &Path) {
    write_file(
        dir,
        ".pre-commit-config.yaml",
        "repos:\n  - repo: local\n    hooks: []\n",
    );
    write_file(dir, ".pre-commit-hooks.yaml", "- id: x\n  entry: x\n");
    write_file(
        dir,
        "ci/workflow.yml",
        "on: push\njobs:\n  t: {runs-on: ubuntu-latest, steps: [{run: make}]}\n",
    );
    write_file(
        dir,
        "deploy/app.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: app}\n",
    );
    write_file(
        dir,
        "specs/hello.yaml",
        "api_version: v1\nkind: sandbox\nname: hello\nrun: {program: echo, args: [hi]}\n",
    );
}

#[test]
fn validate_skips_yaml_that_is_not_a_spec() {
    let home = tempfile::tempdir().expect("home");
    let repo = tempfile::tempdir().expect("repo");
    mixed_repo(repo.path());
    let root = repo.path().to_str().expect("utf-8");
    let r = run_fixture(home.path(), &["validate", root]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("1 spec file valid (4 other YAML skipped; --verbose names them)"),
        "{}",
        r.stdout
    );
    assert!(r.stderr.is_empty(), "{}", r.stderr);
    let r = run_fixture(home.path(), &["validate", "--verbose", root]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    for f in [
        ".pre-commit-config.yaml",
        ".pre-commit-hooks.yaml",
        "ci/workflow.yml",
        "deploy/app.yaml",
    ] {
        assert!(
            r.stderr
                .contains(&format!("skipped {root}/{f}: not a voidbox spec")),
            "{f}: {}",
            r.stderr
        );
    }
    let r = run_fixture(home.path(), &["validate", "--format", "json", root]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(doc["summary"]["files"], 1, "{doc}");
    assert_eq!(doc["summary"]["skipped"].as_array().map(Vec::len), Some(4));
    // A file named explicitly is still checked…
    let config = format!("{root}/.pre-commit-config.yaml");
    let r = run_fixture(home.path(), &["validate", &config]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("kind"), "{}", r.stdout);
    // …unless the hook's `--only-specs` says to judge it as a walk would.
    let spec = format!("{root}/specs/hello.yaml");
    let r = run_fixture(home.path(), &["validate", "--only-specs", &config, &spec]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("1 spec file valid (1 other YAML skipped"));
    // `--only-specs` never reads what could block: a FIFO is refused, not waited on.
    let fifo = format!("{root}/pipe.yaml");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let t0 = Instant::now();
    let r = run_fixture(home.path(), &["validate", "--only-specs", &fifo]);
    assert_eq!(r.code, Some(2), "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("not a regular file"), "{}", r.stderr);
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    std::fs::remove_file(&fifo).expect("rm fifo");
    // A directory with no spec at all is still an error.
    let r = run_fixture(home.path(), &["validate", &format!("{root}/deploy")]);
    assert_eq!(r.code, Some(2), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("no voidbox spec files found (1 YAML file without"),
        "{}",
        r.stderr
    );
}

/// The pre-commit snippet of docs/cli.md, run by the real `pre-commit` against this repository's
/// hook definition: it passes in a repository whose other YAML is not voidbox's, and fails on
/// an invalid spec.
#[test]
fn the_pre_commit_hook_checks_specs_and_leaves_other_yaml_alone() {
    let pre_commit = voidbox_tests::wheel_tool("pre-commit");
    let repo = tempfile::tempdir().expect("repo");
    let bin = tempfile::tempdir().expect("bin");
    std::os::unix::fs::symlink(BIN, bin.path().join("voidbox")).expect("symlink");
    mixed_repo(repo.path());
    let git = |args: &[&str]| {
        let s = Command::new("git")
            .args(args)
            .current_dir(repo.path())
            .stdout(Stdio::null())
            .status()
            .expect("git");
        assert!(s.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let hook = |home: &Path| {
        let out = Command::new(&pre_commit)
            .args(["try-repo", "--all-files", "--color", "never"])
            .arg(repo_root())
            .arg("voidbox-validate")
            .current_dir(repo.path())
            .env("PATH", &path)
            .env("PRE_COMMIT_HOME", home)
            .env("XDG_CACHE_HOME", fixture_cache())
            .env("NO_COLOR", "1")
            .output()
            .expect("pre-commit");
        let run: Run = out.into();
        run
    };
    let home = tempfile::tempdir().expect("pre-commit home");
    let r = hook(home.path());
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("voidbox validate") && r.stdout.contains("Passed"),
        "{}",
        r.stdout
    );
    write_file(
        repo.path(),
        "specs/broken.yaml",
        "api_version: v1\nkind: sandbox\nname: broken\nrun: {program: echo}\nmemroy_mb: 1\n",
    );
    git(&["add", "-A"]);
    let r = hook(home.path());
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("Failed"), "{}", r.stdout);
    assert!(r.stdout.contains("broken.yaml:5:1"), "{}", r.stdout);
}

#[test]
fn an_unreachable_model_endpoint_is_refused_before_any_vm() {
    let home = tempfile::tempdir().expect("home");
    let dir = home.path();
    // A loopback port that nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let spec = write_file(
        dir,
        "local.yaml",
        &format!(
            "api_version: v1\nkind: pipeline\nname: local\npipeline:\n  boxes:\n    - name: ask\n      prompt: hi\n      llm: {{provider: custom, base_url: \"http://127.0.0.1:{port}\", model: m}}\n    - {{name: after, run: {{program: cat}}}}\n"
        ),
    );
    for dry in [false, true] {
        let mut args = vec!["apply"];
        if dry {
            args.push("--dry-run");
        }
        args.push(&spec);
        let t0 = Instant::now();
        let r = run_fixture(dir, &args);
        assert_eq!(r.code, Some(3), "dry-run {dry}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stderr.contains(&format!(
                "local.yaml:8:31: `pipeline.boxes[0].llm.base_url`: http://127.0.0.1:{port}/ is unreachable"
            )),
            "{}",
            r.stderr
        );
        assert!(r.stderr.contains("refused"), "{}", r.stderr);
        assert!(r.stderr.contains("--no-endpoint-check"), "{}", r.stderr);
        assert!(r.stderr.contains("nothing was started"), "{}", r.stderr);
        assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    }
    // The override names itself; the flag skips the check.
    let mut cmd = Command::new(BIN);
    let r: Run = cmd
        .args(["apply", "--dry-run", &spec])
        .env("NO_COLOR", "1")
        .env("XDG_CACHE_HOME", fixture_cache())
        .env("HOME", dir)
        .env(
            "VOIDBOX_LLM_BASE_URL",
            format!("http://127.0.0.1:{port}/v1"),
        )
        .output()
        .expect("run")
        .into();
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("node `ask`: VOIDBOX_LLM_BASE_URL: http://127.0.0.1:"),
        "{}",
        r.stderr
    );
    let r = run_fixture(dir, &["apply", "--dry-run", "--no-endpoint-check", &spec]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("pipeline `local`"), "{}", r.stdout);
    // An endpoint that is up passes.
    let open = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let up = write_file(
        dir,
        "up.yaml",
        &std::fs::read_to_string(&spec).expect("spec").replace(
            &port.to_string(),
            &open.local_addr().expect("addr").port().to_string(),
        ),
    );
    let r = run_fixture(dir, &["apply", "--dry-run", &up]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
}

#[test]
fn dry_run_json_is_the_plan_as_json() {
    let home = tempfile::tempdir().expect("home");
    let r = run_fixture(
        home.path(),
        &[
            "apply",
            "--dry-run",
            "--output",
            "json",
            "examples/fan-out.yaml",
        ],
    );
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("a JSON plan");
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["name"], "text-stats");
    assert_eq!(
        doc["levels"],
        serde_json::json!([["seed"], ["words", "upper", "lines"], ["collect"]])
    );
    let collect = &doc["nodes"][4];
    assert_eq!(collect["input"]["from"], "fan_out", "{collect}");
    assert_eq!(collect["memory_mb"], 128);
    assert_eq!(
        doc["output"],
        serde_json::json!({"from": "node", "node": "collect"})
    );
    // The same document as `graph --format json`.
    let g = run_fixture(
        home.path(),
        &["graph", "--format", "json", "examples/fan-out.yaml"],
    );
    assert_eq!(g.stdout, r.stdout);
}

/// The one default memory: 256 MiB for `run`, `snapshot create` and a command node without
/// `memory_mb`; an agent node keeps 1024 MiB.
#[test]
fn one_default_memory() {
    let home = tempfile::tempdir().expect("home");
    let spec = write_file(
        home.path(),
        "minimal.yaml",
        "api_version: v1\nkind: pipeline\nname: m\nllm: {provider: mock}\npipeline:\n  boxes:\n    - {name: cmd, run: {program: echo}}\n    - {name: ask, prompt: hi}\n",
    );
    let r = run_fixture(home.path(), &["graph", "--format", "json", &spec]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(doc["nodes"][0]["memory_mb"], 256, "{doc}");
    assert_eq!(doc["nodes"][1]["memory_mb"], 1024, "{doc}");
    for args in [&["run", "--help"][..], &["snapshot", "create", "--help"]] {
        let r = run_fixture(home.path(), args);
        assert!(
            r.stdout.contains("[default: 256]"),
            "{args:?}: {}",
            r.stdout
        );
    }
    let r = run_fixture(home.path(), &["schema"]);
    assert!(r
        .stdout
        .contains("default: 256 for a command, 1024 for an agent"));
}

#[test]
fn help_and_readme_say_what_voidbox_does() {
    let home = tempfile::tempdir().expect("home");
    let r = run_fixture(home.path(), &["--help"]);
    assert!(!r.stdout.contains("initramfs"), "{}", r.stdout);
    assert!(r.stdout.contains("kernel + system disk"), "{}", r.stdout);
    // Every `$ voidbox graph …` sample in the README and docs/cli.md is the real output.
    let docs = ["README.md", "docs/cli.md"]
        .map(|f| std::fs::read_to_string(repo_root().join(f)).expect(f))
        .join("\n");
    let mut samples = 0;
    for block in docs.split("```text\n").skip(1) {
        let block = block.split("```").next().unwrap_or_default();
        let Some(cmd) = block
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("$ voidbox graph "))
        else {
            continue;
        };
        let expected: String = block.lines().skip(1).map(|l| format!("{l}\n")).collect();
        let mut args = vec!["graph"];
        args.extend(cmd.split_whitespace());
        let r = run_fixture(home.path(), &args);
        assert_eq!(
            r.stdout, expected,
            "documented sample `voidbox graph {cmd}`"
        );
        samples += 1;
    }
    assert!(
        samples > 1,
        "a `$ voidbox graph` sample is missing from README.md or docs/cli.md"
    );
}

/// The Quick start for contributors (its ```sh block with the build line) leaves a `voidbox`
/// on PATH for every command after it: its build line is the one `scripts/test.sh` runs before the suite (so the binary is there),
/// and its other lines up to the first `voidbox` command, run by bash in the repository,
/// make `voidbox` resolve to that binary.
#[test]
fn the_quick_start_reaches_a_voidbox_command() {
    const BUILD: &str = "cargo build --release -p voidbox -p voidbox-vmm";
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README");
    let quick = readme
        .split("## Quick start")
        .nth(1)
        .and_then(|s| {
            s.split("```sh\n")
                .skip(1)
                .filter_map(|b| b.split("```").next())
                .find(|b| b.lines().any(|l| l == BUILD))
        })
        .expect("a ```sh block with the build line in the Quick start");
    assert!(
        quick
            .lines()
            .any(|l| l.trim_start().starts_with("voidbox apply examples/")),
        "the Quick start runs no `voidbox apply examples/…`:\n{quick}"
    );
    let setup: Vec<&str> = quick
        .lines()
        .take_while(|l| !l.trim_start().starts_with("voidbox "))
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .collect();
    assert!(
        setup.contains(&BUILD),
        "no `{BUILD}` before the first voidbox command"
    );
    let test_sh = std::fs::read_to_string(repo_root().join("scripts/test.sh")).expect("test.sh");
    assert!(
        test_sh.lines().any(|l| l.trim() == BUILD),
        "scripts/test.sh runs `{BUILD}`"
    );
    // (Running the build here would rebuild voidbox with other features than the suite's.)
    let rest: Vec<&str> = setup.into_iter().filter(|l| *l != BUILD).collect();
    let script = format!(
        "set -e\n{}\ncommand -v voidbox\nvoidbox --version\n",
        rest.join("\n")
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(repo_root())
        .output()
        .expect("bash");
    let r: Run = out.into();
    assert_eq!(r.code, Some(0), "{script}\n{}{}", r.stdout, r.stderr);
    let want = repo_root().join("target/release/voidbox");
    assert_eq!(
        r.stdout.lines().next().map(Path::new),
        Some(want.as_path()),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("voidbox 0."), "{}", r.stdout);
}

/// GitHub's anchor for a heading: lower case, every character but letters, digits, `-`, `_`
/// and spaces dropped, spaces turned into `-`.
fn github_slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings (outside code blocks), duplicates numbered as
/// GitHub numbers them (`x`, `x-1`, …).
fn markdown_anchors(text: &str) -> std::collections::HashSet<String> {
    let mut seen = std::collections::HashMap::<String, usize>::new();
    let mut fence = false;
    let mut anchors = std::collections::HashSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        let heading = line.trim_start_matches('#');
        if fence || heading.len() == line.len() || line.len() - heading.len() > 6 {
            continue;
        }
        let Some(heading) = heading.strip_prefix(' ') else {
            continue;
        };
        let slug = github_slug(heading);
        let n = seen.entry(slug.clone()).or_insert(0);
        anchors.insert(if *n == 0 { slug } else { format!("{slug}-{n}") });
        *n += 1;
    }
    anchors
}

/// Every relative link (`](path)`, `](path#anchor)`, `](#anchor)`) of the markdown files,
/// outside code blocks and code spans, that names no file, or no heading of a markdown file:
/// `FILE:LINE: TARGET: why`, FILE relative to `root`.
fn broken_links(root: &Path, files: &[std::path::PathBuf]) -> Vec<String> {
    let mut broken = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        let mut fence = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                fence = !fence;
                continue;
            }
            if fence {
                continue;
            }
            let prose: String = line.split('`').step_by(2).collect();
            for (at, _) in prose.match_indices("](") {
                let rest = &prose[at + 2..];
                let Some(target) = rest.split(')').next() else {
                    continue;
                };
                if target.is_empty()
                    || target.contains(char::is_whitespace)
                    || target.contains("://")
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
                let dest = if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().unwrap_or(root).join(path)
                };
                let why = if !dest.exists() {
                    Some("no such file")
                } else if !anchor.is_empty()
                    && dest.extension().is_some_and(|e| e == "md")
                    && !markdown_anchors(&std::fs::read_to_string(&dest).unwrap_or_default())
                        .contains(anchor)
                {
                    Some("no such heading")
                } else {
                    None
                };
                if let Some(why) = why {
                    broken.push(format!("{shown}:{}: {target}: {why}", n + 1));
                }
            }
        }
    }
    broken
}

/// Every markdown file under `dir`, recursively.
fn markdown_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            markdown_under(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// Every relative link and `#anchor` in README.md, CHANGELOG.md and docs/ resolves (GitHub's
/// heading anchors), and the check itself finds a missing file and a missing heading.
#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = repo_root();
    let mut files = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    markdown_under(&root.join("docs"), &mut files);
    assert!(files.len() > 5, "{files:?}");
    let broken = broken_links(&root, &files);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));

    let dir = tempfile::tempdir().expect("tempdir");
    write_file(
        dir.path(),
        "a.md",
        "# A\n## `voidbox lsp` — the editor\n[ok](#voidbox-lsp--the-editor) [ok](b.md#b-1)\n\
         [x](b.md#nope) `[code](gone.md)` [y](gone.md)\n```\n[z](gone.md)\n```\n",
    );
    write_file(dir.path(), "b.md", "# B\n# B\n");
    let files = [dir.path().join("a.md"), dir.path().join("b.md")];
    assert_eq!(
        broken_links(dir.path(), &files),
        [
            "a.md:4: b.md#nope: no such heading",
            "a.md:4: gone.md: no such file"
        ]
    );
}
