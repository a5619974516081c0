//! Turning an unpacked root into a read-only erofs disk with Debian's `mkfs.erofs`.
//!
//! Ownership and modes come from the layers, not from the files on disk (we may not be root):
//! a fakeroot state file lists every inode of the tree with the wanted `uid`, `gid` and mode,
//! and `mkfs.erofs` runs under `fakeroot -i STATE`, which makes `stat` report them. Timestamps
//! are fixed at 0 and the UUID at zero, so the same layers give the same disk.

use crate::error::{IoContext, OciError};
use crate::unpack::Unpacked;
use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Finds `tool` in `PATH` (and the sbin directories), or says which package to install.
pub fn find_tool(tool: &str, package: &str) -> Result<PathBuf, OciError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    for dir in dirs {
        let cand = dir.join(tool);
        if cand.is_file() {
            return Ok(cand);
        }
    }
    Err(OciError::ToolMissing {
        tool: tool.to_string(),
        package: package.to_string(),
    })
}

/// Writes the erofs image of `tree` to `out`.
pub(crate) fn make_erofs(tree: &Unpacked, out: &Path, scratch: &Path) -> Result<(), OciError> {
    let fakeroot = find_tool("fakeroot", "fakeroot")?;
    let mkfs = find_tool("mkfs.erofs", "erofs-utils")?;
    let state = scratch.join("fakeroot.state");
    write_state(tree, &state)?;
    let output = Command::new(fakeroot)
        .arg("-i")
        .arg(&state)
        .arg("--")
        .arg(mkfs)
        .args([
            "-T0",
            "-U",
            "00000000-0000-0000-0000-000000000000",
            "-x-1",
            "--quiet",
        ])
        .arg(out)
        .arg(&tree.dir)
        .output()
        .ctx(|| "running fakeroot mkfs.erofs".to_string())?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: String = stderr
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(OciError::ToolFailed {
            tool: "mkfs.erofs".into(),
            status: output.status.to_string(),
            stderr: tail.trim().to_string(),
        });
    }
    Ok(())
}

/// One fakeroot line per inode of the tree:
/// `dev=%llx,ino=%llu,mode=%llo,uid=%llu,gid=%llu,nlink=%llu,rdev=%llu`.
fn write_state(tree: &Unpacked, state: &Path) -> Result<(), OciError> {
    let file = std::fs::File::create(state).ctx(|| format!("creating {}", state.display()))?;
    let mut w = std::io::BufWriter::new(file);
    let mut seen = HashSet::new();
    let mut stack = vec![tree.dir.clone()];
    while let Some(path) = stack.pop() {
        let md = std::fs::symlink_metadata(&path).ctx(|| format!("stat {}", path.display()))?;
        if md.is_dir() {
            for ent in std::fs::read_dir(&path).ctx(|| format!("listing {}", path.display()))? {
                stack.push(ent.ctx(|| format!("listing {}", path.display()))?.path());
            }
        }
        let key = (md.dev(), md.ino());
        if !seen.insert(key) {
            continue;
        }
        let (uid, gid, perm) = match tree.meta.get(&key) {
            Some(m) => (m.uid, m.gid, m.perm),
            None => (0, 0, md.mode() & 0o777),
        };
        let mode = (md.mode() & 0o170000) | (perm & 0o7777);
        writeln!(
            w,
            "dev={:x},ino={},mode={:o},uid={},gid={},nlink={},rdev=0",
            md.dev(),
            md.ino(),
            mode,
            uid,
            gid,
            md.nlink()
        )
        .ctx(|| format!("writing {}", state.display()))?;
    }
    w.flush().ctx(|| format!("writing {}", state.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn missing_tools_name_their_package() {
        let err = super::find_tool("voidbox-no-such-tool", "some-package").unwrap_err();
        assert_eq!(
            err.to_string(),
            "`voidbox-no-such-tool` not found: install the Debian package `some-package`"
        );
        assert!(super::find_tool("mkfs.erofs", "erofs-utils").is_ok());
    }
}
