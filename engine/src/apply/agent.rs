//! Agent boxes: the skills copied into the guest (the node's kit, where its runtime
//! discovers skills) and the report's statistics of what the runtime said
//! ([`crate::agent_output`]). How each runtime starts is in [`super::runtime`].

use std::path::Path;

use super::scheduler::AgentStats;
use crate::agent_output::AgentOutcome;
use crate::providers::Endpoint;
use crate::spec::model::SkillEntry;

/// The mock runtime's path in the guest image.
pub const MOCK_RUNTIME: &str = "/opt/voidbox/runtimes/mock/bin/voidbox-mock-llm";
/// Default guest file the runtime writes its result to.
pub const DEFAULT_OUTPUT_FILE: &str = "/workspace/output.json";

/// A file to copy into the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestFile {
    /// Absolute guest path.
    pub path: String,
    /// Contents.
    pub data: Vec<u8>,
    /// File mode (kit files are read-only).
    pub mode: u32,
}

/// The skill files of an agent: its kit ([`crate::kit`]) staged from `skills` (resolved
/// against `spec_dir`, `secrets` redacted), its `skills/` laid out under `skills_root` (where
/// the node's runtime discovers them), with the kit's per-skill summary for the report.
pub fn skill_files(
    spec_dir: &Path,
    skills: &[SkillEntry],
    secrets: &crate::kit::Secrets,
    skills_root: &str,
) -> Result<(Vec<GuestFile>, Vec<crate::kit::SkillSummary>), String> {
    let kit = crate::kit::build(spec_dir, skills, secrets).map_err(|e| e.to_string())?;
    let mut files = Vec::with_capacity(kit.files.len());
    for f in &kit.files {
        let Some(rest) = f.path.strip_prefix("skills/") else {
            return Err(format!(
                "internal: kit file `{}` is not under skills/",
                f.path
            ));
        };
        files.push(GuestFile {
            path: format!("{skills_root}/{rest}"),
            data: f.data.clone(),
            mode: f.guest_mode(),
        });
    }
    Ok((files, kit.summary()))
}

/// The report's statistics of an agent attempt from what its runtime reported; a local
/// endpoint costs nothing (Claude Code prices tokens at list price whatever the endpoint).
pub fn stats(outcome: &AgentOutcome, endpoint: &Endpoint) -> AgentStats {
    AgentStats {
        runtime: super::runtime::runtime_name(endpoint.runtime).into(),
        provider: endpoint.provider.as_str().into(),
        model: outcome.model.clone().or_else(|| endpoint.model.clone()),
        input_tokens: outcome.input_tokens,
        output_tokens: outcome.output_tokens,
        cached_tokens: outcome.cached_tokens,
        // The mock's made-up cost stays (it stands in for a paid model in tests and demos).
        cost_usd: if endpoint.local && endpoint.runtime != crate::providers::Runtime::Mock {
            0.0
        } else {
            outcome.cost_usd
        },
        num_turns: outcome.turns,
        tool_calls: outcome.tool_calls.clone(),
        skills: outcome.skills.clone(),
        mcp_servers: outcome.mcp_servers.clone(),
        warnings: outcome.warnings.clone(),
        result: outcome.result.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skills_are_copied_under_the_claude_dir() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("skills/sum/refs")).unwrap();
        std::fs::write(
            d.path().join("skills/sum/SKILL.md"),
            "---\nname: sum\n---\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("skills/sum/refs/a.md"),
            "key=host-secret-value",
        )
        .unwrap();
        std::fs::write(d.path().join("plain.md"), "p").unwrap();
        let secrets = crate::kit::Secrets::new(["host-secret-value".to_string()]);
        let (files, summary) = skill_files(
            d.path(),
            &[
                SkillEntry::Simple("file:skills/sum".into()),
                SkillEntry::Simple("file:plain.md".into()),
                SkillEntry::Simple("agent:claude-code".into()),
            ],
            &secrets,
            "/home/sandbox/.claude/skills",
        )
        .unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "/home/sandbox/.claude/skills/sum/SKILL.md",
                "/home/sandbox/.claude/skills/sum/refs/a.md",
                "/home/sandbox/.claude/skills/plain/SKILL.md",
            ]
        );
        // What reaches the guest is the staged kit: redacted, plain skills with frontmatter,
        // read-only.
        assert_eq!(files[1].data, b"key=[REDACTED]");
        assert_eq!(
            files[2].data,
            b"---\nname: \"plain\"\ndescription: \"p\"\n---\n\np"
        );
        assert!(files.iter().all(|f| f.mode == 0o444));
        let names: Vec<(&str, u64, u64)> = summary
            .iter()
            .map(|k| (k.name.as_str(), k.files, k.redactions))
            .collect();
        assert_eq!(names, [("sum", 2, 1), ("plain", 1, 0)]);
        let none = crate::kit::Secrets::default();
        assert!(skill_files(
            d.path(),
            &[SkillEntry::Simple("remote:a/b".into())],
            &none,
            "/r"
        )
        .is_err());
        // Codex discovers them under its own home.
        let (files, _) = skill_files(
            d.path(),
            &[SkillEntry::Simple("file:plain.md".into())],
            &none,
            "/home/sandbox/.codex/skills",
        )
        .unwrap();
        assert_eq!(files[0].path, "/home/sandbox/.codex/skills/plain/SKILL.md");
    }
}
