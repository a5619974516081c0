use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use super::*;
use crate::spec::model::InlineSkill;

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// A Claude Code kit of `skills` in `dir`.
fn build(dir: &Path, skills: &[SkillEntry], secrets: &Secrets) -> Result<Kit, KitError> {
    super::build(
        &Sources {
            spec_dir: dir,
            skills,
            prompt_files: &[],
            layout: Layout::CLAUDE,
            remotes: &Remotes::new(),
        },
        secrets,
    )
}

fn simple(s: &str) -> SkillEntry {
    SkillEntry::Simple(s.into())
}

fn file<'a>(kit: &'a Kit, path: &str) -> &'a KitFile {
    kit.files
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} not in {:?}", paths(kit)))
}

fn text(kit: &Kit, path: &str) -> String {
    String::from_utf8(file(kit, path).data.clone()).unwrap()
}

fn paths(kit: &Kit) -> Vec<&str> {
    kit.files.iter().map(|f| f.path.as_str()).collect()
}

#[test]
fn a_skill_directory_is_staged_with_its_files_and_plain_skills_get_frontmatter() {
    let d = tempfile::tempdir().unwrap();
    write(
        d.path(),
        "sk/sum/SKILL.md",
        "---\nname: sum\ndescription: d\n---\nbody\n",
    );
    write(d.path(), "sk/sum/scripts/run.sh", "#!/bin/sh\necho hi\n");
    write(d.path(), "sk/sum/references/a.md", "a");
    write(d.path(), "sk/sum/assets/logo.bin", "\0\x01binary");
    write(d.path(), "sk/sum/README.md", "readme");
    write(d.path(), "sk/sum/.env", "SECRET=1");
    write(d.path(), "sk/sum/.git/config", "x");
    let script = d.path().join("sk/sum/scripts/run.sh");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    write(
        d.path(),
        "notes.md",
        "# Notes\n\nSummarise things briefly.\n",
    );
    let kit = build(
        d.path(),
        &[
            simple("file:sk/sum"),
            simple("file:notes.md"),
            SkillEntry::Inline(InlineSkill {
                name: "Inline  One!".into(),
                content: "# Title only\n".into(),
            }),
            simple("agent:claude-code"),
            simple("cli:sh"),
        ],
        &Secrets::default(),
    )
    .unwrap();
    assert_eq!(
        paths(&kit),
        [
            "skills/sum/SKILL.md",
            "skills/sum/README.md",
            "skills/sum/assets/logo.bin",
            "skills/sum/references/a.md",
            "skills/sum/scripts/run.sh",
            "skills/notes/SKILL.md",
            "skills/inline-one/SKILL.md",
        ]
    );
    assert_eq!(kit.skill_names, ["sum", "notes", "inline-one"]);
    // Existing frontmatter is kept as is.
    assert_eq!(
        text(&kit, "skills/sum/SKILL.md"),
        "---\nname: sum\ndescription: d\n---\nbody\n"
    );
    assert_eq!(
        text(&kit, "skills/notes/SKILL.md"),
        "---\nname: \"notes\"\ndescription: \"Summarise things briefly.\"\n---\n\n# Notes\n\nSummarise things briefly.\n"
    );
    assert!(text(&kit, "skills/inline-one/SKILL.md")
        .starts_with("---\nname: \"inline-one\"\ndescription: \"Title only\"\n---\n"));
    assert!(file(&kit, "skills/sum/scripts/run.sh").executable);
    assert_eq!(file(&kit, "skills/sum/scripts/run.sh").guest_mode(), 0o555);
    assert!(!file(&kit, "skills/sum/assets/logo.bin").text);
    assert_eq!(
        file(&kit, "skills/sum/SKILL.md").guest,
        "/home/sandbox/.claude/skills/sum/SKILL.md"
    );
    let s = &kit.summary()[0];
    assert_eq!((s.name.as_str(), s.files, s.binary_files), ("sum", 5, 1));
}

#[test]
fn symlinks_out_of_the_skill_dir_and_special_files_are_refused() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "outside.txt", "host secret");
    write(d.path(), "sk/a/SKILL.md", "x");
    write(d.path(), "sk/a/inner.md", "inner");
    symlink(
        d.path().join("sk/a/inner.md"),
        d.path().join("sk/a/alias.md"),
    )
    .unwrap();
    // A link to a file inside the skill is copied as that file.
    let kit = build(d.path(), &[simple("file:sk/a")], &Secrets::default()).unwrap();
    assert_eq!(text(&kit, "skills/a/alias.md"), "inner");

    symlink(d.path().join("outside.txt"), d.path().join("sk/a/leak.md")).unwrap();
    let e = build(d.path(), &[simple("file:sk/a")], &Secrets::default()).unwrap_err();
    assert_eq!(e.skill, "file:sk/a");
    assert!(
        e.message
            .contains("`leak.md` is a symlink out of the skill directory"),
        "{e}"
    );
    std::fs::remove_file(d.path().join("sk/a/leak.md")).unwrap();

    symlink("../../..", d.path().join("sk/a/up")).unwrap();
    let e = build(d.path(), &[simple("file:sk/a")], &Secrets::default()).unwrap_err();
    assert!(e.message.contains("`up` is a symlink out of"), "{e}");
    std::fs::remove_file(d.path().join("sk/a/up")).unwrap();

    let st = std::process::Command::new("mkfifo")
        .arg(d.path().join("sk/a/pipe"))
        .status()
        .unwrap();
    assert!(st.success());
    let e = build(d.path(), &[simple("file:sk/a")], &Secrets::default()).unwrap_err();
    assert!(e.message.contains("`pipe` is not a regular file"), "{e}");
}

#[test]
fn missing_dirs_without_skill_md_duplicates_and_unsupported_kinds_are_errors() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "nomd/x.md", "x");
    write(d.path(), "a/sum/SKILL.md", "x");
    write(d.path(), "b/sum/SKILL.md", "y");
    let err = |s: &[SkillEntry]| {
        build(d.path(), s, &Secrets::default())
            .unwrap_err()
            .to_string()
    };
    assert!(err(&[simple("file:gone")]).starts_with("skill `file:gone`: "));
    assert!(err(&[simple("file:nomd")]).contains("has no SKILL.md"));
    assert!(
        err(&[simple("file:a/sum"), simple("file:b/sum")]).contains("a second skill named `sum`")
    );
    assert!(err(&[simple("remote:o/r/s")]).contains("was not fetched before staging"));
    assert!(err(&[simple("mcp:github")]).contains("without saying how to start it"));
}

#[test]
fn kits_are_bounded_in_files_and_bytes() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "many/SKILL.md", "x");
    for i in 0..MAX_FILES {
        write(d.path(), &format!("many/f{i:04}"), "x");
    }
    let e = build(d.path(), &[simple("file:many")], &Secrets::default()).unwrap_err();
    assert!(
        e.message.contains(&format!("more than {MAX_FILES} files")),
        "{e}"
    );
    write(d.path(), "big/SKILL.md", "x");
    let big = std::fs::File::create(d.path().join("big/blob")).unwrap();
    big.set_len(MAX_BYTES + 1).unwrap();
    let e = build(d.path(), &[simple("file:big")], &Secrets::default()).unwrap_err();
    assert!(e.message.contains("larger than the kit limit"), "{e}");
}

#[test]
fn secrets_and_token_patterns_are_redacted_and_counted() {
    let key = "host-api-key-value-1234";
    let s = Secrets::new([key.to_string(), "short".to_string()]);
    assert_eq!(
        s.len(),
        1,
        "values under {MIN_SECRET_LEN} bytes are not redacted"
    );
    let input = format!(
        "k={key} again {key}\nshort stays short\n\
         anthropic sk-ant-api03-{a} openai sk-proj-{a}\n\
         gh ghp_{g} pat github_pat_{p}\naws AKIAABCDEFGHIJKLMNOP slack xoxb-1234567890-abcdef\n\
         not a key: task-sk-{a} skeleton sk-short\n\
         -----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n-----END OPENSSH PRIVATE KEY-----\nafter\n\
         -----BEGIN CERTIFICATE-----\npublic\n",
        a = "A".repeat(30),
        g = "x".repeat(36),
        p = "Y".repeat(30),
    );
    let (out, n) = s.redact(&input);
    assert_eq!(n, 9, "{out}");
    assert!(
        !out.contains(key) && !out.contains("AKIA") && !out.contains("b3Blbn"),
        "{out}"
    );
    assert!(out.contains("short stays short"));
    assert!(
        out.contains("task-sk-") && out.contains("sk-short"),
        "{out}"
    );
    assert!(
        out.contains("[REDACTED]\nafter\n-----BEGIN CERTIFICATE-----"),
        "{out}"
    );
    assert_eq!(s.redact("nothing here"), ("nothing here".to_string(), 0));
}

#[test]
fn staged_text_is_redacted_binary_is_not_and_the_manifest_has_no_host_paths() {
    let d = tempfile::tempdir().unwrap();
    let key = "sekrit-value-from-the-host";
    write(
        d.path(),
        "sk/k/SKILL.md",
        &format!("---\nname: k\n---\nuse {key} and {key}\n"),
    );
    write(
        d.path(),
        "sk/k/scripts/a.sh",
        "TOKEN=ghp_0123456789abcdefghij0123456789abcdef\n",
    );
    let mut bin = format!("\0{key}").into_bytes();
    bin.push(0xff);
    std::fs::write(d.path().join("sk/k/blob"), &bin).unwrap();
    let kit = build(
        d.path(),
        &[simple("file:sk/k")],
        &Secrets::new([key.to_string()]),
    )
    .unwrap();
    assert_eq!(
        text(&kit, "skills/k/SKILL.md"),
        "---\nname: k\n---\nuse [REDACTED] and [REDACTED]\n"
    );
    assert_eq!(file(&kit, "skills/k/SKILL.md").redactions, 2);
    assert_eq!(file(&kit, "skills/k/scripts/a.sh").redactions, 1);
    assert_eq!(file(&kit, "skills/k/blob").data, bin);
    let s = &kit.summary()[0];
    assert_eq!((s.files, s.redactions, s.binary_files), (3, 3, 1));
    let m = kit.manifest();
    let text = m.to_string();
    let host = d.path().to_str().unwrap();
    assert!(!text.contains(host), "{text}");
    assert!(!text.contains(key));
    assert_eq!(m["files"][0]["path"], "skills/k/SKILL.md");
    assert_eq!(
        m["files"][0]["guest"],
        "/home/sandbox/.claude/skills/k/SKILL.md"
    );
    assert_eq!(m["files"][0]["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(m["skills"][0]["redactions"], 3);
}

#[test]
fn writing_is_atomic_and_refuses_a_non_empty_destination() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "sk/a/SKILL.md", "x");
    write(d.path(), "sk/a/scripts/run", "y");
    let run = d.path().join("sk/a/scripts/run");
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let kit = build(d.path(), &[simple("file:sk/a")], &Secrets::default()).unwrap();
    let out = d.path().join("out");
    // An empty directory is replaced.
    std::fs::create_dir(&out).unwrap();
    write_dir(&kit, &out).unwrap();
    assert!(std::fs::read_to_string(out.join("skills/a/SKILL.md"))
        .unwrap()
        .contains("name: \"a\""));
    let mode = std::fs::metadata(out.join("skills/a/scripts/run"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m, kit.manifest());
    // A non-empty destination is left untouched and no temporary directory remains.
    let e = write_dir(&kit, &out).unwrap_err();
    assert!(e.contains("exists and is not empty"), "{e}");
    let other = d.path().join("other");
    write(d.path(), "other/keep", "k");
    assert!(write_dir(&kit, &other).is_err());
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 1);
    let leftovers: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".voidbox-kit-"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn a_failed_rename_removes_the_temporary_directory() {
    let d = tempfile::tempdir().unwrap();
    let kit = build(
        d.path(),
        &[SkillEntry::Inline(InlineSkill {
            name: "i".into(),
            content: "c".into(),
        })],
        &Secrets::default(),
    )
    .unwrap();
    // A destination name longer than NAME_MAX passes the emptiness check, so the kit is
    // written to the temporary directory and the rename fails.
    let parent = d.path().join("sub");
    std::fs::create_dir(&parent).unwrap();
    let e = write_dir(&kit, &parent.join("x".repeat(300))).unwrap_err();
    assert!(!e.is_empty());
    assert_eq!(
        std::fs::read_dir(&parent).unwrap().count(),
        0,
        "nothing half-written remains"
    );
}

#[test]
fn generated_frontmatter_passes_the_agent_skills_rules() {
    let d = tempfile::tempdir().unwrap();
    write(
        d.path(),
        "My Notes.md",
        "\n# Heading\n\nA \"quoted\": description.\n",
    );
    write(d.path(), "empty.txt", "");
    let kit = build(
        d.path(),
        &[simple("file:My Notes.md"), simple("file:empty.txt")],
        &Secrets::default(),
    )
    .unwrap();
    assert_eq!(kit.skill_names, ["my-notes", "empty"]);
    for name in &kit.skill_names {
        let md = text(&kit, &format!("skills/{name}/SKILL.md"));
        let problems = crate::validate::skills::agent_skill_problems(&md, name);
        assert!(problems.is_empty(), "{md}: {problems:?}");
    }
    assert!(text(&kit, "skills/empty/SKILL.md").contains("description: \"Skill empty\""));
}

/// A fetched `remote:` skill is staged from its cache directory like a `file:` directory,
/// named after the skill (not the digest-named directory), redacted, with its origin.
#[test]
fn a_fetched_remote_skill_is_staged_under_its_name_with_its_origin() {
    let d = tempfile::tempdir().unwrap();
    let cached = d.path().join("sha256/0123abcd");
    write(
        &cached,
        "SKILL.md",
        "---\nname: brainstorming\ndescription: d\n---\nbody\n",
    );
    write(&cached, "scripts/run.sh", "echo topsecret-value-123\n");
    let mut remotes = Remotes::new();
    remotes.insert(
        "remote:obra/superpowers/brainstorming@v1".into(),
        remote::FetchedSkill {
            dir: cached.clone(),
            sha256: "0123abcd".into(),
            commit: Some("c".repeat(40)),
            url: "https://api.github.com/repos/obra/superpowers/tarball/v1".into(),
            from_cache: false,
        },
    );
    let skills = [simple("remote:obra/superpowers/brainstorming@v1")];
    let kit = super::build(
        &Sources {
            spec_dir: d.path(),
            skills: &skills,
            prompt_files: &[],
            layout: Layout::CODEX,
            remotes: &remotes,
        },
        &Secrets::new(["topsecret-value-123".to_string()]),
    )
    .unwrap();
    assert_eq!(
        paths(&kit),
        [
            "skills/brainstorming/SKILL.md",
            "skills/brainstorming/scripts/run.sh"
        ]
    );
    assert_eq!(
        file(&kit, "skills/brainstorming/SKILL.md").guest,
        "/home/sandbox/.codex/skills/brainstorming/SKILL.md"
    );
    assert_eq!(
        text(&kit, "skills/brainstorming/scripts/run.sh"),
        "echo [REDACTED]\n"
    );
    let s = &kit.summary()[0];
    let origin = s.remote.as_ref().unwrap();
    assert_eq!(origin.commit.as_deref(), Some("c".repeat(40).as_str()));
    assert_eq!(origin.sha256, "0123abcd");
    let manifest = kit.manifest().to_string();
    assert!(!manifest.contains(d.path().to_str().unwrap()), "{manifest}");
}
