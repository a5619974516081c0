//! A `run` without `program` runs the image's `Entrypoint`/`Cmd`, so it needs an image: the
//! node's `sandbox.image` or the spec's. Without one it is `voidbox::missing_program` at the
//! `run` (whether the image has an entrypoint is known only once it is pulled: `apply`
//! refuses one with neither `Entrypoint` nor `Cmd` before any VM starts).

use super::semantic::items;
use crate::diagnostic::Diagnostic;
use crate::yaml::{Node, NodeKind};

/// Reports every `run` without `program` on a node that boots no OCI image.
pub fn check(root: &Node, out: &mut Vec<Diagnostic>) {
    let spec_image = has_image(root);
    let boxes = root.get("pipeline").and_then(|p| p.get("boxes"));
    let steps = root.get("workflow").and_then(|w| w.get("steps"));
    let nodes = std::iter::once(root).chain(items(boxes).iter().chain(items(steps)));
    for node in nodes {
        let Some(run) = node.get("run") else { continue };
        let program = run
            .get("program")
            .is_some_and(|p| !matches!(p.kind, NodeKind::Null));
        if program || spec_image || has_image(node) {
            continue;
        }
        // Only a mapping can lack the key (other shapes are the schema's to report).
        if !matches!(run.kind, NodeKind::Map(_)) {
            continue;
        }
        out.push(
            Diagnostic::error(
                "voidbox::missing_program",
                "`run` has no `program`, and the node has no `sandbox.image` whose entrypoint \
                 would run",
                run.span,
            )
            .with_label("program missing")
            .with_help(
                "name the program (`program: sh`), or set `sandbox.image` to run the image's \
                 Entrypoint/Cmd (`args` replace its Cmd)",
            ),
        );
    }
}

fn has_image(node: &Node) -> bool {
    node.get("sandbox")
        .and_then(|s| s.get("image"))
        .and_then(Node::as_str)
        .is_some_and(|i| !i.is_empty())
}

#[cfg(test)]
mod tests {
    use crate::validate::validate_source;

    fn codes(src: &str) -> Vec<String> {
        validate_source("t.yaml", src.into(), std::path::Path::new("."))
            .report
            .diagnostics
            .iter()
            .map(|d| d.code.to_string())
            .collect()
    }

    #[test]
    fn a_run_without_program_needs_an_image() {
        for missing in [
            "kind: sandbox\nname: s\nrun: {args: [x]}\n",
            "kind: sandbox\nname: s\nrun: {program: null}\n",
        ] {
            let found = codes(missing);
            assert!(
                found.contains(&"voidbox::missing_program".into()),
                "{found:?}"
            );
        }
        let step = codes(
            "kind: workflow\nname: w\nworkflow:\n  steps:\n    - {name: a, run: {args: [x]}}\n",
        );
        assert!(
            step.contains(&"voidbox::missing_program".into()),
            "{step:?}"
        );
        for ok in [
            "kind: sandbox\nname: s\nsandbox: {image: 'nginx:1'}\nrun: {args: [x]}\n",
            "kind: workflow\nname: w\nworkflow:\n  steps:\n    - {name: a, run: {}, sandbox: {image: 'redis:7'}}\n",
            "kind: pipeline\nname: p\nsandbox: {image: 'python:3'}\npipeline:\n  boxes:\n    - {name: a, run: {}}\n",
        ] {
            assert!(codes(ok).is_empty(), "{ok}: {:?}", codes(ok));
        }
    }
}
