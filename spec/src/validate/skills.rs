//! Skill checks: the `type:value` string syntax, `file:` targets, and the Agent Skills rules
//! for `SKILL.md` frontmatter.

use std::path::{Path, PathBuf};

use crate::diagnostic::{Diagnostic, Span};
use crate::suggest::did_you_mean;
use crate::validate::io_reason;
use crate::yaml::{self, Node, NodeKind};

/// The prefixes a skill string may use.
pub const SKILL_TYPES: [&str; 5] = ["agent", "file", "remote", "mcp", "cli"];

/// Largest SKILL.md read for validation.
const MAX_SKILL_FILE: u64 = 1024 * 1024;

/// A parsed skill string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkillRef<'a> {
    /// `agent:NAME`: the LLM agent CLI itself.
    Agent(&'a str),
    /// `file:PATH`: a local skill file or directory (relative to the spec file, else to the
    /// working directory, with a warning).
    File(&'a str),
    /// `remote:OWNER/REPO[/SKILL][@REF]`: a published skill (fetched by
    /// [`crate::skill_ref`]).
    Remote(&'a str),
    /// `mcp:NAME`: an MCP server available in the guest.
    Mcp(&'a str),
    /// `cli:NAME`: a CLI tool available in the guest.
    Cli(&'a str),
}

/// Parses a `type:value` skill string, explaining what is wrong when it is malformed.
pub fn parse_skill(s: &str) -> Result<SkillRef<'_>, (String, Option<String>)> {
    let Some((kind, value)) = s.split_once(':') else {
        return Err((
            format!("malformed skill `{s}`: expected `type:value`"),
            Some("types: `agent:`, `file:`, `remote:`, `mcp:`, `cli:` (for example `file:skills/review/SKILL.md`)".into()),
        ));
    };
    if value.trim().is_empty() {
        return Err((
            format!("malformed skill `{s}`: nothing after `{kind}:`"),
            None,
        ));
    }
    let simple_name = |v: &str| {
        !v.is_empty()
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | '/'))
    };
    match kind {
        "agent" | "mcp" | "cli" if !simple_name(value) => Err((
            format!("malformed skill `{s}`: `{value}` is not a valid {kind} name"),
            Some("names use letters, digits, `-`, `_`, `.`, `@` and `/`".into()),
        )),
        "agent" => Ok(SkillRef::Agent(value)),
        "mcp" => Ok(SkillRef::Mcp(value)),
        "cli" => Ok(SkillRef::Cli(value)),
        "file" => Ok(SkillRef::File(value)),
        "remote" => match crate::skill_ref::RemoteRef::parse(value) {
            Ok(_) => Ok(SkillRef::Remote(value)),
            Err(why) => Err((
                format!("malformed skill `{s}`: {why}"),
                Some("expected `remote:OWNER/REPO[/SKILL][@REF]`, REF a branch, tag or commit (for example `remote:obra/superpowers/brainstorming@v4.0.0`)".into()),
            )),
        },
        other => Err((
            format!("malformed skill `{s}`: unknown skill type `{other}`"),
            Some(match did_you_mean(other, SKILL_TYPES) {
                Some(t) => format!("did you mean `{t}:{value}`?"),
                None => "types: `agent:`, `file:`, `remote:`, `mcp:`, `cli:`".into(),
            }),
        )),
    }
}

/// Checks one skill string at `span`; `base` is the spec file's directory.
pub fn check_skill_string(s: &str, span: Span, base: &Path, out: &mut Vec<Diagnostic>) {
    match parse_skill(s) {
        Err((msg, help)) => out.push(
            Diagnostic::error("voidbox::invalid_skill", msg, span)
                .with_label("malformed skill")
                .with_help_opt(help),
        ),
        Ok(SkillRef::File(rel)) => check_file_skill(rel, span, base, out),
        Ok(_) => {}
    }
}

/// Where a `file:` skill's SKILL.md (if any) lives, and whether it follows Agent Skills rules.
fn check_file_skill(rel: &str, span: Span, base: &Path, out: &mut Vec<Diagnostic>) {
    let path = crate::validate::paths::resolve(base, rel, span, out).into_path();
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) => {
            out.push(
                Diagnostic::error(
                    "voidbox::skill_not_found",
                    format!("skill file `{rel}` not found ({})", io_reason(&e)),
                    span,
                )
                .with_label("no such file")
                .with_help(format!(
                    "paths are relative to the spec file's directory: {}",
                    base.display()
                )),
            );
            return;
        }
    };
    let skill_md: PathBuf = if meta.is_dir() {
        let md = path.join("SKILL.md");
        if !md.is_file() {
            out.push(
                Diagnostic::error(
                    "voidbox::skill_not_found",
                    format!("skill directory `{rel}` has no SKILL.md"),
                    span,
                )
                .with_help("an Agent Skills skill is a directory holding SKILL.md"),
            );
            return;
        }
        md
    } else if path.file_name().is_some_and(|n| n == "SKILL.md") {
        path.clone()
    } else {
        // A plain markdown skill (void-box style): accepted as it is.
        if let Err(e) = std::fs::File::open(&path) {
            out.push(Diagnostic::error(
                "voidbox::skill_not_found",
                format!("skill file `{rel}` cannot be read ({})", io_reason(&e)),
                span,
            ));
        }
        return;
    };
    let dir_name = skill_md
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match read_limited(&skill_md) {
        Ok(text) => {
            for problem in agent_skill_problems(&text, &dir_name) {
                out.push(
                    Diagnostic::error(
                        "voidbox::skill_frontmatter",
                        format!("{}: {}", skill_md_display(rel, meta.is_dir()), problem.message),
                        span,
                    )
                    .with_label(format!("SKILL.md line {}", problem.line))
                    .with_help("Agent Skills frontmatter: `name` (1-64 chars of a-z, 0-9, `-`, equal to the directory name) and `description` (1-1024 chars)"),
                );
            }
        }
        Err(e) => out.push(Diagnostic::error(
            "voidbox::skill_not_found",
            format!("cannot read `{}`: {e}", skill_md.display()),
            span,
        )),
    }
}

/// Checks one `prompt_files` entry at `span`: a readable UTF-8 file of at most 1 MiB.
pub fn check_prompt_file(rel: &str, span: Span, base: &Path, out: &mut Vec<Diagnostic>) {
    let path = crate::validate::paths::resolve(base, rel, span, out).into_path();
    let problem = match std::fs::metadata(&path) {
        Err(e) => Some(format!("prompt file `{rel}` not found ({})", io_reason(&e))),
        Ok(m) if !m.is_file() => Some(format!("prompt file `{rel}` is not a regular file")),
        Ok(_) => read_limited(&path)
            .err()
            .map(|why| format!("prompt file `{rel}` cannot be used: {why}")),
    };
    if let Some(message) = problem {
        out.push(
            Diagnostic::error("voidbox::prompt_file", message, span)
                .with_label("prompt file")
                .with_help(format!(
                    "an instruction file such as AGENTS.md or CLAUDE.md; paths are relative to the spec file's directory: {}",
                    base.display()
                )),
        );
    }
}

fn skill_md_display(rel: &str, is_dir: bool) -> String {
    if is_dir {
        format!("{}/SKILL.md", rel.trim_end_matches('/'))
    } else {
        rel.to_string()
    }
}

fn read_limited(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| io_reason(&e))?;
    if meta.len() > MAX_SKILL_FILE {
        return Err(format!("larger than {MAX_SKILL_FILE} bytes"));
    }
    let bytes = std::fs::read(path).map_err(|e| io_reason(&e))?;
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())
}

/// One Agent Skills rule violation, with its 1-based line in SKILL.md.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillProblem {
    /// Line in SKILL.md.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Checks SKILL.md text against the Agent Skills frontmatter rules. `dir_name` is the name of
/// the directory holding SKILL.md. Unknown frontmatter keys are tolerated.
pub fn agent_skill_problems(text: &str, dir_name: &str) -> Vec<SkillProblem> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let problem = |line: usize, message: String| SkillProblem { line, message };
    let mut lines = text.split_inclusive('\n');
    if lines.next().map(str::trim_end) != Some("---") {
        return vec![problem(
            1,
            "missing YAML frontmatter (a `---` block with `name` and `description`)".into(),
        )];
    }
    let mut body_len = 0usize;
    let mut closing = None;
    for (i, line) in lines.enumerate() {
        if line.trim_end() == "---" {
            closing = Some(i + 2);
            break;
        }
        body_len += line.len();
    }
    let Some(closing_line) = closing else {
        return vec![problem(
            1,
            "frontmatter is not closed by a `---` line".into(),
        )];
    };
    let start = text.find('\n').map_or(text.len(), |p| p + 1);
    let front = &text[start..start + body_len];
    let line_of = |offset: usize| crate::diagnostic::line_col(front, offset).0 + 1;
    let root = match yaml::parse(front) {
        Ok(root) => root,
        Err(e) if e.code == "voidbox::empty_file" => {
            return vec![problem(
                closing_line,
                "frontmatter is empty: `name` and `description` are required".into(),
            )]
        }
        Err(e) => {
            return vec![problem(
                line_of(e.span.offset),
                format!("frontmatter is not valid YAML: {}", e.message),
            )]
        }
    };
    if !matches!(root.kind, NodeKind::Map(_)) {
        return vec![problem(
            2,
            "frontmatter must be a mapping of keys to values".into(),
        )];
    }
    let mut problems = Vec::new();
    match root.get("name") {
        None => problems.push(problem(2, "frontmatter has no `name`".into())),
        Some(node) => {
            match scalar_text(node) {
                None => problems.push(problem(
                    line_of(node.span.offset),
                    "`name` must be a string".into(),
                )),
                Some(name) => {
                    let line = line_of(node.span.offset);
                    let len = name.chars().count();
                    if !(1..=64).contains(&len) {
                        problems.push(problem(
                            line,
                            format!("`name` must be 1-64 characters, it has {len}"),
                        ));
                    }
                    if !name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    {
                        problems.push(problem(line, format!("`name` `{name}` may only use lowercase letters, digits and hyphens")));
                    }
                    if name.starts_with('-') || name.ends_with('-') {
                        problems.push(problem(
                            line,
                            format!("`name` `{name}` must not start or end with a hyphen"),
                        ));
                    }
                    if name.contains("--") {
                        problems.push(problem(
                            line,
                            format!("`name` `{name}` must not contain consecutive hyphens"),
                        ));
                    }
                    if name != dir_name {
                        problems.push(problem(
                            line,
                            format!("`name` `{name}` must equal its directory name `{dir_name}`"),
                        ));
                    }
                }
            }
        }
    }
    match root.get("description") {
        None => problems.push(problem(2, "frontmatter has no `description`".into())),
        Some(node) => match scalar_text(node) {
            None => problems.push(problem(
                line_of(node.span.offset),
                "`description` must be a string".into(),
            )),
            Some(d) => {
                let len = d.trim().chars().count();
                if !(1..=1024).contains(&len) {
                    problems.push(problem(
                        line_of(node.span.offset),
                        format!("`description` must be 1-1024 characters, it has {len}"),
                    ));
                }
            }
        },
    }
    problems
}

fn scalar_text(node: &Node) -> Option<String> {
    match &node.kind {
        NodeKind::Str(s) => Some(s.clone()),
        NodeKind::Number(n) => Some(n.to_string()),
        NodeKind::Bool(b) => Some(b.to_string()),
        NodeKind::Null => Some(String::new()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_skill_strings() {
        assert_eq!(
            parse_skill("agent:claude-code"),
            Ok(SkillRef::Agent("claude-code"))
        );
        assert_eq!(
            parse_skill("remote:obra/superpowers/brainstorming"),
            Ok(SkillRef::Remote("obra/superpowers/brainstorming"))
        );
        assert!(parse_skill("remote:justname").is_err());
        for ok in [
            "remote:obra/superpowers/brainstorming@v4.0.0",
            "remote:o/r@0123456789abcdef0123456789abcdef01234567",
            "remote:o/r/s@feature/x-1.2",
        ] {
            assert_eq!(parse_skill(ok), Ok(SkillRef::Remote(&ok[7..])), "{ok}");
        }
        for bad in [
            "remote:o/r@",
            "remote:o/r@-x",
            "remote:o/r@a..b",
            "remote:o/r@a b",
            "remote:o/r/s/t",
            "remote:o/../s",
        ] {
            let (msg, help) = parse_skill(bad).expect_err(bad);
            assert!(
                msg.starts_with(&format!("malformed skill `{bad}`: ")),
                "{msg}"
            );
            assert!(help.is_some_and(|h| h.contains("@REF")), "{bad}");
        }
        let long = format!("remote:o/r@{}", "a".repeat(201));
        assert!(parse_skill(&long).is_err());
        assert!(parse_skill("nocolon").is_err());
        assert!(parse_skill("cli:").is_err());
        assert!(parse_skill("cli:has space").is_err());
        let (_, help) = parse_skill("fiel:x.md").expect_err("typo");
        assert_eq!(help.as_deref(), Some("did you mean `file:x.md`?"));
    }

    #[test]
    fn agent_skill_rules() {
        let ok = "---\nname: code-review\ndescription: Reviews code.\nlicense: MIT\n---\n# Body\n";
        assert!(agent_skill_problems(ok, "code-review").is_empty());
        let bad = "---\nname: Code--Review-\ndescription: \"\"\n---\n";
        let p = agent_skill_problems(bad, "code-review");
        let msgs: Vec<_> = p.iter().map(|p| p.message.as_str()).collect();
        assert!(msgs.iter().any(|m| m.contains("lowercase")), "{msgs:?}");
        assert!(msgs.iter().any(|m| m.contains("start or end")), "{msgs:?}");
        assert!(msgs.iter().any(|m| m.contains("consecutive")), "{msgs:?}");
        assert!(
            msgs.iter().any(|m| m.contains("directory name")),
            "{msgs:?}"
        );
        assert!(msgs.iter().any(|m| m.contains("description")), "{msgs:?}");
        assert!(p.iter().all(|p| p.line == 2 || p.line == 3), "{p:?}");
        assert_eq!(agent_skill_problems("# no frontmatter\n", "x")[0].line, 1);
        assert!(agent_skill_problems("---\nname: x\n", "x")[0]
            .message
            .contains("not closed"));
        let long = format!("---\nname: x\ndescription: {}\n---\n", "d".repeat(1025));
        assert!(agent_skill_problems(&long, "x")[0]
            .message
            .contains("1-1024"));
    }
}
