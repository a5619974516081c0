//! Edges of the CLI contract that need no VM (issue #23): a closed stdout, a misspelt flag
//! before `run`'s command, a `run.program` the guest image lacks, and terminal escapes in a
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

#[test]
fn run_program_missing_from_the_guest_image_is_invalid() {
    let home = tempfile::tempdir().expect("home");
    let dir = home.path();
    let spec = write_file(
        dir,
        "typo.yaml",
        "kind: sandbox\nname: typo\nrun:\n  program: ehco\n  args: [hi]\n",
    );
    let r = run_fixture(dir, &["validate", &spec]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("voidbox::program_not_found"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("typo.yaml:4:12"), "{}", r.stdout);
    assert!(r.stdout.contains("did you mean `echo`?"), "{}", r.stdout);
    let r = run_fixture(dir, &["validate", "--format", "json", &spec]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    let d = &doc["files"][0]["diagnostics"][0];
    assert_eq!(d["code"], "voidbox::program_not_found", "{d}");
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(4), Some(12))
    );
    // `--dry-run` refuses it before any VM (an invalid spec: exit 2).
    let r = run_fixture(dir, &["apply", "--dry-run", &spec]);
    assert_eq!(r.code, Some(2), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("voidbox::program_not_found"),
        "{}",
        r.stderr
    );
    // Not checked: absolute paths, programs of a `sandbox.image` (the OCI image has its own
    // PATH), and a box of a pipeline whose own image differs — but its sibling is.
    let fine = write_file(
        dir,
        "fine.yaml",
        "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: a\n      sandbox: {image: 'python:3.12'}\n      run: {program: python3}\n    - name: b\n      run: {program: /opt/tool}\n    - name: c\n      run: {program: awk}\n",
    );
    let r = run_fixture(dir, &["validate", &fine]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    let boxed = write_file(
        dir,
        "boxed.yaml",
        "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: a\n      sandbox: {image: 'python:3.12'}\n      run: {program: python3}\n    - name: b\n      run: {program: python3}\n",
    );
    let r = run_fixture(dir, &["validate", "--format", "github", &boxed]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert_eq!(r.stdout.lines().count(), 1, "{}", r.stdout);
    assert!(r.stdout.contains("line=9,col=22"), "{}", r.stdout);
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

/// The README's pre-commit snippet, run by the real `pre-commit` against this repository's
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
    // Every `$ voidbox graph …` sample in the README is the real output.
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README");
    let mut samples = 0;
    for block in readme.split("```text\n").skip(1) {
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
        assert_eq!(r.stdout, expected, "README sample `voidbox graph {cmd}`");
        samples += 1;
    }
    assert!(samples > 0, "no `$ voidbox graph` sample in the README");
}

/// The Quick start's first step leaves a `voidbox` on PATH for every command after it: its
/// build line is the one `scripts/test.sh` runs before the suite (so the binary is there),
/// and its other lines up to the first `voidbox` command, run by bash in the repository,
/// make `voidbox` resolve to that binary.
#[test]
fn the_quick_start_reaches_a_voidbox_command() {
    const BUILD: &str = "cargo build --release -p voidbox";
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README");
    let quick = readme
        .split("## Quick start")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("a ```sh block in the Quick start");
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
