//! `voidbox image push|pull` and `VOIDBOX_GUEST_IMAGE` against a real registry on loopback
//! (Debian's `docker-registry`, started by `voidbox_oci::testing`), with guest images in
//! temporary `XDG_CACHE_HOME`s. The image is synthetic but complete (a fake kernel ELF with a
//! PVH note, a real erofs system disk, a manifest from this voidbox's recipe): no kernel
//! build, no KVM.

use std::path::{Path, PathBuf};

use voidbox::image::manifest::{
    sha256_hex, AGENT_FILE, CONFIG_FILE, MANIFEST_FILE, SYSTEM_DISK_FILE, VMLINUX_FILE,
};
use voidbox::image::registry::{
    self, ARTIFACT_TYPE, CONFIG_MEDIA_TYPE, GUEST_IMAGE_ENV, HASH_ANNOTATION, LAYERS,
    PROFILE_ANNOTATION,
};
use voidbox::image::testing::FakeImage;
use voidbox::image::{Cache, Profile};
use voidbox_oci::testing::{file_image, http_request, require_tools, Registry};
use voidbox_tests::{run_isolated, Run};

const BIN: &str = env!("CARGO_BIN_EXE_voidbox-under-test");
const FILES: [&str; 5] = [
    VMLINUX_FILE,
    SYSTEM_DISK_FILE,
    AGENT_FILE,
    CONFIG_FILE,
    MANIFEST_FILE,
];

/// Writes a complete compat image of this voidbox's recipe into `cache/images/<hash>` and
/// returns the hash.
fn put_image(cache: &Path, agent: &[u8]) -> String {
    FakeImage::new(agent).write(cache)
}

/// A private cache (`XDG_CACHE_HOME`) and home for the binary.
struct Cli {
    xdg: tempfile::TempDir,
    home: tempfile::TempDir,
}

impl Cli {
    fn new() -> Cli {
        require_tools().expect("OCI test tools (scripts/test.sh installs them)");
        Cli {
            xdg: tempfile::tempdir().expect("cache dir"),
            home: tempfile::tempdir().expect("home dir"),
        }
    }

    /// The voidbox cache root.
    fn root(&self) -> PathBuf {
        self.xdg.path().join("voidbox")
    }

    fn cache(&self) -> Cache {
        Cache::new(self.root())
    }

    fn run(&self, args: &[&str]) -> Run {
        self.run_env(args, &[])
    }

    /// [`Cli::run`] with `env` set on top.
    fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        run_isolated(
            BIN,
            self.xdg.path(),
            self.home.path(),
            args,
            &[GUEST_IMAGE_ENV],
            env,
        )
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let r = self.run(args);
        ok(&r);
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout))
    }

    /// Pushes image `hash` (by prefix) to `reference`; returns the digest.
    fn push(&self, reference: &str, hash: &str) -> String {
        let doc = self.json(&["image", "push", reference, &hash[..12], "--format", "json"]);
        assert_eq!(doc["hash"], hash);
        doc["digest"].as_str().expect("digest").to_string()
    }

    /// The hashes `voidbox image ls` lists.
    fn listed(&self) -> Vec<String> {
        let doc = self.json(&["image", "ls", "--format", "json"]);
        doc.as_array()
            .expect("ls array")
            .iter()
            .filter(|i| Path::new(i["dir"].as_str().unwrap_or_default()).starts_with(self.root()))
            .map(|i| i["hash"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Nothing cached: no image, no index, no staging leftovers.
    fn assert_holds_nothing(&self) {
        assert!(self.listed().is_empty());
        for sub in ["images", "tmp"] {
            let dir = self.root().join(sub);
            let left: Vec<_> = std::fs::read_dir(&dir)
                .map(|rd| rd.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            assert!(left.is_empty(), "{}: {left:?}", dir.display());
        }
        assert!(
            !self.root().join("registry/index.json").exists(),
            "the index records a failed pull"
        );
    }
}

fn ok(r: &Run) {
    assert_eq!(
        r.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        r.stdout,
        r.stderr
    );
}

/// The manifest `reference`'s tag resolves to, as the registry stores it.
fn registry_manifest(registry: &Registry, repo_tag: &str) -> serde_json::Value {
    let (repo, tag) = repo_tag.rsplit_once(':').expect("repo:tag");
    let resp = http_request(
        &registry.host(),
        "GET",
        &format!("/v2/{repo}/manifests/{tag}"),
        &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
        b"",
    )
    .expect("manifest GET");
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    serde_json::from_slice(&resp.body).expect("manifest JSON")
}

#[test]
fn push_then_pull_into_an_empty_cache_is_byte_identical() {
    let registry = Registry::start().expect("registry");
    let a = Cli::new();
    let hash = put_image(&a.root(), b"\x7fELFagent-push-pull");
    let reference = registry.reference("team/guest:v1");

    // Without a hash: the newest usable image of the profile asked for.
    let r = a.run(&["image", "push", &reference, "--profile", "compat"]);
    ok(&r);
    let digest = r.stdout.trim().to_string();
    assert!(digest.starts_with("sha256:"), "{}", r.stdout);
    // Pushing again uploads nothing new and gives the same digest.
    assert_eq!(a.push(&reference, &hash), digest);

    // What the registry holds: the artifact, as documented.
    let m = registry_manifest(&registry, "team/guest:v1");
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(m["artifactType"], ARTIFACT_TYPE);
    assert_eq!(m["config"]["mediaType"], CONFIG_MEDIA_TYPE);
    assert_eq!(m["annotations"][PROFILE_ANNOTATION], "compat");
    assert_eq!(m["annotations"][HASH_ANNOTATION], hash.as_str());
    let layers = m["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), LAYERS.len());
    for kind in &LAYERS {
        let l = layers
            .iter()
            .find(|l| l["mediaType"] == kind.media_type)
            .unwrap_or_else(|| panic!("no {} layer: {m}", kind.media_type));
        assert_eq!(
            l["annotations"]["org.opencontainers.image.title"],
            kind.file
        );
    }

    // Pull into a second, empty cache.
    let b = Cli::new();
    let doc = b.json(&["image", "pull", &reference, "--format", "json"]);
    assert_eq!(doc["hash"], hash.as_str());
    assert_eq!(doc["digest"], digest.as_str());
    assert_eq!(doc["profile"], "compat");
    assert_eq!(doc["downloaded"], true);
    let dir = PathBuf::from(doc["dir"].as_str().expect("dir"));
    assert_eq!(dir, b.root().join("images").join(&hash));
    let src = a.root().join("images").join(&hash);
    for f in FILES {
        assert_eq!(
            std::fs::read(dir.join(f)).expect("pulled file"),
            std::fs::read(src.join(f)).expect("pushed file"),
            "{f} differs"
        );
    }
    assert_eq!(b.listed(), vec![hash.clone()]);
    let verify = b.run(&["image", "verify", &hash[..12]]);
    ok(&verify);
    let tmp_left: Vec<_> = std::fs::read_dir(b.root().join("tmp"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(tmp_left.is_empty(), "{tmp_left:?}");

    // Human output: the hash, then the directory. A second pull downloads nothing.
    let again = b.run(&["image", "pull", &reference]);
    ok(&again);
    let lines: Vec<&str> = again.stdout.lines().collect();
    assert_eq!(
        lines,
        [hash.as_str(), &dir.to_string_lossy()],
        "{}",
        again.stdout
    );
    assert!(again.stderr.contains("cached image"), "{}", again.stderr);
    assert!(!again.stderr.contains("pulling"), "{}", again.stderr);
}

#[test]
fn digest_pinned_pull_needs_no_registry_and_tags_say_what_to_pin() {
    let mut registry = Registry::start().expect("registry");
    let a = Cli::new();
    let hash = put_image(&a.root(), b"\x7fELFagent-pinned");
    let reference = registry.reference("guest:ci");
    let digest = a.push(&reference, &hash);
    let pinned = registry.reference(&format!("guest@{digest}"));

    let b = Cli::new();
    ok(&b.run(&["image", "pull", &reference]));
    registry.stop();

    // The pinned reference is answered from the index.
    let doc = b.json(&["image", "pull", &pinned, "--format", "json"]);
    assert_eq!(doc["hash"], hash.as_str());
    assert_eq!(doc["downloaded"], false);
    assert_eq!(doc["contacted_registry"], false);
    let img = registry::image_for_ref(&b.cache(), Profile::Compat, &pinned)
        .expect("pinned image without the registry");
    assert_eq!(img.manifest.hash, hash);

    // A tag must be resolved: with the registry gone that is an error naming the reference
    // and the digest to pin — not a silent use of the cached image.
    let r = b.run(&["image", "pull", &reference]);
    assert_eq!(r.code, Some(3), "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains(&reference), "{}", r.stderr);
    assert!(r.stderr.contains(&digest), "{}", r.stderr);
    assert!(r.stderr.contains("pin"), "{}", r.stderr);
    let e = registry::image_for_ref(&b.cache(), Profile::Compat, &reference)
        .expect_err("tag without the registry");
    let msg = e.to_string();
    assert!(
        msg.contains(GUEST_IMAGE_ENV) && msg.contains(&reference) && msg.contains(&digest),
        "{msg}"
    );
    assert_eq!(e.exit_code(), 3);
}

#[test]
fn guest_image_of_the_wrong_profile_is_refused() {
    let registry = Registry::start().expect("registry");
    let a = Cli::new();
    let hash = put_image(&a.root(), b"\x7fELFagent-profile");
    let reference = registry.reference("guest:compat");
    a.push(&reference, &hash);

    let b = Cli::new();
    let e = registry::image_for_ref(&b.cache(), Profile::Plain, &reference)
        .expect_err("a compat image on a plain host");
    let msg = e.to_string();
    assert!(msg.contains("compat guest image"), "{msg}");
    assert!(msg.contains("needs a plain one"), "{msg}");
    assert!(msg.contains(GUEST_IMAGE_ENV), "{msg}");
    // The right profile gets it.
    let img = registry::image_for_ref(&b.cache(), Profile::Compat, &reference).expect("compat");
    assert_eq!(img.manifest.hash, hash);
}

#[test]
fn tampered_blob_is_refused_and_nothing_is_cached() {
    let registry = Registry::start().expect("registry");
    let a = Cli::new();
    let hash = put_image(&a.root(), b"\x7fELFagent-tamper");
    let reference = registry.reference("guest:tampered");
    a.push(&reference, &hash);

    // One flipped byte in the system disk as the registry stores it (same length).
    let m = registry_manifest(&registry, "guest:tampered");
    let layer = m["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .find(|l| l["annotations"]["org.opencontainers.image.title"] == SYSTEM_DISK_FILE)
        .expect("system disk layer");
    let digest = layer["digest"].as_str().expect("digest").to_string();
    let blob = registry.blob_data(&digest);
    let mut bytes = std::fs::read(&blob).expect("blob");
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(&blob, &bytes).expect("tamper");
    let actual = format!("sha256:{}", sha256_hex(&bytes));

    let b = Cli::new();
    let r = b.run(&["image", "pull", &reference]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("digest mismatch"), "{}", r.stderr);
    assert!(r.stderr.contains(SYSTEM_DISK_FILE), "{}", r.stderr);
    assert!(
        r.stderr.contains(&digest) && r.stderr.contains(&actual),
        "{}",
        r.stderr
    );
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    b.assert_holds_nothing();
}

#[test]
fn container_images_are_not_guest_images() {
    let registry = Registry::start().expect("registry");
    file_image(&registry, "app:v1", "/hello.txt", "hello\n").expect("fixture image");
    let reference = registry.reference("app:v1");
    let b = Cli::new();
    let r = b.run(&["image", "pull", &reference]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("not a voidbox guest image"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains(&reference), "{}", r.stderr);
    b.assert_holds_nothing();

    // And a tag that does not exist is an environment error naming it.
    let missing = registry.reference("app:nope");
    let r = b.run(&["image", "pull", &missing]);
    assert_eq!(r.code, Some(3), "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains(&missing), "{}", r.stderr);
    b.assert_holds_nothing();
}

/// The real guest image of this host, pushed to the registry and named by
/// `VOIDBOX_GUEST_IMAGE`, boots a VM from an empty cache: pulled, verified and run without a
/// kernel build (how a team's CI runners share one image).
#[test]
fn a_run_boots_the_image_voidbox_guest_image_names() {
    let Some(image) = voidbox_tests::vm::guest_image() else {
        return;
    };
    let registry = Registry::start().expect("registry");
    let reference = registry.reference("team/guest:host");
    let home_cache = image
        .vmlinux
        .ancestors()
        .nth(3)
        .expect("cache root above images/<hash>/vmlinux")
        .to_path_buf();
    let a = Cli::new();
    let r = a.run(&[
        "image",
        "push",
        &reference,
        &image.hash[..12],
        "--cache-dir",
        &home_cache.to_string_lossy(),
    ]);
    ok(&r);

    let b = Cli::new();
    let r = b.run_env(
        &[
            "run",
            "--no-snapshot",
            "--",
            "echo",
            "booted-from-the-registry",
        ],
        &[(GUEST_IMAGE_ENV, &reference)],
    );
    ok(&r);
    assert_eq!(r.stdout.trim(), "booted-from-the-registry", "{}", r.stderr);
    assert_eq!(b.listed(), vec![image.hash.clone()]);
    assert!(
        !b.root().join("kernels").exists(),
        "a kernel was built: {}",
        r.stderr
    );

    // A reference that names nothing is an error before any VM starts, not a kernel build.
    let missing = registry.reference("team/guest:missing");
    let r = b.run_env(
        &["run", "--no-snapshot", "--", "true"],
        &[(GUEST_IMAGE_ENV, &missing)],
    );
    assert_ne!(r.code, Some(0), "{}", r.stdout);
    assert!(r.stderr.contains("team/guest:missing"), "{}", r.stderr);
    assert!(!r.stderr.contains("building guest image"), "{}", r.stderr);
}
