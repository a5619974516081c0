//! The conformance corpus: `specs/valid/*.yaml` must validate; every `specs/invalid/*.yaml`
//! must fail with exactly the diagnostics (severity, code, line, column) listed in its
//! sibling `.expected` file.

use std::path::Path;

use voidbox_tests::{repo_root, Run};

const BIN: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

/// Runs `voidbox` against a fixed image cache (`tests/fixtures/image-cache`: one guest image
/// manifest listing the busybox programs on `PATH`), so that `cli:` checks do not depend on
/// what this machine has cached.
fn run_in(bin: &str, cwd: &Path, args: &[&str]) -> Run {
    std::process::Command::new(bin)
        .args(args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .env(
            "XDG_CACHE_HOME",
            repo_root().join("tests/fixtures/image-cache"),
        )
        .output()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"))
        .into()
}

fn yaml_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .expect("corpus dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn valid_specs_validate() {
    let dir = repo_root().join("specs/valid");
    let files = yaml_files(&dir);
    assert!(files.len() >= 8, "valid corpus too small: {files:?}");
    for f in files {
        let r = run_in(BIN, &dir, &["validate", "--format", "json", &f]);
        assert_eq!(
            r.code,
            Some(0),
            "{f} should be valid:\n{}{}",
            r.stdout,
            r.stderr
        );
        let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
        let diags = doc["files"][0]["diagnostics"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            diags.iter().all(|d| d["severity"] == "warning"),
            "{f}: {diags:?}"
        );
    }
}

#[test]
fn invalid_specs_match_expected_diagnostics() {
    let dir = repo_root().join("specs/invalid");
    let files = yaml_files(&dir);
    assert!(
        files.len() >= 25,
        "need at least 25 invalid cases, have {}",
        files.len()
    );
    for f in files {
        let expected_path = dir.join(f.replace(".yaml", ".expected"));
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        let expected: Vec<String> = expected
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_string)
            .collect();
        assert!(
            expected.iter().any(|l| l.starts_with("error ")),
            "{f}: .expected lists no error"
        );
        let r = run_in(BIN, &dir, &["validate", "--format", "json", &f]);
        assert_eq!(
            r.code,
            Some(1),
            "{f} should be invalid:\n{}{}",
            r.stdout,
            r.stderr
        );
        let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
        let got: Vec<String> = doc["files"][0]["diagnostics"]
            .as_array()
            .expect("diagnostics")
            .iter()
            .map(|d| {
                format!(
                    "{} {} {}:{}",
                    d["severity"].as_str().unwrap_or_default(),
                    d["code"].as_str().unwrap_or_default(),
                    d["line"],
                    d["column"]
                )
            })
            .collect();
        assert_eq!(
            got,
            expected,
            "{f}: diagnostics differ from {}",
            expected_path.display()
        );
        // Every diagnostic carries a message; the human format shows file:line:col and the code.
        let human = run_in(BIN, &dir, &["validate", &f]);
        let first = &expected[0];
        let code = first.split_whitespace().nth(1).unwrap_or_default();
        assert!(
            human.stdout.contains(code),
            "{f}: human output lacks {code}:\n{}",
            human.stdout
        );
    }
}

#[test]
fn whole_corpus_directory_at_once() {
    let root = repo_root();
    let r = run_in(BIN, &root, &["validate", "--format", "json", "specs"]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    let valid = yaml_files(&root.join("specs/valid")).len();
    let invalid = yaml_files(&root.join("specs/invalid")).len();
    // A directory walk skips YAML that is not a spec at all (named one by one, each of these
    // is still an error: see `invalid_specs_match_expected_diagnostics`).
    let not_specs = ["comment-only.yaml", "empty.yaml", "not-a-mapping.yaml"];
    let skipped: Vec<String> = doc["summary"]["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .map(|p| p.as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        skipped,
        not_specs.map(|f| format!("specs/invalid/{f}")),
        "{doc}"
    );
    assert_eq!(doc["summary"]["files"], valid + invalid - not_specs.len());
    assert_eq!(doc["summary"]["invalid"], invalid - not_specs.len());
    assert_eq!(doc["summary"]["valid"], valid);
}
