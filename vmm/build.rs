//! Computes the build id that `voidbox` and `voidbox-vmm` both carry (see `src/build_id.rs`):
//! the crate version, the profile and target, and a hash of every source the VMM is built
//! from (this crate, the workspace crates it links, and `Cargo.lock`). Two binaries with one
//! id run the same VMM code, so they agree on the config, status, control and snapshot
//! formats; any change to those sources gives a new id.

use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// What the VMM is built from, relative to the workspace root.
const INPUTS: &[&str] = &[
    "vmm/src",
    "vmm/Cargo.toml",
    "vmm/build.rs",
    "net/src",
    "net/Cargo.toml",
    "protocol/src",
    "protocol/Cargo.toml",
    "Cargo.lock",
];

fn files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = fs::read_dir(path)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.sort();
        for e in entries {
            files(&e, out);
        }
    } else if path.is_file() {
        out.push(path.to_path_buf());
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest.parent().unwrap_or(&manifest).to_path_buf();
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let version = env("CARGO_PKG_VERSION");
    let mut h = Sha256::new();
    for k in [
        "CARGO_PKG_VERSION",
        "PROFILE",
        "TARGET",
        "OPT_LEVEL",
        "DEBUG",
    ] {
        h.update(format!("{k}={}\n", env(k)));
    }
    let mut features: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("CARGO_FEATURE_"))
        .collect();
    features.sort();
    h.update(features.join(",").as_bytes());
    for input in INPUTS {
        let p = root.join(input);
        println!("cargo:rerun-if-changed={}", p.display());
        let mut list = Vec::new();
        files(&p, &mut list);
        for f in list {
            let rel = f.strip_prefix(&root).unwrap_or(&f);
            let data = fs::read(&f).unwrap_or_default();
            h.update(format!("\n{} {}\n", rel.display(), data.len()));
            h.update(&data);
        }
    }
    let digest = h.finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=VOIDBOX_BUILD_ID={version}-{hex}");
}
