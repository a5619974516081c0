//! Go to definition: from a box or step name where it is used (`stages`, `depends_on`,
//! `stdin_from`, `output_step`) to the box or step that has it.

use voidbox_spec::diagnostic::Span;
use voidbox_spec::yaml::{Node, NodeKind};

use crate::path::{self, Seg};

/// The list a name at `path` refers to (`pipeline.boxes` or `workflow.steps`).
fn target_list(path: &[Seg]) -> Option<(&'static str, &'static str)> {
    let k = |i: usize| match path.get(i) {
        Some(Seg::Key(k)) => Some(k.as_str()),
        _ => None,
    };
    let item = |i: usize| matches!(path.get(i), Some(Seg::Item(_)));
    match (k(0)?, path.len()) {
        ("pipeline", 4) if k(1) == Some("stages") && item(2) && k(3) == Some("name") => {
            Some(("pipeline", "boxes"))
        }
        ("pipeline", 5)
            if k(1) == Some("stages") && item(2) && k(3) == Some("boxes") && item(4) =>
        {
            Some(("pipeline", "boxes"))
        }
        ("workflow", 2) if k(1) == Some("output_step") => Some(("workflow", "steps")),
        ("workflow", 4) if k(1) == Some("steps") && item(2) && k(3) == Some("stdin_from") => {
            Some(("workflow", "steps"))
        }
        ("workflow", 5)
            if k(1) == Some("steps") && item(2) && k(3) == Some("depends_on") && item(4) =>
        {
            Some(("workflow", "steps"))
        }
        _ => None,
    }
}

/// The `name` value node of the item of `list` named `name`.
fn named<'a>(list: Option<&'a Node>, name: &str) -> Option<&'a Node> {
    let NodeKind::Seq(items) = &list?.kind else {
        return None;
    };
    items
        .iter()
        .filter_map(|i| i.get("name"))
        .find(|n| n.as_str() == Some(name))
}

/// The span of the box or step the name at byte `offset` refers to.
pub fn at(root: &Node, offset: usize) -> Option<Span> {
    let hit = path::at_offset(root, offset)?;
    if hit.on_key {
        return None;
    }
    let (section, list) = target_list(&hit.path)?;
    let name = hit.node.as_str()?;
    named(root.get(section)?.get(list), name).map(|n| n.span)
}
