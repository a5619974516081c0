//! Data passing between nodes (design §4): merge rules for fan-out groups and multi-sink
//! workflows, a node's `input.json` / stdin, and the per-node output cap.

use serde_json::Value;

use crate::plan::{Input, Output, Plan};
use petgraph::graph::NodeIndex;

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
}
