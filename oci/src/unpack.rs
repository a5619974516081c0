//! Applying image layers (tar, tar+gzip, tar+zstd) to a root directory.
//!
//! Rules, per entry:
//! - Names are made relative (a leading `/` is dropped, `.` ignored); a `..` component refuses
//!   the whole layer with an error naming the entry.
//! - The parent directory is resolved inside the root (`openat2` with `RESOLVE_IN_ROOT`, or
//!   the same walk in user space), so a symlink planted earlier can never redirect a write
//!   outside; missing parents are created.
//! - `.wh.NAME` removes `NAME` from lower layers; `.wh..wh..opq` empties its directory of
//!   everything not written by the same layer; other `.wh..wh.*` entries are ignored.
//! - Hardlinks must name an existing non-directory inside the root (`..` refuses the layer).
//! - Device nodes and FIFOs are dropped; setuid, setgid and sticky bits are dropped from files,
//!   setuid from directories.
//! - Ownership and permission bits are not applied to the disk (we may not be root); they are
//!   recorded per inode and applied when the erofs image is made. Extended attributes and
//!   timestamps are not kept (the erofs image uses time 0).

use crate::error::OciError;
use crate::resolve::Root;
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Layer compression, from the layer's media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Plain tar.
    None,
    /// tar+gzip.
    Gzip,
    /// tar+zstd.
    Zstd,
}

impl Compression {
    /// The compression of a layer media type, or `None` when the type is not a layer we unpack.
    pub fn from_media_type(media_type: &str) -> Option<Compression> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Some(Compression::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Some(Compression::Gzip),
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.docker.image.rootfs.diff.tar.zstd" => Some(Compression::Zstd),
            _ => None,
        }
    }
}

/// Owner and permission bits of one inode, as the layers want them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub uid: u64,
    pub gid: u64,
    /// Permission bits (and the special bits that survived sanitizing).
    pub perm: u32,
}

/// An unpacked root filesystem.
#[derive(Debug)]
pub(crate) struct Unpacked {
    /// The directory holding it.
    pub dir: PathBuf,
    /// Wanted owner and mode per `(st_dev, st_ino)`; inodes not listed are root's, mode as on disk.
    pub meta: HashMap<(u64, u64), Meta>,
}

/// Applies layers one after another to a directory.
pub(crate) struct Unpacker {
    root: Root,
    dir: PathBuf,
    meta: HashMap<(u64, u64), Meta>,
}

/// The context of one layer being applied.
struct LayerCtx<'a> {
    digest: &'a str,
    /// Inodes written by this layer (kept by its opaque markers).
    created: HashSet<(u64, u64)>,
}

impl LayerCtx<'_> {
    fn err(&self, entry: &str, reason: impl std::fmt::Display) -> OciError {
        OciError::Layer {
            layer: self.digest.to_string(),
            reason: format!("entry `{entry}`: {reason}"),
        }
    }
    fn refuse(&self, entry: &str, reason: impl Into<String>) -> OciError {
        OciError::UnsafeLayer {
            layer: self.digest.to_string(),
            entry: entry.to_string(),
            reason: reason.into(),
        }
    }
}

impl Unpacker {
    /// Starts unpacking into `dir`, which must exist (and should be empty).
    pub(crate) fn new(dir: &Path) -> Result<Unpacker, OciError> {
        let root =
            Root::open(dir).map_err(|e| OciError::io(format!("opening {}", dir.display()), e))?;
        Ok(Unpacker {
            root,
            dir: dir.to_path_buf(),
            meta: HashMap::new(),
        })
    }

    /// Like [`Unpacker::new`] but resolving paths without `openat2` (tests of the fallback).
    #[cfg(test)]
    fn new_without_openat2(dir: &Path) -> Result<Unpacker, OciError> {
        let mut u = Unpacker::new(dir)?;
        u.root = Root::open_without_openat2(dir).map_err(|e| OciError::io("open", e))?;
        Ok(u)
    }

    /// Applies one layer read from `blob`, compressed as `compression`.
    pub(crate) fn apply(
        &mut self,
        blob: impl Read,
        compression: Compression,
        digest: &str,
    ) -> Result<(), OciError> {
        let reader: Box<dyn Read + '_> = match compression {
            Compression::None => Box::new(blob),
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(blob)),
            Compression::Zstd => Box::new(ZstdFrames::new(blob)),
        };
        let mut ctx = LayerCtx {
            digest,
            created: HashSet::new(),
        };
        let mut archive = tar::Archive::new(reader);
        let entries = archive.entries().map_err(|e| OciError::Layer {
            layer: digest.to_string(),
            reason: format!("not a tar archive: {e}"),
        })?;
        for entry in entries {
            let mut entry = entry.map_err(|e| OciError::Layer {
                layer: digest.to_string(),
                reason: format!("reading the tar stream: {e}"),
            })?;
            self.apply_entry(&mut entry, &mut ctx)?;
        }
        Ok(())
    }

    /// Ends unpacking.
    pub(crate) fn finish(self) -> Unpacked {
        Unpacked {
            dir: self.dir,
            meta: self.meta,
        }
    }

    fn apply_entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        ctx: &mut LayerCtx<'_>,
    ) -> Result<(), OciError> {
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let rel = normalize(&raw).map_err(|reason| ctx.refuse(&shown, reason))?;
        let kind = entry.header().entry_type();
        let (uid, gid) = owner(entry).map_err(|e| ctx.err(&shown, e))?;
        let mode = entry.header().mode().map_err(|e| ctx.err(&shown, e))?;

        let Some(name) = rel.file_name().map(|n| n.to_os_string()) else {
            // The root itself (`./`): only its owner and mode matter.
            if kind.is_dir() {
                let st = rustix::fs::fstat(self.root.fd()).map_err(|e| ctx.err(&shown, e))?;
                self.record(&st, uid, gid, dir_perm(mode), ctx);
            }
            return Ok(());
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name_bytes = name.as_bytes();

        if let Some(target) = name_bytes.strip_prefix(b".wh.") {
            if target == b".wh..opq" {
                return self.opaque(parent, ctx, &shown);
            }
            if target.starts_with(b".wh.") {
                return Ok(()); // aufs bookkeeping (.wh..wh.plnk, …)
            }
            if target.is_empty() || target == b"." || target == b".." {
                return Err(ctx.refuse(&shown, "whiteout of nothing"));
            }
            return self.whiteout(parent, std::ffi::OsStr::from_bytes(target), ctx, &shown);
        }

        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let pdir = self.ensure_dir(parent, ctx, &shown)?;
                self.clear(&pdir, &name, false, ctx, &shown)?;
                let fd = rustix::fs::openat(
                    &pdir,
                    &name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .map_err(|e| ctx.err(&shown, e))?;
                let mut file = std::fs::File::from(fd);
                std::io::copy(entry, &mut file).map_err(|e| ctx.err(&shown, e))?;
                let st = rustix::fs::fstat(&file).map_err(|e| ctx.err(&shown, e))?;
                self.record(&st, uid, gid, mode & 0o777, ctx);
            }
            tar::EntryType::Directory => {
                let pdir = self.ensure_dir(parent, ctx, &shown)?;
                if !self.clear(&pdir, &name, true, ctx, &shown)? {
                    rustix::fs::mkdirat(&pdir, &name, Mode::from_raw_mode(0o755))
                        .map_err(|e| ctx.err(&shown, e))?;
                }
                let st = rustix::fs::statat(&pdir, &name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| ctx.err(&shown, e))?;
                self.record(&st, uid, gid, dir_perm(mode), ctx);
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| ctx.err(&shown, "symlink without a target"))?;
                let pdir = self.ensure_dir(parent, ctx, &shown)?;
                self.clear(&pdir, &name, false, ctx, &shown)?;
                rustix::fs::symlinkat(std::ffi::OsStr::from_bytes(&target), &pdir, &name)
                    .map_err(|e| ctx.err(&shown, e))?;
                let st = rustix::fs::statat(&pdir, &name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| ctx.err(&shown, e))?;
                self.record(&st, uid, gid, 0o777, ctx);
            }
            tar::EntryType::Link => {
                let raw_target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| ctx.err(&shown, "hardlink without a target"))?;
                let target = normalize(&raw_target).map_err(|reason| {
                    ctx.refuse(&shown, format!("hardlink target leaves the root: {reason}"))
                })?;
                let (Some(tname), Some(tparent)) = (target.file_name(), target.parent()) else {
                    return Err(ctx.refuse(&shown, "hardlink to the root directory"));
                };
                if target == rel {
                    return Ok(());
                }
                let tdir = self.root.open_dir(tparent).map_err(|e| {
                    ctx.err(&shown, format!("hardlink target {}: {e}", target.display()))
                })?;
                let tst =
                    rustix::fs::statat(&tdir, tname, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| {
                        ctx.err(&shown, format!("hardlink target {}: {e}", target.display()))
                    })?;
                if FileType::from_raw_mode(tst.st_mode) == FileType::Directory {
                    return Err(ctx.refuse(&shown, "hardlink to a directory"));
                }
                let pdir = self.ensure_dir(parent, ctx, &shown)?;
                self.clear(&pdir, &name, false, ctx, &shown)?;
                rustix::fs::linkat(&tdir, tname, &pdir, &name, AtFlags::empty())
                    .map_err(|e| ctx.err(&shown, e))?;
                let key = (tst.st_dev, tst.st_ino);
                ctx.created.insert(key);
                self.meta.entry(key).or_insert(Meta {
                    uid,
                    gid,
                    perm: mode & 0o777,
                });
            }
            // Device nodes and FIFOs are dropped. PAX and GNU long-name headers are folded in
            // by the tar reader; anything else (global headers, …) carries no file.
            _ => {}
        }
        Ok(())
    }

    fn record(
        &mut self,
        st: &rustix::fs::Stat,
        uid: u64,
        gid: u64,
        perm: u32,
        ctx: &mut LayerCtx<'_>,
    ) {
        let key = (st.st_dev, st.st_ino);
        ctx.created.insert(key);
        self.meta.insert(key, Meta { uid, gid, perm });
    }

    /// Opens directory `rel`, creating missing components (owned by root, mode 0755).
    fn ensure_dir(
        &mut self,
        rel: &Path,
        ctx: &mut LayerCtx<'_>,
        shown: &str,
    ) -> Result<OwnedFd, OciError> {
        match self.root.open_dir(rel) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(ctx.err(shown, format!("parent {}: {e}", rel.display()))),
        }
        let mut cur = rustix::io::dup(self.root.fd()).map_err(|e| ctx.err(shown, e))?;
        let mut prefix = PathBuf::new();
        for comp in rel.components() {
            prefix.push(comp);
            cur = match self.root.open_dir(&prefix) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    let name = comp.as_os_str();
                    rustix::fs::mkdirat(&cur, name, Mode::from_raw_mode(0o755)).map_err(|e| {
                        let why = if e == Errno::EXIST {
                            "is a dangling symlink".to_string()
                        } else {
                            e.to_string()
                        };
                        ctx.err(shown, format!("parent {}: {why}", prefix.display()))
                    })?;
                    let fd = rustix::fs::openat(
                        &cur,
                        name,
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|e| ctx.err(shown, e))?;
                    let st = rustix::fs::fstat(&fd).map_err(|e| ctx.err(shown, e))?;
                    self.record(&st, 0, 0, 0o755, ctx);
                    fd
                }
                Err(e) => return Err(ctx.err(shown, format!("parent {}: {e}", prefix.display()))),
            };
        }
        Ok(cur)
    }

    /// Makes room for a new entry `name` in `pdir`: an existing directory is kept when the
    /// new entry is a directory too (returns `true`), anything else is removed.
    fn clear(
        &mut self,
        pdir: &OwnedFd,
        name: &std::ffi::OsStr,
        new_is_dir: bool,
        ctx: &mut LayerCtx<'_>,
        shown: &str,
    ) -> Result<bool, OciError> {
        match rustix::fs::statat(pdir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(ctx.err(shown, e)),
            Ok(st) => {
                let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
                if is_dir && new_is_dir {
                    return Ok(true);
                }
                remove_entry(pdir, name, is_dir).map_err(|e| ctx.err(shown, e))?;
                Ok(false)
            }
        }
    }

    fn whiteout(
        &mut self,
        parent: &Path,
        name: &std::ffi::OsStr,
        ctx: &mut LayerCtx<'_>,
        shown: &str,
    ) -> Result<(), OciError> {
        let pdir = match self.root.open_dir(parent) {
            Ok(fd) => fd,
            Err(Errno::NOENT) | Err(Errno::NOTDIR) => return Ok(()),
            Err(e) => return Err(ctx.err(shown, e)),
        };
        match rustix::fs::statat(&pdir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(ctx.err(shown, e)),
            Ok(st) => {
                let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
                remove_entry(&pdir, name, is_dir).map_err(|e| ctx.err(shown, e))
            }
        }
    }

    fn opaque(&mut self, dir: &Path, ctx: &mut LayerCtx<'_>, shown: &str) -> Result<(), OciError> {
        let pdir = self.ensure_dir(dir, ctx, shown)?;
        for (name, st) in list_dir(&pdir).map_err(|e| ctx.err(shown, e))? {
            if !ctx.created.contains(&(st.st_dev, st.st_ino)) {
                let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
                remove_entry(&pdir, &name, is_dir).map_err(|e| ctx.err(shown, e))?;
            }
        }
        Ok(())
    }
}

/// Makes a tar name relative and refuses `..`. The empty path is the root.
fn normalize(raw: &[u8]) -> Result<PathBuf, String> {
    if raw.contains(&0) {
        return Err("NUL byte in name".into());
    }
    let mut out = PathBuf::new();
    for c in Path::new(std::ffi::OsStr::from_bytes(raw)).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err("`..` in path".into()),
            Component::Prefix(_) => return Err("path prefix".into()),
        }
    }
    Ok(out)
}

/// Directory permission bits: setuid dropped; setgid and sticky kept.
fn dir_perm(mode: u32) -> u32 {
    mode & 0o3777
}

/// The owner of an entry: PAX `uid`/`gid` records win over the header fields.
fn owner<R: Read>(entry: &mut tar::Entry<'_, R>) -> std::io::Result<(u64, u64)> {
    // Empty numeric fields read as 0, as Go's archive/tar (and so Docker) reads them.
    let mut uid = numeric_or_zero(&entry.header().as_old().uid, entry.header().uid())?;
    let mut gid = numeric_or_zero(&entry.header().as_old().gid, entry.header().gid())?;
    if let Some(exts) = entry.pax_extensions()? {
        for ext in exts {
            let ext = ext?;
            let parse = || ext.value().ok().and_then(|v| v.trim().parse::<u64>().ok());
            match ext.key() {
                Ok("uid") => uid = parse().unwrap_or(uid),
                Ok("gid") => gid = parse().unwrap_or(gid),
                _ => {}
            }
        }
    }
    Ok((uid, gid))
}

fn numeric_or_zero(field: &[u8], parsed: std::io::Result<u64>) -> std::io::Result<u64> {
    if field.iter().all(|b| *b == 0 || *b == b' ') {
        return Ok(0);
    }
    parsed
}

/// Entries of a directory (without `.` and `..`) with their `lstat`.
fn list_dir(dir: &OwnedFd) -> rustix::io::Result<Vec<(std::ffi::OsString, rustix::fs::Stat)>> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    for ent in rustix::fs::Dir::read_from(&fd)? {
        let ent = ent?;
        let name = ent.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = std::ffi::OsStr::from_bytes(name).to_os_string();
        let st = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW)?;
        out.push((name, st));
    }
    Ok(out)
}

/// Removes `name` from `dir`; a directory with everything below it (never following symlinks).
fn remove_entry(dir: &OwnedFd, name: &std::ffi::OsStr, is_dir: bool) -> rustix::io::Result<()> {
    if !is_dir {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty());
    }
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for (child, st) in list_dir(&sub)? {
        let child_is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        remove_entry(&sub, &child, child_is_dir)?;
    }
    rustix::fs::unlinkat(dir.as_fd(), name, AtFlags::REMOVEDIR)
}

/// A zstd stream of one or more frames, decoded in pure Rust.
struct ZstdFrames<R: Read> {
    source: Option<R>,
    decoder: Option<
        ruzstd::decoding::StreamingDecoder<std::io::BufReader<R>, ruzstd::decoding::FrameDecoder>,
    >,
}

impl<R: Read> ZstdFrames<R> {
    fn new(source: R) -> ZstdFrames<R> {
        ZstdFrames {
            source: Some(source),
            decoder: None,
        }
    }
}

impl<R: Read> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if let Some(dec) = self.decoder.as_mut() {
                let n = dec.read(buf)?;
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
                // Frame done; anything after it is another frame.
                let Some(dec) = self.decoder.take() else {
                    return Ok(0);
                };
                let mut rest = dec.into_inner();
                if rest.fill_buf_empty()? {
                    return Ok(0);
                }
                self.start(rest)?;
                continue;
            }
            let Some(src) = self.source.take() else {
                return Ok(0);
            };
            self.start(std::io::BufReader::new(src))?;
        }
    }
}

impl<R: Read> ZstdFrames<R> {
    fn start(&mut self, src: std::io::BufReader<R>) -> std::io::Result<()> {
        let dec = ruzstd::decoding::StreamingDecoder::new(src)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        self.decoder = Some(dec);
        Ok(())
    }
}

/// `BufRead::fill_buf` is empty: the stream has ended.
trait FillBufEmpty {
    fn fill_buf_empty(&mut self) -> std::io::Result<bool>;
}

impl<R: Read> FillBufEmpty for std::io::BufReader<R> {
    fn fill_buf_empty(&mut self) -> std::io::Result<bool> {
        use std::io::BufRead;
        Ok(self.fill_buf()?.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, data, link) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o644);
            h.set_uid(7);
            h.set_gid(8);
            h.set_size(data.len() as u64);
            if kind.is_symlink() || kind.is_hard_link() {
                b.append_link(&mut h, path, link).unwrap();
            } else {
                b.append_data(&mut h, path, *data).unwrap();
            }
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn zstd_layers_with_several_frames_unpack() {
        let tar = tar_of(&[
            ("a/one.txt", tar::EntryType::Regular, b"first frame", ""),
            ("a/two.txt", tar::EntryType::Regular, &[b'z'; 5000], ""),
        ]);
        // Two concatenated zstd frames, split at a tar block boundary.
        let level = ruzstd::encoding::CompressionLevel::Fastest;
        let mut blob = ruzstd::encoding::compress_to_vec(&tar[..1024], level);
        blob.extend(ruzstd::encoding::compress_to_vec(&tar[1024..], level));
        let dir = tempfile::tempdir().unwrap();
        let mut u = Unpacker::new(dir.path()).unwrap();
        u.apply(blob.as_slice(), Compression::Zstd, "sha256:test")
            .unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("a/one.txt")).unwrap(),
            b"first frame"
        );
        assert_eq!(
            std::fs::read(dir.path().join("a/two.txt")).unwrap(),
            vec![b'z'; 5000]
        );
        let meta = u.finish().meta;
        let st = std::fs::metadata(dir.path().join("a/one.txt")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            meta[&(st.dev(), st.ino())],
            Meta {
                uid: 7,
                gid: 8,
                perm: 0o644
            }
        );

        let mut u = Unpacker::new(dir.path()).unwrap();
        let err = u
            .apply(&b"not zstd at all"[..], Compression::Zstd, "sha256:bad")
            .unwrap_err();
        assert!(matches!(err, OciError::Layer { .. }), "{err}");
    }

    /// The user-space resolver keeps writes inside too (kernels without openat2).
    #[test]
    fn fallback_resolution_keeps_writes_inside() {
        let top = tempfile::tempdir().unwrap();
        let root = top.path().join("root");
        let outside = top.path().join("outside");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&outside).unwrap();
        let tar = tar_of(&[
            ("up", tar::EntryType::Symlink, b"", "../../../.."),
            ("up/x.txt", tar::EntryType::Regular, b"inside", ""),
            (
                "abs",
                tar::EntryType::Symlink,
                b"",
                outside.to_str().unwrap(),
            ),
            ("abs/y.txt", tar::EntryType::Regular, b"never", ""),
        ]);
        let mut u = Unpacker::new_without_openat2(&root).unwrap();
        let err = u
            .apply(tar.as_slice(), Compression::None, "sha256:t")
            .unwrap_err();
        assert!(err.to_string().contains("abs/y.txt"), "{err}");
        assert_eq!(std::fs::read(root.join("x.txt")).unwrap(), b"inside");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        assert!(!top.path().join("x.txt").exists());
    }
}
