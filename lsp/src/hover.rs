//! Hover: what the field under the cursor means, from the schema's descriptions, with the
//! values an enumeration accepts.

use lsp_types::{Hover, HoverContents, MarkupContent, MarkupKind};

use crate::document::Document;
use crate::path::{self, Seg};
use crate::schema_nav;

/// `a.b[].c` for a path.
pub fn dotted(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Item(_) => s.push_str("[]"),
        }
    }
    s
}

/// The hover at byte `offset`: for the key under the cursor, or the key whose value it is
/// (none in a YAML file that is not a spec, such as a Kubernetes manifest's `kind`).
pub fn at(doc: &Document, offset: usize) -> Option<Hover> {
    if !voidbox_spec::yaml::looks_like_spec(&doc.text) {
        return None;
    }
    let hit = path::at_offset(doc.root()?, offset)?;
    let mut p = hit.path.clone();
    // A value inside a list (`boxes: [a, b]`): the list's field.
    while matches!(p.last(), Some(Seg::Item(_))) && !hit.on_key {
        p.pop();
    }
    if p.is_empty() {
        return None;
    }
    let desc = schema_nav::description(&p)?;
    let mut text = format!("**`{}`**\n\n{desc}", dotted(&p));
    let values = schema_nav::values(&p);
    if !values.is_empty() {
        let list: Vec<String> = values.iter().map(|(v, _)| format!("`{v}`")).collect();
        text.push_str(&format!("\n\nOne of: {}.", list.join(", ")));
    }
    Some(Hover {
        contents: HoverContents::Markup(MarkupContent {
            kind: MarkupKind::Markdown,
            value: text,
        }),
        range: Some(doc.range(hit.span)),
    })
}
