//! Span attributes: OpenTelemetry semantic conventions (GenAI for agents, `process.*` for
//! commands) plus the OpenInference ones LLM observability tools read (Arize Phoenix shows
//! an agent node's runtime call as an LLM span with its tokens and cost).

use opentelemetry::trace::Status;
use opentelemetry::KeyValue;

use crate::plan::{Action, Plan, PlanNode};
use crate::scheduler::{AgentStats, Attempt, NodeRecord, Status as NodeStatus};

/// OpenInference's span kind attribute.
pub const OI_KIND: &str = "openinference.span.kind";

/// A stage of the plan: one pipe step, or a fan-out group.
#[derive(Debug, Clone)]
pub struct Stage {
    /// Shown name (`box` or `fan_out[a, b]`).
    pub name: String,
    /// `pipe` or `fan_out`.
    pub kind: &'static str,
    /// Member nodes (indices into the plan's graph).
    pub members: Vec<usize>,
}

/// The plan's stages in declaration order; every node is in exactly one.
pub fn stages(plan: &Plan) -> Vec<Stage> {
    let mut out: Vec<Stage> = Vec::new();
    let mut of_group: std::collections::HashMap<usize, usize> = Default::default();
    for idx in plan.graph.node_indices() {
        let n = &plan.graph[idx];
        match n.group {
            Some(g) => match of_group.get(&g) {
                Some(&s) => out[s].members.push(idx.index()),
                None => {
                    of_group.insert(g, out.len());
                    out.push(Stage {
                        name: String::new(),
                        kind: "fan_out",
                        members: vec![idx.index()],
                    });
                }
            },
            None => out.push(Stage {
                name: n.name.clone(),
                kind: "pipe",
                members: vec![idx.index()],
            }),
        }
    }
    for s in out.iter_mut().filter(|s| s.kind == "fan_out") {
        let names: Vec<&str> = s
            .members
            .iter()
            .map(|&i| plan.graph[petgraph::graph::NodeIndex::new(i)].name.as_str())
            .collect();
        s.name = format!("fan_out[{}]", names.join(", "));
    }
    out
}

/// The identity attributes of a node (on its spans and metrics).
pub fn node_identity(n: &PlanNode) -> Vec<KeyValue> {
    vec![
        KeyValue::new("voidbox.node.name", n.name.clone()),
        KeyValue::new(
            "voidbox.node.kind",
            match n.action {
                Action::Agent(_) => "agent",
                Action::Command(_) => "command",
                Action::Shell => "shell",
            },
        ),
    ]
}

/// The status of a span for a node or attempt status.
pub fn status(s: NodeStatus, error: Option<&str>) -> Status {
    match s {
        NodeStatus::Succeeded => Status::Ok,
        NodeStatus::Skipped => Status::Unset,
        _ => Status::error(
            error
                .map(|e| e.lines().next().unwrap_or("").to_string())
                .unwrap_or_else(|| s.as_str().to_string()),
        ),
    }
}

/// The node span's attributes at its end.
pub fn node_end(n: &PlanNode, r: &NodeRecord) -> Vec<KeyValue> {
    let mut v = vec![
        KeyValue::new("voidbox.node.status", r.status.as_str()),
        KeyValue::new("voidbox.node.attempts", i64::from(r.attempts)),
        KeyValue::new("voidbox.vm.memory_mb", n.sandbox.memory_mb as i64),
        KeyValue::new("voidbox.vm.vcpus", n.sandbox.vcpus as i64),
        KeyValue::new(
            OI_KIND,
            if matches!(n.action, Action::Agent(_)) {
                "AGENT"
            } else {
                "CHAIN"
            },
        ),
    ];
    if let Some(w) = r.queue_wait {
        v.push(KeyValue::new(
            "voidbox.node.queue_wait_ms",
            w.as_millis() as i64,
        ));
    }
    if let Some(a) = &r.last {
        v.push(KeyValue::new(
            "voidbox.node.output_bytes",
            a.output.len() as i64,
        ));
        if let Some(ag) = &a.agent {
            v.push(KeyValue::new("gen_ai.agent.name", n.name.clone()));
            v.extend(token_attrs(ag));
        }
        v.extend(node_service(a));
    }
    v
}

/// A service attempt's attributes: how it ended, connections served, time to ready.
pub fn node_service(a: &Attempt) -> Vec<KeyValue> {
    let Some(s) = &a.service else {
        return Vec::new();
    };
    let mut v = vec![
        KeyValue::new("voidbox.service.ended", s.ended.as_str()),
        KeyValue::new("voidbox.service.connections", s.connections as i64),
    ];
    if let Some(ms) = s.ready_ms {
        v.push(KeyValue::new("voidbox.service.ready_ms", ms as i64));
    }
    v
}

/// An attempt span's attributes.
pub fn attempt(n: u32, a: &Attempt) -> Vec<KeyValue> {
    let mut v = vec![
        KeyValue::new("voidbox.attempt", i64::from(n)),
        KeyValue::new("voidbox.node.status", a.status.as_str()),
        KeyValue::new("voidbox.output_bytes", a.output.len() as i64),
    ];
    if let Some(c) = a.exit_code {
        v.push(KeyValue::new("process.exit.code", i64::from(c)));
    }
    if let Some(s) = a.signal {
        v.push(KeyValue::new("voidbox.signal", i64::from(s)));
    }
    if let Some(e) = &a.error {
        v.push(KeyValue::new("error.type", a.status.as_str()));
        v.push(KeyValue::new("voidbox.error", first_line(e)));
    }
    if a.environment {
        v.push(KeyValue::new("voidbox.environment_failure", true));
    }
    v
}

/// The VM start span's attributes.
pub fn vm_start(n: &PlanNode, a: &Attempt) -> Vec<KeyValue> {
    let mut v = vec![
        KeyValue::new(
            "voidbox.vm.start.kind",
            if a.restored == Some(true) {
                "restore"
            } else {
                "cold_boot"
            },
        ),
        KeyValue::new("voidbox.vm.memory_mb", n.sandbox.memory_mb as i64),
        KeyValue::new("voidbox.vm.vcpus", n.sandbox.vcpus as i64),
        KeyValue::new("voidbox.vm.network", n.sandbox.network.is_some()),
    ];
    if let Some(s) = &a.phases.snapshot {
        v.push(KeyValue::new("voidbox.vm.snapshot", s.clone()));
    }
    v
}

/// The exec span's name and attributes: a command's program, or for an agent the GenAI
/// `invoke_agent` operation with its model, provider, tokens and cost.
pub fn exec(n: &PlanNode, a: &Attempt) -> (String, Vec<KeyValue>) {
    let mut v = Vec::new();
    if let Some(g) = &a.guest {
        v.push(KeyValue::new(
            "voidbox.guest.cpu_user_ms",
            g.cpu_user_ms as i64,
        ));
        v.push(KeyValue::new(
            "voidbox.guest.cpu_system_ms",
            g.cpu_system_ms as i64,
        ));
        v.push(KeyValue::new(
            "voidbox.guest.memory_used_bytes",
            g.mem_used_kb.saturating_mul(1024) as i64,
        ));
        v.push(KeyValue::new(
            "voidbox.guest.memory_peak_bytes",
            g.mem_peak_kb.saturating_mul(1024) as i64,
        ));
        v.push(KeyValue::new(
            "voidbox.guest.samples",
            g.samples_taken as i64,
        ));
    }
    match &a.runtime_start {
        Some(crate::scheduler::RuntimeStart::Warm { snapshot, .. }) => v.extend([
            KeyValue::new("voidbox.agent.runtime_start", "warm"),
            KeyValue::new("voidbox.agent.warm_snapshot", snapshot.clone()),
        ]),
        Some(crate::scheduler::RuntimeStart::Cold { reason }) => v.extend([
            KeyValue::new("voidbox.agent.runtime_start", "cold"),
            KeyValue::new("voidbox.agent.cold_reason", reason.clone()),
        ]),
        None => {}
    }
    match (&n.action, &a.agent) {
        (Action::Agent(_), Some(ag)) => {
            v.extend([
                KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                KeyValue::new("gen_ai.agent.name", n.name.clone()),
                KeyValue::new("voidbox.agent.runtime", ag.runtime.clone()),
                KeyValue::new("voidbox.agent.turns", ag.num_turns as i64),
                KeyValue::new("voidbox.agent.tool_calls", ag.tool_calls.len() as i64),
                KeyValue::new(OI_KIND, "LLM"),
            ]);
            v.extend(token_attrs(ag));
            (format!("invoke_agent {}", n.name), v)
        }
        (Action::Command(c), _) => {
            // What started (an image's entrypoint has no `run.program`); else what was asked.
            let program = a
                .program
                .clone()
                .or_else(|| c.program.clone())
                .unwrap_or_else(|| "entrypoint".into());
            v.push(KeyValue::new("process.executable.name", program.clone()));
            v.push(KeyValue::new(OI_KIND, "CHAIN"));
            (format!("exec {program}"), v)
        }
        _ => ("exec".to_string(), v),
    }
}

/// Model, provider, tokens and cost, in both conventions.
fn token_attrs(ag: &AgentStats) -> Vec<KeyValue> {
    let mut v = vec![
        KeyValue::new("gen_ai.provider.name", ag.provider.clone()),
        KeyValue::new("gen_ai.system", ag.provider.clone()),
        KeyValue::new("gen_ai.usage.input_tokens", ag.input_tokens as i64),
        KeyValue::new("gen_ai.usage.output_tokens", ag.output_tokens as i64),
        KeyValue::new(
            "gen_ai.usage.cache_read.input_tokens",
            ag.cached_tokens as i64,
        ),
        KeyValue::new("voidbox.llm.cost_usd", ag.cost_usd),
        KeyValue::new("llm.provider", ag.provider.clone()),
        KeyValue::new("llm.system", ag.provider.clone()),
        KeyValue::new("llm.token_count.prompt", ag.input_tokens as i64),
        KeyValue::new("llm.token_count.completion", ag.output_tokens as i64),
        KeyValue::new(
            "llm.token_count.total",
            ag.input_tokens.saturating_add(ag.output_tokens) as i64,
        ),
        KeyValue::new(
            "llm.token_count.prompt_details.cache_read",
            ag.cached_tokens as i64,
        ),
        KeyValue::new("llm.cost.total", ag.cost_usd),
    ];
    if let Some(m) = &ag.model {
        v.push(KeyValue::new("gen_ai.request.model", m.clone()));
        v.push(KeyValue::new("gen_ai.response.model", m.clone()));
        v.push(KeyValue::new("llm.model_name", m.clone()));
    }
    v
}

/// A tool call span's attributes (GenAI `execute_tool`, OpenInference `TOOL`).
pub fn tool(name: &str, id: Option<&str>) -> Vec<KeyValue> {
    let mut v = vec![
        KeyValue::new("gen_ai.operation.name", "execute_tool"),
        KeyValue::new("gen_ai.tool.name", name.to_string()),
        KeyValue::new("tool.name", name.to_string()),
        KeyValue::new(OI_KIND, "TOOL"),
    ];
    if let Some(i) = id {
        v.push(KeyValue::new("gen_ai.tool.call.id", i.to_string()));
    }
    v
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").chars().take(1000).collect()
}
