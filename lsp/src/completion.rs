//! Completion of field names (the ones the mapping under the cursor takes and does not have
//! yet) and of enumeration values, while the document is being typed.

use lsp_types::{CompletionItem, CompletionItemKind, Documentation};

use crate::document::Document;
use crate::path::{self, Typing};
use crate::schema_nav;

/// The completions at line `line`, byte column `column`.
pub fn at(doc: &Document, line: usize, column: usize) -> Vec<CompletionItem> {
    let Some(typing) = path::at_line(&doc.text, line, column) else {
        return Vec::new();
    };
    match typing {
        Typing::Key {
            path,
            prefix,
            present,
        } => schema_nav::fields(&path)
            .into_iter()
            .filter(|(name, _)| name.starts_with(&prefix) && !present.contains(name))
            .map(|(name, desc)| CompletionItem {
                insert_text: Some(format!("{name}: ")),
                label: name,
                kind: Some(CompletionItemKind::FIELD),
                documentation: desc.map(Documentation::String),
                ..CompletionItem::default()
            })
            .collect(),
        Typing::Value { path, prefix } => schema_nav::values(&path)
            .into_iter()
            .filter(|(v, _)| v.starts_with(&prefix))
            .map(|(v, desc)| CompletionItem {
                label: v,
                kind: Some(CompletionItemKind::ENUM_MEMBER),
                documentation: desc.map(Documentation::String),
                ..CompletionItem::default()
            })
            .collect(),
    }
}
