//! Rules for what an agent node needs from its guest: `agent:NAME` skills must agree with the
//! node's `llm.provider`. Whether a `cli:NAME` skill's program is on the guest image's `PATH`
//! depends on the image, so `apply` and `apply --dry-run` check it, never `validate`.
//!
//! Also which runtime programs ([`RUNTIME_PROGRAMS`]) a command runs
//! ([`command_runtimes`]): such a node gets the runtimes disk, as agent nodes do.

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

/// Checks the `agent:` skills of every agent node of `root` against its provider.
pub fn check(root: &Node, out: &mut Vec<Diagnostic>) {
    let spec_provider = provider(root);
    if root.get("kind").and_then(Node::as_str) == Some("agent") {
        if let Some(agent) = root.get("agent") {
            check_node(agent, spec_provider, out);
        }
    }
    if let Some(NodeKind::Seq(boxes)) = root
        .get("pipeline")
        .and_then(|p| p.get("boxes"))
        .map(|b| &b.kind)
    {
        for b in boxes.iter().filter(|b| b.get("prompt").is_some()) {
            let own = provider(b).or(spec_provider);
            check_node(b, own, out);
        }
    }
}

/// The programs of the runtimes disk that a command step may run by name: void-box's guest
/// ships them, so a command node that runs one gets the disk (and them on its `PATH`).
pub const RUNTIME_PROGRAMS: [&str; 2] = ["claude", "codex"];

/// Shells whose `-c SCRIPT` is scanned by [`command_runtimes`].
const SHELLS: [&str; 4] = ["sh", "ash", "bash", "dash"];

/// Words after which the next word is a command again (`if codex …`, `time claude …`).
const COMMAND_PREFIXES: [&str; 14] = [
    "if", "then", "else", "elif", "while", "until", "do", "!", "{", "time", "exec", "command",
    "nohup", "env",
];

/// The [`RUNTIME_PROGRAMS`] that `program ARGS` runs: the program itself when it is one
/// (by bare name), or, for a shell's `-c SCRIPT` (`sh -c 'codex --version'`), each one the
/// script names as a command word. The scan is word-level: a name counts at the start of the
/// script or of a command (after `;`, `&`, `|`, `(`, `` ` ``, `$(`, a newline, a keyword
/// such as `then` or `do`, a prefix such as `env`, `exec`, `time`, or `VAR=value`
/// assignments); anything else (an argument, a quoted string, a name behind a variable)
/// is not seen.
pub fn command_runtimes(program: &str, args: &[String]) -> Vec<&'static str> {
    if let Some(r) = RUNTIME_PROGRAMS.iter().find(|r| **r == program) {
        return vec![r];
    }
    let shell = program.rsplit('/').next().unwrap_or(program);
    if !SHELLS.contains(&shell) || (program.contains('/') && !program.starts_with('/')) {
        return Vec::new();
    }
    let mut script = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" || !a.starts_with('-') && !a.starts_with('+') {
            break;
        }
        if a.starts_with('-') && !a.starts_with("--") && a.contains('c') {
            script = it.find(|a| !a.starts_with('-') && !a.starts_with('+'));
            break;
        }
    }
    let Some(script) = script else {
        return Vec::new();
    };
    let mut found: Vec<&'static str> = Vec::new();
    for word in command_words(script) {
        if let Some(r) = RUNTIME_PROGRAMS.iter().find(|r| **r == word) {
            if !found.contains(r) {
                found.push(r);
            }
        }
    }
    found.sort_unstable();
    found
}

/// The words of `script` in command position (see [`command_runtimes`]).
fn command_words(script: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut at_command = true;
    let bytes = script.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b';' | b'&' | b'|' | b'(' | b')' | b'`' | b'\n' => {
                at_command = true;
                i += 1;
            }
            b'$' if bytes.get(i + 1) == Some(&b'(') => {
                at_command = true;
                i += 2;
            }
            b' ' | b'\t' | b'\r' => i += 1,
            b'#' if at_command => {
                // A comment runs to the end of the line.
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            _ => {
                let start = i;
                while i < bytes.len() && !b" \t\r\n;&|()`".contains(&bytes[i]) {
                    if bytes[i] == b'$' && bytes.get(i + 1) == Some(&b'(') {
                        break;
                    }
                    i += 1;
                }
                // `start..i` spans whole ASCII-delimited bytes, so it is on char boundaries.
                let word = script.get(start..i).unwrap_or_default();
                if !at_command {
                    continue;
                }
                let assignment = word.split_once('=').is_some_and(|(k, _)| {
                    !k.is_empty() && k.bytes().all(|b| b == b'_' || b.is_ascii_alphanumeric())
                });
                if assignment || COMMAND_PREFIXES.contains(&word) {
                    continue;
                }
                out.push(word);
                at_command = false;
            }
        }
    }
    out
}

/// `llm.provider` of a block, with its span.
fn provider(block: &Node) -> Option<(&str, Span)> {
    let p = block.get("llm")?.get("provider")?;
    Some((p.as_str()?, p.span))
}

fn check_node(node: &Node, provider: Option<(&str, Span)>, out: &mut Vec<Diagnostic>) {
    let Some(NodeKind::Seq(skills)) = node.get("skills").map(|s| &s.kind) else {
        return;
    };
    let (name, provider_span) = provider.map_or(("claude", None), |(p, s)| (p, Some(s)));
    for s in skills {
        let Some(text) = s.as_str() else { continue };
        let Ok(SkillRef::Agent(runtime)) = parse_skill(text) else {
            continue;
        };
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml;

    fn codes(text: &str, _: Option<()>) -> Vec<(&'static str, usize)> {
        let root = yaml::parse(text).expect("yaml");
        let mut out = Vec::new();
        check(&root, &mut out);
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
    fn cli_tools_are_not_checked_by_validation() {
        // Whether `jq` is on the guest's PATH depends on the image: `apply` checks it.
        let text =
            "kind: agent\nname: a\nagent:\n  prompt: hi\n  skills: [\"cli:awk\", \"cli:jq\"]\n";
        assert!(codes(text, None).is_empty());
    }

    fn runs(program: &str, args: &[&str]) -> Vec<&'static str> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        command_runtimes(program, &args)
    }

    #[test]
    fn runtime_programs_are_found_by_name_and_as_script_commands() {
        assert_eq!(runs("codex", &["--version"]), ["codex"]);
        assert_eq!(runs("claude", &[]), ["claude"]);
        assert!(runs("/usr/bin/codex", &[]).is_empty());
        assert!(runs("echo", &["codex"]).is_empty());
        for script in [
            "codex --version",
            "set -e; codex --version",
            "echo hi && codex exec 'x'",
            "v=$(codex --version); echo $v",
            "if true; then codex; fi",
            "FOO=1 BAR=2 codex",
            "env codex",
            "true\n  codex --version\n",
            "echo `codex --version`",
            "(codex)",
        ] {
            assert_eq!(runs("sh", &["-c", script]), ["codex"], "{script}");
        }
        assert_eq!(
            runs(
                "/bin/bash",
                &["-euc", "claude --version && codex --version"]
            ),
            ["claude", "codex"]
        );
        assert_eq!(runs("sh", &["-e", "-c", "claude -p hi"]), ["claude"]);
        for script in [
            "echo codex",
            "cat codex.txt",
            "grep -r claude .",
            "echo 'codex --version'",
            "# codex\ntrue",
            "x=codex",
            "./codex",
        ] {
            assert!(runs("sh", &["-c", script]).is_empty(), "{script}");
        }
        // Not a shell's `-c`: a script file, or a program that is not a shell.
        assert!(runs("sh", &["script.sh", "codex"]).is_empty());
        assert!(runs("python3", &["-c", "codex"]).is_empty());
        assert!(runs("bin/sh", &["-c", "codex"]).is_empty());
    }
}
