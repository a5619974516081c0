//! Opening paths *inside* a directory tree, never outside it.
//!
//! Every path a layer names is resolved relative to the unpack root with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: symlinks (planted by earlier entries or
//! layers) are followed as if the root were `/`, so `..` and absolute link targets stop at the
//! root. Where `openat2` is unavailable (kernels before 5.6, seccomp filters) the same
//! resolution is done in user space, one component at a time with `O_NOFOLLOW`, following
//! symlinks by reading them and clamping `..` at the root.

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// Symlinks followed in one resolution before giving up with `ELOOP` (Linux's limit).
const MAX_LINKS: usize = 40;

/// A directory that paths are resolved inside of.
#[derive(Debug)]
pub(crate) struct Root {
    fd: OwnedFd,
    openat2: bool,
}

impl Root {
    /// Opens `dir` as a root.
    pub(crate) fn open(dir: &Path) -> std::io::Result<Root> {
        let fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let openat2 = probe_openat2(&fd);
        Ok(Root { fd, openat2 })
    }

    /// Like [`Root::open`] but never uses `openat2` (tests of the fallback).
    #[cfg(test)]
    pub(crate) fn open_without_openat2(dir: &Path) -> std::io::Result<Root> {
        let mut r = Root::open(dir)?;
        r.openat2 = false;
        Ok(r)
    }

    /// The root directory itself.
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Opens the directory `rel` (empty: the root) inside the root.
    pub(crate) fn open_dir(&self, rel: &Path) -> rustix::io::Result<OwnedFd> {
        self.resolve(rel, OFlags::RDONLY | OFlags::DIRECTORY)
    }

    /// Opens the file `rel` for reading, following symlinks inside the root.
    pub(crate) fn open_file(&self, rel: &Path) -> rustix::io::Result<std::fs::File> {
        self.resolve(rel, OFlags::RDONLY).map(std::fs::File::from)
    }

    /// Resolves `rel` inside the root and opens it with `flags`.
    fn resolve(&self, rel: &Path, flags: OFlags) -> rustix::io::Result<OwnedFd> {
        let flags = flags | OFlags::CLOEXEC;
        if self.openat2 {
            let path: &Path = if rel.as_os_str().is_empty() {
                Path::new(".")
            } else {
                rel
            };
            let how = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
            loop {
                match rustix::fs::openat2(&self.fd, path, flags, Mode::empty(), how) {
                    Err(Errno::AGAIN) | Err(Errno::INTR) => continue,
                    r => return r,
                }
            }
        }
        resolve_in_userspace(&self.fd, rel, flags)
    }
}

/// Whether `openat2` works here.
fn probe_openat2(root: &OwnedFd) -> bool {
    let how = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
    rustix::fs::openat2(
        root,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        how,
    )
    .is_ok()
}

/// `RESOLVE_IN_ROOT` done by hand: walk `rel` component by component from `root`, opening each
/// directory with `O_NOFOLLOW`; a symlink is read and its target spliced into the remaining
/// path (an absolute target restarts at the root); `..` pops a level but never above the root.
fn resolve_in_userspace(root: &OwnedFd, rel: &Path, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let mut stack: Vec<OwnedFd> = vec![rustix::io::dup(root)?];
    let mut pending: VecDeque<OsString> = VecDeque::new();
    push_front_components(&mut pending, rel);
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let cur = stack.last().ok_or(Errno::INVAL)?;
        let st = rustix::fs::statat(cur, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            links += 1;
            if links > MAX_LINKS {
                return Err(Errno::LOOP);
            }
            let target = rustix::fs::readlinkat(cur, name.as_os_str(), Vec::new())?;
            let target = Path::new(OsStr::from_bytes(target.as_bytes()));
            if target.has_root() {
                stack.truncate(1);
            }
            push_front_components(&mut pending, target);
            continue;
        }
        if pending.is_empty() {
            return rustix::fs::openat(
                cur,
                name.as_os_str(),
                flags | OFlags::NOFOLLOW,
                Mode::empty(),
            );
        }
        let next = rustix::fs::openat(
            cur,
            name.as_os_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        stack.push(next);
    }
    // The path was empty or ended in `..`: open where the walk stands.
    let cur = stack.last().ok_or(Errno::INVAL)?;
    rustix::fs::openat(cur.as_fd(), ".", flags, Mode::empty())
}

/// Puts the components of `path` (without `/` and `.`) in front of `pending`, in order.
fn push_front_components(pending: &mut VecDeque<OsString>, path: &Path) {
    let parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    for p in parts.into_iter().rev() {
        pending.push_front(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Both resolvers keep every escape attempt inside the root.
    #[test]
    fn symlinks_cannot_leave_the_root() {
        for use_openat2 in [true, false] {
            let top = tempfile::tempdir().unwrap();
            let root = top.path().join("root");
            std::fs::create_dir_all(root.join("usr/lib")).unwrap();
            std::fs::create_dir_all(top.path().join("outside")).unwrap();
            symlink("../../../../outside", root.join("up")).unwrap();
            symlink("/outside", root.join("abs")).unwrap();
            symlink("usr/lib", root.join("lib")).unwrap();
            symlink("loop", root.join("loop")).unwrap();
            std::fs::create_dir_all(root.join("outside")).unwrap();
            std::fs::write(root.join("outside/marker"), "inside").unwrap();
            std::fs::write(top.path().join("outside/marker"), "OUTSIDE").unwrap();
            let r = if use_openat2 {
                Root::open(&root).unwrap()
            } else {
                Root::open_without_openat2(&root).unwrap()
            };
            if use_openat2 && !r.openat2 {
                eprintln!("openat2 unavailable here; only the fallback is tested");
                continue;
            }
            for p in [
                "up/marker",
                "abs/marker",
                "../outside/marker",
                "/outside/marker",
            ] {
                let text = std::io::read_to_string(r.open_file(Path::new(p)).unwrap()).unwrap();
                assert_eq!(text, "inside", "{p} (openat2: {use_openat2})");
            }
            let lib = r.open_dir(Path::new("lib")).unwrap();
            let usr_lib = std::fs::metadata(root.join("usr/lib")).unwrap();
            let st = rustix::fs::fstat(&lib).unwrap();
            assert_eq!(st.st_ino, std::os::unix::fs::MetadataExt::ino(&usr_lib));
            assert_eq!(r.open_file(Path::new("loop")).unwrap_err(), Errno::LOOP);
            assert!(r.open_dir(Path::new("")).is_ok());
        }
    }
}
