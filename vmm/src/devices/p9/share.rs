//! One share slot's 9P2000.L endpoint: the `p9` crate's server over the bound host
//! directory, behind a filter that checks every request before the server sees it.
//!
//! **Why a crate.** The `p9` crate is crosvm's 9P2000.L server: every fid is an `O_PATH`
//! descriptor, each walk step an `openat(parent, name, O_PATH | O_NOFOLLOW)`, opens go
//! through `/proc/self/fd`, and `symlink`/`mknod` are refused — descriptor-based resolution,
//! never string-prefix checks on paths, written and fuzzed for a production VMM. A
//! hand-written server would have to get all of that (and the wire format of ~30 message
//! types) right again. The crate is not a sandbox by itself, though, and this filter closes
//! what it leaves open (each checked by the host tests):
//! - `openat` resolves a name of several components, `..`, or an absolute name, so a walk
//!   of `..` from the root, or `a/b` through a symlink `a`, or `/etc` would leave the share:
//!   every name (walk elements, and the names of create, mkdir, mknod, symlink, link,
//!   rename, renameat, unlinkat) must be one entry — not empty, `.` or `..`, without `/` or
//!   NUL, UTF-8, at most 255 bytes — and a walk has at most 16 elements.
//! - `Tsetattr` would `chown` to any guest-chosen ids (and, for a ctime-only request, call
//!   `fchownat`): ownership never changes here. Files belong to the VMM's user (the invoking
//!   host user), which the guest sees as the share's guest uid/gid (`uid_map`/`gid_map`, so
//!   the guest's command user may write what the host user may); a chown to exactly those
//!   ids is accepted as the no-op it is, any other is `EPERM`, and a ctime-only update is
//!   answered without touching the file.
//! - Read-only is enforced here, on the host, whatever the guest's mount says: every
//!   request that modifies the tree — `Tlcreate`, `Tsymlink`, `Tmknod`, `Trename`,
//!   `Tsetattr`, `Txattrcreate`, `Tlink`, `Tmkdir`, `Trenameat`, `Tunlinkat`, `Twrite`,
//!   `Tremove`, the legacy `Tcreate`/`Twstat`, and `Tlopen`/`Topen` asking for write access,
//!   truncation, creation or append — is answered `EROFS` without reaching the server.
//! - An unbound slot has no server: `Tversion` is answered (so the guest can tell), `Tattach`
//!   gets `ENOENT`, everything else `EBADF` (no fid can exist).
//! - The guest chooses fid numbers: live fids (each holds host descriptors) are capped at
//!   [`MAX_FIDS`]; one more is `EMFILE`. They are tracked as the server keeps them (attach,
//!   complete walks, clunk, version), which also tells the snapshot code whether anything is
//!   mounted.
//! - `msize` is capped at [`MAX_MSIZE`] (the server negotiates down to it), and `Tread` and
//!   `Treaddir` counts are cut to what the guest's reply buffers hold.
//! - A panic inside the server (none is known) is caught: the slot stops serving (`EIO`) and
//!   the VMM carries on.
//!
//! Limits of the crate, kept: no symlink or device-node creation (`EACCES`), no xattrs
//! (`EOPNOTSUPP`), POSIX locks are answered locally (as QEMU does).

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use super::wire::{
    check_name, empty_reply, offset, open_flags, rlerror, rversion, setattr, ty, Header, Reader,
    Truncated, MAX_WALK_NAMES, MIN_MSIZE, RDATA_HEADER_LEN, VERSION_9P2000_L,
};
use crate::config::ShareConfig;

/// Largest `msize` negotiated (the guest asks for less: Linux 6.1's virtio transport carries
/// at most 512000 bytes).
pub const MAX_MSIZE: u32 = 512 * 1024;
/// Most live fids per share.
pub const MAX_FIDS: usize = 4096;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (best effort; every fid the guest
/// holds is a host descriptor).
pub fn raise_nofile_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid resource and a pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                log::warn!(
                    "cannot raise the descriptor limit: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
}

/// Counters, for tests and diagnostics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ShareStats {
    /// Requests answered.
    pub requests: u64,
    /// Requests refused by the filter (before the server).
    pub refused: u64,
    /// Requests answered with `Rlerror` (refused ones included).
    pub errors: u64,
}

/// One slot's endpoint: bound to a host directory or unbound.
pub struct Share {
    server: Option<p9::Server>,
    root: Option<PathBuf>,
    read_only: bool,
    guest_ids: (u32, u32),
    fids: BTreeSet<u32>,
    failed: bool,
    stats: ShareStats,
}

impl Share {
    /// A slot without a directory.
    pub fn unbound() -> Share {
        Share {
            server: None,
            root: None,
            read_only: true,
            guest_ids: (0, 0),
            fids: BTreeSet::new(),
            failed: false,
            stats: ShareStats::default(),
        }
    }

    /// Binds `cfg.path` (resolved to a directory without symlinks; it must exist). The
    /// server's descriptors are opened here, before the seccomp filter.
    pub fn open(cfg: &ShareConfig) -> Result<Share, String> {
        let shown = cfg.path.display();
        let root = std::fs::canonicalize(&cfg.path)
            .map_err(|e| format!("share {shown}: cannot resolve it: {e}"))?;
        let meta =
            std::fs::metadata(&root).map_err(|e| format!("share {shown}: cannot stat it: {e}"))?;
        if !meta.is_dir() {
            return Err(format!("share {shown} is not a directory"));
        }
        // SAFETY: geteuid/getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let server = p9::Server::with_config(p9::Config {
            root: root.clone().into_boxed_path(),
            msize: MAX_MSIZE,
            uid_map: [(uid, cfg.guest_uid)].into_iter().collect(),
            gid_map: [(gid, cfg.guest_gid)].into_iter().collect(),
            ascii_casefold: false,
        })
        .map_err(|e| format!("share {shown}: {e}"))?;
        Ok(Share {
            server: Some(server),
            root: Some(root),
            read_only: cfg.read_only,
            guest_ids: (cfg.guest_uid, cfg.guest_gid),
            fids: BTreeSet::new(),
            failed: false,
            stats: ShareStats::default(),
        })
    }

    /// Whether a host directory is bound.
    pub fn is_bound(&self) -> bool {
        self.server.is_some()
    }

    /// Whether the share is read-only (an unbound slot is).
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The bound directory (resolved).
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// Fids the server holds.
    pub fn live_fids(&self) -> usize {
        self.fids.len()
    }

    /// Counters.
    pub fn stats(&self) -> ShareStats {
        self.stats
    }

    /// Answers one request (`msg`: exactly the bytes its header's size names; it may be
    /// rewritten in place). `max_reply` is the room in the guest's reply buffers, at least
    /// [`super::wire::RLERROR_LEN`]. Returns the reply, or `None` when `msg` has no complete header (there
    /// is no tag to answer).
    pub fn handle(&mut self, msg: &mut [u8], max_reply: usize) -> Option<Vec<u8>> {
        let h = Header::parse(msg)?;
        self.stats.requests += 1;
        let reply = if h.size as usize != msg.len() {
            rlerror(h.tag, libc::EINVAL)
        } else {
            match self.check(&h, msg, max_reply) {
                Ok(Some(reply)) => reply,
                Ok(None) => self.serve(&h, msg),
                Err(errno) => {
                    self.stats.refused += 1;
                    rlerror(h.tag, errno)
                }
            }
        };
        let reply = if reply.len() > max_reply {
            log::warn!(
                "p9: reply of {} bytes to a type {} request does not fit the guest's {} bytes",
                reply.len(),
                h.ty,
                max_reply
            );
            rlerror(h.tag, libc::EIO)
        } else {
            reply
        };
        if reply.get(4) == Some(&ty::RLERROR) {
            self.stats.errors += 1;
        }
        Some(reply)
    }

    /// The filter: `Err(errno)` refuses, `Ok(Some(reply))` answers here, `Ok(None)` hands
    /// the (possibly rewritten) request to the server.
    fn check(
        &mut self,
        h: &Header,
        msg: &mut [u8],
        max_reply: usize,
    ) -> Result<Option<Vec<u8>>, i32> {
        let inval = |_: Truncated| libc::EINVAL;
        if self.failed {
            return Err(libc::EIO);
        }
        if self.read_only && modifies(h.ty, msg).map_err(inval)? {
            return Err(libc::EROFS);
        }
        let mut r = Reader::body(msg);
        match h.ty {
            ty::TVERSION if self.server.is_none() => {
                let msize = r.u32().map_err(inval)?;
                let version = r.string().map_err(inval)?;
                if msize < MIN_MSIZE {
                    return Err(libc::EINVAL);
                }
                let v: &[u8] = if version == VERSION_9P2000_L {
                    VERSION_9P2000_L
                } else {
                    b"unknown"
                };
                return Ok(Some(rversion(h.tag, msize.min(MAX_MSIZE), v)));
            }
            ty::TATTACH => {
                if self.server.is_none() {
                    return Err(libc::ENOENT);
                }
                let fid = r.u32().map_err(inval)?;
                self.check_new_fid(fid)?;
            }
            ty::TWALK => {
                let fid = r.u32().map_err(inval)?;
                let newfid = r.u32().map_err(inval)?;
                let n = usize::from(r.u16().map_err(inval)?);
                if n > MAX_WALK_NAMES {
                    return Err(libc::EINVAL);
                }
                for _ in 0..n {
                    check_name(r.string().map_err(inval)?)?;
                }
                if newfid != fid {
                    self.check_new_fid(newfid)?;
                }
            }
            ty::TLCREATE
            | ty::TSYMLINK
            | ty::TMKNOD
            | ty::TRENAME
            | ty::TLINK
            | ty::TMKDIR
            | ty::TUNLINKAT => {
                // The name follows one fid (two for Tlink and Trename).
                r.skip(4).map_err(inval)?;
                if matches!(h.ty, ty::TLINK | ty::TRENAME) {
                    r.skip(4).map_err(inval)?;
                }
                check_name(r.string().map_err(inval)?)?;
            }
            ty::TRENAMEAT => {
                r.skip(4).map_err(inval)?;
                check_name(r.string().map_err(inval)?)?;
                r.skip(4).map_err(inval)?;
                check_name(r.string().map_err(inval)?)?;
            }
            ty::TSETATTR => {
                r.skip(4).map_err(inval)?;
                let mut valid = r.u32().map_err(inval)?;
                r.skip(4).map_err(inval)?;
                let (uid, gid) = (r.u32().map_err(inval)?, r.u32().map_err(inval)?);
                // Body: mode, uid, gid, size, atime and mtime (seconds and nanoseconds).
                r.skip(8 + 4 * 8).map_err(inval)?;
                if valid & setattr::UID != 0 && uid == self.guest_ids.0 {
                    valid &= !setattr::UID;
                }
                if valid & setattr::GID != 0 && gid == self.guest_ids.1 {
                    valid &= !setattr::GID;
                }
                if valid & (setattr::UID | setattr::GID) != 0 {
                    return Err(libc::EPERM);
                }
                if valid & !setattr::CTIME == 0 {
                    return Ok(Some(empty_reply(h.ty, h.tag)));
                }
                msg[offset::SETATTR_VALID..offset::SETATTR_VALID + 4]
                    .copy_from_slice(&valid.to_le_bytes());
            }
            ty::TREAD | ty::TREADDIR => {
                let room = (max_reply.saturating_sub(RDATA_HEADER_LEN)).min(u32::MAX as usize);
                let at = offset::IO_COUNT;
                let count = msg
                    .get(at..at + 4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .ok_or(libc::EINVAL)?;
                if count as usize > room {
                    msg[at..at + 4].copy_from_slice(&(room as u32).to_le_bytes());
                }
            }
            _ if self.server.is_none() => {
                return match h.ty {
                    ty::TFLUSH => Ok(Some(empty_reply(h.ty, h.tag))),
                    _ => Err(libc::EBADF),
                };
            }
            _ => {}
        }
        if self.server.is_none() {
            return Err(libc::EBADF);
        }
        Ok(None)
    }

    /// Refuses a fid that would exceed [`MAX_FIDS`].
    fn check_new_fid(&self, fid: u32) -> Result<(), i32> {
        if !self.fids.contains(&fid) && self.fids.len() >= MAX_FIDS {
            return Err(libc::EMFILE);
        }
        Ok(())
    }

    /// Hands a checked request to the server and keeps the fid set in step with it.
    fn serve(&mut self, h: &Header, msg: &[u8]) -> Vec<u8> {
        let Some(server) = self.server.as_mut() else {
            return rlerror(h.tag, libc::EBADF);
        };
        let mut out = Vec::new();
        let mut input = msg;
        match catch_unwind(AssertUnwindSafe(|| {
            server.handle_message(&mut input, &mut out)
        })) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                log::debug!("p9: type {} request not answered by the server: {e}", h.ty);
                return rlerror(h.tag, libc::EIO);
            }
            Err(_) => {
                log::error!(
                    "p9: the server panicked on a type {} request; the share stops serving",
                    h.ty
                );
                self.failed = true;
                self.server = None;
                self.fids.clear();
                return rlerror(h.tag, libc::EIO);
            }
        }
        self.track_fids(h, msg, &out);
        out
    }

    /// Mirrors the server's fid table: attach and complete walks add one, clunk removes
    /// one, version drops them all.
    fn track_fids(&mut self, h: &Header, msg: &[u8], reply: &[u8]) {
        let Some(rh) = Header::parse(reply) else {
            return;
        };
        let mut r = Reader::body(msg);
        match (h.ty, rh.ty.wrapping_sub(1)) {
            (ty::TVERSION, ty::TVERSION) => self.fids.clear(),
            (ty::TATTACH, ty::TATTACH) => {
                if let Ok(fid) = r.u32() {
                    self.fids.insert(fid);
                }
            }
            (ty::TCLUNK, ty::TCLUNK) => {
                if let Ok(fid) = r.u32() {
                    self.fids.remove(&fid);
                }
            }
            (ty::TWALK, ty::TWALK) => {
                let (Ok(_fid), Ok(newfid), Ok(n)) = (r.u32(), r.u32(), r.u16()) else {
                    return;
                };
                let got = Reader::body(reply).u16().unwrap_or(u16::MAX);
                if got == n {
                    self.fids.insert(newfid);
                }
            }
            _ => {}
        }
    }
}

/// Whether a request modifies the tree (refused on a read-only share).
fn modifies(t: u8, msg: &[u8]) -> Result<bool, Truncated> {
    Ok(match t {
        ty::TLCREATE
        | ty::TSYMLINK
        | ty::TMKNOD
        | ty::TRENAME
        | ty::TSETATTR
        | ty::TXATTRCREATE
        | ty::TLINK
        | ty::TMKDIR
        | ty::TRENAMEAT
        | ty::TUNLINKAT
        | ty::TWRITE
        | ty::TREMOVE
        | ty::TCREATE
        | ty::TWSTAT => true,
        ty::TLOPEN => {
            let mut r = Reader::body(msg);
            r.skip(4)?;
            let flags = r.u32()?;
            flags & open_flags::ACCMODE != 0
                || flags & (open_flags::CREATE | open_flags::TRUNC | open_flags::APPEND) != 0
        }
        ty::TOPEN => {
            // Legacy 9P2000: mode[1] = access (OREAD 0) | OTRUNC 0x10 | ORCLOSE 0x40.
            let mut r = Reader::body(msg);
            r.skip(4)?;
            let mode = r.u8()?;
            mode & 0x3 != 0 || mode & (0x10 | 0x40) != 0
        }
        _ => false,
    })
}
