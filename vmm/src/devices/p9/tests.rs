//! Host-side tests of the share slots against real temporary directories: hostile names
//! (`..`, `/`, absolute), symlinks pointing out of the share, read-only refusal, ownership,
//! `msize` capping, unbound slots, malformed messages, the fid cap, and the virtio side
//! (split zero-copy buffers, short chains, hostile chains, the MMIO transport, snapshots).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use vm_memory::{Bytes, GuestAddress};

use super::persist::P9State;
use super::share::{MAX_FIDS, MAX_MSIZE};
use super::wire::{ty, HEADER_LEN};
use super::*;
use crate::bus::BusDevice;
use crate::config::ShareConfig;
use crate::devices::virtio::mmio::{reg, MmioTransport};
use crate::devices::virtio::test_driver::{
    bring_up, irq, read_reg as r32, write_reg as w32, DriverQueue, F_NEXT, F_WRITE,
};
use crate::devices::virtio::{INT_CONFIG, INT_VRING};
use crate::memory::create_guest_memory;
use crate::persist::PersistError;

/// A 9P message under construction.
struct B(Vec<u8>);

impl B {
    fn new() -> Self {
        B(Vec::new())
    }
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32s(self, vs: &[u32]) -> Self {
        vs.iter().fold(self, |b, &v| b.u32(v))
    }
    fn u64s(self, vs: &[u64]) -> Self {
        vs.iter().fold(self, |b, &v| b.u64(v))
    }
    fn s(self, v: &str) -> Self {
        self.bytes(v.as_bytes())
    }
    fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(&(v.len() as u16).to_le_bytes());
        self.0.extend_from_slice(v);
        self
    }
    /// The message of type `t` with this body.
    fn msg(self, t: u8) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((HEADER_LEN + self.0.len()) as u32).to_le_bytes());
        m.push(t);
        m.extend_from_slice(&7u16.to_le_bytes());
        m.extend_from_slice(&self.0);
        m
    }
}

const ROOM: usize = 1 << 20;
const NOFID: u32 = u32::MAX;

fn rtype(r: &[u8]) -> u8 {
    r[4]
}

/// The errno of an `Rlerror`, `None` for any other reply.
fn errno(r: &[u8]) -> Option<i32> {
    (rtype(r) == ty::RLERROR).then(|| u32::from_le_bytes([r[7], r[8], r[9], r[10]]) as i32)
}

/// A share directory beside `outside/secret`: `hello`, `sub/inner`, and the symlinks `out`
/// (to `../outside`) and `etc` (to `/etc`).
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("share");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"host secret").unwrap();
        std::fs::write(root.join("hello"), b"hello from the host\n").unwrap();
        std::fs::write(root.join("sub/inner"), b"inner").unwrap();
        std::os::unix::fs::symlink("../outside", root.join("out")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
        Self {
            _dir: dir,
            root,
            outside,
        }
    }

    fn cfg(&self, read_only: bool) -> ShareConfig {
        ShareConfig {
            path: self.root.clone(),
            read_only,
            guest_uid: 1000,
            guest_gid: 1000,
        }
    }

    /// A share on the fixture, versioned and attached as fid 0.
    fn attached(&self, read_only: bool) -> Client {
        let mut c = Client(Share::open(&self.cfg(read_only)).unwrap());
        let r = c.version(8192);
        assert_eq!(rtype(&r), ty::TVERSION + 1);
        let r = c.call(attach_msg());
        assert_eq!(rtype(&r), ty::TATTACH + 1, "{r:?}");
        c
    }

    fn outside_untouched(&self) {
        let names: Vec<_> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["secret"]);
        assert_eq!(
            std::fs::read(self.outside.join("secret")).unwrap(),
            b"host secret"
        );
    }

    fn listing(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

struct Client(Share);

impl Client {
    fn call(&mut self, mut m: Vec<u8>) -> Vec<u8> {
        self.0.handle(&mut m, ROOM).expect("a reply")
    }
    fn version(&mut self, msize: u32) -> Vec<u8> {
        self.call(B::new().u32(msize).s("9P2000.L").msg(ty::TVERSION))
    }
    fn walk(&mut self, fid: u32, newfid: u32, names: &[&str]) -> Vec<u8> {
        let mut b = B::new().u32(fid).u32(newfid).u16(names.len() as u16);
        for n in names {
            b = b.s(n);
        }
        self.call(b.msg(ty::TWALK))
    }
    fn lopen(&mut self, fid: u32, flags: u32) -> Vec<u8> {
        self.call(B::new().u32(fid).u32(flags).msg(ty::TLOPEN))
    }
    fn lcreate(&mut self, fid: u32, name: &str, flags: u32) -> Vec<u8> {
        let b = B::new().u32(fid).s(name);
        self.call(b.u32s(&[flags, 0o644, 1000]).msg(ty::TLCREATE))
    }
    fn mkdir(&mut self, dfid: u32, name: &str) -> Vec<u8> {
        let b = B::new().u32(dfid).s(name);
        self.call(b.u32s(&[0o755, 1000]).msg(ty::TMKDIR))
    }
    fn read(&mut self, fid: u32, offset: u64, count: u32) -> Vec<u8> {
        self.call(B::new().u32(fid).u64(offset).u32(count).msg(ty::TREAD))
    }
    fn write(&mut self, fid: u32, offset: u64, data: &[u8]) -> Vec<u8> {
        let mut b = B::new().u32(fid).u64(offset).u32(data.len() as u32);
        b.0.extend_from_slice(data);
        self.call(b.msg(ty::TWRITE))
    }
    fn clunk(&mut self, fid: u32) -> Vec<u8> {
        self.call(B::new().u32(fid).msg(ty::TCLUNK))
    }
    fn renameat(&mut self, olddir: u32, old: &str, newdir: u32, new: &str) -> Vec<u8> {
        let b = B::new().u32(olddir).s(old);
        self.call(b.u32(newdir).s(new).msg(ty::TRENAMEAT))
    }
    fn unlinkat(&mut self, dir: u32, name: &str) -> Vec<u8> {
        self.call(B::new().u32(dir).s(name).u32(0).msg(ty::TUNLINKAT))
    }
    fn link(&mut self, dfid: u32, fid: u32, name: &str) -> Vec<u8> {
        self.call(B::new().u32(dfid).u32(fid).s(name).msg(ty::TLINK))
    }
    fn symlink(&mut self, fid: u32, name: &str, target: &str) -> Vec<u8> {
        let b = B::new().u32(fid).s(name).s(target);
        self.call(b.u32(1000).msg(ty::TSYMLINK))
    }
    fn mknod(&mut self, dfid: u32, name: &str) -> Vec<u8> {
        let b = B::new().u32(dfid).s(name);
        self.call(b.u32s(&[0o10644, 0, 0, 1000]).msg(ty::TMKNOD))
    }
    fn setattr(
        &mut self,
        fid: u32,
        valid: u32,
        mode: u32,
        uid: u32,
        gid: u32,
        size: u64,
    ) -> Vec<u8> {
        let b = B::new().u32s(&[fid, valid, mode, uid, gid]);
        self.call(b.u64s(&[size, 0, 0, 0, 0]).msg(ty::TSETATTR))
    }
    fn getattr(&mut self, fid: u32) -> Vec<u8> {
        self.call(B::new().u32(fid).u64(0x7ff).msg(ty::TGETATTR))
    }
}

/// `(mode, uid, gid, size)` of an `Rgetattr`.
fn attrs(r: &[u8]) -> (u32, u32, u32, u64) {
    assert_eq!(rtype(r), ty::TGETATTR + 1, "{r:?}");
    // valid[8] qid[13] mode[4] uid[4] gid[4] nlink[8] rdev[8] size[8]
    let at = HEADER_LEN + 8 + 13;
    let u32_at = |o: usize| u32::from_le_bytes([r[o], r[o + 1], r[o + 2], r[o + 3]]);
    let size = u64::from_le_bytes(r[at + 28..at + 36].try_into().unwrap());
    (u32_at(at), u32_at(at + 4), u32_at(at + 8), size)
}

/// The data of an `Rread`.
fn data(r: &[u8]) -> &[u8] {
    assert_eq!(rtype(r), ty::TREAD + 1, "{r:?}");
    &r[HEADER_LEN + 4..]
}

fn nwqid(r: &[u8]) -> u16 {
    assert_eq!(rtype(r), ty::TWALK + 1, "{r:?}");
    u16::from_le_bytes([r[7], r[8]])
}

#[test]
fn dot_dot_and_dot_walks_are_refused() {
    let f = Fixture::new();
    let mut c = f.attached(false);
    assert_eq!(errno(&c.walk(0, 1, &[".."])), Some(libc::EPERM));
    assert_eq!(errno(&c.walk(0, 1, &["sub", ".."])), Some(libc::EPERM));
    assert_eq!(
        errno(&c.walk(0, 1, &["sub", "..", ".."])),
        Some(libc::EPERM)
    );
    assert_eq!(errno(&c.walk(0, 1, &["."])), Some(libc::EPERM));
    assert_eq!(errno(&c.walk(0, 1, &[""])), Some(libc::EINVAL));
    // From a subdirectory too.
    assert_eq!(nwqid(&c.walk(0, 2, &["sub"])), 1);
    assert_eq!(errno(&c.walk(2, 3, &[".."])), Some(libc::EPERM));
    // More than 16 names.
    let many = vec!["sub"; 17];
    assert_eq!(errno(&c.walk(0, 4, &many)), Some(libc::EINVAL));
    // Only the attach and the one good walk hold fids.
    assert_eq!(c.0.live_fids(), 2);
    assert!(c.0.stats().refused >= 6);
    f.outside_untouched();
}

#[test]
fn names_with_slashes_and_absolute_names_are_refused_everywhere() {
    let f = Fixture::new();
    let mut c = f.attached(false);
    let before = f.listing();
    for bad in ["sub/inner", "../outside", "/etc", "/", "a/", "x\u{0}y"] {
        assert_eq!(
            errno(&c.walk(0, 1, &[bad])),
            Some(libc::EINVAL),
            "walk {bad:?}"
        );
        assert_eq!(
            errno(&c.lcreate(0, bad, 0o2)),
            Some(libc::EINVAL),
            "create {bad:?}"
        );
        assert_eq!(errno(&c.mkdir(0, bad)), Some(libc::EINVAL), "mkdir {bad:?}");
        assert_eq!(
            errno(&c.unlinkat(0, bad)),
            Some(libc::EINVAL),
            "unlink {bad:?}"
        );
        assert_eq!(
            errno(&c.link(0, 0, bad)),
            Some(libc::EINVAL),
            "link {bad:?}"
        );
        assert_eq!(
            errno(&c.symlink(0, bad, "x")),
            Some(libc::EINVAL),
            "symlink {bad:?}"
        );
        assert_eq!(errno(&c.mknod(0, bad)), Some(libc::EINVAL), "mknod {bad:?}");
        assert_eq!(
            errno(&c.renameat(0, "hello", 0, bad)),
            Some(libc::EINVAL),
            "rename to {bad:?}"
        );
        assert_eq!(
            errno(&c.renameat(0, bad, 0, "x")),
            Some(libc::EINVAL),
            "rename from {bad:?}"
        );
    }
    for dots in [".", ".."] {
        assert_eq!(errno(&c.mkdir(0, dots)), Some(libc::EPERM));
        assert_eq!(errno(&c.lcreate(0, dots, 0o2)), Some(libc::EPERM));
        assert_eq!(errno(&c.renameat(0, "hello", 0, dots)), Some(libc::EPERM));
        assert_eq!(errno(&c.unlinkat(0, dots)), Some(libc::EPERM));
    }
    // Too long, not UTF-8.
    let long = "n".repeat(256);
    assert_eq!(errno(&c.mkdir(0, &long)), Some(libc::ENAMETOOLONG));
    let r = c.call(
        B::new()
            .u32(0)
            .bytes(b"\xff\xfe")
            .u32(0o755)
            .u32(0)
            .msg(ty::TMKDIR),
    );
    assert_eq!(errno(&r), Some(libc::EINVAL));
    // The legacy rename names one entry too.
    let r = c.call(B::new().u32(0).u32(0).s("../x").msg(ty::TRENAME));
    assert_eq!(errno(&r), Some(libc::EINVAL));
    assert_eq!(f.listing(), before);
    f.outside_untouched();
}

#[test]
fn symlinks_never_lead_out_of_the_share() {
    let f = Fixture::new();
    let mut c = f.attached(false);
    // Walking through a symlink stops at it: the rest of the walk fails and no fid is made.
    for link in ["out", "etc"] {
        let r = c.walk(0, 1, &[link, "secret"]);
        assert_eq!(nwqid(&r), 1, "{link}");
        assert_eq!(c.0.live_fids(), 1);
    }
    // The link itself is a fid of its own, which cannot be opened or walked from…
    assert_eq!(nwqid(&c.walk(0, 5, &["out"])), 1);
    assert_eq!(errno(&c.lopen(5, 0)), Some(libc::ELOOP));
    assert_eq!(errno(&c.walk(5, 6, &["secret"])), Some(libc::ENOTDIR));
    assert_eq!(errno(&c.lcreate(5, "planted", 0o2)), Some(libc::ENOTDIR));
    assert_eq!(errno(&c.mkdir(5, "planted")), Some(libc::ENOTDIR));
    // …and whose target the guest reads as text, to resolve in its own namespace.
    let r = c.call(B::new().u32(5).msg(ty::TREADLINK));
    assert_eq!(rtype(&r), ty::TREADLINK + 1);
    assert_eq!(&r[HEADER_LEN + 2..], b"../outside");
    assert_eq!(attrs(&c.getattr(5)).0 & libc::S_IFMT, libc::S_IFLNK);
    // The guest cannot make symlinks of its own.
    assert_eq!(errno(&c.symlink(0, "mine", "/etc")), Some(libc::EACCES));
    assert!(!f.root.join("mine").exists());
    f.outside_untouched();
}

#[test]
fn a_read_only_share_refuses_every_modification_with_erofs() {
    let f = Fixture::new();
    let mut c = f.attached(true);
    let before = f.listing();
    let hello_before = std::fs::metadata(f.root.join("hello")).unwrap();
    assert_eq!(nwqid(&c.walk(0, 1, &["hello"])), 1);
    let erofs = Some(libc::EROFS);
    assert_eq!(errno(&c.lcreate(0, "new", 0o2)), erofs);
    assert_eq!(errno(&c.mkdir(0, "newdir")), erofs);
    assert_eq!(errno(&c.symlink(0, "l", "x")), erofs);
    assert_eq!(errno(&c.mknod(0, "n")), erofs);
    assert_eq!(errno(&c.renameat(0, "hello", 0, "moved")), erofs);
    assert_eq!(errno(&c.unlinkat(0, "hello")), erofs);
    assert_eq!(errno(&c.link(0, 1, "hardlink")), erofs);
    assert_eq!(errno(&c.setattr(1, 0x8, 0, 0, 0, 0)), erofs, "truncate");
    assert_eq!(errno(&c.setattr(1, 0x1, 0o777, 0, 0, 0)), erofs, "chmod");
    assert_eq!(errno(&c.write(1, 0, b"overwritten")), erofs);
    let r = c.call(B::new().u32(1).msg(ty::TREMOVE));
    assert_eq!(errno(&r), erofs);
    let r = c.call(
        B::new()
            .u32(1)
            .s("user.x")
            .u64(1)
            .u32(0)
            .msg(ty::TXATTRCREATE),
    );
    assert_eq!(errno(&r), erofs);
    let r = c.call(B::new().u32(0).u32(0).s("x").msg(ty::TRENAME));
    assert_eq!(errno(&r), erofs);
    // Opens for writing, read-write, "no access", truncation, creation or append.
    for flags in [0o1, 0o2, 0o3, 0o1000, 0o100, 0o2000] {
        assert_eq!(errno(&c.lopen(1, flags)), erofs, "flags {flags:o}");
    }
    // Legacy opens for writing and creates, and wstat.
    let r = c.call(B::new().u32(1).u8(1).msg(ty::TOPEN));
    assert_eq!(errno(&r), erofs);
    let r = c.call(B::new().u32(0).s("c").u32(0o644).u8(1).msg(ty::TCREATE));
    assert_eq!(errno(&r), erofs);
    let r = c.call(B::new().u32(1).u16(0).msg(ty::TWSTAT));
    assert_eq!(errno(&r), erofs);
    // Reading works.
    assert_eq!(rtype(&c.lopen(1, 0)), ty::TLOPEN + 1);
    assert_eq!(data(&c.read(1, 0, 4096)), b"hello from the host\n");
    assert_eq!(
        rtype(&c.call(B::new().u32(1).u32(0).msg(ty::TFSYNC))),
        ty::TFSYNC + 1
    );
    assert_eq!(f.listing(), before);
    let hello_after = std::fs::metadata(f.root.join("hello")).unwrap();
    assert_eq!(
        std::fs::read(f.root.join("hello")).unwrap(),
        b"hello from the host\n"
    );
    assert_eq!(hello_after.mode(), hello_before.mode());
    assert_eq!(hello_after.mtime(), hello_before.mtime());
}

#[test]
fn a_read_write_share_creates_files_owned_by_the_vmm_user() {
    let f = Fixture::new();
    let mut c = f.attached(false);
    // SAFETY: geteuid/getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // Files of the VMM's user appear as the guest user.
    assert_eq!(nwqid(&c.walk(0, 1, &["hello"])), 1);
    let (_, guid, ggid, size) = attrs(&c.getattr(1));
    assert_eq!((guid, ggid, size), (1000, 1000, 20));
    // Create, write, close.
    assert_eq!(nwqid(&c.walk(0, 2, &[])), 0);
    assert_eq!(rtype(&c.lcreate(2, "made-in-guest", 0o2)), ty::TLCREATE + 1);
    let r = c.write(2, 0, b"written by the guest\n");
    assert_eq!(rtype(&r), ty::TWRITE + 1, "{r:?}");
    assert_eq!(rtype(&c.clunk(2)), ty::TCLUNK + 1);
    let made = f.root.join("made-in-guest");
    assert_eq!(std::fs::read(&made).unwrap(), b"written by the guest\n");
    let m = std::fs::metadata(&made).unwrap();
    assert_eq!((m.uid(), m.gid()), (uid, gid));
    // mkdir, rename into it, unlink.
    assert_eq!(rtype(&c.mkdir(0, "dir")), ty::TMKDIR + 1);
    assert_eq!(std::fs::metadata(f.root.join("dir")).unwrap().uid(), uid);
    assert_eq!(nwqid(&c.walk(0, 3, &["dir"])), 1);
    assert_eq!(
        rtype(&c.renameat(0, "made-in-guest", 3, "moved")),
        ty::TRENAMEAT + 1
    );
    assert!(f.root.join("dir/moved").is_file());
    assert_eq!(rtype(&c.unlinkat(3, "moved")), ty::TUNLINKAT + 1);
    assert!(!f.root.join("dir/moved").exists());
    // Truncate and chmod work; they keep the owner.
    assert_eq!(rtype(&c.setattr(1, 0x8, 0, 0, 0, 5)), ty::TSETATTR + 1);
    assert_eq!(std::fs::read(f.root.join("hello")).unwrap(), b"hello");
    assert_eq!(rtype(&c.setattr(1, 0x1, 0o600, 0, 0, 0)), ty::TSETATTR + 1);
    assert_eq!(
        std::fs::metadata(f.root.join("hello")).unwrap().mode() & 0o7777,
        0o600
    );
    f.outside_untouched();
}

#[test]
fn ownership_never_changes() {
    let f = Fixture::new();
    let mut c = f.attached(false);
    assert_eq!(nwqid(&c.walk(0, 1, &["hello"])), 1);
    let before = std::fs::metadata(f.root.join("hello")).unwrap();
    // chown to anyone else: EPERM (uid, gid, or both).
    assert_eq!(errno(&c.setattr(1, 0x2, 0, 0, 0, 0)), Some(libc::EPERM));
    assert_eq!(errno(&c.setattr(1, 0x4, 0, 0, 0, 0)), Some(libc::EPERM));
    assert_eq!(
        errno(&c.setattr(1, 0x6, 0, 1000, 4242, 0)),
        Some(libc::EPERM)
    );
    // chown to the ids the guest sees is the no-op it is, with the rest of the request done.
    assert_eq!(
        rtype(&c.setattr(1, 0x2 | 0x4 | 0x1, 0o640, 1000, 1000, 0)),
        ty::TSETATTR + 1
    );
    // A ctime-only update is answered without touching the file.
    assert_eq!(rtype(&c.setattr(1, 0x40, 0, 0, 0, 0)), ty::TSETATTR + 1);
    let after = std::fs::metadata(f.root.join("hello")).unwrap();
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    assert_eq!(after.mode() & 0o7777, 0o640);
}

#[test]
fn msize_is_negotiated_down_to_the_cap() {
    let f = Fixture::new();
    for mut share in [Share::open(&f.cfg(true)).unwrap(), Share::unbound()] {
        let mut c = Client(std::mem::replace(&mut share, Share::unbound()));
        let msize = |r: &[u8]| {
            assert_eq!(rtype(r), ty::TVERSION + 1, "{r:?}");
            u32::from_le_bytes([r[7], r[8], r[9], r[10]])
        };
        assert_eq!(msize(&c.version(16 << 20)), MAX_MSIZE);
        assert_eq!(msize(&c.version(u32::MAX)), MAX_MSIZE);
        assert_eq!(msize(&c.version(512_000)), 512_000);
        assert_eq!(msize(&c.version(8192)), 8192);
        // Never more than asked for.
        assert!(msize(&c.version(MAX_MSIZE)) <= MAX_MSIZE);
        assert_eq!(errno(&c.version(100)), Some(libc::EINVAL));
        // Another protocol version is answered "unknown".
        let r = c.call(B::new().u32(8192).s("9P2000.u").msg(ty::TVERSION));
        assert_eq!(&r[HEADER_LEN + 6..], b"unknown");
    }
}

#[test]
fn an_unbound_slot_refuses_attach() {
    let mut c = Client(Share::unbound());
    assert!(!c.0.is_bound());
    assert_eq!(rtype(&c.version(8192)), ty::TVERSION + 1);
    let r = c.call(
        B::new()
            .u32(0)
            .u32(NOFID)
            .s("u")
            .s("")
            .u32(1000)
            .msg(ty::TATTACH),
    );
    assert_eq!(errno(&r), Some(libc::ENOENT));
    assert_eq!(errno(&c.walk(0, 1, &[])), Some(libc::EBADF));
    assert_eq!(errno(&c.lopen(0, 0)), Some(libc::EBADF));
    assert_eq!(errno(&c.getattr(0)), Some(libc::EBADF));
    let r = c.call(B::new().u16(3).msg(ty::TFLUSH));
    assert_eq!(rtype(&r), ty::TFLUSH + 1);
    assert_eq!(c.0.live_fids(), 0);
}

#[test]
fn malformed_and_short_messages_get_errors_never_panics() {
    let f = Fixture::new();
    let mut c = f.attached(false);
    // Shorter than a header: nothing to answer.
    for short in [&b""[..], b"\x07", b"\x07\0\0\0\x64\0"] {
        assert_eq!(c.0.handle(&mut short.to_vec(), ROOM), None);
    }
    // A size that is not the message's.
    let mut m = B::new().u32(0).msg(ty::TCLUNK);
    m[0] = 200;
    assert_eq!(errno(&c.call(m)), Some(libc::EINVAL));
    // Bodies cut short, for checked and unchecked types.
    for t in [
        ty::TWALK,
        ty::TLCREATE,
        ty::TMKDIR,
        ty::TRENAMEAT,
        ty::TSETATTR,
        ty::TREAD,
        ty::TATTACH,
        ty::TGETATTR,
        ty::TLOPEN,
        ty::TVERSION,
    ] {
        let r = c.call(B::new().u16(1).msg(t));
        assert!(errno(&r).is_some(), "type {t}: {r:?}");
    }
    // A string longer than the message.
    let r = c.call(B::new().u32(0).u32(1).u16(1).u16(60000).msg(ty::TWALK));
    assert_eq!(errno(&r), Some(libc::EINVAL));
    // Unknown and reply types.
    for t in [0u8, 1, 7, 101, 200, 255] {
        assert!(errno(&c.call(B::new().u32(0).msg(t))).is_some(), "type {t}");
    }
    // Unknown fids.
    assert_eq!(errno(&c.lopen(99, 0)), Some(libc::EBADF));
    assert_eq!(errno(&c.read(99, 0, 10)), Some(libc::EBADF));
    // The session still works.
    assert_eq!(nwqid(&c.walk(0, 1, &["hello"])), 1);
}

#[test]
fn live_fids_are_capped_and_tracked() {
    // Every fid is a descriptor of this process.
    super::share::raise_nofile_limit();
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid resource and a pointer to a local rlimit.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    if lim.rlim_cur < 2 * MAX_FIDS as u64 + 256 {
        eprintln!("skipped: descriptor limit {} too low", lim.rlim_cur);
        return;
    }
    let f = Fixture::new();
    let mut c = f.attached(true);
    for fid in 1..MAX_FIDS as u32 {
        assert_eq!(nwqid(&c.walk(0, fid, &[])), 0);
    }
    assert_eq!(c.0.live_fids(), MAX_FIDS);
    assert_eq!(errno(&c.walk(0, 50_000, &[])), Some(libc::EMFILE));
    let r = c.call(
        B::new()
            .u32(60_000)
            .u32(NOFID)
            .s("u")
            .s("")
            .u32(0)
            .msg(ty::TATTACH),
    );
    assert_eq!(errno(&r), Some(libc::EMFILE));
    // Reusing a live fid as the target of a walk is not a new one.
    assert_eq!(nwqid(&c.walk(1, 1, &["sub"])), 1);
    assert_eq!(rtype(&c.clunk(7)), ty::TCLUNK + 1);
    assert_eq!(c.0.live_fids(), MAX_FIDS - 1);
    // A partial walk makes no fid.
    assert_eq!(nwqid(&c.walk(0, 7, &["sub", "nothing"])), 1);
    assert_eq!(c.0.live_fids(), MAX_FIDS - 1);
    assert_eq!(nwqid(&c.walk(0, 50_000, &[])), 0);
    assert_eq!(c.0.live_fids(), MAX_FIDS);
    // A version drops them all.
    c.version(8192);
    assert_eq!(c.0.live_fids(), 0);
}

#[test]
fn reads_fit_the_guests_reply_buffers() {
    let f = Fixture::new();
    let mut c = f.attached(true);
    assert_eq!(nwqid(&c.walk(0, 1, &["hello"])), 1);
    assert_eq!(rtype(&c.lopen(1, 0)), ty::TLOPEN + 1);
    let mut m = B::new().u32(1).u64(0).u32(1 << 20).msg(ty::TREAD);
    let r = c.0.handle(&mut m, 16).unwrap();
    assert_eq!(data(&r), b"hello");
    // Directory listings too.
    assert_eq!(nwqid(&c.walk(0, 2, &[])), 0);
    assert_eq!(rtype(&c.lopen(2, 0o200000)), ty::TLOPEN + 1);
    let mut m = B::new().u32(2).u64(0).u32(1 << 20).msg(ty::TREADDIR);
    let r = c.0.handle(&mut m, 64).unwrap();
    assert_eq!(rtype(&r), ty::TREADDIR + 1);
    assert!(r.len() <= 64);
}

// ---- the virtio side ----

const MEM_SIZE: u64 = 16 << 20;
const QBASE: u64 = 0x1_0000;
const DATA: u64 = 0x10_0000;

/// A device on slot 0 over `share`, with an active queue of `size` entries.
struct H {
    mem: GuestMem,
    p9: P9,
    irq: Arc<Interrupt>,
    q: DriverQueue,
    next: u64,
}

impl H {
    fn new(share: Share) -> Self {
        let mem = create_guest_memory(MEM_SIZE).unwrap();
        let irq = irq();
        let mut p9 = P9::new(0, share, irq.clone(), None);
        let q = DriverQueue::new(QBASE, 64);
        p9.activate(mem.clone(), vec![q.queue(QUEUE_SIZE)], offered_features())
            .unwrap();
        Self {
            mem,
            p9,
            irq,
            q,
            next: DATA,
        }
    }

    fn alloc(&mut self, len: u64) -> u64 {
        let a = self.next;
        self.next += (len + 0xfff) & !0xfff;
        a
    }

    /// Sends `msg` split into readable pieces of `out_split` bytes (the rest in one more),
    /// with writable buffers of `in_lens`; returns the used length and the reply buffers.
    fn request(&mut self, msg: &[u8], out_split: &[usize], in_lens: &[u32]) -> (u32, Vec<u8>) {
        let mut bufs = Vec::new();
        let mut rest = msg;
        for &n in out_split {
            let (a, b) = rest.split_at(n.min(rest.len()));
            let at = self.alloc(a.len() as u64);
            self.mem.write_slice(a, GuestAddress(at)).unwrap();
            bufs.push((at, a.len() as u32, false));
            rest = b;
        }
        if !rest.is_empty() {
            let at = self.alloc(rest.len() as u64);
            self.mem.write_slice(rest, GuestAddress(at)).unwrap();
            bufs.push((at, rest.len() as u32, false));
        }
        let mut ins = Vec::new();
        for &len in in_lens {
            let at = self.alloc(u64::from(len));
            ins.push((at, len));
            bufs.push((at, len, true));
        }
        let head = self.q.add_chain(&self.mem, &bufs);
        assert!(self.p9.process_queue());
        let used = self.q.used(&self.mem);
        assert_eq!(used.len(), 1, "{used:?}");
        assert_eq!(used[0].0, head);
        let mut reply = Vec::new();
        for (at, len) in ins {
            let mut v = vec![0u8; len as usize];
            self.mem.read_slice(&mut v, GuestAddress(at)).unwrap();
            reply.extend_from_slice(&v);
        }
        reply.truncate(used[0].1 as usize);
        (used[0].1, reply)
    }
}

/// `Tattach` of fid 0 to the share root as user `u` (uid 1000).
fn attach_msg() -> Vec<u8> {
    let b = B::new().u32s(&[0, NOFID]).s("u").s("");
    b.u32(1000).msg(ty::TATTACH)
}

#[test]
fn zero_copy_style_split_buffers_carry_requests_and_replies() {
    let f = Fixture::new();
    std::fs::write(f.root.join("big"), vec![0x5a; 10_000]).unwrap();
    let mut h = H::new(Share::open(&f.cfg(false)).unwrap());
    let version = B::new().u32(512_000).s("9P2000.L").msg(ty::TVERSION);
    let (_, r) = h.request(&version, &[], &[8192]);
    assert_eq!(rtype(&r), ty::TVERSION + 1);
    assert_eq!(
        rtype(&h.request(&attach_msg(), &[], &[8192]).1),
        ty::TATTACH + 1
    );
    let walk = B::new().u32(0).u32(1).u16(1).s("big").msg(ty::TWALK);
    assert_eq!(nwqid(&h.request(&walk, &[], &[8192]).1), 1);
    let lopen = B::new().u32(1).u32(0o2).msg(ty::TLOPEN);
    assert_eq!(rtype(&h.request(&lopen, &[], &[8192]).1), ty::TLOPEN + 1);
    // A read as Linux's zero-copy path sends it: an 11-byte reply header, then pages.
    let read = B::new().u32(1).u64(0).u32(10_000).msg(ty::TREAD);
    let (used, r) = h.request(&read, &[], &[11, 4096, 4096, 4096]);
    assert_eq!(used, 11 + 10_000);
    assert_eq!(data(&r), vec![0x5a; 10_000]);
    // A write as it sends it: the 23-byte header, then the data in page pieces.
    let payload: Vec<u8> = (0..9000).map(|i| (i % 251) as u8).collect();
    let mut w = B::new().u32(1).u64(100).u32(payload.len() as u32);
    w.0.extend_from_slice(&payload);
    let write = w.msg(ty::TWRITE);
    let (used, r) = h.request(&write, &[23, 4096, 4096], &[4096]);
    assert_eq!((used, rtype(&r)), (11, ty::TWRITE + 1));
    let big = std::fs::read(f.root.join("big")).unwrap();
    assert_eq!(&big[100..9100], &payload[..]);
    assert_eq!(h.irq.status() & INT_VRING, INT_VRING);
    assert_eq!(h.p9.dropped(), 0);
}

#[test]
fn chains_that_cannot_hold_a_request_or_reply_are_answered_or_dropped() {
    let f = Fixture::new();
    let mut h = H::new(Share::open(&f.cfg(false)).unwrap());
    // No room for even an Rlerror: dropped, used length 0.
    let (used, _) = h.request(&attach_msg(), &[], &[4]);
    assert_eq!(used, 0);
    assert_eq!(h.p9.dropped(), 1);
    assert_eq!(
        h.p9.share().live_fids(),
        0,
        "a dropped request is not executed"
    );
    // Fewer readable bytes than a header: dropped.
    let (used, _) = h.request(&[1, 2, 3], &[], &[64]);
    assert_eq!(used, 0);
    assert_eq!(h.p9.dropped(), 2);
    // A header naming more than the chain carries: EINVAL.
    let mut m = attach_msg();
    m[0..4].copy_from_slice(&1000u32.to_le_bytes());
    let (_, r) = h.request(&m, &[], &[64]);
    assert_eq!(errno(&r), Some(libc::EINVAL));
    // More than the largest msize: EMSGSIZE (nothing gathered).
    m[0..4].copy_from_slice(&(MAX_MSIZE + 1).to_le_bytes());
    let (_, r) = h.request(&m, &[], &[64]);
    assert_eq!(errno(&r), Some(libc::EMSGSIZE));
    // A reply too big for the buffers: the read is cut to fit.
    h.request(&attach_msg(), &[], &[64]);
    let walk = B::new().u32(0).u32(1).u16(1).s("hello").msg(ty::TWALK);
    h.request(&walk, &[], &[64]);
    h.request(&B::new().u32(1).u32(0).msg(ty::TLOPEN), &[], &[64]);
    let (used, r) = h.request(&B::new().u32(1).u64(0).u32(4096).msg(ty::TREAD), &[], &[16]);
    assert_eq!(used, 16);
    assert_eq!(data(&r), b"hello");
    assert!(h.p9.broken_reason().is_none());
}

#[test]
fn hostile_chains_break_the_device_and_never_loop() {
    for descs in [
        // Self loop.
        vec![(0u16, DATA, 16u32, F_NEXT, 0u16)],
        // next beyond the queue.
        vec![(0, DATA, 16, F_NEXT, 200)],
        // A buffer outside guest memory, and a huge length.
        vec![(0, DATA, 16, F_NEXT, 1), (1, 1 << 40, 64, F_WRITE, 0)],
        vec![(0, DATA, 16, F_NEXT, 1), (1, DATA, u32::MAX, F_WRITE, 0)],
        // Readable after writable.
        vec![(0, DATA, 64, F_WRITE | F_NEXT, 1), (1, DATA, 16, 0, 0)],
    ] {
        let mut h = H::new(Share::unbound());
        for &(i, addr, len, flags, next) in &descs {
            h.q.write_desc(&h.mem, i, addr, len, flags, next);
        }
        h.q.publish(&h.mem, 0);
        h.p9.process_queue();
        assert!(h.p9.broken_reason().is_some(), "{descs:?}");
        assert_ne!(h.irq.status() & INT_CONFIG, 0);
        h.q.publish(&h.mem, 0);
        assert!(!h.p9.process_queue());
    }
    // A chain as long as the queue is served (the reply scattered over 63 buffers).
    let mut h = H::new(Share::unbound());
    let version = B::new().u32(8192).s("9P2000.L").msg(ty::TVERSION);
    let (used, r) = h.request(&version, &[], &[2; 63]);
    assert_eq!(rtype(&r), ty::TVERSION + 1);
    assert_eq!(used as usize, r.len());
    assert!(h.p9.broken_reason().is_none());
}

/// A transport around slot `slot` serving `share`, driven to DRIVER_OK.
fn running_transport(slot: usize, share: Share) -> (MmioTransport, Arc<Mutex<P9>>, GuestMem) {
    let mem = create_guest_memory(MEM_SIZE).unwrap();
    let irq = irq();
    let p9 = Arc::new(Mutex::new(P9::new(slot, share, irq.clone(), None)));
    let mut t = MmioTransport::new(Box::new(P9Device::new(p9.clone())), mem.clone(), irq);
    bring_up(&mut t, offered_features(), &[&DriverQueue::new(QBASE, 16)]);
    assert!(t.is_activated());
    (t, p9, mem)
}

/// Submits `msg` with a 4 KiB reply buffer through QueueNotify; returns the reply.
fn notify(t: &mut MmioTransport, mem: &GuestMem, q: &mut DriverQueue, msg: &[u8]) -> Vec<u8> {
    let at = DATA + 0x10_000 * u64::from(q.avail_idx);
    mem.write_slice(msg, GuestAddress(at)).unwrap();
    q.add_chain(
        mem,
        &[(at, msg.len() as u32, false), (at + 0x8000, 4096, true)],
    );
    w32(t, reg::QUEUE_NOTIFY, 0);
    let used = q.used(mem);
    assert_eq!(used.len(), 1);
    let mut r = vec![0u8; used[0].1 as usize];
    mem.read_slice(&mut r, GuestAddress(at + 0x8000)).unwrap();
    r
}

#[test]
fn the_transport_offers_the_mount_tag() {
    let (mut t, _p9, _mem) = running_transport(2, Share::unbound());
    assert_eq!(r32(&mut t, reg::DEVICE_ID), P9_DEVICE_ID);
    w32(&mut t, reg::DEVICE_FEATURES_SEL, 0);
    assert_ne!(
        r32(&mut t, reg::DEVICE_FEATURES) & (1 << VIRTIO_9P_MOUNT_TAG),
        0
    );
    // tag_len[2] then "voidbox2", read byte by byte as Linux does.
    let mut cfg = Vec::new();
    for i in 0..12 {
        let mut b = [0u8; 1];
        t.read(reg::CONFIG + i, &mut b);
        cfg.push(b[0]);
    }
    assert_eq!(&cfg[..2], &8u16.to_le_bytes());
    assert_eq!(&cfg[2..10], b"voidbox2");
    assert_eq!(&cfg[10..], &[0, 0]);
    assert_eq!(tag(3), "voidbox3");
}

#[test]
fn snapshots_hold_the_queue_and_refuse_a_mounted_share() {
    let f = Fixture::new();
    let (mut t, p9, mem) = running_transport(1, Share::open(&f.cfg(true)).unwrap());
    let mut q = DriverQueue::new(QBASE, 16);
    let version = B::new().u32(8192).s("9P2000.L").msg(ty::TVERSION);
    assert_eq!(
        rtype(&notify(&mut t, &mem, &mut q, &version)),
        ty::TVERSION + 1
    );
    // Unmounted (no fid): the state saves, and restores with this VM's own binding.
    let ts = t.save();
    let ps = lock(&p9).save().unwrap();
    assert_eq!(ps.slot, 1);
    assert_eq!(ps.queue.unwrap().next_avail, 1);
    let ps: P9State = serde_json::from_str(&serde_json::to_string(&ps).unwrap()).unwrap();
    let irq = irq();
    let other = Fixture::new();
    std::fs::write(other.root.join("hello"), b"the restored VM's own share").unwrap();
    let restored = P9::restore(
        &ps,
        1,
        Share::open(&other.cfg(true)).unwrap(),
        mem.clone(),
        irq.clone(),
        None,
    )
    .unwrap();
    assert_eq!(restored.save().unwrap(), ps);
    let p2 = Arc::new(Mutex::new(restored));
    let mut t2 =
        MmioTransport::restore(Box::new(P9Device::new(p2.clone())), mem.clone(), irq, &ts).unwrap();
    assert_eq!(
        rtype(&notify(&mut t2, &mem, &mut q, &attach_msg())),
        ty::TATTACH + 1
    );
    let walk = B::new().u32(0).u32(1).u16(1).s("hello").msg(ty::TWALK);
    assert_eq!(nwqid(&notify(&mut t2, &mem, &mut q, &walk)), 1);
    notify(
        &mut t2,
        &mem,
        &mut q,
        &B::new().u32(1).u32(0).msg(ty::TLOPEN),
    );
    let r = notify(
        &mut t2,
        &mem,
        &mut q,
        &B::new().u32(1).u64(0).u32(100).msg(ty::TREAD),
    );
    assert_eq!(data(&r), b"the restored VM's own share");
    // Mounted (live fids): a snapshot is refused.
    let e = lock(&p2).save().unwrap_err();
    assert!(e.contains("voidbox1") && e.contains("mounted"), "{e}");
    // Clunked again: allowed.
    notify(&mut t2, &mem, &mut q, &B::new().u32(1).msg(ty::TCLUNK));
    notify(&mut t2, &mem, &mut q, &B::new().u32(0).msg(ty::TCLUNK));
    assert!(lock(&p2).save().is_ok());
}

#[test]
fn restore_refuses_invalid_state() {
    let mem = create_guest_memory(MEM_SIZE).unwrap();
    let good = P9::new(2, Share::unbound(), irq(), None).save().unwrap();
    let restore = |s: &P9State, slot: usize| {
        P9::restore(s, slot, Share::unbound(), mem.clone(), irq(), None).map(|_| ())
    };
    restore(&good, 2).unwrap();
    let invalid = |r: Result<(), PersistError>| matches!(r, Err(PersistError::Invalid { .. }));
    assert!(invalid(restore(&good, 1)), "another slot");
    let far = P9State {
        slot: 9,
        ..good.clone()
    };
    assert!(invalid(restore(&far, 9)));
    let feat = P9State {
        acked_features: 1 << 40,
        ..good.clone()
    };
    assert!(invalid(restore(&feat, 2)));
    let inactive = P9State {
        acked_features: offered_features(),
        ..good.clone()
    };
    assert!(invalid(restore(&inactive, 2)));
    let long = P9State {
        broken: Some("x".repeat(5000)),
        ..good
    };
    assert!(invalid(restore(&long, 2)));
}

#[test]
fn open_refuses_what_is_not_a_directory() {
    let f = Fixture::new();
    let file = ShareConfig {
        path: f.root.join("hello"),
        ..f.cfg(true)
    };
    assert!(Share::open(&file)
        .err()
        .unwrap()
        .contains("not a directory"));
    let missing = ShareConfig {
        path: f.root.join("missing"),
        ..f.cfg(true)
    };
    assert!(Share::open(&missing).is_err());
    // A symlink to a directory is resolved to it.
    let link = ShareConfig {
        path: f.root.join("out"),
        ..f.cfg(true)
    };
    let s = Share::open(&link).unwrap();
    assert_eq!(
        s.root().unwrap(),
        std::fs::canonicalize(&f.outside).unwrap()
    );
    assert!(s.is_bound() && s.read_only());
}

#[test]
fn fuzz_entry_point_survives_junk() {
    use super::fuzz::fuzz_messages;
    assert!(fuzz_messages(&[]).is_none());
    for flags in 0u8..4 {
        let mut data = vec![flags];
        for m in [
            B::new().u32(8192).s("9P2000.L").msg(ty::TVERSION),
            attach_msg(),
            B::new().u32(0).u32(1).u16(1).s("..").msg(ty::TWALK),
            B::new().u32(0).u32(1).u16(1).s("out").msg(ty::TWALK),
            B::new()
                .u32(0)
                .s("x")
                .u32(0o2)
                .u32(0o644)
                .u32(0)
                .msg(ty::TLCREATE),
            vec![1, 2, 3],
            vec![0xff; 40],
        ] {
            data.extend_from_slice(&(m.len() as u16).to_le_bytes());
            data.extend_from_slice(&m);
        }
        let r = fuzz_messages(&data).unwrap();
        assert_eq!(r.replies.len(), 7);
        assert!(r.replies_well_formed, "{r:?}");
        assert!(r.outside_untouched && r.read_only_untouched, "{r:?}");
    }
}

/// A full session on a share, on a thread under the VMM's base filter for `access` (a
/// syscall outside it kills this whole test process with SIGSYS).
fn session_under_seccomp(f: &Fixture, read_only: bool) {
    use crate::seccomp::{build, FilterKind, FilterParams, ShareAccess};
    let access = ShareAccess {
        bound: true,
        writable: !read_only,
    };
    let params = FilterParams::for_this_process(false, None).with_shares(access);
    let filter = build(&params, FilterKind::Base).unwrap();
    let share = Share::open(&f.cfg(read_only)).unwrap();
    let thread = std::thread::spawn(move || {
        seccompiler::apply_filter(&filter).unwrap();
        let mut c = Client(share);
        let mut replies = Vec::new();
        c.version(512_000);
        let r = c.call(attach_msg());
        replies.push(rtype(&r));
        replies.push(nwqid(&c.walk(0, 1, &["hello"])) as u8);
        replies.push(rtype(&c.getattr(1)));
        replies.push(rtype(&c.lopen(1, 0)));
        replies.push(data(&c.read(1, 0, 100)).len() as u8);
        replies.push(rtype(&c.call(B::new().u32(1).u32(0).msg(ty::TFSYNC))));
        replies.push(rtype(&c.call(B::new().u32(0).msg(ty::TSTATFS))));
        let lock = B::new().u32(1).u8(0).u32(0).u64(0).u64(10).u32(1).s("c");
        replies.push(rtype(&c.call(lock.msg(ty::TLOCK))));
        let getlock = B::new().u32(1).u8(0).u64(0).u64(10).u32(1).s("c");
        replies.push(rtype(&c.call(getlock.msg(ty::TGETLOCK))));
        // A directory listing (fdopendir on a duplicate, seekdir, getdents).
        c.walk(0, 2, &["sub"]);
        replies.push(rtype(&c.lopen(2, 0o200000)));
        let r = c.call(B::new().u32(2).u64(0).u32(4096).msg(ty::TREADDIR));
        replies.push(rtype(&r));
        c.walk(0, 3, &["out"]);
        replies.push(rtype(&c.call(B::new().u32(3).msg(ty::TREADLINK))));
        if !read_only {
            c.walk(0, 4, &[]);
            replies.push(rtype(&c.lcreate(4, "new", 0o2)));
            replies.push(rtype(&c.write(4, 0, b"under seccomp")));
            replies.push(rtype(&c.setattr(4, 0x8 | 0x1, 0o600, 0, 0, 5)));
            // atime and mtime "now".
            replies.push(rtype(&c.setattr(4, 0x10 | 0x20, 0, 0, 0, 0)));
            replies.push(rtype(&c.mkdir(0, "d")));
            c.walk(0, 5, &["d"]);
            replies.push(rtype(&c.renameat(0, "new", 5, "moved")));
            c.walk(5, 6, &["moved"]);
            replies.push(rtype(&c.link(0, 6, "hard")));
            replies.push(rtype(&c.unlinkat(0, "hard")));
            replies.push(rtype(&c.call(B::new().u32(4).u32(1).msg(ty::TFSYNC))));
        }
        for fid in 0..7 {
            c.clunk(fid);
        }
        replies
    });
    let replies = thread.join().unwrap();
    let mut want = vec![
        ty::TATTACH + 1,
        1,
        ty::TGETATTR + 1,
        ty::TLOPEN + 1,
        20,
        ty::TFSYNC + 1,
        ty::TSTATFS + 1,
        ty::TLOCK + 1,
        ty::TGETLOCK + 1,
        ty::TLOPEN + 1,
        ty::TREADDIR + 1,
        ty::TREADLINK + 1,
    ];
    if !read_only {
        want.extend([
            ty::TLCREATE + 1,
            ty::TWRITE + 1,
            ty::TSETATTR + 1,
            ty::TSETATTR + 1,
            ty::TMKDIR + 1,
            ty::TRENAMEAT + 1,
            ty::TLINK + 1,
            ty::TUNLINKAT + 1,
            ty::TFSYNC + 1,
        ]);
        assert_eq!(std::fs::read(f.root.join("d/moved")).unwrap(), b"under");
    }
    assert_eq!(replies, want);
}

#[test]
fn shares_work_under_the_vmms_seccomp_filter() {
    let f = Fixture::new();
    session_under_seccomp(&f, true);
    session_under_seccomp(&f, false);
}
