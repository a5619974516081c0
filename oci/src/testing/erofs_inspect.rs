//! Reading inodes back out of an erofs image: owner, size and type from `dump.erofs`, the
//! full mode (with setuid/setgid/sticky, which `dump.erofs` 1.5 does not print) from the
//! on-disk inode that `dump.erofs` names.

use super::{herr, run, Result};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::Command;

/// What an erofs image says about one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErofsInode {
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Full `st_mode` (type and permission bits, including setuid/setgid/sticky).
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Hard link count.
    pub nlink: u32,
}

impl ErofsInode {
    /// Permission bits including setuid/setgid/sticky (`mode & 0o7777`).
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & 0o170000 == 0o040000
    }
    /// Whether it is a regular file.
    pub fn is_file(&self) -> bool {
        self.mode & 0o170000 == 0o100000
    }
    /// Whether it is a symlink.
    pub fn is_symlink(&self) -> bool {
        self.mode & 0o170000 == 0o120000
    }
}

/// The inode at `path` (absolute, e.g. `/etc/passwd`) in `disk`, or `None` when absent.
pub fn erofs_inode(disk: &Path, path: &str) -> Result<Option<ErofsInode>> {
    let out = run(Command::new("dump.erofs")
        .arg(format!("--path={path}"))
        .arg(disk))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Option<u64> {
        let at = text.find(&format!("{name}:"))? + name.len() + 1;
        text[at..].split_whitespace().next()?.parse().ok()
    };
    let Some(nid) = field("NID") else {
        return Ok(None);
    };
    let (uid, gid, size, nlink) = (
        field("Uid").ok_or_else(|| herr!("dump.erofs: no Uid for {path}"))?,
        field("Gid").ok_or_else(|| herr!("dump.erofs: no Gid for {path}"))?,
        field("Size").ok_or_else(|| herr!("dump.erofs: no Size for {path}"))?,
        field("Links").unwrap_or(1),
    );
    let mut f = std::fs::File::open(disk)?;
    let mut sb = [0u8; 128];
    f.seek(SeekFrom::Start(1024))?;
    f.read_exact(&mut sb)?;
    if sb[..4] != 0xE0F5_E1E2u32.to_le_bytes() {
        return Err(herr!("{} is not erofs", disk.display()));
    }
    let blkszbits = u32::from(sb[12]);
    let meta_blkaddr = u64::from(u32::from_le_bytes([sb[40], sb[41], sb[42], sb[43]]));
    let mut mode = [0u8; 2];
    f.seek(SeekFrom::Start((meta_blkaddr << blkszbits) + nid * 32 + 4))?;
    f.read_exact(&mut mode)?;
    Ok(Some(ErofsInode {
        uid: uid as u32,
        gid: gid as u32,
        mode: u32::from(u16::from_le_bytes(mode)),
        size,
        nlink: nlink as u32,
    }))
}
