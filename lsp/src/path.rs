//! Where the cursor is in a spec, as a path of mapping keys and sequence items: exactly from
//! the parsed YAML tree ([`at_offset`]) when the document parses, or from indentation
//! ([`at_line`]) while it is being typed and does not parse yet (block style, and flow
//! mappings and sequences opened on the cursor's line: `- {type: box, na`).

use voidbox_spec::diagnostic::Span;
use voidbox_spec::yaml::{Node, NodeKind};

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// A mapping key.
    Key(String),
    /// A sequence item (its index; `usize::MAX` when not known).
    Item(usize),
}

/// What the cursor is on in the parsed tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit<'a> {
    /// From the root to the key or value under the cursor (a key's own name is the last
    /// segment).
    pub path: Vec<Seg>,
    /// `true`: the cursor is on a mapping key; `false`: on a value.
    pub on_key: bool,
    /// The key's or value's span.
    pub span: Span,
    /// The value node (for a key: the value it maps to).
    pub node: &'a Node,
}

fn contains(span: Span, offset: usize) -> bool {
    offset >= span.offset && offset <= span.offset + span.len
}

/// The innermost key or value of `root` at byte `offset`.
pub fn at_offset(root: &Node, offset: usize) -> Option<Hit<'_>> {
    let mut path = Vec::new();
    let mut node = root;
    loop {
        match &node.kind {
            NodeKind::Map(entries) => {
                let mut next = None;
                for (k, v) in entries {
                    if contains(k.span, offset) {
                        path.push(Seg::Key(k.name.clone()));
                        return Some(Hit {
                            path,
                            on_key: true,
                            span: k.span,
                            node: v,
                        });
                    }
                    if contains(v.span, offset) {
                        next = Some((Seg::Key(k.name.clone()), v));
                        break;
                    }
                }
                let (seg, v) = next?;
                path.push(seg);
                node = v;
            }
            NodeKind::Seq(items) => {
                let (i, v) = items
                    .iter()
                    .enumerate()
                    .find(|(_, v)| contains(v.span, offset))?;
                path.push(Seg::Item(i));
                node = v;
            }
            _ => {
                return contains(node.span, offset).then_some(Hit {
                    path,
                    on_key: false,
                    span: node.span,
                    node,
                })
            }
        }
    }
}

/// What is being typed on a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Typing {
    /// A key of the mapping at `path` (the prefix typed so far; the keys it already has).
    Key {
        /// The mapping.
        path: Vec<Seg>,
        /// What is typed of the key.
        prefix: String,
        /// Keys the mapping already has (not offered again).
        present: Vec<String>,
    },
    /// The value of the key at `path` (its last segment).
    Value {
        /// The key.
        path: Vec<Seg>,
        /// What is typed of the value.
        prefix: String,
    },
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_blank(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

/// A sequence item's marker at `ind`: `Some(column of its content)`.
fn item_content(line: &str, ind: usize) -> Option<usize> {
    let rest = &line[ind..];
    let after = rest.strip_prefix('-')?;
    if !(after.is_empty() || after.starts_with(' ')) {
        return None;
    }
    Some(ind + 1 + (after.len() - after.trim_start_matches(' ').len()))
}

/// The key of a `key:` line (the text before its first `: ` or final `:`).
fn key_of(text: &str) -> Option<String> {
    let t = text.trim_start();
    let end = t
        .find(": ")
        .or_else(|| t.ends_with(':').then(|| t.len() - 1))?;
    let k = t[..end].trim().trim_matches(|c| c == '"' || c == '\'');
    (!k.is_empty()).then(|| k.to_string())
}

/// The path of the mapping whose keys start at column `col`, from the lines above `line_no`
/// (`seq_owner`: `col` is a sequence's column, whose owner may be a key at that same column).
fn parents(lines: &[&str], line_no: usize, mut col: usize, mut seq_owner: bool) -> Vec<Seg> {
    let mut rev = Vec::new();
    for l in (0..line_no).rev() {
        let text = lines[l];
        if is_blank(text) {
            continue;
        }
        let ind = indent(text);
        if let Some(content) = item_content(text, ind) {
            if ind < col && content <= col {
                rev.push(Seg::Item(usize::MAX));
                col = ind;
                seq_owner = true;
            }
            continue;
        }
        if ind < col || (seq_owner && ind == col) {
            let Some(k) = key_of(text) else { break };
            rev.push(Seg::Key(k));
            col = ind;
            seq_owner = false;
            if col == 0 {
                break;
            }
        }
    }
    rev.reverse();
    rev
}

/// The keys of the mapping whose keys are at column `col` around line `line_no` (the
/// mapping's other lines, above and below, up to its end).
fn siblings(lines: &[&str], line_no: usize, col: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut scan = |range: &mut dyn Iterator<Item = usize>| {
        for l in range {
            let text = lines[l];
            if is_blank(text) {
                continue;
            }
            let ind = indent(text);
            if let Some(content) = item_content(text, ind) {
                if content == col {
                    // The item's first line: its first key, then the item ends.
                    if let Some(k) = key_of(&text[content..]) {
                        out.push(k);
                    }
                    break;
                }
                if ind < col {
                    break;
                }
                continue;
            }
            if ind < col {
                break;
            }
            if ind == col {
                if let Some(k) = key_of(text) {
                    out.push(k);
                }
            }
        }
    };
    scan(&mut (0..line_no).rev());
    scan(&mut (line_no + 1..lines.len()));
    out
}

/// Removes the quotes around a scalar (and an unclosed opening one).
fn unquote(s: &str) -> &str {
    s.trim().trim_matches(|c| c == '"' || c == '\'')
}

/// One open collection while scanning a line for flow style.
#[derive(Default)]
struct Flow {
    /// The line's block-level content (`key: value`), not a flow collection.
    block: bool,
    /// A flow sequence (`[`), else a mapping (`{`, or the block level).
    seq: bool,
    /// The path step from the enclosing collection to this one.
    seg: Option<Seg>,
    /// The key of the entry being typed (its `:` seen).
    key: Option<String>,
    /// Keys of this mapping's entries so far.
    present: Vec<String>,
    /// The sequence item being typed.
    item: usize,
    /// Byte offset where the current key or value starts.
    start: usize,
    /// The current entry's value is a collection that has closed already.
    closed: bool,
}

/// What is being typed at the end of `typed` (a line's content after its indentation and
/// item marker, whose block mapping is at `base`) inside a flow collection opened on this
/// line: `None` when the line opens none (block style: the caller decides), `Some(None)`
/// when there is nothing to complete (after a closed collection, in a comment).
fn flow(typed: &str, base: &[Seg]) -> Option<Option<Typing>> {
    let mut stack = vec![Flow {
        block: true,
        ..Flow::default()
    }];
    let mut opened = false;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut chars = typed.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if q == '"' && c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        let top = stack.last_mut()?;
        let pending = typed[top.start..i].trim();
        match c {
            '"' | '\'' if pending.is_empty() => quote = Some(c),
            '#' if i == 0 || typed[..i].ends_with([' ', '\t']) => {
                return opened.then_some(None);
            }
            ':' if !top.seq
                && top.key.is_none()
                && chars
                    .peek()
                    .is_none_or(|&(_, n)| matches!(n, ' ' | '\t' | ',' | '}' | ']')) =>
            {
                let k = unquote(pending).to_string();
                if !top.block {
                    top.present.push(k.clone());
                }
                top.key = Some(k);
                top.start = i + 1;
            }
            '{' | '[' if pending.is_empty() && !top.closed => {
                let seg = if top.seq {
                    Some(Seg::Item(top.item))
                } else if let Some(k) = &top.key {
                    Some(Seg::Key(k.clone()))
                } else if top.block {
                    // The line's item itself (`- {…}`).
                    None
                } else {
                    // A collection as a key: nothing to complete.
                    return Some(None);
                };
                opened = true;
                stack.push(Flow {
                    seq: c == '[',
                    seg,
                    start: i + 1,
                    ..Flow::default()
                });
            }
            ',' if !top.block => {
                if top.seq {
                    top.item += 1;
                } else {
                    top.key = None;
                }
                top.start = i + 1;
                top.closed = false;
            }
            '}' | ']' if !top.block => {
                stack.pop();
                let parent = stack.last_mut()?;
                parent.closed = true;
                parent.start = i + 1;
            }
            _ => {}
        }
    }
    if !opened {
        return None;
    }
    let top = stack.last()?;
    if top.block || top.closed {
        return Some(None);
    }
    let mut path = base.to_vec();
    path.extend(stack.iter().filter_map(|f| f.seg.clone()));
    let prefix = unquote(&typed[top.start..]).to_string();
    if top.seq {
        path.push(Seg::Item(top.item));
        return Some(Some(Typing::Value { path, prefix }));
    }
    if let Some(k) = &top.key {
        path.push(Seg::Key(k.clone()));
        return Some(Some(Typing::Value { path, prefix }));
    }
    if prefix
        .chars()
        .any(|c| !(c.is_ascii_alphanumeric() || c == '_'))
    {
        return Some(None);
    }
    Some(Some(Typing::Key {
        path,
        prefix,
        present: top.present.clone(),
    }))
}

/// What is being typed at `character` (a byte column) of line `line_no` of `text`.
pub fn at_line(text: &str, line_no: usize, character: usize) -> Option<Typing> {
    let lines: Vec<&str> = text.split('\n').map(|l| l.trim_end_matches('\r')).collect();
    let line = *lines.get(line_no)?;
    let before = line.get(..character.min(line.len()))?;
    let ind = indent(before);
    let (col, in_item) = match item_content(before, ind) {
        Some(c) => (c, true),
        None => (ind, false),
    };
    let typed = &before[col.min(before.len())..];
    let mut path = parents(&lines, line_no, col, false);
    if in_item {
        // The item marker on this line opens a new mapping inside the sequence above.
        let mut p = parents(&lines, line_no, ind, true);
        p.push(Seg::Item(usize::MAX));
        path = p;
    }
    if let Some(t) = flow(typed, &path) {
        return t;
    }
    if let Some((k, v)) = typed.split_once(':') {
        let key = k.trim().to_string();
        if key.is_empty() || key.contains(' ') {
            return None;
        }
        path.push(Seg::Key(key));
        return Some(Typing::Value {
            path,
            prefix: v
                .trim_start()
                .trim_matches(|c| c == '"' || c == '\'')
                .to_string(),
        });
    }
    if typed
        .chars()
        .any(|c| !(c.is_ascii_alphanumeric() || c == '_'))
    {
        return None;
    }
    let present = if in_item {
        Vec::new()
    } else {
        siblings(&lines, line_no, col)
    };
    Some(Typing::Key {
        path,
        prefix: typed.to_string(),
        present,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Seg {
        Seg::Key(s.into())
    }
    const ITEM: Seg = Seg::Item(usize::MAX);

    #[test]
    fn tree_paths_name_keys_values_and_items() {
        let src = "kind: pipeline\npipeline:\n  boxes:\n    - name: a\n      run: {program: sh}\n";
        let root = voidbox_spec::yaml::parse(src).unwrap();
        let at = |needle: &str| at_offset(&root, src.find(needle).unwrap() + 1).unwrap();
        let h = at("program");
        assert!(h.on_key);
        assert_eq!(
            h.path,
            [
                key("pipeline"),
                key("boxes"),
                Seg::Item(0),
                key("run"),
                key("program")
            ]
        );
        let h = at("sh}");
        assert!(!h.on_key);
        assert_eq!(h.path.last(), Some(&key("program")));
        assert_eq!(at("pipeline\n").path, [key("kind")]);
    }

    #[test]
    fn typed_keys_and_values_from_indentation() {
        let src = "kind: pipeline\npipeline:\n  boxes:\n    - name: a\n      ru\n  stag\n";
        assert_eq!(
            at_line(src, 4, 8),
            Some(Typing::Key {
                path: vec![key("pipeline"), key("boxes"), ITEM],
                prefix: "ru".into(),
                present: vec!["name".into()],
            })
        );
        assert_eq!(
            at_line(src, 5, 6),
            Some(Typing::Key {
                path: vec![key("pipeline")],
                prefix: "stag".into(),
                present: vec!["boxes".into()],
            })
        );
        let src = "kind: workflow\nworkflow:\n  steps:\n  - name: a\n    mode: se\n";
        assert_eq!(
            at_line(src, 4, 12),
            Some(Typing::Value {
                path: vec![key("workflow"), key("steps"), ITEM, key("mode")],
                prefix: "se".into(),
            })
        );
        // A new item's first key.
        let src = "pipeline:\n  stages:\n    - ty\n";
        assert_eq!(
            at_line(src, 2, 8),
            Some(Typing::Key {
                path: vec![key("pipeline"), key("stages"), ITEM],
                prefix: "ty".into(),
                present: vec![],
            })
        );
        assert_eq!(
            at_line("na\n", 0, 2),
            Some(Typing::Key {
                path: vec![],
                prefix: "na".into(),
                present: vec![],
            })
        );
    }

    #[test]
    fn typed_keys_and_values_inside_flow_collections() {
        let at_end = |src: &str| {
            let line = src.lines().count() - 1;
            at_line(src, line, src.lines().last().unwrap().len())
        };
        let stages = vec![key("pipeline"), key("stages"), ITEM];
        // An item that is a flow mapping: its keys, without those it has.
        assert_eq!(
            at_end("pipeline:\n  stages:\n    - {type: box, na"),
            Some(Typing::Key {
                path: stages.clone(),
                prefix: "na".into(),
                present: vec!["type".into()],
            })
        );
        // A value inside it, quoted or not.
        let mut ty = stages.clone();
        ty.push(key("type"));
        for line in ["- {type: b", "- {name: x, type: \"b", "- { type:b"] {
            let want = if line.ends_with(":b") {
                None
            } else {
                Some(Typing::Value {
                    path: ty.clone(),
                    prefix: "b".into(),
                })
            };
            assert_eq!(
                at_end(&format!("pipeline:\n  stages:\n    {line}")),
                want,
                "{line}"
            );
        }
        // A key's value that is a flow mapping, nested, with a sequence and a comma in quotes.
        let src =
            "pipeline:\n  boxes:\n    - name: a\n      run: {program: sh, args: ['a, b: {'], ti";
        assert_eq!(
            at_end(src),
            Some(Typing::Key {
                path: vec![key("pipeline"), key("boxes"), ITEM, key("run")],
                prefix: "ti".into(),
                present: vec!["program".into(), "args".into()],
            })
        );
        assert_eq!(
            at_end("pipeline:\n  boxes: [{name: a}, {run: {pro"),
            Some(Typing::Key {
                path: vec![key("pipeline"), key("boxes"), Seg::Item(1), key("run")],
                prefix: "pro".into(),
                present: vec![],
            })
        );
        assert_eq!(
            at_end("pipeline:\n  stages: [{type: fan_out, boxes: [a, b"),
            Some(Typing::Value {
                path: vec![
                    key("pipeline"),
                    key("stages"),
                    Seg::Item(0),
                    key("boxes"),
                    Seg::Item(1)
                ],
                prefix: "b".into(),
            })
        );
        // Nothing after a closed collection, in a comment, or in a plain scalar's brace.
        assert_eq!(at_end("pipeline:\n  stages:\n    - {type: box} "), None);
        assert_eq!(at_end("pipeline:\n  stages:\n    - {type: box, # na"), None);
        assert_eq!(
            at_end("x:\n  run: echo {a"),
            Some(Typing::Value {
                path: vec![key("x"), key("run")],
                prefix: "echo {a".into(),
            })
        );
        assert_eq!(
            at_line("na\n", 0, 2),
            Some(Typing::Key {
                path: vec![],
                prefix: "na".into(),
                present: vec![],
            })
        );
    }
}
