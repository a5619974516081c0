//! Data passing between nodes (docs/architecture.md §4): merge rules for fan-out groups and
//! multi-sink workflows, a node's `input.json` / stdin, and the per-node output cap.

use serde_json::Value;

use crate::plan::{Action, Input, Output, Plan};
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

/// `n` is a command service: it hands its dependents no output (it is still running when
/// they start), so their input leaves it out. An agent service hands its ready file.
pub fn hands_no_output(plan: &Plan, n: NodeIndex) -> bool {
    let node = &plan.graph[n];
    node.service.is_some() && matches!(node.action, Action::Command(_))
}

/// `node` takes the run's input (`apply --input`): it has no upstream node, or only
/// command services, which hand it nothing.
pub fn takes_run_input(plan: &Plan, node: NodeIndex) -> bool {
    match &plan.graph[node].input {
        Input::RunInput => true,
        Input::Node(n) => hands_no_output(plan, *n),
        Input::Group(g) => plan
            .groups
            .get(*g)
            .is_some_and(|m| m.iter().all(|&n| hands_no_output(plan, n))),
        Input::Steps { deps, stdin } => {
            stdin.is_none() && deps.iter().all(|&n| hands_no_output(plan, n))
        }
    }
}

/// Resolves a node's input from finished outputs (`outputs[i]` is node `i`'s output).
/// `None` when an output it needs is missing (its producer did not succeed). Command
/// services ([`hands_no_output`]) are left out: a node whose every upstream is one gets the
/// run input, as a root node does; otherwise its input is built from the others alone.
pub fn node_input(
    plan: &Plan,
    node: NodeIndex,
    run_input: Option<&[u8]>,
    outputs: &[Option<Vec<u8>>],
) -> Option<NodeInput> {
    let get = |i: NodeIndex| outputs.get(i.index()).and_then(|o| o.as_deref());
    if takes_run_input(plan, node) {
        return Some(NodeInput {
            file: run_input.map(<[u8]>::to_vec),
            stdin: run_input.map(<[u8]>::to_vec),
        });
    }
    let handing = |ns: &[NodeIndex]| -> Vec<NodeIndex> {
        ns.iter()
            .copied()
            .filter(|&n| !hands_no_output(plan, n))
            .collect()
    };
    Some(match &plan.graph[node].input {
        Input::RunInput => return None, // taken above
        Input::Node(n) => {
            let o = get(*n)?.to_vec();
            NodeInput {
                file: Some(o.clone()),
                stdin: Some(o),
            }
        }
        Input::Group(g) => {
            let members = handing(plan.groups.get(*g)?);
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
            let deps = handing(deps);
            let file = match (stdin_bytes.as_ref(), deps.as_slice()) {
                (Some(s), _) => s.clone(),
                (None, []) => return None, // taken above
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

    /// A command service hands no output: its dependents' input is built from their other
    /// upstream nodes, or is the run input when it is their only one.
    #[test]
    fn a_command_service_is_left_out_of_its_dependents_input() {
        let p = crate::plan::compile_for_test(
            "kind: workflow\nname: w\nworkflow:\n  steps:\n    - {name: web, mode: service, ports: [80], run: {program: httpd}}\n    - {name: build, run: {program: echo}}\n    - {name: lint, run: {program: echo}}\n    - {name: a, depends_on: [web], run: {program: wget}}\n    - {name: b, depends_on: [web, build], run: {program: wget}}\n    - {name: c, depends_on: [build, web, lint], run: {program: wget}}\n",
        );
        let idx = |name: &str| {
            p.graph
                .node_indices()
                .find(|&i| p.graph[i].name == name)
                .unwrap()
        };
        let mut outputs = vec![None; p.graph.node_count()];
        // A running service's slot stays empty: nothing may need it.
        outputs[idx("build").index()] = Some(b"built\n".to_vec());
        outputs[idx("lint").index()] = Some(b"{\"ok\":true}".to_vec());
        let input = |name, run: Option<&[u8]>| node_input(&p, idx(name), run, &outputs).unwrap();
        assert!(hands_no_output(&p, idx("web")) && !hands_no_output(&p, idx("build")));
        assert!(takes_run_input(&p, idx("a")) && takes_run_input(&p, idx("build")));
        assert!(!takes_run_input(&p, idx("b")) && !takes_run_input(&p, idx("c")));
        let a = input("a", Some(b"{\"x\":1}"));
        assert_eq!(a.file.as_deref(), Some(&b"{\"x\":1}"[..]));
        assert_eq!(a.stdin.as_deref(), Some(&b"{\"x\":1}"[..]));
        assert_eq!(input("a", None), NodeInput::default());
        let b = input("b", Some(b"run"));
        assert_eq!((b.file.as_deref(), b.stdin), (Some(&b"built\n"[..]), None));
        let c: Value = serde_json::from_slice(&input("c", None).file.unwrap()).unwrap();
        assert_eq!(c, json!({"build": "built", "lint": {"ok": true}}));
    }

    #[test]
    fn merge_keeps_declaration_order() {
        let m = merge([&b"9\n"[..], b"THE FOX\n", b"2\n"]);
        assert_eq!(m, br#"[9,"THE FOX",2]"#);
    }
}
