//! Where a host directory share may be mounted in the guest: one rule that `validate`, the
//! engine (before a VM starts) and the guest agent (on `MountShare`) all apply, so a path
//! that passes the first is never refused by the last.
//!
//! A share's guest path is absolute and normalized (no empty, `.` or `..` component, no
//! trailing `/`), at most [`MAX_SHARE_PATH`] bytes, without whitespace, control characters,
//! `,` or `:`. It is not `/`, not at or under a [`RESERVED_TREES`] entry, and neither one of
//! those or [`PROTECTED`] nor a directory holding one (`/etc`, `/sbin`, `/opt`): a mount
//! there would hide what the guest or the agent needs. `/workspace` itself is allowed: the project
//! directory over the working directory (void-box's `--mount /project:/workspace:rw`).
//!
//! Mount points are created when missing. On the guest's read-only system disk only the
//! tmpfs trees ([`WRITABLE_TREES`]) can take new directories at boot; a share anywhere else
//! (`/mnt/rw`, `/data/in`, `/srv`) asks for a writable root ([`needs_writable_root`]), which
//! the engine requests on the guest's command line ([`WRITABLE_ROOT_PARAM`]).

/// Longest guest path of a share, in bytes.
pub const MAX_SHARE_PATH: usize = 256;

/// Guest paths a share may not be at or under.
pub const RESERVED_TREES: [&str; 7] = [
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/etc/voidbox",
    "/sbin/voidbox-agent",
    "/opt/voidbox",
];

/// Guest paths a share may not hide by being mounted above them (besides
/// [`RESERVED_TREES`], which it may not be at or under either).
pub const PROTECTED: [&str; 4] = ["/workspace", "/home", "/home/sandbox", "/tmp"];

/// The working directory, which a share may replace whole.
pub const WORKSPACE: &str = "/workspace";

/// Trees that are tmpfs mounts on the guest's read-only system disk: mount points below
/// them can be created without a writable root.
pub const WRITABLE_TREES: [&str; 2] = ["/workspace", "/home"];

/// The guest kernel command-line parameter that asks the guest agent for a writable root
/// (an overlay of the system disk and a tmpfs, made before anything else is mounted).
pub const WRITABLE_ROOT_PARAM: &str = "voidbox.root=rw";

/// Whether `p` is `tree` or below it.
pub fn at_or_under(p: &str, tree: &str) -> bool {
    p == tree || p.strip_prefix(tree).is_some_and(|r| r.starts_with('/'))
}

/// Checks a share's guest path (see the module documentation); the error says why, naming
/// the path.
pub fn check_share_path(p: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("share guest path `{p}` {why}"));
    if !p.starts_with('/') {
        return bad("must be absolute");
    }
    if p.len() > MAX_SHARE_PATH {
        return bad(&format!("is longer than {MAX_SHARE_PATH} bytes"));
    }
    if p.chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == ':' || c == ',')
    {
        return bad("must not contain whitespace, control characters, `:` or `,`");
    }
    if p == "/" {
        return bad("must not be the guest's root");
    }
    if p == WORKSPACE {
        return Ok(());
    }
    if p[1..]
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return bad("must be normalised (no empty, `.` or `..` components, no trailing `/`)");
    }
    if let Some(t) = RESERVED_TREES.iter().find(|t| at_or_under(p, t)) {
        return bad(&format!("must not be inside {t}"));
    }
    if let Some(t) = RESERVED_TREES
        .iter()
        .chain(&PROTECTED)
        .find(|t| at_or_under(t, p))
    {
        return bad(&format!(
            "would hide {t} (use a path below /workspace, for example)"
        ));
    }
    Ok(())
}

/// Whether a share at `p` (already checked) needs the guest's root to be writable when the
/// guest runs on its read-only system disk: true unless `p` is `/workspace` or below one of
/// the [`WRITABLE_TREES`].
pub fn needs_writable_root(p: &str) -> bool {
    !WRITABLE_TREES.iter().any(|t| at_or_under(p, t))
}

/// Whether two share paths collide (one at or under the other): the guest mounts each
/// share on its own directory.
pub fn overlaps(a: &str, b: &str) -> bool {
    at_or_under(a, b) || at_or_under(b, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_paths_follow_the_rules() {
        for ok in [
            "/workspace/src",
            "/workspace/a/b",
            "/workspace",
            "/home/sandbox/project",
            "/mnt",
            "/mnt/rw",
            "/data",
            "/data/in",
            "/opt/tools",
            "/srv",
        ] {
            assert_eq!(check_share_path(ok), Ok(()), "{ok}");
        }
        for bad in [
            "/",
            "relative",
            "",
            "/home",
            "/home/sandbox",
            "/tmp",
            "/proc",
            "/proc/1",
            "/sys/kernel",
            "/dev",
            "/dev/shm",
            "/run",
            "/run/voidbox",
            "/etc/voidbox",
            "/etc/voidbox/x",
            "/etc",
            "/sbin",
            "/sbin/voidbox-agent",
            "/opt",
            "/opt/voidbox/runtimes",
            "/workspace/../etc",
            "/workspace/./x",
            "/workspace//x",
            "/workspace/x/",
            "/a,b",
            "/a:b",
            "/a b",
            "/a\nb",
        ] {
            assert!(check_share_path(bad).is_err(), "{bad:?}");
        }
        let long = format!("/{}", "x".repeat(MAX_SHARE_PATH));
        assert!(check_share_path(&long).is_err());
        assert!(check_share_path("/etc")
            .unwrap_err()
            .contains("would hide /etc/voidbox"));
        assert!(check_share_path("/opt")
            .unwrap_err()
            .contains("would hide /opt/voidbox"));
    }

    #[test]
    fn only_the_tmpfs_trees_need_no_writable_root() {
        for tmpfs in ["/workspace", "/workspace/src", "/home/sandbox/p", "/home/x"] {
            assert!(!needs_writable_root(tmpfs), "{tmpfs}");
        }
        for disk in [
            "/mnt",
            "/mnt/rw",
            "/data/in",
            "/opt/tools",
            "/srv",
            "/workspaces",
        ] {
            assert!(needs_writable_root(disk), "{disk}");
        }
    }

    #[test]
    fn overlapping_paths() {
        assert!(overlaps("/data", "/data/in"));
        assert!(overlaps("/data/in", "/data"));
        assert!(overlaps("/srv", "/srv"));
        assert!(!overlaps("/data", "/data2"));
    }
}
