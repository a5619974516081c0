//! Data passing between nodes (design §4): merge rules for fan-out groups and multi-sink
//! workflows, a node's `input.json` / stdin, and the per-node output cap.

use serde_json::Value;

use crate::plan::{Input, Output, Plan};
use petgraph::graph::NodeIndex;

/// Default per-node output cap: 16 MiB.
pub const DEFAULT_MAX_OUTPUT: u64 = 16 * 1024 * 1024;

/// One output as an element of a merged array: valid JSON stays JSON, anything else becomes
/// a string with one trailing newline (`\n` or `\r\n`) trimmed.
pub fn element(bytes: &[u8]) -> Value {
    if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
        return v;
    }
    let text = String::from_utf8_lossy(bytes);
    let trimmed = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    Value::String(trimmed.to_string())
}

/// Outputs merged into a JSON array in the given order, serialized (no trailing newline).
pub fn merge<'a>(outputs: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let arr: Vec<Value> = outputs.into_iter().map(element).collect();
    serde_json::to_vec(&Value::Array(arr)).unwrap_or_else(|_| b"[]".to_vec())
}

/// What a node receives: `input.json` contents and the bytes piped to its stdin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInput {
    /// Written to `/workspace/input.json` when set.
    pub file: Option<Vec<u8>>,
    /// Piped to the command's stdin when set.
    pub stdin: Option<Vec<u8>>,
}

/// Resolves a node's input from finished outputs (`outputs[i]` is node `i`'s output).
/// `None` when an output it needs is missing (its producer did not succeed).
pub fn node_input(
    plan: &Plan,
    node: NodeIndex,
    run_input: Option<&[u8]>,
    outputs: &[Option<Vec<u8>>],
) -> Option<NodeInput> {
    let get = |i: NodeIndex| outputs.get(i.index()).and_then(|o| o.as_deref());
    Some(match &plan.graph[node].input {
        Input::RunInput => NodeInput {
            file: run_input.map(<[u8]>::to_vec),
            stdin: run_input.map(<[u8]>::to_vec),
        },
        Input::Node(n) => {
            let o = get(*n)?.to_vec();
            NodeInput {
                file: Some(o.clone()),
                stdin: Some(o),
            }
        }
        Input::Group(g) => {
            let members = plan.groups.get(*g)?;
            let parts: Option<Vec<&[u8]>> = members.iter().map(|m| get(*m)).collect();
            let merged = merge(parts?);
            NodeInput {
                file: Some(merged.clone()),
                stdin: Some(merged),
            }
        }
        Input::Steps { deps, stdin } => {
            let stdin_bytes = match stdin {
                Some(s) => Some(get(*s)?.to_vec()),
                None => None,
            };
            let file = match (stdin_bytes.as_ref(), deps.as_slice()) {
                (Some(s), _) => s.clone(),
                (None, [one]) => get(*one)?.to_vec(),
                (None, many) => {
                    let mut obj = serde_json::Map::new();
                    for d in many {
                        obj.insert(plan.graph[*d].name.clone(), element(get(*d)?));
                    }
                    serde_json::to_vec(&Value::Object(obj)).unwrap_or_default()
                }
            };
            NodeInput {
                file: Some(file),
                stdin: stdin_bytes,
            }
        }
    })
}

/// The plan's final output, when every node it comes from succeeded.
pub fn final_output(plan: &Plan, outputs: &[Option<Vec<u8>>]) -> Option<Vec<u8>> {
    let get = |i: &NodeIndex| outputs.get(i.index()).and_then(|o| o.as_deref());
    match &plan.output {
        Output::Node(n) => get(n).map(<[u8]>::to_vec),
        Output::Group(g) => {
            let parts: Option<Vec<&[u8]>> = plan.groups.get(*g)?.iter().map(get).collect();
            parts.map(|p| with_newline(merge(p)))
        }
        Output::Merge(ns) => {
            let parts: Option<Vec<&[u8]>> = ns.iter().map(get).collect();
            parts.map(|p| with_newline(merge(p)))
        }
    }
}

fn with_newline(mut v: Vec<u8>) -> Vec<u8> {
    v.push(b'\n');
    v
}

/// Collects a stream up to a cap; beyond it the collector remembers that it overflowed
/// (an error for the node, never a silent truncation).
#[derive(Debug, Clone)]
pub struct CappedBuf {
    buf: Vec<u8>,
    cap: u64,
    total: u64,
}

impl CappedBuf {
    /// An empty collector holding at most `cap` bytes.
    pub fn new(cap: u64) -> CappedBuf {
        CappedBuf {
            buf: Vec::new(),
            cap,
            total: 0,
        }
    }

    /// Appends `data` (bytes beyond the cap are counted, not stored).
    pub fn push(&mut self, data: &[u8]) {
        self.total = self.total.saturating_add(data.len() as u64);
        let room = self.cap.saturating_sub(self.buf.len() as u64) as usize;
        self.buf.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// `true` once more than `cap` bytes were pushed.
    pub fn overflowed(&self) -> bool {
        self.total > self.cap
    }

    /// Bytes pushed in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The collected bytes, or an error text when the cap was exceeded.
    pub fn into_result(self, what: &str) -> Result<Vec<u8>, String> {
        if self.overflowed() {
            Err(over_cap(what, self.total, self.cap))
        } else {
            Ok(self.buf)
        }
    }
}

/// The message for an output over the cap.
pub fn over_cap(what: &str, size: u64, cap: u64) -> String {
    format!(
        "{what} is larger than the output cap ({size} > {cap} bytes; raise it with --max-output)"
    )
}

/// The last `max` bytes of a stream (stderr tails for reports).
#[derive(Debug, Clone)]
pub struct Tail {
    buf: std::collections::VecDeque<u8>,
    max: usize,
}

impl Tail {
    /// An empty tail keeping `max` bytes.
    pub fn new(max: usize) -> Tail {
        Tail {
            buf: std::collections::VecDeque::new(),
            max,
        }
    }

    /// Appends bytes, dropping the oldest beyond `max`.
    pub fn push(&mut self, data: &[u8]) {
        let data = &data[data.len().saturating_sub(self.max)..];
        self.buf.extend(data.iter().copied());
        while self.buf.len() > self.max {
            self.buf.pop_front();
        }
    }

    /// The tail as (lossy) text.
    pub fn text(&self) -> String {
        let v: Vec<u8> = self.buf.iter().copied().collect();
        String::from_utf8_lossy(&v).into_owned()
    }
}

/// Parses a size like `16MiB`, `512k`, `1048576`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size `{s}`"))?;
    let mul: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("invalid size unit in `{s}` (use K, M or G)")),
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn elements_keep_json_and_trim_one_newline() {
        assert_eq!(element(b"9\n"), json!(9));
        assert_eq!(element(b"      9\n"), json!(9));
        assert_eq!(element(b"{\"a\":1}"), json!({"a": 1}));
        assert_eq!(element(b"A B\nC D\n"), json!("A B\nC D"));
        assert_eq!(element(b"x\n\n"), json!("x\n"));
        assert_eq!(element(b"x\r\n"), json!("x"));
        assert_eq!(element(b""), json!(""));
        assert_eq!(element(&[0xff, b'a']), json!("\u{fffd}a"));
    }

    #[test]
    fn merge_keeps_declaration_order() {
        let m = merge([&b"9\n"[..], b"THE FOX\n", b"2\n"]);
        assert_eq!(m, br#"[9,"THE FOX",2]"#);
    }

    #[test]
    fn capped_buffer_errors_instead_of_truncating() {
        let mut b = CappedBuf::new(4);
        b.push(b"ab");
        b.push(b"cd");
        assert!(!b.overflowed());
        b.push(b"e");
        assert!(b.overflowed());
        assert_eq!(b.total(), 5);
        assert!(b.into_result("stdout").unwrap_err().contains("5 > 4"));
    }

    #[test]
    fn tail_keeps_the_end() {
        let mut t = Tail::new(5);
        t.push(b"hello ");
        t.push(b"world");
        assert_eq!(t.text(), "world");
        t.push(b"0123456789");
        assert_eq!(t.text(), "56789");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("512k").unwrap(), 512 << 10);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(parse_size("x").is_err());
        assert!(parse_size("5T").is_err());
    }
}
