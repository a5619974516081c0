//! Thin wrappers over the mount system calls the disk setup needs: `mount`, detached
//! mount clones (`open_tree` + `move_mount`), `pivot_root`, and waiting for a device node.
//!
//! Every error names the call and its paths, because it ends up verbatim on the console and
//! in the answer to every exec of a node whose disks failed.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// `open_tree(2)`: clone the mount tree instead of referring to it.
const OPEN_TREE_CLONE: libc::c_uint = 1;
/// `move_mount(2)`: the source is the fd itself (empty path).
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
/// `move_mount(2)`: follow a symlink at the target.
const MOVE_MOUNT_T_SYMLINKS: libc::c_uint = 0x10;

/// A path as a C string.
pub fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn last_error(what: String) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

/// `mount(source, target, fstype, flags, data)`; an empty `data` passes NULL.
pub fn mount(
    source: &Path,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> Result<(), String> {
    let what = || {
        format!(
            "mount {fstype} {} on {}{}",
            source.display(),
            target.display(),
            if data.is_empty() {
                String::new()
            } else {
                format!(" ({data})")
            }
        )
    };
    let (src, tgt) = (
        cpath(source).map_err(|e| format!("{}: {e}", what()))?,
        cpath(target).map_err(|e| format!("{}: {e}", what()))?,
    );
    let (fs, opts) = (
        CString::new(fstype).map_err(|_| format!("{}: NUL byte", what()))?,
        CString::new(data).map_err(|_| format!("{}: NUL byte", what()))?,
    );
    let opts_ptr = if data.is_empty() {
        std::ptr::null()
    } else {
        opts.as_ptr().cast()
    };
    // SAFETY: all strings are NUL-terminated and outlive the call.
    let rc = unsafe { libc::mount(src.as_ptr(), tgt.as_ptr(), fs.as_ptr(), flags, opts_ptr) };
    if rc < 0 {
        return Err(last_error(what()));
    }
    Ok(())
}

/// Makes every mount of the calling thread's mount namespace private (`mount --make-rprivate /`),
/// so that nothing mounted afterwards propagates to another namespace.
pub fn make_private() -> Result<(), String> {
    // SAFETY: a propagation change: source, fstype and data are ignored and may be NULL.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        return Err(last_error("making the mounts private".into()));
    }
    Ok(())
}

/// `mkdir -p` with mode 0755 (a missing parent is created too).
pub fn mkdir_p(path: &Path) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| format!("mkdir {}: {e}", path.display()))
}

/// What [`file_mount_point`] does with what it finds at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileMountPoint {
    /// A regular file: mounted over as it is.
    Use,
    /// Nothing: an empty file is created (and the missing parent directories).
    Create,
    /// A symbolic link (dangling or not): replaced by an empty file, so that the mount
    /// lands at the path itself and never where a link points (`/etc/resolv.conf ->
    /// /run/systemd/…` in an image, or a link into `/dev` or `/proc`).
    ReplaceLink,
    /// A directory or a special file: refused.
    Refuse,
}

/// Decides what [`file_mount_point`] does with `path` (looked at without following a
/// symlink at its last component).
pub fn file_mount_point_choice(path: &Path) -> io::Result<FileMountPoint> {
    match path.symlink_metadata() {
        Ok(m) if m.is_file() => Ok(FileMountPoint::Use),
        Ok(m) if m.file_type().is_symlink() => Ok(FileMountPoint::ReplaceLink),
        Ok(_) => Ok(FileMountPoint::Refuse),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(FileMountPoint::Create),
        Err(e) => Err(e),
    }
}

/// Makes sure a regular file is at `path`, to bind-mount a file over: an existing one is
/// used as it is, a symlink is replaced by an empty file, and an empty file (with its parent
/// directories) is created where nothing is. A directory or special file is an error, as
/// is a read-only file system where something must change.
pub fn file_mount_point(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let choice =
        file_mount_point_choice(path).map_err(|e| format!("looking at {}: {e}", path.display()))?;
    match choice {
        FileMountPoint::Use => return Ok(()),
        FileMountPoint::Refuse => {
            return Err(format!(
                "{} is a directory or special file, not a file to mount over",
                path.display()
            ))
        }
        FileMountPoint::ReplaceLink => std::fs::remove_file(path)
            .map_err(|e| format!("replacing the symlink {}: {e}", path.display()))?,
        FileMountPoint::Create => {
            if let Some(parent) = path.parent() {
                mkdir_p(parent)?;
            }
        }
    }
    // O_CREAT | O_EXCL: never follows a symlink raced in at the path.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map(drop)
        .map_err(|e| format!("creating {}: {e}", path.display()))
}

/// Waits until `path` exists (a device node that devtmpfs has not created yet), polling
/// every 10 ms for at most `limit`.
pub fn wait_for(path: &Path, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if path.symlink_metadata().is_ok() {
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(format!(
                "{} does not exist (waited {} ms)",
                path.display(),
                limit.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A detached copy of the mount tree at `path` and everything mounted below it
/// (`open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`), to be attached elsewhere with
/// [`attach_clone`] — also after a `pivot_root` has made `path` unreachable.
pub fn clone_tree(path: &Path) -> Result<OwnedFd, String> {
    let p = cpath(path).map_err(|e| format!("cloning {}: {e}", path.display()))?;
    let flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: NUL-terminated path; the returned fd is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, p.as_ptr(), flags) };
    if fd < 0 {
        return Err(last_error(format!(
            "cloning the mounts at {}",
            path.display()
        )));
    }
    // SAFETY: a fresh fd owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Attaches a detached tree from [`clone_tree`] at `target` (`move_mount`), which is
/// resolved in the calling thread's root; a symlink at `target` is followed there.
pub fn attach_clone(tree: &OwnedFd, target: &Path) -> Result<(), String> {
    let t = cpath(target).map_err(|e| format!("mounting on {}: {e}", target.display()))?;
    // SAFETY: `tree` is an open_tree fd, the empty source path selects it, `t` is
    // NUL-terminated.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_SYMLINKS,
        )
    };
    if rc < 0 {
        return Err(last_error(format!(
            "attaching a mount on {}",
            target.display()
        )));
    }
    Ok(())
}

/// Makes `new_root` (a mount point) the root of the calling thread, whose mount namespace
/// must be its own: `pivot_root(".", ".")` from inside it, then the old root — stacked on
/// top — is detached. The thread's working directory is the new `/` afterwards.
pub fn pivot_into(new_root: &Path) -> Result<(), String> {
    let open_dir = |p: &Path| -> Result<OwnedFd, String> {
        let c = cpath(p).map_err(|e| format!("opening {}: {e}", p.display()))?;
        // SAFETY: NUL-terminated path; the fd is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(last_error(format!("opening {}", p.display())));
        }
        // SAFETY: a fresh fd owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let old_root = open_dir(Path::new("/"))?;
    let new = open_dir(new_root)?;
    // SAFETY: fchdir to a directory fd we own.
    if unsafe { libc::fchdir(new.as_raw_fd()) } < 0 {
        return Err(last_error(format!("chdir {}", new_root.display())));
    }
    // SAFETY: pivot_root with two NUL-terminated paths.
    if unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) } < 0 {
        let e = io::Error::last_os_error();
        let hint = if e.raw_os_error() == Some(libc::EINVAL) {
            " (the agent's own root must be a mount with a parent, not the initramfs rootfs)"
        } else {
            ""
        };
        return Err(format!("pivot_root into {}: {e}{hint}", new_root.display()));
    }
    // The old root is now stacked on the new one; "." from its fd is that old root.
    // SAFETY: fchdir to a directory fd we own.
    if unsafe { libc::fchdir(old_root.as_raw_fd()) } < 0 {
        return Err(last_error("chdir to the old root".into()));
    }
    // SAFETY: NUL-terminated path; MNT_DETACH unmounts lazily.
    if unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) } < 0 {
        return Err(last_error("detaching the old root".into()));
    }
    // SAFETY: NUL-terminated path.
    if unsafe { libc::chdir(c"/".as_ptr()) } < 0 {
        return Err(last_error("chdir /".into()));
    }
    Ok(())
}

/// Whether `path` is a mounted sysfs (the compat kernel has none).
pub fn is_sysfs(path: &Path) -> bool {
    let Ok(p) = cpath(path) else {
        return false;
    };
    // SAFETY: statfs is plain data filled by the kernel.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path and a valid out-pointer.
    if unsafe { libc::statfs(p.as_ptr(), &mut st) } < 0 {
        return false;
    }
    st.f_type as u64 == libc::SYSFS_MAGIC as u64
}
