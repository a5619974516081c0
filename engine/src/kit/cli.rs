//! `voidbox skills SPEC`: stages every agent node's kit and reports it, per skill: files,
//! bytes, redactions (and, with `--output json`, each kit's manifest).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Value};

use super::Kit;
use crate::plan::Plan;

/// Exit code of a kit that cannot be staged (a missing skill directory, a refused file).
pub const EXIT_KIT: u8 = 3;

/// `voidbox skills` arguments.
#[derive(Debug, clap::Args)]
pub struct SkillsArgs {
    /// The spec file.
    pub file: PathBuf,
    /// What stdout carries.
    #[arg(long, value_enum, default_value_t = SkillsFormat::Text)]
    pub output: SkillsFormat,
    /// Keep the kits in DIR (`DIR/<node>/`; DIR must not exist or be empty) instead of a
    /// temporary directory removed on exit.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// `voidbox skills --output` formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SkillsFormat {
    /// One line per skill.
    Text,
    /// One JSON document: per node its skills and manifest.
    Json,
}

/// Runs `voidbox skills` on a loaded plan (fetching its `remote:` skills first).
pub fn skills_cmd(plan: &Plan, args: &SkillsArgs) -> ExitCode {
    let remotes = match super::fetch_remotes(plan, &|k| std::env::var(k).ok(), None) {
        Ok(r) => r,
        Err(failures) => {
            for f in failures {
                eprintln!("error: agent box `{}`: {}", f.node, f.error);
            }
            return ExitCode::from(EXIT_KIT);
        }
    };
    let mut kits: Vec<(String, Kit)> = Vec::new();
    for node in plan.graph.node_weights() {
        match super::for_node(plan, &remotes, node, &|k| std::env::var(k).ok()) {
            None => {}
            Some(Ok(k)) => kits.push((node.name.clone(), k)),
            Some(Err(e)) => {
                eprintln!("error: agent box `{}`: {e}", node.name);
                return ExitCode::from(EXIT_KIT);
            }
        }
    }
    let kept = match write_all(&kits, args.out.as_deref()) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let text = match args.output {
        SkillsFormat::Text => text(&kits, kept.as_deref()),
        SkillsFormat::Json => {
            let doc = json(&kits, kept.as_deref());
            serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
        }
    };
    print!("{text}");
    ExitCode::SUCCESS
}

/// Writes each kit to `<root>/<node>/`, the whole tree built next to `out` and renamed into
/// place (or into a temporary directory, removed on return, without `out`). Returns `out`.
fn write_all(kits: &[(String, Kit)], out: Option<&Path>) -> Result<Option<PathBuf>, String> {
    let Some(out) = out else {
        let tmp = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        for (name, kit) in kits {
            super::write_dir(kit, &tmp.path().join(crate::names::file_component(name)))?;
        }
        return Ok(None);
    };
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Ok(mut rd) = std::fs::read_dir(out) {
        if rd.next().is_some() {
            return Err(format!("{} exists and is not empty", out.display()));
        }
    } else if out.symlink_metadata().is_ok() {
        return Err(format!("{} exists and is not a directory", out.display()));
    }
    let tmp = tempfile::Builder::new()
        .prefix(".voidbox-kits-")
        .tempdir_in(parent)
        .map_err(|e| format!("{}: {e}", parent.display()))?;
    for (name, kit) in kits {
        super::write_dir(kit, &tmp.path().join(crate::names::file_component(name)))?;
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", tmp.path().display()))?;
    }
    std::fs::rename(tmp.path(), out).map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = tmp.keep();
    Ok(Some(out.to_path_buf()))
}

fn text(kits: &[(String, Kit)], out: Option<&Path>) -> String {
    let mut s = String::new();
    if kits.is_empty() {
        s.push_str("no agent boxes: nothing to stage\n");
    }
    for (node, kit) in kits {
        let _ = writeln!(s, "{node}:");
        let summary = kit.summary();
        if summary.is_empty() && kit.instructions.is_none() {
            s.push_str("  (no file or inline skills, no prompt files)\n");
        }
        for k in summary {
            let _ = write!(
                s,
                "  {}: {} file{}, {} bytes, {} redaction{}",
                k.name,
                k.files,
                if k.files == 1 { "" } else { "s" },
                k.bytes,
                k.redactions,
                if k.redactions == 1 { "" } else { "s" },
            );
            if k.binary_files > 0 {
                let _ = write!(s, " ({} binary, not redacted)", k.binary_files);
            }
            s.push('\n');
        }
        if let Some(i) = &kit.instructions {
            let _ = writeln!(
                s,
                "  {} (from {}): {} bytes, {} redaction{}",
                i.path,
                i.sources.join(", "),
                i.bytes,
                i.redactions,
                if i.redactions == 1 { "" } else { "s" },
            );
        }
    }
    if let Some(out) = out {
        let _ = writeln!(s, "kits written to {}", out.display());
    }
    s
}

fn json(kits: &[(String, Kit)], out: Option<&Path>) -> Value {
    let nodes: Vec<Value> = kits
        .iter()
        .map(|(node, kit)| {
            json!({
                "name": node,
                "dir": out.map(|o| o.join(crate::names::file_component(node)).display().to_string()),
                "skills": kit.summary(),
                "instructions": kit.instructions,
                "manifest": kit.manifest(),
            })
        })
        .collect();
    json!({ "nodes": nodes })
}
