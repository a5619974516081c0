//! End-to-end tests of `voidbox skills SPEC` through the built binary: the kit staged on
//! the host, a host secret the spec passes in redacted in the output and in `--out` files.

use std::path::Path;
use std::process::Command;

use voidbox_tests::Run;

const BIN: &str = env!("CARGO_BIN_EXE_voidbox-under-test");
/// The fake key the child process gets in its environment.
const FAKE_KEY: &str = "voidbox-fake-key-0123456789abcdef";

fn run(cwd: &Path, args: &[&str]) -> Run {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .env("VOIDBOX_TEST_FAKE_KEY", FAKE_KEY)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {BIN}: {e}"))
        .into()
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
}

/// A spec whose agent gets `VOIDBOX_TEST_FAKE_KEY` from the host (empty `env` value) and
/// names it as its provider key, with a `file:` skill directory and a plain markdown skill.
fn fixture() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    write(
        d.path(),
        "spec.yaml",
        "api_version: v1\nkind: agent\nname: kit\nllm: {provider: mock, api_key_env: VOIDBOX_TEST_FAKE_KEY}\n\
         sandbox:\n  env: {VOIDBOX_TEST_FAKE_KEY: \"\"}\n\
         agent:\n  prompt: hi\n  skills: [\"file:skills/deploy\", \"file:notes.md\"]\n  prompt_files: [AGENTS.md, docs/style.md]\n",
    );
    write(
        d.path(),
        "AGENTS.md",
        &format!("# Rules\nNever print {FAKE_KEY}.\n"),
    );
    write(d.path(), "docs/style.md", "Write short sentences.\n");
    write(
        d.path(),
        "skills/deploy/SKILL.md",
        &format!("---\nname: deploy\ndescription: deploys\n---\nUse key {FAKE_KEY}.\n"),
    );
    write(
        d.path(),
        "skills/deploy/scripts/run.sh",
        &format!("#!/bin/sh\nexport KEY={FAKE_KEY}\nexport GH=ghp_abcdefghijklmnopqrstuvwxyz0123456789\n"),
    );
    write(
        d.path(),
        "skills/deploy/references/api.md",
        "no secrets here\n",
    );
    write(d.path(), "notes.md", "# Notes\nTake notes.\n");
    d
}

#[test]
fn skills_json_reports_redactions_and_out_holds_the_redacted_kit() {
    let d = fixture();
    let out = d.path().join("kit-out");
    let r = run(
        d.path(),
        &[
            "skills",
            "spec.yaml",
            "--output",
            "json",
            "--out",
            out.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON");
    let node = &doc["nodes"][0];
    assert_eq!(node["name"], "kit");
    assert_eq!(
        node["skills"],
        serde_json::json!([
            {"name": "deploy", "files": 3, "bytes": node["skills"][0]["bytes"], "redactions": 3, "binary_files": 0},
            {"name": "notes", "files": 1, "bytes": node["skills"][1]["bytes"], "redactions": 0, "binary_files": 0},
        ]),
        "{}",
        r.stdout
    );
    // The prompt files become the runtime's instructions file (the mock runtime reads
    // Claude Code's layout), in order, redacted.
    assert_eq!(
        node["instructions"],
        serde_json::json!({"path": "/home/sandbox/.claude/CLAUDE.md", "sources": ["AGENTS.md", "style.md"], "bytes": node["instructions"]["bytes"], "redactions": 1}),
        "{}",
        r.stdout
    );
    let kit = out.join("kit");
    assert_eq!(node["dir"], kit.display().to_string());
    // The key appears nowhere: not in the output, not in any staged file.
    assert!(!r.stdout.contains(FAKE_KEY));
    let host_dir = d.path().display().to_string();
    let manifest = node["manifest"].to_string();
    assert!(!manifest.contains(&host_dir), "{manifest}");
    let mut files = Vec::new();
    for e in walk(&kit) {
        let text = std::fs::read_to_string(&e).expect("read");
        assert!(!text.contains(FAKE_KEY), "{}: {text}", e.display());
        files.push(e.strip_prefix(&kit).expect("inside").display().to_string());
    }
    files.sort();
    assert_eq!(
        files,
        [
            "CLAUDE.md",
            "manifest.json",
            "skills/deploy/SKILL.md",
            "skills/deploy/references/api.md",
            "skills/deploy/scripts/run.sh",
            "skills/notes/SKILL.md",
        ]
    );
    assert_eq!(
        std::fs::read_to_string(kit.join("skills/deploy/scripts/run.sh")).expect("read"),
        "#!/bin/sh\nexport KEY=[REDACTED]\nexport GH=[REDACTED]\n"
    );
    assert_eq!(
        std::fs::read_to_string(kit.join("CLAUDE.md")).expect("read"),
        "# Rules\nNever print [REDACTED].\n\nWrite short sentences.\n"
    );
    assert!(std::fs::read_to_string(kit.join("skills/notes/SKILL.md"))
        .expect("read")
        .starts_with("---\nname: \"notes\"\ndescription: \"Take notes.\"\n---\n"));
    let on_disk: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(kit.join("manifest.json")).expect("read"))
            .expect("manifest JSON");
    assert_eq!(on_disk, node["manifest"]);

    // A non-empty --out is refused and left as it was.
    let again = run(
        d.path(),
        &["skills", "spec.yaml", "--out", out.to_str().expect("utf-8")],
    );
    assert_eq!(again.code, Some(2), "{}", again.stderr);
    assert!(
        again.stderr.contains("exists and is not empty"),
        "{}",
        again.stderr
    );
}

#[test]
fn skills_text_lists_each_skill() {
    let d = fixture();
    let r = run(d.path(), &["skills", "spec.yaml"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.starts_with("kit:\n  deploy: 3 files, "),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(", 3 redactions\n  notes: 1 file, "),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("  /home/sandbox/.claude/CLAUDE.md (from AGENTS.md, style.md): "),
        "{}",
        r.stdout
    );
}

/// Each runtime gets its own layout: Claude Code `~/.claude/CLAUDE.md`, Codex
/// `~/.codex/AGENTS.md` (and its skills under `~/.codex/skills`); no key is needed to stage.
#[test]
fn prompt_files_land_where_each_runtime_reads_instructions() {
    let d = fixture();
    write(
        d.path(),
        "two.yaml",
        "api_version: v1\nkind: pipeline\nname: two\npipeline:\n  boxes:\n\
         \x20   - {name: c, prompt: hi, llm: {provider: claude}, prompt_files: [AGENTS.md], skills: [\"file:notes.md\"]}\n\
         \x20   - {name: x, prompt: hi, llm: {provider: codex}, prompt_files: [AGENTS.md], skills: [\"file:notes.md\"]}\n",
    );
    let r = Command::new(BIN)
        .args(["skills", "two.yaml", "--output", "json"])
        .current_dir(d.path())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("VOIDBOX_LLM_PROVIDER")
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert_eq!(
        r.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let guest = |node: usize, path: &str| {
        doc["nodes"][node]["manifest"]["files"]
            .as_array()
            .expect("files")
            .iter()
            .find(|f| f["path"] == path)
            .map(|f| f["guest"].clone())
    };
    assert_eq!(
        doc["nodes"][0]["instructions"]["path"],
        "/home/sandbox/.claude/CLAUDE.md"
    );
    assert_eq!(
        doc["nodes"][1]["instructions"]["path"],
        "/home/sandbox/.codex/AGENTS.md"
    );
    assert_eq!(
        guest(1, "skills/notes/SKILL.md"),
        Some("/home/sandbox/.codex/skills/notes/SKILL.md".into())
    );
    assert_eq!(
        guest(1, "AGENTS.md"),
        Some("/home/sandbox/.codex/AGENTS.md".into())
    );
    assert_eq!(
        guest(0, "CLAUDE.md"),
        Some("/home/sandbox/.claude/CLAUDE.md".into())
    );
}

/// `validate` checks prompt files: a missing one, and one on a command box, are errors at
/// their line.
#[test]
fn validate_locates_bad_prompt_files() {
    let d = fixture();
    write(
        d.path(),
        "bad.yaml",
        "api_version: v1\nkind: pipeline\nname: p\nllm: {provider: mock}\npipeline:\n  boxes:\n\
         \x20   - name: a\n      prompt: hi\n      prompt_files: [AGENTS.md, nope.md]\n\
         \x20   - name: b\n      run: {program: echo}\n      prompt_files: [AGENTS.md]\n",
    );
    let r = run(d.path(), &["validate", "bad.yaml"]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    let all = format!("{}{}", r.stdout, r.stderr);
    assert!(
        all.contains("bad.yaml:9:33: prompt file `nope.md` not found"),
        "{all}"
    );
    assert!(
        all.contains("bad.yaml:12:7: `prompt_files` on command box `b`"),
        "{all}"
    );
}

#[test]
fn an_invalid_spec_exits_like_validate_and_a_kit_error_exits_3_naming_node_and_skill() {
    let d = fixture();
    write(
        d.path(),
        "bad.yaml",
        "api_version: v1\nkind: agent\nname: x\n",
    );
    let r = run(d.path(), &["skills", "bad.yaml"]);
    let v = run(d.path(), &["validate", "bad.yaml"]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_eq!(r.code, v.code);
    assert!(r.stderr.contains("bad.yaml:"), "{}", r.stderr);

    write(
        d.path(),
        "leak.yaml",
        "api_version: v1\nkind: pipeline\nname: p\nllm: {provider: mock}\npipeline:\n  boxes:\n    - {name: writer, prompt: hi, skills: [\"file:leaky-skill\"]}\n",
    );
    write(
        d.path(),
        "leaky-skill/SKILL.md",
        "---\nname: leaky-skill\ndescription: leaks\n---\n",
    );
    std::os::unix::fs::symlink("../spec.yaml", d.path().join("leaky-skill/leak.md"))
        .expect("symlink");
    let r = run(d.path(), &["skills", "leak.yaml"]);
    assert_eq!(r.code, Some(3), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("agent box `writer`: skill `file:leaky-skill`: ")
            && r.stderr
                .contains("`leak.md` is a symlink out of the skill directory"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stdout, "");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
