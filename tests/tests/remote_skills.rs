//! `remote:` skills fetched from a real local HTTP server (`python3 -m http.server`) serving
//! tarballs made by real `git archive` from a real git repository, laid out as GitHub's
//! REST API serves them (`repos/OWNER/REPO/tarball/REF`). No internet needed.

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use voidbox::kit::remote::{fetch, RemoteRef, RemoteSource, API_URL_ENV, GITHUB_TOKEN_ENV};

const TOKEN: &str = "ghp_remote_skills_test_TOKEN_0123456789";

/// `python3 -m http.server` on a free loopback port, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let mut child = Command::new("python3")
            .args([
                "-u",
                "-m",
                "http.server",
                "0",
                "--bind",
                "127.0.0.1",
                "--directory",
            ])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 is needed for these tests");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("http.server's first line");
        // "Serving HTTP on 127.0.0.1 port 40123 (http://127.0.0.1:40123/) ..."
        let port: u16 = line
            .split(" port ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "http.server did not answer");
            std::thread::sleep(Duration::from_millis(50));
        }
        Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(dir: &Path, program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn write(path: &Path, text: &str, mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A git repository `acme/kit` archived as `srv/repos/acme/kit/tarball/{HEAD,<sha>}`.
struct Fixture {
    tmp: tempfile::TempDir,
    sha: String,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        let hello = "---\nname: hello\ndescription: Says hello.\n---\nRun scripts/run.sh.\n";
        write(&repo.join("skills/hello/SKILL.md"), hello, 0o644);
        write(
            &repo.join("skills/hello/scripts/run.sh"),
            "#!/bin/sh\necho hello\n",
            0o755,
        );
        write(
            &repo.join("skills/hello/references/notes.md"),
            "notes\n",
            0o644,
        );
        write(
            &repo.join("skills/hello/.env"),
            "API_KEY=never-staged\n",
            0o644,
        );
        write(
            &repo.join("other/SKILL.md"),
            "---\nname: other\ndescription: At the root.\n---\n",
            0o644,
        );
        write(
            &repo.join("SKILL.md"),
            "---\nname: kit\ndescription: The whole repository.\n---\n",
            0o644,
        );
        write(&repo.join("README.md"), "# kit\n", 0o644);
        run(&repo, "git", &["init", "-q", "-b", "main"]);
        run(&repo, "git", &["add", "-A"]);
        run(
            &repo,
            "git",
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.com",
                "commit",
                "-qm",
                "skills",
            ],
        );
        let sha = run(&repo, "git", &["rev-parse", "HEAD"]);
        let tarballs = tmp.path().join("srv/repos/acme/kit/tarball");
        fs::create_dir_all(&tarballs).unwrap();
        let out = tarballs.join("HEAD");
        let prefix = format!("--prefix=acme-kit-{}/", &sha[..7]);
        run(
            &repo,
            "git",
            &[
                "archive",
                "--format=tar.gz",
                &prefix,
                "-o",
                out.to_str().unwrap(),
                "HEAD",
            ],
        );
        fs::copy(&out, tarballs.join(&sha)).unwrap();
        Fixture { tmp, sha }
    }

    fn srv(&self) -> PathBuf {
        self.tmp.path().join("srv")
    }

    fn cache(&self) -> PathBuf {
        self.tmp.path().join("cache")
    }

    fn source(&self, base: &str) -> RemoteSource {
        let base = base.to_string();
        RemoteSource::from_env(
            &move |k| match k {
                API_URL_ENV => Some(base.clone()),
                GITHUB_TOKEN_ENV => Some(TOKEN.to_string()),
                _ => None,
            },
            Some(&self.cache()),
        )
        .unwrap()
    }
}

fn rref(s: &str) -> RemoteRef {
    RemoteRef::parse(s).unwrap()
}

/// Every file under `dir` (relative) with its mode.
fn tree(dir: &Path) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for e in walk(dir) {
        let m = fs::metadata(&e).unwrap().permissions().mode() & 0o777;
        out.push((e.strip_prefix(dir).unwrap().display().to_string(), m));
    }
    out.sort();
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn assert_no_token(dir: &Path) {
    for f in walk(dir) {
        let text = fs::read(&f).unwrap();
        assert!(
            !String::from_utf8_lossy(&text).contains(TOKEN),
            "{} holds the token",
            f.display()
        );
    }
}

#[test]
fn fetches_extracts_and_serves_pinned_commits_offline() {
    let fx = Fixture::new();
    let server = Server::start(&fx.srv());
    let src = fx.source(&server.url);

    let got = fetch(&src, &rref("acme/kit/hello")).unwrap();
    assert!(!got.from_cache);
    assert_eq!(
        got.commit.as_deref(),
        Some(fx.sha.as_str()),
        "pax comment read"
    );
    assert_eq!(
        got.url,
        format!("{}/repos/acme/kit/tarball/HEAD", server.url)
    );
    assert_eq!(got.dir, fx.cache().join("skills/sha256").join(&got.sha256));
    assert_eq!(
        tree(&got.dir),
        [
            ("SKILL.md".to_string(), 0o644),
            ("references/notes.md".to_string(), 0o644),
            ("scripts/run.sh".to_string(), 0o755),
        ],
        "exec bit kept, .env skipped"
    );
    let index = fx.cache().join("skills/refs/acme/kit");
    let head: serde_json::Value =
        serde_json::from_slice(&fs::read(index.join("hello@HEAD.json")).unwrap()).unwrap();
    assert_eq!(head["commit"], fx.sha.as_str());
    assert_eq!(head["sha256"], got.sha256.as_str());
    assert!(index.join(format!("hello@{}.json", fx.sha)).is_file());

    // The repository root, and a skill directory at the root (no skills/other/).
    let root = fetch(&src, &rref("acme/kit")).unwrap();
    assert!(fs::read_to_string(root.dir.join("SKILL.md"))
        .unwrap()
        .contains("name: kit"));
    assert!(root.dir.join("skills/hello/scripts/run.sh").is_file());
    let other = fetch(&src, &rref(&format!("acme/kit/other@{}", fx.sha))).unwrap();
    assert_eq!(tree(&other.dir), [("SKILL.md".to_string(), 0o644)]);
    assert!(!other.from_cache);
    assert_no_token(&fx.cache());

    drop(server);
    // Pinned: from the cache, no network.
    let pinned = fetch(&src, &rref(&format!("acme/kit/hello@{}", fx.sha))).unwrap();
    assert!(pinned.from_cache);
    assert_eq!(
        (&pinned.dir, &pinned.sha256, &pinned.commit),
        (&got.dir, &got.sha256, &got.commit)
    );
    // A branch: fetched every time, so it fails, naming the cached copy.
    let e = fetch(&src, &rref("acme/kit/hello")).unwrap_err();
    assert_eq!(e.skill, "remote:acme/kit/hello");
    let msg = e.to_string();
    assert!(
        msg.contains("offline: could not reach http://127.0.0.1:"),
        "{msg}"
    );
    assert!(msg.contains("a cached copy of commit"), "{msg}");
    assert!(
        msg.contains(&format!("pin `remote:acme/kit/hello@{}`", fx.sha)),
        "{msg}"
    );
    assert!(!msg.contains('\n') && !msg.contains(TOKEN), "{msg}");
    // Never fetched: no cached copy to name.
    let e = fetch(&src, &rref("acme/kit/hello@v9")).unwrap_err();
    assert!(!e.message.contains("cached"), "{e}");
}

#[test]
fn reports_missing_repositories_and_skills() {
    let fx = Fixture::new();
    let server = Server::start(&fx.srv());
    let src = fx.source(&server.url);
    let e = fetch(&src, &rref("acme/nope/hello")).unwrap_err();
    assert!(
        e.message
            .starts_with("acme/nope (or ref `HEAD`) not found: http://127.0.0.1:"),
        "{e}"
    );
    assert!(e.message.contains("HTTP 404"), "{e}");
    let e = fetch(&src, &rref("acme/kit@v1.0")).unwrap_err();
    assert!(e.message.contains("(or ref `v1.0`) not found"), "{e}");
    let e = fetch(&src, &rref("acme/kit/absent")).unwrap_err();
    assert_eq!(
        e.message,
        "acme/kit at `HEAD` has neither `skills/absent/SKILL.md` nor `absent/SKILL.md`"
    );
    assert!(!e.to_string().contains(TOKEN));
}

/// A gzipped tar with raw (unchecked) entry paths.
fn crafted(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
    let enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(enc);
    for (path, kind, data, link) in entries {
        let mut h = tar::Header::new_ustar();
        let name = &mut h.as_old_mut().name;
        name.fill(0);
        name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(t) = link {
            h.as_old_mut().linkname[..t.len()].copy_from_slice(t.as_bytes());
        }
        h.set_entry_type(*kind);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

#[test]
fn refuses_malicious_tarballs() {
    use tar::EntryType::{Regular, Symlink};
    let fx = Fixture::new();
    let md: &[u8] = b"---\nname: hello\ndescription: x\n---\n";
    let evil = fx.srv().join("repos/evil");
    for (repo, tarball) in [
        (
            "dotdot",
            crafted(&[
                ("evil-dotdot-1/skills/hello/SKILL.md", Regular, md, None),
                ("evil-dotdot-1/../evil", Regular, b"pwned", None),
            ]),
        ),
        (
            "link",
            crafted(&[
                ("evil-link-1/skills/hello/SKILL.md", Regular, md, None),
                (
                    "evil-link-1/skills/hello/passwd",
                    Symlink,
                    b"",
                    Some("/etc/passwd"),
                ),
            ]),
        ),
    ] {
        let dir = evil.join(repo).join("tarball");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("HEAD"), tarball).unwrap();
    }
    let server = Server::start(&fx.srv());
    let src = fx.source(&server.url);
    let e = fetch(&src, &rref("evil/dotdot/hello")).unwrap_err();
    assert!(
        e.message
            .contains("the tarball entry `evil-dotdot-1/../evil` has a `..` component"),
        "{e}"
    );
    let e = fetch(&src, &rref("evil/link/hello")).unwrap_err();
    assert!(
        e.message
            .contains("`skills/hello/passwd` is a symbolic link"),
        "{e}"
    );
    // Nothing was stored, nothing written outside the cache.
    let sha_dir = fx.cache().join("skills/sha256");
    assert!(!sha_dir.exists() || fs::read_dir(&sha_dir).unwrap().next().is_none());
    assert!(!fx.cache().join("skills/refs/evil").exists());
    assert!(!fx.tmp.path().join("evil").exists());
    assert!(!fx.cache().join("evil").exists());
}

/// Through the CLI: `voidbox skills` fetches a `remote:` skill and reports its origin;
/// with the server gone, `apply --dry-run` refuses the unpinned skill at its spec line
/// (exit 3, nothing started) and a commit-pinned one is staged from the cache.
#[test]
fn the_cli_fetches_remote_skills_and_refuses_them_offline_at_their_line() {
    let f = Fixture::new();
    let server = Server::start(&f.srv());
    let spec_dir = f.tmp.path().join("spec");
    fs::create_dir_all(&spec_dir).unwrap();
    let spec = |skill: &str| {
        format!("api_version: v1\nkind: agent\nname: r\nllm: {{provider: mock}}\nagent:\n  prompt: hi\n  skills:\n    - \"{skill}\"\n")
    };
    fs::write(spec_dir.join("head.yaml"), spec("remote:acme/kit/hello")).unwrap();
    fs::write(
        spec_dir.join("pinned.yaml"),
        spec(&format!("remote:acme/kit/hello@{}", f.sha)),
    )
    .unwrap();
    let voidbox = |base: &str, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_voidbox-under-test"))
            .args(args)
            .current_dir(&spec_dir)
            .env("XDG_CACHE_HOME", f.cache())
            .env(API_URL_ENV, base)
            .env_remove(GITHUB_TOKEN_ENV)
            .env_remove("VOIDBOX_GITHUB_TOKEN")
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for file in ["head.yaml", "pinned.yaml"] {
        let (code, stdout, stderr) = voidbox(&server.url, &["skills", file, "--output", "json"]);
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let s = &doc["nodes"][0]["skills"][0];
        assert_eq!(s["name"], "hello", "{stdout}");
        assert_eq!(
            s["files"], 3,
            "SKILL.md, scripts/run.sh, references/notes.md: {stdout}"
        );
        assert_eq!(s["remote"]["commit"], f.sha.as_str(), "{stdout}");
    }
    let base = server.url.clone();
    drop(server);

    let (code, stdout, stderr) = voidbox(&base, &["apply", "--dry-run", "head.yaml"]);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(stderr.contains("head.yaml:8:"), "{stderr}");
    assert!(stderr.contains("offline"), "{stderr}");
    assert!(
        stderr.contains(&f.sha),
        "the cached commit to pin: {stderr}"
    );

    let (code, stdout, stderr) = voidbox(&base, &["skills", "pinned.yaml", "--output", "json"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["nodes"][0]["skills"][0]["remote"]["from_cache"], true);
}
