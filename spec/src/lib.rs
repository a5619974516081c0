//! The voidbox spec language, apart from everything that runs it.
//!
//! YAML specs (`agent`, `sandbox`, `pipeline`, `workflow`) are loaded with their source spans
//! ([`yaml`]), decoded into the typed model ([`model`]), validated against the JSON Schema
//! ([`schema`]) and the semantic rules ([`validate`]) with located [`diagnostic`]s, and
//! compiled into a petgraph DAG ([`plan`]) that `voidbox graph` renders.
//!
//! This crate links no VMM, KVM, seccomp, network stack, async runtime, HTTP client or
//! telemetry exporter (a test in the suite checks it), so a pre-commit hook, an editor's
//! language server or another tool can read specs without the engine. Validation reads
//! nothing of the host but the files a spec names: the same spec gets the same verdict on
//! every machine.
//!
//! | module | owns |
//! |---|---|
//! | [`model`] | the typed spec (serde + schemars) |
//! | [`yaml`] | the span-keeping YAML loader |
//! | [`schema`] | the JSON Schema and its located errors |
//! | [`host_path`] | how host paths in a spec resolve |
//! | [`validate`] | schema and semantic checks, located diagnostics |
//! | [`diagnostic`] | the diagnostic type and its human / JSON / GitHub renderings |
//! | [`plan`] | the compiled DAG and its renderings (text, DOT, Mermaid, JSON) |
//! | [`network_policy`] | `sandbox.network`: accepted ranges, value checks, summary |
//! | [`skill_ref`] | `remote:` skill references |
//! | [`limits`] | the one set of memory, vCPU and timeout limits every layer uses |
//! | [`names`] | which names are refused, and how a name becomes a host file name |
//! | [`suggest`] | "did you mean" suggestions |

pub mod diagnostic;
pub mod host_path;
pub mod limits;
pub mod model;
pub mod names;
pub mod network_policy;
pub mod plan;
pub mod schema;
pub mod skill_ref;
pub mod suggest;
pub mod validate;
pub mod yaml;

pub use model::*;
