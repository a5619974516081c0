//! Hostile layers (made with Python's `tarfile`, added with `umoci raw add-layer`) pulled from
//! a real registry: each is refused or neutralised, and nothing is written outside the
//! unpack directory — a sentinel directory beside the cache stays exactly as it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use voidbox_oci::testing::{erofs_inode, python_tar, require_tools, ImageBuilder, Registry};
use voidbox_oci::{NoProgress, OciError, PullOptions, PulledImage, Store};

struct Case {
    _dir: tempfile::TempDir,
    store: Store,
    sentinel: PathBuf,
    registry: Registry,
}

impl Case {
    fn new() -> Case {
        require_tools().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sentinel = dir.path().join("sentinel");
        std::fs::create_dir(&sentinel).unwrap();
        std::fs::write(sentinel.join("secret"), "untouched\n").unwrap();
        let store = Store::open(dir.path().join("cache")).unwrap();
        Case {
            _dir: dir,
            store,
            sentinel,
            registry: Registry::start().unwrap(),
        }
    }

    /// Pushes busybox + the layer the Python body writes (with `SENTINEL` bound to the
    /// sentinel's absolute path) and pulls it.
    async fn pull_hostile(&self, name: &str, body: &str) -> Result<PulledImage, OciError> {
        let tar = self.sentinel.parent().unwrap().join(format!("{name}.tar"));
        let body = format!(
            "SENTINEL = {:?}\n{body}",
            self.sentinel.display().to_string()
        );
        python_tar(&body, &tar).unwrap();
        ImageBuilder::busybox()
            .unwrap()
            .layer_tar(&tar)
            .unwrap()
            .push(&self.registry, &format!("{name}:v1"))
            .unwrap();
        std::fs::remove_file(&tar).unwrap();
        let before = snapshot(self.sentinel.parent().unwrap());
        let result = self
            .store
            .pull(
                &self.registry.reference(&format!("{name}:v1")),
                &PullOptions::default(),
                &NoProgress,
            )
            .await;
        let after = snapshot(self.sentinel.parent().unwrap());
        assert_eq!(before, after, "something was written outside the cache");
        result
    }

    fn assert_cache_clean(&self) {
        assert!(self.store.list().unwrap().is_empty());
        for sub in ["images", "tmp"] {
            let left: Vec<_> = std::fs::read_dir(self.store.root().join(sub))
                .unwrap()
                .collect();
            assert!(left.is_empty(), "{sub}: {left:?}");
        }
    }
}

/// Every path outside the cache root with its type, size, link count and content hash.
fn snapshot(top: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![top.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.file_name().is_some_and(|n| n == "cache") {
            continue;
        }
        let md = std::fs::symlink_metadata(&p).unwrap();
        use std::os::unix::fs::MetadataExt;
        let desc = if md.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
            format!("dir {:o}", md.mode())
        } else if md.file_type().is_symlink() {
            format!("link {:?}", std::fs::read_link(&p).unwrap())
        } else {
            format!(
                "file {:o} {} {} {:?}",
                md.mode(),
                md.len(),
                md.nlink(),
                std::fs::read(&p).unwrap()
            )
        };
        out.insert(p, desc);
    }
    out
}

fn unsafe_entry(err: &OciError) -> String {
    match err {
        OciError::UnsafeLayer { entry, .. } => entry.clone(),
        other => panic!("expected UnsafeLayer, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dotdot_names_refuse_the_layer() {
    let case = Case::new();
    let err = case
        .pull_hostile(
            "dotdot",
            r#"add_file("ok.txt", b"fine")
add_file("../../../../../../escaped.txt", b"pwned")"#,
        )
        .await
        .unwrap_err();
    assert_eq!(unsafe_entry(&err), "../../../../../../escaped.txt", "{err}");
    let err = case
        .pull_hostile("dotdot-mid", r#"add_file("a/../../escaped.txt", b"pwned")"#)
        .await
        .unwrap_err();
    assert_eq!(unsafe_entry(&err), "a/../../escaped.txt");
    case.assert_cache_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_names_are_made_relative() {
    let case = Case::new();
    let img = case
        .pull_hostile(
            "absolute",
            r#"add_file(SENTINEL + "/secret", b"overwritten!")
add_file("/etc/abs.txt", b"absolute")"#,
        )
        .await
        .unwrap();
    let inside = format!("{}/secret", case.sentinel.display());
    assert_eq!(
        erofs_inode(&img.rootfs_disk, &inside)
            .unwrap()
            .unwrap()
            .size,
        12
    );
    assert_eq!(
        erofs_inode(&img.rootfs_disk, "/etc/abs.txt")
            .unwrap()
            .unwrap()
            .size,
        8
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_symlinks_stay_inside() {
    let case = Case::new();
    // A directory symlink to the sentinel (absolute and relative), then writes through it:
    // they resolve inside the image, where the sentinel path does not exist (refused) or
    // where `..` stops at the root (neutralised).
    let err = case
        .pull_hostile(
            "symlink-abs",
            r#"add_symlink("evil", SENTINEL)
add_file("evil/pwned", b"pwned")"#,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::Layer { .. }), "{err}");
    assert!(err.to_string().contains("evil/pwned"), "{err}");

    let img = case
        .pull_hostile(
            "symlink-rel",
            r#"add_symlink("up", "../../../../../../../../..")
add_file("up/pwned-rel", b"pwned")
add_symlink("root-link", "/")
add_file("root-link/etc/pwned-abs", b"pwned")
add_symlink("secret-link", SENTINEL + "/secret")
add_file("secret-link", b"replaced the link, not the target")"#,
        )
        .await
        .unwrap();
    let disk = &img.rootfs_disk;
    assert_eq!(erofs_inode(disk, "/pwned-rel").unwrap().unwrap().size, 5);
    assert_eq!(
        erofs_inode(disk, "/etc/pwned-abs").unwrap().unwrap().size,
        5
    );
    let replaced = erofs_inode(disk, "/secret-link").unwrap().unwrap();
    assert!(replaced.is_file());
    assert!(erofs_inode(disk, "/up").unwrap().unwrap().is_symlink());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hardlinks_out_of_the_root_are_refused() {
    let case = Case::new();
    let err = case
        .pull_hostile(
            "hardlink-dotdot",
            r#"add_hardlink("stolen", "../../../../../../sentinel/secret")"#,
        )
        .await
        .unwrap_err();
    assert_eq!(unsafe_entry(&err), "stolen");
    assert!(err.to_string().contains("hardlink"), "{err}");

    // An absolute target is looked up inside the image, where it does not exist.
    let err = case
        .pull_hostile(
            "hardlink-abs",
            r#"add_hardlink("stolen", SENTINEL + "/secret")"#,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::Layer { .. }), "{err}");

    // Through a symlinked directory: the link resolves inside the root, so the target is
    // missing there too.
    let err = case
        .pull_hostile(
            "hardlink-symlink",
            r#"add_symlink("out", SENTINEL)
add_hardlink("stolen", "out/secret")"#,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::Layer { .. }), "{err}");
    case.assert_cache_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_nodes_and_fifos_are_dropped() {
    let case = Case::new();
    let img = case
        .pull_hostile(
            "devices",
            r#"add_dir("dev")
add_device("dev/mem", tarfile.CHRTYPE, 1, 1)
add_device("dev/sda", tarfile.BLKTYPE, 8, 0)
add_device("dev/fifo", tarfile.FIFOTYPE, 0, 0)
add_file("dev/regular", b"kept")"#,
        )
        .await
        .unwrap();
    let disk = &img.rootfs_disk;
    for gone in ["/dev/mem", "/dev/sda", "/dev/fifo"] {
        assert!(erofs_inode(disk, gone).unwrap().is_none(), "{gone}");
    }
    assert_eq!(erofs_inode(disk, "/dev/regular").unwrap().unwrap().size, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whiteouts_cannot_reach_outside() {
    let case = Case::new();
    let img = case
        .pull_hostile(
            "whiteouts",
            r#"add_symlink("out", SENTINEL)
add_file("out/.wh.secret")
add_file("etc/.wh.passwd")"#,
        )
        .await
        .unwrap();
    assert!(erofs_inode(&img.rootfs_disk, "/etc/passwd")
        .unwrap()
        .is_none());
    assert!(erofs_inode(&img.rootfs_disk, "/bin/busybox")
        .unwrap()
        .is_some());

    let err = case
        .pull_hostile("whiteout-dotdot", r#"add_file("bin/.wh..")"#)
        .await
        .unwrap_err();
    assert_eq!(unsafe_entry(&err), "bin/.wh..");
}
