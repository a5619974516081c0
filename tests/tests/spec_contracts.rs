//! Spec contracts checked through the built binary, without VMs: names never become paths,
//! void-box specs run as written (working-directory paths), one set of limits in `validate`,
//! `run` and `snapshot create`, and timeouts that are refused rather than clamped.

use std::path::Path;

use voidbox_tests::{write_file as write, Run};

const BIN: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

/// Runs the binary in `cwd` with an empty cache (no guest image, no snapshots).
fn run(cwd: &Path, args: &[&str]) -> Run {
    let cache = tempfile::tempdir().expect("cache dir");
    std::process::Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .env("XDG_CACHE_HOME", cache.path())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {BIN}: {e}"))
        .into()
}

/// `(severity, code, line, column, message)` of each diagnostic of a `--format json` run.
fn diagnostics(r: &Run) -> Vec<(String, String, u64, u64, String)> {
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON report");
    doc["files"][0]["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .map(|d| {
            (
                d["severity"].as_str().unwrap_or_default().to_string(),
                d["code"].as_str().unwrap_or_default().to_string(),
                d["line"].as_u64().unwrap_or_default(),
                d["column"].as_u64().unwrap_or_default(),
                d["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn hostile_names_are_refused_where_they_are_written() {
    let dir = tempfile::tempdir().expect("tmp");
    write(
        dir.path(),
        "p.yaml",
        "kind: pipeline\nname: \"../../x\"\npipeline:\n  boxes:\n    - name: \"a/b\"\n      run: {program: echo}\n    - name: \"ctl\\x01\"\n      run: {program: echo}\n",
    );
    let r = run(dir.path(), &["validate", "p.yaml"]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    for at in ["p.yaml:2:7", "p.yaml:5:13", "p.yaml:7:13"] {
        assert!(r.stdout.contains(at), "{at} missing:\n{}", r.stdout);
    }
    assert!(r.stdout.contains("voidbox::bad_name"), "{}", r.stdout);
    assert!(
        r.stdout.contains("spec name \"../../x\" contains `/`"),
        "{}",
        r.stdout
    );
    // `apply` refuses it as an invalid spec and creates nothing anywhere.
    let logs = dir.path().join("logs");
    let r = run(
        dir.path(),
        &["apply", "p.yaml", "--logs-dir", &logs.to_string_lossy()],
    );
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(!logs.exists());
    let entries: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert_eq!(entries, ["p.yaml"]);
}

#[test]
fn an_over_range_timeout_is_refused_not_clamped() {
    let dir = tempfile::tempdir().expect("tmp");
    write(
        dir.path(),
        "t.yaml",
        "kind: workflow\nname: w\nworkflow:\n  steps:\n    - name: a\n      run: {program: sleep, args: [\"5000\"]}\n      timeout_secs: 5000\n    - name: b\n      run: {program: echo}\n      timeout_secs: 86401\n",
    );
    let r = run(dir.path(), &["validate", "t.yaml"]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("t.yaml:10:21"), "{}", r.stdout);
    assert!(
        r.stdout
            .contains("`workflow.steps[1].timeout_secs` is `86401`, outside 1..=86400"),
        "{}",
        r.stdout
    );
    // 5000 s (above the guest's old 3600 s clamp) is honoured: only one error.
    let json = run(dir.path(), &["validate", "--format", "json", "t.yaml"]);
    assert_eq!(diagnostics(&json).len(), 1, "{}", json.stdout);
}

#[test]
fn apply_help_documents_the_default_node_timeout() {
    let r = run(Path::new("."), &["apply", "--help"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("default node timeout, 1800 s"),
        "{}",
        r.stdout
    );
}

#[test]
fn void_box_paths_relative_to_the_working_directory_are_accepted_with_a_warning() {
    // void-box layout: paths written relative to the directory `voidbox` runs in, the spec
    // one level down.
    let proj = tempfile::tempdir().expect("tmp");
    let root = proj.path().canonicalize().expect("canonical");
    std::fs::create_dir_all(root.join("skills")).expect("mkdir");
    std::fs::create_dir_all(root.join("specs")).expect("mkdir");
    std::fs::create_dir_all(root.join("data")).expect("mkdir");
    write(&root, "skills/review.md", "# Review\nBe thorough.\n");
    write(
        &root,
        "specs/agent.yaml",
        "kind: agent\nname: reviewer\nllm: {provider: mock}\nsandbox:\n  mounts:\n    - {host: ./data, guest: /data}\n    - {host: ./out, guest: /out, mode: rw}\nagent:\n  prompt: Review it.\n  skills: [\"file:skills/review.md\"]\n",
    );
    let r = run(&root, &["validate", "--format", "json", "specs/agent.yaml"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    let d = diagnostics(&r);
    let at = |code: &str| {
        d.iter()
            .filter(|x| x.0 == "warning" && x.1 == code)
            .map(|x| (x.2, x.3, x.4.clone()))
            .collect::<Vec<_>>()
    };
    let cwd = at("voidbox::cwd_relative_path");
    assert_eq!(cwd.len(), 2, "{d:?}");
    assert_eq!((cwd[0].0, cwd[0].1), (6, 14), "{d:?}");
    assert_eq!((cwd[1].0, cwd[1].1), (10, 12), "{d:?}");
    let skill = &cwd[1].2;
    assert!(
        skill.contains(&root.join("specs/skills/review.md").display().to_string())
            && skill.contains(&root.join("skills/review.md").display().to_string()),
        "{skill}"
    );
    let created = at("voidbox::mount_created");
    assert_eq!(created.len(), 1, "{d:?}");
    assert_eq!((created[0].0, created[0].1), (7, 14), "{d:?}");
    assert!(d.iter().all(|x| x.0 == "warning"), "{d:?}");

    // From another directory the paths are missing: errors, not warnings.
    let elsewhere = tempfile::tempdir().expect("tmp");
    let spec = root.join("specs/agent.yaml");
    let r = run(elsewhere.path(), &["validate", &spec.to_string_lossy()]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(
        r.stdout.contains("voidbox::skill_not_found"),
        "{}",
        r.stdout
    );

    // The plan uses the path validate found: `apply --dry-run` accepts the skill.
    write(
        &root,
        "specs/skill-only.yaml",
        "kind: agent\nname: reviewer\nllm: {provider: mock}\nagent:\n  prompt: Review it.\n  skills: [\"file:skills/review.md\"]\n",
    );
    let r = run(&root, &["apply", "--dry-run", "specs/skill-only.yaml"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("voidbox::cwd_relative_path"),
        "{}",
        r.stderr
    );
}

#[test]
fn credential_proxy_is_accepted_by_validate_and_apply() {
    // void-box's opt-in `credential_proxy` is how every real runtime works here (the
    // credential gateway), so `true` and `false` are both carried out, never refused.
    let dir = tempfile::tempdir().expect("tmp");
    for v in ["true", "false"] {
        write(
            dir.path(),
            "a.yaml",
            &format!("kind: agent\nname: a\nllm:\n  provider: mock\n  credential_proxy: {v}\nagent: {{prompt: hi}}\n"),
        );
        let r = run(dir.path(), &["validate", "a.yaml"]);
        assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
        let r = run(dir.path(), &["apply", "--dry-run", "a.yaml"]);
        assert_eq!(r.code, Some(0), "{v}: {}", r.stderr);
        assert!(!r.stderr.contains("credential_proxy"), "{}", r.stderr);
    }
}

#[test]
fn run_and_snapshot_create_use_the_spec_limits_and_one_default() {
    let dir = tempfile::tempdir().expect("tmp");
    write(
        dir.path(),
        "big.yaml",
        "kind: sandbox\nname: big\nsandbox: {memory_mb: 70000, vcpus: 33}\nrun: {program: echo}\n",
    );
    let v = run(dir.path(), &["validate", "big.yaml"]);
    assert_eq!(v.code, Some(1), "{}", v.stdout);
    assert!(v.stdout.contains("outside 64..=65536"), "{}", v.stdout);
    assert!(v.stdout.contains("outside 1..=32"), "{}", v.stdout);
    for cmd in [
        &["run", "--memory-mb", "70000", "--", "true"][..],
        &["snapshot", "create", "--memory-mb", "70000"],
    ] {
        let r = run(dir.path(), cmd);
        assert_eq!(r.code, Some(2), "{cmd:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("70000 is not in 64..=65536"),
            "{cmd:?}: {}",
            r.stderr
        );
    }
    for cmd in [
        &["run", "--vcpus", "33", "--", "true"][..],
        &["snapshot", "create", "--vcpus", "33"],
    ] {
        let r = run(dir.path(), cmd);
        assert_eq!(r.code, Some(2), "{cmd:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("33 is not in 1..=32"),
            "{cmd:?}: {}",
            r.stderr
        );
    }
    let r = run(dir.path(), &["run", "--timeout", "86401", "--", "true"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr.contains("86401 is not in 1..=86400"),
        "{}",
        r.stderr
    );
    // One default size: the snapshot `create` makes is the one `run` restores.
    for cmd in [&["run", "--help"][..], &["snapshot", "create", "--help"]] {
        let r = run(dir.path(), cmd);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        let mem = r
            .stdout
            .split("--memory-mb")
            .nth(1)
            .and_then(|s| s.split("--").next())
            .unwrap_or_default();
        assert!(mem.contains("[default: 256]"), "{cmd:?}: {mem}");
    }
}

/// Where docs/spec.md states a default: in the `default` column of the table under a heading
/// (the row whose first cell names the field), or in a phrase, `{}` standing for the value.
enum Stated {
    Row(&'static str),
    Phrase(&'static str),
    /// An object default: each of its fields is the default of that field in this table.
    Fields(&'static str),
}

/// Every default docs/spec.md states, by schema object (`#` for the top level, else a
/// `$defs` name) and field. Each field with a `default` in the schema must be here.
const STATED: &[(&str, &str, Stated)] = &[
    ("#", "api_version", Stated::Row("Top level")),
    ("#", "on_failure", Stated::Row("Top level")),
    ("#", "timeout_secs", Stated::Row("Top level")),
    ("#", "sandbox", Stated::Fields("sandbox")),
    ("Sandbox", "mode", Stated::Row("sandbox")),
    ("Sandbox", "memory_mb", Stated::Row("sandbox")),
    ("Sandbox", "vcpus", Stated::Row("sandbox")),
    ("Sandbox", "network", Stated::Row("sandbox")),
    ("NetworkPolicy", "max_connections", Stated::Row("Network")),
    (
        "NetworkPolicy",
        "connections_per_second",
        Stated::Row("Network"),
    ),
    ("ResourceLimits", "nofile", Stated::Row("Guest policy")),
    ("ResourceLimits", "nproc", Stated::Row("Guest policy")),
    ("ResourceLimits", "fsize_mb", Stated::Row("Guest policy")),
    (
        "ResourceLimits",
        "address_space_mb",
        Stated::Row("Guest policy"),
    ),
    (
        "Mount",
        "mode",
        Stated::Phrase("a mount `mode` defaults to `{}`"),
    ),
    (
        "Agent",
        "mode",
        Stated::Phrase("`mode: task|service|interactive` (default `{}`"),
    ),
    (
        "OciSkill",
        "readonly",
        Stated::Phrase("`readonly` default `{}`"),
    ),
    (
        "Messaging",
        "enabled",
        Stated::Phrase("(`enabled` default `{}`)"),
    ),
    (
        "BoxOutput",
        "guest",
        Stated::Phrase("`outputs: [{name, guest}]` (`guest` defaults to `{}`)"),
    ),
    (
        "BoxInput",
        "guest",
        Stated::Phrase("`inputs: [{from, guest}]` (`guest` defaults to `{}`)"),
    ),
    (
        "Agent",
        "timeout_secs",
        Stated::Phrase("**default node timeout, {} s**"),
    ),
    (
        "PipelineBox",
        "timeout_secs",
        Stated::Phrase("**default node timeout, {} s**"),
    ),
    (
        "Step",
        "timeout_secs",
        Stated::Phrase("**default node timeout, {} s**"),
    ),
    (
        "PipelineBox",
        "ready_timeout_secs",
        Stated::Phrase("`ready_timeout_secs` (1..=86400, default {} s)"),
    ),
    (
        "Step",
        "ready_timeout_secs",
        Stated::Phrase("`ready_timeout_secs` (1..=86400, default {} s)"),
    ),
];

/// A schema field's default as the docs write it: its `default` keyword (a string unquoted),
/// else the one its description states (`none by default`, `Default: unlimited`, or the first
/// number after "default").
fn schema_default(field: &serde_json::Value) -> Option<String> {
    if let Some(d) = field.get("default") {
        return Some(d.as_str().map_or_else(|| d.to_string(), str::to_string));
    }
    let desc = field["description"].as_str()?.replace('\n', " ");
    if desc.contains("none by default") {
        return Some("none".into());
    }
    let after = &desc[desc.find("default").or_else(|| desc.find("Default"))?..];
    if after.split_whitespace().nth(1) == Some("unlimited") {
        return Some("unlimited".into());
    }
    let number: String = after
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    (!number.is_empty()).then_some(number)
}

/// The `default` cell of each row of the tables under each heading of a markdown text:
/// `(heading, field, default)`, the field each name in backticks in the row's first cell, the
/// default the cell's first word without backticks.
fn table_defaults(doc: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let (mut heading, mut column, mut fence) = (String::new(), None, false);
    for line in doc.lines() {
        let line = line.trim();
        if line.starts_with("```") {
            fence = !fence;
        }
        if fence {
            continue;
        }
        if let Some(h) = line.strip_prefix('#') {
            heading = h.trim_start_matches('#').trim().to_string();
            column = None;
        }
        if !line.starts_with('|') {
            column = None;
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        let Some(at) = column else {
            column = cells.iter().position(|c| *c == "default");
            continue;
        };
        let Some(value) = cells.get(at).and_then(|c| c.split_whitespace().next()) else {
            continue;
        };
        for name in cells[0].split('`').skip(1).step_by(2) {
            out.push((heading.clone(), name.to_string(), value.replace('`', "")));
        }
    }
    out
}

/// Each place where `doc` states a schema default with another value, or does not state it:
/// one line per field.
fn wrong_defaults(schema: &serde_json::Value, doc: &str) -> Vec<String> {
    let rows = table_defaults(doc);
    let prose = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let row = |heading: &str, field: &str| {
        rows.iter()
            .find(|(h, f, _)| h == heading && f == field)
            .map(|(_, _, v)| v.clone())
    };
    let object = |name: &str| {
        if name == "#" {
            schema
        } else {
            &schema["$defs"][name]
        }
    };
    let mut wrong = Vec::new();
    for (obj, field, stated) in STATED {
        let def = &object(obj)["properties"][field];
        let Some(want) = schema_default(def) else {
            wrong.push(format!("{obj}.{field}: the schema states no default"));
            continue;
        };
        match stated {
            Stated::Row(heading) => {
                if row(heading, field).as_deref() != Some(&want) {
                    wrong.push(format!(
                        "{obj}.{field}: docs/spec.md's table under `{heading}` says {:?}, the schema {want}",
                        row(heading, field)
                    ));
                }
            }
            Stated::Phrase(phrase) => {
                let phrase = phrase.replace("{}", &want);
                if !prose.contains(&phrase) {
                    wrong.push(format!(
                        "{obj}.{field}: docs/spec.md does not say \"{phrase}\""
                    ));
                }
            }
            Stated::Fields(heading) => {
                for (k, v) in def["default"].as_object().into_iter().flatten() {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    if row(heading, k).as_deref() != Some(&v) {
                        wrong.push(format!(
                            "{obj}.{field}.{k}: docs/spec.md says {:?}, the schema {v}",
                            row(heading, k)
                        ));
                    }
                }
            }
        }
    }
    wrong
}

/// The defaults docs/spec.md states are the schema's (`schemas/voidbox.schema.json`, which
/// another test keeps equal to `voidbox schema`): `memory_mb`, `vcpus`, the timeouts and every
/// field the schema gives a `default`; a changed value in the doc is caught.
#[test]
fn the_documented_defaults_are_the_schemas() {
    let root = voidbox_tests::repo_root();
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("schemas/voidbox.schema.json")).expect("schema"),
    )
    .expect("schema JSON");
    let doc = std::fs::read_to_string(root.join("docs/spec.md")).expect("docs/spec.md");
    let wrong = wrong_defaults(&schema, &doc);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // Every field with a `default` keyword is checked.
    let mut objects = vec![("#".to_string(), &schema)];
    objects.extend(
        schema["$defs"]
            .as_object()
            .expect("$defs")
            .iter()
            .map(|(k, v)| (k.clone(), v)),
    );
    for (obj, def) in objects {
        for (field, f) in def["properties"].as_object().into_iter().flatten() {
            if f.get("default").is_some() {
                assert!(
                    STATED.iter().any(|(o, n, _)| *o == obj && n == field),
                    "{obj}.{field} has a default in the schema that no test compares with docs/spec.md"
                );
            }
        }
    }
    for (field, required) in [
        ("memory_mb", "Sandbox"),
        ("vcpus", "Sandbox"),
        ("timeout_secs", "#"),
    ] {
        assert!(
            STATED.iter().any(|(o, n, _)| *o == required && *n == field),
            "{field}"
        );
    }

    // A wrong value in the doc's table or prose is caught.
    let memory = "| `memory_mb` | 64..=65536 | 256 ";
    assert!(
        doc.contains(memory),
        "the sandbox table's memory_mb row moved"
    );
    let broken = doc.replace(memory, "| `memory_mb` | 64..=65536 | 1024 ");
    assert_eq!(wrong_defaults(&schema, &broken).len(), 1);
    let broken = doc.replace(
        "default node timeout, 1800 s",
        "default node timeout, 600 s",
    );
    assert_eq!(wrong_defaults(&schema, &broken).len(), 3);
}
