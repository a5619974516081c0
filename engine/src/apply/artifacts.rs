//! Box artifacts (void-box `outputs` / `inputs`): named directories that flow between boxes
//! beside the JSON data.
//!
//! When a box succeeds, each of its `outputs` directories is copied out of its VM by file
//! RPCs (`ListDir` + `ReadFile`) into `<run dir>/artifacts/<encoded name>/` on the host,
//! within the node's output cap (`--max-output`, all of a box's outputs together; over the cap
//! is an error, never a truncation). Before a consumer's command starts, each of its `inputs`
//! is written to its guest directory. Guest-provided names are untrusted: every entry must be
//! one plain path component (no `/`, `..`, NUL), symlinks and special files are not
//! followed or copied, and host files are only ever created fresh inside the artifact's
//! directory, so nothing escapes it.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use voidbox_protocol::{DirEntry, ErrorCode, FileKind};

use crate::plan::PlanNode;
use crate::sandbox::{Sandbox, SandboxError};

/// Most files (and directories) one output may hold.
pub const MAX_ENTRIES: u64 = 10_000;
/// Deepest directory nesting copied.
pub const MAX_DEPTH: usize = 32;

pub use crate::scheduler::ArtifactStats;

/// The guest file operations artifacts need ([`Sandbox`] in production).
pub trait GuestFiles {
    /// Entries of a directory (`lstat`ed), and whether the guest capped the list.
    fn list_dir(&mut self, path: &str) -> Result<(Vec<DirEntry>, bool), SandboxError>;
    /// A file of at most `max` bytes.
    fn read_file(&mut self, path: &str, max: u64) -> Result<Vec<u8>, SandboxError>;
    /// Writes a file (creating its parents).
    fn write_file(&mut self, path: &str, data: &[u8]) -> Result<(), SandboxError>;
    /// Creates a directory and its parents.
    fn mkdir_p(&mut self, path: &str) -> Result<(), SandboxError>;
}

impl GuestFiles for Sandbox {
    fn list_dir(&mut self, path: &str) -> Result<(Vec<DirEntry>, bool), SandboxError> {
        Sandbox::list_dir(self, path)
    }
    fn read_file(&mut self, path: &str, max: u64) -> Result<Vec<u8>, SandboxError> {
        Sandbox::read_file(self, path, max)
    }
    fn write_file(&mut self, path: &str, data: &[u8]) -> Result<(), SandboxError> {
        Sandbox::write_file(self, path, data, Some(0o644))
    }
    fn mkdir_p(&mut self, path: &str) -> Result<(), SandboxError> {
        Sandbox::mkdir_p(self, path)
    }
}

/// Writes every `inputs` entry of `node` into its VM, before its command starts: each from
/// `given` (a node runner's `--inputs`), else from the run directory `run_dir`.
pub fn place_inputs(
    g: &mut dyn GuestFiles,
    node: &PlanNode,
    run_dir: &Path,
    given: &std::collections::HashMap<String, PathBuf>,
) -> Result<(), String> {
    for i in &node.artifacts.inputs {
        let src = given
            .get(&i.from)
            .cloned()
            .unwrap_or_else(|| store_dir(run_dir, &i.from));
        if !src.is_dir() {
            return Err(format!(
                "input `{}`: the output was never collected (its box did not succeed)",
                i.from
            ));
        }
        place(g, &src, &i.guest).map_err(|e| format!("input `{}`: {e}", i.from))?;
    }
    Ok(())
}

/// Copies every `outputs` directory of `node` out of its VM after it succeeded, each within
/// `cap` bytes.
pub fn collect_outputs(
    g: &mut dyn GuestFiles,
    node: &PlanNode,
    run_dir: &Path,
    cap: u64,
) -> Result<Vec<ArtifactStats>, String> {
    node.artifacts
        .outputs
        .iter()
        .map(|o| collect(g, &o.name, &o.guest, &store_dir(run_dir, &o.name), cap))
        .collect()
}

/// The host directory of output `name` in the run directory `run_dir`.
pub fn store_dir(run_dir: &Path, name: &str) -> PathBuf {
    run_dir
        .join("artifacts")
        .join(crate::names::file_component(name))
}

/// Whether a guest-provided entry name is one plain path component.
fn plain_component(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 255
        && !name.contains(['/', '\0'])
}

/// Copies the guest directory `guest_dir` of output `name` into `dest` (created fresh;
/// removed again on error), with at most `cap` bytes.
pub fn collect(
    g: &mut dyn GuestFiles,
    name: &str,
    guest_dir: &str,
    dest: &Path,
    cap: u64,
) -> Result<ArtifactStats, String> {
    if dest.exists() {
        std::fs::remove_dir_all(dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    std::fs::create_dir(dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    let mut stats = ArtifactStats {
        name: name.to_string(),
        files: 0,
        bytes: 0,
        skipped: 0,
    };
    let res = copy_dir(g, guest_dir.trim_end_matches('/'), dest, cap, 0, &mut stats);
    if let Err(e) = res {
        let _ = std::fs::remove_dir_all(dest);
        return Err(match e {
            CopyError::Missing => {
                format!("output `{name}`: the box did not create its directory {guest_dir}")
            }
            CopyError::Other(m) => format!("output `{name}` ({guest_dir}): {m}"),
        });
    }
    Ok(stats)
}

enum CopyError {
    Missing,
    Other(String),
}

impl From<String> for CopyError {
    fn from(s: String) -> Self {
        CopyError::Other(s)
    }
}

fn copy_dir(
    g: &mut dyn GuestFiles,
    guest: &str,
    host: &Path,
    cap: u64,
    depth: usize,
    stats: &mut ArtifactStats,
) -> Result<(), CopyError> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} directories at {guest}").into());
    }
    let (entries, truncated) = match g.list_dir(guest) {
        Ok(l) => l,
        Err(SandboxError::Guest {
            code: ErrorCode::NotFound,
            ..
        }) if depth == 0 => return Err(CopyError::Missing),
        Err(e) => return Err(format!("listing {guest}: {e}").into()),
    };
    if truncated {
        return Err(format!("{guest} holds more than {MAX_ENTRIES} entries").into());
    }
    for e in entries {
        if !plain_component(&e.name) {
            return Err(format!(
                "the guest listed an unsafe file name {:?} in {guest}",
                e.name
            )
            .into());
        }
        let gpath = format!("{guest}/{}", e.name);
        let hpath = host.join(&e.name);
        if stats.files + 1 > MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} files").into());
        }
        match e.kind {
            FileKind::Dir => {
                std::fs::create_dir(&hpath).map_err(|err| format!("{}: {err}", hpath.display()))?;
                copy_dir(g, &gpath, &hpath, cap, depth + 1, stats)?;
            }
            FileKind::File => {
                let left = cap.saturating_sub(stats.bytes);
                if e.size > left {
                    return Err(over(stats.bytes.saturating_add(e.size), cap).into());
                }
                let data = match g.read_file(&gpath, left) {
                    Ok(d) => d,
                    Err(SandboxError::Guest {
                        code: ErrorCode::TooLarge,
                        ..
                    }) => return Err(over(cap.saturating_add(1), cap).into()),
                    Err(err) => return Err(format!("reading {gpath}: {err}").into()),
                };
                stats.bytes += data.len() as u64;
                stats.files += 1;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&hpath)
                    .map_err(|err| format!("{}: {err}", hpath.display()))?;
                f.write_all(&data)
                    .map_err(|err| format!("{}: {err}", hpath.display()))?;
            }
            FileKind::Symlink | FileKind::Other => stats.skipped += 1,
        }
    }
    Ok(())
}

fn over(size: u64, cap: u64) -> String {
    crate::capped::over_cap("the directory", size, cap)
}

/// Writes the collected artifact in `src` to the guest directory `guest_dir` (created even
/// when the artifact is empty).
pub fn place(g: &mut dyn GuestFiles, src: &Path, guest_dir: &str) -> Result<(), String> {
    let guest_dir = guest_dir.trim_end_matches('/');
    g.mkdir_p(guest_dir)
        .map_err(|e| format!("creating {guest_dir}: {e}"))?;
    place_dir(g, src, guest_dir, 0)
}

fn place_dir(g: &mut dyn GuestFiles, src: &Path, guest: &str, depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    let mut names: Vec<(String, std::fs::FileType)> = std::fs::read_dir(src)
        .map_err(|e| format!("{}: {e}", src.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.file_type().ok()?)))
        .collect();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, ty) in names {
        let host = src.join(&name);
        let gpath = format!("{guest}/{name}");
        if ty.is_dir() {
            g.mkdir_p(&gpath)
                .map_err(|e| format!("creating {gpath}: {e}"))?;
            place_dir(g, &host, &gpath, depth + 1)?;
        } else if ty.is_file() {
            let data = std::fs::read(&host).map_err(|e| format!("{}: {e}", host.display()))?;
            g.write_file(&gpath, &data)
                .map_err(|e| format!("writing {gpath}: {e}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// An in-memory guest: path → Some(contents) for files, None for directories; names
    /// listed as given (so tests can inject hostile ones).
    #[derive(Default)]
    struct FakeGuest {
        files: BTreeMap<String, Option<Vec<u8>>>,
        extra: Vec<(String, DirEntry)>,
    }

    impl GuestFiles for FakeGuest {
        fn list_dir(&mut self, path: &str) -> Result<(Vec<DirEntry>, bool), SandboxError> {
            if !matches!(self.files.get(path), Some(None)) {
                return Err(SandboxError::Guest {
                    what: "list".into(),
                    code: ErrorCode::NotFound,
                    message: "no such directory".into(),
                });
            }
            let prefix = format!("{path}/");
            let mut out: Vec<DirEntry> = self
                .files
                .iter()
                .filter_map(|(p, c)| {
                    let rest = p.strip_prefix(&prefix)?;
                    (!rest.contains('/')).then(|| DirEntry {
                        name: rest.to_string(),
                        kind: if c.is_some() {
                            FileKind::File
                        } else {
                            FileKind::Dir
                        },
                        size: c.as_ref().map_or(0, |c| c.len() as u64),
                    })
                })
                .collect();
            out.extend(
                self.extra
                    .iter()
                    .filter(|(d, _)| d == path)
                    .map(|(_, e)| e.clone()),
            );
            Ok((out, false))
        }
        fn read_file(&mut self, path: &str, max: u64) -> Result<Vec<u8>, SandboxError> {
            match self.files.get(path) {
                Some(Some(d)) if d.len() as u64 <= max => Ok(d.clone()),
                Some(Some(_)) => Err(SandboxError::Guest {
                    what: "read".into(),
                    code: ErrorCode::TooLarge,
                    message: "too large".into(),
                }),
                _ => Err(SandboxError::Guest {
                    what: "read".into(),
                    code: ErrorCode::NotFound,
                    message: "no such file".into(),
                }),
            }
        }
        fn write_file(&mut self, path: &str, data: &[u8]) -> Result<(), SandboxError> {
            self.files.insert(path.to_string(), Some(data.to_vec()));
            Ok(())
        }
        fn mkdir_p(&mut self, path: &str) -> Result<(), SandboxError> {
            self.files.insert(path.to_string(), None);
            Ok(())
        }
    }

    fn guest() -> FakeGuest {
        let mut g = FakeGuest::default();
        g.files.insert("/workspace/out".into(), None);
        g.files
            .insert("/workspace/out/a.txt".into(), Some(b"alpha".to_vec()));
        g.files.insert("/workspace/out/sub".into(), None);
        g.files
            .insert("/workspace/out/sub/b.txt".into(), Some(b"beta!".to_vec()));
        g.extra.push((
            "/workspace/out".into(),
            DirEntry {
                name: "link".into(),
                kind: FileKind::Symlink,
                size: 0,
            },
        ));
        g
    }

    #[test]
    fn collects_and_places_a_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = store_dir(tmp.path(), "reports");
        let s = collect(&mut guest(), "reports", "/workspace/out/", &dest, 1024).unwrap();
        assert_eq!((s.files, s.bytes, s.skipped), (2, 10, 1));
        assert_eq!(std::fs::read(dest.join("sub/b.txt")).unwrap(), b"beta!");
        assert!(!dest.join("link").exists());
        let mut consumer = FakeGuest::default();
        place(&mut consumer, &dest, "/workspace/in").unwrap();
        assert_eq!(
            consumer.files.get("/workspace/in/sub/b.txt"),
            Some(&Some(b"beta!".to_vec()))
        );
        assert_eq!(consumer.files.get("/workspace/in"), Some(&None));
    }

    #[test]
    fn over_the_cap_is_an_error_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = store_dir(tmp.path(), "r");
        let e = collect(&mut guest(), "r", "/workspace/out", &dest, 7).unwrap_err();
        assert!(e.contains("larger than the output cap"), "{e}");
        assert!(!dest.exists());
        let e = collect(&mut guest(), "r", "/workspace/missing", &dest, 7).unwrap_err();
        assert!(e.contains("did not create"), "{e}");
    }

    #[test]
    fn hostile_names_are_refused() {
        for bad in ["..", "../x", "a/b", "", "x\0y", "."] {
            let tmp = tempfile::tempdir().unwrap();
            let mut g = guest();
            g.extra.push((
                "/workspace/out".into(),
                DirEntry {
                    name: bad.into(),
                    kind: FileKind::File,
                    size: 1,
                },
            ));
            let dest = store_dir(tmp.path(), "r");
            let e = collect(&mut g, "r", "/workspace/out", &dest, 1024).unwrap_err();
            assert!(e.contains("unsafe file name"), "{bad:?}: {e}");
            assert!(!dest.exists());
        }
    }

    #[test]
    fn names_are_encoded() {
        let dir = |n: &str| store_dir(Path::new("/run"), n);
        assert_eq!(dir("reports"), Path::new("/run/artifacts/reports"));
        for hostile in ["../x", "a/b", "..", ".", ""] {
            let d = dir(hostile);
            assert_eq!(d.parent(), Some(Path::new("/run/artifacts")), "{hostile:?}");
        }
    }
}
