//! `run.program` must be on the guest image's `PATH` (the spec's `run`, each box's and each
//! step's): a bare name the image does not ship is `voidbox::program_not_found` at the
//! value, with a did-you-mean, instead of a failure after a VM booted. It depends on the
//! image, so `apply` and `apply --dry-run` check it with the image they boot ([`missing`]);
//! `validate` and the LSP never do (their verdict is the same on every machine).
//! Checked only where the node runs in that image as is: not in an OCI `sandbox.image`,
//! another kernel/initramfs/guest image or a named snapshot, not with `PATH` set in an
//! `env`, nor with a mount over a `PATH` directory. Absolute paths are left to the guest
//! (mounts and inputs may provide them). The runtime programs
//! ([`super::runtimes::RUNTIME_PROGRAMS`]) are found: such a node gets the runtimes disk.

use std::collections::BTreeSet;

use super::runtimes::RUNTIME_PROGRAMS;
use super::semantic::items;
use crate::diagnostic::Diagnostic;
use crate::suggest::did_you_mean;
use crate::yaml::{Node, NodeKind};
use voidbox_protocol::GUEST_PATH_DIRS as PATH_DIRS;

/// Fields of the spec-wide `sandbox` that boot something other than the default image.
const OTHER_IMAGE: [&str; 5] = ["image", "guest_image", "kernel", "initramfs", "snapshot"];

/// Every `run.program` of `root` that a guest image whose `PATH` holds `known` lacks, each
/// with its field (`workflow.steps[1].run.program`) and a diagnostic at the value.
pub fn missing(root: &Node, known: &BTreeSet<String>) -> Vec<(String, Diagnostic)> {
    let mut out = Vec::new();
    let sandbox = root.get("sandbox");
    if sandbox.is_some_and(|s| {
        s.get("mode").and_then(Node::as_str) == Some("mock")
            || OTHER_IMAGE.iter().any(|f| s.get(f).is_some())
            || changes_path(s)
    }) {
        return out;
    }
    let mut nodes: Vec<(&Node, String)> = vec![(root, String::new())];
    let boxes = root.get("pipeline").and_then(|p| p.get("boxes"));
    let steps = root.get("workflow").and_then(|w| w.get("steps"));
    for (section, list) in [("pipeline.boxes", boxes), ("workflow.steps", steps)] {
        let listed = items(list).iter().enumerate();
        nodes.extend(listed.map(|(i, n)| (n, format!("{section}[{i}]."))));
    }
    for (node, prefix) in nodes {
        let own = node.get("sandbox");
        if own.is_some_and(|s| s.get("image").is_some() || s.get("snapshot").is_some())
            || own.is_some_and(changes_path)
            || skill_covers_path(node)
            || skill_covers_path(root)
        {
            continue;
        }
        let Some(run) = node.get("run") else { continue };
        if has_path_var(run.get("env")) {
            continue;
        }
        let Some(value) = run.get("program") else {
            continue;
        };
        let Some(program) = value.as_str() else {
            continue;
        };
        if program.is_empty() || program.contains('/') {
            continue;
        }
        if known.contains(program) || RUNTIME_PROGRAMS.contains(&program) {
            continue;
        }
        let candidates = known.iter().map(String::as_str).chain(RUNTIME_PROGRAMS);
        let help = match did_you_mean(program, candidates) {
            Some(m) => format!("did you mean `{m}`? (`voidbox image ls` shows the guest image)"),
            None => "use a program the guest image ships (busybox applets such as `sh`, `awk`, `sed`), an absolute path, or a `sandbox.image` that has it".into(),
        };
        out.push((
            format!("{prefix}run.program"),
            Diagnostic::error(
                "voidbox::program_not_found",
                format!("program `{program}` is not on the guest image's PATH"),
                value.span,
            )
            .with_label("not in the guest image")
            .with_help(help),
        ));
    }
    out
}

/// Whether a `sandbox` block sets `PATH` or mounts over a `PATH` directory.
fn changes_path(sandbox: &Node) -> bool {
    has_path_var(sandbox.get("env"))
        || items(sandbox.get("mounts")).iter().any(|m| {
            m.get("guest")
                .and_then(Node::as_str)
                .is_some_and(covers_path_dir)
        })
}

/// Whether an OCI skill (`skills: [{image, mount}]`) of `node` is mounted over a `PATH`
/// directory (its programs then shadow or add to the image's).
fn skill_covers_path(node: &Node) -> bool {
    items(node.get("skills")).iter().any(|s| {
        s.get("mount")
            .and_then(Node::as_str)
            .is_some_and(covers_path_dir)
    })
}

/// Whether an `env` mapping names `PATH`.
fn has_path_var(env: Option<&Node>) -> bool {
    matches!(env.map(|e| &e.kind), Some(NodeKind::Map(_)))
        && env.and_then(|e| e.get("PATH")).is_some()
}

/// Whether a guest mount point is a `PATH` directory, inside one, or above one.
fn covers_path_dir(guest: &str) -> bool {
    let guest = guest.trim_end_matches('/').trim_start_matches('/');
    PATH_DIRS.iter().any(|dir| {
        guest.is_empty()
            || *dir == guest
            || dir.starts_with(&format!("{guest}/"))
            || guest.starts_with(&format!("{dir}/"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml;

    /// `(line, column, help)` of each diagnostic.
    fn found(text: &str, programs: Option<&BTreeSet<String>>) -> Vec<(usize, usize, String)> {
        let root = yaml::parse(text).expect("yaml");
        let Some(programs) = programs else {
            return Vec::new();
        };
        missing(&root, programs)
            .iter()
            .map(|(_, d)| {
                assert_eq!(d.code, "voidbox::program_not_found");
                let (l, c) = crate::diagnostic::line_col(text, d.span.offset);
                (l, c, d.help.clone().unwrap_or_default())
            })
            .collect()
    }

    fn image() -> BTreeSet<String> {
        ["sh", "echo", "awk"].map(String::from).into()
    }

    #[test]
    fn bare_programs_must_be_in_the_image() {
        let img = image();
        let spec = "kind: sandbox\nname: a\nrun:\n  program: ehco\n";
        let f = found(spec, Some(&img));
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].0, f[0].1), (4, 12));
        assert!(f[0].2.contains("did you mean `echo`?"), "{}", f[0].2);
        assert!(found("kind: sandbox\nname: a\nrun: {program: echo}\n", Some(&img)).is_empty());
        assert!(found(
            "kind: sandbox\nname: a\nrun: {program: /opt/x}\n",
            Some(&img)
        )
        .is_empty());
        let pipeline = "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: a\n      run: {program: sh}\n    - name: b\n      run: {program: zzzzqqq}\n";
        let f = found(pipeline, Some(&img));
        assert_eq!((f[0].0, f[0].1), (8, 22));
        assert!(!f[0].2.contains("did you mean"), "{}", f[0].2);
        let workflow = "kind: workflow\nname: w\nworkflow:\n  steps:\n    - name: a\n      run: {program: ehco}\n";
        let root = yaml::parse(workflow).expect("yaml");
        let m = missing(&root, &img);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].0, "workflow.steps[0].run.program");
        // The runtime programs come with the runtimes disk; a typo of one is named.
        let runtimes = "kind: workflow\nname: w\nworkflow:\n  steps:\n    - name: a\n      run: {program: codex, args: [--version]}\n    - name: b\n      run: {program: claude}\n    - name: c\n      run: {program: codx}\n";
        let f = found(runtimes, Some(&img));
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].0, 10);
        assert!(f[0].2.contains("did you mean `codex`?"), "{}", f[0].2);
    }

    #[test]
    fn oci_skills_over_path_dirs_are_not_checked() {
        let img = image();
        let spec = "kind: sandbox\nname: a\nskills:\n  - {image: 'r/t:1', mount: /usr/local/bin}\nrun: {program: lint}\n";
        assert!(found(spec, Some(&img)).is_empty());
        let elsewhere = "kind: sandbox\nname: a\nskills:\n  - {image: 'r/t:1', mount: /skills/lint}\nrun: {program: lint}\n";
        assert_eq!(found(elsewhere, Some(&img)).len(), 1);
    }

    #[test]
    fn other_images_paths_and_mounts_are_not_checked() {
        let img = image();
        for sandbox in [
            "sandbox: {image: 'python:3.12'}\n",
            "sandbox: {kernel: ./vmlinux}\n",
            "sandbox: {mode: mock}\n",
            "sandbox: {env: {PATH: /opt/bin}}\n",
            "sandbox: {mounts: [{host: ., guest: /usr/local/bin}]}\n",
            "sandbox: {mounts: [{host: ., guest: /usr}]}\n",
        ] {
            let spec = format!("kind: sandbox\nname: a\n{sandbox}run: {{program: python3}}\n");
            assert!(found(&spec, Some(&img)).is_empty(), "{spec}");
        }
        let spec = "kind: sandbox\nname: a\nsandbox: {mounts: [{host: ., guest: /workspace/x}]}\nrun: {program: python3}\n";
        assert_eq!(found(spec, Some(&img)).len(), 1);
        let spec = "kind: sandbox\nname: a\nrun: {program: tool, env: {PATH: /workspace}}\n";
        assert!(found(spec, Some(&img)).is_empty());
        let pipeline = "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: a\n      sandbox: {image: 'python:3.12'}\n      run: {program: python3}\n    - name: b\n      run: {program: python3}\n";
        let f = found(pipeline, Some(&img));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].0, 9);
    }
}
