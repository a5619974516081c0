//! voidbox: a declarative pipeline engine.
//!
//! YAML specs (`agent`, `sandbox`, `pipeline`, `workflow`) are loaded with their source spans
//! ([`spec`]), validated against the JSON Schema and semantic rules ([`validate`]), compiled
//! into a petgraph DAG ([`plan`]) and rendered or executed.

pub mod cli;
pub mod diagnostic;
pub mod image;
pub mod plan;
pub mod run;
pub mod sandbox;
pub mod snapshot;
pub mod spec;
pub mod suggest;
pub mod validate;
