//! `voidbox-spec` stays a library a pre-commit hook or an editor can link: no VMM, KVM,
//! seccomp, NAT, async runtime, HTTP stack, OCI client or telemetry exporter among its
//! normal dependencies (issue 24). Read from `cargo tree`, which resolves features for this
//! package alone, as `cargo build -p voidbox-spec` does.

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

/// `(name, version)` of every package in `voidbox-spec`'s normal dependency tree.
fn normal_dependencies() -> Vec<(String, String)> {
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
    let deps = normal_dependencies();
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
fn the_forbidden_list_matches_what_it_names() {
    assert!(forbidden("tokio") && forbidden("tokio-util") && forbidden("opentelemetry_sdk"));
    assert!(forbidden("voidbox-vmm") && !forbidden("voidbox-spec") && !forbidden("voidbox-net"));
}
