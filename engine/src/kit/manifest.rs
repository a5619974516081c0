//! `manifest.json`: what a kit holds, by kit-relative and guest path only.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Kit;

/// Manifest format version.
pub const MANIFEST_VERSION: u64 = 1;

/// The manifest of `kit`.
pub fn manifest(kit: &Kit) -> Value {
    let files: Vec<Value> = kit
        .files
        .iter()
        .map(|f| {
            json!({
                "path": f.path,
                "guest": f.guest,
                "skill": f.skill,
                "bytes": f.data.len(),
                "sha256": hex::encode(Sha256::digest(&f.data)),
                "text": f.text,
                "executable": f.executable,
                "redactions": f.redactions,
            })
        })
        .collect();
    json!({
        "version": MANIFEST_VERSION,
        "guest_root": kit.layout.root,
        "skills": kit.summary(),
        "instructions": kit.instructions,
        "files": files,
    })
}
