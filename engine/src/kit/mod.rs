//! Skills kits: an agent node's skills staged on the host, secrets redacted, before they
//! reach the guest (issue 13, item 4).
//!
//! A kit is a directory tree (paths relative to the kit root):
//! - `skills/<name>/SKILL.md` for every skill, plus every other file of a `file:` skill
//!   directory at its relative path (`scripts/`, `references/`, `assets/` and any other
//!   file; entries whose name starts with `.` are skipped — VCS metadata, `.env` files);
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
//! a NUL byte) are copied untouched and counted. The spec model has no field naming prompt
//! files (`AGENTS.md`, `CLAUDE.md`), so kits carry none yet.
//!
//! The guest sees the kit's `skills/` at [`GUEST_KIT_ROOT`]`/skills` (where Claude Code
//! discovers `<name>/SKILL.md`), written read-only.

pub mod cli;
mod manifest;
mod redact;
mod stage;
#[cfg(test)]
mod tests;

use std::path::Path;

use serde::Serialize;

pub use redact::{Secrets, MIN_SECRET_LEN, REDACTED};
pub use stage::write_dir;

use crate::plan::{Action, PlanNode};
use crate::spec::model::SkillEntry;

/// Most files one kit may hold.
pub const MAX_FILES: usize = 256;
/// Most bytes one kit may hold.
pub const MAX_BYTES: u64 = 8 << 20;
/// Guest directory the kit root maps to (`skills/x/SKILL.md` lands in
/// `/home/sandbox/.claude/skills/x/SKILL.md`).
pub const GUEST_KIT_ROOT: &str = "/home/sandbox/.claude";

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
    /// The skill it belongs to.
    pub skill: String,
}

impl KitFile {
    /// Absolute guest path.
    pub fn guest_path(&self) -> String {
        format!("{GUEST_KIT_ROOT}/{}", self.path)
    }

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
}

/// A staged kit, in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kit {
    /// Staged files, in skill order then path order.
    pub files: Vec<KitFile>,
    /// Skill names in spec order.
    pub skill_names: Vec<String>,
}

impl Kit {
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
#[error("skill `{skill}`: {message}")]
pub struct KitError {
    /// The skill as written in the spec.
    pub skill: String,
    /// What went wrong.
    pub message: String,
}

/// Stages `skills` (relative paths against `spec_dir`) in memory, redacting `secrets`.
/// `agent:`, `cli:` and OCI skills stage nothing (they are not files); `remote:` and MCP
/// skills are refused (not supported yet).
pub fn build(spec_dir: &Path, skills: &[SkillEntry], secrets: &Secrets) -> Result<Kit, KitError> {
    stage::build(spec_dir, skills, secrets)
}

/// The kit of `node`, with [`Secrets::for_node`]; `None` for a node that is not an agent.
pub fn for_node(spec_dir: &Path, node: &PlanNode) -> Option<Result<Kit, KitError>> {
    match &node.action {
        Action::Agent(a) => Some(build(spec_dir, &a.skills, &Secrets::for_node(node))),
        _ => None,
    }
}
