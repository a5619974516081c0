//! Document symbols: the spec's sections, with its boxes, steps and stages.

use lsp_types::{DocumentSymbol, SymbolKind};
use voidbox_spec::diagnostic::Span;
use voidbox_spec::yaml::{Node, NodeKind};

use crate::document::Document;

#[allow(deprecated)] // `DocumentSymbol::deprecated` must be given; it is `None`.
fn symbol(
    doc: &Document,
    name: String,
    detail: Option<String>,
    kind: SymbolKind,
    whole: Span,
    select: Span,
    children: Vec<DocumentSymbol>,
) -> DocumentSymbol {
    DocumentSymbol {
        name,
        detail,
        kind,
        tags: None,
        deprecated: None,
        range: doc.range(whole),
        selection_range: doc.range(select),
        children: (!children.is_empty()).then_some(children),
    }
}

fn items(node: Option<&Node>) -> &[Node] {
    match node.map(|n| &n.kind) {
        Some(NodeKind::Seq(items)) => items,
        _ => &[],
    }
}

/// Named items of a list (boxes, steps) as symbols.
fn named_items(doc: &Document, list: Option<&Node>, kind: SymbolKind) -> Vec<DocumentSymbol> {
    items(list)
        .iter()
        .filter_map(|item| {
            let name = item.get("name")?;
            let detail = item
                .get("run")
                .and_then(|r| r.get("program"))
                .and_then(Node::as_str)
                .map(|p| format!("run {p}"))
                .or_else(|| item.get("prompt").map(|_| "agent".to_string()));
            Some(symbol(
                doc,
                name.as_str()?.to_string(),
                detail,
                kind,
                item.span,
                name.span,
                Vec::new(),
            ))
        })
        .collect()
}

/// The stages of a pipeline: `1: box a`, `2: fan_out [b, c]`.
fn stages(doc: &Document, list: Option<&Node>) -> Vec<DocumentSymbol> {
    items(list)
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let what = match s.get("type").and_then(Node::as_str) {
                Some("fan_out") => {
                    let names: Vec<&str> = items(s.get("boxes"))
                        .iter()
                        .filter_map(Node::as_str)
                        .collect();
                    format!("fan_out [{}]", names.join(", "))
                }
                _ => format!(
                    "box {}",
                    s.get("name").and_then(Node::as_str).unwrap_or("?")
                ),
            };
            symbol(
                doc,
                format!("{}: {what}", i + 1),
                None,
                SymbolKind::EVENT,
                s.span,
                s.span,
                Vec::new(),
            )
        })
        .collect()
}

/// The symbols of a parsed spec.
pub fn of(doc: &Document, root: &Node) -> Vec<DocumentSymbol> {
    let NodeKind::Map(entries) = &root.kind else {
        return Vec::new();
    };
    entries
        .iter()
        .map(|(k, v)| {
            let children = match k.name.as_str() {
                "pipeline" => {
                    let mut c = named_items(doc, v.get("boxes"), SymbolKind::FUNCTION);
                    c.extend(stages(doc, v.get("stages")));
                    c
                }
                "workflow" => named_items(doc, v.get("steps"), SymbolKind::FUNCTION),
                _ => Vec::new(),
            };
            symbol(
                doc,
                k.name.clone(),
                v.as_str().map(str::to_string),
                SymbolKind::MODULE,
                k.span.to(v.span),
                k.span,
                children,
            )
        })
        .collect()
}
