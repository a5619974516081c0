//! Pulls from a real `docker-registry` on loopback into a real cache, checked in the erofs.

use std::path::Path;
use voidbox_oci::testing::{erofs_inode, push_index, require_tools, ImageBuilder, Layer, Registry};
use voidbox_oci::{NoProgress, OciError, Platform, PullOptions, PullProgress, Store};

fn store() -> (tempfile::TempDir, Store) {
    require_tools().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("oci")).unwrap();
    (dir, store)
}

fn read_erofs_file(disk: &Path, path: &str) -> Option<u64> {
    erofs_inode(disk, path).unwrap().map(|i| i.size)
}

/// The engine spawns pulls on tokio: the future must be `Send`.
#[allow(dead_code)]
fn pull_future_is_send(store: &Store, opts: &PullOptions) {
    fn send<T: Send>(_: &T) {}
    send(&store.pull("x", opts, &NoProgress));
    send(&store.pull_boot_files("x", opts, &NoProgress));
}

#[derive(Default)]
struct Recorder {
    layers: std::sync::Mutex<Vec<(usize, u64)>>,
    bytes: std::sync::atomic::AtomicU64,
    done: std::sync::Mutex<Vec<String>>,
    phases: std::sync::Mutex<Vec<String>>,
}

impl PullProgress for Recorder {
    fn layers(&self, total: usize, bytes: u64) {
        self.layers.lock().unwrap().push((total, bytes));
    }
    fn bytes(&self, n: u64) {
        self.bytes.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
    }
    fn layer_done(&self, digest: &str) {
        self.done.lock().unwrap().push(digest.to_string());
    }
    fn phase(&self, what: &str) {
        self.phases.lock().unwrap().push(what.to_string());
    }
}

/// Three layers: busybox; files, an owned home, a setuid binary, a hardlink; then a whiteout
/// and an opaque directory. Env, WorkingDir and User set.
fn layered_image(registry: &Registry, name_tag: &str) -> String {
    ImageBuilder::busybox()
        .unwrap()
        .layer(
            Layer::new()
                .file(
                    "etc/passwd",
                    "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1002::/home/app:/bin/sh\n",
                    0o644,
                )
                .file("etc/group", "root:x:0:\napp:x:1002:\n", 0o644)
                .dir_owned("home/app", 0o750, 1001, 1002)
                .file_owned("home/app/notes.txt", "mine\n", 0o600, 1001, 1002)
                .file("usr/bin/suid", "#!/bin/sh\n", 0o4755)
                .file("usr/bin/sgid", "#!/bin/sh\n", 0o2755)
                .dir("shared", 0o1777)
                .file("doomed.txt", "bye\n", 0o644)
                .dir("opaque", 0o755)
                .file("opaque/old.txt", "old\n", 0o644)
                .dir("opaque/olddir", 0o755)
                .file("opaque/olddir/deep.txt", "deep\n", 0o644)
                .file("data/original", "linked\n", 0o640)
                .hardlink("data/link", "data/original"),
        )
        .unwrap()
        .layer(
            Layer::new()
                .whiteout("doomed.txt")
                .dir("opaque", 0o755)
                .opaque("opaque")
                .file("opaque/new.txt", "new\n", 0o644),
        )
        .unwrap()
        .env("PATH=/bin:/usr/bin")
        .env("GREETING=hello")
        .working_dir("/home/app")
        .user("app")
        .entrypoint(&["/bin/sh", "-c"])
        .cmd(&["echo hi"])
        .push(registry, name_tag)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layered_image_unpacks_with_whiteouts_owners_and_config() {
    let (_dir, store) = store();
    let registry = Registry::start().unwrap();
    let digest = layered_image(&registry, "layered:v1");
    let progress = Recorder::default();
    let img = store
        .pull(
            &registry.reference("layered:v1"),
            &PullOptions::default(),
            &progress,
        )
        .await
        .unwrap();
    assert_eq!(img.manifest_digest, digest);
    assert!(!img.cache_hit);
    assert_eq!(img.layers, 3);
    assert!(img.rootfs_disk.starts_with(store.root()));
    assert_eq!(
        std::fs::metadata(&img.rootfs_disk).unwrap().len(),
        img.disk_bytes
    );

    // Progress saw every layer and every byte.
    let layers = progress.layers.lock().unwrap().clone();
    assert_eq!(layers.len(), 1);
    assert_eq!(layers[0].0, 3);
    assert_eq!(
        progress.bytes.load(std::sync::atomic::Ordering::SeqCst),
        layers[0].1
    );
    assert_eq!(progress.done.lock().unwrap().len(), 3);
    let phases = progress.phases.lock().unwrap().clone();
    for p in ["resolving", "downloading", "unpacking", "converting"] {
        assert!(phases.contains(&p.to_string()), "{phases:?}");
    }

    // Config.
    let c = &img.config;
    assert_eq!(c.env, vec!["PATH=/bin:/usr/bin", "GREETING=hello"]);
    assert_eq!(c.working_dir.as_deref(), Some("/home/app"));
    assert_eq!(c.user.as_deref(), Some("app"));
    assert_eq!(c.resolved_user, Some((1001, 1002)));
    assert_eq!(c.entrypoint, vec!["/bin/sh", "-c"]);
    assert_eq!(c.cmd, vec!["echo hi"]);

    // Whiteouts and opaque directories.
    let disk = &img.rootfs_disk;
    assert_eq!(read_erofs_file(disk, "/doomed.txt"), None);
    assert_eq!(read_erofs_file(disk, "/.wh.doomed.txt"), None);
    assert_eq!(read_erofs_file(disk, "/opaque/old.txt"), None);
    assert_eq!(read_erofs_file(disk, "/opaque/olddir"), None);
    assert_eq!(read_erofs_file(disk, "/opaque/.wh..wh..opq"), None);
    assert_eq!(read_erofs_file(disk, "/opaque/new.txt"), Some(4));
    assert_eq!(
        read_erofs_file(disk, "/bin/busybox"),
        Some(std::fs::metadata("/bin/busybox").unwrap().len())
    );

    // Owners and modes, as the tar headers said (setuid/setgid dropped, sticky dir kept).
    let home = erofs_inode(disk, "/home/app").unwrap().unwrap();
    assert!(home.is_dir());
    assert_eq!((home.uid, home.gid, home.perm()), (1001, 1002, 0o750));
    let notes = erofs_inode(disk, "/home/app/notes.txt").unwrap().unwrap();
    assert_eq!((notes.uid, notes.gid, notes.perm()), (1001, 1002, 0o600));
    assert_eq!(
        erofs_inode(disk, "/usr/bin/suid").unwrap().unwrap().perm(),
        0o755
    );
    assert_eq!(
        erofs_inode(disk, "/usr/bin/sgid").unwrap().unwrap().perm(),
        0o755
    );
    assert_eq!(
        erofs_inode(disk, "/shared").unwrap().unwrap().perm(),
        0o1777
    );
    assert_eq!(erofs_inode(disk, "/tmp").unwrap().unwrap().perm(), 0o1777);
    assert_eq!(erofs_inode(disk, "/root").unwrap().unwrap().perm(), 0o700);
    let bb = erofs_inode(disk, "/bin/busybox").unwrap().unwrap();
    assert_eq!((bb.uid, bb.gid, bb.perm()), (0, 0, 0o755));
    assert!(erofs_inode(disk, "/bin/sh").unwrap().unwrap().is_symlink());

    // The hardlink shares the inode.
    let original = erofs_inode(disk, "/data/original").unwrap().unwrap();
    let link = erofs_inode(disk, "/data/link").unwrap().unwrap();
    assert_eq!(original.nlink, 2);
    assert_eq!(original, link);
    assert_eq!(original.perm(), 0o640);

    // A second pull of the tag asks the registry and is a cache hit.
    let again = store
        .pull(
            &registry.reference("layered:v1"),
            &PullOptions::default(),
            &NoProgress,
        )
        .await
        .unwrap();
    assert!(again.cache_hit);
    assert_eq!(again.manifest_digest, digest);
    assert_eq!(again.rootfs_disk, img.rootfs_disk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_index_resolves_to_the_requested_platform() {
    let (_dir, store) = store();
    let registry = Registry::start().unwrap();
    let amd64 = ImageBuilder::new()
        .unwrap()
        .layer(Layer::new().file("arch", "amd64\n", 0o644))
        .unwrap()
        .push(&registry, "multi:amd64")
        .unwrap();
    let arm64 = ImageBuilder::new()
        .unwrap()
        .layer(Layer::new().file("arch", "arm64!\n", 0o644))
        .unwrap()
        .platform("linux", "arm64")
        .push(&registry, "multi:arm64")
        .unwrap();
    let index = push_index(
        &registry,
        "multi:latest",
        &[("linux/arm64", &arm64), ("linux/amd64", &amd64)],
    )
    .unwrap();

    let reference = registry.reference("multi:latest");
    let img = store
        .pull(&reference, &PullOptions::default(), &NoProgress)
        .await
        .unwrap();
    assert_eq!(img.manifest_digest, amd64);
    assert_eq!(read_erofs_file(&img.rootfs_disk, "/arch"), Some(6));

    let arm = PullOptions {
        platform: Platform::parse("linux/arm64").unwrap(),
        ..Default::default()
    };
    let img = store.pull(&reference, &arm, &NoProgress).await.unwrap();
    assert_eq!(img.manifest_digest, arm64);
    assert_eq!(read_erofs_file(&img.rootfs_disk, "/arch"), Some(7));

    // The index digest as a reference, served from the cache afterwards.
    let by_index = format!("{}/multi@{index}", registry.host());
    let img = store
        .pull(&by_index, &PullOptions::default(), &NoProgress)
        .await
        .unwrap();
    assert_eq!(img.manifest_digest, amd64);

    let s390 = PullOptions {
        platform: Platform::parse("linux/s390x").unwrap(),
        ..Default::default()
    };
    let err = store
        .pull(&reference, &s390, &NoProgress)
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::NoMatchingPlatform { .. }), "{err}");
    assert!(err.to_string().contains("linux/arm64"), "{err}");

    // A single-platform image for another architecture is refused too.
    let err = store
        .pull(
            &registry.reference("multi:arm64"),
            &PullOptions::default(),
            &NoProgress,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::NoMatchingPlatform { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_digest_needs_no_network_and_a_moved_tag_is_pulled_again() {
    let (_dir, store) = store();
    let mut registry = Registry::start().unwrap();
    let reference = registry.reference("moving:latest");
    let first =
        voidbox_oci::testing::file_image(&registry, "moving:latest", "/version", "1\n").unwrap();
    let img1 = store
        .pull(&reference, &PullOptions::default(), &NoProgress)
        .await
        .unwrap();
    assert_eq!(img1.manifest_digest, first);
    assert!(!img1.cache_hit);

    // The tag moves: the next pull notices and pulls the new image.
    let second =
        voidbox_oci::testing::file_image(&registry, "moving:latest", "/version", "two\n").unwrap();
    assert_ne!(first, second);
    let img2 = store
        .pull(&reference, &PullOptions::default(), &NoProgress)
        .await
        .unwrap();
    assert_eq!(img2.manifest_digest, second);
    assert!(!img2.cache_hit);
    assert_eq!(read_erofs_file(&img2.rootfs_disk, "/version"), Some(4));
    assert_eq!(
        store.lookup(&reference).unwrap().unwrap().manifest_digest,
        second
    );

    // Registry gone: digest references are served from the cache, tags fail as unreachable.
    registry.stop();
    let pinned = format!("{}/moving@{first}", registry.host());
    let hit = store
        .pull(&pinned, &PullOptions::default(), &NoProgress)
        .await
        .unwrap();
    assert!(hit.cache_hit);
    assert_eq!(hit.rootfs_disk, img1.rootfs_disk);
    assert_eq!(
        store.lookup(&pinned).unwrap().unwrap().manifest_digest,
        first
    );
    let err = store
        .pull(&reference, &PullOptions::default(), &NoProgress)
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::Unreachable { .. }), "{err}");
    let missing = format!("{}/moving@sha256:{}", registry.host(), "0".repeat(64));
    assert!(store.lookup(&missing).unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn altered_blob_is_refused_and_nothing_is_cached() {
    let (_dir, store) = store();
    let registry = Registry::start().unwrap();
    voidbox_oci::testing::file_image(&registry, "tampered:v1", "/payload", "original payload\n")
        .unwrap();
    // Find the last layer through the registry API and flip one byte of its stored data.
    let resp = voidbox_oci::testing::http_request(
        &registry.host(),
        "GET",
        "/v2/tampered/manifests/v1",
        &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
        b"",
    )
    .unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
    let layer = manifest["layers"][1]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let data = registry.blob_data(&layer);
    let mut bytes = std::fs::read(&data).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();

    let err = store
        .pull(
            &registry.reference("tampered:v1"),
            &PullOptions::default(),
            &NoProgress,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&layer), "{err}");
    assert!(store.list().unwrap().is_empty());
    for sub in ["images", "tmp", "refs"] {
        let left: Vec<_> = std::fs::read_dir(store.root().join(sub)).unwrap().collect();
        assert!(left.is_empty(), "{sub}: {left:?}");
    }
    assert!(store
        .lookup(&registry.reference("tampered:v1"))
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pulls_of_one_image_convert_once() {
    let (dir, store) = store();
    let other = Store::open(dir.path().join("oci")).unwrap();
    let registry = Registry::start().unwrap();
    let digest = layered_image(&registry, "busy:v1");
    let reference = registry.reference("busy:v1");
    let opts = PullOptions::default();
    let (a, b) = tokio::join!(
        store.pull(&reference, &opts, &NoProgress),
        other.pull(&reference, &opts, &NoProgress)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.manifest_digest, digest);
    assert_eq!(b.manifest_digest, digest);
    assert_eq!(a.rootfs_disk, b.rootfs_disk);
    assert_eq!(
        [a.cache_hit, b.cache_hit].iter().filter(|h| !**h).count(),
        1,
        "exactly one conversion"
    );
    assert_eq!(store.list().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_remove_and_prune() {
    let (_dir, store) = store();
    let registry = Registry::start().unwrap();
    let mut digests = Vec::new();
    for (i, name) in ["one", "two", "three"].iter().enumerate() {
        let d = voidbox_oci::testing::file_image(
            &registry,
            &format!("{name}:v1"),
            "/n",
            &"x".repeat(i + 1),
        )
        .unwrap();
        store
            .pull(
                &registry.reference(&format!("{name}:v1")),
                &PullOptions::default(),
                &NoProgress,
            )
            .await
            .unwrap();
        digests.push(d);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Use "one" again so that "two" is the least recently used.
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(store
        .lookup(&registry.reference("one:v1"))
        .unwrap()
        .is_some());

    let list = store.list().unwrap();
    assert_eq!(list.len(), 3);
    assert_eq!(
        list[0].manifest_digest, digests[0],
        "most recently used first"
    );
    let two = list
        .iter()
        .find(|c| c.manifest_digest == digests[1])
        .unwrap();
    assert_eq!(two.references, vec![format!("{}/two:v1", registry.host())]);
    assert_eq!(two.layers, 2);
    assert!(two.bytes >= std::fs::metadata(&two.rootfs_disk).unwrap().len());
    assert!(two.last_used >= two.created);

    // Remove by reference, then by digest prefix.
    let removed = store.remove(&registry.reference("three:v1")).unwrap();
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].manifest_digest, digests[2]);
    assert!(store
        .lookup(&registry.reference("three:v1"))
        .unwrap()
        .is_none());
    assert!(matches!(
        store.remove(&registry.reference("three:v1")),
        Err(OciError::NotCached(_))
    ));
    assert!(matches!(
        store.remove("sha256:"),
        Err(OciError::NotCached(_))
    ));

    // Prune to just above one image's size: the least recently used ("two") goes first.
    let sizes: u64 = store.list().unwrap().iter().map(|c| c.bytes).max().unwrap();
    let evicted = store.prune(sizes + 1).unwrap();
    assert_eq!(evicted.len(), 1);
    assert_eq!(evicted[0].manifest_digest, digests[1]);
    let left = store.list().unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].manifest_digest, digests[0]);

    let prefix = &digests[0]["sha256:".len().."sha256:".len() + 12];
    let removed = store.remove(prefix).unwrap();
    assert_eq!(removed[0].manifest_digest, digests[0]);
    assert!(store.list().unwrap().is_empty());
    assert!(store.prune(0).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_files_come_out_of_a_guest_image() {
    let (_dir, store) = store();
    let registry = Registry::start().unwrap();
    let kernel = b"not really a kernel".repeat(100);
    let cpio = b"070701 not really a cpio archive".repeat(50);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &cpio).unwrap();
    let gz = gz.finish().unwrap();
    ImageBuilder::new()
        .unwrap()
        .layer(
            Layer::new()
                .file("boot/vmlinuz-6.1", &kernel, 0o644)
                .symlink("boot/vmlinuz", "/boot/vmlinuz-6.1")
                .file("rootfs.cpio.gz", &gz, 0o644),
        )
        .unwrap()
        .push(&registry, "guest:v1")
        .unwrap();
    let boot = store
        .pull_boot_files(
            &registry.reference("guest:v1"),
            &PullOptions::default(),
            &NoProgress,
        )
        .await
        .unwrap();
    assert_eq!(std::fs::read(&boot.kernel).unwrap(), kernel);
    assert_eq!(
        std::fs::read(boot.initramfs.as_ref().unwrap()).unwrap(),
        cpio
    );
    assert!(store.list().unwrap()[0].has_kernel);

    voidbox_oci::testing::file_image(&registry, "nokernel:v1", "/hello", "hi").unwrap();
    let err = store
        .pull_boot_files(
            &registry.reference("nokernel:v1"),
            &PullOptions::default(),
            &NoProgress,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::NoKernel { .. }), "{err}");
    assert!(err.to_string().contains("/boot/vmlinuz"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_layer_media_type_and_missing_images_are_typed_errors() {
    let (_dir, store) = store();
    let registry = Registry::start().unwrap();
    voidbox_oci::testing::file_image(&registry, "plain:v1", "/x", "x").unwrap();
    let get = voidbox_oci::testing::http_request(
        &registry.host(),
        "GET",
        "/v2/plain/manifests/v1",
        &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
        b"",
    )
    .unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&get.body).unwrap();
    manifest["layers"][1]["mediaType"] = "application/vnd.oci.image.layer.v1.tar+bzip2".into();
    let body = manifest.to_string();
    let put = voidbox_oci::testing::http_request(
        &registry.host(),
        "PUT",
        "/v2/plain/manifests/odd",
        &[("Content-Type", "application/vnd.oci.image.manifest.v1+json")],
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    let err = store
        .pull(
            &registry.reference("plain:odd"),
            &PullOptions::default(),
            &NoProgress,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, OciError::UnsupportedMediaType { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("tar+bzip2"), "{err}");

    let err = store
        .pull(
            &registry.reference("plain:nope"),
            &PullOptions::default(),
            &NoProgress,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::NotFound { .. }), "{err}");
    let err = store
        .pull(
            &registry.reference("absent:v1"),
            &PullOptions::default(),
            &NoProgress,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::NotFound { .. }), "{err}");
    assert!(store.list().unwrap().is_empty());
}
