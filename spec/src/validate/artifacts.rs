//! Rules for box artifacts (void-box `outputs` / `inputs`): guest paths are absolute without
//! `..`, output names are unique, and every `inputs[].from` names the output of a box that
//! runs in an earlier stage (so the directory exists when the consumer starts).

use std::collections::HashMap;

use crate::diagnostic::{Diagnostic, Span};
use crate::yaml::{Node, NodeKind};

fn seq(node: Option<&Node>) -> &[Node] {
    match node.map(|n| &n.kind) {
        Some(NodeKind::Seq(items)) => items,
        _ => &[],
    }
}

/// Checks the `outputs` and `inputs` of every box of `pipeline`.
pub fn check(pipeline: &Node, out: &mut Vec<Diagnostic>) {
    let boxes = seq(pipeline.get("boxes"));
    // The stage each box runs in (none: the box never runs).
    let mut stage_of: HashMap<&str, usize> = HashMap::new();
    if pipeline.get("stages").is_some() {
        for (i, st) in seq(pipeline.get("stages")).iter().enumerate() {
            if let Some(n) = st.get("name").and_then(Node::as_str) {
                stage_of.entry(n).or_insert(i);
            }
            for m in seq(st.get("boxes")) {
                if let Some(n) = m.as_str() {
                    stage_of.entry(n).or_insert(i);
                }
            }
        }
    } else {
        for (i, b) in boxes.iter().enumerate() {
            if let Some(n) = b.get("name").and_then(Node::as_str) {
                stage_of.entry(n).or_insert(i);
            }
        }
    }
    // output name -> (producing box, span of the name)
    let mut outputs: HashMap<&str, (&str, Span)> = HashMap::new();
    for b in boxes {
        let name = b.get("name").and_then(Node::as_str).unwrap_or("?");
        for o in seq(b.get("outputs")) {
            check_path(o.get("guest"), "output", out);
            let Some(n) = o.get("name") else { continue };
            let Some(text) = n.as_str() else { continue };
            if let Some((_, first)) = outputs.get(text) {
                out.push(
                    Diagnostic::error(
                        "voidbox::duplicate_output",
                        format!("output `{text}` is declared twice"),
                        n.span,
                    )
                    .with_related(*first, "first declared here")
                    .with_help("output names are unique across the pipeline's boxes"),
                );
            } else {
                outputs.insert(text, (name, n.span));
            }
        }
    }
    for b in boxes {
        let name = b.get("name").and_then(Node::as_str).unwrap_or("?");
        for i in seq(b.get("inputs")) {
            check_path(i.get("guest"), "input", out);
            let Some(from) = i.get("from") else { continue };
            let Some(f) = from.as_str() else { continue };
            // Undeclared names are reported by the semantic rules (`voidbox::unknown_output`).
            let Some((producer, declared)) = outputs.get(f) else {
                continue;
            };
            let why = match (stage_of.get(producer), stage_of.get(name)) {
                _ if *producer == name => Some(format!("box `{name}` reads its own output `{f}`")),
                (None, _) => Some(format!(
                    "output `{f}` comes from box `{producer}`, which no stage runs"
                )),
                (Some(p), Some(c)) if p >= c => Some(format!(
                    "box `{name}` reads output `{f}` of box `{producer}`, which does not run before it"
                )),
                _ => None,
            };
            if let Some(why) = why {
                out.push(
                    Diagnostic::error("voidbox::input_not_ready", why, from.span)
                        .with_related(*declared, "output declared here")
                        .with_help("an input must come from a box in an earlier stage"),
                );
            }
        }
    }
}

fn check_path(guest: Option<&Node>, what: &str, out: &mut Vec<Diagnostic>) {
    let Some(g) = guest else { return };
    let Some(p) = g.as_str().filter(|p| !p.is_empty()) else {
        return;
    };
    if !p.starts_with('/') || p.split('/').any(|c| c == "..") || p.trim_end_matches('/').is_empty()
    {
        out.push(
            Diagnostic::error(
                "voidbox::invalid_artifact",
                format!("{what} directory `{p}` must be an absolute guest path without `..`"),
                g.span,
            )
            .with_help(format!("for example `/workspace/{what}`")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml;

    fn codes(text: &str) -> Vec<(&'static str, usize)> {
        let root = yaml::parse(text).expect("yaml");
        let mut out = Vec::new();
        check(root.get("pipeline").expect("pipeline"), &mut out);
        out.iter()
            .map(|d| (d.code, crate::diagnostic::line_col(text, d.span.offset).0))
            .collect()
    }

    #[test]
    fn inputs_come_from_earlier_stages() {
        let ok = "pipeline:\n  boxes:\n    - {name: a, run: {program: x}, outputs: [{name: o}]}\n    - {name: b, run: {program: x}, inputs: [{from: o}]}\n";
        assert!(codes(ok).is_empty());
        let later = "pipeline:\n  boxes:\n    - {name: b, run: {program: x}, inputs: [{from: o}]}\n    - {name: a, run: {program: x}, outputs: [{name: o}]}\n";
        assert_eq!(codes(later), [("voidbox::input_not_ready", 3)]);
        let sibling = "pipeline:\n  boxes:\n    - {name: a, run: {program: x}, outputs: [{name: o}]}\n    - {name: b, run: {program: x}, inputs: [{from: o}]}\n  stages:\n    - {type: fan_out, boxes: [a, b]}\n";
        assert_eq!(codes(sibling), [("voidbox::input_not_ready", 4)]);
        let own = "pipeline:\n  boxes:\n    - {name: a, run: {program: x}, outputs: [{name: o}], inputs: [{from: o}]}\n";
        assert_eq!(codes(own), [("voidbox::input_not_ready", 3)]);
        let unused = "pipeline:\n  boxes:\n    - {name: a, run: {program: x}, outputs: [{name: o}]}\n    - {name: b, run: {program: x}, inputs: [{from: o}]}\n  stages:\n    - {type: box, name: b}\n";
        assert_eq!(codes(unused), [("voidbox::input_not_ready", 4)]);
    }

    #[test]
    fn names_are_unique_and_paths_absolute() {
        let t = "pipeline:\n  boxes:\n    - name: a\n      run: {program: x}\n      outputs: [{name: o, guest: rel}, {name: o, guest: /workspace/../x}]\n      inputs: [{from: o, guest: /}]\n";
        assert_eq!(
            codes(t),
            [
                ("voidbox::invalid_artifact", 5),
                ("voidbox::invalid_artifact", 5),
                ("voidbox::duplicate_output", 5),
                ("voidbox::invalid_artifact", 6),
                ("voidbox::input_not_ready", 6),
            ]
        );
    }
}
