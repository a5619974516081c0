//! The typed spec model (api_version v1), a strict superset of void-box's v1 format.
//!
//! Every struct denies unknown fields; the JSON Schema in `schemas/voidbox.schema.json` is
//! generated from these types (doc comments become descriptions, serde defaults become
//! schema defaults).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::limits::{MAX_MEMORY_MB, MAX_TIMEOUT_SECS, MAX_VCPUS, MIN_MEMORY_MB, MIN_VCPUS};
/// `sandbox.limits`: the guest policy's own type, shared with the guest agent.
pub use voidbox_protocol::ResourceLimits;

/// A voidbox spec: one `agent`, `sandbox`, `pipeline` or `workflow`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "voidbox spec", extend("$id" = "https://voidbox.dev/schemas/voidbox.schema.json"))]
pub struct Spec {
    /// Spec format version. Only `v1` exists.
    #[serde(default)]
    pub api_version: ApiVersion,
    /// What this spec describes: a single `agent`, a `sandbox` command, a `pipeline` of
    /// stages, or a `workflow` DAG of steps.
    pub kind: Kind,
    /// Name of the spec (shown in reports and graphs).
    #[schemars(length(min = 1))]
    pub name: String,
    /// VM defaults for every node; a pipeline box may override them.
    #[serde(default)]
    pub sandbox: Sandbox,
    /// The LLM used by agent nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<Llm>,
    /// Observability settings (traces, metrics, logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observe: Option<Observe>,
    /// The agent of a `kind: agent` spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Agent>,
    /// The boxes and stages of a `kind: pipeline` spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<Pipeline>,
    /// The steps of a `kind: workflow` spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<Workflow>,
    /// The command of a `kind: sandbox` spec (without it, the sandbox is the environment
    /// `voidbox shell` opens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<Command>,
    /// Default retries for every node after a failed attempt (exponential backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub retries: Option<u32>,
    /// Wall-clock limit for the whole run, in seconds (none by default; every node also has
    /// its own limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
    /// What happens to independent nodes when one fails.
    #[serde(default)]
    pub on_failure: OnFailure,
}

/// Spec format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum ApiVersion {
    /// Version 1.
    #[default]
    #[serde(rename = "v1")]
    V1,
}

/// The kind of a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// One agent running its `agent:` block.
    Agent,
    /// One command (`run:`) in a sandbox, or an interactive environment.
    Sandbox,
    /// Boxes run in `stages` (sequential `box` stages and parallel `fan_out` stages).
    Pipeline,
    /// A DAG of `steps` with `depends_on`.
    Workflow,
}

impl Kind {
    /// The lowercase name used in specs.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Agent => "agent",
            Kind::Sandbox => "sandbox",
            Kind::Pipeline => "pipeline",
            Kind::Workflow => "workflow",
        }
    }
}

/// Failure policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Stop at the first failure: running siblings are cancelled and their VMs killed.
    #[default]
    FailFast,
    /// Keep running every node that does not depend on the failed one.
    Continue,
}

/// Sandbox (micro-VM) settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sandbox {
    /// Execution mode: `auto` and `local` run a KVM micro-VM; `mock` is accepted for void-box
    /// compatibility but never fabricates results (`apply` refuses it).
    #[serde(default)]
    pub mode: SandboxMode,
    /// Guest memory per VM, in MiB (default: 256 for a command, 1024 for an agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_MEMORY_MB, max = MAX_MEMORY_MB))]
    pub memory_mb: Option<u64>,
    /// Virtual CPUs per VM.
    #[serde(default = "default_vcpus")]
    #[schemars(range(min = MIN_VCPUS, max = MAX_VCPUS))]
    pub vcpus: u32,
    /// Network access. `false` (the default): no network device at all; `true`: a
    /// user-mode NAT with the default policy (public egress only); a mapping: a NAT with
    /// that policy.
    #[serde(default)]
    pub network: Network,
    /// Environment variables for every command. An empty value copies the host's value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Host directories mounted into the VM (host paths relative to the spec file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// OCI image used as the root filesystem (for example `alpine:3.20`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// OCI image carrying a guest kernel + initramfs (void-box compatibility).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_image: Option<String>,
    /// Path of a guest kernel to boot instead of the built-in guest image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// Path of an initramfs to boot instead of the built-in guest image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initramfs: Option<String>,
    /// Snapshot to restore from: a hash prefix or a directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Extra programs the guest agent may start in each VM, besides the node's own program
    /// (`run.program`, or the agent runtime): bare names (resolved on the guest's `PATH`)
    /// or absolute paths. Anything else is refused with exit code 126. Children of an
    /// allowed program are not filtered (`sh -c "tr …"` needs only `sh`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(inner(pattern(r"^(/\S*|[^/\s]+)$")))]
    pub allowed_commands: Option<Vec<String>>,
    /// Resource limits of every process in the VM (unset: nofile 1024, nproc 1024,
    /// fsize_mb 4096, address space unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceLimits>,
}

fn default_vcpus() -> u32 {
    1
}

impl Default for Sandbox {
    fn default() -> Self {
        Self {
            mode: SandboxMode::default(),
            memory_mb: None,
            vcpus: default_vcpus(),
            network: Network::default(),
            env: BTreeMap::new(),
            mounts: Vec::new(),
            image: None,
            guest_image: None,
            kernel: None,
            initramfs: None,
            snapshot: None,
            allowed_commands: None,
            limits: None,
        }
    }
}

/// Sandbox execution mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// A KVM micro-VM.
    #[default]
    Auto,
    /// A KVM micro-VM.
    Local,
    /// void-box's mock backend: accepted by `validate`/`graph` with a warning, refused by
    /// `apply` (use `apply --dry-run`).
    Mock,
}

/// `network:`: on or off, or on with a policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Network {
    /// `true`: a network device with the default policy; `false`: no network device.
    Enabled(bool),
    /// A network device with this policy.
    NetworkPolicy(NetworkPolicy),
}

impl Default for Network {
    fn default() -> Self {
        Network::Enabled(false)
    }
}

impl Network {
    /// The NAT policy of a VM with this setting; `None`: no network device.
    pub fn policy(&self) -> Option<voidbox_net::NetworkPolicy> {
        match self {
            Network::Enabled(false) => None,
            Network::Enabled(true) => Some(voidbox_net::NetworkPolicy::default()),
            Network::NetworkPolicy(p) => Some(p.to_policy()),
        }
    }
}

/// The policy of the user-mode NAT (the mapping form of `network:`). Evaluation order:
/// the gateway admits only `allow_host_ports`; `deny` wins over everything else; the host's
/// own interface addresses pass only when an `allow` entry names one alone (`ADDR/32`); the
/// default-denied ranges (host loopback, private, link-local, CGNAT, cloud metadata, IANA's
/// special-purpose ranges — 0/8, 192.0.0.0/24, documentation, benchmarking, 240/4,
/// multicast, broadcast — IPv6 unique-local and link-local) pass only when inside `allow`;
/// with `allow_domains`, only
/// addresses the VM's own DNS returned for an allowed name pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Host loopback ports the guest reaches at `10.0.2.2:PORT` (→ host `127.0.0.1:PORT`);
    /// no other host port is reachable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(range(min = 1, max = 65535)))]
    pub allow_host_ports: Vec<u16>,
    /// When set, public egress only to addresses the VM's own DNS returned for these names
    /// (DNS pinning: literal IPs do not pass, `allow` does not bypass it); other names get
    /// NXDOMAIN. `*.example.com` matches the subdomains of example.com.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)))]
    pub allow_domains: Vec<String>,
    /// Exceptions to the default denies, as CIDRs (`10.1.0.0/16`, `fd00::/8`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<String>")]
    pub allow: Vec<ipnet::IpNet>,
    /// Extra denies, as CIDRs; they win over everything else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<String>")]
    pub deny: Vec<ipnet::IpNet>,
    /// Most concurrent TCP connections and UDP flows of the VM.
    #[serde(default = "default_max_connections")]
    #[schemars(range(min = 1, max = crate::network_policy::MAX_CONNECTIONS_LIMIT))]
    pub max_connections: u32,
    /// Most new TCP connections and UDP flows per second of the VM.
    #[serde(default = "default_connections_per_second")]
    #[schemars(range(min = 1, max = crate::network_policy::CONNECTIONS_PER_SECOND_LIMIT))]
    pub connections_per_second: u32,
}

fn default_max_connections() -> u32 {
    voidbox_net::DEFAULT_MAX_CONNECTIONS
}

fn default_connections_per_second() -> u32 {
    voidbox_net::DEFAULT_CONNECTIONS_PER_SECOND
}

impl NetworkPolicy {
    /// The NAT's policy (domain names in lowercase).
    pub fn to_policy(&self) -> voidbox_net::NetworkPolicy {
        voidbox_net::NetworkPolicy {
            allow_host_ports: self.allow_host_ports.clone(),
            allow_domains: self
                .allow_domains
                .iter()
                .map(|d| d.to_ascii_lowercase())
                .collect(),
            allow: self.allow.clone(),
            deny: self.deny.clone(),
            max_connections: self.max_connections,
            connections_per_second: self.connections_per_second,
            public_egress: true,
        }
    }
}

/// Per-box overrides of the spec's sandbox settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxOverride {
    /// Guest memory for this box, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_MEMORY_MB, max = MAX_MEMORY_MB))]
    pub memory_mb: Option<u64>,
    /// Virtual CPUs for this box.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_VCPUS, max = MAX_VCPUS))]
    pub vcpus: Option<u32>,
    /// Network access for this box: replaces the spec's `network` entirely (a mapping here
    /// is the whole policy; nothing is merged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// Extra environment variables (merged over the spec's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Extra mounts for this box.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// OCI root filesystem image for this box.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Snapshot to restore this box from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Extra programs this box's guest agent may start (replaces the spec's list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(inner(pattern(r"^(/\S*|[^/\s]+)$")))]
    pub allowed_commands: Option<Vec<String>>,
    /// Resource limits for this box (each one set here replaces the spec's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceLimits>,
}

/// A host directory mounted into the VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// Host path (relative paths are relative to the spec file).
    #[schemars(length(min = 1))]
    pub host: String,
    /// Absolute path inside the guest.
    #[schemars(length(min = 1))]
    pub guest: String,
    /// `ro` (default) or `rw`.
    #[serde(default)]
    pub mode: MountMode,
}

/// Mount access mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MountMode {
    /// Read-only.
    #[default]
    Ro,
    /// Read-write.
    Rw,
}

/// LLM settings for agent nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Llm {
    /// Which agent runtime and LLM backend to use.
    pub provider: Provider,
    /// Model name (provider-specific).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The provider's endpoint as the host sees it: an Anthropic Messages API root for the
    /// Claude Code providers, an OpenAI API root including `/v1` for `codex`. Required for
    /// `custom`; https, or http to a loopback host only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Name of the host environment variable that holds the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// void-box's opt-in host-side key injection. In voidbox it is always on, whatever this
    /// says: the guest never sees the API key, the node's credential gateway adds it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub credential_proxy: bool,
}

/// LLM provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Provider {
    /// Claude Code with an API key.
    Claude,
    /// Claude Code with a personal (subscription) login.
    ClaudePersonal,
    /// OpenAI Codex CLI.
    Codex,
    /// Claude Code against a local Ollama server (`http://127.0.0.1:11434`).
    Ollama,
    /// Claude Code against a local LM Studio server (`http://127.0.0.1:1234`).
    LmStudio,
    /// Claude Code against any Anthropic Messages API endpoint (`base_url`).
    Custom,
    /// A deterministic offline stand-in for an LLM CLI (tests and demos).
    Mock,
}

impl Provider {
    /// Every provider, in declaration order.
    pub const ALL: [Provider; 7] = [
        Provider::Claude,
        Provider::ClaudePersonal,
        Provider::Codex,
        Provider::Ollama,
        Provider::LmStudio,
        Provider::Custom,
        Provider::Mock,
    ];

    /// The name used in specs.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Claude => "claude",
            Provider::ClaudePersonal => "claude-personal",
            Provider::Codex => "codex",
            Provider::Ollama => "ollama",
            Provider::LmStudio => "lm-studio",
            Provider::Custom => "custom",
            Provider::Mock => "mock",
        }
    }
}

/// Observability settings (void-box compatible).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Observe {
    /// Export traces (default: on whenever an OTLP endpoint or `apply --trace` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<bool>,
    /// Export metrics (default: on whenever an OTLP endpoint is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<bool>,
    /// Export the run's log records (node started, retried, finished; notices; network
    /// denials; agent warnings) over OTLP, correlated with the trace (default: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<bool>,
    /// OTLP endpoint (for example `http://localhost:4317` for gRPC, `http://localhost:4318`
    /// for HTTP); `VOIDBOX_OTLP_ENDPOINT` and `OTEL_EXPORTER_OTLP_ENDPOINT` apply when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// Service name reported to the collector (`OTEL_SERVICE_NAME` and
    /// `VOIDBOX_SERVICE_NAME` take precedence; default `voidbox`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Guest telemetry buffer size (samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry_buffer_size: Option<u64>,
}

/// The agent of a `kind: agent` spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    /// The task given to the agent.
    pub prompt: String,
    /// Skills installed into the VM before the agent starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<SkillEntry>,
    /// Instruction files (`AGENTS.md`, `CLAUDE.md`; paths relative to the spec file) given
    /// to the runtime, in order, as its user-level instructions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompt_files: Vec<String>,
    /// Time limit for the agent, in seconds (without it: the default node timeout, 1800 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
    /// Guest path of the file the agent writes its result to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
    /// Agent messaging (void-box compatible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messaging: Option<Messaging>,
    /// `task` (run to completion), `service` (long-running) or `interactive`.
    #[serde(default)]
    pub mode: AgentMode,
    /// Retries after a failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub retries: Option<u32>,
}

/// Agent messaging settings (void-box compatible).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Messaging {
    /// Enable messaging.
    #[serde(default)]
    pub enabled: bool,
    /// Provider bridge name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_bridge: Option<String>,
}

/// How an agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AgentMode {
    /// Run the prompt to completion.
    #[default]
    Task,
    /// A long-running agent with no timeout of its own (in the foreground: `kind: agent` has
    /// one node).
    Service,
    /// An interactive session.
    Interactive,
}

/// A pipeline: boxes and the stages that run them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pipeline {
    /// The boxes (nodes) of the pipeline.
    pub boxes: Vec<PipelineBox>,
    /// Stages in order. Without stages, the boxes run one after another in declaration order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<Stage>,
}

/// A pipeline box: an agent box (`prompt`) or a command box (`run`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineBox {
    /// Unique box name, referenced by stages.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Agent box: the task given to the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Command box: the program to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<Command>,
    /// Skills for an agent box.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<SkillEntry>,
    /// Instruction files for an agent box (`AGENTS.md`, `CLAUDE.md`; paths relative to the
    /// spec file), given to its runtime in order as its user-level instructions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompt_files: Vec<String>,
    /// LLM settings for this box (overrides the spec's `llm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<Llm>,
    /// Time limit for this box, in seconds (without it: the default node timeout, 1800 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
    /// Retries after a failed attempt (exponential backoff with jitter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub retries: Option<u32>,
    /// Sandbox overrides for this box.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxOverride>,
    /// Named output directories this box writes (void-box compatible).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<BoxOutput>,
    /// Named inputs this box reads from earlier boxes' outputs (void-box compatible).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<BoxInput>,
    /// `service` for a long-running box: a sidecar of the next stage (reached as
    /// `NAME:PORT`, stopped when that stage is done), or in the foreground as the last stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<StepMode>,
    /// A service box's TCP ports (readiness, and what the next stage may reach).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// How long a service box may take to become ready, in seconds (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_SECS))]
    pub ready_timeout_secs: Option<u64>,
}

/// A named output directory of a box.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BoxOutput {
    /// Output name, referenced by other boxes' `inputs[].from`.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Guest directory the box writes.
    #[serde(default = "default_output_guest")]
    pub guest: String,
}

fn default_output_guest() -> String {
    "/workspace/output".to_string()
}

/// A named input of a box.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BoxInput {
    /// Name of another box's output.
    #[schemars(length(min = 1))]
    pub from: String,
    /// Guest directory where the input appears.
    #[serde(default = "default_input_guest")]
    pub guest: String,
}

fn default_input_guest() -> String {
    "/workspace/input".to_string()
}

/// A pipeline stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Stage {
    /// Run one box.
    Box {
        /// The box to run.
        #[schemars(length(min = 1))]
        name: String,
    },
    /// Run several boxes in parallel on the same input; their outputs are merged into a JSON
    /// array in declaration order.
    FanOut {
        /// The boxes to run in parallel (at least two).
        boxes: Vec<String>,
    },
}

/// A program to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Command {
    /// Program name (looked up in the guest's PATH) or absolute path. Optional on a node with
    /// `sandbox.image`: without it the image's `Entrypoint`/`Cmd` runs (`args` replacing
    /// `Cmd`, as with Docker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub program: Option<String>,
    /// Arguments (with the image's entrypoint: they replace its `Cmd`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory in the guest (default `/workspace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}

/// A workflow: a DAG of steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Workflow {
    /// The steps.
    pub steps: Vec<Step>,
    /// The step whose output is the workflow's output (default: the single final step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_step: Option<String>,
}

/// A workflow step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Unique step name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The command to run.
    pub run: StepCommand,
    /// Steps that must finish first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Step whose output is piped to this step's stdin (must be in `depends_on`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_from: Option<String>,
    /// `service` for a long-running step (void-box compatible): without dependents (or as
    /// the `output_step`) it runs in the foreground until it exits; with dependents it is a
    /// sidecar they reach as `NAME:PORT`, stopped when the last of them finishes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<StepMode>,
    /// A service's TCP ports: it is ready when each accepts a connection in its VM, and its
    /// dependents reach these ports (and only these) as `NAME:PORT`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// How long a service may take to become ready, in seconds (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_SECS))]
    pub ready_timeout_secs: Option<u64>,
    /// Time limit for this step, in seconds (without it: the default node timeout, 1800 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
    /// Retries after a failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub retries: Option<u32>,
    /// Sandbox overrides for this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxOverride>,
}

/// The command of a workflow step (void-box also allows `stdin_from` here).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StepCommand {
    /// Program name or absolute path. Optional on a step with `sandbox.image`: without it the
    /// image's `Entrypoint`/`Cmd` runs (`args` replacing `Cmd`, as with Docker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub program: Option<String>,
    /// Arguments (with the image's entrypoint: they replace its `Cmd`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory in the guest (default `/workspace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// void-box form of the step's `stdin_from`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_from: Option<String>,
}

/// Workflow step (or pipeline box) mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StepMode {
    /// A long-running service (no timeout of its own).
    Service,
}

impl Step {
    /// `stdin_from`, whichever of the two accepted places sets it.
    pub fn stdin_source(&self) -> Option<&str> {
        self.stdin_from
            .as_deref()
            .or(self.run.stdin_from.as_deref())
    }
}

/// A skill: a `type:value` string or an object form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum SkillEntry {
    /// `agent:NAME`, `file:PATH`, `remote:OWNER/REPO[/SKILL]`, `mcp:NAME` or `cli:NAME`.
    Simple(String),
    /// A skill shipped as an OCI image, mounted into the guest.
    Oci(OciSkill),
    /// An MCP server started for the agent.
    Mcp(McpSkill),
    /// A skill given inline.
    Inline(InlineSkill),
}

/// A skill shipped as an OCI image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OciSkill {
    /// Image reference (for example `python:3.12-slim`).
    #[schemars(length(min = 1))]
    pub image: String,
    /// Absolute guest path where the image's filesystem appears.
    #[schemars(length(min = 1))]
    pub mount: String,
    /// Mount read-only (default).
    #[serde(default = "default_true")]
    pub readonly: bool,
}

fn default_true() -> bool {
    true
}

/// An MCP server skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpSkill {
    /// Server name as the agent sees it.
    #[schemars(length(min = 1))]
    pub mcp: String,
    /// Command that starts the server (stdio transport).
    #[schemars(length(min = 1))]
    pub command: String,
    /// Arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables for the server.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// An inline skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InlineSkill {
    /// Skill name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// SKILL.md content.
    pub content: String,
}
