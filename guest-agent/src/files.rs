//! File RPCs confined to `/workspace`, `/home` and `/etc/voidbox`.
//!
//! Each root is held as an `O_PATH` directory fd opened at start-up; every lookup below it
//! goes through `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`, so `..`, absolute
//! symlinks and `/proc` magic links cannot leave the root. Paths are additionally checked
//! lexically: they must name a root, and `..` components are rejected outright.
//!
//! Files and directories created under `/workspace` and `/home` belong to the command user
//! (uid/gid 1000, or `voidbox.user`); under `/etc/voidbox` (host-provided configuration)
//! they stay root's, read-only to the sandbox user. Writes refuse non-regular files and hard-linked files (a hard link made by
//! the sandbox user must not let the root agent write through it).

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use voidbox_protocol::{ErrorCode, FileKind};

use crate::spawn::Credentials;

/// Largest file a single WriteFile transfer may produce.
pub const MAX_WRITE_BYTES: u64 = 1 << 30;
/// Longest accepted path.
pub const MAX_PATH_LEN: usize = 4096;
/// Default permission bits of created files.
pub const DEFAULT_FILE_MODE: u32 = 0o644;
/// Default permission bits of created directories.
pub const DEFAULT_DIR_MODE: u32 = 0o755;

/// A failed file operation: protocol error code + message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// Error category for the response.
    pub code: ErrorCode,
    /// Human-readable detail.
    pub message: String,
}

impl FileError {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        FileError {
            code,
            message: message.into(),
        }
    }

    fn denied(path: &str, why: &str) -> Self {
        FileError::new(
            ErrorCode::PathDenied,
            format!("path `{path}` denied: {why}"),
        )
    }

    fn io(path: &str, e: io::Error) -> Self {
        let code = match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => ErrorCode::NotFound,
            Some(libc::EEXIST) => ErrorCode::AlreadyExists,
            Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => {
                ErrorCode::PermissionDenied
            }
            Some(libc::EXDEV) | Some(libc::ELOOP) => ErrorCode::PathDenied,
            Some(libc::EFBIG) | Some(libc::ENOSPC) => ErrorCode::TooLarge,
            _ => ErrorCode::Io,
        };
        FileError::new(code, format!("{path}: {e}"))
    }
}

/// Result of a file operation.
pub type FileResult<T> = Result<T, FileError>;

struct Root {
    /// Guest path of the root (`/workspace`).
    name: &'static str,
    /// `O_PATH` directory fd (absent when the directory does not exist).
    fd: Option<OwnedFd>,
    /// Ownership of things created below it.
    owner: Option<(u32, u32)>,
}

/// The confinement roots.
pub struct Roots {
    roots: Vec<Root>,
    chown: bool,
}

/// The guest paths of the roots, with the owner of created entries.
pub const ROOTS: [(&str, bool); 3] = [
    ("/workspace", true),
    ("/home", true),
    ("/etc/voidbox", false),
];

impl Roots {
    /// Opens the roots below `base` (`/` in the guest; `--root DIR` on the host, where
    /// `/workspace` becomes `DIR/workspace`). Missing roots are tolerated (requests for
    /// them fail with `PathDenied`). What is created under `/workspace` and `/home` belongs
    /// to `owner` (the command user: 1000:1000, or `voidbox.user`).
    pub fn open(base: &Path, owner: Credentials) -> Roots {
        let roots = ROOTS
            .iter()
            .map(|&(name, sandbox_owned)| {
                let dir = base.join(name.trim_start_matches('/'));
                let fd = open_path_dir(&dir).ok();
                if fd.is_none() {
                    crate::debug!("confinement root {} not available", dir.display());
                }
                Root {
                    name,
                    fd,
                    owner: sandbox_owned.then_some((owner.uid, owner.gid)),
                }
            })
            .collect();
        // SAFETY: geteuid has no preconditions.
        let chown = unsafe { libc::geteuid() } == 0;
        Roots { roots, chown }
    }

    /// Splits a guest path into (root, relative path), rejecting anything outside the roots.
    /// Relative paths are taken relative to `/workspace`.
    fn locate<'a>(&'a self, path: &str) -> FileResult<(&'a Root, &'a OwnedFd, String)> {
        if path.is_empty() {
            return Err(FileError::new(ErrorCode::InvalidRequest, "empty path"));
        }
        if path.len() > MAX_PATH_LEN {
            return Err(FileError::new(ErrorCode::TooLarge, "path too long"));
        }
        if path.contains('\0') {
            return Err(FileError::denied(path, "contains a NUL byte"));
        }
        let mut parts: Vec<&str> = Vec::new();
        let rel_to_workspace = !path.starts_with('/');
        if rel_to_workspace {
            parts.push("workspace");
        }
        for c in path.split('/') {
            match c {
                "" | "." => {}
                ".." => return Err(FileError::denied(path, "`..` is not allowed")),
                c => parts.push(c),
            }
        }
        for root in &self.roots {
            let comps: Vec<&str> = root.name.split('/').filter(|c| !c.is_empty()).collect();
            if parts.len() >= comps.len() && parts[..comps.len()] == comps[..] {
                let Some(fd) = &root.fd else {
                    return Err(FileError::denied(path, "root is not available"));
                };
                let rel = parts[comps.len()..].join("/");
                return Ok((root, fd, if rel.is_empty() { ".".into() } else { rel }));
            }
        }
        Err(FileError::denied(
            path,
            "outside /workspace, /home and /etc/voidbox",
        ))
    }

    fn chown_created(&self, root: &Root, fd: RawFd) {
        if let (true, Some((uid, gid))) = (self.chown, root.owner) {
            // SAFETY: fchown on an fd we own.
            unsafe { libc::fchown(fd, uid, gid) };
        }
    }

    /// Creates a directory and its missing parents (`mkdir -p`).
    pub fn mkdir_p(&self, path: &str, mode: Option<u32>) -> FileResult<()> {
        let (root, rootfd, rel) = self.locate(path)?;
        self.mkdir_rel(root, rootfd, &rel, mode.unwrap_or(DEFAULT_DIR_MODE) & 0o777)
            .map_err(|e| FileError::io(path, e))
    }

    fn mkdir_rel(&self, root: &Root, rootfd: &OwnedFd, rel: &str, mode: u32) -> io::Result<()> {
        if rel == "." {
            return Ok(());
        }
        let mut dir = open_in_root(rootfd, ".", libc::O_PATH | libc::O_DIRECTORY, 0)?;
        let mut prefix = String::new();
        for comp in rel.split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(comp);
            match open_in_root(rootfd, &prefix, libc::O_PATH | libc::O_DIRECTORY, 0) {
                Ok(fd) => dir = fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let name = cstr(comp)?;
                    // SAFETY: `dir` is a directory fd resolved inside the root and `name` a
                    // single component, so mkdirat cannot create anything outside it.
                    let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) };
                    if rc < 0 {
                        let err = io::Error::last_os_error();
                        if err.raw_os_error() != Some(libc::EEXIST) {
                            return Err(err);
                        }
                    }
                    let fd = open_in_root(rootfd, &prefix, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
                    if rc == 0 {
                        self.chown_created(root, fd.as_raw_fd());
                        // SAFETY: fchmod on an fd we own (mkdirat's mode was filtered by umask).
                        unsafe { libc::fchmod(fd.as_raw_fd(), mode) };
                    }
                    dir = fd;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Opens a file for a WriteFile transfer (truncating it), creating parents on request.
    pub fn create_file(
        &self,
        path: &str,
        mode: Option<u32>,
        create_parents: bool,
    ) -> FileResult<File> {
        let (root, rootfd, rel) = self.locate(path)?;
        if rel == "." {
            return Err(FileError::new(
                ErrorCode::InvalidRequest,
                format!("{path} is a directory"),
            ));
        }
        let mode = mode.unwrap_or(DEFAULT_FILE_MODE) & 0o777;
        if create_parents {
            if let Some((parent, _)) = rel.rsplit_once('/') {
                self.mkdir_rel(root, rootfd, parent, DEFAULT_DIR_MODE)
                    .map_err(|e| FileError::io(path, e))?;
            }
        }
        let base = libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC;
        let (fd, created) =
            match open_in_root(rootfd, &rel, base | libc::O_CREAT | libc::O_EXCL, mode) {
                Ok(fd) => (fd, true),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => (
                    open_in_root(rootfd, &rel, base, 0).map_err(|e| FileError::io(path, e))?,
                    false,
                ),
                Err(e) => return Err(FileError::io(path, e)),
            };
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| FileError::io(path, e))?;
        if !meta.file_type().is_file() {
            return Err(FileError::denied(path, "not a regular file"));
        }
        if meta.nlink() > 1 {
            return Err(FileError::denied(path, "file has several hard links"));
        }
        if created {
            self.chown_created(root, file.as_raw_fd());
            // SAFETY: fchmod on an fd we own (openat2's mode was filtered by umask).
            unsafe { libc::fchmod(file.as_raw_fd(), mode) };
        } else {
            file.set_len(0).map_err(|e| FileError::io(path, e))?;
        }
        clear_nonblock(&file);
        Ok(file)
    }

    /// Opens a regular file for reading.
    pub fn open_read(&self, path: &str) -> FileResult<File> {
        let (_, rootfd, rel) = self.locate(path)?;
        let fd = open_in_root(
            rootfd,
            &rel,
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| FileError::io(path, e))?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| FileError::io(path, e))?;
        if !meta.file_type().is_file() {
            return Err(FileError::new(
                ErrorCode::InvalidRequest,
                format!("{path} is not a regular file"),
            ));
        }
        clear_nonblock(&file);
        Ok(file)
    }

    /// Reads `[offset, offset + max_len)` of a file in chunks of at most `chunk` bytes,
    /// handing each to `sink(offset, data, last)`. An empty range yields one empty last chunk.
    pub fn read_chunks(
        &self,
        path: &str,
        offset: u64,
        max_len: Option<u64>,
        chunk: usize,
        mut sink: impl FnMut(u64, &[u8], bool) -> io::Result<()>,
    ) -> FileResult<()> {
        let mut file = self.open_read(path)?;
        let size = file.metadata().map_err(|e| FileError::io(path, e))?.len();
        let end = max_len.map_or(size, |m| offset.saturating_add(m).min(size));
        let mut pos = offset.min(end);
        file.seek(SeekFrom::Start(pos))
            .map_err(|e| FileError::io(path, e))?;
        let mut buf = vec![0u8; chunk.clamp(1, voidbox_protocol::FILE_CHUNK_SIZE)];
        loop {
            let want = usize::try_from(end - pos)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let n = if want == 0 {
                0
            } else {
                read_some(&mut file, &mut buf[..want]).map_err(|e| FileError::io(path, e))?
            };
            let last = n == 0 || pos + n as u64 >= end;
            sink(pos, &buf[..n], last).map_err(|e| FileError::io(path, e))?;
            pos += n as u64;
            if last {
                return Ok(());
            }
        }
    }

    /// Metadata of a path, without following a final symlink.
    pub fn stat(&self, path: &str) -> FileResult<Stat> {
        let (_, rootfd, rel) = self.locate(path)?;
        let fd = open_in_root(
            rootfd,
            &rel,
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| FileError::io(path, e))?;
        // SAFETY: libc::stat is plain data filled by fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat on an O_PATH fd we own (allowed since Linux 3.6) into valid memory.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(FileError::io(path, io::Error::last_os_error()));
        }
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            _ => FileKind::Other,
        };
        Ok(Stat {
            kind,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            mtime_secs: st.st_mtime,
        })
    }
}

impl Roots {
    /// The entries of a directory (sorted by name, without `.` and `..`, at most
    /// `max` of them; the flag says whether more existed). Entries are `lstat`ed: a
    /// symlink is reported as one, never followed.
    pub fn list_dir(
        &self,
        path: &str,
        max: usize,
    ) -> FileResult<(Vec<voidbox_protocol::DirEntry>, bool)> {
        use std::os::unix::ffi::OsStrExt;
        let (_, rootfd, rel) = self.locate(path)?;
        let fd = open_in_root(
            rootfd,
            &rel,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| FileError::io(path, e))?;
        let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
        // SAFETY: `raw` is an open directory fd; on success the DIR stream owns it.
        let dir = unsafe { libc::fdopendir(raw) };
        if dir.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so we still own `raw`.
            unsafe { libc::close(raw) };
            return Err(FileError::io(path, e));
        }
        let mut entries = Vec::new();
        let mut truncated = false;
        loop {
            // SAFETY: `dir` is a valid DIR stream until closedir below.
            let ent = unsafe { libc::readdir64(dir) };
            if ent.is_null() {
                break;
            }
            // SAFETY: readdir64 returned a valid entry with a NUL-terminated name.
            let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) };
            let bytes = name.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            if entries.len() >= max {
                truncated = true;
                break;
            }
            // SAFETY: libc::stat is plain data filled by fstatat.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: valid dir fd, NUL-terminated name, valid out pointer.
            let ok = unsafe {
                libc::fstatat(
                    libc::dirfd(dir),
                    name.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            } == 0;
            let utf8 = std::str::from_utf8(bytes).ok();
            let kind = match (ok, utf8, st.st_mode & libc::S_IFMT) {
                (true, Some(_), libc::S_IFREG) => FileKind::File,
                (true, Some(_), libc::S_IFDIR) => FileKind::Dir,
                (true, Some(_), libc::S_IFLNK) => FileKind::Symlink,
                _ => FileKind::Other,
            };
            entries.push(voidbox_protocol::DirEntry {
                name: std::ffi::OsStr::from_bytes(bytes)
                    .to_string_lossy()
                    .into_owned(),
                kind,
                size: if kind == FileKind::File {
                    u64::try_from(st.st_size).unwrap_or(0)
                } else {
                    0
                },
            });
        }
        // SAFETY: closes the stream and its fd exactly once.
        unsafe { libc::closedir(dir) };
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((entries, truncated))
    }
}

/// Metadata returned by [`Roots::stat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Object kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time (Unix seconds).
    pub mtime_secs: i64,
}

/// An in-progress WriteFile transfer (sequential chunks, size-capped).
pub struct FileWriter {
    file: File,
    written: u64,
    path: String,
}

impl FileWriter {
    /// Starts a transfer on a file opened by [`Roots::create_file`].
    pub fn new(file: File, path: &str) -> Self {
        FileWriter {
            file,
            written: 0,
            path: path.to_string(),
        }
    }

    /// Appends `data`, which must start at `offset` (the bytes written so far).
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> FileResult<()> {
        if offset != self.written {
            return Err(FileError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "{}: chunk at offset {offset}, expected {}",
                    self.path, self.written
                ),
            ));
        }
        let new_len = self.written.saturating_add(data.len() as u64);
        if new_len > MAX_WRITE_BYTES {
            return Err(FileError::new(
                ErrorCode::TooLarge,
                format!("{}: file larger than {} bytes", self.path, MAX_WRITE_BYTES),
            ));
        }
        self.file
            .write_all(data)
            .map_err(|e| FileError::io(&self.path, e))?;
        self.written = new_len;
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }
}

fn read_some(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match f.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

fn clear_nonblock(f: &File) {
    // SAFETY: F_GETFL/F_SETFL on an fd we own.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn open_path_dir(dir: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: freshly opened fd owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat2(root, rel, flags, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`.
pub fn open_in_root(
    root: &OwnedFd,
    rel: &str,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    let path = cstr(rel)?;
    // SAFETY: open_how is plain data; all-zero is a valid value (non_exhaustive prevents
    // a struct literal).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & libc::O_CREAT != 0 {
        u64::from(mode)
    } else {
        0
    };
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        // SAFETY: valid dirfd, NUL-terminated path, and a pointer/size pair describing `how`.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                path.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel returned a new fd owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        let err = io::Error::last_os_error();
        // EAGAIN: a concurrent rename raced the lookup; retry (the kernel asks us to).
        if err.raw_os_error() != Some(libc::EAGAIN) && err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Roots) {
        let dir = tempfile::tempdir().unwrap();
        for (r, _) in ROOTS {
            std::fs::create_dir_all(dir.path().join(r.trim_start_matches('/'))).unwrap();
        }
        let roots = Roots::open(dir.path(), crate::spawn::SANDBOX);
        (dir, roots)
    }

    #[test]
    fn lexical_checks() {
        let (_d, r) = setup();
        for bad in [
            "/etc/passwd",
            "/proc/self/environ",
            "/workspace/../etc/passwd",
            "/",
            "/etc/voidboxx/a",
            "/workspacex",
        ] {
            let e = r.stat(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::PathDenied, "{bad}: {e:?}");
        }
        assert!(r.stat("/workspace").is_ok());
        assert!(r.stat("/etc/voidbox/").is_ok());
        assert!(r
            .stat("relative")
            .is_err_and(|e| e.code == ErrorCode::NotFound));
    }

    #[test]
    fn symlinks_stay_inside() {
        let (d, r) = setup();
        let ws = d.path().join("workspace");
        std::os::unix::fs::symlink("/etc/passwd", ws.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../../etc/passwd", ws.join("rel")).unwrap();
        std::os::unix::fs::symlink("/proc/self/root/etc/passwd", ws.join("magic")).unwrap();
        for l in ["/workspace/abs", "/workspace/rel", "/workspace/magic"] {
            assert!(r.open_read(l).is_err(), "{l}");
            assert!(r.create_file(l, None, false).is_err(), "{l}");
        }
        assert!(!ws.join("etc").exists() && !ws.join("proc").exists());
        assert_eq!(r.stat("/workspace/abs").unwrap().kind, FileKind::Symlink);
    }

    #[test]
    fn list_dir_lstats_and_stays_inside() {
        let (tmp, roots) = setup();
        let ws = tmp.path().join("workspace");
        std::fs::create_dir_all(ws.join("out/sub")).unwrap();
        std::fs::write(ws.join("out/a.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.join("out/link")).unwrap();
        let (entries, truncated) = roots.list_dir("/workspace/out", 10).unwrap();
        assert!(!truncated);
        let got: Vec<(&str, FileKind, u64)> = entries
            .iter()
            .map(|e| (e.name.as_str(), e.kind, e.size))
            .collect();
        assert_eq!(
            got,
            [
                ("a.txt", FileKind::File, 5),
                ("link", FileKind::Symlink, 0),
                ("sub", FileKind::Dir, 0)
            ]
        );
        let (few, truncated) = roots.list_dir("/workspace/out", 1).unwrap();
        assert_eq!((few.len(), truncated), (1, true));
        assert!(roots.list_dir("/workspace/out/link", 10).is_err());
        assert!(roots.list_dir("/tmp", 10).is_err());
        assert!(roots.list_dir("/workspace/missing", 10).is_err());
    }

    #[test]
    fn write_read_mkdir() {
        let (d, r) = setup();
        r.mkdir_p("/workspace/a/b/c", None).unwrap();
        assert!(d.path().join("workspace/a/b/c").is_dir());
        let f = r
            .create_file("/workspace/a/b/c/f.txt", Some(0o4755), false)
            .unwrap();
        let mut w = FileWriter::new(f, "x");
        w.write_at(0, b"hello ").unwrap();
        assert!(w.write_at(0, b"again").is_err());
        w.write_at(6, b"world").unwrap();
        let st = r.stat("/workspace/a/b/c/f.txt").unwrap();
        assert_eq!((st.kind, st.size, st.mode), (FileKind::File, 11, 0o755));
        let mut got = Vec::new();
        r.read_chunks(
            "/workspace/a/b/c/f.txt",
            2,
            Some(7),
            3,
            |off, data, last| {
                got.push((off, data.to_vec(), last));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                (2, b"llo".to_vec(), false),
                (5, b" wo".to_vec(), false),
                (8, b"r".to_vec(), true)
            ]
        );
        // Hard-linked files are refused for writing.
        std::fs::hard_link(
            d.path().join("workspace/a/b/c/f.txt"),
            d.path().join("workspace/link"),
        )
        .unwrap();
        assert_eq!(
            r.create_file("/workspace/link", None, false)
                .unwrap_err()
                .code,
            ErrorCode::PathDenied
        );
        assert!(r.create_file("/workspace/x/y/z", None, false).is_err());
        assert!(r.create_file("/workspace/x/y/z", None, true).is_ok());
    }
}
