//! End-to-end tests of `voidbox runtimes build|ls|verify` through the built binary: an
//! unreachable registry is exit 3 naming the URL, an empty cache is reported, and the real
//! pinned runtimes disk (fetched from the real npm registry, or already in the default
//! cache where `voidbox image build` puts it) is listed with its versions and verifies.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

use voidbox::runtimes::{CLAUDE_PACKAGE, CLAUDE_VERSION, CODEX_PACKAGE, CODEX_VERSION};
use voidbox_tests::Run;

const BIN: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

fn voidbox(args: &[&str], registry: Option<&str>) -> Run {
    let mut c = Command::new(BIN);
    c.args(args).env("NO_COLOR", "1");
    if let Some(r) = registry {
        c.env("VOIDBOX_NPM_REGISTRY", r);
    }
    c.output()
        .unwrap_or_else(|e| panic!("cannot run {BIN}: {e}"))
        .into()
}

fn path_arg(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

#[test]
fn runtimes_build_with_an_unreachable_registry_is_exit_3_naming_the_url() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead = format!("http://{}", l.local_addr().expect("addr"));
    drop(l);
    let tmp = tempfile::tempdir().expect("tempdir");
    let r = voidbox(
        &["runtimes", "build", "--cache-dir", path_arg(tmp.path())],
        Some(&dead),
    );
    assert_eq!(r.code, Some(3), "{r:?}");
    let url = format!(
        "{dead}/@anthropic-ai/claude-code-linux-x64-musl/-/claude-code-linux-x64-musl-2.1.330.tgz"
    );
    assert!(r.stderr.contains(&format!("cannot fetch {url}: ")), "{r:?}");
    assert!(r.stderr.contains("Connection refused"), "{r:?}");
    assert!(!tmp.path().join("runtimes").exists());
}

#[test]
fn runtimes_ls_and_verify_on_an_empty_cache() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = path_arg(tmp.path());
    let r = voidbox(&["runtimes", "ls", "--cache-dir", dir], None);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stderr.contains("no cached runtimes disk"), "{r:?}");
    let r = voidbox(
        &["runtimes", "ls", "--format", "json", "--cache-dir", dir],
        None,
    );
    assert_eq!(r.stdout.trim(), "[]", "{r:?}");
    let r = voidbox(&["runtimes", "verify", "--cache-dir", dir], None);
    assert_eq!(r.code, Some(3), "{r:?}");
    assert!(r.stderr.contains("voidbox runtimes build"), "{r:?}");
}

#[test]
fn runtimes_real_disk_is_built_listed_and_verified() {
    let r = voidbox(&["runtimes", "build", "--format", "json"], None);
    assert_eq!(r.code, Some(0), "{r:?}");
    let built: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON");
    assert_eq!(built["current"], true, "{built}");
    let key = built["key"].as_str().expect("key").to_string();
    assert!(
        Path::new(built["path"].as_str().expect("path")).is_file(),
        "{built}"
    );

    let r = voidbox(&["runtimes", "ls", "--format", "json"], None);
    assert_eq!(r.code, Some(0), "{r:?}");
    let listed: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON");
    let disk = listed
        .as_array()
        .expect("array")
        .iter()
        .find(|d| d["key"] == key.as_str())
        .unwrap_or_else(|| panic!("{key} not listed: {listed}"));
    let version = |name: &str| {
        disk["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| p["version"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(version(CLAUDE_PACKAGE).as_deref(), Some(CLAUDE_VERSION));
    assert_eq!(version(CODEX_PACKAGE).as_deref(), Some(CODEX_VERSION));

    let r = voidbox(&["runtimes", "ls"], None);
    assert!(r.stdout.contains(&key[..12]), "{r:?}");
    assert!(r.stdout.contains(CLAUDE_VERSION), "{r:?}");

    let r = voidbox(&["runtimes", "verify", "--format", "json"], None);
    let verified: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON");
    let entry = verified
        .as_array()
        .expect("array")
        .iter()
        .find(|d| d["runtimes"] == key.as_str())
        .unwrap_or_else(|| panic!("{key} not verified: {verified}"));
    assert_eq!(entry["ok"], true, "{entry}");
    assert_eq!(entry["sha256"], built["sha256"], "{entry}");
}
