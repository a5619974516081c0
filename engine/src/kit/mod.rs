//! Skills kits: an agent node's skills staged on the host, secrets redacted, before they
//! reach the guest (issue 13, item 4).
//!
//! A kit is a directory tree (paths relative to the kit root):
//! - `skills/<name>/SKILL.md` for every skill, plus every other file of a `file:` skill
//!   directory at its relative path (`scripts/`, `references/`, `assets/` and any other
//!   file; entries whose name starts with `.` are skipped — VCS metadata, `.env` files);
//! - the runtime's instructions file (`CLAUDE.md` for Claude Code, `AGENTS.md` for Codex):
//!   the spec's `prompt_files`, in order, joined by a blank line;
//! - `manifest.json`: the kit's files with their kit-relative and guest paths, sizes,
//!   SHA-256 and redaction counts, and a per-skill summary — never a host path.
//!
//! A plain markdown or text skill (`file:notes.md`, an inline skill) becomes
//! `skills/<name>/SKILL.md`, with generated YAML frontmatter (`name`, `description`) when
//! it has none; its name is made an Agent Skills name (`My Notes.md` → `my-notes`). Symlinks are followed only to a regular file inside the skill directory;
//! anything else (a link out of it, a link to a directory, a FIFO, a socket, a device) is
//! refused. A kit holds at most [`MAX_FILES`] files and [`MAX_BYTES`] bytes.
//!
//! Every UTF-8 text file is redacted with [`Secrets`]; binary files (not UTF-8, or holding
//! a NUL byte) are copied untouched and counted; prompt files must be text.
//!
//! The kit root maps to the runtime's configuration directory ([`Layout`]), written
//! read-only: `~/.claude` (skills in `~/.claude/skills/<name>/SKILL.md`, instructions in
//! `~/.claude/CLAUDE.md`, both where Claude Code discovers them) or `~/.codex` (Codex's
//! `skills/` and `AGENTS.md`).

pub mod cli;
mod manifest;
mod redact;
pub mod remote;
mod stage;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use redact::{Secrets, MIN_SECRET_LEN, REDACTED};
pub use stage::write_dir;

use crate::plan::{Action, Plan, PlanNode};
use crate::providers::Runtime;
use crate::spec::model::SkillEntry;

/// Most files one kit may hold.
pub const MAX_FILES: usize = 256;
/// Most bytes one kit may hold.
pub const MAX_BYTES: u64 = 8 << 20;

/// Where a kit lands in the guest for one runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Guest directory the kit root maps to (the runtime's configuration directory).
    pub root: &'static str,
    /// The runtime's user-level instructions file, relative to `root`.
    pub instructions: &'static str,
}

impl Layout {
    /// Claude Code's (and the mock runtime's): `~/.claude`, `CLAUDE.md`.
    pub const CLAUDE: Layout = Layout {
        root: "/home/sandbox/.claude",
        instructions: "CLAUDE.md",
    };
    /// Codex's: `$CODEX_HOME` (`~/.codex`), `AGENTS.md`.
    pub const CODEX: Layout = Layout {
        root: "/home/sandbox/.codex",
        instructions: "AGENTS.md",
    };

    /// The layout of `runtime`.
    pub fn of(runtime: Runtime) -> Layout {
        match runtime {
            Runtime::Codex => Layout::CODEX,
            Runtime::ClaudeCode | Runtime::Mock => Layout::CLAUDE,
        }
    }

    /// Where the runtime discovers skills (`<dir>/<name>/SKILL.md`).
    pub fn skills_dir(&self) -> String {
        format!("{}/skills", self.root)
    }
}

/// One staged file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KitFile {
    /// Path relative to the kit root (`skills/<name>/…`, `/`-separated).
    pub path: String,
    /// Contents after redaction.
    pub data: Vec<u8>,
    /// UTF-8 text (redacted); `false`: binary, copied untouched.
    pub text: bool,
    /// The source file was executable.
    pub executable: bool,
    /// Secrets replaced in this file.
    pub redactions: u64,
    /// The skill it belongs to (empty for the instructions file).
    pub skill: String,
    /// Absolute guest path.
    pub guest: String,
}

impl KitFile {
    /// Guest file mode: read-only (`0o555` for executables, else `0o444`).
    pub fn guest_mode(&self) -> u32 {
        if self.executable {
            0o555
        } else {
            0o444
        }
    }
}

/// One skill of a kit, as reports show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkillSummary {
    /// Skill name (its directory under `skills/`).
    pub name: String,
    /// Files staged.
    pub files: u64,
    /// Bytes staged (after redaction).
    pub bytes: u64,
    /// Secrets replaced.
    pub redactions: u64,
    /// Binary files copied untouched (not redacted).
    pub binary_files: u64,
    /// Where a `remote:` skill came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteOrigin>,
}

/// What a `remote:` skill was fetched from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RemoteOrigin {
    /// The tarball URL.
    pub url: String,
    /// The commit, when the tarball names it.
    pub commit: Option<String>,
    /// The skill tree's digest (its cache entry).
    pub sha256: String,
    /// Served from the cache (a pinned commit), without the network.
    pub from_cache: bool,
}

/// The `remote:` skills fetched for a plan, by the skill as written (`remote:o/r/s@ref`).
/// Why `mcp:NAME` alone cannot run: nothing says how to start the server in the guest.
pub const MCP_NAME_ONLY: &str = "`mcp:NAME` names an MCP server without saying how to start it in the guest; give it as `{mcp: NAME, command: PROGRAM, args: [...], env: {...}}` with a program the VM has (the guest image, a `file:` skill's script, or an OCI skill)";

pub type Remotes = BTreeMap<String, remote::FetchedSkill>;

/// A `remote:` skill that could not be fetched.
#[derive(Debug, Clone)]
pub struct RemoteFailure {
    /// The agent node.
    pub node: String,
    /// The skill's index in the node's `skills`.
    pub index: usize,
    /// Why.
    pub error: remote::RemoteError,
}

/// Fetches every agent node's `remote:` skills (each distinct one once) into the cache
/// under `cache_root` (default: the image cache's root), the source configured through
/// `env` ([`remote::RemoteSource::from_env`]). Every failure is returned, none hidden.
pub fn fetch_remotes(
    plan: &Plan,
    env: &dyn Fn(&str) -> Option<String>,
    cache_root: Option<&Path>,
) -> Result<Remotes, Vec<RemoteFailure>> {
    let mut out = Remotes::new();
    let mut failed: BTreeMap<String, remote::RemoteError> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut source: Option<Result<remote::RemoteSource, String>> = None;
    for node in plan.graph.node_weights() {
        let Action::Agent(a) = &node.action else {
            continue;
        };
        for (index, s) in a.skills.iter().enumerate() {
            let SkillEntry::Simple(text) = s else {
                continue;
            };
            let Some(value) = text.strip_prefix("remote:") else {
                continue;
            };
            let fail = |message: String| remote::RemoteError {
                skill: text.clone(),
                message,
            };
            let result = if let Some(f) = out.get(text) {
                Ok(f.clone())
            } else if let Some(e) = failed.get(text) {
                Err(e.clone())
            } else {
                let src =
                    source.get_or_insert_with(|| remote::RemoteSource::from_env(env, cache_root));
                let r = match (&*src, remote::RemoteRef::parse(value)) {
                    (Err(e), _) => Err(fail(e.clone())),
                    (_, Err(e)) => Err(fail(e)),
                    (Ok(src), Ok(r)) => remote::fetch(src, &r),
                };
                match &r {
                    Ok(f) => {
                        out.insert(text.clone(), f.clone());
                    }
                    Err(e) => {
                        failed.insert(text.clone(), e.clone());
                    }
                }
                r
            };
            if let Err(error) = result {
                failures.push(RemoteFailure {
                    node: node.name.clone(),
                    index,
                    error,
                });
            }
        }
    }
    if failures.is_empty() {
        Ok(out)
    } else {
        Err(failures)
    }
}

/// The instructions file of a kit, as reports show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstructionsSummary {
    /// Guest path (`/home/sandbox/.claude/CLAUDE.md`).
    pub path: String,
    /// The prompt files joined into it, by file name, in order.
    pub sources: Vec<String>,
    /// Bytes (after redaction).
    pub bytes: u64,
    /// Secrets replaced.
    pub redactions: u64,
}

/// What reports show of a kit: per skill, and its instructions file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KitSummary {
    /// Per skill, in spec order.
    pub skills: Vec<SkillSummary>,
    /// The instructions file, when the spec names prompt files.
    pub instructions: Option<InstructionsSummary>,
}

/// A staged kit, in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kit {
    /// Where it lands in the guest.
    pub layout: Layout,
    /// Staged files: skills in spec order (each `SKILL.md` first, then path order), then
    /// the instructions file.
    pub files: Vec<KitFile>,
    /// Skill names in spec order.
    pub skill_names: Vec<String>,
    /// The instructions file's sources and counts, when the spec names prompt files.
    pub instructions: Option<InstructionsSummary>,
    /// Where each `remote:` skill came from, by skill name.
    pub origins: BTreeMap<String, RemoteOrigin>,
}

impl Kit {
    /// What reports show.
    pub fn report(&self) -> KitSummary {
        KitSummary {
            skills: self.summary(),
            instructions: self.instructions.clone(),
        }
    }

    /// Per-skill counts, in spec order.
    pub fn summary(&self) -> Vec<SkillSummary> {
        self.skill_names
            .iter()
            .map(|name| {
                let mut s = SkillSummary {
                    name: name.clone(),
                    files: 0,
                    bytes: 0,
                    redactions: 0,
                    binary_files: 0,
                    remote: self.origins.get(name).cloned(),
                };
                for f in self.files.iter().filter(|f| &f.skill == name) {
                    s.files += 1;
                    s.bytes += f.data.len() as u64;
                    s.redactions += f.redactions;
                    s.binary_files += u64::from(!f.text);
                }
                s
            })
            .collect()
    }

    /// The `manifest.json` document.
    pub fn manifest(&self) -> serde_json::Value {
        manifest::manifest(self)
    }
}

/// Why a kit could not be staged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} `{skill}`: {message}")]
pub struct KitError {
    /// What failed: `skill`, `prompt file` or `llm`.
    pub kind: &'static str,
    /// The skill (or prompt file, or field) as written in the spec.
    pub skill: String,
    /// What went wrong.
    pub message: String,
}

/// What a kit is staged from.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    /// The spec file's directory (relative `file:` paths start there).
    pub spec_dir: &'a Path,
    /// The skills, as the plan has them.
    pub skills: &'a [SkillEntry],
    /// The prompt files (host paths, resolved by the plan), in order.
    pub prompt_files: &'a [PathBuf],
    /// Where the kit lands in the guest.
    pub layout: Layout,
    /// The `remote:` skills fetched ([`fetch_remotes`]); one missing here is an error.
    pub remotes: &'a Remotes,
}

/// Stages a kit in memory, redacting `secrets`. `agent:`, `cli:` and OCI skills stage
/// nothing (they are not files; OCI skills are disks, MCP servers are started by the
/// runtime); a bare `mcp:NAME` is refused; a `remote:` skill is staged from its fetched
/// directory like a `file:` skill directory.
pub fn build(src: &Sources<'_>, secrets: &Secrets) -> Result<Kit, KitError> {
    stage::build(src, secrets)
}

/// The kit of `plan`'s `node`, with [`Secrets::for_node`] and the layout of the runtime its
/// `llm` selects (overrides read through `env`); `None` for a node that is not an agent.
pub fn for_node(
    plan: &Plan,
    remotes: &Remotes,
    node: &PlanNode,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<Result<Kit, KitError>> {
    let Action::Agent(a) = &node.action else {
        return None;
    };
    let runtime = match crate::providers::runtime_of(&a.llm, env) {
        Ok(r) => r,
        Err(e) => {
            return Some(Err(KitError {
                kind: "llm",
                skill: "provider".into(),
                message: e.to_string(),
            }))
        }
    };
    let src = Sources {
        spec_dir: &plan.spec_dir,
        skills: &a.skills,
        prompt_files: &a.prompt_files,
        layout: Layout::of(runtime),
        remotes,
    };
    Some(build(&src, &Secrets::for_node(node)))
}
