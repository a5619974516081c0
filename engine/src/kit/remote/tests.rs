use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};

use super::*;

const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

/// One raw tar entry (paths written as they are: no checks, unlike `tar::Builder`'s).
enum E<'a> {
    File(&'a str, &'a [u8], u32),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    Hard(&'a str, &'a str),
    Fifo(&'a str),
    Global(&'a str),
}

fn tgz(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    for e in entries {
        let mut h = tar::Header::new_ustar();
        let (path, data, kind, mode, link): (&str, Vec<u8>, _, u32, Option<&str>) = match e {
            E::File(p, d, m) => (p, d.to_vec(), tar::EntryType::Regular, *m, None),
            E::Dir(p) => (p, vec![], tar::EntryType::Directory, 0o755, None),
            E::Symlink(p, t) => (p, vec![], tar::EntryType::Symlink, 0o777, Some(t)),
            E::Hard(p, t) => (p, vec![], tar::EntryType::Link, 0o644, Some(t)),
            E::Fifo(p) => (p, vec![], tar::EntryType::Fifo, 0o644, None),
            E::Global(comment) => {
                let rec = format!("comment={comment}\n");
                let mut len = rec.len() + 2;
                while len != rec.len() + 1 + len.to_string().len() {
                    len += 1;
                }
                let body = format!("{len} {rec}");
                assert_eq!(body.len(), len, "pax record length");
                (
                    "pax_global_header",
                    body.into_bytes(),
                    tar::EntryType::XGlobalHeader,
                    0o666,
                    None,
                )
            }
        };
        let name = &mut h.as_old_mut().name;
        name.fill(0);
        name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(t) = link {
            let l = &mut h.as_old_mut().linkname;
            l.fill(0);
            l[..t.len()].copy_from_slice(t.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

fn rref(s: &str) -> RemoteRef {
    RemoteRef::parse(s).unwrap()
}

fn paths(x: &Extracted) -> Vec<(&str, bool)> {
    x.files
        .iter()
        .map(|f| (f.path.as_str(), f.executable))
        .collect()
}

const MD: &[u8] = b"---\nname: hello\ndescription: Says hello.\n---\n";

#[test]
fn parses_references() {
    let r = rref("obra/superpowers/brainstorming@v4.0.0");
    assert_eq!(
        r,
        RemoteRef {
            owner: "obra".into(),
            repo: "superpowers".into(),
            skill: Some("brainstorming".into()),
            reference: Some("v4.0.0".into()),
        }
    );
    assert_eq!(r.name(), "brainstorming");
    assert_eq!(r.to_string(), "obra/superpowers/brainstorming@v4.0.0");
    assert!(!r.is_commit());
    let root = rref("o/my.repo");
    assert_eq!(
        (root.name(), root.skill.as_deref(), root.reference_or_head()),
        ("my.repo", None, "HEAD")
    );
    assert_eq!(root.to_string(), "o/my.repo");
    let pinned = rref(&format!("o/r@{SHA}"));
    assert!(pinned.is_commit());
    assert!(!rref(&format!("o/r@{}", &SHA[..39])).is_commit());
    assert_eq!(
        rref("o/r/s@feature/x").reference.as_deref(),
        Some("feature/x")
    );
    assert_eq!(rref("o/.github").repo, ".github");
    for bad in [
        "justname",
        "o/r/s/t",
        "o//s",
        "/r",
        "../r",
        "o/..",
        "o/r/..",
        "o/r/.hidden",
        "o/r s",
        "o/r@",
        "o/r@-rf",
        "o/r@a..b",
        "o/r@a//b",
        "o/r@a/",
        "o/r@/a",
        "o/r@a b",
        "o/r@a@b",
        "o/r@a~1",
    ] {
        assert!(RemoteRef::parse(bad).is_err(), "{bad} accepted");
    }
    assert!(check_ref(&"a".repeat(MAX_REF_LEN)).is_ok());
    assert!(check_ref(&"a".repeat(MAX_REF_LEN + 1)).is_err());
}

#[test]
fn source_from_env() {
    let root = Path::new("/cache/root");
    let src = |vars: &[(&str, &str)]| {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RemoteSource::from_env(
            &move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            Some(root),
        )
    };
    let s = src(&[]).unwrap();
    assert_eq!(s.base(), DEFAULT_API_URL);
    assert!(!s.has_token());
    assert_eq!(s.cache_dir(), Path::new("/cache/root/skills"));
    for (v, want) in [
        ("https://ghe.example/api/v3/", "https://ghe.example/api/v3"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("http://localhost:1", "http://localhost:1"),
        ("http://[::1]:9/x", "http://[::1]:9/x"),
    ] {
        assert_eq!(src(&[(API_URL_ENV, v)]).unwrap().base(), want, "{v}");
    }
    for v in [
        "http://example.com",
        "http://10.0.0.1",
        "ftp://127.0.0.1",
        "not a url",
        "https://u:p@example.com",
        "https://example.com/?q=1",
    ] {
        let e = src(&[(API_URL_ENV, v)]).unwrap_err();
        assert!(e.contains(API_URL_ENV), "{v}: {e}");
        assert!(!e.contains("u:p"), "{e}");
    }
    let token = "ghp_0123456789abcdefSECRET";
    let s = src(&[(GITHUB_TOKEN_ENV, "other"), (TOKEN_ENV, token)]).unwrap();
    assert_eq!(s.token.as_deref(), Some(token));
    assert!(!format!("{s:?}").contains(token), "{s:?}");
    assert_eq!(
        s.scrub(format!("bad {token} x")),
        "bad <token> x".to_string()
    );
    let s = src(&[(GITHUB_TOKEN_ENV, " other "), (TOKEN_ENV, " ")]).unwrap();
    assert_eq!(s.token.as_deref(), Some("other"));
    assert_eq!(
        s.tarball_url(&rref("o/r/s@v1")),
        "https://api.github.com/repos/o/r/tarball/v1"
    );
    assert_eq!(
        s.index_path(&rref("o/r@feature/x")),
        Path::new("/cache/root/skills/refs/o/r/_root@feature%2Fx.json")
    );
    assert_eq!(
        s.index_path(&rref("o/r/s")),
        Path::new("/cache/root/skills/refs/o/r/s@HEAD.json")
    );
}

#[test]
fn path_safety() {
    assert_eq!(
        unsafe_path(Path::new("/etc/passwd")),
        Some("an absolute path")
    );
    assert_eq!(unsafe_path(Path::new("a/../b")), Some("a `..` component"));
    assert_eq!(unsafe_path(Path::new("..")), Some("a `..` component"));
    assert_eq!(unsafe_path(Path::new("./a/b")), None);
    assert_eq!(unsafe_path(Path::new("a/..b/c")), None);
}

#[test]
fn tree_digest_is_defined_and_deterministic() {
    let f = |p: &str, x: bool, d: &[u8]| TreeFile {
        path: p.into(),
        executable: x,
        data: d.to_vec(),
    };
    let tree = vec![
        f("scripts/run.sh", true, b"#!/bin/sh\n"),
        f("SKILL.md", false, b"abc"),
    ];
    let mut h = Sha256::new();
    h.update(b"SKILL.md\x00644\x003\x00abc");
    h.update(b"scripts/run.sh\x00755\x0010\x00#!/bin/sh\n");
    let want = hex::encode(h.finalize());
    assert_eq!(tree_digest(&tree), want);
    let mut rev = tree.clone();
    rev.reverse();
    assert_eq!(tree_digest(&rev), want);
    let mut other = tree.clone();
    other[0].executable = false;
    assert_ne!(tree_digest(&other), want);
    let mut other = tree.clone();
    other[1].data = b"abd".to_vec();
    assert_ne!(tree_digest(&other), want);
    let mut other = tree.clone();
    other[1].path = "skill.md".into();
    assert_ne!(tree_digest(&other), want);
    // Lengths keep boundaries apart: ("a", "bc") differs from ("ab", "c").
    assert_ne!(
        tree_digest(&[f("x", false, b"a"), f("y", false, b"bc")]),
        tree_digest(&[f("x", false, b"ab"), f("y", false, b"c")])
    );
}

#[test]
fn extracts_the_skill_subtree() {
    let t = tgz(&[
        E::Global(SHA),
        E::Dir("o-r-0123456/"),
        E::File("o-r-0123456/README.md", b"readme", 0o644),
        E::Symlink("o-r-0123456/docs-link", "../outside"),
        E::Dir("o-r-0123456/skills/"),
        E::Dir("o-r-0123456/skills/hello/"),
        E::File("o-r-0123456/skills/hello/SKILL.md", MD, 0o644),
        E::File(
            "o-r-0123456/skills/hello/scripts/run.sh",
            b"#!/bin/sh\necho hi\n",
            0o775,
        ),
        E::File("o-r-0123456/skills/hello/.env", b"TOKEN=x", 0o644),
        E::File("o-r-0123456/skills/hello/.git/config", b"x", 0o644),
        E::Symlink("o-r-0123456/skills/hello/.hidden-link", "/etc/passwd"),
        E::File("o-r-0123456/skills/hello2/SKILL.md", b"other", 0o644),
        E::File("o-r-0123456/hello/SKILL.md", b"root variant", 0o644),
        E::Symlink("o-r-0123456/hello/link", "/etc"),
    ]);
    let x = extract(t.as_slice(), &rref("o/r/hello")).unwrap();
    assert_eq!(x.commit.as_deref(), Some(SHA));
    assert_eq!(
        paths(&x),
        [("SKILL.md", false), ("scripts/run.sh", true)],
        "skills/hello/ wins over hello/; dot-entries skipped"
    );
    assert_eq!(x.files[0].data, MD);
    // No skills/x/: the directory at the root.
    let t = tgz(&[
        E::Dir("top/"),
        E::File("top/hello/SKILL.md", MD, 0o644),
        E::File("top/hello/a/b/c.txt", b"deep", 0o600),
        E::File("top/SKILL.md", b"root", 0o644),
    ]);
    let x = extract(t.as_slice(), &rref("o/r/hello@main")).unwrap();
    assert_eq!(x.commit, None);
    assert_eq!(paths(&x), [("SKILL.md", false), ("a/b/c.txt", false)]);
    // The repository root.
    let x = extract(t.as_slice(), &rref("o/r")).unwrap();
    assert_eq!(
        paths(&x),
        [
            ("SKILL.md", false),
            ("hello/SKILL.md", false),
            ("hello/a/b/c.txt", false)
        ]
    );
}

#[test]
fn missing_skill_names_what_was_looked_for() {
    let t = tgz(&[
        E::Dir("top/"),
        E::File("top/README.md", b"x", 0o644),
        E::Dir("top/skills/hello/"),
        E::File("top/skills/hello/notes.md", b"x", 0o644),
    ]);
    let e = extract(t.as_slice(), &rref("o/r/hello@v1")).unwrap_err();
    assert_eq!(
        e,
        "o/r at `v1` has neither `skills/hello/SKILL.md` nor `hello/SKILL.md`"
    );
    let e = extract(t.as_slice(), &rref("o/r")).unwrap_err();
    assert_eq!(e, "o/r at `HEAD` has no `SKILL.md` at the repository root");
    let e = extract(&b"not gzip"[..], &rref("o/r")).unwrap_err();
    assert!(e.contains("tarball"), "{e}");
}

#[test]
fn refuses_unsafe_tarballs() {
    let base = |extra: E<'static>| {
        tgz(&[
            E::Dir("top/"),
            E::File("top/skills/hello/SKILL.md", MD, 0o644),
            extra,
        ])
    };
    let hello = rref("o/r/hello");
    for (extra, want) in [
        (
            E::File("top/../evil", b"x", 0o644),
            "`top/../evil` has a `..` component",
        ),
        (
            E::File("/etc/evil", b"x", 0o644),
            "`/etc/evil` has an absolute path",
        ),
        (
            E::File("top/README/../../x", b"x", 0o644),
            "has a `..` component",
        ),
        (
            E::Symlink("top/skills/hello/link", "/etc/passwd"),
            "`skills/hello/link` is a symbolic link",
        ),
        (
            E::Hard("top/skills/hello/hard", "top/README.md"),
            "`skills/hello/hard` is a hard link",
        ),
        (
            E::Fifo("top/skills/hello/fifo"),
            "`skills/hello/fifo` is a FIFO",
        ),
        (
            E::File("top/skills/hello/SKILL.md", b"again", 0o644),
            "`skills/hello/SKILL.md` appears twice",
        ),
        (
            E::File("other/x", b"x", 0o644),
            "more than one top-level directory (`top` and `other`)",
        ),
    ] {
        let e = extract(base(extra).as_slice(), &hello).unwrap_err();
        assert!(e.contains(want), "{e:?} lacks {want:?}");
    }
    // Outside the skill, links are ignored.
    let ok = base(E::Symlink("top/skills/other/link", "/etc/passwd"));
    assert!(extract(ok.as_slice(), &hello).is_ok());
    // Bounds: files, bytes.
    let names: Vec<String> = (0..MAX_FILES)
        .map(|i| format!("top/skills/hello/f{i}"))
        .collect();
    let mut many: Vec<E> = vec![E::File("top/skills/hello/SKILL.md", MD, 0o644)];
    many.extend(names.iter().map(|n| E::File(n, b"x", 0o644)));
    let e = extract(tgz(&many).as_slice(), &hello).unwrap_err();
    assert!(e.contains(&format!("more than {MAX_FILES} files")), "{e}");
    let big = vec![b'x'; (MAX_BYTES / 2 + 1) as usize];
    let t = tgz(&[
        E::File("top/skills/hello/SKILL.md", MD, 0o644),
        E::File("top/skills/hello/a", &big, 0o644),
        E::File("top/skills/hello/b", &big, 0o644),
    ]);
    let e = extract(t.as_slice(), &hello).unwrap_err();
    assert!(e.contains(&format!("more than {MAX_BYTES} bytes")), "{e}");
}

#[test]
fn installs_content_addressed_trees() {
    let dir = tempfile::tempdir().unwrap();
    let sha_dir = dir.path().join("sha256");
    let files = vec![
        TreeFile {
            path: "SKILL.md".into(),
            executable: false,
            data: MD.to_vec(),
        },
        TreeFile {
            path: "scripts/run.sh".into(),
            executable: true,
            data: b"#!/bin/sh\n".to_vec(),
        },
    ];
    let (hex, target) = install(&sha_dir, &files).unwrap();
    assert_eq!(hex, tree_digest(&files));
    assert_eq!(target, sha_dir.join(&hex));
    let mode = |p: &str| fs::metadata(target.join(p)).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode("SKILL.md"), mode("scripts/run.sh")), (0o644, 0o755));
    assert_eq!(tree_digest(&read_tree(&target).unwrap()), hex);
    // Again: kept as it is.
    let before = fs::metadata(target.join("SKILL.md"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(install(&sha_dir, &files).unwrap().1, target);
    assert_eq!(
        fs::metadata(target.join("SKILL.md"))
            .unwrap()
            .modified()
            .unwrap(),
        before
    );
    // A damaged tree is replaced.
    fs::write(target.join("SKILL.md"), "tampered").unwrap();
    assert!(!tree_intact(&target, &hex));
    install(&sha_dir, &files).unwrap();
    assert!(tree_intact(&target, &hex));
    // No temporary directory is left behind.
    let left: Vec<_> = fs::read_dir(&sha_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from(&hex)]);
    // A symlink in a cached tree makes it not intact.
    std::os::unix::fs::symlink("/etc/passwd", target.join("link")).unwrap();
    assert!(read_tree(&target).unwrap_err().contains("link"));
}

#[test]
fn index_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("refs/o/r/s@HEAD.json");
    let e = IndexEntry {
        url: "https://api.github.com/repos/o/r/tarball/HEAD".into(),
        commit: Some(SHA.into()),
        sha256: "ab".repeat(32),
        fetched_at: "2024-01-01T00:00:00Z".into(),
        skill: Some("s".into()),
    };
    write_index(&path, &e).unwrap();
    let back = read_index(&path).unwrap();
    assert_eq!(
        (back.url, back.commit, back.sha256, back.skill),
        (e.url, e.commit, e.sha256, e.skill)
    );
    fs::write(&path, "{not json").unwrap();
    assert!(read_index(&path).is_none());
}

#[test]
fn status_messages() {
    let r = rref("acme/kit/hello");
    let url = "https://api.github.com/repos/acme/kit/tarball/HEAD";
    let m = status_error(404, &r, url, None, false);
    assert!(m.starts_with("acme/kit (or ref `HEAD`) not found"), "{m}");
    assert!(m.contains(GITHUB_TOKEN_ENV), "{m}");
    assert!(!status_error(404, &r, url, None, true).contains("private"));
    let m = status_error(403, &r, url, Some("0"), false);
    assert!(
        m.contains("rate limit") && m.contains(GITHUB_TOKEN_ENV),
        "{m}"
    );
    let m = status_error(403, &r, url, Some("42"), true);
    assert!(m.contains("HTTP 403") && m.contains("token"), "{m}");
    let m = status_error(401, &r, url, None, true);
    assert!(m.contains("HTTP 401") && m.contains(TOKEN_ENV), "{m}");
    assert!(status_error(429, &r, url, None, true).contains("rate limit"));
    assert_eq!(
        status_error(502, &r, url, None, true),
        format!("{url} answered HTTP 502")
    );
}

#[test]
fn timestamps() {
    let at = |s: u64| rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
    assert_eq!(at(0), "1970-01-01T00:00:00Z");
    assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
    assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(at(4_102_444_799), "2099-12-31T23:59:59Z");
}

#[test]
fn unpacked_size_is_bounded() {
    let mut r = Limited {
        inner: &[0u8; 10][..],
        left: 4,
    };
    let mut buf = Vec::new();
    let e = r.read_to_end(&mut buf).unwrap_err();
    assert!(e.to_string().contains("unpacks to more than"), "{e}");
}
