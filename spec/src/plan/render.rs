//! Deterministic renderings of a [`Plan`]: a level-by-level text view, Graphviz DOT,
//! Mermaid and JSON. The same spec always renders to byte-identical output.
//!
//! JSON plan, version 1 (`graph --format json`, `apply --dry-run --output json`; fields are
//! only ever added):
//! ```text
//! { "version": 1, "kind": str, "name": str, "on_failure": "fail_fast"|"continue",
//!   "timeout_secs": int|null,
//!   "levels": [ [str] ],             // node names, level by level (parallel within a level)
//!   "nodes": [ { "name": str, "level": int (1-based), "type": "command"|"agent"|"shell",
//!                "fan_out": int|null,  // the fan-out group
//!                "run": null|{ "program": str|null (null: the image's entrypoint),
//!                              "args": [str] },
//!                "agent": null|{ "provider": str, "model": str|null, "prompt": str,
//!                                "skills": int },
//!                "memory_mb": int, "vcpus": int, "timeout_secs": int (effective),
//!                "retries": int, "network": null|str (the policy in words),
//!                "image": str|null, "mounts": int, "env": [str] (names only),
//!                "service": null|{ "ports": [int], "ready_timeout_secs": int },
//!                "input": { "from": "run_input" }|{ "from": "node", "node": str }
//!                         |{ "from": "fan_out", "nodes": [str] }
//!                         |{ "from": "depends_on", "nodes": [str], "stdin": str|null } } ],
//!   "output": { "from": "node", "node": str }|{ "from": "merge", "nodes": [str] } }
//! ```

use std::fmt::Write as _;

use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use super::{Action, Edge, Input, Output, Plan, PlanNode};
use crate::model::OnFailure;

/// Output formats of `voidbox graph`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum GraphFormat {
    /// Level-by-level text for terminals.
    Text,
    /// Graphviz DOT (`dot -Tsvg`).
    Dot,
    /// Mermaid flowchart (renders on GitHub).
    Mermaid,
    /// One JSON document (the plan, for tools).
    Json,
}

/// Renders `plan` in `format`.
pub fn render(plan: &Plan, format: GraphFormat) -> String {
    match format {
        GraphFormat::Text => text(plan),
        GraphFormat::Dot => dot(plan),
        GraphFormat::Mermaid => mermaid(plan),
        GraphFormat::Json => {
            let mut s = serde_json::to_string_pretty(&json(plan)).unwrap_or_default();
            s.push('\n');
            s
        }
    }
}

/// The plan as one JSON document (see the module docs for its fields).
pub fn json(plan: &Plan) -> serde_json::Value {
    use serde_json::json;
    let levels = plan.levels();
    let level_of = |idx: NodeIndex| levels.iter().position(|l| l.contains(&idx)).map(|l| l + 1);
    let list = |nodes: &[NodeIndex]| -> Vec<&str> {
        nodes.iter().map(|n| plan.graph[*n].name.as_str()).collect()
    };
    let nodes: Vec<serde_json::Value> = plan
        .graph
        .node_indices()
        .map(|idx| {
            let n = &plan.graph[idx];
            let (run, agent) = match &n.action {
                Action::Command(c) => (json!({"program": c.program, "args": c.args}), json!(null)),
                Action::Agent(a) => (
                    json!(null),
                    json!({
                        "provider": a.llm.provider.as_str(),
                        "model": a.llm.model,
                        "prompt": a.prompt,
                        "skills": a.skills.len(),
                    }),
                ),
                Action::Shell => (json!(null), json!(null)),
            };
            let input = match &n.input {
                Input::RunInput => json!({"from": "run_input"}),
                Input::Node(p) => json!({"from": "node", "node": plan.graph[*p].name}),
                Input::Group(g) => json!({"from": "fan_out", "nodes": list(&plan.groups[*g])}),
                Input::Steps { deps, stdin } => json!({
                    "from": "depends_on",
                    "nodes": list(deps),
                    "stdin": stdin.map(|i| plan.graph[i].name.as_str()),
                }),
            };
            json!({
                "name": n.name,
                "level": level_of(idx),
                "type": kind_word(n),
                "fan_out": n.group,
                "run": run,
                "agent": agent,
                "memory_mb": n.sandbox.memory_mb,
                "vcpus": n.sandbox.vcpus,
                "timeout_secs": n.timeout().secs,
                "retries": n.retries,
                "network": n.sandbox.network.as_ref().map(crate::network_policy::summary),
                "image": n.sandbox.image,
                "mounts": n.sandbox.mounts.len(),
                "env": n.sandbox.env.keys().collect::<Vec<_>>(),
                "service": n.service.as_ref().map(|s| json!({
                    "ports": s.ports,
                    "ready_timeout_secs": s.ready_timeout_secs,
                })),
                "input": input,
            })
        })
        .collect();
    let output = match &plan.output {
        Output::Node(n) => json!({"from": "node", "node": plan.graph[*n].name}),
        Output::Group(g) => json!({"from": "merge", "nodes": list(&plan.groups[*g])}),
        Output::Merge(ns) => json!({"from": "merge", "nodes": list(ns)}),
    };
    json!({
        "version": 1,
        "kind": plan.kind.as_str(),
        "name": plan.name,
        "on_failure": match plan.on_failure {
            OnFailure::FailFast => "fail_fast",
            OnFailure::Continue => "continue",
        },
        "timeout_secs": plan.timeout_secs,
        "levels": levels.iter().map(|l| list(l)).collect::<Vec<_>>(),
        "nodes": nodes,
        "output": output,
    })
}

fn truncate(s: &str, max: usize) -> String {
    let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut t: String = one_line.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// A one-line description of what a node runs.
pub fn describe_action(node: &PlanNode) -> String {
    match &node.action {
        Action::Command(c) => {
            let mut words = vec![match &c.program {
                Some(p) => shell_word(p),
                None => "<image entrypoint>".into(),
            }];
            words.extend(c.args.iter().map(|a| shell_word(a)));
            truncate(&words.join(" "), 60)
        }
        Action::Agent(a) => {
            let mut s = a.llm.provider.as_str().to_string();
            if let Some(m) = &a.llm.model {
                let _ = write!(s, "/{m}");
            }
            if !a.skills.is_empty() {
                let _ = write!(
                    s,
                    ", {} skill{}",
                    a.skills.len(),
                    if a.skills.len() == 1 { "" } else { "s" }
                );
            }
            let _ = write!(s, ": \"{}\"", truncate(&a.prompt, 40));
            s
        }
        Action::Shell => "interactive shell".to_string(),
    }
}

fn kind_word(node: &PlanNode) -> &'static str {
    match node.action {
        Action::Command(_) => "command",
        Action::Agent(_) => "agent",
        Action::Shell => "shell",
    }
}

fn resources(node: &PlanNode) -> String {
    let sb = &node.sandbox;
    let mut parts = vec![
        format!("{} MiB", sb.memory_mb),
        format!("{} vCPU", sb.vcpus),
    ];
    if let Some(policy) = &sb.network {
        parts.push(crate::network_policy::summary(policy));
    }
    if let Some(t) = node.timeout_secs {
        parts.push(format!("timeout {t}s"));
    }
    if let Some(svc) = &node.service {
        let ports: Vec<String> = svc.ports.iter().map(|p| format!(":{p}")).collect();
        parts.push(match ports.is_empty() {
            true => "service".to_string(),
            false => format!("service {}", ports.join(" ")),
        });
    }
    if node.retries > 0 {
        parts.push(format!(
            "{} retr{}",
            node.retries,
            if node.retries == 1 { "y" } else { "ies" }
        ));
    }
    if !sb.mounts.is_empty() {
        parts.push(format!(
            "{} mount{}",
            sb.mounts.len(),
            if sb.mounts.len() == 1 { "" } else { "s" }
        ));
    }
    parts.join(", ")
}

fn names(plan: &Plan, nodes: &[NodeIndex]) -> String {
    nodes
        .iter()
        .map(|n| plan.graph[*n].name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn input_note(plan: &Plan, node: &PlanNode) -> String {
    match &node.input {
        Input::RunInput => String::new(),
        Input::Node(n) => format!("  ← {}", plan.graph[*n].name),
        Input::Group(g) => format!("  ← [{}]", names(plan, &plan.groups[*g])),
        Input::Steps { deps, stdin } => {
            let mut s = format!("  ← {}", names(plan, deps));
            if let Some(i) = stdin {
                let _ = write!(s, " (stdin: {})", plan.graph[*i].name);
            }
            s
        }
    }
}

fn output_note(plan: &Plan) -> String {
    match &plan.output {
        Output::Node(n) => plan.graph[*n].name.clone(),
        Output::Group(g) => format!("[{}] (merged JSON array)", names(plan, &plan.groups[*g])),
        Output::Merge(nodes) => format!("[{}] (merged JSON array)", names(plan, nodes)),
    }
}

fn text(plan: &Plan) -> String {
    let levels = plan.levels();
    let n = plan.graph.node_count();
    let width = plan
        .graph
        .node_weights()
        .map(|w| w.name.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    let policy = match plan.on_failure {
        OnFailure::FailFast => "fail-fast",
        OnFailure::Continue => "continue on failure",
    };
    let _ = writeln!(
        out,
        "{} `{}`: {n} node{} in {} level{}, {policy}{}",
        plan.kind.as_str(),
        plan.name,
        if n == 1 { "" } else { "s" },
        levels.len(),
        if levels.len() == 1 { "" } else { "s" },
        plan.timeout_secs
            .map(|t| format!(", timeout {t}s"))
            .unwrap_or_default()
    );
    for (i, level) in levels.iter().enumerate() {
        let groups: Vec<usize> = {
            let mut g: Vec<usize> = level.iter().filter_map(|n| plan.graph[*n].group).collect();
            g.dedup();
            g
        };
        let note = if groups.is_empty() {
            if level.len() > 1 { " (parallel)" } else { "" }.to_string()
        } else {
            " — fan_out: outputs merged as a JSON array in this order".to_string()
        };
        let _ = writeln!(out, "level {}{note}", i + 1);
        for idx in level {
            let node = &plan.graph[*idx];
            let _ = writeln!(
                out,
                "  {:width$}  {:7}  {}  [{}]{}",
                node.name,
                kind_word(node),
                describe_action(node),
                resources(node),
                input_note(plan, node),
            );
        }
    }
    let _ = writeln!(out, "output: {}", output_note(plan));
    out
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn edge_label(edge: &Edge) -> Option<String> {
    match edge {
        Edge::Pipe | Edge::DependsOn => None,
        Edge::Merge { index } => Some(format!("[{index}]")),
        Edge::Stdin => Some("stdin".into()),
    }
}

fn dot(plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", dot_escape(&plan.name));
    let _ = writeln!(
        out,
        "  graph [rankdir=LR, label=\"{} {}\", labelloc=t, fontname=\"Helvetica\"];",
        plan.kind.as_str(),
        dot_escape(&plan.name)
    );
    let _ = writeln!(
        out,
        "  node [shape=box, style=rounded, fontname=\"Helvetica\"];"
    );
    let _ = writeln!(out, "  edge [fontname=\"Helvetica\", fontsize=10];");
    let node_line = |idx: NodeIndex| {
        let n = &plan.graph[idx];
        let shape = match n.action {
            Action::Agent(_) => ", shape=component",
            _ => "",
        };
        format!(
            "\"{}\" [label=\"{}\\n{}: {}\"{shape}];",
            dot_escape(&n.name),
            dot_escape(&n.name),
            kind_word(n),
            dot_escape(&describe_action(n))
        )
    };
    for (g, members) in plan.groups.iter().enumerate() {
        let _ = writeln!(out, "  subgraph \"cluster_fan_out_{g}\" {{");
        let _ = writeln!(out, "    label=\"fan_out\"; style=dashed;");
        for m in members {
            let _ = writeln!(out, "    {}", node_line(*m));
        }
        let _ = writeln!(out, "  }}");
    }
    for idx in plan.graph.node_indices() {
        if plan.graph[idx].group.is_none() {
            let _ = writeln!(out, "  {}", node_line(idx));
        }
    }
    for e in sorted_edges(plan) {
        let (a, b, w) = e;
        let label = edge_label(&w)
            .map(|l| format!(" [label=\"{l}\"]"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  \"{}\" -> \"{}\"{label};",
            dot_escape(&plan.graph[a].name),
            dot_escape(&plan.graph[b].name)
        );
    }
    let _ = writeln!(out, "}}");
    out
}

fn sorted_edges(plan: &Plan) -> Vec<(NodeIndex, NodeIndex, Edge)> {
    let mut edges: Vec<_> = plan
        .graph
        .node_indices()
        .flat_map(|n| {
            plan.graph
                .edges_directed(n, Direction::Outgoing)
                .map(|e| (e.source(), e.target(), *e.weight()))
                .collect::<Vec<_>>()
        })
        .collect();
    edges.sort_by_key(|(a, b, _)| (a.index(), b.index()));
    edges
}

fn mermaid_escape(s: &str) -> String {
    s.replace('&', "#amp;")
        .replace('"', "#quot;")
        .replace('<', "#lt;")
        .replace('>', "#gt;")
}

fn mermaid(plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "---");
    let _ = writeln!(
        out,
        "title: {} {}",
        plan.kind.as_str(),
        mermaid_escape(&plan.name)
    );
    let _ = writeln!(out, "---");
    let _ = writeln!(out, "flowchart LR");
    let node_line = |idx: NodeIndex| {
        let n = &plan.graph[idx];
        let label = format!(
            "{}<br/>{}: {}",
            mermaid_escape(&n.name),
            kind_word(n),
            mermaid_escape(&describe_action(n))
        );
        match n.action {
            Action::Agent(_) => format!("n{}[[\"{label}\"]]", idx.index()),
            _ => format!("n{}[\"{label}\"]", idx.index()),
        }
    };
    for (g, members) in plan.groups.iter().enumerate() {
        let _ = writeln!(out, "  subgraph g{g} [\"fan_out\"]");
        for m in members {
            let _ = writeln!(out, "    {}", node_line(*m));
        }
        let _ = writeln!(out, "  end");
    }
    for idx in plan.graph.node_indices() {
        if plan.graph[idx].group.is_none() {
            let _ = writeln!(out, "  {}", node_line(idx));
        }
    }
    for (a, b, w) in sorted_edges(plan) {
        match edge_label(&w) {
            Some(l) => {
                let _ = writeln!(out, "  n{} -->|\"{l}\"| n{}", a.index(), b.index());
            }
            None => {
                let _ = writeln!(out, "  n{} --> n{}", a.index(), b.index());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(src: &str) -> Plan {
        crate::plan::compile_for_test(src)
    }

    const PIPE: &str = "api_version: v1\nkind: pipeline\nname: p\nsandbox: {memory_mb: 128}\npipeline:\n  boxes:\n    - {name: seed, run: {program: echo, args: ['[1]']}}\n    - {name: a, run: {program: cat}}\n    - {name: b, run: {program: wc, args: [-c]}, timeout_secs: 5, retries: 1}\n    - {name: collect, run: {program: cat}}\n  stages:\n    - {type: box, name: seed}\n    - {type: fan_out, boxes: [a, b]}\n    - {type: box, name: collect}\n";

    #[test]
    fn pipeline_compiles_to_stages_with_merge_edges() {
        let p = plan(PIPE);
        assert_eq!(p.graph.node_count(), 4);
        assert_eq!(p.groups.len(), 1);
        let collect = p.node("collect").expect("collect");
        assert_eq!(p.graph[collect].input, Input::Group(0));
        assert_eq!(p.output, Output::Node(collect));
        assert_eq!(p.levels().len(), 3);
        let merge: Vec<_> = sorted_edges(&p)
            .into_iter()
            .filter(|(_, _, w)| matches!(w, Edge::Merge { .. }))
            .collect();
        assert_eq!(merge.len(), 2);
    }

    #[test]
    fn text_view_is_readable_and_stable() {
        let p = plan(PIPE);
        let t = render(&p, GraphFormat::Text);
        assert_eq!(t, render(&plan(PIPE), GraphFormat::Text));
        let expected = "pipeline `p`: 4 nodes in 3 levels, fail-fast\n\
level 1\n  seed     command  echo '[1]'  [128 MiB, 1 vCPU]\n\
level 2 — fan_out: outputs merged as a JSON array in this order\n  a        command  cat  [128 MiB, 1 vCPU]  ← seed\n  b        command  wc -c  [128 MiB, 1 vCPU, timeout 5s, 1 retry]  ← seed\n\
level 3\n  collect  command  cat  [128 MiB, 1 vCPU]  ← [a, b]\n\
output: collect\n";
        assert_eq!(t, expected);
    }

    #[test]
    fn dot_and_mermaid_have_clusters_and_edges() {
        let p = plan(PIPE);
        let d = render(&p, GraphFormat::Dot);
        assert!(d.starts_with("digraph \"p\" {"));
        assert!(d.contains("subgraph \"cluster_fan_out_0\""));
        assert!(d.contains("\"a\" -> \"collect\" [label=\"[0]\"];"));
        assert!(d.contains("\"b\" -> \"collect\" [label=\"[1]\"];"));
        let m = render(&p, GraphFormat::Mermaid);
        assert!(m.contains("flowchart LR"));
        assert!(m.contains("subgraph g0 [\"fan_out\"]"));
        assert!(m.contains("n1 -->|\"[0]\"| n3"));
    }

    #[test]
    fn workflow_edges_and_outputs() {
        let src = "kind: workflow\nname: w\nworkflow:\n  steps:\n    - {name: a, run: {program: echo}}\n    - {name: b, run: {program: cat}, depends_on: [a], stdin_from: a}\n    - {name: c, run: {program: cat}, depends_on: [a]}\n";
        let p = plan(src);
        let b = p.node("b").expect("b");
        let a = p.node("a").expect("a");
        assert_eq!(
            p.graph[b].input,
            Input::Steps {
                deps: vec![a],
                stdin: Some(a)
            }
        );
        assert_eq!(p.output, Output::Merge(vec![b, p.node("c").expect("c")]));
        let t = render(&p, GraphFormat::Text);
        assert!(t.contains("← a (stdin: a)"), "{t}");
        assert!(render(&p, GraphFormat::Dot).contains("\"a\" -> \"b\" [label=\"stdin\"];"));
    }

    #[test]
    fn overrides_and_paths_resolve() {
        let src = "kind: pipeline\nname: p\nsandbox:\n  memory_mb: 256\n  env: {A: '1'}\npipeline:\n  boxes:\n    - name: x\n      run: {program: 'true'}\n      sandbox: {memory_mb: 512, env: {B: '2'}}\n";
        let p = plan(src);
        let x = &p.graph[p.node("x").expect("x")];
        assert_eq!(x.sandbox.memory_mb, 512);
        assert_eq!(x.sandbox.env.len(), 2);
    }

    #[test]
    fn network_shows_as_network_or_its_policy() {
        let src = "kind: pipeline\nname: p\nsandbox: {memory_mb: 128, network: true}\npipeline:\n  boxes:\n    - {name: a, run: {program: 'true'}}\n    - {name: b, run: {program: 'true'}, sandbox: {network: {allow_host_ports: [11434], allow_domains: [api.github.com], connections_per_second: 5}}}\n    - {name: c, run: {program: 'true'}, sandbox: {network: false}}\n";
        let t = render(&plan(src), GraphFormat::Text);
        assert!(
            t.contains("  a  command  true  [128 MiB, 1 vCPU, network]\n"),
            "{t}"
        );
        assert!(
            t.contains("  b  command  true  [128 MiB, 1 vCPU, network(host ports 11434; domains api.github.com; 5 conns/s)]  ← a\n"),
            "{t}"
        );
        assert!(
            t.contains("  c  command  true  [128 MiB, 1 vCPU]  ← b\n"),
            "{t}"
        );
    }

    #[test]
    fn quoting_in_dot_and_mermaid() {
        let src = "kind: pipeline\nname: 'we \"quote\"'\npipeline:\n  boxes:\n    - {name: x, run: {program: sh, args: [-c, 'echo \"<b>\"']}}\n";
        let p = plan(src);
        let d = render(&p, GraphFormat::Dot);
        assert!(d.contains("digraph \"we \\\"quote\\\"\""), "{d}");
        let m = render(&p, GraphFormat::Mermaid);
        assert!(m.contains("#quot;#lt;b#gt;#quot;"), "{m}");
    }
}
