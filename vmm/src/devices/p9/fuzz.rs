//! The `p9_message` fuzz target's entry point ([`fuzz_messages`]), also replayed over the
//! seed corpus by `tests/p9_fuzz_corpus.rs`. Not part of the VMM's interface.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::share::{Share, ShareStats};
use crate::config::ShareConfig;

/// What [`fuzz_messages`] observed.
#[doc(hidden)]
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FuzzReport {
    /// Each reply, in order (`None`: dropped, no complete header).
    pub replies: Vec<Option<Vec<u8>>>,
    /// Counters.
    pub stats: ShareStats,
    /// Every reply was a well-formed message echoing its request's tag and fitting the room.
    pub replies_well_formed: bool,
    /// The directory beside the share (reachable only by escaping it) is untouched.
    pub outside_untouched: bool,
    /// The share is untouched (checked for read-only shares; true otherwise).
    pub read_only_untouched: bool,
}

/// Room for each reply in [`fuzz_messages`].
#[doc(hidden)]
pub const FUZZ_REPLY_ROOM: usize = 8192;

/// A file tree: (relative path, kind and contents or link target).
fn tree(root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap_or(&p).to_path_buf();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            use std::os::unix::fs::PermissionsExt;
            let perms = m.permissions().mode();
            let what = if m.file_type().is_symlink() {
                format!("link {:?}", std::fs::read_link(&p).ok())
            } else if m.is_dir() {
                stack.push(p.clone());
                format!("dir {perms:o}")
            } else {
                format!(
                    "file {perms:o} {:?} {:?}",
                    std::fs::read(&p).ok(),
                    m.modified().ok()
                )
            };
            out.push((rel, what));
        }
    }
    out.sort();
    out
}

/// A scratch tree: `share/` (a file, a directory, a symlink to `../outside`) beside
/// `outside/secret`. Removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Option<Scratch> {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "voidbox-p9-fuzz-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let share = dir.join("share");
        std::fs::create_dir_all(share.join("sub")).ok()?;
        std::fs::create_dir_all(dir.join("outside")).ok()?;
        std::fs::write(dir.join("outside/secret"), b"host secret").ok()?;
        std::fs::write(share.join("file"), b"shared file").ok()?;
        std::fs::write(share.join("sub/inner"), b"inner").ok()?;
        std::os::unix::fs::symlink("../outside", share.join("out")).ok()?;
        Some(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fuzzing entry point: `data[0]` bit 0 makes the share read-only, bit 1 leaves the slot
/// unbound; `data[1..]` is a sequence of requests, each `len[2 LE]` then that many bytes (a
/// 9P message, well-formed or not). Each goes through the share's filter and server over a
/// scratch directory, with [`FUZZ_REPLY_ROOM`] bytes for its reply. Must never panic.
#[doc(hidden)]
pub fn fuzz_messages(data: &[u8]) -> Option<FuzzReport> {
    let (&flags, mut rest) = data.split_first()?;
    let scratch = Scratch::new()?;
    let root = scratch.0.join("share");
    let outside = scratch.0.join("outside");
    let cfg = ShareConfig {
        path: root.clone(),
        read_only: flags & 1 != 0,
        guest_uid: 1000,
        guest_gid: 1000,
    };
    let mut share = if flags & 2 != 0 {
        Share::unbound()
    } else {
        Share::open(&cfg).ok()?
    };
    let (outside_before, share_before) = (tree(&outside), tree(&root));
    let mut report = FuzzReport {
        replies_well_formed: true,
        ..FuzzReport::default()
    };
    while rest.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let mut msg = rest[2..2 + n].to_vec();
        rest = &rest[2 + n..];
        let tag = msg.get(5..7).map(|t| [t[0], t[1]]);
        let reply = share.handle(&mut msg, FUZZ_REPLY_ROOM);
        if let Some(r) = &reply {
            let size = r
                .get(..4)
                .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]));
            report.replies_well_formed &= size == Some(r.len() as u32)
                && r.len() <= FUZZ_REPLY_ROOM
                && r.get(5..7).map(|t| [t[0], t[1]]) == tag;
        } else {
            report.replies_well_formed &= n < super::wire::HEADER_LEN;
        }
        report.replies.push(reply);
    }
    report.stats = share.stats();
    report.outside_untouched = tree(&outside) == outside_before;
    report.read_only_untouched = !cfg.read_only || tree(&root) == share_before;
    Some(report)
}
