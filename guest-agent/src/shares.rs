//! Host directory shares: on the host's `MountShare`, mounts the VMM's virtio-9p share slot
//! `voidbox<slot>` at a guest path, in every root commands run in.
//!
//! * The path follows [`voidbox_protocol::guest_paths`] (the rule `validate` and the engine
//!   apply before a VM starts): never `/`, `/home`, `/home/sandbox`, `/tmp`, nor at or under
//!   `/proc`, `/sys`, `/dev`, `/run`, `/etc/voidbox`, `/opt/voidbox` or the agent's binary,
//!   nor a directory holding one of those (`/etc`, `/sbin`, `/opt`).
//! * On the read-only system disk, a mount point outside `/workspace` and `/home` can only be
//!   created when the engine asked for a writable root at boot
//!   ([`voidbox_protocol::guest_paths::WRITABLE_ROOT_PARAM`]); it does for such shares.
//! * The mount point is reached one component at a time from `/` with
//!   `openat(O_PATH | O_NOFOLLOW | O_DIRECTORY)`, missing directories created on the way
//!   (given to the command user): a symlink anywhere on the path is refused, and the mount
//!   lands on the directory that was checked (`/proc/self/fd/N`), whatever a command
//!   renames meanwhile.
//! * Options: `trans=virtio,version=9p2000.L,msize=512000,cache=none,access=client`, plus
//!   `MS_NOSUID | MS_NODEV` and `MS_RDONLY` for a read-only share. `cache=none` keeps the
//!   guest and the host in step (what one writes the other reads at once); the price is no
//!   shared writable `mmap` on a share. `access=client` lets the guest kernel check
//!   permissions against the owners the VMM reports (the host user appears as the command
//!   user). 512000 bytes is the most Linux 6.1's virtio transport carries per message.
//! * With the node's image as the root of commands ([`ExecRoot::Image`]), the share is
//!   mounted in the agent's namespace — at the path when it can be made there (so file RPCs
//!   under `/workspace` and `/home` see it too), else at `/run/voidbox/shares/<slot>` — and a
//!   clone of that mount is attached at the path inside the image's namespace. One 9P
//!   session serves both (a virtio channel carries one mount).
//! * A slot is mounted once; the kernel's answer for a slot the VMM has not bound (it
//!   refuses the attach) is `NotFound`.
//!
//! Only PID 1 mounts: an agent running as a host process (tests) answers `Unsupported`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;

use voidbox_protocol::{guest_paths, ErrorCode, MountShare, MAX_SHARE_SLOTS};

use crate::rootfs::ExecRoot;
use crate::spawn::Credentials;

/// `msize` the guest asks for (the VMM caps it at 512 KiB; Linux 6.1's virtio transport at
/// 512000 bytes).
pub const MSIZE: u32 = 512_000;
/// Where a share is mounted in the agent's namespace when its path cannot be made there.
pub const STAGING: &str = "/run/voidbox/shares";

/// `open_tree(2)`: clone the mount instead of referring to it.
const OPEN_TREE_CLONE: libc::c_uint = 1;
/// `move_mount(2)`: the source is the fd itself.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
/// `move_mount(2)`: the target is the fd itself.
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// Which slot is mounted where.
static MOUNTED: Mutex<[Option<String>; MAX_SHARE_SLOTS as usize]> =
    Mutex::new([None, None, None, None]);

/// A refused or failed mount, as the host is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareError {
    /// Category.
    pub code: ErrorCode,
    /// What happened.
    pub message: String,
}

fn err(code: ErrorCode, message: impl Into<String>) -> ShareError {
    ShareError {
        code,
        message: message.into(),
    }
}

/// The mount tag of `slot`.
pub fn tag(slot: u8) -> String {
    format!("voidbox{slot}")
}

/// The 9p mount options.
pub fn options() -> String {
    format!("trans=virtio,version=9p2000.L,msize={MSIZE},cache=none,access=client")
}

/// The mount flags of a share.
pub fn flags(read_only: bool) -> libc::c_ulong {
    let f = libc::MS_NOSUID | libc::MS_NODEV;
    if read_only {
        f | libc::MS_RDONLY
    } else {
        f
    }
}

/// Checks a share's guest path: the rule `validate` and the engine apply too
/// ([`voidbox_protocol::guest_paths::check_share_path`]).
pub fn check_share_path(p: &str) -> Result<(), String> {
    guest_paths::check_share_path(p)
}

/// Mounts the share `req` asks for in `root` (directories it creates go to `user`).
/// `is_init`: only PID 1 mounts.
pub fn mount(
    req: &MountShare,
    root: &ExecRoot,
    user: Credentials,
    is_init: bool,
) -> Result<(), ShareError> {
    if !is_init {
        return Err(err(
            ErrorCode::Unsupported,
            "shares are mounted by the guest agent as PID 1 only",
        ));
    }
    if req.slot >= MAX_SHARE_SLOTS {
        return Err(err(
            ErrorCode::InvalidRequest,
            format!(
                "share slot {} does not exist (0..{MAX_SHARE_SLOTS})",
                req.slot
            ),
        ));
    }
    check_share_path(&req.path).map_err(|e| err(ErrorCode::PathDenied, e))?;
    let mut mounted = MOUNTED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(at) = &mounted[usize::from(req.slot)] {
        return Err(err(
            ErrorCode::AlreadyExists,
            format!("share slot {} is already mounted at {at}", req.slot),
        ));
    }
    if let Some(other) = mounted
        .iter()
        .flatten()
        .find(|p| guest_paths::overlaps(p, &req.path))
    {
        return Err(err(
            ErrorCode::AlreadyExists,
            format!("share path {} overlaps the share at {other}", req.path),
        ));
    }
    let path = Path::new(&req.path);
    match root {
        ExecRoot::Image(image) => {
            let staging = Path::new(STAGING).join(req.slot.to_string());
            // At the path in the agent's namespace when it can be made, else staged.
            let here =
                MountPoint::open(path, user).or_else(|_| MountPoint::open(&staging, user))?;
            mount_9p(req, &here)?;
            let tree = here.clone_mount().inspect_err(|_| here.detach())?;
            let inner = req.path.clone();
            let inside = image
                .run(move || MountPoint::open(Path::new(&inner), user)?.attach(&tree))
                .map_err(|e| err(ErrorCode::Internal, e))
                .and_then(|r| r);
            if let Err(e) = inside {
                here.detach();
                return Err(e);
            }
        }
        // A root that failed at boot fails every exec with its own reason; the share is
        // mounted in the agent's namespace all the same.
        ExecRoot::System | ExecRoot::Broken(_) => {
            let here = MountPoint::open(path, user)?;
            mount_9p(req, &here)?;
        }
    }
    mounted[usize::from(req.slot)] = Some(req.path.clone());
    crate::debug!(
        "share {} mounted at {} ({})",
        tag(req.slot),
        req.path,
        if req.read_only { "ro" } else { "rw" }
    );
    Ok(())
}

/// Makes sure the directory `path` (absolute) exists, reached from `/` without following
/// symlinks; missing directories are created (mode 0755) and given to `user`. For an
/// image's `WorkingDir` the image lacks (Docker creates it too).
pub fn ensure_dir(path: &Path, user: Credentials) -> Result<(), String> {
    MountPoint::open_for(path, user, "the working directory")
        .map(drop)
        .map_err(|e| e.message)
}

/// Mounts the 9p share of `req` on `at`.
fn mount_9p(req: &MountShare, at: &MountPoint) -> Result<(), ShareError> {
    let (source, target, fstype, data) = (
        CString::new(tag(req.slot)).map_err(|_| err(ErrorCode::Internal, "tag"))?,
        CString::new(format!("/proc/self/fd/{}", at.dir.as_raw_fd()))
            .map_err(|_| err(ErrorCode::Internal, "target"))?,
        c"9p",
        CString::new(options()).map_err(|_| err(ErrorCode::Internal, "options"))?,
    );
    // SAFETY: every string is NUL-terminated and outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags(req.read_only),
            data.as_ptr().cast(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    let what = format!("mounting share {} on {}", tag(req.slot), at.shown);
    Err(match e.raw_os_error() {
        Some(libc::ENOENT) => err(
            ErrorCode::NotFound,
            format!(
                "{what}: the host has not bound share slot {} ({e})",
                req.slot
            ),
        ),
        Some(libc::EBUSY) => err(ErrorCode::AlreadyExists, format!("{what}: {e}")),
        Some(libc::EACCES | libc::EPERM) => {
            err(ErrorCode::PermissionDenied, format!("{what}: {e}"))
        }
        _ => err(ErrorCode::Io, format!("{what}: {e}")),
    })
}

/// A mount point reached without following symlinks: the directory and its parent.
struct MountPoint {
    parent: OwnedFd,
    name: CString,
    dir: OwnedFd,
    shown: String,
}

/// `openat(dir, name, O_PATH | O_NOFOLLOW | O_DIRECTORY)`.
fn open_dir_at(dir: libc::c_int, name: &CString) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name; the fd is owned below.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl MountPoint {
    /// Walks to `path` (absolute, checked) from `/`, creating missing directories (mode
    /// 0755, owned by `user`); a symlink or non-directory on the way is refused.
    fn open(path: &Path, user: Credentials) -> Result<MountPoint, ShareError> {
        MountPoint::open_for(path, user, "the mount point")
    }

    /// As [`MountPoint::open`]; `what` names the directory in errors.
    fn open_for(path: &Path, user: Credentials, what: &str) -> Result<MountPoint, ShareError> {
        let shown = path.display().to_string();
        let denied = |e: String| err(ErrorCode::PathDenied, e);
        let mut parent = open_dir_at(libc::AT_FDCWD, &CString::from(c"/"))
            .map_err(|e| err(ErrorCode::Io, format!("opening /: {e}")))?;
        let comps: Vec<&str> = shown.split('/').filter(|c| !c.is_empty()).collect();
        let mut walked = String::new();
        for (i, c) in comps.iter().enumerate() {
            walked.push('/');
            walked.push_str(c);
            let name = CString::new(*c).map_err(|_| denied(format!("{shown}: NUL byte")))?;
            let dir = match open_dir_at(parent.as_raw_fd(), &name) {
                Ok(d) => d,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    // SAFETY: a NUL-terminated name relative to a directory fd we own.
                    if unsafe { libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), 0o755) } < 0 {
                        let e = io::Error::last_os_error();
                        if e.raw_os_error() != Some(libc::EEXIST) {
                            let hint = if e.raw_os_error() == Some(libc::EROFS) {
                                " (the guest's root is read-only: the VM was booted without \
                                 voidbox.root=rw, which the engine asks for with shares \
                                 outside /workspace and /home)"
                            } else {
                                ""
                            };
                            return Err(err(
                                ErrorCode::Io,
                                format!("creating {what} {walked}: {e}{hint}"),
                            ));
                        }
                    }
                    // SAFETY: as above; an fchownat of the directory just made (best effort).
                    unsafe {
                        libc::fchownat(
                            parent.as_raw_fd(),
                            name.as_ptr(),
                            user.uid,
                            user.gid,
                            libc::AT_SYMLINK_NOFOLLOW,
                        )
                    };
                    open_dir_at(parent.as_raw_fd(), &name)
                        .map_err(|e| denied(format!("{walked}: {e}")))?
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                    return Err(denied(format!(
                        "{walked} is not a directory (or is a symbolic link): {what} is \
                         reached without following symlinks"
                    )));
                }
                Err(e) => return Err(err(ErrorCode::Io, format!("{walked}: {e}"))),
            };
            if i + 1 == comps.len() {
                return Ok(MountPoint {
                    parent,
                    name,
                    dir,
                    shown,
                });
            }
            parent = dir;
        }
        Err(denied(format!(
            "{shown} is not a mount point a share may use"
        )))
    }

    /// A detached clone of what is now mounted on this mount point.
    fn clone_mount(&self) -> Result<OwnedFd, ShareError> {
        // Walking the last component again crosses into the new mount.
        let root = open_dir_at(self.parent.as_raw_fd(), &self.name)
            .map_err(|e| err(ErrorCode::Io, format!("{}: {e}", self.shown)))?;
        let flags =
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint;
        // SAFETY: an fd we own with the empty path it names; the result is owned below.
        let fd =
            unsafe { libc::syscall(libc::SYS_open_tree, root.as_raw_fd(), c"".as_ptr(), flags) };
        if fd < 0 {
            return Err(err(
                ErrorCode::Io,
                format!(
                    "cloning the share at {}: {}",
                    self.shown,
                    io::Error::last_os_error()
                ),
            ));
        }
        // SAFETY: a fresh fd owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
    }

    /// Attaches the detached mount `tree` on this mount point.
    fn attach(&self, tree: &OwnedFd) -> Result<(), ShareError> {
        // SAFETY: two fds we own, each selected by the empty path.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree.as_raw_fd(),
                c"".as_ptr(),
                self.dir.as_raw_fd(),
                c"".as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
            )
        };
        if rc < 0 {
            return Err(err(
                ErrorCode::Io,
                format!(
                    "attaching the share at {} in the image root: {}",
                    self.shown,
                    io::Error::last_os_error()
                ),
            ));
        }
        Ok(())
    }

    /// Detaches what was mounted here (cleanup after a failure; best effort).
    fn detach(&self) {
        let Ok(root) = open_dir_at(self.parent.as_raw_fd(), &self.name) else {
            return;
        };
        if let Ok(t) = CString::new(format!("/proc/self/fd/{}", root.as_raw_fd())) {
            // SAFETY: a NUL-terminated path; MNT_DETACH unmounts lazily.
            unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_flags() {
        assert_eq!(
            options(),
            "trans=virtio,version=9p2000.L,msize=512000,cache=none,access=client"
        );
        assert_ne!(flags(true) & libc::MS_RDONLY, 0);
        assert_eq!(flags(false) & libc::MS_RDONLY, 0);
        for ro in [true, false] {
            assert_eq!(
                flags(ro) & (libc::MS_NOSUID | libc::MS_NODEV),
                libc::MS_NOSUID | libc::MS_NODEV
            );
        }
        assert_eq!(tag(3), "voidbox3");
    }

    #[test]
    fn only_pid_1_mounts_and_requests_are_checked_first() {
        let req = |slot, path: &str| MountShare {
            id: voidbox_protocol::RequestId(1),
            slot,
            path: path.into(),
            read_only: true,
        };
        let user = crate::spawn::SANDBOX;
        let e = mount(&req(0, "/workspace/src"), &ExecRoot::System, user, false).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unsupported);
        let e = mount(&req(4, "/workspace/src"), &ExecRoot::System, user, true).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        let e = mount(&req(0, "/proc/x"), &ExecRoot::System, user, true).unwrap_err();
        assert_eq!(e.code, ErrorCode::PathDenied);
    }

    #[test]
    fn mount_points_are_reached_without_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(base.join("real")).unwrap();
        std::os::unix::fs::symlink(base.join("real"), base.join("link")).unwrap();
        std::fs::write(base.join("file"), b"x").unwrap();
        // SAFETY: getuid/getgid cannot fail.
        let me = unsafe {
            Credentials {
                uid: libc::getuid(),
                gid: libc::getgid(),
            }
        };
        // Missing directories are made.
        let m = MountPoint::open(&base.join("real/a/b"), me).unwrap();
        assert!(base.join("real/a/b").is_dir());
        assert_eq!(m.shown, base.join("real/a/b").display().to_string());
        // A symlink on the way, at the end, or a file: refused, nothing made beyond.
        for bad in ["link/c", "link", "file", "file/d"] {
            let e = MountPoint::open(&base.join(bad), me).err().unwrap();
            assert_eq!(e.code, ErrorCode::PathDenied, "{bad}: {e:?}");
        }
        assert!(!base.join("real/c").exists());
    }
}
