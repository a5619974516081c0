//! OCI image references — `sandbox.image` and `sandbox.guest_image` (spec-wide), each box's
//! and step's `sandbox.image`, and OCI skills' `image` (the agent's and each box's) — parsed
//! with the parser the OCI client uses (`oci-spec`'s `Reference`, which `oci-client`
//! re-exports) and the same sha256-only digest rule as `voidbox_oci::ImageRef`, so `validate`
//! refuses exactly what a pull would (the engine tests that the two agree):
//! `voidbox::invalid_image_reference` at the value.
//! Empty values are left to the schema and to `apply`.

use super::semantic::items;
use crate::diagnostic::Diagnostic;
use crate::yaml::{Node, NodeKind};

/// Why `reference` is not an image reference a pull accepts (`None`: it is one).
pub fn reference_problem(reference: &str) -> Option<String> {
    let parsed: oci_spec::distribution::Reference = match reference.trim().parse() {
        Ok(r) => r,
        Err(e) => return Some(format!("{e}")),
    };
    let digest = parsed.digest()?;
    let Some(hex) = digest.strip_prefix("sha256:") else {
        return Some(format!(
            "unsupported digest `{digest}` (only sha256 is supported)"
        ));
    };
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Some(format!("malformed sha256 digest `{digest}`"));
    }
    None
}

/// Reports every malformed image reference in the spec.
pub fn check(root: &Node, out: &mut Vec<Diagnostic>) {
    let mut one = |node: Option<&Node>, field: &str| {
        let Some(n) = node else { return };
        let Some(reference) = n.as_str().filter(|r| !r.trim().is_empty()) else {
            return;
        };
        if let Some(reason) = reference_problem(reference) {
            out.push(
                Diagnostic::error(
                    "voidbox::invalid_image_reference",
                    format!("`{field}`: invalid image reference `{reference}`: {reason}"),
                    n.span,
                )
                .with_label("not an OCI image reference")
                .with_help("write `[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]`, for example `alpine:3.20` or `ghcr.io/org/tool@sha256:<64 hex digits>`"),
            );
        }
    };
    let sandbox = root.get("sandbox");
    one(sandbox.and_then(|s| s.get("image")), "sandbox.image");
    one(
        sandbox.and_then(|s| s.get("guest_image")),
        "sandbox.guest_image",
    );
    let mut skills = |list: Option<&Node>, at: &str| {
        for (i, s) in items(list).iter().enumerate() {
            if matches!(s.kind, NodeKind::Map(_)) {
                one(s.get("image"), &format!("{at}.skills[{i}].image"));
            }
        }
    };
    skills(root.get("agent").and_then(|a| a.get("skills")), "agent");
    let boxes = root.get("pipeline").and_then(|p| p.get("boxes"));
    for (i, b) in items(boxes).iter().enumerate() {
        skills(b.get("skills"), &format!("pipeline.boxes[{i}]"));
    }
    for (i, b) in items(boxes).iter().enumerate() {
        one(
            b.get("sandbox").and_then(|s| s.get("image")),
            &format!("pipeline.boxes[{i}].sandbox.image"),
        );
    }
    let steps = root.get("workflow").and_then(|w| w.get("steps"));
    for (i, s) in items(steps).iter().enumerate() {
        one(
            s.get("sandbox").and_then(|s| s.get("image")),
            &format!("workflow.steps[{i}].sandbox.image"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostic::line_col;
    use crate::yaml::parse;

    /// `(line, column, message)` of each diagnostic.
    fn bad(src: &str) -> Vec<(usize, usize, String)> {
        let root = parse(src).expect("yaml");
        let mut out = Vec::new();
        check(&root, &mut out);
        out.into_iter()
            .map(|d| {
                assert_eq!(d.code, "voidbox::invalid_image_reference");
                assert!(d.is_error());
                let (l, c) = line_col(src, d.span.offset);
                (l, c, d.message)
            })
            .collect()
    }

    #[test]
    fn spec_wide_sandbox_images_are_located() {
        let src = "kind: sandbox\nname: s\nsandbox:\n  image: \"Bad Image\"\n  guest_image: \"x@sha256:1234\"\n";
        let got = bad(src);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!((got[0].0, got[0].1), (4, 10));
        assert!(
            got[0]
                .2
                .starts_with("`sandbox.image`: invalid image reference `Bad Image`: "),
            "{got:?}"
        );
        assert_eq!((got[1].0, got[1].1), (5, 16));
        assert!(got[1].2.contains("`sandbox.guest_image`"), "{got:?}");
        assert!(got[1].2.contains("sha256"), "{got:?}");
    }

    #[test]
    fn per_box_step_and_skill_images_are_located() {
        let src = "kind: pipeline\nname: p\nagent:\n  prompt: hi\n  skills:\n    - {image: \"UPPER\", mount: /s}\n    - \"file:x.md\"\npipeline:\n  boxes:\n    - name: a\n      run: {program: echo}\n      sandbox: {image: \"a:b:c\"}\n    - name: b\n      prompt: hi\n      skills: [{image: \"ok/skill:1\", mount: /k}, {image: \"no spaces allowed\", mount: /m}]\n";
        let got = bad(src);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!((got[0].0, got[0].1), (6, 15));
        assert!(got[0].2.contains("`agent.skills[0].image`"), "{got:?}");
        assert_eq!(got[1].0, 15);
        assert!(
            got[1].2.contains("`pipeline.boxes[1].skills[1].image`"),
            "{got:?}"
        );
        assert_eq!((got[2].0, got[2].1), (12, 24));
        assert!(
            got[2].2.contains("`pipeline.boxes[0].sandbox.image`"),
            "{got:?}"
        );
        let wf = "kind: workflow\nname: w\nworkflow:\n  steps:\n    - name: s\n      run: {program: echo}\n      sandbox:\n        image: \"-leading-dash\"\n";
        let got = bad(wf);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].0, got[0].1), (8, 16));
        assert!(got[0].2.contains("`workflow.steps[0].sandbox.image`"));
    }

    #[test]
    fn valid_and_empty_references_pass() {
        let digest = "a".repeat(64);
        let src = format!(
            "kind: pipeline\nname: p\nsandbox:\n  image: alpine:3.20\n  guest_image: \"\"\npipeline:\n  boxes:\n    - name: a\n      run: {{program: echo}}\n      sandbox: {{image: \"127.0.0.1:5000/x/y@sha256:{digest}\"}}\n    - name: b\n      prompt: hi\n      skills: [{{image: ghcr.io/org/python:3.12-slim, mount: /py}}, \"agent:x\"]\n"
        );
        assert!(bad(&src).is_empty(), "{:?}", bad(&src));
    }
}
