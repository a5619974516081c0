//! End-to-end tests of `voidbox validate`, `graph` and `schema` through the built binary,
//! including hostile input: huge files, alias bombs, binary garbage, FIFOs, directories.

use std::time::{Duration, Instant};

use voidbox_tests::{repo_root, run_in, write_file as write, Run};

const BIN: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

fn run(args: &[&str]) -> Run {
    run_in(BIN, &repo_root(), args)
}

const VALID: &str = "api_version: v1\nkind: sandbox\nname: ok\nrun: {program: echo}\n";

#[test]
fn schema_file_is_up_to_date() {
    let r = run(&["schema"]);
    assert_eq!(r.code, Some(0));
    let checked_in = std::fs::read_to_string(repo_root().join("schemas/voidbox.schema.json"))
        .expect("schemas/voidbox.schema.json");
    assert!(
        r.stdout == checked_in,
        "schemas/voidbox.schema.json is stale: regenerate it with\n  cargo run -p voidbox -- schema > schemas/voidbox.schema.json"
    );
    let schema: serde_json::Value = serde_json::from_str(&r.stdout).expect("schema is JSON");
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert!(schema["properties"]["kind"]["description"].is_string());
}

#[test]
fn examples_validate_and_have_the_schema_modeline() {
    let dir = repo_root().join("examples");
    let r = run_in(BIN, &dir, &["validate", "."]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    for entry in std::fs::read_dir(&dir).expect("examples") {
        let p = entry.expect("entry").path();
        if p.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&p).expect("read");
            assert!(
                text.starts_with("# yaml-language-server: $schema=../schemas/voidbox.schema.json"),
                "{} lacks the yaml-language-server modeline",
                p.display()
            );
        }
    }
}

#[test]
fn github_format_emits_annotations() {
    let r = run(&[
        "validate",
        "--format",
        "github",
        "specs/invalid/unknown-field.yaml",
    ]);
    assert_eq!(r.code, Some(1));
    assert_eq!(
        r.stdout.trim_end(),
        "::error file=specs/invalid/unknown-field.yaml,line=8,col=7,title=voidbox%3A%3Aunknown_field::unknown field `timeout_sec` in `pipeline.boxes[0]` [voidbox::unknown_field] help: did you mean `timeout_secs`?"
    );
}

#[test]
fn human_format_shows_snippet_and_help() {
    let r = run(&["validate", "specs/invalid/unknown-field.yaml"]);
    assert_eq!(r.code, Some(1));
    assert!(
        r.stdout.contains("specs/invalid/unknown-field.yaml:8:7"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("timeout_sec: 30"), "{}", r.stdout);
    assert!(
        r.stdout.contains("did you mean `timeout_secs`?"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("1 of 1 spec file invalid: 1 error"),
        "{}",
        r.stdout
    );
}

#[test]
fn usage_and_io_errors_exit_2() {
    assert_eq!(run(&["validate", "no/such/file.yaml"]).code, Some(2));
    assert_eq!(
        run(&["validate", "--format", "xml", "examples"]).code,
        Some(2)
    );
    assert_eq!(run(&["frobnicate"]).code, Some(2));
    let r = run(&["graph", "examples"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("is a directory"), "{}", r.stderr);
    let tmp = tempfile::tempdir().expect("tmp");
    let r = run_in(BIN, tmp.path(), &["validate", "."]);
    assert_eq!(r.code, Some(2));
    assert!(
        r.stderr.contains("no *.yaml or *.yml spec files found"),
        "{}",
        r.stderr
    );
}

#[test]
fn fifo_and_dangling_symlink_do_not_hang() {
    let tmp = tempfile::tempdir().expect("tmp");
    let fifo = tmp.path().join("pipe.yaml");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(status.success());
    std::os::unix::fs::symlink(tmp.path().join("missing"), tmp.path().join("link.yaml"))
        .expect("symlink");
    let start = Instant::now();
    let r = run_in(BIN, tmp.path(), &["validate", "pipe.yaml"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("not a regular file"), "{}", r.stderr);
    let r = run_in(BIN, tmp.path(), &["validate", "link.yaml"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn ten_megabyte_spec_is_refused_quickly() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut big = String::from("kind: sandbox\nname: big\nrun:\n  program: echo\n  args:\n");
    while big.len() < 10 * 1024 * 1024 {
        big.push_str("    - \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"\n");
    }
    let p = write(tmp.path(), "big.yaml", &big);
    let start = Instant::now();
    let r = run(&["validate", "--format", "json", &p]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stdout.contains("voidbox::too_large"), "{}", r.stdout);
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn directory_of_a_thousand_specs() {
    let tmp = tempfile::tempdir().expect("tmp");
    for i in 0..1000 {
        let text = if i % 10 == 0 {
            format!("kind: sandbox\nname: s{i}\nsandbox: {{memory_mb: 1}}\n")
        } else {
            VALID.replace("name: ok", &format!("name: s{i}"))
        };
        write(tmp.path(), &format!("s{i:04}.yaml"), &text);
    }
    let r = run_in(BIN, tmp.path(), &["validate", "--format", "json", "."]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(doc["summary"]["files"], 1000);
    assert_eq!(doc["summary"]["invalid"], 100);
    // Deterministic order: files are sorted.
    assert_eq!(doc["files"][0]["path"], "./s0000.yaml");
    assert_eq!(doc["files"][999]["path"], "./s0999.yaml");
}

#[test]
fn graph_formats_are_deterministic_and_well_formed() {
    for format in ["text", "dot", "mermaid"] {
        let a = run(&["graph", "examples/fan-out.yaml", "--format", format]);
        let b = run(&["graph", "examples/fan-out.yaml", "--format", format]);
        assert_eq!(a.code, Some(0), "{}", a.stderr);
        assert_eq!(a.stdout, b.stdout, "{format} output is not deterministic");
    }
    let text = run(&["graph", "examples/fan-out.yaml"]).stdout;
    assert!(text.contains("level 2 — fan_out"), "{text}");
    assert!(text.contains("← [words, upper, lines]"), "{text}");
    let mermaid = run(&["graph", "examples/workflow.yaml", "--format", "mermaid"]).stdout;
    assert!(mermaid.contains("n0 -->|\"stdin\"| n1"), "{mermaid}");
    let r = run(&["graph", "specs/invalid/cycle.yaml"]);
    assert_eq!(r.code, Some(1));
    assert!(
        r.stderr.contains("dependency cycle: a → c → b → a"),
        "{}",
        r.stderr
    );
}

#[test]
fn dot_output_renders_with_graphviz() {
    let dot = run(&["graph", "examples/fan-out.yaml", "--format", "dot"]).stdout;
    let mut child = std::process::Command::new("dot")
        .arg("-Tsvg")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("Graphviz `dot` is required for this test (apt-get install graphviz; the README's test command installs it)");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(dot.as_bytes()).expect("write dot");
    }
    let out = child.wait_with_output().expect("dot");
    assert!(
        out.status.success(),
        "dot rejected the output: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = String::from_utf8_lossy(&out.stdout);
    assert!(svg.contains("<svg") && svg.contains("collect"), "{svg}");
}

#[test]
fn apply_dry_run_and_mock_mode() {
    let r = run(&["apply", "--dry-run", "examples/fan-out.yaml"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.starts_with("pipeline `text-stats`"),
        "{}",
        r.stdout
    );
    let r = run(&["apply", "specs/valid/mock-mode.yaml"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("--dry-run"), "{}", r.stderr);
    let r = run(&["apply", "specs/invalid/cycle.yaml"]);
    assert_eq!(r.code, Some(2));
}

#[test]
fn snapshot_ls_and_rm_on_a_cache_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().to_str().expect("utf-8 path");
    let r = run(&["snapshot", "ls", "--cache-dir", cache, "--format", "json"]);
    assert_eq!((r.code, r.stdout.trim()), (Some(0), "[]"), "{}", r.stderr);
    let r = run(&["snapshot", "ls", "--cache-dir", cache]);
    assert_eq!(r.code, Some(0));
    assert!(r.stderr.contains("no snapshots"), "{}", r.stderr);
    // A typo removes nothing and says why.
    let r = run(&["snapshot", "rm", "--cache-dir", cache, "abc123"]);
    assert_eq!(r.code, Some(2));
    assert!(
        r.stderr.contains("no cached snapshot matches abc123"),
        "{}",
        r.stderr
    );
    let r = run(&["snapshot", "rm", "--cache-dir", cache, "not-hex"]);
    assert_eq!(r.code, Some(2));
    assert!(
        r.stderr.contains("not a snapshot key prefix"),
        "{}",
        r.stderr
    );
    // Two entries of one size and image that boot different things (one with the runtimes
    // disk, one with a network device) are told apart by `NET` and `BOOTS`.
    for (key, image_key, network) in [
        ("1".repeat(64), "a".repeat(64), false),
        ("2".repeat(64), "b".repeat(64), true),
    ] {
        let d = dir.path().join(&key);
        std::fs::create_dir(&d).expect("mkdir");
        for f in ["state.snap", "memory.bin", "secret"] {
            std::fs::write(d.join(f), b"x").expect("write");
        }
        let meta = serde_json::json!({
            "key": key, "image_hash": "c".repeat(64), "image_key": image_key,
            "extra_cmdline": [], "network": network, "memory_mb": 256, "vcpus": 1,
            "created_unix": 1, "voidbox_version": "0.1.0", "boot_ms": 1, "snapshot_ms": 1,
            "pause_us": 1, "state_bytes": 1,
        });
        std::fs::write(d.join("meta.json"), meta.to_string()).expect("meta");
    }
    let r = run(&["snapshot", "ls", "--cache-dir", cache]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let header = r.stdout.lines().next().unwrap_or_default();
    assert!(
        header.contains(" NET ") && header.contains(" BOOTS "),
        "{}",
        r.stdout
    );
    let row = |key: char| {
        r.stdout
            .lines()
            .find(|l| l.starts_with(&key.to_string().repeat(12)))
            .unwrap_or_else(|| panic!("no row for {key}: {}", r.stdout))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(row('1')[3..5], ["-", "cccccccccccc"]);
    assert_eq!(row('1')[5], "aaaaaaaaaaaa");
    assert_eq!(row('2')[3], "yes");
    assert_eq!(row('2')[5], "bbbbbbbbbbbb");
    let r = run(&["snapshot", "ls", "--cache-dir", cache, "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(doc.as_array().map(Vec::len), Some(2), "{doc}");
    assert!(doc[0]["image_key"].as_str().is_some_and(|k| k.len() == 64));
    // An unreadable entry is listed as a warning, and `rm --all` clears it.
    let broken = dir.path().join("a".repeat(64));
    std::fs::create_dir(&broken).expect("mkdir");
    let r = run(&["snapshot", "ls", "--cache-dir", cache]);
    assert!(
        r.stderr.contains("warning") && r.stderr.contains("meta.json"),
        "{}",
        r.stderr
    );
    let r = run(&["snapshot", "rm", "--cache-dir", cache, "--all"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(!broken.exists());
    // Usage errors exit 2.
    let r = run(&["snapshot", "create", "--memory-mb", "1"]);
    assert_eq!(r.code, Some(2));
}

/// Writes a fake snapshot entry `key` into `cache` (a diff over `base` when given).
fn fake_snapshot(cache: &std::path::Path, key: &str, base: Option<&str>) {
    let d = cache.join(key);
    std::fs::create_dir(&d).expect("mkdir");
    let memory = if base.is_some() {
        "memory.diff"
    } else {
        "memory.bin"
    };
    for f in ["state.snap", memory, "secret"] {
        std::fs::write(d.join(f), b"x").expect("write");
    }
    let mut meta = serde_json::json!({
        "key": key, "image_hash": "c".repeat(64), "image_key": "a".repeat(64),
        "extra_cmdline": [], "memory_mb": 1024, "vcpus": 1,
        "created_unix": 1, "voidbox_version": "0.1.0", "boot_ms": 1, "snapshot_ms": 1,
        "pause_us": 1, "state_bytes": 1,
    });
    if let Some(b) = base {
        meta["base"] = b.into();
        meta["warm"] = serde_json::json!({
            "runtime": "claude-code", "provider": "anthropic", "model": "sonnet",
            "kit_hash": "k", "settle_ms": 900, "diff_bytes": 1,
        });
    }
    std::fs::write(d.join("meta.json"), meta.to_string()).expect("meta");
}

#[test]
fn snapshot_ls_shows_layers_and_rm_keeps_a_base_with_its_diffs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().to_str().expect("utf-8 path");
    let (base, diff, other) = ("1".repeat(64), "2".repeat(64), "3".repeat(64));
    fake_snapshot(dir.path(), &base, None);
    fake_snapshot(dir.path(), &diff, Some(&base));
    fake_snapshot(dir.path(), &other, None);
    // The diff is listed right under its base, indented, with its runtime and model.
    let r = run(&["snapshot", "ls", "--cache-dir", cache]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[0].ends_with("KIND"), "{}", r.stdout);
    let at = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row {prefix}: {}", r.stdout))
    };
    let b = at(&base[..12]);
    assert_eq!(at(&format!("└ {}", &diff[..12])), b + 1, "{}", r.stdout);
    assert!(lines[b].ends_with("golden"), "{}", r.stdout);
    assert!(
        lines[b + 1].ends_with("warm claude-code sonnet"),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr.contains("3 snapshot(s) (1 diff(s)"),
        "{}",
        r.stderr
    );
    let r = run(&["snapshot", "ls", "--cache-dir", cache, "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    let entry = |k: &str| {
        doc.as_array()
            .and_then(|a| a.iter().find(|e| e["key"] == k))
            .cloned()
            .unwrap_or_else(|| panic!("no {k} in {doc}"))
    };
    assert_eq!(entry(&diff)["base"], base.as_str());
    assert_eq!(entry(&diff)["warm"]["runtime"], "claude-code");
    assert_eq!(entry(&diff)["kind"], "warm claude-code sonnet");
    assert!(entry(&base)["base"].is_null() && entry(&base)["warm"].is_null());
    // A base that a diff needs is refused, removing nothing (not even the other key).
    let r = run(&["snapshot", "rm", "--cache-dir", cache, "333", "111"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr
            .contains(&format!("base of 1 diff snapshot(s) ({})", &diff[..12]))
            && r.stderr.contains("--with-dependents"),
        "{}",
        r.stderr
    );
    for k in [&base, &diff, &other] {
        assert!(dir.path().join(k).exists());
    }
    // With the flag both go, the diff first; the other stays.
    let r = run(&[
        "snapshot",
        "rm",
        "--cache-dir",
        cache,
        "--with-dependents",
        "111",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(
        r.stderr.lines().collect::<Vec<_>>(),
        [format!("removed {diff}"), format!("removed {base}")],
    );
    assert!(!dir.path().join(&base).exists() && !dir.path().join(&diff).exists());
    assert!(dir.path().join(&other).exists());
    // Named together, a base and its diff go without the flag.
    fake_snapshot(dir.path(), &base, None);
    fake_snapshot(dir.path(), &diff, Some(&base));
    let r = run(&["snapshot", "rm", "--cache-dir", cache, "111", "222"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(!dir.path().join(&base).exists() && !dir.path().join(&diff).exists());
}
