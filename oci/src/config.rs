//! The runtime part of an image config (`Env`, `WorkingDir`, `User`, `Entrypoint`, `Cmd`) and
//! resolving `User` against the image's own `/etc/passwd` and `/etc/group`.

use crate::resolve::Root;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::Path;

/// What an image asks of the process run in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeConfig {
    /// `KEY=value` entries, in order.
    pub env: Vec<String>,
    /// The working directory, absolute, when the image sets one.
    pub working_dir: Option<String>,
    /// `User` as written in the image (`name`, `uid`, `name:group`, `uid:gid`), when set.
    pub user: Option<String>,
    /// `User` resolved to numeric `(uid, gid)` against the image's `/etc/passwd` and
    /// `/etc/group` at unpack time, Docker's way: a numeric uid without a group takes the
    /// primary group from `/etc/passwd` (0 when the uid is not listed). `None` when `user` is
    /// unset (run as root) **or** names a user or group the image does not have — the engine
    /// must refuse the latter (`user.is_some() && resolved_user.is_none()`).
    pub resolved_user: Option<(u32, u32)>,
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
}

impl RuntimeConfig {
    /// Reads the runtime fields from an image config blob (OCI or Docker).
    pub(crate) fn from_image_config(config: &oci_spec::image::ImageConfiguration) -> RuntimeConfig {
        let Some(c) = config.config() else {
            return RuntimeConfig::default();
        };
        RuntimeConfig {
            env: c.env().clone().unwrap_or_default(),
            working_dir: c.working_dir().clone().filter(|w| !w.is_empty()),
            user: c.user().clone().filter(|u| !u.is_empty()),
            resolved_user: None,
            entrypoint: c.entrypoint().clone().unwrap_or_default(),
            cmd: c.cmd().clone().unwrap_or_default(),
        }
    }
}

/// Resolves `user` (`name`, `uid`, `name:group`, `uid:gid`, …) in the unpacked root.
pub(crate) fn resolve_user(root: &Root, user: &str) -> Option<(u32, u32)> {
    let passwd = read_small(root, "etc/passwd");
    let group = read_small(root, "etc/group");
    resolve_user_in(user, &passwd, &group)
}

fn resolve_user_in(user: &str, passwd: &str, group: &str) -> Option<(u32, u32)> {
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    // passwd: name:x:uid:gid:gecos:home:shell
    let users: Vec<(&str, u32, u32)> = passwd
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((
                *f.first()?,
                f.get(2)?.parse().ok()?,
                f.get(3)?.parse().ok()?,
            ))
        })
        .collect();
    let (uid, primary) = match u.parse::<u32>() {
        Ok(uid) => (
            uid,
            users.iter().find(|e| e.1 == uid).map(|e| e.2).unwrap_or(0),
        ),
        Err(_) => users.iter().find(|e| e.0 == u).map(|e| (e.1, e.2))?,
    };
    let gid = match g {
        None | Some("") => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.first() == Some(&g)).then(|| f.get(2)?.parse().ok())?
            })?,
        },
    };
    Some((uid, gid))
}

/// Reads a file of the image (at most 4 MiB); missing or unreadable reads as empty.
fn read_small(root: &Root, rel: &str) -> String {
    let Ok(file) = root.open_file(Path::new(rel)) else {
        return String::new();
    };
    let mut text = String::new();
    let _ = file.take(4 << 20).read_to_string(&mut text);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1002::/home/app:/bin/sh\n";
    const GROUP: &str = "root:x:0:\napp:x:1002:\nstaff:x:50:app\n";

    #[test]
    fn users_resolve_like_docker() {
        let r = |u| resolve_user_in(u, PASSWD, GROUP);
        assert_eq!(r("app"), Some((1001, 1002)));
        assert_eq!(r("app:staff"), Some((1001, 50)));
        assert_eq!(r("1001"), Some((1001, 1002)));
        assert_eq!(r("4242"), Some((4242, 0)));
        assert_eq!(r("4242:7"), Some((4242, 7)));
        assert_eq!(r("app:77"), Some((1001, 77)));
        assert_eq!(r("nobody"), None);
        assert_eq!(r("app:nogroup"), None);
    }
}
