//! The execution plan: every spec kind compiled into one petgraph DAG.
//!
//! Nodes are boxes / steps with their resolved settings (sandbox defaults merged with per-box
//! overrides, host paths made absolute); edges carry data flow. Pipelines record their stages
//! and fan-out groups, whose outputs are merged as JSON arrays in declaration order.

pub mod render;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::host_path::{resolve, Resolved};
use crate::limits::Timeout;
use crate::model::{
    Agent, AgentMode, BoxInput, BoxOutput, Command, Kind, Llm, Mount, MountMode, OnFailure,
    Provider, ResourceLimits, Sandbox, SandboxMode, SandboxOverride, SkillEntry, Spec, Stage,
    StepMode,
};

/// A compiled spec.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The spec's name.
    pub name: String,
    /// The spec's kind.
    pub kind: Kind,
    /// Nodes and data-flow edges.
    pub graph: DiGraph<PlanNode, Edge>,
    /// Parallel fan-out groups, members in declaration order.
    pub groups: Vec<Vec<NodeIndex>>,
    /// Where the final output comes from.
    pub output: Output,
    /// Failure policy.
    pub on_failure: OnFailure,
    /// Wall-clock limit for the whole run.
    pub timeout_secs: Option<u64>,
    /// `sandbox.mode` of the spec.
    pub mode: SandboxMode,
    /// Directory relative paths (skills, mounts) resolve against.
    pub spec_dir: PathBuf,
    /// The spec's `observe` block (carried out by the engine's `observe`).
    pub observe: Option<crate::model::Observe>,
}

/// One node: one fresh micro-VM.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanNode {
    /// Box or step name (unique in the plan).
    pub name: String,
    /// What runs in the VM.
    pub action: Action,
    /// VM settings after merging overrides.
    pub sandbox: NodeSandbox,
    /// Its own time limit in seconds (see [`PlanNode::timeout`] for the effective one).
    pub timeout_secs: Option<u64>,
    /// Retries after a failed attempt.
    pub retries: u32,
    /// Where the node's input comes from.
    pub input: Input,
    /// The fan-out group the node belongs to.
    pub group: Option<usize>,
    /// Named artifact directories (pipeline boxes' `outputs` / `inputs`).
    pub artifacts: NodeArtifacts,
    /// Set for a `mode: service` node: long-running, with no timeout of its own.
    pub service: Option<ServiceSettings>,
}

/// How a service node becomes ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSettings {
    /// Ready when each of these TCP ports accepts a connection in its VM (empty: when its
    /// process started, or, for an agent, when its output file appears); also the ports its
    /// dependents may reach.
    pub ports: Vec<u16>,
    /// The bound on becoming ready, in seconds.
    pub ready_timeout_secs: u64,
}

/// A service's readiness bound without `ready_timeout_secs`.
pub const DEFAULT_READY_TIMEOUT_SECS: u64 = 300;

impl ServiceSettings {
    fn new(ports: &[u16], ready_timeout_secs: Option<u64>) -> ServiceSettings {
        ServiceSettings {
            ports: ports.to_vec(),
            ready_timeout_secs: ready_timeout_secs.unwrap_or(DEFAULT_READY_TIMEOUT_SECS),
        }
    }
}

/// A box's named artifact directories (void-box `outputs` / `inputs`), copied between VMs
/// by the engine's `apply`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeArtifacts {
    /// Directories copied out of the VM when the box succeeds.
    pub outputs: Vec<BoxOutput>,
    /// Earlier boxes' outputs written into the VM before the command starts.
    pub inputs: Vec<BoxInput>,
}

impl PlanNode {
    /// The node's effective time limit: its `timeout_secs`, else the default node timeout (a
    /// service's: the longest a command may run, [`Timeout::service`]).
    pub fn timeout(&self) -> Timeout {
        match (&self.service, self.timeout_secs) {
            (Some(_), None) => Timeout::service(),
            _ => Timeout::node(self.timeout_secs),
        }
    }
}

/// What a node runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A program.
    Command(Command),
    /// An LLM agent with a prompt.
    Agent(AgentAction),
    /// An interactive environment (`kind: sandbox` without `run`): nothing to execute.
    Shell,
}

/// An agent node's resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentAction {
    /// The task.
    pub prompt: String,
    /// Skills to install.
    pub skills: Vec<SkillEntry>,
    /// Instruction files for the runtime, in order, resolved like `file:` skills.
    pub prompt_files: Vec<PathBuf>,
    /// The LLM (the node's, else the spec's, else Claude).
    pub llm: Llm,
    /// Guest file the agent writes its result to.
    pub output_file: Option<String>,
    /// How the agent runs.
    pub mode: AgentMode,
}

/// A node's VM settings.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSandbox {
    /// Guest memory in MiB.
    pub memory_mb: u64,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// The NAT policy of the node's network device (the box's `network`, else the spec's;
    /// the box's replaces the spec's entirely); `None`: no network device.
    pub network: Option<voidbox_net::NetworkPolicy>,
    /// Environment (an empty value means "copy the host's value at run time").
    pub env: BTreeMap<String, String>,
    /// Mounts with resolved host paths (spec-relative, else working-directory-relative).
    pub mounts: Vec<Mount>,
    /// Host directories of `rw` mounts that did not exist when the plan was made: created
    /// when the node starts (as void-box does).
    pub create_mount_dirs: Vec<PathBuf>,
    /// OCI root filesystem image.
    pub image: Option<String>,
    /// Guest kernel image override (absolute).
    pub kernel: Option<PathBuf>,
    /// Initramfs override (absolute).
    pub initramfs: Option<PathBuf>,
    /// OCI image holding a kernel and an initramfs (void-box's `guest_image`).
    pub guest_image: Option<String>,
    /// Snapshot to restore from.
    pub snapshot: Option<String>,
    /// Extra programs the guest may start besides the node's own (the box's list, else the
    /// spec's).
    pub allowed_commands: Vec<String>,
    /// Resource limits set by the spec or the box (the box's win field by field); unset
    /// ones get the guest defaults ([`ResourceLimits::DEFAULT`]).
    pub limits: ResourceLimits,
}

/// Where a node's input comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// The run's input (`--input`), if any.
    RunInput,
    /// Another node's output.
    Node(NodeIndex),
    /// A fan-out group's outputs merged into a JSON array in declaration order.
    Group(usize),
    /// Workflow dependencies: `input.json` is the `stdin` step's output when set, else the only
    /// dependency's output, else an object keyed by dependency name.
    Steps {
        /// Dependencies in `depends_on` order.
        deps: Vec<NodeIndex>,
        /// The dependency piped to stdin.
        stdin: Option<NodeIndex>,
    },
}

/// Where the plan's final output comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// One node's output.
    Node(NodeIndex),
    /// A fan-out group's merged array.
    Group(usize),
    /// Several final workflow steps, merged as a JSON array in declaration order.
    Merge(Vec<NodeIndex>),
}

/// A data-flow edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// Sequential stage: the whole output flows on.
    Pipe,
    /// A fan-out member's output becomes element `index` of the merged array.
    Merge {
        /// Position in the merged array.
        index: usize,
    },
    /// A workflow dependency.
    DependsOn,
    /// A workflow dependency whose output is piped to stdin.
    Stdin,
}

/// Why a spec could not be compiled (validation normally catches all of these first).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A required block is missing.
    #[error("`kind: {0}` requires a `{1}:` block")]
    MissingSection(&'static str, &'static str),
    /// A name is referenced but not declared.
    #[error("unknown {0} `{1}`")]
    Unknown(&'static str, String),
    /// The workflow has a cycle.
    #[error("dependency cycle involving `{0}`")]
    Cycle(String),
}

impl Plan {
    /// `true` for a service the run stops when its dependents are done (a sidecar); a
    /// service without dependents, or the workflow's `output_step`, runs in the foreground
    /// until it exits.
    pub fn is_sidecar(&self, idx: NodeIndex) -> bool {
        self.graph[idx].service.is_some()
            && self
                .graph
                .neighbors_directed(idx, Direction::Outgoing)
                .next()
                .is_some()
            && !matches!(self.output, Output::Node(n) if n == idx)
    }

    /// Compiles a validated spec. `spec_dir` is the directory relative paths resolve against.
    pub fn compile(spec: &Spec, spec_dir: &Path) -> Result<Plan, PlanError> {
        let mut b = Builder {
            spec,
            dir: spec_dir,
            graph: DiGraph::new(),
            groups: Vec::new(),
        };
        let output = match spec.kind {
            Kind::Agent => b.agent()?,
            Kind::Sandbox => b.sandbox_kind(),
            Kind::Pipeline => b.pipeline()?,
            Kind::Workflow => b.workflow()?,
        };
        if petgraph::algo::is_cyclic_directed(&b.graph) {
            let name = b
                .graph
                .node_weights()
                .next()
                .map(|n| n.name.clone())
                .unwrap_or_default();
            return Err(PlanError::Cycle(name));
        }
        Ok(Plan {
            name: spec.name.clone(),
            kind: spec.kind,
            graph: b.graph,
            groups: b.groups,
            output,
            on_failure: spec.on_failure,
            timeout_secs: spec.timeout_secs,
            mode: spec.sandbox.mode,
            spec_dir: spec_dir.to_path_buf(),
            observe: spec.observe.clone(),
        })
    }

    /// Nodes grouped by depth: level 0 has no inputs, level n depends on level < n.
    /// Within a level, nodes are in declaration order.
    pub fn levels(&self) -> Vec<Vec<NodeIndex>> {
        let mut depth: HashMap<NodeIndex, usize> = HashMap::new();
        let order = petgraph::algo::toposort(&self.graph, None).unwrap_or_default();
        for n in &order {
            let d = self
                .graph
                .edges_directed(*n, Direction::Incoming)
                .map(|e| depth.get(&e.source()).map_or(0, |d| d + 1))
                .max()
                .unwrap_or(0);
            depth.insert(*n, d);
        }
        let max = depth.values().copied().max().map_or(0, |m| m + 1);
        let mut levels = vec![Vec::new(); max];
        for n in self.graph.node_indices() {
            if let Some(d) = depth.get(&n) {
                levels[*d].push(n);
            }
        }
        levels
    }

    /// The plan of node `idx` alone, as a node runner runs it (`voidbox apply --node`): no
    /// edges, no group, the run's input as its input, its output the plan's output; the
    /// spec-wide settings (failure policy, deadline, mode, observe) stay. A service in it runs
    /// in the foreground.
    pub fn only(&self, idx: NodeIndex) -> Plan {
        let mut graph = DiGraph::new();
        let mut node = self.graph[idx].clone();
        node.input = Input::RunInput;
        node.group = None;
        let one = graph.add_node(node);
        Plan {
            name: self.name.clone(),
            kind: self.kind,
            graph,
            groups: Vec::new(),
            output: Output::Node(one),
            on_failure: self.on_failure,
            timeout_secs: self.timeout_secs,
            mode: self.mode,
            spec_dir: self.spec_dir.clone(),
            observe: self.observe.clone(),
        }
    }

    /// The nodes `idx` takes data from or waits for (its incoming edges' sources), each once,
    /// in declaration order.
    pub fn upstream(&self, idx: NodeIndex) -> Vec<NodeIndex> {
        let mut out: Vec<NodeIndex> = self
            .graph
            .neighbors_directed(idx, Direction::Incoming)
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<NodeIndex> {
        self.graph
            .node_indices()
            .find(|i| self.graph[*i].name == name)
    }
}

struct Builder<'a> {
    spec: &'a Spec,
    dir: &'a Path,
    graph: DiGraph<PlanNode, Edge>,
    groups: Vec<Vec<NodeIndex>>,
}

impl Builder<'_> {
    /// The node's VM settings: the box's override, else the spec's, else the defaults (an
    /// `agent` node gets [`DEFAULT_AGENT_MEMORY_MB`](crate::limits::DEFAULT_AGENT_MEMORY_MB)).
    fn resolve_sandbox(&self, over: Option<&SandboxOverride>, agent: bool) -> NodeSandbox {
        let base: &Sandbox = &self.spec.sandbox;
        let default_memory_mb = if agent {
            crate::limits::DEFAULT_AGENT_MEMORY_MB
        } else {
            u64::from(crate::limits::DEFAULT_RUN_MEMORY_MB)
        };
        let abs = |p: &str| resolve(self.dir, p).into_path();
        let mut env = base.env.clone();
        let mut mounts = base.mounts.clone();
        if let Some(o) = over {
            env.extend(o.env.clone());
            mounts.extend(o.mounts.clone());
        }
        let mut create_mount_dirs = Vec::new();
        for m in &mut mounts {
            let host = resolve(self.dir, &m.host);
            if matches!(host, Resolved::Missing(_)) && m.mode == MountMode::Rw {
                create_mount_dirs.push(host.path().to_path_buf());
            }
            m.host = host.path().to_string_lossy().into_owned();
        }
        NodeSandbox {
            memory_mb: over
                .and_then(|o| o.memory_mb)
                .or(base.memory_mb)
                .unwrap_or(default_memory_mb),
            vcpus: over.and_then(|o| o.vcpus).unwrap_or(base.vcpus),
            network: over
                .and_then(|o| o.network.as_ref())
                .unwrap_or(&base.network)
                .policy(),
            env,
            mounts,
            create_mount_dirs,
            image: over
                .and_then(|o| o.image.clone())
                .or_else(|| base.image.clone()),
            kernel: base.kernel.as_deref().map(abs),
            initramfs: base.initramfs.as_deref().map(abs),
            guest_image: base.guest_image.clone().filter(|g| !g.is_empty()),
            snapshot: over
                .and_then(|o| o.snapshot.clone())
                .or_else(|| base.snapshot.clone()),
            allowed_commands: over
                .and_then(|o| o.allowed_commands.clone())
                .or_else(|| base.allowed_commands.clone())
                .unwrap_or_default(),
            limits: merge_limits(base.limits, over.and_then(|o| o.limits)),
        }
    }

    fn llm(&self, own: Option<&Llm>) -> Llm {
        own.or(self.spec.llm.as_ref()).cloned().unwrap_or(Llm {
            provider: Provider::Claude,
            model: None,
            base_url: None,
            api_key_env: None,
            credential_proxy: false,
        })
    }

    /// The skills with each `file:` path that resolves only against the working directory
    /// rewritten to that absolute path, so `apply` reads what `validate` checked.
    fn skills(&self, skills: &[SkillEntry]) -> Vec<SkillEntry> {
        skills
            .iter()
            .map(|s| match s {
                SkillEntry::Simple(text) => {
                    match text.strip_prefix("file:").map(|rel| resolve(self.dir, rel)) {
                        Some(Resolved::Cwd { cwd, .. }) => match cwd.to_str() {
                            Some(p) => SkillEntry::Simple(format!("file:{p}")),
                            None => s.clone(),
                        },
                        _ => s.clone(),
                    }
                }
                _ => s.clone(),
            })
            .collect()
    }

    /// Host paths of `prompt_files`, resolved like `file:` skills.
    fn prompt_files(&self, files: &[String]) -> Vec<PathBuf> {
        files
            .iter()
            .map(|rel| resolve(self.dir, rel).into_path())
            .collect()
    }

    fn add(&mut self, node: PlanNode) -> NodeIndex {
        self.graph.add_node(node)
    }

    fn agent(&mut self) -> Result<Output, PlanError> {
        let agent: &Agent = self
            .spec
            .agent
            .as_ref()
            .ok_or(PlanError::MissingSection("agent", "agent"))?;
        let node = PlanNode {
            name: self.spec.name.clone(),
            action: Action::Agent(AgentAction {
                prompt: agent.prompt.clone(),
                skills: self.skills(&agent.skills),
                prompt_files: self.prompt_files(&agent.prompt_files),
                llm: self.llm(None),
                output_file: agent.output_file.clone(),
                mode: agent.mode,
            }),
            sandbox: self.resolve_sandbox(None, true),
            timeout_secs: agent.timeout_secs,
            retries: agent.retries.or(self.spec.retries).unwrap_or(0),
            input: Input::RunInput,
            group: None,
            artifacts: NodeArtifacts::default(),
            service: (agent.mode == AgentMode::Service).then(|| ServiceSettings::new(&[], None)),
        };
        Ok(Output::Node(self.add(node)))
    }

    fn sandbox_kind(&mut self) -> Output {
        let node = PlanNode {
            name: self.spec.name.clone(),
            action: self.spec.run.clone().map_or(Action::Shell, Action::Command),
            sandbox: self.resolve_sandbox(None, false),
            timeout_secs: None,
            retries: self.spec.retries.unwrap_or(0),
            input: Input::RunInput,
            group: None,
            artifacts: NodeArtifacts::default(),
            service: None,
        };
        Output::Node(self.add(node))
    }

    fn pipeline(&mut self) -> Result<Output, PlanError> {
        let pipeline = self
            .spec
            .pipeline
            .as_ref()
            .ok_or(PlanError::MissingSection("pipeline", "pipeline"))?;
        let stages: Vec<Stage> = if pipeline.stages.is_empty() {
            pipeline
                .boxes
                .iter()
                .map(|b| Stage::Box {
                    name: b.name.clone(),
                })
                .collect()
        } else {
            pipeline.stages.clone()
        };
        let mut prev: Option<Output> = None;
        for stage in &stages {
            let members: Vec<&str> = match stage {
                Stage::Box { name } => vec![name.as_str()],
                Stage::FanOut { boxes } => boxes.iter().map(String::as_str).collect(),
            };
            let group = matches!(stage, Stage::FanOut { .. }).then_some(self.groups.len());
            let input = match &prev {
                None => Input::RunInput,
                Some(Output::Node(n)) => Input::Node(*n),
                Some(Output::Group(g)) => Input::Group(*g),
                Some(Output::Merge(_)) => Input::RunInput,
            };
            let mut indices = Vec::new();
            for name in members {
                let b = pipeline
                    .boxes
                    .iter()
                    .find(|b| b.name == name)
                    .ok_or_else(|| PlanError::Unknown("box", name.to_string()))?;
                let action = match (&b.run, &b.prompt) {
                    (Some(cmd), _) => Action::Command(cmd.clone()),
                    (None, Some(prompt)) => Action::Agent(AgentAction {
                        prompt: prompt.clone(),
                        skills: self.skills(&b.skills),
                        prompt_files: self.prompt_files(&b.prompt_files),
                        llm: self.llm(b.llm.as_ref()),
                        output_file: None,
                        mode: AgentMode::Task,
                    }),
                    (None, None) => {
                        return Err(PlanError::Unknown("action of box", name.to_string()))
                    }
                };
                let agent = matches!(action, Action::Agent(_));
                let service = (b.mode == Some(StepMode::Service))
                    .then(|| ServiceSettings::new(&b.ports, b.ready_timeout_secs));
                let node = PlanNode {
                    name: b.name.clone(),
                    action,
                    sandbox: self.resolve_sandbox(b.sandbox.as_ref(), agent),
                    timeout_secs: b.timeout_secs,
                    // A service is not retried (`validate` refuses its own `retries`).
                    retries: match service {
                        Some(_) => 0,
                        None => b.retries.or(self.spec.retries).unwrap_or(0),
                    },
                    input: input.clone(),
                    group,
                    artifacts: NodeArtifacts {
                        outputs: b.outputs.clone(),
                        inputs: b.inputs.clone(),
                    },
                    service,
                };
                let idx = self.add(node);
                match &prev {
                    Some(Output::Node(p)) => {
                        self.graph.add_edge(*p, idx, Edge::Pipe);
                    }
                    Some(Output::Group(g)) => {
                        for (i, m) in self.groups[*g].clone().into_iter().enumerate() {
                            self.graph.add_edge(m, idx, Edge::Merge { index: i });
                        }
                    }
                    _ => {}
                }
                indices.push(idx);
            }
            prev = Some(match group {
                Some(g) => {
                    self.groups.push(indices);
                    Output::Group(g)
                }
                None => Output::Node(indices[0]),
            });
        }
        prev.ok_or(PlanError::MissingSection("pipeline", "pipeline.boxes"))
    }

    fn workflow(&mut self) -> Result<Output, PlanError> {
        let wf = self
            .spec
            .workflow
            .as_ref()
            .ok_or(PlanError::MissingSection("workflow", "workflow"))?;
        let mut index: HashMap<&str, NodeIndex> = HashMap::new();
        for step in &wf.steps {
            let cmd = Command {
                program: step.run.program.clone(),
                args: step.run.args.clone(),
                env: step.run.env.clone(),
                workdir: step.run.workdir.clone(),
            };
            let service = (step.mode == Some(StepMode::Service))
                .then(|| ServiceSettings::new(&step.ports, step.ready_timeout_secs));
            let node = PlanNode {
                name: step.name.clone(),
                action: Action::Command(cmd),
                sandbox: self.resolve_sandbox(step.sandbox.as_ref(), false),
                timeout_secs: step.timeout_secs,
                // A service is not retried (`validate` refuses its own `retries`).
                retries: match service {
                    Some(_) => 0,
                    None => step.retries.or(self.spec.retries).unwrap_or(0),
                },
                input: Input::RunInput,
                group: None,
                artifacts: NodeArtifacts::default(),
                service,
            };
            index.insert(step.name.as_str(), self.add(node));
        }
        let lookup = |n: &str| {
            index
                .get(n)
                .copied()
                .ok_or_else(|| PlanError::Unknown("step", n.to_string()))
        };
        for step in &wf.steps {
            let me = lookup(&step.name)?;
            let stdin = step.stdin_source().map(lookup).transpose()?;
            let mut deps = Vec::new();
            for d in &step.depends_on {
                let dep = lookup(d)?;
                if deps.contains(&dep) {
                    continue;
                }
                let edge = if Some(dep) == stdin {
                    Edge::Stdin
                } else {
                    Edge::DependsOn
                };
                self.graph.add_edge(dep, me, edge);
                deps.push(dep);
            }
            if !deps.is_empty() {
                self.graph[me].input = Input::Steps { deps, stdin };
            }
        }
        if let Some(out) = &wf.output_step {
            return Ok(Output::Node(lookup(out)?));
        }
        let sinks: Vec<NodeIndex> = self
            .graph
            .node_indices()
            .filter(|n| {
                self.graph
                    .edges_directed(*n, Direction::Outgoing)
                    .next()
                    .is_none()
            })
            .collect();
        Ok(match sinks.as_slice() {
            [one] => Output::Node(*one),
            _ => Output::Merge(sinks),
        })
    }
}

/// The spec's limits with the box's laid over them, field by field.
fn merge_limits(base: Option<ResourceLimits>, over: Option<ResourceLimits>) -> ResourceLimits {
    let (b, o) = (base.unwrap_or_default(), over.unwrap_or_default());
    ResourceLimits {
        nofile: o.nofile.or(b.nofile),
        nproc: o.nproc.or(b.nproc),
        fsize_mb: o.fsize_mb.or(b.fsize_mb),
        address_space_mb: o.address_space_mb.or(b.address_space_mb),
    }
}

impl NodeSandbox {
    /// Mounts as `host:guest:mode` strings (for display).
    pub fn mount_summary(&self) -> Vec<String> {
        self.mounts
            .iter()
            .map(|m| {
                let mode = match m.mode {
                    MountMode::Ro => "ro",
                    MountMode::Rw => "rw",
                };
                format!("{}:{}:{mode}", m.host, m.guest)
            })
            .collect()
    }
}

/// Test helper (this crate's tests and the engine's): validates the spec text `src` and
/// compiles it (host paths against `/specs`), panicking with the diagnostics when it is
/// invalid.
#[doc(hidden)]
pub fn compile_for_test(src: &str) -> Plan {
    let v = crate::validate::validate_source("t.yaml", src.to_string(), Path::new("."));
    let spec = v
        .spec
        .unwrap_or_else(|| panic!("{:?}", v.report.diagnostics));
    Plan::compile(&spec, Path::new("/specs")).expect("compiles")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{TimeoutLimit, DEFAULT_NODE_TIMEOUT_SECS};
    use crate::validate::validate_source;

    fn compile(src: &str, dir: &Path) -> Plan {
        let v = validate_source("t.yaml", src.to_string(), dir);
        let spec = v
            .spec
            .unwrap_or_else(|| panic!("{:?}", v.report.diagnostics));
        Plan::compile(&spec, dir).expect("plan")
    }

    #[test]
    fn host_paths_resolve_like_validate_resolves_them() {
        // The test's working directory (the crate) holds Cargo.toml and src/; the spec
        // directory holds `here/` only.
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(dir.path().join("here")).expect("mkdir");
        let src = "kind: agent\nname: a\nllm: {provider: mock}\nsandbox:\n  mounts:\n    - {host: here, guest: /a}\n    - {host: src, guest: /b}\n    - {host: new-out, guest: /c, mode: rw}\nagent:\n  prompt: hi\n  skills: [\"file:Cargo.toml\"]\n";
        let plan = compile(src, dir.path());
        let node = plan.graph.node_weights().next().expect("node");
        let cwd = std::env::current_dir().expect("cwd");
        let hosts: Vec<&str> = node
            .sandbox
            .mounts
            .iter()
            .map(|m| m.host.as_str())
            .collect();
        assert_eq!(hosts[0], dir.path().join("here").to_string_lossy());
        assert_eq!(hosts[1], cwd.join("src").to_string_lossy());
        assert_eq!(hosts[2], dir.path().join("new-out").to_string_lossy());
        assert_eq!(node.sandbox.create_mount_dirs, [dir.path().join("new-out")]);
        let Action::Agent(a) = &node.action else {
            panic!("agent")
        };
        assert_eq!(
            a.skills,
            [SkillEntry::Simple(format!(
                "file:{}",
                cwd.join("Cargo.toml").display()
            ))]
        );
    }

    #[test]
    fn each_node_carries_its_effective_network_policy() {
        let src = "kind: workflow\nname: w\nsandbox:\n  network:\n    allow_host_ports: [11434]\n    deny: [198.51.100.0/24]\n    max_connections: 64\nworkflow:\n  steps:\n    - {name: inherit, run: {program: echo}}\n    - {name: replace, run: {program: echo}, sandbox: {network: {allow_domains: [API.GitHub.com]}}}\n    - {name: default, run: {program: echo}, sandbox: {network: true}}\n    - {name: off, run: {program: echo}, sandbox: {network: false}}\n";
        let plan = compile(src, Path::new("/"));
        let net = |name: &str| {
            plan.graph[plan.node(name).expect(name)]
                .sandbox
                .network
                .clone()
        };
        let inherit = net("inherit").expect("spec-wide policy");
        assert_eq!(inherit.allow_host_ports, [11434]);
        assert_eq!(inherit.deny[0].to_string(), "198.51.100.0/24");
        assert_eq!(inherit.max_connections, 64);
        assert_eq!(
            inherit.connections_per_second,
            voidbox_net::DEFAULT_CONNECTIONS_PER_SECOND
        );
        // A box's mapping replaces the spec's entirely: nothing is merged.
        let replace = net("replace").expect("own policy");
        assert_eq!(
            replace,
            voidbox_net::NetworkPolicy {
                allow_domains: vec!["api.github.com".into()],
                ..voidbox_net::NetworkPolicy::default()
            }
        );
        assert_eq!(net("default"), Some(voidbox_net::NetworkPolicy::default()));
        assert_eq!(net("off"), None);
        // Without `network:` there is no device, as in v1.
        let plain = compile(
            "kind: sandbox\nname: s\nrun: {program: echo}\n",
            Path::new("/"),
        );
        assert_eq!(
            plain
                .graph
                .node_weights()
                .next()
                .expect("node")
                .sandbox
                .network,
            None
        );
    }

    #[test]
    fn every_node_has_an_effective_timeout() {
        let plan = compile(
            "kind: workflow\nname: w\nworkflow:\n  steps:\n    - {name: a, run: {program: echo}, timeout_secs: 7}\n    - {name: b, run: {program: echo}}\n",
            Path::new("/"),
        );
        let t: Vec<_> = plan.graph.node_weights().map(PlanNode::timeout).collect();
        assert_eq!((t[0].limit, t[0].secs), (TimeoutLimit::Node, 7));
        assert_eq!(
            (t[1].limit, t[1].secs),
            (TimeoutLimit::DefaultNode, DEFAULT_NODE_TIMEOUT_SECS)
        );
    }

    #[test]
    fn a_node_alone_keeps_its_settings_and_loses_its_edges() {
        let p = crate::plan::compile_for_test(
            "kind: pipeline\nname: p\ntimeout_secs: 50\npipeline:\n  boxes:\n    - {name: a, run: {program: echo}}\n    - {name: b, run: {program: cat}, retries: 2}\n    - {name: c, run: {program: cat}}\n  stages:\n    - {type: box, name: a}\n    - {type: fan_out, boxes: [b, c]}\n",
        );
        let b = p.node("b").unwrap();
        let one = p.only(b);
        assert_eq!(one.graph.node_count(), 1);
        assert_eq!(one.graph.edge_count(), 0);
        let n = &one.graph[NodeIndex::new(0)];
        assert_eq!(
            (n.name.as_str(), n.retries, &n.input, n.group),
            ("b", 2, &Input::RunInput, None)
        );
        assert_eq!(one.output, Output::Node(NodeIndex::new(0)));
        assert!(one.groups.is_empty());
        assert_eq!(one.timeout_secs, Some(50));
    }
}
