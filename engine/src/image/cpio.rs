//! A reproducible writer (and a reader) of uncompressed cpio "newc" archives — the format
//! the kernel unpacks as an initramfs. [`Archive`] also holds the guest's root tree before
//! it goes onto the system disk ([`super::erofs`]).
//!
//! Reproducible: entries are written sorted by path (so parents precede children),
//! inode numbers are assigned in that order, and mtimes, uids and gids are whatever
//! the caller put in the entry (the image builder uses fixed values).

use std::collections::BTreeMap;
use std::io::{self, Write};

const MAGIC: &[u8; 6] = b"070701";
const TRAILER: &str = "TRAILER!!!";
const HEADER_LEN: usize = 110;

/// File types stored in `mode`.
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;
const S_IFMT: u32 = 0o170000;

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file with its contents.
    File(Vec<u8>),
    /// A symbolic link to the given target.
    Symlink(String),
    /// A character device node.
    CharDev {
        /// Device major number.
        major: u32,
        /// Device minor number.
        minor: u32,
    },
}

/// One archive member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Permission bits (and setuid/setgid/sticky), without the file type.
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time (seconds since the epoch).
    pub mtime: u32,
    /// Type and contents.
    pub kind: Kind,
}

impl Entry {
    /// The full `st_mode`: file type | permissions.
    pub fn mode(&self) -> u32 {
        let ty = match self.kind {
            Kind::Dir => S_IFDIR,
            Kind::File(_) => S_IFREG,
            Kind::Symlink(_) => S_IFLNK,
            Kind::CharDev { .. } => S_IFCHR,
        };
        ty | (self.perm & 0o7777)
    }

    fn data(&self) -> &[u8] {
        match &self.kind {
            Kind::File(d) => d,
            Kind::Symlink(t) => t.as_bytes(),
            Kind::Dir | Kind::CharDev { .. } => &[],
        }
    }
}

/// Errors from building or parsing an archive.
#[derive(Debug, thiserror::Error)]
pub enum CpioError {
    /// A path that cannot be stored (empty, absolute after normalisation, `..`, NUL…).
    #[error("invalid archive path {0:?}")]
    BadPath(String),
    /// An entry whose parent directory is not in the archive.
    #[error("{0:?} has no parent directory entry in the archive")]
    MissingParent(String),
    /// A field does not fit the format (sizes are 32-bit in newc).
    #[error("{0:?} is too large for a newc archive")]
    TooLarge(String),
    /// A malformed archive.
    #[error("malformed cpio archive at byte {offset}: {what}")]
    Malformed {
        /// Byte offset of the problem.
        offset: usize,
        /// Description.
        what: String,
    },
    /// Writing failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// An archive under construction, kept sorted by path.
#[derive(Debug, Default, Clone)]
pub struct Archive {
    entries: BTreeMap<String, Entry>,
}

/// Normalises `path` to the archive form: relative, no `.`/empty components.
pub fn normalize(path: &str) -> Result<String, CpioError> {
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(CpioError::BadPath(path.to_string())),
            c if c.contains('\0') => return Err(CpioError::BadPath(path.to_string())),
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return Err(CpioError::BadPath(path.to_string()));
    }
    Ok(parts.join("/"))
}

impl Archive {
    /// An empty archive.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the entry at `path`.
    pub fn insert(&mut self, path: &str, entry: Entry) -> Result<(), CpioError> {
        let path = normalize(path)?;
        self.entries.insert(path, entry);
        Ok(())
    }

    /// The entry at `path`, if any.
    pub fn get(&self, path: &str) -> Option<&Entry> {
        normalize(path).ok().and_then(|p| self.entries.get(&p))
    }

    /// Entries in archive order.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(p, e)| (p.as_str(), e))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the archive is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Checks that every entry's parent directory is present (the kernel's
    /// unpacker does not create missing parents).
    pub fn check_parents(&self) -> Result<(), CpioError> {
        for path in self.entries.keys() {
            if let Some((parent, _)) = path.rsplit_once('/') {
                match self.entries.get(parent) {
                    Some(Entry {
                        kind: Kind::Dir, ..
                    }) => {}
                    _ => return Err(CpioError::MissingParent(path.clone())),
                }
            }
        }
        Ok(())
    }

    /// Writes the archive (sorted, inodes numbered from 1, then the trailer).
    /// Returns the number of bytes written.
    pub fn write_to<W: Write>(&self, w: &mut W) -> Result<u64, CpioError> {
        self.check_parents()?;
        let mut written = 0u64;
        for (i, (path, e)) in self.entries.iter().enumerate() {
            let data = e.data();
            let size = u32::try_from(data.len()).map_err(|_| CpioError::TooLarge(path.clone()))?;
            let (rmaj, rmin) = match e.kind {
                Kind::CharDev { major, minor } => (major, minor),
                _ => (0, 0),
            };
            let nlink = if matches!(e.kind, Kind::Dir) { 2 } else { 1 };
            let ino = u32::try_from(i + 1).map_err(|_| CpioError::TooLarge(path.clone()))?;
            let h = Header {
                ino,
                mode: e.mode(),
                uid: e.uid,
                gid: e.gid,
                nlink,
                mtime: e.mtime,
                filesize: size,
                rdevmajor: rmaj,
                rdevminor: rmin,
            };
            written += write_member(w, &h, path, data)?;
        }
        let trailer = Header {
            nlink: 1,
            ..Header::default()
        };
        written += write_member(w, &trailer, TRAILER, &[])?;
        Ok(written)
    }

    /// Serialises the archive to a byte vector.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CpioError> {
        let mut v = Vec::new();
        self.write_to(&mut v)?;
        Ok(v)
    }

    /// Parses a newc archive (up to its trailer). Inode numbers and link counts are
    /// not kept; hard links are not supported.
    pub fn parse(bytes: &[u8]) -> Result<Archive, CpioError> {
        let mut off = 0usize;
        let mut archive = Archive::new();
        loop {
            let bad = |offset: usize, what: &str| CpioError::Malformed {
                offset,
                what: what.to_string(),
            };
            let hdr = bytes
                .get(off..off + HEADER_LEN)
                .ok_or_else(|| bad(off, "truncated header"))?;
            if &hdr[..6] != MAGIC {
                return Err(bad(off, "bad magic (only uncompressed newc is supported)"));
            }
            let field = |i: usize| -> Result<u32, CpioError> {
                let s = std::str::from_utf8(&hdr[6 + i * 8..6 + (i + 1) * 8])
                    .map_err(|_| bad(off, "non-ASCII header field"))?;
                u32::from_str_radix(s, 16).map_err(|_| bad(off, "non-hex header field"))
            };
            let mode = field(1)?;
            let uid = field(2)?;
            let gid = field(3)?;
            let mtime = field(5)?;
            let filesize = field(6)? as usize;
            let rmaj = field(9)?;
            let rmin = field(10)?;
            let namesize = field(11)? as usize;
            let name_start = off + HEADER_LEN;
            let name_bytes = bytes
                .get(name_start..name_start + namesize)
                .ok_or_else(|| bad(off, "truncated name"))?;
            let name = name_bytes
                .strip_suffix(b"\0")
                .and_then(|n| std::str::from_utf8(n).ok())
                .ok_or_else(|| bad(off, "name not NUL-terminated UTF-8"))?;
            let data_start = pad4(name_start + namesize);
            let data = bytes
                .get(data_start..data_start + filesize)
                .ok_or_else(|| bad(off, "truncated data"))?;
            if name == TRAILER {
                return Ok(archive);
            }
            let kind = match mode & S_IFMT {
                S_IFDIR => Kind::Dir,
                S_IFREG => Kind::File(data.to_vec()),
                S_IFLNK => Kind::Symlink(
                    String::from_utf8(data.to_vec()).map_err(|_| bad(off, "non-UTF-8 symlink"))?,
                ),
                S_IFCHR => Kind::CharDev {
                    major: rmaj,
                    minor: rmin,
                },
                _ => return Err(bad(off, "unsupported file type")),
            };
            let entry = Entry {
                perm: mode & 0o7777,
                uid,
                gid,
                mtime,
                kind,
            };
            archive.insert(name, entry)?;
            off = pad4(data_start + filesize);
        }
    }
}

/// A newc archive holding one executable, `name` (a top-level name, so it needs no
/// directory entries), root-owned, mode 0755, mtime 0. The kernel unpacks concatenated
/// archives in order, so this appended to an initramfs adds (or replaces) that file — how
/// the guest agent joins a user-supplied initramfs.
pub fn single_executable(name: &str, bytes: &[u8]) -> Result<Vec<u8>, CpioError> {
    let path = normalize(name)?;
    if path.contains('/') {
        return Err(CpioError::BadPath(name.to_string()));
    }
    let mut a = Archive::new();
    a.insert(
        &path,
        Entry {
            perm: 0o755,
            uid: 0,
            gid: 0,
            mtime: 0,
            kind: Kind::File(bytes.to_vec()),
        },
    )?;
    a.to_bytes()
}

#[derive(Debug, Default)]
struct Header {
    ino: u32,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    mtime: u32,
    filesize: u32,
    rdevmajor: u32,
    rdevminor: u32,
}

fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

fn write_member<W: Write>(
    w: &mut W,
    h: &Header,
    name: &str,
    data: &[u8],
) -> Result<u64, CpioError> {
    let namesize = name.len() + 1;
    let mut hdr = String::with_capacity(HEADER_LEN);
    hdr.push_str("070701");
    // ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize check
    for v in [
        h.ino,
        h.mode,
        h.uid,
        h.gid,
        h.nlink,
        h.mtime,
        h.filesize,
        0,
        0,
        h.rdevmajor,
        h.rdevminor,
        u32::try_from(namesize).map_err(|_| CpioError::TooLarge(name.to_string()))?,
        0,
    ] {
        hdr.push_str(&format!("{v:08x}"));
    }
    w.write_all(hdr.as_bytes())?;
    w.write_all(name.as_bytes())?;
    w.write_all(&[0])?;
    let head = HEADER_LEN + namesize;
    let pad = pad4(head) - head;
    w.write_all(&[0u8; 3][..pad])?;
    w.write_all(data)?;
    let dpad = pad4(data.len()) - data.len();
    w.write_all(&[0u8; 3][..dpad])?;
    Ok((pad4(head) + pad4(data.len())) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(kind: Kind) -> Entry {
        Entry {
            perm: 0o755,
            uid: 0,
            gid: 0,
            mtime: 0,
            kind,
        }
    }

    fn sample() -> Archive {
        let mut a = Archive::new();
        // Inserted out of order on purpose.
        a.insert("/bin/sh", e(Kind::Symlink("/bin/busybox".into())))
            .unwrap();
        a.insert("init", e(Kind::File(b"#!/bin/sh\necho hi\n".to_vec())))
            .unwrap();
        a.insert("bin", e(Kind::Dir)).unwrap();
        a.insert(
            "bin/busybox",
            e(Kind::File(vec![0x7f, b'E', b'L', b'F', 1])),
        )
        .unwrap();
        a.insert("dev", e(Kind::Dir)).unwrap();
        a.insert("dev/console", e(Kind::CharDev { major: 5, minor: 1 }))
            .unwrap();
        let mut home = e(Kind::Dir);
        home.uid = 1000;
        home.gid = 1000;
        a.insert("home", e(Kind::Dir)).unwrap();
        a.insert("home/sandbox", home).unwrap();
        a
    }

    #[test]
    fn round_trip() {
        let a = sample();
        let bytes = a.to_bytes().unwrap();
        assert_eq!(bytes.len() % 4, 0);
        let b = Archive::parse(&bytes).unwrap();
        assert_eq!(a.entries, b.entries);
        assert_eq!(b.get("/home/sandbox").unwrap().uid, 1000);
    }

    #[test]
    fn reproducible_regardless_of_insertion_order() {
        let a = sample();
        let mut b = Archive::new();
        for (p, e) in a.entries().collect::<Vec<_>>().into_iter().rev() {
            b.insert(p, e.clone()).unwrap();
        }
        assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap());
    }

    #[test]
    fn sorted_parents_first_and_trailer() {
        let bytes = sample().to_bytes().unwrap();
        let text = String::from_utf8_lossy(&bytes);
        let pos = |s: &str| text.find(s).unwrap();
        assert!(pos("bin\0") < pos("bin/busybox\0"));
        assert!(pos("bin/busybox\0") < pos("bin/sh\0"));
        assert!(text.ends_with("TRAILER!!!\0\0\0\0") || text.contains("TRAILER!!!\0"));
    }

    #[test]
    fn matches_gnu_cpio_listing() {
        // `cpio -t` (if installed) must read what we write.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.cpio");
        std::fs::write(&path, sample().to_bytes().unwrap()).unwrap();
        let Ok(out) = std::process::Command::new("cpio")
            .args(["-t", "--quiet", "-F"])
            .arg(&path)
            .output()
        else {
            return;
        };
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            listing.lines().collect::<Vec<_>>(),
            [
                "bin",
                "bin/busybox",
                "bin/sh",
                "dev",
                "dev/console",
                "home",
                "home/sandbox",
                "init"
            ]
        );
    }

    #[test]
    fn missing_parent_and_bad_paths_rejected() {
        let mut a = Archive::new();
        a.insert("usr/bin/awk", e(Kind::Symlink("/bin/busybox".into())))
            .unwrap();
        assert!(matches!(a.to_bytes(), Err(CpioError::MissingParent(_))));
        assert!(matches!(normalize("../x"), Err(CpioError::BadPath(_))));
        assert!(matches!(normalize("/"), Err(CpioError::BadPath(_))));
        assert_eq!(normalize("/./a//b/").unwrap(), "a/b");
    }

    #[test]
    fn single_executable_archive() {
        let bytes = single_executable("/voidbox-agent", b"\x7fELFagent").unwrap();
        assert_eq!(bytes.len() % 4, 0);
        let a = Archive::parse(&bytes).unwrap();
        assert_eq!(a.len(), 1);
        let e = a.get("voidbox-agent").unwrap();
        assert_eq!((e.perm, e.uid, e.mtime), (0o755, 0, 0));
        assert_eq!(e.kind, Kind::File(b"\x7fELFagent".to_vec()));
        assert_eq!(e.mode() & S_IFMT, S_IFREG);
        // GNU cpio (if installed) reads it too.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.cpio");
        std::fs::write(&path, &bytes).unwrap();
        if let Ok(out) = std::process::Command::new("cpio")
            .args(["-t", "--quiet", "-F"])
            .arg(&path)
            .output()
        {
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "voidbox-agent");
        }
        assert!(matches!(
            single_executable("sbin/voidbox-agent", b""),
            Err(CpioError::BadPath(_))
        ));
        assert!(single_executable("..", b"").is_err());
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let bytes = sample().to_bytes().unwrap();
        for cut in [0, 5, 50, 111, bytes.len() / 2, bytes.len() - 1] {
            assert!(Archive::parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut gz = bytes.clone();
        gz[0] = 0x1f;
        assert!(Archive::parse(&gz).is_err());
    }
}
