//! `voidbox-spec` stays a library a pre-commit hook or an editor can link: no VMM, KVM,
//! seccomp, NAT, async runtime, HTTP stack, OCI client or telemetry exporter among its
//! normal dependencies (issue 24). Read from `cargo tree`, which resolves features for this
//! package alone, as `cargo build -p voidbox-spec` does. Without its `cli` feature (which only
//! the `voidbox` binary turns on) it links no argument parser either (issue 34).

use std::path::Path;
use std::process::Command;

/// Crates the spec layer must never link (a prefix ends with `*`).
const FORBIDDEN: &[&str] = &[
    "kvm-ioctls",
    "kvm-bindings",
    "vm-memory",
    "vm-superio",
    "virtio-queue",
    "linux-loader",
    "seccompiler",
    "smoltcp",
    "hickory-proto",
    "socket2",
    "tokio",
    "tokio-*",
    "mio",
    "hyper",
    "hyper-*",
    "reqwest",
    "rustls",
    "tonic",
    "opentelemetry",
    "opentelemetry*",
    "oci-client",
    "voidbox",
    "voidbox-vmm",
    "voidbox-oci",
];

fn forbidden(name: &str) -> bool {
    FORBIDDEN.iter().any(|f| match f.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *f,
    })
}

/// `(name, version)` of every package in `voidbox-spec`'s normal dependency tree, with
/// `extra` cargo tree arguments (features).
fn normal_dependencies(extra: &[&str]) -> Vec<(String, String)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let out = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "voidbox-spec",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--locked",
        ])
        .args(extra)
        .arg("--manifest-path")
        .arg(&manifest)
        .output()
        .expect("runs cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut deps: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect();
    deps.sort();
    deps.dedup();
    deps
}

#[test]
fn the_spec_crate_links_no_vmm_network_stack_async_runtime_or_exporter() {
    let deps = normal_dependencies(&[]);
    assert!(
        deps.iter().any(|(n, _)| n == "voidbox-spec")
            && deps.iter().any(|(n, _)| n == "jsonschema"),
        "cargo tree listed the crate and its schema validator: {deps:?}"
    );
    let bad: Vec<String> = deps
        .iter()
        .filter(|(n, _)| forbidden(n))
        .map(|(n, v)| format!("{n} {v}"))
        .collect();
    assert!(
        bad.is_empty(),
        "voidbox-spec links {bad:?}; keep runtime crates in the engine (see `cargo tree -p voidbox-spec -i <crate>`)"
    );
}

#[test]
fn the_cli_parsers_are_behind_the_cli_feature() {
    let is_clap = |n: &str| n == "clap" || n.starts_with("clap_");
    let without = normal_dependencies(&["--no-default-features"]);
    assert!(
        without.iter().any(|(n, _)| n == "jsonschema"),
        "cargo tree listed the schema validator: {without:?}"
    );
    let clap: Vec<&(String, String)> = without.iter().filter(|(n, _)| is_clap(n)).collect();
    assert!(
        clap.is_empty(),
        "voidbox-spec links {clap:?} without its `cli` feature; keep clap derives behind \
         `#[cfg_attr(feature = \"cli\", ...)]`"
    );
    // The feature is what brings clap in: the binary's parsers still have it.
    let with = normal_dependencies(&["--no-default-features", "--features", "cli"]);
    assert!(
        with.iter().any(|(n, _)| n == "clap"),
        "the `cli` feature links clap: {with:?}"
    );
}

#[test]
fn the_forbidden_list_matches_what_it_names() {
    assert!(forbidden("tokio") && forbidden("tokio-util") && forbidden("opentelemetry_sdk"));
    assert!(forbidden("voidbox-vmm") && !forbidden("voidbox-spec") && !forbidden("voidbox-net"));
}
