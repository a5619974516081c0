//! `--mount HOST:GUEST[:ro|rw]` of `voidbox run` and `voidbox shell`: host directories
//! shared into the VM.
//!
//! The host path resolves against the working directory and must be a directory; a
//! missing one is an error for `ro` and created (just before the VM starts) for `rw`. The
//! guest path follows the share rules ([`crate::sandbox::shares::check_guest_path`]).

use std::path::{Path, PathBuf};

use crate::sandbox::shares::{check_guest_path, Share};
use crate::spec::model::{Mount, MountMode};

/// One host directory shared into the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMount {
    /// Absolute host directory.
    pub host: PathBuf,
    /// Absolute guest path.
    pub guest: String,
    /// Mounted read-only (`ro`, the default).
    pub read_only: bool,
    /// The host directory does not exist yet and is created before the VM starts (`rw`).
    pub create: bool,
}

/// Parses one `--mount` value; relative host paths resolve against `cwd`.
pub fn parse(arg: &str, cwd: &Path) -> Result<HostMount, String> {
    let bad = |why: &str| format!("--mount `{arg}`: {why} (expected HOST:GUEST[:ro|rw])");
    let (rest, read_only) = match arg.rsplit_once(':') {
        Some((r, "ro")) => (r, true),
        Some((r, "rw")) => (r, false),
        _ => (arg, true),
    };
    let (host, guest) = rest.rsplit_once(':').ok_or_else(|| bad("no guest path"))?;
    if host.is_empty() {
        return Err(bad("the host path is empty"));
    }
    check_guest_path(guest).map_err(|why| bad(&why))?;
    let host = cwd.join(host);
    let create = match std::fs::metadata(&host) {
        Ok(m) if m.is_dir() => false,
        Ok(_) => return Err(bad(&format!("{} is not a directory", host.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !read_only => true,
        Err(e) => return Err(bad(&format!("{}: {e}", host.display()))),
    };
    Ok(HostMount {
        host,
        guest: guest.to_string(),
        read_only,
        create,
    })
}

/// A spec's `sandbox.mounts` entry (its host path already resolved by the plan);
/// `missing_rw` are the plan's `create_mount_dirs`.
pub fn from_spec(m: &Mount, missing_rw: &[PathBuf]) -> Result<HostMount, String> {
    check_guest_path(&m.guest)?;
    let host = PathBuf::from(&m.host);
    Ok(HostMount {
        create: missing_rw.contains(&host),
        // Shares need absolute host paths; a plan made from a relative spec path has
        // relative ones.
        host: std::path::absolute(&host).unwrap_or(host),
        guest: m.guest.clone(),
        read_only: m.mode == MountMode::Ro,
    })
}

/// Creates the missing host directories of `rw` mounts.
pub fn create_dirs(mounts: &[HostMount]) -> Result<(), String> {
    for m in mounts.iter().filter(|m| m.create) {
        std::fs::create_dir_all(&m.host)
            .map_err(|e| format!("creating {}: {e}", m.host.display()))?;
    }
    Ok(())
}

/// The sandbox's shares for `mounts`.
pub fn shares(mounts: &[HostMount]) -> Vec<Share> {
    mounts
        .iter()
        .map(|m| Share {
            host: m.host.clone(),
            guest: m.guest.clone(),
            read_only: m.read_only,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modes_and_resolves_against_cwd() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        let m = parse("src:/work", dir.path()).unwrap();
        assert_eq!(m.host, dir.path().join("src"));
        assert_eq!(
            (m.guest.as_str(), m.read_only, m.create),
            ("/work", true, false)
        );
        let m = parse("src:/work:rw", dir.path()).unwrap();
        assert!(!m.read_only && !m.create);
        let abs = format!("{}:/w:ro", dir.path().display());
        assert_eq!(
            parse(&abs, Path::new("/elsewhere")).unwrap().host,
            dir.path()
        );
        // A missing rw directory is created later; a missing ro one is an error.
        let m = parse("out/new:/out:rw", dir.path()).unwrap();
        assert!(m.create && !m.host.exists());
        create_dirs(std::slice::from_ref(&m)).unwrap();
        assert!(m.host.is_dir());
        let e = parse("nope:/x", dir.path()).unwrap_err();
        assert!(e.contains("nope") && e.contains("No such file"), "{e}");
    }

    #[test]
    fn refuses_bad_shapes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let err = |a: &str| parse(a, dir.path()).unwrap_err();
        assert!(err(".").contains("no guest path"));
        assert!(err(":/x").contains("host path is empty"));
        assert!(err(".:rel").contains("must be absolute"));
        assert!(err(".:/").contains("guest's root"));
        assert!(err(".:/a/../b").contains("normalised"));
        assert!(err(".:/a//b:rw").contains("normalised"));
        assert!(err(".:/proc/x").contains("inside /proc"));
        assert!(err("f:/f").contains("not a directory"));
        // An unknown mode is part of the guest path, which then is not absolute.
        assert!(err(".:/x:rx").contains("must be absolute"));
    }

    #[test]
    fn spec_mounts_keep_their_mode_and_missing_dirs() {
        let m = Mount {
            host: "/h/out".into(),
            guest: "/out".into(),
            mode: MountMode::Rw,
        };
        let h = from_spec(&m, &[PathBuf::from("/h/out")]).unwrap();
        assert!(!h.read_only && h.create);
        let ro = Mount {
            mode: MountMode::Ro,
            guest: "out".into(),
            ..m
        };
        assert!(from_spec(&ro, &[])
            .unwrap_err()
            .contains("must be absolute"));
        let hs = shares(&[h]);
        assert_eq!((hs[0].guest.as_str(), hs[0].read_only), ("/out", false));
    }
}
