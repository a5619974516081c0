//! Tests of the runtimes disk against real components: tarballs built here and served by a
//! real HTTP server on loopback (standing in for the npm registry), Debian's real musl,
//! the real `mkfs.erofs`/`fsck.erofs`/`dump.erofs`, and — in one test — the real npm
//! registry and the real pinned CLIs.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha512};

use super::pins::{self, Package, Ship};
use super::*;

/// A loopback HTTP/1.1 server serving fixed files by path, recording every request path.
struct Registry {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Registry {
    fn start(files: Vec<(String, Vec<u8>)>) -> Registry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let files: HashMap<String, Vec<u8>> = files.into_iter().collect();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(mut c) = conn {
                    serve(&mut c, &files, &r);
                }
            }
        });
        Registry {
            addr,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(c: &mut TcpStream, files: &HashMap<String, Vec<u8>>, requests: &Mutex<Vec<String>>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
        match c.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("").to_string();
    requests.lock().unwrap().push(path.clone());
    let _ = match files.get(&path) {
        Some(body) => c
            .write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )
            .and_then(|_| c.write_all(body)),
        None => {
            c.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        }
    };
}

/// One tarball entry.
enum E<'a> {
    File(&'a str, &'a [u8]),
    /// A regular file whose name bytes are written as they are (no checks).
    RawName(&'a [u8], &'a [u8]),
    Symlink(&'a str, &'a str),
}

/// A gzipped tar of `entries`, as npm serves.
fn tgz(entries: &[E]) -> Vec<u8> {
    use tar::{EntryType, Header};
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for e in entries {
        let mut h = Header::new_gnu();
        h.set_mode(0o755);
        let data: &[u8] = match e {
            E::File(p, d) => {
                h.set_path(p).unwrap();
                d
            }
            E::RawName(name, d) => {
                h.as_old_mut().name[..name.len()].copy_from_slice(name);
                d
            }
            E::Symlink(p, target) => {
                h.set_path(p).unwrap();
                h.set_entry_type(EntryType::Symlink);
                h.set_link_name(target).unwrap();
                &[]
            }
        };
        if !matches!(e, E::Symlink(..)) {
            h.set_entry_type(EntryType::Regular);
        }
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

fn integrity(bytes: &[u8]) -> String {
    npm::integrity_of(&Sha512::digest(bytes))
}

fn ship(source: &str, dest: &str) -> Ship {
    Ship {
        source: source.into(),
        dest: dest.into(),
    }
}

const ALPHA: &[u8] = b"\x7fELF alpha binary";
const BETA: &[u8] = b"\x7fELF beta binary";
const HELPER: &[u8] = b"#!/bin/sh\necho helper\n";

/// Two packages shaped like the real ones (one scoped file at the root of `package/`, one
/// with vendor paths and two shipped files), their tarballs and where a registry serves them.
fn fixture() -> (Vec<Package>, Vec<(String, Vec<u8>)>) {
    let a = tgz(&[
        E::File("package/package.json", b"{}"),
        E::File("package/alpha", ALPHA),
    ]);
    let b = tgz(&[
        E::File("package/README.md", b"beta"),
        E::File("package/vendor/x/bin/beta", BETA),
        E::File("package/vendor/x/path/helper", HELPER),
        E::File("package/vendor/x/unused", &[0u8; 4096]),
    ]);
    let packages = vec![
        Package {
            name: "@test/alpha-linux-x64-musl".into(),
            version: "1.0.0".into(),
            integrity: integrity(&a),
            files: vec![ship("package/alpha", "alpha/bin/alpha")],
        },
        Package {
            name: "@test/beta".into(),
            version: "2.0.0-linux-x64".into(),
            integrity: integrity(&b),
            files: vec![
                ship("package/vendor/x/bin/beta", "beta/bin/beta"),
                ship("package/vendor/x/path/helper", "beta/bin/helper"),
            ],
        },
    ];
    let served = vec![
        (
            "/@test/alpha-linux-x64-musl/-/alpha-linux-x64-musl-1.0.0.tgz".to_string(),
            a,
        ),
        ("/@test/beta/-/beta-2.0.0-linux-x64.tgz".to_string(), b),
    ];
    (packages, served)
}

fn options(root: &Path, registry: &str, packages: Vec<Package>) -> Options {
    Options {
        cache: Cache::new(root),
        registry: registry.to_string(),
        packages,
        debian: pins::host_files()
            .expect("Debian's musl and bash-static are needed (apt-get install musl bash-static)"),
    }
}

fn quiet() -> impl FnMut(&str) {
    |_: &str| {}
}

/// A loopback URL nothing listens on.
fn dead_registry() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}")
}

/// Entries under `runtimes/` and `tmp/` of a cache root (nothing left behind by a failure).
fn leftovers(root: &Path) -> Vec<String> {
    ["runtimes", "tmp"]
        .iter()
        .flat_map(|d| {
            std::fs::read_dir(root.join(d))
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.path().display().to_string())
        .collect()
}

#[test]
fn runtimes_disk_from_a_local_registry_reads_back_is_reproducible_and_cached() {
    let (packages, served) = fixture();
    let reg = Registry::start(served);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("cache");
    let opts = options(&root, &reg.url(), packages.clone());
    let mut lines = Vec::new();
    let d = ensure_with(&opts, &mut |l: &str| lines.push(l.to_string())).unwrap();
    assert!(d.freshly_built);
    assert_eq!(reg.requests().len(), 2, "{:?}", reg.requests());
    assert!(
        lines
            .iter()
            .any(|l| l.contains("fetching @test/beta@2.0.0-linux-x64 from http://127.0.0.1")),
        "{lines:?}"
    );
    assert_eq!(d.path, root.join("runtimes").join(d.key()).join(DISK_FILE));
    assert_eq!(d.digest, sha256_file(&d.path).unwrap().1);
    assert_eq!(d.size() % 4096, 0);

    // The manifest: versions, canonical URLs, pins, every file's hash, musl — no host paths.
    let m = &d.manifest;
    assert_eq!(m.layout, LAYOUT_VERSION);
    assert_eq!(m.mount, GUEST_MOUNT);
    let beta = m.package("@test/beta").unwrap();
    assert_eq!(
        beta.tarball,
        "https://registry.npmjs.org/@test/beta/-/beta-2.0.0-linux-x64.tgz"
    );
    assert_eq!(beta.integrity, packages[1].integrity);
    assert_eq!(
        beta.files
            .iter()
            .map(|f| f.path.as_str())
            .collect::<Vec<_>>(),
        ["beta/bin/beta", "beta/bin/helper"]
    );
    assert_eq!(
        beta.files[0].sha256,
        hex::encode(sha2::Sha256::digest(BETA))
    );
    let debian = pins::host_files().unwrap();
    assert_eq!(
        m.debian
            .iter()
            .map(|d| (d.package.as_str(), d.file.path.as_str()))
            .collect::<Vec<_>>(),
        [(MUSL_PACKAGE, LOADER_PATH), (BASH_PACKAGE, BASH_PATH)]
    );
    for (rec, host) in m.debian.iter().zip(&debian) {
        assert_eq!(rec.version, host.version);
        assert_eq!(
            rec.file.sha256,
            sha256_file(&host.path).unwrap().1,
            "{} is Debian's file byte for byte",
            rec.file.path
        );
    }
    let on_disk = m.on_disk().to_json();
    for host in [root.to_str().unwrap(), "/tmp/", "/root", "127.0.0.1"] {
        assert!(!on_disk.contains(host), "{host} in {on_disk}");
    }

    // Read back: exactly the manifest's files, 0555, the on-disk manifest 0444, root-owned,
    // timestamps 0.
    verify(&d, tmp.path()).unwrap();
    let back = read_back(&d.path, tmp.path()).unwrap();
    let mut names: Vec<&str> = back.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "alpha",
            "alpha/bin",
            "alpha/bin/alpha",
            "bash",
            "bash/bin",
            "bash/bin/bash",
            "beta",
            "beta/bin",
            "beta/bin/beta",
            "beta/bin/helper",
            "lib",
            "lib/ld-musl-x86_64.so.1",
            "manifest.json"
        ]
    );
    assert_eq!(back["beta/bin/helper"].mode, 0o555);
    assert_eq!(back["manifest.json"].mode, 0o444);
    assert_eq!(back["beta"].mode, 0o755);
    let dump = Command::new("dump.erofs")
        .arg("--path=/alpha/bin/alpha")
        .arg(&d.path)
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.contains("Uid: 0   Gid: 0"), "{dump}");
    assert!(dump.contains("Access: 0555"), "{dump}");
    assert!(dump.contains("1970-01-01 00:00:00"), "{dump}");

    // A cache hit asks nothing of the network (a registry that is not there).
    let again = ensure_with(
        &options(&root, &dead_registry(), packages.clone()),
        &mut quiet(),
    )
    .unwrap();
    assert!(!again.freshly_built);
    assert_eq!(again.digest, d.digest);
    assert_eq!(reg.requests().len(), 2);
    let (listed, broken) = list(Some(&root)).unwrap();
    assert!(broken.is_empty());
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key(), d.key());

    // Another cache, another time: the same bytes.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let other = ensure_with(
        &options(&tmp.path().join("other"), &reg.url(), packages),
        &mut quiet(),
    )
    .unwrap();
    assert_eq!(other.digest, d.digest, "the disk is reproducible");
    assert_eq!(other.key(), d.key());
    assert!(leftovers(&root)
        .iter()
        .all(|p| !p.contains("/tmp/runtimes-")));

    // One flipped byte of a shipped file is caught by verify.
    let mut bytes = std::fs::read(&d.path).unwrap();
    let at = bytes
        .windows(BETA.len())
        .position(|w| w == BETA)
        .expect("file data is stored uncompressed");
    bytes[at + 5] ^= 1;
    std::fs::write(&d.path, &bytes).unwrap();
    let err = verify(&d, tmp.path()).unwrap_err().to_string();
    assert!(err.contains("sha256"), "{err}");
}

/// A disk of an older layout (never used by this voidbox: its key differs) is listed as
/// stale by `verify`, not failed, and `runtimes rm` removes it by a key prefix.
#[test]
fn runtimes_older_layouts_are_stale_and_removable() {
    let (packages, served) = fixture();
    let reg = Registry::start(served);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("cache");
    let opts = options(&root, &reg.url(), packages);
    let d = ensure_with(&opts, &mut quiet()).unwrap();
    // Make it look like a layout 1 disk: its cache manifest says so.
    let mut m = d.manifest.clone();
    m.layout = 1;
    let dir = d.path.parent().unwrap().to_path_buf();
    std::fs::write(dir.join(MANIFEST_FILE), m.to_json()).unwrap();
    let (failed, out) = cli::verify_all(Some(&root), crate::output::Format::Json).unwrap();
    assert_eq!(failed, 0, "{out:?}");
    assert_eq!(out[0]["stale"], true, "{out:?}");
    assert!(
        cli::remove(Some(&root), "").is_err(),
        "an empty key matches nothing"
    );
    assert!(cli::remove(Some(&root), "zz").is_err());
    let key = cli::remove(Some(&root), &d.key()[..8]).unwrap();
    assert_eq!(key, d.key());
    assert!(!dir.exists());
    assert!(list(Some(&root)).unwrap().0.is_empty());
}

#[test]
fn runtimes_integrity_mismatch_is_refused() {
    let (mut packages, served) = fixture();
    // The real tarball's bytes, against a pin of other bytes.
    packages[1].integrity = integrity(b"not the tarball");
    let reg = Registry::start(served);
    let tmp = tempfile::tempdir().unwrap();
    let opts = options(tmp.path(), &reg.url(), packages.clone());
    let err = ensure_with(&opts, &mut quiet()).unwrap_err();
    assert!(matches!(err, RuntimesError::Integrity { .. }), "{err}");
    assert_eq!(err.exit_code(), 1);
    let msg = err.to_string();
    assert!(msg.contains("@test/beta@2.0.0-linux-x64"), "{msg}");
    assert!(msg.contains(&packages[1].integrity), "{msg}");
    assert!(msg.contains(&reg.url()), "{msg}");
    assert!(
        leftovers(tmp.path()).is_empty(),
        "{:?}",
        leftovers(tmp.path())
    );
    assert!(cached_disk(tmp.path(), &opts).is_none());
}

fn cached_disk(root: &Path, opts: &Options) -> Option<RuntimesDisk> {
    load(&disk_dir(&Cache::new(root), &opts.packages, &opts.debian)).unwrap()
}

#[test]
fn runtimes_unsafe_tarball_paths_are_refused() {
    for (name, why) in [
        (&b"package/../../etc/evil"[..], "`..`"),
        (&b"/etc/evil"[..], "absolute"),
    ] {
        let bad = tgz(&[E::File("package/alpha", ALPHA), E::RawName(name, b"evil")]);
        let pkg = Package {
            name: "@test/alpha".into(),
            version: "1.0.0".into(),
            integrity: integrity(&bad),
            files: vec![ship("package/alpha", "alpha/bin/alpha")],
        };
        let reg = Registry::start(vec![("/@test/alpha/-/alpha-1.0.0.tgz".into(), bad)]);
        let tmp = tempfile::tempdir().unwrap();
        let err =
            ensure_with(&options(tmp.path(), &reg.url(), vec![pkg]), &mut quiet()).unwrap_err();
        assert!(matches!(err, RuntimesError::Tarball { .. }), "{err}");
        assert!(err.to_string().contains(why), "{err}");
        assert!(leftovers(tmp.path()).is_empty());
        assert!(!tmp.path().join("etc").exists() && !Path::new("/etc/evil").exists());
    }
}

#[test]
fn runtimes_missing_or_non_file_entries_are_refused() {
    for (entries, why) in [
        (
            vec![E::File("package/other", ALPHA)],
            "package/alpha is missing",
        ),
        (
            vec![E::Symlink("package/alpha", "/etc/passwd")],
            "not a regular file",
        ),
        (
            vec![
                E::File("package/alpha", ALPHA),
                E::File("./package/alpha", ALPHA),
            ],
            "appears twice",
        ),
    ] {
        let t = tgz(&entries);
        let pkg = Package {
            name: "alpha".into(),
            version: "1.0.0".into(),
            integrity: integrity(&t),
            files: vec![ship("package/alpha", "alpha/bin/alpha")],
        };
        let reg = Registry::start(vec![("/alpha/-/alpha-1.0.0.tgz".into(), t)]);
        let tmp = tempfile::tempdir().unwrap();
        let err =
            ensure_with(&options(tmp.path(), &reg.url(), vec![pkg]), &mut quiet()).unwrap_err();
        assert!(err.to_string().contains(why), "{why}: {err}");
    }
}

#[test]
fn runtimes_unreachable_registry_names_the_url_and_the_reason() {
    let (packages, _) = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let dead = dead_registry();
    let err = ensure_with(&options(tmp.path(), &dead, packages.clone()), &mut quiet()).unwrap_err();
    assert_eq!(err.exit_code(), 3, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "cannot fetch {dead}/@test/alpha-linux-x64-musl/-/alpha-linux-x64-musl-1.0.0.tgz: "
        )),
        "{msg}"
    );
    assert!(msg.to_lowercase().contains("connect"), "{msg}");
    // As `voidbox image build` reports it: still an environment problem.
    let image_err: crate::image::ImageError = err.into();
    assert_eq!(image_err.exit_code(), 3);

    // A registry that answers without the tarball.
    let reg = Registry::start(vec![]);
    let err = ensure_with(&options(tmp.path(), &reg.url(), packages), &mut quiet()).unwrap_err();
    assert_eq!(err.exit_code(), 3);
    assert!(err.to_string().contains("HTTP 404"), "{err}");
    assert!(leftovers(tmp.path()).is_empty());
}

#[test]
fn runtimes_concurrent_builds_build_once() {
    let (packages, served) = fixture();
    let reg = Registry::start(served);
    let tmp = tempfile::tempdir().unwrap();
    let opts = options(tmp.path(), &reg.url(), packages);
    let digests: Vec<(String, bool)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let d = ensure_with(&opts, &mut quiet()).unwrap();
                    (d.digest, d.freshly_built)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(digests[0].0, digests[1].0);
    assert_eq!(
        digests.iter().filter(|d| d.1).count(),
        1,
        "one builds, the other waits and finds it"
    );
    assert_eq!(reg.requests().len(), 2, "each tarball fetched once");
}

#[test]
fn runtimes_pins_keys_and_urls() {
    for p in pins::pinned() {
        assert_eq!(npm::parse_integrity(&p.integrity).unwrap().len(), 64);
        assert_eq!(
            npm::integrity_of(&npm::parse_integrity(&p.integrity).unwrap()),
            p.integrity
        );
    }
    assert!(npm::parse_integrity("sha1-AAAA").is_err());
    assert!(npm::parse_integrity("sha512-AAAA").is_err());
    assert_eq!(
        tarball_url(DEFAULT_REGISTRY, CODEX_PACKAGE, CODEX_VERSION),
        "https://registry.npmjs.org/@openai/codex/-/codex-0.169.0-linux-x64.tgz"
    );
    assert_eq!(
        tarball_url(DEFAULT_REGISTRY, CLAUDE_PACKAGE, CLAUDE_VERSION),
        "https://registry.npmjs.org/@anthropic-ai/claude-code-linux-x64-musl/-/claude-code-linux-x64-musl-2.1.330.tgz"
    );
    assert_eq!(short_name(CLAUDE_PACKAGE), "claude-code");
    assert_eq!(short_name(CODEX_PACKAGE), "codex");
    assert_eq!(CLAUDE_BIN, format!("{GUEST_MOUNT}/{CLAUDE_PATH}"));
    assert_eq!(CODEX_BIN, format!("{GUEST_MOUNT}/{CODEX_PATH}"));
    assert_eq!(RG_BIN, format!("{GUEST_MOUNT}/{RG_PATH}"));
    assert_eq!(LOADER_BIN, format!("{GUEST_MOUNT}/{LOADER_PATH}"));
    assert_eq!(BASH_BIN, format!("{GUEST_MOUNT}/{BASH_PATH}"));
    assert_eq!(BASH_BIN_DIR, format!("{GUEST_MOUNT}/bash/bin"));

    // The key covers every input.
    let musl = vec![pins::DebianFile {
        package: MUSL_PACKAGE,
        path: "/x".into(),
        version: "1.2.3-1".into(),
        dest: LOADER_PATH,
    }];
    let base = manifest::cache_key(&pins::pinned(), &musl);
    assert!(is_hash(&base));
    let mut other_musl = musl.clone();
    other_musl[0].version = "1.2.5-1".into();
    assert_ne!(manifest::cache_key(&pins::pinned(), &other_musl), base);
    let mut moved = musl.clone();
    moved[0].path = "/elsewhere".into();
    assert_eq!(
        manifest::cache_key(&pins::pinned(), &moved),
        base,
        "no host paths"
    );
    let mut with_bash = musl.clone();
    with_bash.push(pins::DebianFile {
        package: BASH_PACKAGE,
        path: BASH_STATIC.into(),
        version: "5.2.15-2".into(),
        dest: BASH_PATH,
    });
    assert_ne!(manifest::cache_key(&pins::pinned(), &with_bash), base);
    let mut repinned = pins::pinned();
    repinned[0].integrity = CODEX_INTEGRITY.into();
    assert_ne!(manifest::cache_key(&repinned, &musl), base);
    let mut reshipped = pins::pinned();
    reshipped[1].files.pop();
    assert_ne!(manifest::cache_key(&reshipped, &musl), base);
}

/// The real thing: the pinned packages from the real npm registry (or the disk already in
/// the default cache, which `voidbox image build` puts there), and the real CLIs run from
/// the disk's files with the disk's musl loader.
#[test]
fn runtimes_real_pinned_disk_runs_both_clis() {
    let d = ensure(&mut |l: &str| eprintln!("runtimes: {l}")).unwrap();
    assert_eq!(Some(d.key().to_string()), current_key());
    assert_eq!(cached().unwrap().map(|c| c.digest), Some(d.digest.clone()));
    let m = &d.manifest;
    let claude = m.package(CLAUDE_PACKAGE).unwrap();
    assert_eq!(
        (claude.version.as_str(), claude.integrity.as_str()),
        (CLAUDE_VERSION, CLAUDE_INTEGRITY)
    );
    let codex = m.package(CODEX_PACKAGE).unwrap();
    assert_eq!(
        (codex.version.as_str(), codex.integrity.as_str()),
        (CODEX_VERSION, CODEX_INTEGRITY)
    );
    assert_eq!(
        codex.tarball,
        "https://registry.npmjs.org/@openai/codex/-/codex-0.169.0-linux-x64.tgz"
    );
    assert!(
        claude.files[0].size > 100 << 20,
        "the native binary, not a wrapper"
    );

    let tmp = tempfile::tempdir().unwrap();
    let report = verify(&d, tmp.path()).unwrap();
    assert_eq!(
        report.entries, 13,
        "3 files of 2 packages, the loader, bash, the manifest, 7 dirs"
    );

    let dir = tmp.path().join("x");
    let st = Command::new("fsck.erofs")
        .arg(format!("--extract={}", dir.display()))
        .arg(&d.path)
        .status()
        .unwrap();
    assert!(st.success());
    let run = |argv: &[&Path]| {
        let out = Command::new(argv[0])
            .args(&argv[1..])
            .arg("--version")
            .output()
            .unwrap();
        assert!(out.status.success(), "{argv:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let loader = dir.join(LOADER_PATH);
    let v = run(&[&loader, &dir.join(CLAUDE_PATH)]);
    assert!(
        v.starts_with(&format!("{CLAUDE_VERSION} (Claude Code)")),
        "{v}"
    );
    let v = run(&[&dir.join(CODEX_PATH)]);
    assert!(v.starts_with("codex-cli 0.169.0"), "{v}");
    let v = run(&[&dir.join(RG_PATH)]);
    assert!(v.starts_with("ripgrep "), "{v}");
    let v = run(&[&dir.join(BASH_PATH)]);
    assert!(v.starts_with("GNU bash, version 5"), "{v}");
}
