//! Agent boxes: the skills copied into the guest (the node's kit, where its runtime
//! discovers skills) and the report's statistics of what the runtime said
//! ([`crate::agent_output`]). How each runtime starts is in [`super::launch`].

use crate::agent_output::AgentOutcome;
use crate::providers::Endpoint;
use crate::scheduler::AgentStats;

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

/// The kit of an agent ([`crate::kit`], `secrets` redacted) as guest files where its
/// runtime discovers them (read-only), with the kit's summary for the report.
pub fn kit_files(
    src: &crate::kit::Sources<'_>,
    secrets: &crate::kit::Secrets,
) -> Result<(Vec<GuestFile>, crate::kit::KitSummary), String> {
    let kit = crate::kit::build(src, secrets).map_err(|e| e.to_string())?;
    let files = kit
        .files
        .iter()
        .map(|f| GuestFile {
            path: f.guest.clone(),
            data: f.data.clone(),
            mode: f.guest_mode(),
        })
        .collect();
    Ok((files, kit.report()))
}

/// The report's statistics of an agent attempt from what its runtime reported; a local
/// endpoint and the mock runtime cost nothing (Claude Code prices tokens at list price
/// whatever the endpoint; the mock's script may name a cost, but no money was spent).
pub fn stats(outcome: &AgentOutcome, endpoint: &Endpoint) -> AgentStats {
    AgentStats {
        runtime: super::launch::runtime_name(endpoint.runtime).into(),
        provider: endpoint.provider.as_str().into(),
        model: outcome.model.clone().or_else(|| endpoint.model.clone()),
        input_tokens: outcome.input_tokens,
        output_tokens: outcome.output_tokens,
        cached_tokens: outcome.cached_tokens,
        cost_usd: if endpoint.local || endpoint.runtime == crate::providers::Runtime::Mock {
            0.0
        } else {
            outcome.cost_usd
        },
        num_turns: outcome.turns,
        tool_calls: outcome.tool_calls.clone(),
        tool_timings: outcome.tool_timings.clone(),
        skills: outcome.skills.clone(),
        mcp_servers: outcome.mcp_servers.clone(),
        warnings: outcome.warnings.clone(),
        result: outcome.result.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::Path;

    use crate::kit::{Layout, Remotes, Sources};
    use crate::spec::model::SkillEntry;

    static NO_REMOTES: Remotes = Remotes::new();

    fn sources<'a>(
        dir: &'a Path,
        skills: &'a [SkillEntry],
        prompt_files: &'a [std::path::PathBuf],
        layout: Layout,
    ) -> Sources<'a> {
        Sources {
            spec_dir: dir,
            skills,
            prompt_files,
            layout,
            remotes: &NO_REMOTES,
        }
    }

    #[test]
    fn the_kit_lands_where_each_runtime_discovers_it() {
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
        std::fs::write(d.path().join("AGENTS.md"), "Be brief.").unwrap();
        std::fs::write(d.path().join("CLAUDE.md"), "Never host-secret-value.\n").unwrap();
        let secrets = crate::kit::Secrets::new(["host-secret-value".to_string()]);
        let skills = [
            SkillEntry::Simple("file:skills/sum".into()),
            SkillEntry::Simple("file:plain.md".into()),
            SkillEntry::Simple("agent:claude-code".into()),
        ];
        let prompts = [d.path().join("AGENTS.md"), d.path().join("CLAUDE.md")];
        let (files, summary) = kit_files(
            &sources(d.path(), &skills, &prompts, Layout::CLAUDE),
            &secrets,
        )
        .unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "/home/sandbox/.claude/skills/sum/SKILL.md",
                "/home/sandbox/.claude/skills/sum/refs/a.md",
                "/home/sandbox/.claude/skills/plain/SKILL.md",
                "/home/sandbox/.claude/CLAUDE.md",
            ]
        );
        // What reaches the guest is the staged kit: redacted, plain skills with frontmatter,
        // the prompt files joined in order, all read-only.
        assert_eq!(files[1].data, b"key=[REDACTED]");
        assert_eq!(
            files[2].data,
            b"---\nname: \"plain\"\ndescription: \"p\"\n---\n\np"
        );
        assert_eq!(files[3].data, b"Be brief.\n\nNever [REDACTED].\n");
        assert!(files.iter().all(|f| f.mode == 0o444));
        let names: Vec<(&str, u64, u64)> = summary
            .skills
            .iter()
            .map(|k| (k.name.as_str(), k.files, k.redactions))
            .collect();
        assert_eq!(names, [("sum", 2, 1), ("plain", 1, 0)]);
        let i = summary.instructions.unwrap();
        assert_eq!(i.path, "/home/sandbox/.claude/CLAUDE.md");
        assert_eq!(i.sources, ["AGENTS.md", "CLAUDE.md"]);
        assert_eq!(i.redactions, 1);

        // Codex discovers them under its own home, its instructions in AGENTS.md.
        let none = crate::kit::Secrets::default();
        let plain = [SkillEntry::Simple("file:plain.md".into())];
        let (files, _) = kit_files(
            &sources(d.path(), &plain, &prompts[..1], Layout::CODEX),
            &none,
        )
        .unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/home/sandbox/.codex/skills/plain/SKILL.md",
                "/home/sandbox/.codex/AGENTS.md"
            ]
        );

        // A prompt file that is not text, or missing, is refused, naming it.
        std::fs::write(d.path().join("bin.md"), b"\0\x01").unwrap();
        for bad in ["bin.md", "missing.md"] {
            let p = [d.path().join(bad)];
            let e = kit_files(&sources(d.path(), &[], &p, Layout::CLAUDE), &none).unwrap_err();
            assert!(e.starts_with(&format!("prompt file `{bad}`: ")), "{e}");
        }
    }
}
