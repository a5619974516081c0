//! voidbox: a declarative pipeline engine.
//!
//! YAML specs (`agent`, `sandbox`, `pipeline`, `workflow`) are loaded, validated and compiled
//! into a DAG by the `voidbox-spec` crate (re-exported here as [`spec`], [`validate`],
//! [`plan`], [`diagnostic`], [`limits`], [`names`] and [`suggest`]); this crate runs them.
//!
//! Where each command and concept lives (one module per command or concept):
//!
//! | module | owns |
//! |---|---|
//! | [`cli`] | argument parsing and dispatch for every `voidbox` command |
//! | [`doctor`] | `voidbox doctor`: what this host lacks (KVM, image, disk, memory, tools) and the fixes |
//! | [`agent_output`] | one report shape for Claude Code's and Codex's JSON output |
//! | [`apply`] | `voidbox apply`: scheduler, data passing, fan-out merge, failures, reports |
//! | [`scheduler`] | the DAG run: parallelism, retries, cancellation, data passing, progress |
//! | [`node`] | a node made ready to run for `apply`, `run` and `shell`: refusals, guest policy, images, agent launch |
//! | [`run`] | `voidbox run`: one command in a fresh micro-VM |
//! | [`shell`] | `voidbox shell`: an interactive terminal in a fresh micro-VM |
//! | [`sandbox`] | one micro-VM as the engine drives it: the VMM child process and the guest-agent session |
//! | [`snapshot`] | golden snapshots: the cache, their creation and `voidbox snapshot` |
//! | [`image`] | the guest image (kernel + initramfs): builder, cache and `voidbox image` |
//! | [`runtimes`] | the read-only runtimes disk: the real agent CLIs (Claude Code, Codex) from npm |
//! | [`kit`] | skills kits: skills staged on the host with secrets redacted, and `voidbox skills` |
//! | [`oci`] | OCI images: pulls for `sandbox.image`, `voidbox pull` and `voidbox oci` |
//! | [`network`] | guest networking: policy checks, DNS upstreams, `voidbox run` flags, NAT config |
//! | [`providers`] | what an `llm` block resolves to: runtime, upstream endpoint, host credential |
//! | [`output`] | how commands print: progress mode, listing format |
//! | [`units`] | sizes and ages as people write and read them (`16MiB`, `1.5M`, `3h`) |
//! | [`capped`] | bounded output collection: a capped buffer and a stream's tail |
//! | [`gateway`] | the per-VM credential gateway: the guest's token swapped for the real key |

pub use voidbox_spec as spec;
pub use voidbox_spec::{diagnostic, limits, names, plan, suggest, validate};

pub mod agent_output;
pub mod apply;
pub mod capped;
pub mod cli;
pub mod doctor;
pub mod error_chain;
pub mod export;
pub mod gateway;
pub mod image;
pub mod kit;
pub mod mount_flag;
pub mod network;
pub mod node;
pub mod observe;
pub mod oci;
pub mod output;
pub mod providers;
pub mod run;
pub mod runtimes;
pub mod sandbox;
pub mod scheduler;
pub mod shell;
pub mod snapshot;
pub mod units;

// The spec's limits are the VMM's: `voidbox-spec` defines them without linking the VMM, and
// this crate, which links both, refuses to build when they drift apart.
const _: () = assert!(
    limits::MIN_MEMORY_MB == voidbox_vmm::config::MIN_MEMORY_MB as u64
        && limits::MAX_MEMORY_MB == voidbox_vmm::config::MAX_MEMORY_MB as u64
        && limits::MAX_VCPUS == voidbox_vmm::config::MAX_VCPUS as u32
);

#[cfg(test)]
mod tests {
    /// `validate` refuses exactly the image references a pull refuses, for the same reason:
    /// `voidbox-spec` checks them without linking the OCI client.
    #[test]
    fn validate_and_the_oci_client_agree_on_image_references() {
        let hex = "a".repeat(64);
        let refs = [
            "alpine".to_string(),
            "alpine:3.20".into(),
            "  ghcr.io/org/tool:v1  ".into(),
            "localhost:5000/x/y:latest".into(),
            format!("alpine@sha256:{hex}"),
            format!("alpine:3.20@sha256:{hex}"),
            format!("alpine@sha512:{hex}"),
            "alpine@sha256:abc".into(),
            format!("alpine@sha256:{}", "A".repeat(64)),
            "Alpine".into(),
            "alpine:".into(),
            "alpine::1".into(),
            "-x".into(),
            "a/b/../c".into(),
            "registry.example.com:notaport/x".into(),
            "x".repeat(300),
        ];
        for r in &refs {
            let spec = crate::validate::image_refs::reference_problem(r);
            let oci = match voidbox_oci::ImageRef::parse(r) {
                Ok(_) => None,
                Err(voidbox_oci::OciError::InvalidReference { reason, .. }) => Some(reason),
                Err(e) => panic!("{r}: {e}"),
            };
            assert_eq!(spec, oci, "{r}");
        }
    }
}
