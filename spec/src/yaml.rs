//! A span-preserving YAML loader.
//!
//! The YAML text is parsed with `saphyr-parser` into a small tree of [`Node`]s that keep the
//! byte range they came from, so every later error (JSON Schema or semantic) can point at the
//! exact line and column. Scalars are resolved with the YAML 1.2 core schema, like
//! `serde_yaml`. Hostile input is bounded: nesting depth, node count and alias expansion are
//! capped, so an alias bomb or a deeply nested document is an error, not an OOM.

use std::borrow::Cow;

use saphyr_parser::{Event, Parser, ScalarStyle, Span as YamlSpan, Tag};
use serde_json::{Map, Number, Value};

use crate::diagnostic::Span;

/// Maximum nesting depth of sequences and mappings.
pub const MAX_DEPTH: usize = 128;
/// Maximum number of nodes in one document (after alias expansion).
pub const MAX_NODES: usize = 1_000_000;
/// Maximum number of nodes copied by alias expansion.
pub const MAX_ALIAS_NODES: usize = 100_000;

/// A YAML node with the byte range it was parsed from.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// What the node holds.
    pub kind: NodeKind,
    /// Byte range in the source.
    pub span: Span,
}

/// The value of a YAML node after core-schema resolution.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// `null`, `~` or nothing.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer or float.
    Number(Number),
    /// Any other scalar.
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in source order. Keys are scalars (their text).
    Map(Vec<(Key, Node)>),
}

/// A mapping key: its text and its span.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// The key as text (`1: x` has the key `"1"`).
    pub name: String,
    /// Byte range of the key in the source.
    pub span: Span,
}

/// Why a document could not be loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadError {
    /// Stable diagnostic code (`voidbox::yaml_syntax`, …).
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
    /// Where.
    pub span: Span,
    /// A hint, when one helps.
    pub help: Option<String>,
}

impl LoadError {
    fn new(code: &'static str, message: impl Into<String>, span: Span) -> Self {
        Self {
            code,
            message: message.into(),
            span,
            help: None,
        }
    }

    fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

impl Node {
    /// Converts the tree to a JSON value (for JSON Schema validation and typed decoding).
    pub fn to_json(&self) -> Value {
        match &self.kind {
            NodeKind::Null => Value::Null,
            NodeKind::Bool(b) => Value::Bool(*b),
            NodeKind::Number(n) => Value::Number(n.clone()),
            NodeKind::Str(s) => Value::String(s.clone()),
            NodeKind::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeKind::Map(entries) => {
                let mut map = Map::with_capacity(entries.len());
                for (k, v) in entries {
                    map.insert(k.name.clone(), v.to_json());
                }
                Value::Object(map)
            }
        }
    }

    /// The value under `key` when this node is a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.entry(key).map(|(_, v)| v)
    }

    /// The key and value under `key` when this node is a mapping.
    pub fn entry(&self, key: &str) -> Option<(&Key, &Node)> {
        match &self.kind {
            NodeKind::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.name == key)
                .map(|(k, v)| (k, v)),
            _ => None,
        }
    }

    /// The `index`th item when this node is a sequence.
    pub fn item(&self, index: usize) -> Option<&Node> {
        match &self.kind {
            NodeKind::Seq(items) => items.get(index),
            _ => None,
        }
    }

    /// The string value of a scalar node.
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Follows a JSON-pointer-like path of segments (keys and indices); returns the deepest
    /// node reached and whether the whole path resolved.
    pub fn walk<I, S>(&self, segments: I) -> (&Node, bool)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut node = self;
        for seg in segments {
            let seg = seg.as_ref();
            let next = match &node.kind {
                NodeKind::Map(_) => node.get(seg),
                NodeKind::Seq(_) => seg.parse::<usize>().ok().and_then(|i| node.item(i)),
                _ => None,
            };
            match next {
                Some(n) => node = n,
                None => return (node, false),
            }
        }
        (node, true)
    }
}

/// Maps the parser's character indices to byte offsets.
struct CharIndex<'a> {
    src: &'a str,
    ascii: bool,
    /// Byte offset of every 64th character (only for non-ASCII sources).
    checkpoints: Vec<usize>,
}

impl<'a> CharIndex<'a> {
    fn new(src: &'a str) -> Self {
        let ascii = src.is_ascii();
        let checkpoints = if ascii {
            Vec::new()
        } else {
            src.char_indices()
                .enumerate()
                .filter(|(i, _)| i % 64 == 0)
                .map(|(_, (b, _))| b)
                .collect()
        };
        Self {
            src,
            ascii,
            checkpoints,
        }
    }

    fn byte(&self, char_index: usize) -> usize {
        if self.ascii {
            return char_index.min(self.src.len());
        }
        let Some(&start) = self.checkpoints.get(char_index / 64) else {
            return self.src.len();
        };
        self.src[start..]
            .char_indices()
            .nth(char_index % 64)
            .map_or(self.src.len(), |(b, _)| start + b)
    }

    fn span(&self, span: &YamlSpan) -> Span {
        let start = self.byte(span.start.index());
        let end = self.byte(span.end.index()).max(start);
        Span::new(start, end - start)
    }
}

enum Frame {
    Seq {
        start: Span,
        anchor: usize,
        items: Vec<Node>,
    },
    Map {
        start: Span,
        anchor: usize,
        entries: Vec<(Key, Node)>,
        pending_key: Option<Key>,
    },
}

/// Whether `src` looks like a voidbox spec rather than some other YAML file (a CI workflow,
/// a pre-commit config, a Kubernetes manifest): its top-level mapping has `api_version`, or
/// `kind` without Kubernetes' `apiVersion`. A file that does not parse is judged by its
/// unindented lines, so a broken spec is still a spec (and gets its errors).
pub fn looks_like_spec(src: &str) -> bool {
    let judge =
        |has: &dyn Fn(&str) -> bool| has("api_version") || (has("kind") && !has("apiVersion"));
    match parse(src) {
        Ok(root) => judge(&|k| root.get(k).is_some()),
        Err(_) => judge(&|k| {
            src.lines().any(|l| {
                l.strip_prefix(k)
                    .is_some_and(|rest| rest.trim_start().starts_with(':'))
            })
        }),
    }
}

/// Parses one YAML document into a spanned tree.
pub fn parse(src: &str) -> Result<Node, LoadError> {
    let index = CharIndex::new(src);
    let mut parser = Parser::new_from_str(src);
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: std::collections::HashMap<usize, Node> = std::collections::HashMap::new();
    let mut root: Option<Node> = None;
    let mut documents = 0usize;
    let mut nodes = 0usize;
    let mut alias_nodes = 0usize;

    while let Some(item) = parser.next_event() {
        let (event, yspan) = item.map_err(|e| {
            let at = index.byte(e.marker().index());
            LoadError::new(
                "voidbox::yaml_syntax",
                format!("YAML syntax error: {}", e.info()),
                Span::new(at, 0),
            )
        })?;
        let span = index.span(&yspan);
        let done: Option<(Node, usize)> = match event {
            Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => None,
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(LoadError::new(
                        "voidbox::multiple_documents",
                        "a spec file holds exactly one YAML document",
                        span,
                    )
                    .with_help("split the documents into separate files"));
                }
                None
            }
            Event::Alias(id) => {
                let copy = alias(&anchors, id, span, &mut alias_nodes, &mut nodes)?;
                Some((copy, 0))
            }
            Event::Scalar(value, style, anchor, tag) => {
                nodes += 1;
                let kind = resolve_scalar(value, style, tag.as_deref(), span)?;
                Some((Node { kind, span }, anchor))
            }
            Event::SequenceStart(anchor, tag) => {
                check_collection_tag(tag.as_deref(), "seq", span)?;
                nodes += 1;
                check_depth(stack.len(), span)?;
                stack.push(Frame::Seq {
                    start: span,
                    anchor,
                    items: Vec::new(),
                });
                None
            }
            Event::MappingStart(anchor, tag) => {
                check_collection_tag(tag.as_deref(), "map", span)?;
                nodes += 1;
                check_depth(stack.len(), span)?;
                stack.push(Frame::Map {
                    start: span,
                    anchor,
                    entries: Vec::new(),
                    pending_key: None,
                });
                None
            }
            Event::SequenceEnd => match stack.pop() {
                Some(Frame::Seq {
                    start,
                    anchor,
                    items,
                }) => Some((
                    Node {
                        kind: NodeKind::Seq(items),
                        span: start.to(span),
                    },
                    anchor,
                )),
                _ => return Err(internal(span)),
            },
            Event::MappingEnd => match stack.pop() {
                Some(Frame::Map {
                    start,
                    anchor,
                    entries,
                    ..
                }) => Some((
                    Node {
                        kind: NodeKind::Map(entries),
                        span: start.to(span),
                    },
                    anchor,
                )),
                _ => return Err(internal(span)),
            },
        };
        if nodes > MAX_NODES {
            return Err(LoadError::new(
                "voidbox::too_large",
                format!("document has more than {MAX_NODES} nodes"),
                span,
            ));
        }
        let Some((node, anchor)) = done else { continue };
        if anchor != 0 {
            anchors.insert(anchor, node.clone());
        }
        attach(src, &mut stack, &mut root, node)?;
    }
    root.ok_or_else(|| {
        LoadError::new(
            "voidbox::empty_file",
            "the spec file is empty",
            Span::new(0, 0),
        )
        .with_help("a spec starts with `api_version: v1` and `kind: …`")
    })
}

/// Puts a finished node where it belongs: the root, the next item of the open sequence,
/// or the open mapping's next key (a scalar, not yet used) or value.
fn attach(
    src: &str,
    stack: &mut [Frame],
    root: &mut Option<Node>,
    node: Node,
) -> Result<(), LoadError> {
    match stack.last_mut() {
        None => *root = Some(node),
        Some(Frame::Seq { items, .. }) => items.push(node),
        Some(Frame::Map {
            entries,
            pending_key,
            ..
        }) => match pending_key.take() {
            None => {
                let name = match &node.kind {
                    NodeKind::Str(s) => s.clone(),
                    NodeKind::Null => "null".to_string(),
                    NodeKind::Bool(b) => b.to_string(),
                    NodeKind::Number(n) => n.to_string(),
                    NodeKind::Seq(_) | NodeKind::Map(_) => {
                        return Err(LoadError::new(
                            "voidbox::invalid_key",
                            "mapping keys must be scalars",
                            node.span,
                        ))
                    }
                };
                if let Some((first, _)) = entries.iter().find(|(k, _)| k.name == name) {
                    let (line, _) = crate::diagnostic::line_col(src, first.span.offset);
                    return Err(LoadError::new(
                        "voidbox::duplicate_key",
                        format!("duplicate key `{name}`"),
                        node.span,
                    )
                    .with_help(format!("`{name}` is already set on line {line}")));
                }
                *pending_key = Some(Key {
                    name,
                    span: node.span,
                });
            }
            Some(key) => entries.push((key, node)),
        },
    }
    Ok(())
}

/// A copy of the node anchored as `id`, counted against the node and alias limits (an
/// alias bomb stops here).
fn alias(
    anchors: &std::collections::HashMap<usize, Node>,
    id: usize,
    span: Span,
    alias_nodes: &mut usize,
    nodes: &mut usize,
) -> Result<Node, LoadError> {
    let Some(target) = anchors.get(&id) else {
        return Err(LoadError::new(
            "voidbox::yaml_syntax",
            "alias refers to an unknown anchor",
            span,
        ));
    };
    let copied = count_nodes(target);
    *alias_nodes = alias_nodes.saturating_add(copied);
    *nodes = nodes.saturating_add(copied);
    if *alias_nodes > MAX_ALIAS_NODES || *nodes > MAX_NODES {
        return Err(LoadError::new(
            "voidbox::alias_limit",
            format!("alias expansion exceeds {MAX_ALIAS_NODES} nodes (is this an alias bomb?)"),
            span,
        )
        .with_help("specs do not need aliases that expand this much; write the values out"));
    }
    let mut copy = target.clone();
    copy.span = span;
    Ok(copy)
}

fn check_depth(depth: usize, span: Span) -> Result<(), LoadError> {
    if depth >= MAX_DEPTH {
        return Err(LoadError::new(
            "voidbox::depth_limit",
            format!("nesting deeper than {MAX_DEPTH} levels"),
            span,
        ));
    }
    Ok(())
}

fn internal(span: Span) -> LoadError {
    LoadError::new(
        "voidbox::yaml_syntax",
        "unbalanced YAML collection events",
        span,
    )
}

fn count_nodes(node: &Node) -> usize {
    let mut count = 0usize;
    let mut stack = vec![node];
    while let Some(n) = stack.pop() {
        count += 1;
        match &n.kind {
            NodeKind::Seq(items) => stack.extend(items.iter()),
            NodeKind::Map(entries) => stack.extend(entries.iter().map(|(_, v)| v)),
            _ => {}
        }
    }
    count
}

fn core_tag(tag: &Tag) -> Option<&str> {
    if tag.is_yaml_core_schema() || tag.handle == "!!" {
        Some(tag.suffix.as_str())
    } else {
        None
    }
}

fn check_collection_tag(tag: Option<&Tag>, expected: &str, span: Span) -> Result<(), LoadError> {
    match tag {
        None => Ok(()),
        Some(t) if core_tag(t) == Some(expected) => Ok(()),
        Some(t) => Err(unsupported_tag(t, span)),
    }
}

fn unsupported_tag(tag: &Tag, span: Span) -> LoadError {
    LoadError::new(
        "voidbox::yaml_syntax",
        format!("unsupported YAML tag `{tag}`"),
        span,
    )
    .with_help("specs use plain YAML values; remove the tag")
}

fn resolve_scalar(
    value: Cow<'_, str>,
    style: ScalarStyle,
    tag: Option<&Tag>,
    span: Span,
) -> Result<NodeKind, LoadError> {
    if let Some(tag) = tag {
        let bad = |what: &str| {
            LoadError::new(
                "voidbox::yaml_syntax",
                format!("`{value}` is not a valid {what}"),
                span,
            )
        };
        return match core_tag(tag) {
            Some("str") => Ok(NodeKind::Str(value.into_owned())),
            Some("null") => Ok(NodeKind::Null),
            Some("bool") => parse_bool(&value)
                .map(NodeKind::Bool)
                .ok_or_else(|| bad("bool")),
            Some("int") => parse_int(&value)
                .map(NodeKind::Number)
                .ok_or_else(|| bad("integer")),
            Some("float") => parse_float(&value)
                .or_else(|| parse_int(&value))
                .map(NodeKind::Number)
                .ok_or_else(|| bad("float")),
            _ => Err(unsupported_tag(tag, span)),
        };
    }
    if style != ScalarStyle::Plain {
        return Ok(NodeKind::Str(value.into_owned()));
    }
    let v = value.as_ref();
    if matches!(v, "" | "~" | "null" | "Null" | "NULL") {
        return Ok(NodeKind::Null);
    }
    if let Some(b) = parse_bool(v) {
        return Ok(NodeKind::Bool(b));
    }
    if let Some(n) = parse_int(v) {
        return Ok(NodeKind::Number(n));
    }
    if let Some(n) = parse_float(v) {
        return Ok(NodeKind::Number(n));
    }
    Ok(NodeKind::Str(value.into_owned()))
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

fn parse_int(v: &str) -> Option<Number> {
    let (neg, digits) = match v.as_bytes().first()? {
        b'-' => (true, &v[1..]),
        b'+' => (false, &v[1..]),
        _ => (false, v),
    };
    let (radix, body) = if let Some(h) = digits.strip_prefix("0x") {
        (16, h)
    } else if let Some(o) = digits.strip_prefix("0o") {
        (8, o)
    } else {
        (10, digits)
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u64::from_str_radix(body, radix).ok()?;
    if neg {
        let n = i64::try_from(magnitude).ok()?;
        Some(Number::from(-n))
    } else {
        Some(Number::from(magnitude))
    }
}

fn parse_float(v: &str) -> Option<Number> {
    let lower = v.to_ascii_lowercase();
    if matches!(lower.as_str(), ".inf" | "+.inf" | "-.inf" | ".nan") {
        // JSON has no infinities or NaN; keep them as strings so the schema reports them.
        return None;
    }
    let body = v.strip_prefix(['-', '+']).unwrap_or(v);
    let first = body.chars().next()?;
    if !(first.is_ascii_digit() || first == '.') {
        return None;
    }
    if !body
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
    {
        return None;
    }
    let f: f64 = v.parse().ok()?;
    Number::from_f64(f)
}

#[cfg(test)]
mod tests {
    #[test]
    fn specs_are_told_from_other_yaml() {
        use super::looks_like_spec as spec;
        assert!(spec("api_version: v1\nkind: pipeline\n"));
        assert!(
            spec("kind: sandbox\nname: x\n"),
            "void-box v1 without api_version"
        );
        assert!(spec("{api_version: v1}"));
        assert!(
            spec("api_version: v1\nkind: [unclosed\n"),
            "a broken spec is a spec"
        );
        assert!(!spec("repos:\n  - repo: local\n"), "pre-commit config");
        assert!(
            !spec("- id: voidbox-validate\n  entry: voidbox validate\n"),
            "hooks"
        );
        assert!(!spec("on: push\njobs: {}\n"), "GitHub workflow");
        assert!(
            !spec("apiVersion: apps/v1\nkind: Deployment\n"),
            "Kubernetes"
        );
        assert!(
            !spec("apiVersion: v1\nkind: {{ .Values.kind }}\n  bad: [\n"),
            "a Helm template"
        );
        assert!(!spec(""));
        assert!(!spec("  kind: nested\nx: 1\n"), "only top-level keys count");
    }

    use super::*;

    fn json(src: &str) -> Value {
        parse(src).expect("parses").to_json()
    }

    #[test]
    fn resolves_core_schema_scalars() {
        let v = json("a: 1\nb: -2\nc: 1.5\nd: true\ne: ~\nf: yes\ng: '1'\nh: 0x10\ni: .inf\n");
        assert_eq!(
            v,
            serde_json::json!({"a": 1, "b": -2, "c": 1.5, "d": true, "e": null, "f": "yes", "g": "1", "h": 16, "i": ".inf"})
        );
    }

    #[test]
    fn keeps_spans_of_keys_and_values() {
        let src = "kind: pipeline\npipeline:\n  boxes:\n    - name: fetch\n";
        let root = parse(src).expect("parses");
        let (node, ok) = root.walk(["pipeline", "boxes", "0", "name"]);
        assert!(ok);
        assert_eq!(crate::diagnostic::line_col(src, node.span.offset), (4, 13));
        let (key, _) = root.entry("pipeline").expect("key");
        assert_eq!(crate::diagnostic::line_col(src, key.span.offset), (2, 1));
    }

    #[test]
    fn walk_stops_at_deepest_existing_node() {
        let root = parse("a:\n  b: 1\n").expect("parses");
        let (node, ok) = root.walk(["a", "missing"]);
        assert!(!ok);
        assert!(matches!(node.kind, NodeKind::Map(_)));
    }

    #[test]
    fn duplicate_keys_are_errors() {
        let err = parse("a: 1\nb: 2\na: 3\n").expect_err("duplicate");
        assert_eq!(err.code, "voidbox::duplicate_key");
        assert_eq!(
            crate::diagnostic::line_col("a: 1\nb: 2\na: 3\n", err.span.offset),
            (3, 1)
        );
    }

    #[test]
    fn alias_bomb_is_bounded() {
        let mut src = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let prev = i - 1;
            src.push_str(&format!(
                "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            ));
        }
        let err = parse(&src).expect_err("bomb");
        assert_eq!(err.code, "voidbox::alias_limit");
    }

    #[test]
    fn aliases_expand() {
        assert_eq!(
            json("a: &x {k: 1}\nb: *x\n"),
            serde_json::json!({"a": {"k": 1}, "b": {"k": 1}})
        );
    }

    #[test]
    fn deep_nesting_is_bounded() {
        let src = "[".repeat(MAX_DEPTH + 5);
        let err = parse(&src).expect_err("deep");
        assert_eq!(err.code, "voidbox::depth_limit");
    }

    #[test]
    fn empty_and_multi_document() {
        assert_eq!(parse("").expect_err("empty").code, "voidbox::empty_file");
        assert_eq!(
            parse("# only a comment\n").expect_err("empty").code,
            "voidbox::empty_file"
        );
        assert_eq!(
            parse("a: 1\n---\nb: 2\n").expect_err("multi").code,
            "voidbox::multiple_documents"
        );
    }

    #[test]
    fn syntax_error_is_located() {
        let src = "a: 1\nb: [1, 2\nc: 3\n";
        let err = parse(src).expect_err("syntax");
        assert_eq!(err.code, "voidbox::yaml_syntax");
        assert!(crate::diagnostic::line_col(src, err.span.offset).0 >= 2);
    }

    #[test]
    fn non_ascii_offsets_are_bytes() {
        let src = "name: \"héllo wörld\"\nkind: x\n";
        let root = parse(src).expect("parses");
        let (node, _) = root.walk(["kind"]);
        assert_eq!(&src[node.span.offset..node.span.offset + 1], "x");
        assert_eq!(crate::diagnostic::line_col(src, node.span.offset), (2, 7));
    }
}
