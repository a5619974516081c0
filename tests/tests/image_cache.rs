//! `voidbox image ls|verify|rm` on a temporary cache holding a synthetic (but
//! structurally complete) image: a fake kernel, a real erofs system disk (`mkfs.erofs`).
//! No kernel build, no VM.

use std::path::Path;
use std::process::Command;

use voidbox::image::manifest::{
    content_hash, sha256_hex, Artifact, Manifest, INITRAMFS_FILE, LEGACY_FORMAT, MANIFEST_FILE,
    SYSTEM_DISK_FILE,
};
use voidbox::image::recipe;
use voidbox::image::testing::FakeImage;

/// Writes a complete image into `root/images/<hash>` and returns the hash.
fn put_image(root: &Path, agent: &[u8]) -> String {
    put_image_built_by(root, agent, recipe::BUILDER_VERSION)
}

/// [`put_image`] as made by image builder `builder_version` (with this tree's kernel recipe,
/// so only the builder can make it stale).
fn put_image_built_by(root: &Path, agent: &[u8], builder_version: u32) -> String {
    FakeImage {
        builder_version,
        recipe_kernel: true,
        ..FakeImage::new(agent)
    }
    .write(root)
}

/// Loads, edits and rewrites the manifest of image `hash`.
fn rewrite_manifest(root: &Path, hash: &str, edit: impl FnOnce(&mut Manifest)) {
    let dir = root.join("images").join(hash);
    let mut m = Manifest::load(&dir).unwrap();
    edit(&mut m);
    std::fs::write(dir.join(MANIFEST_FILE), m.to_json()).unwrap();
}

fn voidbox(root: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_voidbox-under-test"))
        .arg("image")
        .args(args)
        .arg("--cache-dir")
        .arg(root)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn images_of_an_older_builder_are_stale_unless_named() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let a = put_image_built_by(root, b"\x7fELFagent-old", recipe::BUILDER_VERSION - 1);
    // Verifying everything lists it as stale (unused, not corrupt) and passes.
    let (code, out, err) = voidbox(root, &["verify"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "stale {}: made by another image builder",
            &a[..12]
        )),
        "{out}"
    );
    // `ls` (and `doctor`) say the same: one verdict on staleness everywhere.
    let b = put_image(root, b"\x7fELFagent-current");
    let (_, out, _) = voidbox(root, &["ls"]);
    let state = |h: &str| {
        out.lines().find(|l| l.starts_with(&h[..12])).map(|l| {
            l.split("cache")
                .nth(1)
                .unwrap_or_default()
                .trim()
                .to_string()
        })
    };
    assert_eq!(
        state(&a).as_deref(),
        Some("stale: made by another image builder"),
        "{out}"
    );
    assert_eq!(state(&b).as_deref(), Some("current"), "{out}");
    let (_, out, _) = voidbox(root, &["ls", "--format", "json"]);
    assert!(
        out.contains("\"stale\": \"made by another image builder\""),
        "{out}"
    );
    // Named, it is verified in full (here its files are intact: it passes, not called stale).
    let (code, out, err) = voidbox(root, &["verify", &a]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with(&format!("ok {}", &a[..12])), "{out}");
}

#[test]
fn ls_verify_rm_on_a_temp_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();

    let (code, _, err) = voidbox(root, &["verify"]);
    assert_eq!(code, 3, "empty cache: {err}");

    let a = put_image(root, b"\x7fELFagent-a");
    let b = put_image(root, b"\x7fELFagent-b");

    let (code, out, err) = voidbox(root, &["verify"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok ")).count(),
        2,
        "{out}"
    );

    let (code, out, _) = voidbox(root, &["ls", "--format", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[0]["profile"], "compat");
    assert_eq!(v[0]["layout"], "system-disk");
    let disk_size = std::fs::metadata(root.join("images").join(&a).join(SYSTEM_DISK_FILE))
        .unwrap()
        .len();
    assert!(v
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["system_disk_size"] == disk_size));
    let (code, out, _) = voidbox(root, &["ls"]);
    assert_eq!(code, 0);
    assert!(out.contains("SYSTEM DISK"), "{out}");

    // Tampering is caught: one changed byte in the system disk's file data, and a disk
    // whose hash is right but whose agent is not the recorded one.
    let disk = root.join("images").join(&a).join(SYSTEM_DISK_FILE);
    let mut bytes = std::fs::read(&disk).unwrap();
    let at = bytes
        .windows(b"agent-a".len())
        .position(|w| w == b"agent-a")
        .expect("the agent's bytes are on the disk, uncompressed");
    bytes[at] ^= 1;
    std::fs::write(&disk, &bytes).unwrap();
    let (code, out, _) = voidbox(root, &["verify", &a[..10]]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("sha256"), "{out}");
    rewrite_manifest(root, &a, |m| {
        if let Some(d) = m.system_disk.as_mut() {
            d.sha256 = sha256_hex(&bytes);
        }
    });
    let (code, out, _) = voidbox(root, &["verify", &a[..10]]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("guest agent differs"), "{out}");

    let (code, _, err) = voidbox(root, &["rm", &a[..12]]);
    assert_eq!(code, 0, "{err}");
    assert!(!root.join("images").join(&a).exists());
    assert!(root.join("images").join(&b).exists());

    // A prefix that matches nothing: 2, as in `snapshot rm`.
    let (code, _, err) = voidbox(root, &["rm", "deadbeef"]);
    assert_eq!(code, 2, "{err}");

    let (code, _, _) = voidbox(root, &["rm", "--all"]);
    assert_eq!(code, 0);
    let (_, out, _) = voidbox(root, &["ls", "--format", "json"]);
    assert_eq!(out.trim(), "[]");
}

/// An image of the old layout (kernel + initramfs) is listed and removable, is stale when
/// verifying everything, fails verification when named, and is never what the engine boots.
#[test]
fn old_layout_images_are_listed_but_never_booted() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let hash = put_image(root, b"\x7fELFagent-old");
    let dir = root.join("images").join(&hash);
    std::fs::write(dir.join(INITRAMFS_FILE), b"070701").unwrap();
    let mut m = Manifest::load(&dir).unwrap();
    m.format = LEGACY_FORMAT;
    m.system_disk = None;
    m.agent = None;
    m.initramfs = Some(Artifact::of(&dir, INITRAMFS_FILE).unwrap());
    m.inputs.erofs_utils_version = None;
    m.hash = content_hash(&m.inputs);
    let old_dir = root.join("images").join(&m.hash);
    std::fs::rename(&dir, &old_dir).unwrap();
    std::fs::write(old_dir.join(MANIFEST_FILE), m.to_json()).unwrap();

    let (code, out, err) = voidbox(root, &["ls"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("old layout"), "{out}");
    assert!(!err.contains("warning"), "{err}");
    // Verifying everything reports it as stale (unused, not corrupt) and passes; naming it
    // fails.
    let (code, out, _) = voidbox(root, &["verify"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("stale {}", &m.hash[..12])), "{out}");
    assert!(out.contains("old layout"), "{out}");
    let (code, out, _) = voidbox(root, &["verify", &m.hash[..12]]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAILED") && out.contains("old layout"),
        "{out}"
    );
    assert!(voidbox::sandbox::GuestImage::from_cached(&old_dir, &m).is_none());
    let (code, _, err) = voidbox(root, &["rm", &m.hash[..12]]);
    assert_eq!(code, 0, "{err}");
}

/// `voidbox image ARGS --cache-dir CACHE` with the bundle at `bundle` (`VOIDBOX_BUNDLE_DIR`).
fn voidbox_bundled(cache: &Path, bundle: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_voidbox-under-test"))
        .arg("image")
        .args(args)
        .arg("--cache-dir")
        .arg(cache)
        .env("VOIDBOX_BUNDLE_DIR", bundle)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every path under `dir`, sorted.
fn tree(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            }
            out.push(e.path());
        }
    }
    out.sort();
    out
}

#[test]
fn bundled_images_are_listed_and_verified_read_only() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, bundle) = (tmp.path().join("cache"), tmp.path().join("share/voidbox"));
    let cached = put_image(&cache, b"\x7fELFagent-cached");
    let bundled = put_image(&bundle, b"\x7fELFagent-bundled");
    let before = tree(&bundle);

    let (code, out, err) = voidbox_bundled(&cache, &bundle, &["ls", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let sources: Vec<(String, String)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["hash"].as_str().unwrap().to_string(),
                i["source"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        sources,
        [
            (cached.clone(), "cache".into()),
            (bundled.clone(), "bundled".into())
        ]
    );
    let (code, out, _) = voidbox_bundled(&cache, &bundle, &["ls"]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.starts_with(&bundled[..12]) && l.contains(" bundled ")),
        "{out}"
    );

    // `verify` checks bundled images too; a changed byte fails it.
    let (code, out, err) = voidbox_bundled(&cache, &bundle, &["verify"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok ")).count(),
        2,
        "{out}"
    );
    let disk = bundle.join("images").join(&bundled).join(SYSTEM_DISK_FILE);
    let mut bytes = std::fs::read(&disk).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&disk, &bytes).unwrap();
    let (code, out, _) = voidbox_bundled(&cache, &bundle, &["verify"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("FAILED {}", &bundled[..12])), "{out}");
    // Nothing was written into the bundle (no locks, no scratch, no temp files).
    assert_eq!(tree(&bundle), before);

    // A bundle location that is not one is an error, not a silent kernel build.
    let (code, _, err) = voidbox_bundled(&cache, &tmp.path().join("nope"), &["ls"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("VOIDBOX_BUNDLE_DIR") && err.contains("no images/"),
        "{err}"
    );
}
