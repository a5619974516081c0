//! Rules for what an agent node needs from its guest: `agent:NAME` skills must agree with the
//! node's `llm.provider`, and `cli:NAME` skills must name a program on the guest image's
//! `PATH` (checked when the image is known: the newest cached guest image records it).

use std::collections::BTreeSet;

use crate::diagnostic::{Diagnostic, Span};
use crate::validate::skills::{parse_skill, SkillRef};
use crate::yaml::{Node, NodeKind};

/// Runtime names `agent:NAME` accepts, with the providers each works with.
pub const RUNTIMES: [(&str, &[&str]); 2] = [
    (
        "claude-code",
        &["claude", "claude-personal", "ollama", "lm-studio", "custom"],
    ),
    ("codex", &["codex"]),
];

/// Whether `agent:NAME` names a runtime in [`RUNTIMES`].
pub fn is_known(name: &str) -> bool {
    RUNTIMES.iter().any(|(r, _)| *r == name)
}

/// The programs on the guest image's `PATH`, asked for only when a `cli:` skill needs them
/// (`None`: the image is not known).
pub type Programs<'p> = &'p dyn Fn() -> Option<&'p BTreeSet<String>>;

/// Checks the `agent:` and `cli:` skills of every agent node of `root`.
/// `cli:` programs of a node in an OCI `sandbox.image` come from that image, which is not
/// known here: they are not checked.
pub fn check(root: &Node, programs: Programs<'_>, out: &mut Vec<Diagnostic>) {
    let spec_provider = provider(root);
    let unknown: Programs<'_> = &|| None;
    let in_image = |n: &Node| n.get("sandbox").and_then(|s| s.get("image")).is_some();
    let spec_image = in_image(root);
    if root.get("kind").and_then(Node::as_str) == Some("agent") {
        if let Some(agent) = root.get("agent") {
            let programs = if spec_image { unknown } else { programs };
            check_node(agent, spec_provider, programs, out);
        }
    }
    if let Some(NodeKind::Seq(boxes)) = root
        .get("pipeline")
        .and_then(|p| p.get("boxes"))
        .map(|b| &b.kind)
    {
        for b in boxes.iter().filter(|b| b.get("prompt").is_some()) {
            let own = provider(b).or(spec_provider);
            let programs = if spec_image || in_image(b) {
                unknown
            } else {
                programs
            };
            check_node(b, own, programs, out);
        }
    }
}

/// `llm.provider` of a block, with its span.
fn provider(block: &Node) -> Option<(&str, Span)> {
    let p = block.get("llm")?.get("provider")?;
    Some((p.as_str()?, p.span))
}

fn check_node(
    node: &Node,
    provider: Option<(&str, Span)>,
    programs: Programs<'_>,
    out: &mut Vec<Diagnostic>,
) {
    let Some(NodeKind::Seq(skills)) = node.get("skills").map(|s| &s.kind) else {
        return;
    };
    let (name, provider_span) = provider.map_or(("claude", None), |(p, s)| (p, Some(s)));
    for s in skills {
        let Some(text) = s.as_str() else { continue };
        match parse_skill(text) {
            Ok(SkillRef::Agent(runtime)) => {
                let Some((_, providers)) = RUNTIMES.iter().find(|(r, _)| *r == runtime) else {
                    out.push(
                        Diagnostic::warning(
                            "voidbox::unknown_runtime",
                            format!("unknown agent runtime `{runtime}`; `apply` refuses it"),
                            s.span,
                        )
                        .with_help("known runtimes: `agent:claude-code`, `agent:codex`"),
                    );
                    continue;
                };
                if !providers.contains(&name) {
                    let mut d = Diagnostic::error(
                        "voidbox::runtime_conflict",
                        format!(
                            "`agent:{runtime}` cannot run with `llm.provider: {name}`{}",
                            if provider_span.is_none() {
                                " (the default)"
                            } else {
                                ""
                            }
                        ),
                        s.span,
                    )
                    .with_label("runtime named here")
                    .with_help(if name == "mock" {
                        "the mock provider runs its own offline runtime: remove the `agent:` skill"
                            .to_string()
                    } else {
                        format!(
                            "`agent:{runtime}` works with provider {}",
                            providers
                                .iter()
                                .map(|p| format!("`{p}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    });
                    if let Some(span) = provider_span {
                        d = d.with_related(span, "provider chosen here");
                    }
                    out.push(d);
                }
            }
            Ok(SkillRef::Cli(tool)) if programs().is_some_and(|p| !p.contains(tool)) => {
                out.push(
                        Diagnostic::error(
                            "voidbox::cli_not_found",
                            format!("`cli:{tool}`: `{tool}` is not on the guest image's PATH"),
                            s.span,
                        )
                        .with_label("not in the guest image")
                        .with_help("use a program the guest image ships (busybox applets such as `awk`, `sed`, `grep`), or remove the skill"),
                    );
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml;

    fn codes(text: &str, programs: Option<&BTreeSet<String>>) -> Vec<(&'static str, usize)> {
        let root = yaml::parse(text).expect("yaml");
        let mut out = Vec::new();
        check(&root, &|| programs, &mut out);
        out.iter()
            .map(|d| (d.code, crate::diagnostic::line_col(text, d.span.offset).0))
            .collect()
    }

    #[test]
    fn runtime_must_match_provider() {
        let agent = |provider: &str, skill: &str| {
            format!(
                "kind: agent\nname: a\n{provider}agent:\n  prompt: hi\n  skills: [\"{skill}\"]\n"
            )
        };
        assert!(codes(
            &agent("llm: {provider: claude}\n", "agent:claude-code"),
            None
        )
        .is_empty());
        assert!(codes(&agent("", "agent:claude-code"), None).is_empty());
        assert!(codes(&agent("llm: {provider: codex}\n", "agent:codex"), None).is_empty());
        assert!(codes(
            &agent("llm: {provider: lm-studio}\n", "agent:claude-code"),
            None
        )
        .is_empty());
        assert_eq!(
            codes(&agent("llm: {provider: lm-studio}\n", "agent:codex"), None),
            [("voidbox::runtime_conflict", 6)]
        );
        assert_eq!(
            codes(&agent("llm: {provider: mock}\n", "agent:claude-code"), None),
            [("voidbox::runtime_conflict", 6)]
        );
        assert_eq!(
            codes(&agent("", "agent:codex"), None),
            [("voidbox::runtime_conflict", 5)]
        );
        assert_eq!(
            codes(&agent("", "agent:aider"), None),
            [("voidbox::unknown_runtime", 5)]
        );
        // A box's own llm wins over the spec's.
        let p = "kind: pipeline\nname: p\nllm: {provider: mock}\npipeline:\n  boxes:\n    - name: a\n      prompt: hi\n      llm: {provider: codex}\n      skills: [\"agent:codex\"]\n    - name: b\n      prompt: hi\n      skills: [\"agent:codex\"]\n";
        assert_eq!(codes(p, None), [("voidbox::runtime_conflict", 12)]);
    }

    #[test]
    fn cli_tools_are_checked_when_the_image_is_known() {
        let text =
            "kind: agent\nname: a\nagent:\n  prompt: hi\n  skills: [\"cli:awk\", \"cli:jq\"]\n";
        assert!(codes(text, None).is_empty());
        let programs: BTreeSet<String> = ["awk".to_string(), "sh".to_string()].into();
        assert_eq!(
            codes(text, Some(&programs)),
            [("voidbox::cli_not_found", 5)]
        );
        // In an OCI image the programs are the image's: not checked.
        let in_image = "kind: agent\nname: a\nsandbox: {image: 'python:3.12-slim'}\nagent:\n  prompt: hi\n  skills: [\"cli:python3\"]\n";
        assert!(codes(in_image, Some(&programs)).is_empty());
        let box_image = "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: a\n      prompt: hi\n      skills: [\"cli:python3\"]\n      sandbox: {image: 'python:3'}\n";
        assert!(codes(box_image, Some(&programs)).is_empty());
    }
}
