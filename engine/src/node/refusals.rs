//! Plan-time refusals: every spec field `apply` cannot carry out is refused before the first
//! VM starts (exit 3), each one named with its field and its line — never silently dropped.
//! `apply --dry-run` runs the same checks, so it reports exactly the refusals `apply` would
//! make, with the same exit code.
//!
//! [`check_spec`] needs only the spec; [`check_image`] needs the guest image the nodes boot
//! (the programs on its `PATH` for `cli:` skills, and spec-named snapshots).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::diagnostic::Span;
use crate::plan::{Action, Plan, PlanNode};
use crate::spec::model::Kind;
use crate::spec::yaml::{self, Node, NodeKind};
use crate::validate::skills::{parse_skill, SkillRef};

/// Exit code of a refused spec (an environment limit, not an invalid spec).
pub const EXIT_REFUSED: u8 = 3;

/// Guest directories the file RPCs can read and write (artifact paths must be inside).
pub const ARTIFACT_ROOTS: [&str; 2] = ["/workspace", "/home"];

/// What the nodes are checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `apply` (and `--dry-run`): every node runs to completion.
    Run,
    /// `shell`: the node opens an interactive terminal, so an agent's
    /// `mode: interactive` is what is asked for, not refused.
    Shell,
}

/// One field `apply` cannot carry out, located in the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The field, as a path (`pipeline.boxes[1].sandbox.mounts`).
    pub field: String,
    /// 1-based line of the field.
    pub line: usize,
    /// 1-based column of the field.
    pub column: usize,
    /// What cannot be done, and why.
    pub message: String,
    /// How to proceed.
    pub help: String,
}

/// The spec's text parsed with spans, for locating refusals.
#[derive(Debug)]
pub struct SpecSource {
    /// The spec file as given on the command line.
    pub path: String,
    /// The command that refuses it (`apply`, `shell`), as the summary line names it.
    pub command: &'static str,
    text: String,
    root: Node,
}

impl SpecSource {
    /// Parses `text` (already validated); `None` when it no longer parses.
    pub fn parse(path: impl Into<String>, text: impl Into<String>) -> Option<SpecSource> {
        let text = text.into();
        let root = yaml::parse(&text).ok()?;
        Some(SpecSource {
            path: path.into(),
            command: "apply",
            text,
            root,
        })
    }
}

/// Checks a node's spec-named `sandbox.snapshot` (`Err(why)` when it cannot serve it).
pub type SnapshotCheck<'a> = &'a dyn Fn(&PlanNode, &str) -> Result<(), String>;

/// What [`check_image`] knows about the guest image the nodes boot.
pub struct ImageFacts<'a> {
    /// Program names on the guest's `PATH`; `None` when the image does not record them.
    pub path_programs: Option<&'a BTreeSet<String>>,
    /// Checks spec-named snapshots; `None` when snapshots are off.
    pub snapshot: Option<SnapshotCheck<'a>>,
}

/// The located fields of one plan node.
struct Located<'a> {
    src: &'a SpecSource,
    /// The node's own block (a box, a step, `agent`, or the root for `kind: sandbox`).
    own: Option<(&'a Node, String)>,
}

impl<'a> Located<'a> {
    fn of(src: &'a SpecSource, kind: Kind, name: &str) -> Located<'a> {
        let root = &src.root;
        let list = |section: &str, key: &str| {
            let items = match root.get(section).and_then(|s| s.get(key)).map(|n| &n.kind) {
                Some(NodeKind::Seq(items)) => items.as_slice(),
                _ => &[],
            };
            items
                .iter()
                .enumerate()
                .find(|(_, b)| b.get("name").and_then(Node::as_str) == Some(name))
                .map(|(i, b)| (b, format!("{section}.{key}[{i}]")))
        };
        let own = match kind {
            Kind::Pipeline => list("pipeline", "boxes"),
            Kind::Workflow => list("workflow", "steps"),
            Kind::Agent => root.get("agent").map(|a| (a, "agent".to_string())),
            Kind::Sandbox => None,
        };
        Located { src, own }
    }

    fn at(&self, field: String, span: Span, message: String, help: &str) -> Refusal {
        let (line, column) = crate::diagnostic::line_col(&self.src.text, span.offset);
        Refusal {
            field,
            line,
            column,
            message,
            help: help.to_string(),
        }
    }

    /// `key` of the node's own block (`prefix.key`), with its value.
    fn own_field(&self, key: &str) -> Option<(String, &'a Node, Span)> {
        let (node, prefix) = self.own.as_ref()?;
        let (k, v) = node.entry(key)?;
        Some((format!("{prefix}.{key}"), v, k.span))
    }

    /// `sandbox.key` of the node's override block, else of the spec.
    fn sandbox_field(&self, key: &str) -> Option<(String, &'a Node, Span)> {
        self.sandbox_fields(key).into_iter().next()
    }

    /// Both `sandbox.key` blocks that are set (the node's and the spec's).
    fn sandbox_fields(&self, key: &str) -> Vec<(String, &'a Node, Span)> {
        let mut out = Vec::new();
        if let Some((node, prefix)) = &self.own {
            if let Some((k, v)) = node.get("sandbox").and_then(|s| s.entry(key)) {
                out.push((format!("{prefix}.sandbox.{key}"), v, k.span));
            }
        }
        if let Some((k, v)) = self.src.root.get("sandbox").and_then(|s| s.entry(key)) {
            out.push((format!("sandbox.{key}"), v, k.span));
        }
        out
    }

    /// The node's `llm.provider`, else the spec's, else where the default applies.
    fn provider_field(&self) -> (String, Span) {
        if let Some((node, prefix)) = &self.own {
            if let Some((k, _)) = node.get("llm").and_then(|l| l.entry("provider")) {
                return (format!("{prefix}.llm.provider"), k.span);
            }
        }
        if let Some((k, _)) = self.src.root.get("llm").and_then(|l| l.entry("provider")) {
            return ("llm.provider".into(), k.span);
        }
        match &self.own {
            Some((node, prefix)) => (
                format!("{prefix}.prompt (default `llm.provider: claude`)"),
                node.entry("prompt").map_or(node.span, |(k, _)| k.span),
            ),
            None => ("llm.provider".into(), self.src.root.span),
        }
    }

    /// The node's `llm.KEY`, else the spec's.
    fn llm_field(&self, key: &str) -> Option<(String, Span)> {
        if let Some((node, prefix)) = &self.own {
            if let Some((k, _)) = node.get("llm").and_then(|l| l.entry(key)) {
                return Some((format!("{prefix}.llm.{key}"), k.span));
            }
        }
        let (k, _) = self.src.root.get("llm").and_then(|l| l.entry(key))?;
        Some((format!("llm.{key}"), k.span))
    }

    /// The node's skills with their field paths and spans.
    fn skills(&self) -> Vec<(String, &'a Node)> {
        let Some((node, prefix)) = &self.own else {
            return Vec::new();
        };
        match node.get("skills").map(|s| &s.kind) {
            Some(NodeKind::Seq(items)) => items
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("{prefix}.skills[{i}]"), s))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// A field of a node that a host-side preparation step (an OCI pull) failed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeField<'f> {
    /// `sandbox.KEY` (the node's override, else the spec's).
    Sandbox(&'f str),
    /// The node's skill at this index.
    Skill(usize),
    /// The node's `llm.provider` (its own, else the spec's, else where the default applies).
    Provider,
    /// The node's `llm.KEY` (its own, else the spec's; else as [`NodeField::Provider`]).
    Llm(&'f str),
}

/// A [`Refusal`] for `field` of node `node`, located in the spec (the spec's root when the
/// field cannot be found).
pub fn locate(
    plan: &Plan,
    src: &SpecSource,
    node: &str,
    field: NodeField<'_>,
    message: String,
    help: &str,
) -> Refusal {
    let at = Located::of(src, plan.kind, node);
    let found = match field {
        NodeField::Sandbox(key) => at.sandbox_field(key).map(|(f, _, span)| (f, span)),
        NodeField::Skill(i) => at.skills().into_iter().nth(i).map(|(f, n)| (f, n.span)),
        NodeField::Provider => Some(at.provider_field()),
        NodeField::Llm(key) => Some(at.llm_field(key).unwrap_or_else(|| at.provider_field())),
    };
    let (name, span) = found.unwrap_or_else(|| {
        let name = match field {
            NodeField::Sandbox(key) => format!("sandbox.{key}"),
            NodeField::Skill(i) => format!("skills[{i}]"),
            NodeField::Provider => "llm.provider".into(),
            NodeField::Llm(key) => format!("llm.{key}"),
        };
        (name, src.root.span)
    });
    at.at(name, span, message, help)
}

const REMOVE_HELP: &str =
    "remove it from the spec (`voidbox validate` accepts it so that specs stay portable)";

/// Collects refusals keyed by field, so a spec-level field shared by many nodes is reported
/// once, naming every node that uses it.
#[derive(Default)]
struct Collector {
    by_field: BTreeMap<(usize, usize, String), (Refusal, Vec<String>)>,
}

impl Collector {
    fn add(&mut self, r: Refusal, node: &str) {
        let key = (r.line, r.column, r.field.clone());
        let entry = self.by_field.entry(key).or_insert_with(|| (r, Vec::new()));
        if !entry.1.iter().any(|n| n == node) {
            entry.1.push(node.to_string());
        }
    }

    fn finish(self, plan: &Plan) -> Vec<Refusal> {
        let many = plan.graph.node_count() > 1;
        self.by_field
            .into_values()
            .map(|(mut r, nodes)| {
                if many && !r.field.starts_with("pipeline.") && !r.field.starts_with("workflow.") {
                    let names: Vec<String> = nodes.iter().map(|n| format!("`{n}`")).collect();
                    let _ = write!(r.message, " (used by {})", names.join(", "));
                }
                r
            })
            .collect()
    }
}

/// Every field of the spec `apply` cannot carry out (independent of the guest image).
pub fn check_spec(plan: &Plan, src: &SpecSource, purpose: Purpose) -> Vec<Refusal> {
    let mut c = Collector::default();
    let root = &src.root;
    let whole = Located { src, own: None };
    let first = plan
        .graph
        .node_weights()
        .next()
        .map(|n| n.name.clone())
        .unwrap_or_default();
    // A malformed OTLP endpoint in the spec is refused where it is written.
    if let Some((_, v)) = root.entry("observe") {
        if let Some((k, NodeKind::Str(url))) = v.entry("otlp_endpoint").map(|(k, n)| (k, &n.kind)) {
            if let Err(e) = crate::observe::config::check_endpoint(url, "observe.otlp_endpoint") {
                c.add(
                    whole.at(
                        "observe.otlp_endpoint".into(),
                        k.span,
                        e,
                        "use an http:// or https:// URL such as http://localhost:4317 (gRPC) or http://localhost:4318 (HTTP)",
                    ),
                    &first,
                );
            }
        }
    }
    for n in plan.graph.node_weights() {
        let at = Located::of(src, plan.kind, &n.name);
        sandbox_refusals(&at, n, &mut c);
        node_refusals(&at, plan.kind, n, purpose, &mut c);
    }
    c.finish(plan)
}

fn sandbox_refusals(at: &Located<'_>, n: &PlanNode, c: &mut Collector) {
    use crate::sandbox::shares::MAX_SHARES;
    let sb = &n.sandbox;
    if sb.mounts.is_empty() {
        return;
    }
    let fields = at.sandbox_fields("mounts");
    if sb.mounts.len() > MAX_SHARES {
        if let Some((field, _, span)) = fields.first() {
            c.add(
                at.at(
                    field.clone(),
                    *span,
                    format!(
                        "{} mounts, more than the {MAX_SHARES} host directories a VM can share",
                        sb.mounts.len()
                    ),
                    "share a common parent directory instead of several siblings",
                ),
                &n.name,
            );
        }
    }
    // Each mount with its spec item, in the plan's order: the spec's, then the box's.
    let mut located: Vec<(String, &Node)> = Vec::new();
    for (field, v, _) in fields.iter().rev() {
        if let NodeKind::Seq(items) = &v.kind {
            located.extend(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| (format!("{field}[{i}]"), item)),
            );
        }
    }
    // Guest paths follow the share rule already: `validate` applies it.
    for (m, (field, item)) in sb.mounts.iter().zip(&located) {
        // A host path that exists must be a directory (a missing `rw` one is created).
        let host = std::path::Path::new(&m.host);
        if let Some(h) = item.get("host").filter(|_| host.exists() && !host.is_dir()) {
            c.add(
                at.at(
                    format!("{field}.host"),
                    h.span,
                    format!("mount host path {} is not a directory", host.display()),
                    "share the directory that holds it",
                ),
                &n.name,
            );
        }
    }
}

fn node_refusals(at: &Located<'_>, kind: Kind, n: &PlanNode, purpose: Purpose, c: &mut Collector) {
    if kind == Kind::Pipeline {
        for key in ["outputs", "inputs"] {
            if let Some((field, v, _)) = at.own_field(key) {
                if let NodeKind::Seq(items) = &v.kind {
                    for (i, item) in items.iter().enumerate() {
                        let Some(g) = item.get("guest") else { continue };
                        let Some(path) = g.as_str() else { continue };
                        if !artifact_path_ok(path) {
                            c.add(
                                at.at(
                                    format!("{field}[{i}].guest"),
                                    g.span,
                                    format!("artifact directory `{path}` is outside {} (the only guest directories files can be copied from and to)", ARTIFACT_ROOTS.join(" and ")),
                                    "use a directory under /workspace, for example `/workspace/output`",
                                ),
                                &n.name,
                            );
                        }
                    }
                }
            }
        }
    }
    let Action::Agent(_) = &n.action else {
        return;
    };
    if kind == Kind::Agent {
        if let Some((field, v, span)) = at.own_field("mode") {
            // `voidbox shell` is where an interactive agent runs.
            if v.as_str() == Some("interactive") && purpose != Purpose::Shell {
                c.add(
                    at.at(
                        field,
                        span,
                        "`mode: interactive` is `voidbox shell`'s (apply runs `task` and `service`)"
                            .into(),
                        "run it with `voidbox shell SPEC`, or remove `mode:` to run it as a task",
                    ),
                    &n.name,
                );
            }
        }
        if let Some((field, v, span)) = at.own_field("messaging") {
            if matches!(
                v.get("enabled").map(|e| &e.kind),
                Some(NodeKind::Bool(true))
            ) {
                c.add(
                    at.at(
                        field,
                        span,
                        "agent `messaging` is not provided yet".into(),
                        REMOVE_HELP,
                    ),
                    &n.name,
                );
            }
        }
    }
    for (field, s) in at.skills() {
        let refuse = match &s.kind {
            NodeKind::Str(text) => match parse_skill(text) {
                Ok(SkillRef::Mcp(_)) => Some(crate::kit::MCP_NAME_ONLY),
                Ok(SkillRef::Agent(name)) if !crate::validate::runtimes::is_known(name) => {
                    Some("this `agent:` runtime is unknown (known: `claude-code`, `codex`)")
                }
                _ => None,
            },
            _ => None,
        };
        if let Some(why) = refuse {
            c.add(at.at(field, s.span, why.into(), REMOVE_HELP), &n.name);
        }
    }
}

/// Whether `path` is an absolute guest path under [`ARTIFACT_ROOTS`] without `..`.
pub fn artifact_path_ok(path: &str) -> bool {
    path.starts_with('/')
        && !path.split('/').any(|c| c == "..")
        && !path.contains('\0')
        && ARTIFACT_ROOTS.iter().any(|r| {
            path.strip_prefix(r)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
}

/// The fields that depend on the guest image: `run.program`s
/// ([`crate::validate::programs::missing`]) and `cli:` skills whose program is not on the
/// image's `PATH`, and spec-named snapshots that cannot restore their node.
pub fn check_image(plan: &Plan, src: &SpecSource, facts: &ImageFacts<'_>) -> Vec<Refusal> {
    let mut c = Collector::default();
    if let Some(programs) = facts.path_programs {
        for (field, d) in crate::validate::programs::missing(&src.root, programs) {
            let (line, column) = crate::diagnostic::line_col(&src.text, d.span.offset);
            let r = Refusal {
                field,
                line,
                column,
                message: d.message,
                help: d.help.unwrap_or_default(),
            };
            c.add(r, &plan.name);
        }
    }
    for n in plan.graph.node_weights() {
        let at = Located::of(src, plan.kind, &n.name);
        if let (Action::Agent(_), Some(programs)) = (&n.action, facts.path_programs) {
            for (field, s) in at.skills() {
                if let Some(Ok(SkillRef::Cli(tool))) = s.as_str().map(parse_skill) {
                    if !programs.contains(tool) {
                        c.add(
                            at.at(
                                field,
                                s.span,
                                format!("`cli:{tool}`: `{tool}` is not on the guest image's PATH"),
                                "remove the skill, or use a program the image ships (`voidbox image ls` shows the image)",
                            ),
                            &n.name,
                        );
                    }
                }
            }
        }
        if let (Some(check), Some(named)) = (facts.snapshot, n.sandbox.snapshot.as_deref()) {
            if let Err(why) = check(n, named) {
                if let Some((field, _, span)) = at.sandbox_field("snapshot") {
                    let (msg, help) = match why.split_once("\n  help: ") {
                        Some((m, h)) => (m.to_string(), h.to_string()),
                        None => (why.clone(), "remove `snapshot:`, or create a matching snapshot with `voidbox snapshot create`".into()),
                    };
                    c.add(at.at(field, span, msg, &help), &n.name);
                }
            }
        }
    }
    c.finish(plan)
}

/// An interactive sandbox (no `run:`) has nothing for `apply` to execute (exit 2).
pub fn nothing_to_run(plan: &Plan) -> Option<String> {
    plan.graph
        .node_weights()
        .find(|n| matches!(n.action, Action::Shell))
        .map(|n| format!(
            "error: `{}` is an interactive sandbox (no `run:`), so `apply` has nothing to execute\n  help: add `run:`, or open it with `voidbox shell SPEC`",
            n.name
        ))
}

/// Renders refusals for stderr: one `error: FILE:LINE:COL: FIELD: message` block each, then a
/// summary line.
pub fn render(src: &SpecSource, refusals: &[Refusal]) -> String {
    let mut s = String::new();
    for r in refusals {
        let _ = writeln!(
            s,
            "error: {}:{}:{}: `{}`: {}\n  help: {}",
            src.path, r.line, r.column, r.field, r.message, r.help
        );
    }
    let n = refusals.len();
    let _ = writeln!(
        s,
        "error: `{}` refuses {} (field{} above); nothing was started",
        src.command,
        src.path,
        if n == 1 { "" } else { "s" }
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::validate_source;
    use std::path::Path;

    fn refusals(text: &str) -> Vec<Refusal> {
        let v = validate_source("t.yaml", text.to_string(), Path::new("/"));
        let spec = v
            .spec
            .unwrap_or_else(|| panic!("invalid: {:?}", v.report.diagnostics));
        let plan = Plan::compile(&spec, Path::new("/")).expect("plan");
        let src = SpecSource::parse("t.yaml", text).expect("parse");
        check_spec(&plan, &src, Purpose::Run)
    }

    fn sandbox(sb: &str) -> Vec<Refusal> {
        refusals(&format!(
            "kind: sandbox\nname: s\nsandbox: {sb}\nrun: {{program: echo}}\n"
        ))
    }

    #[test]
    fn refuses_sandbox_features_with_field_and_line() {
        assert!(sandbox("{memory_mb: 128}").is_empty());
        assert!(sandbox("{snapshot: abc, network: false}").is_empty());
        // Host directories are shared (virtio-9p), within the VM's share slots and guest
        // path rules.
        assert!(sandbox("{mounts: [{host: /, guest: /mnt}]}").is_empty());
        // A guest path the guest cannot mount never gets here: `validate` refuses it.
        let v = validate_source(
            "t.yaml",
            "kind: sandbox\nname: s\nsandbox: {mounts: [{host: /, guest: /proc/x}]}\nrun: {program: echo}\n".into(),
            Path::new("/"),
        );
        assert!(v.spec.is_none());
        assert!(v.report.diagnostics[0]
            .message
            .contains("must not be inside /proc"));
        let r =
            sandbox("{mounts: [{host: /, guest: /mnt}, {host: /etc/passwd, guest: /workspace/h}]}");
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].field, "sandbox.mounts[1].host");
        assert!(r[0].message.contains("is not a directory"), "{r:?}");
        let five = (0..5)
            .map(|i| format!("{{host: /, guest: /workspace/m{i}}}"))
            .collect::<Vec<_>>()
            .join(", ");
        let r = sandbox(&format!("{{mounts: [{five}]}}"));
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].field, "sandbox.mounts");
        // OCI root filesystems and boot files are provided (pulled before anything starts).
        assert!(sandbox("{image: 'alpine:3.20', guest_image: 'x:1'}").is_empty());
        // Every provider is carried out (a missing key is refused when `apply` resolves
        // the endpoint, with the environment at hand).
        assert!(refusals("kind: agent\nname: a\nagent: {prompt: hi}\n").is_empty());
    }

    #[test]
    fn network_in_both_forms_is_provided() {
        assert!(sandbox("{network: true}").is_empty());
        assert!(
            sandbox("{network: {allow_host_ports: [11434], deny: [198.51.100.0/24]}}").is_empty()
        );
        let text = "kind: pipeline\nname: p\nsandbox:\n  network: {allow_domains: [api.github.com]}\npipeline:\n  boxes:\n    - {name: a, run: {program: echo}, sandbox: {network: false}}\n    - {name: b, run: {program: echo}, sandbox: {network: true, mounts: [{host: /, guest: /m}]}}\n";
        let r = refusals(text);
        assert!(r.is_empty(), "{r:?}");
    }

    #[test]
    fn credential_proxy_is_accepted_either_way() {
        // The gateway is how every real runtime reaches its model: `true` asks for what
        // happens anyway, `false` cannot turn it off (the key never enters the guest).
        for v in ["true", "false"] {
            let text = format!("kind: agent\nname: a\nllm: {{provider: claude, credential_proxy: {v}}}\nagent: {{prompt: hi}}\n");
            assert!(refusals(&text).is_empty(), "{v}");
        }
    }

    #[test]
    fn artifact_paths_must_be_reachable() {
        assert!(artifact_path_ok("/workspace/output"));
        assert!(artifact_path_ok("/home/sandbox/x"));
        assert!(!artifact_path_ok("/tmp/out"));
        assert!(!artifact_path_ok("/workspacex"));
        assert!(!artifact_path_ok("/workspace/../etc"));
        let text = "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: a\n      run: {program: echo}\n      outputs: [{name: o, guest: /tmp/o}]\n";
        let r = refusals(text);
        assert_eq!(r[0].field, "pipeline.boxes[0].outputs[0].guest");
        assert_eq!(r[0].line, 7);
    }

    #[test]
    fn image_facts_refuse_missing_tools_and_snapshots() {
        // `awk` is in every guest image, so `validate` accepts it whether or not an image is
        // cached here; the facts below say the image lacks it.
        let text = "kind: agent\nname: a\nllm: {provider: mock}\nsandbox: {snapshot: abc}\nagent: {prompt: hi, skills: [\"cli:sh\", \"cli:awk\"]}\n";
        let v = validate_source("t.yaml", text.to_string(), Path::new("/"));
        let plan = Plan::compile(&v.spec.expect("valid"), Path::new("/")).expect("plan");
        let src = SpecSource::parse("t.yaml", text).expect("parse");
        let programs: BTreeSet<String> = ["sh".to_string()].into();
        let snap = |_: &PlanNode, v: &str| Err(format!("sandbox.snapshot `{v}`: not found"));
        let facts = ImageFacts {
            path_programs: Some(&programs),
            snapshot: Some(&snap),
        };
        let r = check_image(&plan, &src, &facts);
        let fields: Vec<&str> = r.iter().map(|r| r.field.as_str()).collect();
        assert_eq!(fields, ["sandbox.snapshot", "agent.skills[1]"]);
        let text = render(&src, &r);
        assert!(text.contains("error: t.yaml:5:"), "{text}");
        assert!(text.contains("nothing was started"), "{text}");
    }

    #[test]
    fn image_facts_refuse_a_run_program_the_image_lacks() {
        // `validate` never checks it (the image differs per machine); `apply` does, at the
        // value. `codex` comes with the runtimes disk.
        let text = "kind: workflow\nname: w\nworkflow:\n  steps:\n    - name: a\n      run: {program: codex}\n    - name: b\n      run: {program: ehco}\n";
        let v = validate_source("t.yaml", text.to_string(), Path::new("/"));
        let plan = Plan::compile(&v.spec.expect("valid"), Path::new("/")).expect("plan");
        let src = SpecSource::parse("t.yaml", text).expect("parse");
        let programs: BTreeSet<String> = ["sh".to_string(), "echo".to_string()].into();
        let facts = ImageFacts {
            path_programs: Some(&programs),
            snapshot: None,
        };
        let r = check_image(&plan, &src, &facts);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].field, "workflow.steps[1].run.program");
        assert_eq!((r[0].line, r[0].column), (8, 22));
        assert_eq!(
            r[0].message,
            "program `ehco` is not on the guest image's PATH"
        );
        assert!(r[0].help.contains("did you mean `echo`?"), "{}", r[0].help);
        let none = ImageFacts {
            path_programs: None,
            snapshot: None,
        };
        assert!(check_image(&plan, &src, &none).is_empty());
    }
}
