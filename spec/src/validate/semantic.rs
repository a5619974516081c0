//! Semantic rules beyond the JSON Schema: sections per kind, references, duplicate names,
//! dependency cycles, fan-out shape, skills, mounts, paths and network policies.
//!
//! The rules walk the spanned YAML tree (not the typed spec) so that they run — and report
//! with exact locations — even when the schema found other problems in the same file.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use petgraph::graph::{DiGraph, NodeIndex};

use crate::diagnostic::{Diagnostic, Span};
use crate::host_path::Resolved;
use crate::suggest::did_you_mean;
use crate::validate::skills::{check_prompt_file, check_skill_string};
use crate::yaml::{Node, NodeKind};

/// Runs every semantic rule over `root`; `base` is the spec file's directory (`_facts`:
/// nothing, see [`super::HostFacts`]).
pub fn check(root: &Node, base: &Path, _facts: super::HostFacts<'_>, out: &mut Vec<Diagnostic>) {
    let kind = root.get("kind").and_then(Node::as_str);
    check_sections(root, kind, out);
    crate::validate::names::check(root, out);
    crate::validate::image_refs::check(root, out);
    crate::validate::network::check(root, out);
    crate::validate::entrypoints::check(root, out);
    if let Some(sandbox) = root.get("sandbox") {
        check_sandbox(sandbox, base, out);
    }
    if let Some(agent) = root.get("agent") {
        check_agent(agent, base, out);
    }
    if let Some(pipeline) = root.get("pipeline") {
        check_pipeline(pipeline, base, out);
        crate::validate::artifacts::check(pipeline, out);
    }
    if let Some(workflow) = root.get("workflow") {
        check_workflow(workflow, base, out);
    }
    if let Some(run) = root.get("run") {
        check_env(run.get("env"), out);
    }
    crate::validate::runtimes::check(root, out);
}

fn key_span(node: &Node, key: &str) -> Span {
    node.entry(key).map_or(node.span, |(k, _)| k.span)
}

/// The items of a YAML sequence node (none when it is absent or not a sequence).
pub(crate) fn items(node: Option<&Node>) -> &[Node] {
    match node.map(|n| &n.kind) {
        Some(NodeKind::Seq(items)) => items,
        _ => &[],
    }
}

fn check_sections(root: &Node, kind: Option<&str>, out: &mut Vec<Diagnostic>) {
    let required = match kind {
        Some("agent") => Some("agent"),
        Some("pipeline") => Some("pipeline"),
        Some("workflow") => Some("workflow"),
        _ => None,
    };
    if let Some(section) = required {
        if root.get(section).is_none() {
            out.push(
                Diagnostic::error(
                    "voidbox::missing_section",
                    format!(
                        "`kind: {}` requires a `{section}:` block",
                        kind.unwrap_or_default()
                    ),
                    root.get("kind").map_or(Span::default(), |n| n.span),
                )
                .with_label(format!("needs `{section}:`")),
            );
        }
    }
    let kind_span = root.get("kind").map_or(Span::default(), |n| n.span);
    for section in ["agent", "pipeline", "workflow", "run"] {
        if Some(section) == required || root.get(section).is_none() {
            continue;
        }
        let belongs = match section {
            "run" => "sandbox",
            s => s,
        };
        let span = key_span(root, section);
        match kind {
            Some("sandbox") if section != "run" => out.push(
                Diagnostic::error(
                    "voidbox::unexpected_section",
                    format!("`kind: sandbox` does not accept a `{section}:` block"),
                    span,
                )
                .with_related(kind_span, "kind declared here"),
            ),
            Some("sandbox") => {}
            Some(k @ ("agent" | "pipeline" | "workflow")) => out.push(
                Diagnostic::warning(
                    "voidbox::ignored_section",
                    format!(
                        "`{section}:` is ignored by `kind: {k}` (it belongs to `kind: {belongs}`)"
                    ),
                    span,
                )
                .with_related(kind_span, "kind declared here"),
            ),
            _ => {}
        }
    }
}

fn check_sandbox(sandbox: &Node, base: &Path, out: &mut Vec<Diagnostic>) {
    if let Some(mode) = sandbox.get("mode").filter(|m| m.as_str() == Some("mock")) {
        out.push(
            Diagnostic::warning(
                "voidbox::mock_mode",
                "`sandbox.mode: mock` never runs anything: `voidbox apply` refuses it",
                mode.span,
            )
            .with_help("use `voidbox apply --dry-run` to see the plan, or `mode: auto` to run in KVM micro-VMs"),
        );
    }
    for key in ["kernel", "initramfs"] {
        if let Some(node) = sandbox.get(key) {
            if let Some(p) = node.as_str() {
                if !crate::validate::paths::resolve(base, p, node.span, out)
                    .path()
                    .is_file()
                {
                    out.push(
                        Diagnostic::error(
                            "voidbox::file_not_found",
                            format!("`sandbox.{key}` file `{p}` does not exist"),
                            node.span,
                        )
                        .with_help(format!(
                            "paths are relative to the spec file's directory: {}",
                            base.display()
                        )),
                    );
                }
            }
        }
    }
    check_mounts(sandbox.get("mounts"), base, out);
    check_env(sandbox.get("env"), out);
}

fn check_mounts(mounts: Option<&Node>, base: &Path, out: &mut Vec<Diagnostic>) {
    for m in items(mounts) {
        if let Some(host) = m.get("host") {
            if let Some(p) = host.as_str().filter(|p| !p.is_empty()) {
                let resolved = crate::validate::paths::resolve(base, p, host.span, out);
                let rw = m.get("mode").and_then(Node::as_str) == Some("rw");
                if matches!(resolved, Resolved::Missing(_)) && rw {
                    out.push(
                        Diagnostic::warning(
                            "voidbox::mount_created",
                            format!(
                                "`rw` mount host directory `{p}` does not exist: it is created ({}) when the node starts",
                                std::path::absolute(resolved.path())
                                    .unwrap_or_else(|_| resolved.path().to_path_buf())
                                    .display()
                            ),
                            host.span,
                        )
                        .with_label("created when the node starts")
                        .with_help(format!(
                            "host paths are relative to the spec file's directory: {}",
                            base.display()
                        )),
                    );
                } else if matches!(resolved, Resolved::Missing(_)) {
                    out.push(
                        Diagnostic::error(
                            "voidbox::mount_not_found",
                            format!("mount host path `{p}` does not exist"),
                            host.span,
                        )
                        .with_label("no such file or directory")
                        .with_help(format!(
                            "host paths are relative to the spec file's directory: {}",
                            base.display()
                        )),
                    );
                }
            }
        }
        if let Some(guest) = m.get("guest") {
            if let Some(g) = guest.as_str().filter(|g| !g.is_empty()) {
                // The rule the engine and the guest agent apply: what passes here mounts.
                if let Err(why) = voidbox_protocol::guest_paths::check_share_path(g) {
                    out.push(
                        Diagnostic::error("voidbox::invalid_mount", why, guest.span)
                            .with_help("for example `/workspace/src`, `/mnt/data` or `/srv/cache`"),
                    );
                }
            }
        }
    }
}

fn check_env(env: Option<&Node>, out: &mut Vec<Diagnostic>) {
    let Some(NodeKind::Map(entries)) = env.map(|n| &n.kind) else {
        return;
    };
    for (k, _) in entries {
        let valid = k
            .name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            out.push(
                Diagnostic::error(
                    "voidbox::invalid_env",
                    format!("`{}` is not a valid environment variable name", k.name),
                    k.span,
                )
                .with_help("names use letters, digits and `_`, and do not start with a digit"),
            );
        }
    }
}

fn check_skills(skills: Option<&Node>, base: &Path, out: &mut Vec<Diagnostic>) {
    for s in items(skills) {
        match &s.kind {
            NodeKind::Str(text) => check_skill_string(text, s.span, base, out),
            NodeKind::Map(_) => {
                if let Some(mount) = s.get("mount") {
                    if let Some(m) = mount
                        .as_str()
                        .filter(|m| !m.is_empty() && !m.starts_with('/'))
                    {
                        out.push(
                            Diagnostic::error(
                                "voidbox::invalid_skill",
                                format!("OCI skill mount `{m}` must be an absolute guest path"),
                                mount.span,
                            )
                            .with_help("for example `/skills/python`"),
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

fn check_prompt_files(files: Option<&Node>, base: &Path, out: &mut Vec<Diagnostic>) {
    for f in items(files) {
        if let Some(rel) = f.as_str() {
            check_prompt_file(rel, f.span, base, out);
        }
    }
}

fn check_agent(agent: &Node, base: &Path, out: &mut Vec<Diagnostic>) {
    let mode = agent.get("mode").and_then(Node::as_str).unwrap_or("task");
    if let Some(prompt) = agent.get("prompt") {
        let empty = match &prompt.kind {
            NodeKind::Str(s) => s.trim().is_empty(),
            NodeKind::Null => true,
            _ => false,
        };
        if empty && mode != "interactive" {
            out.push(
                Diagnostic::error(
                    "voidbox::empty_prompt",
                    "`agent.prompt` is empty",
                    prompt.span,
                )
                .with_help("give the agent a task, or use `mode: interactive`"),
            );
        }
    }
    let mode_span = agent.get("mode").map_or(agent.span, |n| n.span);
    if mode == "service" {
        if agent.get("timeout_secs").is_some() {
            out.push(
                Diagnostic::error(
                    "voidbox::mode_conflict",
                    "`mode: service` and `timeout_secs` are mutually exclusive",
                    key_span(agent, "timeout_secs"),
                )
                .with_related(mode_span, "service mode declared here"),
            );
        }
        if agent.get("output_file").is_none() {
            out.push(
                Diagnostic::error(
                    "voidbox::mode_conflict",
                    "`mode: service` requires `output_file`",
                    mode_span,
                )
                .with_help("add `output_file: /workspace/output.json`"),
            );
        }
    }
    if mode == "interactive" && agent.get("timeout_secs").is_some() {
        out.push(
            Diagnostic::error(
                "voidbox::mode_conflict",
                "`mode: interactive` and `timeout_secs` are mutually exclusive",
                key_span(agent, "timeout_secs"),
            )
            .with_related(mode_span, "interactive mode declared here"),
        );
    }
    check_skills(agent.get("skills"), base, out);
    check_prompt_files(agent.get("prompt_files"), base, out);
}

/// Names declared by a list of items (`boxes` or `steps`); reports duplicates.
fn declared_names<'a>(
    list: &'a [Node],
    what: &str,
    out: &mut Vec<Diagnostic>,
) -> HashMap<&'a str, (usize, Span)> {
    let mut names: HashMap<&str, (usize, Span)> = HashMap::new();
    for (i, item) in list.iter().enumerate() {
        let Some(name_node) = item.get("name") else {
            continue;
        };
        let Some(name) = name_node.as_str() else {
            continue;
        };
        if let Some((_, first)) = names.get(name) {
            out.push(
                Diagnostic::error(
                    "voidbox::duplicate_name",
                    format!("duplicate {what} name `{name}`"),
                    name_node.span,
                )
                .with_label("declared again here")
                .with_related(*first, "first declared here")
                .with_help(format!("{what} names must be unique")),
            );
        } else {
            names.insert(name, (i, name_node.span));
        }
    }
    names
}

fn unknown_ref(
    code: &'static str,
    what: &'static str,
    name: &str,
    span: Span,
    known: &HashMap<&str, (usize, Span)>,
) -> Diagnostic {
    let mut candidates: Vec<&str> = known.keys().copied().collect();
    candidates.sort_unstable();
    let help = did_you_mean(name, candidates.iter().copied())
        .map(|s| format!("did you mean `{s}`?"))
        .or_else(|| {
            (!candidates.is_empty()).then(|| {
                let plural = if what == "box" { "boxes" } else { "steps" };
                format!("known {plural}: {}", crate::suggest::one_of(&candidates))
            })
        });
    Diagnostic::error(code, format!("unknown {what} `{name}`"), span)
        .with_label(format!("no {what} has this name"))
        .with_help_opt(help)
}

fn check_pipeline(pipeline: &Node, base: &Path, out: &mut Vec<Diagnostic>) {
    let boxes = items(pipeline.get("boxes"));
    if matches!(pipeline.get("boxes").map(|b| &b.kind), Some(NodeKind::Seq(v)) if v.is_empty()) {
        out.push(Diagnostic::error(
            "voidbox::empty_pipeline",
            "`pipeline.boxes` is empty: a pipeline needs at least one box",
            pipeline.get("boxes").map_or(pipeline.span, |b| b.span),
        ));
    }
    let names = declared_names(boxes, "box", out);
    let mut outputs: HashSet<&str> = HashSet::new();
    for b in boxes {
        for o in items(b.get("outputs")) {
            if let Some(n) = o.get("name").and_then(Node::as_str) {
                outputs.insert(n);
            }
        }
    }
    for b in boxes {
        let name = b.get("name").and_then(Node::as_str).unwrap_or("?");
        let head = b.get("name").map_or(b.span, |n| n.span);
        match (b.get("prompt"), b.get("run")) {
            (Some(_), Some(_)) => out.push(
                Diagnostic::error(
                    "voidbox::box_kind",
                    format!("box `{name}` has both `prompt` and `run`"),
                    key_span(b, "run"),
                )
                .with_related(key_span(b, "prompt"), "prompt here")
                .with_help("an agent box has `prompt`; a command box has `run`"),
            ),
            (None, None) => out.push(
                Diagnostic::error(
                    "voidbox::box_kind",
                    format!("box `{name}` has neither `prompt` nor `run`"),
                    head,
                )
                .with_help(
                    "add `prompt: …` for an agent box or `run: {program: …}` for a command box",
                ),
            ),
            (None, Some(_)) => {
                // A new field: refused where it would do nothing (void-box's `skills` and
                // `llm` stay warnings).
                if b.get("prompt_files").is_some() {
                    out.push(
                        Diagnostic::error(
                            "voidbox::box_kind",
                            format!("`prompt_files` on command box `{name}`: only agent boxes have a runtime to give them to"),
                            key_span(b, "prompt_files"),
                        )
                        .with_help("remove it, or make the box an agent box with `prompt: …`"),
                    );
                }
                for key in ["skills", "llm"] {
                    if b.get(key).is_some() {
                        out.push(
                            Diagnostic::warning(
                                "voidbox::ignored_field",
                                format!("`{key}` on command box `{name}` is ignored (only agent boxes use it)"),
                                key_span(b, key),
                            ),
                        );
                    }
                }
            }
            (Some(prompt), None) => {
                if prompt.as_str().is_some_and(|p| p.trim().is_empty()) {
                    out.push(Diagnostic::error(
                        "voidbox::empty_prompt",
                        format!("box `{name}` has an empty `prompt`"),
                        prompt.span,
                    ));
                }
            }
        }
        check_skills(b.get("skills"), base, out);
        check_prompt_files(b.get("prompt_files"), base, out);
        check_service(b, "box", name, out);
        if let Some(run) = b.get("run") {
            check_env(run.get("env"), out);
        }
        if let Some(sb) = b.get("sandbox") {
            check_mounts(sb.get("mounts"), base, out);
            check_env(sb.get("env"), out);
        }
        for i in items(b.get("inputs")) {
            if let Some(from) = i.get("from") {
                if let Some(f) = from.as_str().filter(|f| !outputs.contains(f)) {
                    out.push(
                        Diagnostic::error(
                            "voidbox::unknown_output",
                            format!("box `{name}` reads output `{f}`, which no box declares"),
                            from.span,
                        )
                        .with_help_opt(
                            did_you_mean(f, outputs.iter().copied())
                                .map(|s| format!("did you mean `{s}`?")),
                        ),
                    );
                }
            }
        }
    }
    check_stages(pipeline, &names, out);
}

fn check_stages(pipeline: &Node, names: &HashMap<&str, (usize, Span)>, out: &mut Vec<Diagnostic>) {
    let Some(stages_node) = pipeline.get("stages") else {
        return;
    };
    let stages = items(Some(stages_node));
    let mut used: HashMap<String, Span> = HashMap::new();
    let mut use_box = |name: &str, span: Span, out: &mut Vec<Diagnostic>| {
        if !names.contains_key(name) {
            out.push(unknown_ref(
                "voidbox::unknown_box",
                "box",
                name,
                span,
                names,
            ));
        } else if let Some(first) = used.get(name) {
            out.push(
                Diagnostic::error(
                    "voidbox::box_reused",
                    format!("box `{name}` is used by more than one stage"),
                    span,
                )
                .with_related(*first, "first used here")
                .with_help(
                    "every box is one node with one fresh VM; declare a second box to run it again",
                ),
            );
        } else {
            used.insert(name.to_string(), span);
        }
    };
    for stage in stages {
        let ty = stage.get("type").and_then(Node::as_str);
        match ty {
            Some("box") => {
                if let Some(n) = stage.get("name") {
                    if let Some(name) = n.as_str() {
                        use_box(name, n.span, out);
                    }
                }
            }
            Some("fan_out") => {
                let Some(list) = stage.get("boxes") else {
                    continue;
                };
                let NodeKind::Seq(members) = &list.kind else {
                    continue;
                };
                match members.len() {
                    0 => out.push(
                        Diagnostic::error("voidbox::empty_fan_out", "`fan_out` stage has no boxes", list.span)
                            .with_help("a fan_out runs two or more boxes in parallel"),
                    ),
                    1 => out.push(
                        Diagnostic::error(
                            "voidbox::single_fan_out",
                            "`fan_out` stage has a single box",
                            list.span,
                        )
                        .with_help("use `{type: box, name: …}` for one box; a fan_out runs two or more in parallel"),
                    ),
                    _ => {}
                }
                for m in members {
                    if let Some(name) = m.as_str() {
                        use_box(name, m.span, out);
                    }
                }
            }
            _ => {}
        }
    }
    if !stages.is_empty() {
        let mut unused: Vec<(&str, Span)> = names
            .iter()
            .filter(|(n, _)| !used.contains_key(**n))
            .map(|(n, (_, s))| (*n, *s))
            .collect();
        unused.sort_by_key(|(_, s)| s.offset);
        for (n, span) in unused {
            out.push(
                Diagnostic::warning(
                    "voidbox::unused_box",
                    format!("box `{n}` is not used by any stage and will not run"),
                    span,
                )
                .with_help("add it to `stages`, or remove it"),
            );
        }
    }
}

fn check_workflow(workflow: &Node, base: &Path, out: &mut Vec<Diagnostic>) {
    let steps_node = workflow.get("steps");
    let steps = items(steps_node);
    if matches!(steps_node.map(|s| &s.kind), Some(NodeKind::Seq(v)) if v.is_empty()) {
        out.push(Diagnostic::error(
            "voidbox::empty_workflow",
            "`workflow.steps` is empty: a workflow needs at least one step",
            steps_node.map_or(workflow.span, |s| s.span),
        ));
    }
    let names = declared_names(steps, "step", out);
    let services: HashSet<&str> = steps
        .iter()
        .filter(|s| s.get("mode").and_then(Node::as_str) == Some("service"))
        .filter_map(|s| s.get("name").and_then(Node::as_str))
        .collect();
    let mut graph: DiGraph<usize, Span> = DiGraph::new();
    let idx: Vec<NodeIndex> = (0..steps.len()).map(|i| graph.add_node(i)).collect();
    for (i, step) in steps.iter().enumerate() {
        let name = step.get("name").and_then(Node::as_str).unwrap_or("?");
        let mut deps: HashMap<&str, Span> = HashMap::new();
        for d in items(step.get("depends_on")) {
            let Some(dep) = d.as_str() else { continue };
            if let Some(first) = deps.get(dep) {
                out.push(
                    Diagnostic::warning(
                        "voidbox::duplicate_dependency",
                        format!("step `{name}` lists `{dep}` twice in `depends_on`"),
                        d.span,
                    )
                    .with_related(*first, "first listed here"),
                );
                continue;
            }
            deps.insert(dep, d.span);
            match names.get(dep) {
                None => out.push(unknown_ref(
                    "voidbox::unknown_step",
                    "step",
                    dep,
                    d.span,
                    &names,
                )),
                Some((j, _)) => {
                    graph.add_edge(idx[i], idx[*j], d.span);
                }
            }
        }
        let run = step.get("run");
        let inner = run.and_then(|r| r.get("stdin_from"));
        let outer = step.get("stdin_from");
        if let (Some(a), Some(b)) = (outer, inner) {
            out.push(
                Diagnostic::error(
                    "voidbox::conflicting_fields",
                    format!("step `{name}` sets `stdin_from` twice"),
                    b.span,
                )
                .with_related(a.span, "also set here")
                .with_help("keep one: `stdin_from` on the step, or (void-box form) under `run`"),
            );
        }
        if let Some(src) = outer.or(inner) {
            if let Some(s) = src.as_str() {
                if s == name {
                    out.push(Diagnostic::error(
                        "voidbox::stdin_not_dependency",
                        format!("step `{name}` cannot read its own output as stdin"),
                        src.span,
                    ));
                } else if !names.contains_key(s) {
                    out.push(unknown_ref(
                        "voidbox::unknown_step",
                        "step",
                        s,
                        src.span,
                        &names,
                    ));
                } else if !deps.contains_key(s) {
                    out.push(
                        Diagnostic::error(
                            "voidbox::stdin_not_dependency",
                            format!("step `{name}` reads stdin from `{s}`, which is not in its `depends_on`"),
                            src.span,
                        )
                        .with_help(format!("add `{s}` to `depends_on`")),
                    );
                }
            }
        }
        check_service(step, "step", name, out);
        if let Some(src) = outer.or(inner) {
            if let Some(s) = src.as_str().filter(|s| services.contains(s)) {
                out.push(
                    Diagnostic::error(
                        "voidbox::stdin_from_service",
                        format!("step `{name}` reads stdin from `{s}`, a service, which has no output while its dependents run"),
                        src.span,
                    )
                    .with_help(format!("reach the service as `{s}:PORT` instead")),
                );
            }
        }
        if let Some(r) = run {
            check_env(r.get("env"), out);
        }
        if let Some(sb) = step.get("sandbox") {
            check_mounts(sb.get("mounts"), base, out);
            check_env(sb.get("env"), out);
        }
    }
    report_cycles(&graph, steps, out);
    if let Some(os) = workflow.get("output_step") {
        if let Some(s) = os.as_str().filter(|s| !names.contains_key(s)) {
            out.push(unknown_ref(
                "voidbox::unknown_output_step",
                "step",
                s,
                os.span,
                &names,
            ));
        }
    }
}

/// A `mode: service` step or box: no `timeout_secs` or `retries` of its own, a name its
/// dependents can resolve when it has `ports`, distinct non-zero ports; `ports` and
/// `ready_timeout_secs` only on a service.
fn check_service(node: &Node, what: &str, name: &str, out: &mut Vec<Diagnostic>) {
    let service = node.get("mode").and_then(Node::as_str) == Some("service");
    if !service {
        for key in ["ports", "ready_timeout_secs"] {
            if node.get(key).is_some() {
                out.push(
                    Diagnostic::error(
                        "voidbox::service_field",
                        format!(
                            "{what} `{name}`: `{key}` applies only to a `mode: service` {what}"
                        ),
                        key_span(node, key),
                    )
                    .with_help(format!("add `mode: service`, or remove `{key}`")),
                );
            }
        }
        return;
    }
    for (key, why) in [
        ("timeout_secs", "a service has no timeout of its own (it runs until it exits or its dependents are done; `ready_timeout_secs` bounds its start)"),
        ("retries", "a service is not retried (a service that exits early fails the run)"),
    ] {
        if node.get(key).is_some() {
            out.push(Diagnostic::error(
                "voidbox::mode_conflict",
                format!("{what} `{name}`: `mode: service` and `{key}` are mutually exclusive: {why}"),
                key_span(node, key),
            ));
        }
    }
    let ports = items(node.get("ports"));
    let mut seen: HashMap<u64, Span> = HashMap::new();
    for p in ports {
        let Some(n) = (match &p.kind {
            NodeKind::Number(n) => n.as_u64(),
            _ => None,
        }) else {
            continue; // the schema reports a port that is not a number
        };
        if n == 0 {
            out.push(Diagnostic::error(
                "voidbox::service_port",
                format!("{what} `{name}`: port 0 is not a TCP port a service can listen on"),
                p.span,
            ));
        } else if let Some(first) = seen.insert(n, p.span) {
            out.push(
                Diagnostic::error(
                    "voidbox::service_port",
                    format!("{what} `{name}` lists port {n} twice"),
                    p.span,
                )
                .with_related(first, "first listed here"),
            );
        }
    }
    if !ports.is_empty() && !hostname_ok(name) {
        out.push(
            Diagnostic::error(
                "voidbox::service_name",
                format!("service `{name}` is reached as `{name}:PORT`, but `{name}` is not a host name"),
                node.get("name").map_or(node.span, |n| n.span),
            )
            .with_help("name it with letters, digits and `-` (at most 63, not starting or ending with `-`)"),
        );
    }
}

/// A name the dependents' resolver answers: one DNS label of letters, digits and `-`.
pub(crate) fn hostname_ok(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Reports each dependency cycle once, spelled out in full (`a → b → c → a`).
fn report_cycles(graph: &DiGraph<usize, Span>, steps: &[Node], out: &mut Vec<Diagnostic>) {
    let name_of = |i: usize| steps[i].get("name").and_then(Node::as_str).unwrap_or("?");
    let mut sccs = petgraph::algo::tarjan_scc(graph);
    sccs.sort_by_key(|c| c.iter().map(|n| graph[*n]).min());
    for scc in sccs {
        let self_loop = scc.len() == 1 && graph.find_edge(scc[0], scc[0]).is_some();
        if scc.len() < 2 && !self_loop {
            continue;
        }
        let members: HashSet<NodeIndex> = scc.iter().copied().collect();
        let Some(&start) = scc.iter().min_by_key(|n| graph[**n]) else {
            continue;
        };
        // Walk dependencies inside the component until we return to the start.
        let path = cycle_path(graph, start, &members);
        let mut text: Vec<&str> = path.iter().map(|(n, _)| name_of(graph[*n])).collect();
        text.push(name_of(graph[start]));
        let first_edge = path.first().map_or(Span::default(), |(_, s)| *s);
        let mut d = Diagnostic::error(
            "voidbox::cycle",
            format!("dependency cycle: {}", text.join(" → ")),
            first_edge,
        )
        .with_label(format!("`{}` depends on `{}`", text[0], text.get(1).copied().unwrap_or("?")))
        .with_help("`→` reads \"depends on\"; a workflow must be acyclic, so remove one of these dependencies");
        for (i, (_, span)) in path.iter().enumerate().skip(1) {
            d = d.with_related(*span, format!("`{}` depends on `{}`", text[i], text[i + 1]));
        }
        out.push(d);
    }
}

/// A simple cycle through `start` within `members`: the nodes in order with the span of the
/// dependency edge leaving each.
fn cycle_path(
    graph: &DiGraph<usize, Span>,
    start: NodeIndex,
    members: &HashSet<NodeIndex>,
) -> Vec<(NodeIndex, Span)> {
    // Depth-first search for a path back to `start`, preferring declaration order.
    let mut stack: Vec<(NodeIndex, Vec<(NodeIndex, Span)>)> = vec![(start, Vec::new())];
    let mut seen: HashSet<NodeIndex> = HashSet::new();
    while let Some((node, path)) = stack.pop() {
        let mut edges: Vec<_> = graph
            .edges(node)
            .filter(|e| members.contains(&petgraph::visit::EdgeRef::target(e)))
            .map(|e| (petgraph::visit::EdgeRef::target(&e), *e.weight()))
            .collect();
        edges.sort_by_key(|(_, s)| std::cmp::Reverse(s.offset));
        for (next, span) in edges {
            let mut p = path.clone();
            p.push((node, span));
            if next == start {
                return p;
            }
            if seen.insert(next) {
                stack.push((next, p));
            }
        }
    }
    vec![(start, Span::default())]
}
