//! The guest's root tree, as it goes onto the system disk: the guest agent
//! (`/sbin/voidbox-agent`, `/init` links to it), busybox with its applet links, the
//! directories the agent and runtimes use, and minimal `/etc` files (an empty
//! `/etc/resolv.conf` among them: the agent binds its generated one over it). Held as an
//! [`Archive`] (sorted, fixed owners, modes and mtimes) so the disk is reproducible.
//!
//! Everything is owned by root: the agent mounts tmpfs on `/workspace`, `/home`, `/tmp` and
//! `/run` and gives `/workspace` and `/home/sandbox` to the sandbox user at boot.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use super::cpio::{Archive, Entry, Kind};
use super::error::ImageError;
use super::recipe::{AGENT_GUEST_PATH, EXCLUDED_APPLETS, FILE_MTIME, REQUIRED_APPLETS};

/// Directories: (path, mode).
const DIRS: &[(&str, u32)] = &[
    ("bin", 0o755),
    ("dev", 0o755),
    ("etc", 0o755),
    ("etc/voidbox", 0o755),
    ("home", 0o755),
    ("home/sandbox", 0o755),
    ("lib", 0o755),
    ("mnt", 0o755),
    ("opt", 0o755),
    ("opt/voidbox", 0o755),
    ("opt/voidbox/runtimes", 0o755),
    // The mount point of the read-only runtimes disk (engine/src/runtimes).
    ("opt/voidbox/runtimes/npm", 0o755),
    ("proc", 0o555),
    ("root", 0o700),
    ("run", 0o755),
    ("sbin", 0o755),
    ("sys", 0o555),
    ("tmp", 0o1777),
    ("usr", 0o755),
    ("usr/bin", 0o755),
    ("usr/sbin", 0o755),
    ("var", 0o755),
    ("workspace", 0o755),
];

/// Symbolic links: (path, target). `/var/tmp` is `/tmp`, a tmpfs (the root may be
/// read-only). The musl loader that Claude Code's musl build names as its interpreter lives
/// on the runtimes disk (dangling in VMs without it).
const LINKS: &[(&str, &str)] = &[
    ("var/tmp", "/tmp"),
    (
        "lib/ld-musl-x86_64.so.1",
        "/opt/voidbox/runtimes/npm/lib/ld-musl-x86_64.so.1",
    ),
];

const PASSWD: &str =
    "root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\n";
const GROUP: &str = "root:x:0:\nsandbox:x:1000:\n";
const HOSTS: &str = "127.0.0.1\tlocalhost voidbox\n";
const NSSWITCH: &str = "passwd: files\ngroup: files\nhosts: files dns\n";

fn entry(perm: u32, kind: Kind) -> Entry {
    Entry {
        perm,
        uid: 0,
        gid: 0,
        mtime: FILE_MTIME,
        kind,
    }
}

/// Applet paths (`bin/sh`, `usr/bin/awk`, …) from `busybox --list-full`.
pub fn busybox_applets(busybox: &Path) -> Result<Vec<String>, ImageError> {
    let out = Command::new(busybox)
        .arg("--list-full")
        .output()
        .map_err(ImageError::io(busybox))?;
    if !out.status.success() {
        return Err(ImageError::Step {
            step: format!("{} --list-full", busybox.display()),
            log_tail: String::from_utf8_lossy(&out.stderr).into_owned(),
            log: None,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().trim_start_matches('/').to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// Adds an executable at `path` (e.g. a runtime under `opt/voidbox/runtimes/`), with its
/// parent directories.
pub fn add_executable(a: &mut Archive, path: &str, bytes: &[u8]) -> Result<(), ImageError> {
    let mut dir = String::new();
    let parents: Vec<&str> = path.split('/').collect();
    for part in &parents[..parents.len().saturating_sub(1)] {
        if !dir.is_empty() {
            dir.push('/');
        }
        dir.push_str(part);
        if a.get(&dir).is_none() {
            a.insert(&dir, entry(0o755, Kind::Dir))?;
        }
    }
    a.insert(path, entry(0o755, Kind::File(bytes.to_vec())))?;
    Ok(())
}

/// Builds the tree. `applets` are busybox's `--list-full` paths. No device nodes: the
/// kernel mounts devtmpfs on `/dev` (`CONFIG_DEVTMPFS_MOUNT`) before it starts the agent.
pub fn build(agent: &[u8], busybox: &[u8], applets: &[String]) -> Result<Archive, ImageError> {
    let mut a = Archive::new();
    for (dir, mode) in DIRS {
        a.insert(dir, entry(*mode, Kind::Dir))?;
    }
    for (path, target) in LINKS {
        a.insert(path, entry(0o777, Kind::Symlink(target.to_string())))?;
    }
    a.insert(AGENT_GUEST_PATH, entry(0o755, Kind::File(agent.to_vec())))?;
    a.insert(
        "init",
        entry(0o777, Kind::Symlink(format!("/{AGENT_GUEST_PATH}"))),
    )?;
    a.insert("bin/busybox", entry(0o755, Kind::File(busybox.to_vec())))?;

    let names: BTreeSet<&str> = applets
        .iter()
        .filter_map(|p| p.rsplit('/').next())
        .collect();
    let missing: Vec<&str> = REQUIRED_APPLETS
        .iter()
        .copied()
        .filter(|r| !names.contains(r))
        .collect();
    if !missing.is_empty() {
        return Err(ImageError::Environment(format!(
            "the installed busybox lacks required applets: {}",
            missing.join(" ")
        )));
    }
    for path in applets {
        let Some((dir, name)) = path.rsplit_once('/') else {
            continue;
        };
        if EXCLUDED_APPLETS.contains(&name) || name == "busybox" {
            continue;
        }
        // Only into the standard directories created above.
        if !matches!(dir, "bin" | "sbin" | "usr/bin" | "usr/sbin") {
            continue;
        }
        a.insert(path, entry(0o777, Kind::Symlink("/bin/busybox".into())))?;
    }

    for (path, text) in [
        ("etc/passwd", PASSWD),
        ("etc/group", GROUP),
        ("etc/hosts", HOSTS),
        ("etc/hostname", "voidbox\n"),
        ("etc/nsswitch.conf", NSSWITCH),
        // Empty: the mount point of the agent's generated resolver file on the read-only
        // root when the node has network (`voidbox.net`); without network no resolver is
        // configured (the C libraries then try 127.0.0.1, where nothing listens).
        ("etc/resolv.conf", ""),
    ] {
        a.insert(path, entry(0o644, Kind::File(text.as_bytes().to_vec())))?;
    }
    a.check_parents()?;
    Ok(a)
}

/// The guest agent's `PATH` directories, as archive paths.
pub use voidbox_protocol::GUEST_PATH_DIRS as PATH_DIRS;

/// Names of the programs on the guest's `PATH` (executables and links in [`PATH_DIRS`]),
/// sorted and deduplicated.
pub fn path_programs(a: &Archive) -> Vec<String> {
    let mut names = BTreeSet::new();
    for (path, e) in a.entries() {
        let Some((dir, name)) = path.rsplit_once('/') else {
            continue;
        };
        let runnable = match &e.kind {
            Kind::File(_) => e.perm & 0o111 != 0,
            Kind::Symlink(_) => true,
            _ => false,
        };
        if runnable && PATH_DIRS.contains(&dir) {
            names.insert(name.to_string());
        }
    }
    names.into_iter().collect()
}

/// The programs on `PATH` of the image in `dir`: from its manifest, else (old-layout
/// manifests written before they were recorded) from its initramfs. `None` when neither can
/// be read.
pub fn image_path_programs(dir: &Path) -> Option<BTreeSet<String>> {
    let m = super::manifest::Manifest::load(dir).ok()?;
    if let Some(set) = m.path_program_set() {
        return Some(set);
    }
    let bytes = std::fs::read(dir.join(&m.initramfs.as_ref()?.file)).ok()?;
    let a = Archive::parse(&bytes).ok()?;
    Some(path_programs(&a).into_iter().collect())
}

/// The guest agent's bytes in a tree, if it is there as a regular file.
pub fn agent(a: &Archive) -> Option<&[u8]> {
    match a.get(AGENT_GUEST_PATH) {
        Some(Entry {
            kind: Kind::File(data),
            ..
        }) => Some(data),
        _ => None,
    }
}

/// Checks a tree for what the guest needs; returns the problems found.
pub fn check(a: &Archive) -> Vec<String> {
    let mut problems = Vec::new();
    match a.get(AGENT_GUEST_PATH) {
        Some(Entry {
            kind: Kind::File(data),
            perm,
            ..
        }) => {
            if perm & 0o111 == 0 {
                problems.push(format!("/{AGENT_GUEST_PATH} is not executable"));
            }
            if !data.starts_with(b"\x7fELF") && !data.starts_with(b"#!") {
                problems.push(format!(
                    "/{AGENT_GUEST_PATH} is neither an ELF binary nor a script"
                ));
            }
        }
        _ => problems.push(format!(
            "/{AGENT_GUEST_PATH} is missing or not a regular file"
        )),
    }
    if !matches!(
        a.get("bin/busybox"),
        Some(Entry {
            kind: Kind::File(_),
            ..
        })
    ) {
        problems.push("/bin/busybox is missing".into());
    }
    for applet in REQUIRED_APPLETS {
        let found = ["bin", "sbin", "usr/bin", "usr/sbin"].iter().any(|d| {
            matches!(
                a.get(&format!("{d}/{applet}")),
                Some(Entry {
                    kind: Kind::Symlink(_),
                    ..
                })
            )
        });
        if !found {
            problems.push(format!("applet {applet} is missing"));
        }
    }
    // Owners are not checked: the disk is packed with `--all-root`, and a tree read back by
    // a user other than root (`fsck.erofs --extract`) belongs to that user.
    for (dir, mode) in DIRS {
        match a.get(dir) {
            Some(e) if matches!(e.kind, Kind::Dir) && e.perm == *mode => {}
            _ => problems.push(format!("/{dir} is missing or has the wrong mode")),
        }
    }
    for (path, target) in LINKS {
        if a.get(path).map(|e| &e.kind) != Some(&Kind::Symlink(target.to_string())) {
            problems.push(format!("/{path} is not a link to {target}"));
        }
    }
    match a.get("etc/passwd") {
        Some(Entry {
            kind: Kind::File(d),
            ..
        }) if String::from_utf8_lossy(d).contains("sandbox:x:1000:1000:") => {}
        _ => problems.push("/etc/passwd lacks the sandbox user (uid 1000)".into()),
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applets() -> Vec<String> {
        let mut v: Vec<String> = REQUIRED_APPLETS
            .iter()
            .map(|a| format!("bin/{a}"))
            .collect();
        v.extend([
            "sbin/init".into(),
            "linuxrc".into(),
            "usr/bin/[".into(),
            "sbin/poweroff".into(),
        ]);
        v
    }

    #[test]
    fn layout_is_complete_and_reproducible() {
        let a = build(b"\x7fELFagent", b"\x7fELFbusybox", &applets()).unwrap();
        assert!(check(&a).is_empty(), "{:?}", check(&a));
        assert!(
            a.get("sbin/init").is_none(),
            "busybox must not provide init"
        );
        assert!(a.get("linuxrc").is_none());
        assert!(a.get("usr/bin/[").is_some());
        assert_eq!(a.get("tmp").unwrap().perm, 0o1777);
        // The mount point of the agent's resolver file on the read-only root.
        assert_eq!(
            a.get("etc/resolv.conf").map(|e| (&e.kind, e.perm)),
            Some((&Kind::File(Vec::new()), 0o644))
        );
        assert!(a
            .entries()
            .all(|(_, e)| e.mtime == FILE_MTIME && e.uid == 0));
        assert_eq!(agent(&a), Some(&b"\x7fELFagent"[..]));
        assert_eq!(
            a.get("init").map(|e| &e.kind),
            Some(&Kind::Symlink("/sbin/voidbox-agent".into()))
        );
        assert!(
            !a.entries()
                .any(|(_, e)| matches!(e.kind, Kind::CharDev { .. })),
            "no device nodes: devtmpfs provides them"
        );
        let b = build(
            b"\x7fELFagent",
            b"\x7fELFbusybox",
            &applets().into_iter().rev().collect::<Vec<_>>(),
        )
        .unwrap();
        assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap());
        // And the bytes parse back to the same tree.
        let parsed = Archive::parse(&a.to_bytes().unwrap()).unwrap();
        assert!(check(&parsed).is_empty());
    }

    #[test]
    fn path_programs_lists_applets_not_init() {
        let a = build(b"\x7fELFagent", b"\x7fELFbusybox", &applets()).unwrap();
        let p = path_programs(&a);
        assert!(p.contains(&"sh".to_string()) && p.contains(&"busybox".to_string()));
        assert!(p.contains(&"poweroff".to_string()) && p.contains(&"[".to_string()));
        assert!(!p.iter().any(|n| n == "init" || n == "passwd"));
        assert!(p.contains(&"voidbox-agent".to_string()), "sbin is on PATH");
    }

    #[test]
    fn the_corpus_image_cache_fixture_is_a_valid_cache() {
        let root =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/image-cache/voidbox");
        let (images, bad) = super::super::cache::Cache::new(root).list().unwrap();
        assert!(bad.is_empty(), "{bad:?}");
        let programs = images[0]
            .manifest
            .path_program_set()
            .expect("path_programs");
        assert!(programs.contains("awk") && !programs.contains("jq"));
    }

    #[test]
    fn missing_required_applet_fails() {
        let err = build(b"\x7fELF", b"\x7fELF", &["bin/sh".to_string()]).unwrap_err();
        assert!(err.to_string().contains("awk"), "{err}");
    }

    #[test]
    fn check_finds_problems() {
        let mut a = build(b"\x7fELFagent", b"\x7fELFbb", &applets()).unwrap();
        a.insert(AGENT_GUEST_PATH, entry(0o644, Kind::File(b"junk".to_vec())))
            .unwrap();
        a.insert("tmp", entry(0o755, Kind::Dir)).unwrap();
        let p = check(&a);
        assert!(p.iter().any(|p| p.contains("not executable")));
        assert!(p.iter().any(|p| p.contains("neither an ELF")));
        assert!(p
            .iter()
            .any(|p| p.contains("/tmp is missing or has the wrong mode")));
    }

    #[test]
    fn real_busybox_has_required_applets() {
        let bb = Path::new(super::super::deps::BUSYBOX_PATH);
        if !bb.exists() {
            return;
        }
        let list = busybox_applets(bb).unwrap();
        let a = build(b"\x7fELF", &[], &list).unwrap();
        assert!(check(&a).iter().all(|p| !p.contains("applet")));
    }
}
