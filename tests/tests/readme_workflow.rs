//! The GitHub Actions workflow in docs/install.md's "In GitHub Actions" section is one a user can
//! paste: actionlint (pinned in the wheel tools' venv, which scripts/wheel.sh makes) finds
//! nothing wrong with it — syntax, expressions, step outputs, shell scripts and action
//! versions included.

use std::process::Command;

use voidbox_tests::repo_root;

/// The first ```yaml block after the section heading.
fn readme_workflow() -> String {
    let doc = std::fs::read_to_string(repo_root().join("docs/install.md")).expect("install.md");
    let section = doc
        .split_once("\n## In GitHub Actions")
        .expect("docs/install.md has an \"In GitHub Actions\" section")
        .1;
    let block = section
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a ```yaml block in that section")
        .0;
    block.to_string()
}

#[test]
fn the_readme_github_actions_workflow_passes_actionlint() {
    let actionlint = voidbox_tests::wheel_tool("actionlint");
    let dir = tempfile::tempdir().expect("tempdir");
    let workflows = dir.path().join(".github/workflows");
    std::fs::create_dir_all(&workflows).expect("mkdir");
    let jobs = readme_workflow();
    assert!(
        jobs.contains("voidbox apply") && jobs.contains("--junit"),
        "{jobs}"
    );
    let file = workflows.join("voidbox.yml");
    std::fs::write(&file, format!("name: voidbox\non: [push]\n{jobs}")).expect("write");
    let out = Command::new(&actionlint)
        .arg(&file)
        .current_dir(dir.path())
        .output()
        .expect("run actionlint");
    assert!(
        out.status.success(),
        "actionlint rejects the workflow of docs/install.md:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
