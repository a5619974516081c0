//! `voidbox pull` and `voidbox oci ls|rm|prune` through the built binary, against real
//! registries on loopback (Debian's `docker-registry`, started by `voidbox_oci::testing`),
//! with the cache in a temporary `XDG_CACHE_HOME`. No KVM needed.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use voidbox_oci::testing::{file_image, http_request, require_tools, Registry};
use voidbox_tests::{run_isolated, Run};

const BIN: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

/// A private cache, home and Docker config for the binary.
struct Cli {
    cache: tempfile::TempDir,
    home: tempfile::TempDir,
}

impl Cli {
    fn new() -> Cli {
        require_tools().expect("OCI test tools");
        Cli {
            cache: tempfile::tempdir().expect("cache dir"),
            home: tempfile::tempdir().expect("home dir"),
        }
    }

    /// The OCI cache root the binary uses.
    fn oci_root(&self) -> PathBuf {
        self.cache.path().join("voidbox").join("oci")
    }

    /// Runs the binary with `args`, no registry credentials and no cap unless `env` sets them.
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        run_isolated(
            BIN,
            self.cache.path(),
            self.home.path(),
            args,
            &["VOIDBOX_OCI_MAX_BYTES"],
            env,
        )
    }

    /// `voidbox oci ls --format json`.
    fn ls(&self) -> serde_json::Value {
        let r = self.run(&["oci", "ls", "--format", "json"], &[]);
        assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
        serde_json::from_str(&r.stdout).expect("oci ls JSON")
    }

    /// Digests of the cached images, most recently used first.
    fn cached(&self) -> Vec<String> {
        self.ls()["images"]
            .as_array()
            .expect("images")
            .iter()
            .map(|i| i["digest"].as_str().unwrap_or_default().to_string())
            .collect()
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

/// Exit 3 with one `error: pulling REF: …` line naming `reason`.
fn unavailable(r: &Run, reference: &str, reason: &str) {
    assert_eq!(
        r.code,
        Some(3),
        "stdout:\n{}\nstderr:\n{}",
        r.stdout,
        r.stderr
    );
    let errors: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{}", r.stderr);
    assert!(
        errors[0].starts_with(&format!("error: pulling {reference}: ")),
        "{}",
        r.stderr
    );
    assert!(errors[0].contains(reason), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
}

fn assert_cache_holds_nothing(root: &Path) {
    for sub in ["images", "refs", "tmp"] {
        let dir = root.join(sub);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{}: {left:?}", dir.display());
    }
}

#[test]
fn pull_then_cached_then_listed_then_removed() {
    let cli = Cli::new();
    let registry = Registry::start().unwrap();
    let digest = file_image(&registry, "app:v1", "/hello.txt", "hello\n").unwrap();
    let reference = registry.reference("app:v1");

    let first = cli.run(&["pull", &reference], &[]);
    ok(&first);
    assert!(
        first.stdout.contains(&format!("digest: {digest}")),
        "{}",
        first.stdout
    );
    assert!(first.stdout.contains("layers: 2"), "{}", first.stdout);
    assert!(first.stdout.contains("cached: no"), "{}", first.stdout);
    // Not a terminal: one plain line per phase.
    for phase in [
        "resolving",
        "downloading 2 layers",
        "unpacking",
        "converting",
    ] {
        assert!(
            first
                .stderr
                .contains(&format!("pulling {reference}: {phase}")),
            "{phase}: {}",
            first.stderr
        );
    }

    let second = cli.run(&["pull", &reference], &[]);
    ok(&second);
    assert!(second.stdout.contains("cached: yes"), "{}", second.stdout);
    assert!(
        second
            .stderr
            .contains(&format!("pulling {reference}: cached")),
        "{}",
        second.stderr
    );
    assert!(!second.stderr.contains("downloading"), "{}", second.stderr);

    let json = cli.run(&["pull", &reference, "--format", "json"], &[]);
    ok(&json);
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).expect("pull JSON");
    assert_eq!(doc["digest"], digest.as_str());
    assert_eq!(doc["cache_hit"], true);
    assert_eq!(doc["layers"], 2);
    let disk = PathBuf::from(doc["rootfs_disk"].as_str().expect("rootfs_disk"));
    assert!(disk.starts_with(cli.oci_root()), "{}", disk.display());
    assert_eq!(
        doc["disk_bytes"].as_u64(),
        Some(std::fs::metadata(&disk).expect("disk").len())
    );

    let ls = cli.ls();
    let images = ls["images"].as_array().expect("images");
    assert_eq!(images.len(), 1, "{ls}");
    assert_eq!(images[0]["digest"], digest.as_str());
    assert_eq!(images[0]["references"][0], reference.as_str());
    assert_eq!(images[0]["layers"], 2);
    assert!(images[0]["bytes"].as_u64() >= doc["disk_bytes"].as_u64());
    assert_eq!(ls["total_bytes"], images[0]["bytes"]);
    assert_eq!(ls["max_bytes"].as_u64(), Some(20 << 30));

    let human = cli.run(&["oci", "ls"], &[]);
    ok(&human);
    let hex = &digest["sha256:".len().."sha256:".len() + 12];
    let row = human
        .stdout
        .lines()
        .find(|l| l.starts_with(&reference))
        .unwrap_or_else(|| panic!("{}", human.stdout));
    assert!(row.contains(hex), "{row}");
    assert!(human.stdout.starts_with("REFERENCE"), "{}", human.stdout);
    assert!(
        human.stderr.contains("1 image(s)") && human.stderr.contains("of 20.0G"),
        "{}",
        human.stderr
    );

    let rm = cli.run(&["oci", "rm", &reference], &[]);
    ok(&rm);
    assert!(
        rm.stderr.contains(&format!("removed sha256:{hex}")),
        "{}",
        rm.stderr
    );
    assert!(cli.cached().is_empty());
    assert!(!disk.exists());
    let again = cli.run(&["oci", "rm", &reference], &[]);
    assert_eq!(again.code, Some(3), "{}", again.stderr);
    assert!(
        again.stderr.contains("not in the OCI cache"),
        "{}",
        again.stderr
    );
}

#[test]
fn rm_by_digest_prefix_and_all_and_a_typo_removes_nothing() {
    let cli = Cli::new();
    let registry = Registry::start().unwrap();
    let a = file_image(&registry, "a:v1", "/a", "a\n").unwrap();
    let b = file_image(&registry, "b:v1", "/b", "b\n").unwrap();
    for name in ["a:v1", "b:v1"] {
        ok(&cli.run(&["pull", &registry.reference(name)], &[]));
    }
    let prefix = &a["sha256:".len().."sha256:".len() + 10];
    let typo = cli.run(&["oci", "rm", prefix, "no-such-image:v9"], &[]);
    assert_eq!(typo.code, Some(3), "{}", typo.stderr);
    assert!(typo.stderr.contains("no-such-image:v9"), "{}", typo.stderr);
    assert_eq!(cli.cached().len(), 2, "a typo removes nothing");

    ok(&cli.run(&["oci", "rm", prefix], &[]));
    assert_eq!(cli.cached(), [b]);
    let all = cli.run(&["oci", "rm", "--all"], &[]);
    ok(&all);
    assert!(all.stderr.contains("removed 1 image(s)"), "{}", all.stderr);
    assert!(cli.cached().is_empty());
    let usage = cli.run(&["oci", "rm"], &[]);
    assert_eq!(usage.code, Some(2), "{}", usage.stderr);
}

#[test]
fn the_cap_evicts_least_recently_used_never_the_image_just_pulled() {
    let cli = Cli::new();
    let registry = Registry::start().unwrap();
    let mut digests = Vec::new();
    for name in ["one", "two", "three"] {
        digests.push(file_image(&registry, &format!("{name}:v1"), "/n", name).unwrap());
    }
    let pull = |name: &str, env: &[(&str, &str)]| {
        let r = cli.run(&["pull", &registry.reference(&format!("{name}:v1"))], env);
        ok(&r);
        std::thread::sleep(std::time::Duration::from_millis(30));
        r
    };
    pull("one", &[]);
    pull("two", &[]);
    // A cache hit is a use: "two" becomes the least recently used.
    pull("one", &[]);
    assert_eq!(cli.cached(), [digests[0].clone(), digests[1].clone()]);

    // Prune to one byte less than the total: only the least recently used goes.
    let total = cli.ls()["total_bytes"].as_u64().expect("total");
    let max = (total - 1).to_string();
    let prune = cli.run(&["oci", "prune", "--max-bytes", &max], &[]);
    ok(&prune);
    assert!(
        prune.stderr.contains(&registry.reference("two:v1")),
        "{}",
        prune.stderr
    );
    assert!(
        prune.stderr.contains("evicted 1 image(s)"),
        "{}",
        prune.stderr
    );
    assert_eq!(cli.cached(), [digests[0].clone()]);

    // A cap smaller than any image: the pull keeps what it just pulled, evicts the rest.
    let tiny = [("VOIDBOX_OCI_MAX_BYTES", "1K")];
    let three = pull("three", &tiny);
    assert!(
        three
            .stderr
            .contains(&format!("evicted sha256:{}", &digests[0][7..19])),
        "{}",
        three.stderr
    );
    assert_eq!(cli.cached(), [digests[2].clone()]);
    assert!(std::fs::metadata(
        cli.oci_root()
            .join("images")
            .join(&digests[2][7..])
            .join("rootfs.erofs")
    )
    .is_ok());

    // `oci prune` without --max-bytes applies the same cap.
    ok(&cli.run(&["oci", "prune"], &tiny));
    assert!(cli.cached().is_empty());

    // A malformed cap is a usage error, before anything is downloaded.
    let bad = cli.run(
        &["pull", &registry.reference("one:v1")],
        &[("VOIDBOX_OCI_MAX_BYTES", "lots")],
    );
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(
        bad.stderr.contains("VOIDBOX_OCI_MAX_BYTES"),
        "{}",
        bad.stderr
    );
    assert!(cli.cached().is_empty());
}

#[test]
fn missing_tag_closed_port_and_bad_reference() {
    let cli = Cli::new();
    let registry = Registry::start().unwrap();
    file_image(&registry, "app:v1", "/x", "x\n").unwrap();

    let missing = registry.reference("app:nope");
    unavailable(
        &cli.run(&["pull", &missing], &[]),
        &missing,
        &format!("image {missing} not found"),
    );

    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let closed = format!("127.0.0.1:{port}/app:v1");
    unavailable(
        &cli.run(&["pull", &closed], &[]),
        &closed,
        &format!("registry 127.0.0.1:{port} unreachable"),
    );

    let usage = cli.run(&["pull", "Not A/Reference"], &[]);
    assert_eq!(usage.code, Some(2), "{}", usage.stderr);
    assert!(
        usage.stderr.contains("invalid image reference"),
        "{}",
        usage.stderr
    );
    assert_cache_holds_nothing(&cli.oci_root());
}

#[test]
fn altered_blob_is_refused_and_nothing_is_cached() {
    let cli = Cli::new();
    let registry = Registry::start().unwrap();
    file_image(&registry, "tampered:v1", "/payload", "original payload\n").unwrap();
    let resp = http_request(
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
        .expect("layer digest")
        .to_string();
    let data = registry.blob_data(&layer);
    let mut bytes = std::fs::read(&data).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();

    let reference = registry.reference("tampered:v1");
    let r = cli.run(&["pull", &reference], &[]);
    unavailable(&r, &reference, "digest mismatch");
    assert!(r.stderr.contains(&layer), "{}", r.stderr);
    assert!(cli.cached().is_empty());
    assert_cache_holds_nothing(&cli.oci_root());
}

#[test]
fn basic_auth_from_the_environment_and_no_password_in_any_output() {
    const USER: &str = "alice";
    const PASSWORD: &str = "s3cret-Passw0rd";
    const WRONG: &str = "wrong-Passw0rd-xyz";
    let cli = Cli::new();
    let registry = Registry::start_with_basic_auth(USER, PASSWORD).unwrap();
    let digest = file_image(&registry, "private:v1", "/p", "p\n").unwrap();
    let reference = registry.reference("private:v1");
    let b64 = base64::engine::general_purpose::STANDARD;
    let secrets = [
        PASSWORD.to_string(),
        WRONG.to_string(),
        b64.encode(format!("{USER}:{PASSWORD}")),
        b64.encode(format!("{USER}:{WRONG}")),
        b64.encode(PASSWORD),
        b64.encode(WRONG),
    ];
    let no_secret = |r: &Run| {
        for s in &secrets {
            assert!(
                !r.stdout.contains(s) && !r.stderr.contains(s),
                "secret leaked:\n{}\n{}",
                r.stdout,
                r.stderr
            );
        }
    };

    let wrong = cli.run(
        &["pull", &reference],
        &[
            ("VOIDBOX_REGISTRY_USERNAME", USER),
            ("VOIDBOX_REGISTRY_PASSWORD", WRONG),
        ],
    );
    unavailable(&wrong, &reference, "refused access");
    no_secret(&wrong);

    let anonymous = cli.run(&["pull", &reference], &[]);
    unavailable(&anonymous, &reference, "refused access");
    assert_cache_holds_nothing(&cli.oci_root());

    // Into a --cache-dir this time: the default cache stays empty.
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().to_str().expect("utf-8 temp dir");
    let right = cli.run(
        &[
            "pull",
            &reference,
            "--cache-dir",
            cache_dir,
            "--format",
            "json",
        ],
        &[
            ("VOIDBOX_REGISTRY_USERNAME", USER),
            ("VOIDBOX_REGISTRY_PASSWORD", PASSWORD),
        ],
    );
    ok(&right);
    no_secret(&right);
    let doc: serde_json::Value = serde_json::from_str(&right.stdout).expect("pull JSON");
    assert_eq!(doc["digest"], digest.as_str());
    assert!(doc["rootfs_disk"]
        .as_str()
        .is_some_and(|d| d.starts_with(cache_dir)));
    assert!(cli.cached().is_empty());
    let ls = cli.run(&["oci", "ls", "--cache-dir", cache_dir], &[]);
    ok(&ls);
    assert!(ls.stdout.contains(&reference), "{}", ls.stdout);
}
