//! voidbox: a declarative pipeline engine.
//!
//! YAML specs (`agent`, `sandbox`, `pipeline`, `workflow`) are loaded with their source spans
//! ([`spec`]), validated against the JSON Schema and semantic rules ([`validate`]), compiled
//! into a petgraph DAG ([`plan`]) and rendered or executed.
//!
//! Where each command and concept lives (one module per command or concept):
//!
//! | module | owns |
//! |---|---|
//! | [`cli`] | argument parsing and dispatch for every `voidbox` command |
//! | [`spec`] | the spec model, the span-keeping YAML loader, the JSON Schema |
//! | [`validate`] | `voidbox validate`: schema and semantic checks, located diagnostics |
//! | [`diagnostic`] | the diagnostic type and its human / JSON / GitHub renderings |
//! | [`doctor`] | `voidbox doctor`: what this host lacks (KVM, image, disk, memory, tools) and the fixes |
//! | [`plan`] | the compiled DAG and `voidbox graph` rendering |
//! | [`agent_output`] | one report shape for Claude Code's and Codex's JSON output |
//! | [`apply`] | `voidbox apply`: scheduler, data passing, fan-out merge, failures, reports |
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
//! | [`gateway`] | the per-VM credential gateway: the guest's token swapped for the real key |
//! | [`suggest`] | "did you mean" suggestions |
//! | [`limits`] | the one set of memory, vCPU and timeout limits every layer uses |
//! | [`names`] | which names are refused, and how a name becomes a host file name |

pub mod agent_output;
pub mod apply;
pub mod cli;
pub mod diagnostic;
pub mod doctor;
pub mod error_chain;
pub mod gateway;
pub mod image;
pub mod kit;
pub mod limits;
pub mod mount_flag;
pub mod names;
pub mod network;
pub mod observe;
pub mod oci;
pub mod plan;
pub mod providers;
pub mod run;
pub mod runtimes;
pub mod sandbox;
pub mod shell;
pub mod snapshot;
pub mod spec;
pub mod suggest;
pub mod validate;
