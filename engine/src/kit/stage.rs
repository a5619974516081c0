//! Staging: skill sources read from the host into kit files, and a kit written to a
//! directory atomically.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{InstructionsSummary, Kit, KitError, KitFile, Secrets, Sources, MAX_BYTES, MAX_FILES};
use crate::spec::host_path;
use crate::spec::model::SkillEntry;
use crate::validate::skills::{parse_skill, SkillRef};

/// Longest generated `description`, in characters.
const MAX_DESCRIPTION: usize = 200;
/// Deepest directory level walked inside a skill directory.
const MAX_DEPTH: usize = 16;

struct Stager<'a> {
    secrets: &'a Secrets,
    kit: Kit,
    bytes: u64,
    names: BTreeSet<String>,
}

pub(super) fn build(src: &Sources<'_>, secrets: &Secrets) -> Result<Kit, KitError> {
    let mut st = Stager {
        secrets,
        kit: Kit {
            layout: src.layout,
            files: Vec::new(),
            skill_names: Vec::new(),
            instructions: None,
            origins: Default::default(),
        },
        bytes: 0,
        names: BTreeSet::new(),
    };
    let spec_dir = src.spec_dir;
    for s in src.skills {
        let label = label(s);
        let err = |message: String| KitError {
            kind: "skill",
            skill: label.clone(),
            message,
        };
        match s {
            SkillEntry::Inline(i) => {
                let name = st.claim(&agent_skill_name(&i.name)).map_err(err)?;
                st.markdown(&name, i.content.as_bytes(), false)
                    .map_err(err)?;
            }
            SkillEntry::Simple(text) => match parse_skill(text) {
                Ok(SkillRef::File(rel)) => {
                    let path = host_path::resolve(spec_dir, rel).into_path();
                    st.file_skill(&path).map_err(err)?;
                }
                Ok(SkillRef::Agent(_) | SkillRef::Cli(_)) => {}
                Ok(SkillRef::Remote(value)) => {
                    let Some(f) = src.remotes.get(text) else {
                        return Err(err(format!(
                            "internal: `remote:{value}` was not fetched before staging"
                        )));
                    };
                    let r = super::remote::RemoteRef::parse(value).map_err(err)?;
                    // Named after the skill (the cache directory is named by its digest).
                    let name = st.claim(&safe_name(r.name())).map_err(err)?;
                    st.dir_skill(&name, &f.dir).map_err(err)?;
                    st.kit.origins.insert(
                        name,
                        super::RemoteOrigin {
                            url: f.url.clone(),
                            commit: f.commit.clone(),
                            sha256: f.sha256.clone(),
                            from_cache: f.from_cache,
                        },
                    );
                }
                Ok(SkillRef::Mcp(_)) => return Err(err(super::MCP_NAME_ONLY.into())),
                Err((why, _)) => return Err(err(why)),
            },
            // Attached as its own disk (`crate::node::oci_images`), not a kit file.
            SkillEntry::Oci(_) => {}
            // Started by the runtime from its MCP configuration (`crate::node::launch`).
            SkillEntry::Mcp(_) => {}
        }
    }
    st.instructions(src.prompt_files)?;
    Ok(st.kit)
}

/// How a skill is named in errors: as written in the spec.
fn label(s: &SkillEntry) -> String {
    match s {
        SkillEntry::Simple(t) => t.clone(),
        SkillEntry::Inline(i) => i.name.clone(),
        SkillEntry::Oci(o) => o.image.clone(),
        SkillEntry::Mcp(m) => format!("mcp {}", m.mcp),
    }
}

/// A skill or path component as a file name: `[A-Za-z0-9._-]`, anything else `_`; never
/// empty, `.` or `..`.
fn safe_name(s: &str) -> String {
    let n: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if n.is_empty() || n.chars().all(|c| c == '.') {
        n.replace('.', "_") + "_"
    } else {
        n
    }
}

/// A plain or inline skill's name as Agent Skills requires it (it becomes the directory
/// and the generated frontmatter's `name`): 1-64 of `a-z`, `0-9` and single inner hyphens.
fn agent_skill_name(s: &str) -> String {
    let mut n = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            n.push(c.to_ascii_lowercase());
        } else if !n.is_empty() && !n.ends_with('-') {
            n.push('-');
        }
    }
    n.truncate(64);
    let n = n.trim_end_matches('-');
    if n.is_empty() {
        "skill".into()
    } else {
        n.to_string()
    }
}

impl Stager<'_> {
    fn claim(&mut self, name: &str) -> Result<String, String> {
        if !self.names.insert(name.to_string()) {
            return Err(format!(
                "a second skill named `{name}` (skill names must be unique in a kit)"
            ));
        }
        self.kit.skill_names.push(name.to_string());
        Ok(name.to_string())
    }

    /// Adds `data` as `skills/<skill>/<rel>`; text is redacted, then passed to `finish`.
    fn add(
        &mut self,
        skill: &str,
        rel: &str,
        data: Vec<u8>,
        executable: bool,
        finish: impl FnOnce(String) -> String,
    ) -> Result<(), String> {
        let text = !data.contains(&0) && std::str::from_utf8(&data).is_ok();
        let (data, redactions) = match std::str::from_utf8(&data) {
            Ok(t) if text => {
                let (r, n) = self.secrets.redact(t);
                (finish(r).into_bytes(), n)
            }
            _ => (data, 0),
        };
        self.charge(data.len())?;
        let path = format!("skills/{skill}/{rel}");
        self.kit.files.push(KitFile {
            guest: format!("{}/{path}", self.kit.layout.root),
            path,
            data,
            text,
            executable,
            redactions,
            skill: skill.to_string(),
        });
        Ok(())
    }

    /// Counts `n` more bytes against the kit's limit.
    fn charge(&mut self, n: usize) -> Result<(), String> {
        self.bytes += n as u64;
        if self.kit.files.len() >= MAX_FILES {
            return Err(format!("the kit would hold more than {MAX_FILES} files"));
        }
        if self.bytes > MAX_BYTES {
            return Err(format!(
                "the kit would hold more than {} MiB",
                MAX_BYTES >> 20
            ));
        }
        Ok(())
    }

    /// The runtime's instructions file from `files` (redacted text, in order, a blank line
    /// between them); nothing when there are none.
    fn instructions(&mut self, files: &[PathBuf]) -> Result<(), KitError> {
        if files.is_empty() {
            return Ok(());
        }
        let mut joined = String::new();
        let mut sources = Vec::new();
        let mut redactions = 0;
        for path in files {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let err = |message: String| KitError {
                kind: "prompt file",
                skill: name.clone(),
                message,
            };
            let (data, _) = read_regular(path).map_err(err)?;
            let text = String::from_utf8(data)
                .ok()
                .filter(|t| !t.contains('\0'))
                .ok_or_else(|| err("not UTF-8 text".into()))?;
            let (text, n) = self.secrets.redact(&text);
            redactions += n;
            if !joined.is_empty() {
                joined.push_str(if joined.ends_with('\n') { "\n" } else { "\n\n" });
            }
            joined.push_str(&text);
            sources.push(name);
        }
        let layout = self.kit.layout;
        self.charge(joined.len()).map_err(|message| KitError {
            kind: "prompt file",
            skill: sources.join(", "),
            message,
        })?;
        let guest = format!("{}/{}", layout.root, layout.instructions);
        self.kit.instructions = Some(InstructionsSummary {
            path: guest.clone(),
            sources,
            bytes: joined.len() as u64,
            redactions,
        });
        self.kit.files.push(KitFile {
            path: layout.instructions.to_string(),
            guest,
            data: joined.into_bytes(),
            text: true,
            executable: false,
            redactions,
            skill: String::new(),
        });
        Ok(())
    }

    /// Adds `SKILL.md` for `skill`, with generated frontmatter when it has none.
    fn markdown(&mut self, skill: &str, data: &[u8], executable: bool) -> Result<(), String> {
        // Generated from the redacted text, so the description never repeats a secret.
        self.add(skill, "SKILL.md", data.to_vec(), executable, |t| {
            if has_frontmatter(&t) {
                t
            } else {
                with_frontmatter(skill, &t)
            }
        })
    }

    fn file_skill(&mut self, path: &Path) -> Result<(), String> {
        let meta = std::fs::metadata(path)
            .map_err(|e| format!("{}: {}", path.display(), crate::validate::io_reason(&e)))?;
        let stem = |p: &Path| p.file_stem().map(|s| safe_name(&s.to_string_lossy()));
        if meta.is_dir() {
            let name = path
                .file_name()
                .map(|s| safe_name(&s.to_string_lossy()))
                .unwrap_or_else(|| "skill".into());
            let name = self.claim(&name)?;
            return self.dir_skill(&name, path);
        }
        let name = if path.file_name().is_some_and(|n| n == "SKILL.md") {
            path.parent().and_then(stem)
        } else {
            path.file_stem()
                .map(|s| agent_skill_name(&s.to_string_lossy()))
        };
        let name = self.claim(&name.unwrap_or_else(|| "skill".into()))?;
        let (data, exec) = read_regular(path)?;
        self.markdown(&name, &data, exec)
    }

    /// Every file under `root` (dot-entries skipped), `SKILL.md` required.
    fn dir_skill(&mut self, name: &str, root: &Path) -> Result<(), String> {
        let canon = std::fs::canonicalize(root)
            .map_err(|e| format!("{}: {}", root.display(), crate::validate::io_reason(&e)))?;
        let walker = walkdir::WalkDir::new(root)
            .follow_links(false)
            .max_depth(MAX_DEPTH)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| e.depth() == 0 || !e.file_name().to_string_lossy().starts_with('.'));
        let mut seen_skill_md = false;
        for entry in walker {
            let entry = entry.map_err(|e| e.to_string())?;
            if entry.depth() == 0 {
                continue;
            }
            let Ok(rel) = entry.path().strip_prefix(root) else {
                continue;
            };
            let rel_str = rel
                .iter()
                .map(|c| safe_name(&c.to_string_lossy()))
                .collect::<Vec<_>>()
                .join("/");
            let ft = entry.file_type();
            if ft.is_dir() {
                continue;
            }
            let source = if ft.is_symlink() {
                inside_link(&canon, entry.path(), &rel_str)?
            } else if ft.is_file() {
                entry.path().to_path_buf()
            } else {
                return Err(format!(
                    "`{rel_str}` is not a regular file (FIFOs, sockets and devices are refused)"
                ));
            };
            let (data, exec) = read_regular(&source)?;
            if rel_str == "SKILL.md" {
                seen_skill_md = true;
                self.markdown(name, &data, exec)?;
            } else {
                self.add(name, &rel_str, data, exec, |t| t)?;
            }
        }
        if !seen_skill_md {
            return Err(format!(
                "the skill directory {} has no SKILL.md",
                root.display()
            ));
        }
        // SKILL.md first, then the rest in path order.
        self.kit.files.sort_by(|a, b| {
            let key = |f: &KitFile| {
                (
                    self.kit.skill_names.iter().position(|n| n == &f.skill),
                    !f.path.ends_with("/SKILL.md") || f.path.matches('/').count() != 2,
                    f.path.clone(),
                )
            };
            key(a).cmp(&key(b))
        });
        Ok(())
    }
}

/// The target of the symlink at `link` when it is a regular file inside `canon_root`.
fn inside_link(canon_root: &Path, link: &Path, rel: &str) -> Result<PathBuf, String> {
    let target = std::fs::canonicalize(link).map_err(|e| {
        format!(
            "`{rel}` is a dangling symlink ({})",
            crate::validate::io_reason(&e)
        )
    })?;
    if !target.starts_with(canon_root) {
        return Err(format!(
            "`{rel}` is a symlink out of the skill directory (refused)"
        ));
    }
    if !std::fs::metadata(&target).is_ok_and(|m| m.is_file()) {
        return Err(format!(
            "`{rel}` is a symlink to something other than a regular file (refused)"
        ));
    }
    Ok(target)
}

/// Reads a regular file (never blocking on a FIFO), bounded by the kit size.
fn read_regular(path: &Path) -> Result<(Vec<u8>, bool), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e: std::io::Error| format!("{}: {}", path.display(), crate::validate::io_reason(&e));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(format!(
            "{} is not a regular file (FIFOs, sockets and devices are refused)",
            path.display()
        ));
    }
    if meta.len() > MAX_BYTES {
        return Err(format!(
            "{} is larger than the kit limit of {} MiB",
            path.display(),
            MAX_BYTES >> 20
        ));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    File::take(f, MAX_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(io)?;
    Ok((data, meta.permissions().mode() & 0o111 != 0))
}

fn has_frontmatter(t: &str) -> bool {
    let t = t.strip_prefix('\u{feff}').unwrap_or(t);
    t.starts_with("---\n") || t.starts_with("---\r\n")
}

/// `text` with `name` / `description` frontmatter: the description is the first line of
/// prose (a heading's text when there is no prose), else `Skill <name>`.
pub(super) fn with_frontmatter(name: &str, text: &str) -> String {
    let lines = || text.lines().map(str::trim).filter(|l| !l.is_empty());
    let desc = lines()
        .find(|l| !l.starts_with('#'))
        .or_else(|| lines().next().map(|l| l.trim_start_matches('#').trim()))
        .filter(|l| !l.is_empty())
        .map(|l| l.chars().take(MAX_DESCRIPTION).collect::<String>())
        .unwrap_or_else(|| format!("Skill {name}"));
    // JSON strings are YAML double-quoted scalars.
    let q = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    format!(
        "---\nname: {}\ndescription: {}\n---\n\n{text}",
        q(name),
        q(&desc)
    )
}

/// Writes `kit` (its files and `manifest.json`) to `dest`: built in a temporary directory
/// next to it and renamed into place, so `dest` either does not change or holds the whole
/// kit. `dest` must not exist or be an empty directory; its parent must exist.
pub fn write_dir(kit: &Kit, dest: &Path) -> Result<(), String> {
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Ok(mut rd) = std::fs::read_dir(dest) {
        if rd.next().is_some() {
            return Err(format!("{} exists and is not empty", dest.display()));
        }
    } else if dest.symlink_metadata().is_ok() {
        return Err(format!("{} exists and is not a directory", dest.display()));
    }
    let io = |p: &Path, e: std::io::Error| {
        format!("{}: {}", p.display(), crate::validate::io_reason(&e))
    };
    let tmp = tempfile::Builder::new()
        .prefix(".voidbox-kit-")
        .tempdir_in(parent)
        .map_err(|e| io(parent, e))?;
    for f in &kit.files {
        let p = tmp.path().join(&f.path);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
        }
        std::fs::write(&p, &f.data).map_err(|e| io(&p, e))?;
        let mode = if f.executable { 0o755 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io(&p, e))?;
    }
    let m = tmp.path().join("manifest.json");
    let text = serde_json::to_string_pretty(&kit.manifest()).map_err(|e| e.to_string())? + "\n";
    std::fs::write(&m, text).map_err(|e| io(&m, e))?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
        .map_err(|e| io(tmp.path(), e))?;
    // rename(2) replaces an empty directory and fails on a non-empty one; on failure the
    // temporary directory is removed when `tmp` drops.
    std::fs::rename(tmp.path(), dest).map_err(|e| io(dest, e))?;
    let _ = tmp.keep();
    Ok(())
}
