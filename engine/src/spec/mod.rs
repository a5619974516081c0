//! The spec language: the typed model, its JSON Schema and the span-preserving YAML loader.

pub mod model;
pub mod schema;
pub mod yaml;

pub use model::*;
