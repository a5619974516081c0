//! The initramfs layout: `/init` (the guest agent), busybox with its applet links,
//! the directories the agent and runtimes use, and minimal `/etc` files.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use super::cpio::{Archive, Entry, Kind};
use super::error::ImageError;
use super::recipe::{EXCLUDED_APPLETS, INITRAMFS_MTIME, REQUIRED_APPLETS};

/// uid/gid of the unprivileged user every guest command runs as.
pub const SANDBOX_UID: u32 = 1000;

/// Directories: (path, mode, uid).
const DIRS: &[(&str, u32, u32)] = &[
    ("bin", 0o755, 0),
    ("dev", 0o755, 0),
    ("etc", 0o755, 0),
    ("etc/voidbox", 0o755, 0),
    ("home", 0o755, 0),
    ("home/sandbox", 0o755, SANDBOX_UID),
    ("mnt", 0o755, 0),
    ("opt", 0o755, 0),
    ("opt/voidbox", 0o755, 0),
    ("opt/voidbox/runtimes", 0o755, 0),
    ("proc", 0o555, 0),
    ("root", 0o700, 0),
    ("run", 0o755, 0),
    ("sbin", 0o755, 0),
    ("sys", 0o555, 0),
    ("tmp", 0o1777, 0),
    ("usr", 0o755, 0),
    ("usr/bin", 0o755, 0),
    ("usr/sbin", 0o755, 0),
    ("var", 0o755, 0),
    ("var/tmp", 0o1777, 0),
    ("workspace", 0o755, SANDBOX_UID),
];

const PASSWD: &str =
    "root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\n";
const GROUP: &str = "root:x:0:\nsandbox:x:1000:\n";
const HOSTS: &str = "127.0.0.1\tlocalhost voidbox\n";
const NSSWITCH: &str = "passwd: files\ngroup: files\nhosts: files dns\n";

fn entry(perm: u32, uid: u32, kind: Kind) -> Entry {
    Entry {
        perm,
        uid,
        gid: uid,
        mtime: INITRAMFS_MTIME,
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
            a.insert(&dir, entry(0o755, 0, Kind::Dir))?;
        }
    }
    a.insert(path, entry(0o755, 0, Kind::File(bytes.to_vec())))?;
    Ok(())
}

/// Builds the archive. `applets` are busybox's `--list-full` paths.
pub fn build(agent: &[u8], busybox: &[u8], applets: &[String]) -> Result<Archive, ImageError> {
    let mut a = Archive::new();
    for (dir, mode, uid) in DIRS {
        a.insert(dir, entry(*mode, *uid, Kind::Dir))?;
    }
    // The kernel opens /dev/console for PID 1 before anything can mount devtmpfs.
    a.insert(
        "dev/console",
        entry(0o600, 0, Kind::CharDev { major: 5, minor: 1 }),
    )?;
    a.insert("init", entry(0o755, 0, Kind::File(agent.to_vec())))?;
    a.insert("bin/busybox", entry(0o755, 0, Kind::File(busybox.to_vec())))?;

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
        a.insert(path, entry(0o777, 0, Kind::Symlink("/bin/busybox".into())))?;
    }

    for (path, text) in [
        ("etc/passwd", PASSWD),
        ("etc/group", GROUP),
        ("etc/hosts", HOSTS),
        ("etc/hostname", "voidbox\n"),
        ("etc/nsswitch.conf", NSSWITCH),
    ] {
        a.insert(path, entry(0o644, 0, Kind::File(text.as_bytes().to_vec())))?;
    }
    a.check_parents()?;
    Ok(a)
}

/// The guest agent's `PATH` directories, as archive paths.
pub const PATH_DIRS: [&str; 6] = [
    "usr/local/bin",
    "usr/bin",
    "bin",
    "usr/local/sbin",
    "usr/sbin",
    "sbin",
];

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

/// The programs on `PATH` of the image in `dir`: from its manifest, else (manifests written
/// before they were recorded) from its initramfs. `None` when neither can be read.
pub fn image_path_programs(dir: &Path) -> Option<BTreeSet<String>> {
    let m = super::manifest::Manifest::load(dir).ok()?;
    if let Some(set) = m.path_program_set() {
        return Some(set);
    }
    let bytes = std::fs::read(dir.join(&m.initramfs.file)).ok()?;
    let a = Archive::parse(&bytes).ok()?;
    Some(path_programs(&a).into_iter().collect())
}

/// The programs on `PATH` of the newest cached guest image, when its manifest records them;
/// read once per process (validation asks for every `cli:` skill).
pub fn cached_path_programs() -> Option<&'static BTreeSet<String>> {
    static PROGRAMS: std::sync::OnceLock<Option<BTreeSet<String>>> = std::sync::OnceLock::new();
    PROGRAMS
        .get_or_init(|| {
            let cache = super::cache::Cache::open(None).ok()?;
            let (images, _) = cache.list().ok()?;
            images.first()?.manifest.path_program_set()
        })
        .as_ref()
}

/// Checks an archive for what the guest needs; returns the problems found.
pub fn check(a: &Archive) -> Vec<String> {
    let mut problems = Vec::new();
    match a.get("init") {
        Some(Entry {
            kind: Kind::File(data),
            perm,
            ..
        }) => {
            if perm & 0o111 == 0 {
                problems.push("/init is not executable".into());
            }
            if !data.starts_with(b"\x7fELF") && !data.starts_with(b"#!") {
                problems.push("/init is neither an ELF binary nor a script".into());
            }
        }
        _ => problems.push("/init is missing or not a regular file".into()),
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
    for (dir, _, uid) in DIRS {
        match a.get(dir) {
            Some(e) if matches!(e.kind, Kind::Dir) && e.uid == *uid => {}
            _ => problems.push(format!("/{dir} is missing or has the wrong owner")),
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
        assert_eq!(a.get("workspace").unwrap().uid, SANDBOX_UID);
        assert_eq!(a.get("tmp").unwrap().perm, 0o1777);
        assert!(a.entries().all(|(_, e)| e.mtime == INITRAMFS_MTIME));
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
        a.insert("init", entry(0o644, 0, Kind::File(b"junk".to_vec())))
            .unwrap();
        let p = check(&a);
        assert!(p.iter().any(|p| p.contains("not executable")));
        assert!(p.iter().any(|p| p.contains("neither an ELF")));
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
