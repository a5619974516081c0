//! Host paths in a spec (`file:` skills, mount hosts, `kernel`, `initramfs`): a relative
//! path resolves against the spec file's directory. void-box resolved them against the
//! working directory, so a path missing next to the spec but present relative to the
//! working directory is used instead (`validate` warns, naming both).

use std::path::{Path, PathBuf};

/// Where a host path of a spec resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// Found relative to the spec file's directory (or absolute).
    Spec(PathBuf),
    /// Missing next to the spec file, found relative to the working directory.
    Cwd {
        /// The spec-relative path that does not exist (made absolute).
        spec: PathBuf,
        /// The working-directory path that does (absolute).
        cwd: PathBuf,
    },
    /// Found nowhere; the spec-relative path.
    Missing(PathBuf),
}

impl Resolved {
    /// The path to use: the one that exists, else the spec-relative one.
    pub fn path(&self) -> &Path {
        match self {
            Resolved::Spec(p) | Resolved::Missing(p) => p,
            Resolved::Cwd { cwd, .. } => cwd,
        }
    }

    /// Consumes `self`, returning [`Resolved::path`].
    pub fn into_path(self) -> PathBuf {
        match self {
            Resolved::Spec(p) | Resolved::Missing(p) => p,
            Resolved::Cwd { cwd, .. } => cwd,
        }
    }
}

/// Resolves `rel` (as written in the spec) against `spec_dir`, falling back to the working
/// directory.
pub fn resolve(spec_dir: &Path, rel: &str) -> Resolved {
    let spec = spec_dir.join(rel);
    if std::fs::metadata(&spec).is_ok() {
        return Resolved::Spec(spec);
    }
    if Path::new(rel).is_relative() {
        if let Ok(cwd) = std::env::current_dir() {
            let there = cwd.join(rel);
            if std::fs::metadata(&there).is_ok() {
                let spec = std::path::absolute(&spec).unwrap_or(spec);
                return Resolved::Cwd { spec, cwd: there };
            }
        }
    }
    Resolved::Missing(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_dir_first_then_missing() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("here.md"), "x").expect("write");
        assert_eq!(
            resolve(dir.path(), "here.md"),
            Resolved::Spec(dir.path().join("here.md"))
        );
        let missing = resolve(dir.path(), "no-such-file-anywhere-4b1d.md");
        assert!(matches!(missing, Resolved::Missing(_)), "{missing:?}");
        assert_eq!(
            missing.path(),
            dir.path().join("no-such-file-anywhere-4b1d.md")
        );
    }

    #[test]
    fn falls_back_to_the_working_directory() {
        // The crate directory (the test's working directory) holds Cargo.toml; an empty
        // spec directory does not.
        let dir = tempfile::tempdir().expect("tempdir");
        match resolve(dir.path(), "Cargo.toml") {
            Resolved::Cwd { spec, cwd } => {
                assert_eq!(spec, dir.path().join("Cargo.toml"));
                assert!(cwd.is_absolute() && cwd.is_file(), "{cwd:?}");
            }
            other => panic!("{other:?}"),
        }
    }
}
