//! The spec language: the typed model, its JSON Schema, the span-preserving YAML loader and
//! how host paths in a spec resolve.

pub mod host_path;
pub mod model;
pub mod schema;
pub mod yaml;

pub use model::*;
