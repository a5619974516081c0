//! Host directory shares of a VM (`sandbox.mounts`): host directories the guest sees at
//! guest paths, read-only or read-write, over virtio-9p.
//!
//! Every VM has [`MAX_SHARES`] share slots (the VMM's virtio-9p devices, tags `voidbox0` …,
//! probed at boot so golden snapshots hold them). [`SandboxConfig::shares`](super::SandboxConfig::shares)
//! binds slot `i` to `shares[i]` when the VMM starts — cold boot or restore alike, the
//! snapshot key does not depend on them — and once the guest agent is authenticated (and
//! re-keyed), [`super::Sandbox::start`] asks it to mount each one (`MountShare`), before the
//! caller's first request.
//!
//! The VMM serves each share as the user running it: what the guest creates belongs to
//! that user, and the guest sees that user's files as owned by the command user (uid/gid
//! 1000, or the image's `User`). Read-only is enforced by the VMM, whatever the guest does.
//! Host paths are expected resolved (absolute) and existing; [`check`] refuses anything else
//! before a VM starts, with the guest-path rules of the guest agent (so a bad path is
//! reported before a boot, not after).

use std::path::PathBuf;

use voidbox_vmm::config::{ShareConfig, DEFAULT_SHARE_GUEST_ID, SHARE_SLOTS};

use super::SandboxError;

/// The guest-path rule of shares (shared with `validate` and the guest agent).
pub use voidbox_protocol::guest_paths::check_share_path as check_guest_path;
use voidbox_protocol::guest_paths::overlaps;

/// Most shares per VM.
pub const MAX_SHARES: usize = SHARE_SLOTS;
/// Longest guest path of a share, in bytes (the guest agent's limit).
pub const MAX_GUEST_PATH: usize = voidbox_protocol::guest_paths::MAX_SHARE_PATH;

/// One host directory shared with the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The host directory (absolute, existing).
    pub host: PathBuf,
    /// Where the guest sees it (absolute, normalized; created when missing).
    pub guest: String,
    /// Refuse every change (enforced by the VMM).
    pub read_only: bool,
}

/// Checks the shares of a VM: at most [`MAX_SHARES`], host paths absolute existing
/// directories, guest paths per [`check_guest_path`], no two at (or one under) the same
/// guest path. `snapshot_control`: a VM that takes a snapshot cannot have shares (the VMM
/// refuses to snapshot a mounted share).
pub fn check(shares: &[Share], snapshot_control: bool) -> Result<(), SandboxError> {
    let fail = |m: String| Err(SandboxError::Share(m));
    if shares.len() > MAX_SHARES {
        return fail(format!(
            "{} shares, at most {MAX_SHARES} per VM",
            shares.len()
        ));
    }
    if snapshot_control && !shares.is_empty() {
        return fail("a VM that takes a snapshot cannot have shares".into());
    }
    for (i, s) in shares.iter().enumerate() {
        let host = s.host.display();
        if !s.host.is_absolute() {
            return fail(format!("share host path {host} is not absolute"));
        }
        match std::fs::metadata(&s.host) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return fail(format!("share host path {host} is not a directory")),
            Err(e) => return fail(format!("share host path {host}: {e}")),
        }
        if s.host.to_str().is_none() {
            return fail(format!("share host path {host} is not UTF-8"));
        }
        check_guest_path(&s.guest).or_else(fail)?;
        if let Some(o) = shares[..i].iter().find(|o| overlaps(&o.guest, &s.guest)) {
            return fail(format!(
                "shares at {} and {} overlap in the guest",
                o.guest, s.guest
            ));
        }
    }
    Ok(())
}

/// The VMM's share slots for `shares`; `user` is the command user (`None`: 1000:1000), whom
/// the host user's files appear to belong to.
pub fn vm_shares(shares: &[Share], user: Option<(u32, u32)>) -> Vec<ShareConfig> {
    let (uid, gid) = user.unwrap_or((DEFAULT_SHARE_GUEST_ID, DEFAULT_SHARE_GUEST_ID));
    shares
        .iter()
        .map(|s| ShareConfig {
            path: s.host.clone(),
            read_only: s.read_only,
            guest_uid: uid,
            guest_gid: gid,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(host: &std::path::Path, guest: &str, read_only: bool) -> Share {
        Share {
            host: host.to_path_buf(),
            guest: guest.into(),
            read_only,
        }
    }

    #[test]
    fn shares_are_checked_before_a_vm_starts() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        let b = d.path().join("b");
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        let ok = vec![
            share(&a, "/workspace/a", true),
            share(&b, "/workspace/b", false),
        ];
        check(&ok, false).unwrap();
        let msg = |s: &[Share], snap| match check(s, snap) {
            Err(SandboxError::Share(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(msg(&ok, true).contains("snapshot"));
        assert!(msg(&[share(&d.path().join("f"), "/x", true)], false).contains("not a directory"));
        assert!(msg(&[share(&d.path().join("nope"), "/x", true)], false).contains("nope"));
        assert!(
            msg(&[share(std::path::Path::new("rel"), "/x", true)], false).contains("not absolute")
        );
        assert!(msg(&[share(&a, "/etc", true)], false).contains("/etc/voidbox"));
        let nested = [
            share(&a, "/workspace/a", true),
            share(&b, "/workspace/a/b", true),
        ];
        assert!(msg(&nested, false).contains("overlap"));
        let same = [share(&a, "/data", true), share(&b, "/data", true)];
        assert!(msg(&same, false).contains("overlap"));
        let five: Vec<Share> = (0..5).map(|i| share(&a, &format!("/d{i}"), true)).collect();
        assert!(msg(&five, false).contains("at most 4"));
    }

    #[test]
    fn slots_follow_the_order_and_the_command_user() {
        let s = [
            share(std::path::Path::new("/h/a"), "/workspace/a", true),
            share(std::path::Path::new("/h/b"), "/workspace/b", false),
        ];
        let v = vm_shares(&s, None);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].path, std::path::Path::new("/h/a"));
        assert!(v[0].read_only && !v[1].read_only);
        assert_eq!((v[1].guest_uid, v[1].guest_gid), (1000, 1000));
        let v = vm_shares(&s, Some((501, 20)));
        assert_eq!((v[0].guest_uid, v[0].guest_gid), (501, 20));
    }
}
