//! The DAG scheduler: starts a node as soon as its inputs exist, within `max_parallel`
//! running nodes and a memory budget; retries with backoff; fail-fast or continue; a
//! pipeline deadline; external cancellation (signals). Attempts run on tokio's blocking
//! pool through an [`Executor`]; results are stored per node, so they do not depend on the
//! order in which nodes finish.

pub mod cancel;
pub mod data;
pub mod progress;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use petgraph::graph::NodeIndex;
use petgraph::Direction;
use tokio::sync::{mpsc, watch};

use self::cancel::{NodeControl, StopReason};
use self::data::{final_output, node_input, NodeInput};
use self::progress::Progress;
use crate::plan::{Plan, PlanNode};
use crate::spec::model::OnFailure;

/// A collected output, as the JSON report lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ArtifactStats {
    /// The output's name.
    pub name: String,
    /// Regular files copied.
    pub files: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Symlinks and special files left out (never followed).
    pub skipped: u64,
}

/// One attempt of one node, as handed to an executor.
#[derive(Debug, Clone)]
pub struct Job {
    /// The node.
    pub index: NodeIndex,
    /// Its settings.
    pub node: PlanNode,
    /// Attempt number, 1-based (exported to the guest as `VOIDBOX_ATTEMPT`).
    pub attempt: u32,
    /// Its input.
    pub input: NodeInput,
    /// Output cap in bytes.
    pub max_output: u64,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Finished with exit code 0 and an output within the cap.
    Succeeded,
    /// Failed (non-zero exit, VM failure, output over the cap, …).
    Failed,
    /// Its timeout expired.
    TimedOut,
    /// Stopped because the run was cancelled.
    Cancelled,
    /// Never started (an input failed, or the run stopped first).
    Skipped,
}

impl Status {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::TimedOut => "timed_out",
            Status::Cancelled => "cancelled",
            Status::Skipped => "skipped",
        }
    }
}

/// What an agent attempt's runtime reported ([`crate::agent_output::AgentOutcome`], in one
/// shape for every runtime).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct AgentStats {
    /// The runtime that ran (`claude-code`, `codex`, `mock`).
    pub runtime: String,
    /// The provider after overrides.
    pub provider: String,
    /// Model named by the runtime (Claude Code's init event), else the one it was given.
    pub model: Option<String>,
    /// Input tokens (cached ones included).
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cached_tokens: u64,
    /// Cost in USD (zero for a local endpoint).
    pub cost_usd: f64,
    /// Turns.
    pub num_turns: u64,
    /// Tool names in call order (capped).
    pub tool_calls: Vec<String>,
    /// When each tool call ran (for traces; not in the report).
    #[serde(skip)]
    pub tool_timings: Vec<crate::agent_output::ToolTiming>,
    /// Skills the runtime listed at start (Claude Code; Codex does not report them).
    pub skills: Vec<String>,
    /// MCP servers the runtime listed at start, as `name:status`.
    pub mcp_servers: Vec<String>,
    /// Non-fatal warnings the runtime emitted (capped).
    pub warnings: Vec<String>,
    /// The final result text, whole (a result over the output cap fails the node and is
    /// not kept).
    pub result: Option<String>,
}

/// What one attempt produced.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// Outcome.
    pub status: Status,
    /// Output bytes (on success).
    pub output: Vec<u8>,
    /// Guest exit code.
    pub exit_code: Option<i32>,
    /// Guest signal.
    pub signal: Option<i32>,
    /// Why it failed.
    pub error: Option<String>,
    /// Last bytes of stderr.
    pub stderr_tail: String,
    /// Guest console log kept for this attempt.
    pub console_log: Option<std::path::PathBuf>,
    /// VM start (boot) time.
    pub boot: Option<Duration>,
    /// The VM was restored from a snapshot (`true`) or cold-booted (`false`).
    pub restored: Option<bool>,
    /// Command run time.
    pub exec: Option<Duration>,
    /// Agent statistics.
    pub agent: Option<AgentStats>,
    /// An environment problem (no KVM, no image): the run exits 3.
    pub environment: bool,
    /// Output directories copied out of the VM (on success).
    pub artifacts: Vec<ArtifactStats>,
    /// What the VM's NAT denied (final counts; empty without a network device).
    pub net_denials: Vec<voidbox_net::Denial>,
    /// An agent's skills kit as staged into this attempt's VM (per skill: files, bytes,
    /// redactions); `None` when no kit was staged.
    pub kit: Option<crate::kit::KitSummary>,
    /// What the node's credential gateway forwarded (real agent runtimes only).
    pub gateway: Option<crate::gateway::GatewayStats>,
    /// When the attempt's phases ran (for traces).
    pub phases: Phases,
    /// What the guest's telemetry said the command used.
    pub guest: Option<GuestUsage>,
    /// The program a command node started (its `run.program`, or the image's entrypoint).
    pub program: Option<String>,
    /// A service's life: when it became ready, what it served, how it ended.
    pub service: Option<ServiceStats>,
    /// How an agent's runtime started: restored waiting for its prompt, or in the VM (with
    /// the reason); `None` for commands.
    pub runtime_start: Option<RuntimeStart>,
}

/// How an agent attempt's runtime started.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "start", rename_all = "snake_case")]
pub enum RuntimeStart {
    /// Restored already running, waiting for its prompt (a warm-runtime snapshot).
    Warm {
        /// The warm snapshot's key (12 characters).
        snapshot: String,
        /// This attempt created it (the runtime started once, in the creator VM).
        created: bool,
    },
    /// Started from nothing in the VM.
    Cold {
        /// Why it could not start warm.
        reason: String,
    },
}

impl RuntimeStart {
    /// `warm` or `cold`.
    pub fn kind(&self) -> &'static str {
        match self {
            RuntimeStart::Warm { .. } => "warm",
            RuntimeStart::Cold { .. } => "cold",
        }
    }
}

/// A service attempt's life, as reports and traces show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ServiceStats {
    /// From the start of its command to ready, in milliseconds (`None`: never ready).
    pub ready_ms: Option<u64>,
    /// When it became ready (for traces; not in the report).
    #[serde(skip)]
    pub ready_at: Option<SystemTime>,
    /// The ports that decided readiness (empty: its process started, or its output file
    /// appeared).
    pub ports: Vec<u16>,
    /// TCP connections relayed to it (from its dependents and published ports).
    pub connections: u64,
    /// How it ended.
    pub ended: ServiceEnd,
}

/// How a service ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceEnd {
    /// Its process exited on its own (a foreground service's normal end).
    #[default]
    Exited,
    /// Stopped by the run once its last dependent finished.
    Stopped,
    /// Exited or crashed while dependents still needed it (the run fails).
    Died,
    /// Not ready within its `ready_timeout_secs`.
    NotReady,
    /// Stopped because the run stopped (fail-fast, timeout, signal).
    Cancelled,
}

impl ServiceEnd {
    /// The report's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceEnd::Exited => "exited",
            ServiceEnd::Stopped => "stopped",
            ServiceEnd::Died => "died",
            ServiceEnd::NotReady => "not_ready",
            ServiceEnd::Cancelled => "cancelled",
        }
    }
}

/// How a guest command ended, in words: `killed by signal 9`, `exit code 7` (`None`: neither
/// is known).
pub fn exit_words(exit_code: Option<i32>, signal: Option<i32>) -> Option<String> {
    match (exit_code, signal) {
        (_, Some(s)) => Some(format!("killed by signal {s}")),
        (Some(c), _) => Some(format!("exit code {c}")),
        _ => None,
    }
}

/// When an attempt's phases ran, in wall-clock time (each `(start, end)`).
#[derive(Debug, Clone, Default)]
pub struct Phases {
    /// The VM's start: restore from a snapshot or cold boot.
    pub vm_start: Option<(SystemTime, SystemTime)>,
    /// Input, kit and artifact files written into the guest.
    pub provision: Option<(SystemTime, SystemTime)>,
    /// The command (or agent runtime) ran.
    pub exec: Option<(SystemTime, SystemTime)>,
    /// Output and artifacts read back.
    pub collect: Option<(SystemTime, SystemTime)>,
    /// The snapshot the VM was restored from (its directory's name), if it was.
    pub snapshot: Option<String>,
}

/// The guest's resource use while the command ran, from its agent's telemetry: a snapshot
/// just before the command, samples while it ran (the last `observe.telemetry_buffer_size`
/// kept) and one just after.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestUsage {
    /// CPU time in user mode while the command ran, all vCPUs, milliseconds.
    pub cpu_user_ms: u64,
    /// CPU time in kernel mode while the command ran, milliseconds.
    pub cpu_system_ms: u64,
    /// Memory in use (total − available) when the command ended, KiB.
    pub mem_used_kb: u64,
    /// The most memory in use seen while it ran (samples and the end), KiB.
    pub mem_peak_kb: u64,
    /// The guest's memory, KiB.
    pub mem_total_kb: u64,
    /// Samples taken while it ran (all of them, kept or not).
    pub samples_taken: u64,
    /// The last samples (at most the buffer size), oldest first.
    pub samples: Vec<GuestSample>,
}

/// One guest telemetry sample taken while a command ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestSample {
    /// When it arrived.
    pub at: SystemTime,
    /// User CPU time since the command started, milliseconds.
    pub cpu_user_ms: u64,
    /// Kernel CPU time since the command started, milliseconds.
    pub cpu_system_ms: u64,
    /// Memory in use, KiB.
    pub mem_used_kb: u64,
    /// Processes in the guest.
    pub processes: u32,
}

impl GuestSample {
    /// Sample `t` relative to the snapshot taken before the command.
    pub fn new(
        before: &voidbox_protocol::Telemetry,
        t: &voidbox_protocol::Telemetry,
    ) -> GuestSample {
        GuestSample {
            at: SystemTime::now(),
            cpu_user_ms: t.cpu_user_ms.saturating_sub(before.cpu_user_ms),
            cpu_system_ms: t.cpu_system_ms.saturating_sub(before.cpu_system_ms),
            mem_used_kb: t.mem_total_kb.saturating_sub(t.mem_available_kb),
            processes: t.processes,
        }
    }
}

impl GuestUsage {
    /// The usage between the snapshots before and after the command, with the samples taken
    /// in between (counters that went backwards count as zero).
    pub fn between(
        before: &voidbox_protocol::Telemetry,
        after: &voidbox_protocol::Telemetry,
        samples: Vec<GuestSample>,
        samples_taken: u64,
        peak_kb: u64,
    ) -> GuestUsage {
        let used = after.mem_total_kb.saturating_sub(after.mem_available_kb);
        GuestUsage {
            cpu_user_ms: after.cpu_user_ms.saturating_sub(before.cpu_user_ms),
            cpu_system_ms: after.cpu_system_ms.saturating_sub(before.cpu_system_ms),
            mem_used_kb: used,
            mem_peak_kb: peak_kb.max(used),
            mem_total_kb: after.mem_total_kb,
            samples_taken,
            samples,
        }
    }
}

impl Attempt {
    /// A successful attempt with `output`.
    pub fn ok(output: Vec<u8>) -> Attempt {
        Attempt {
            status: Status::Succeeded,
            output,
            exit_code: Some(0),
            signal: None,
            error: None,
            stderr_tail: String::new(),
            console_log: None,
            boot: None,
            restored: None,
            exec: None,
            agent: None,
            environment: false,
            artifacts: Vec::new(),
            net_denials: Vec::new(),
            kit: None,
            gateway: None,
            phases: Phases::default(),
            guest: None,
            program: None,
            service: None,
            runtime_start: None,
        }
    }

    /// An attempt that ended with `status` and an error text.
    pub fn failed(status: Status, error: impl Into<String>) -> Attempt {
        Attempt {
            status,
            error: Some(error.into()),
            exit_code: None,
            ..Attempt::ok(Vec::new())
        }
    }
}

/// Runs attempts. Called on a blocking thread; must return promptly once `ctl` is stopped.
pub trait Executor: Send + Sync + 'static {
    /// Runs one attempt.
    fn run(&self, job: &Job, ctl: &NodeControl) -> Attempt;
    /// Kills whatever is still starting (called on fail-fast, timeout and signals).
    fn abort_all(&self) {}
}

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct SchedOptions {
    /// Most nodes running at once.
    pub max_parallel: usize,
    /// Memory budget in MiB for the running VMs.
    pub memory_budget_mb: u64,
    /// Per-VM overhead (VMM, page tables) added to `memory_mb` in the budget.
    pub vm_overhead_mb: u64,
    /// Output cap per node.
    pub max_output: u64,
    /// First retry delay (doubled each retry, capped at 30 s, ±25 % jitter).
    pub retry_base: Duration,
    /// The run's input (`--input`).
    pub run_input: Option<Vec<u8>>,
    /// The input of the nodes that take the run's input, built outside the run: a node
    /// runner (`apply --node`) builds its node's input from outputs made on other machines,
    /// exactly as [`node_input`] would have from the same outputs.
    pub given_input: Option<NodeInput>,
}

/// Why the whole run stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abort {
    /// A node failed under fail-fast.
    FailFast,
    /// The pipeline's `timeout_secs` passed.
    Timeout,
    /// A signal (its number).
    Signal(i32),
}

/// Progress events for reporters.
#[derive(Debug, Clone)]
pub enum Event {
    /// An attempt started.
    Started {
        /// Node.
        node: NodeIndex,
        /// Attempt number.
        attempt: u32,
    },
    /// An attempt failed and will be retried after `delay`.
    Retrying {
        /// Node.
        node: NodeIndex,
        /// The failed attempt.
        attempt: u32,
        /// Backoff.
        delay: Duration,
        /// Why it failed.
        error: String,
    },
    /// A service became ready: its dependents may start.
    Ready {
        /// Node.
        node: NodeIndex,
    },
    /// A node reached its final status.
    Finished {
        /// Node.
        node: NodeIndex,
    },
}

/// The final record of one node.
#[derive(Debug, Clone)]
pub struct NodeRecord {
    /// Status of the last attempt (or `Skipped`).
    pub status: Status,
    /// Attempts made.
    pub attempts: u32,
    /// Start of the first attempt, relative to the run's start.
    pub started: Option<Duration>,
    /// First start to last end.
    pub duration: Option<Duration>,
    /// From the moment its inputs were ready to its first start (waiting for a slot or
    /// memory).
    pub queue_wait: Option<Duration>,
    /// The last attempt.
    pub last: Option<Attempt>,
}

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Per node, in node-index (declaration) order.
    pub nodes: Vec<NodeRecord>,
    /// The final output when the run succeeded.
    pub output: Option<Vec<u8>>,
    /// Why the run stopped early.
    pub abort: Option<Abort>,
    /// Wall time.
    pub duration: Duration,
}

impl RunResult {
    /// `true` when every node succeeded.
    pub fn success(&self) -> bool {
        self.abort.is_none() && self.nodes.iter().all(|n| n.status == Status::Succeeded)
    }

    /// `true` when a node failed because of the host environment.
    pub fn environment_failure(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| n.last.as_ref().is_some_and(|a| a.environment))
    }
}

/// Backoff before retry `n` (1-based): `base · 2^(n-1)`, capped at 30 s, scaled by
/// `jitter` in `[0, 1)` to 75–125 %.
pub fn backoff(base: Duration, n: u32, jitter: f64) -> Duration {
    let exp = base.saturating_mul(1u32 << n.saturating_sub(1).min(16));
    let capped = exp.min(Duration::from_secs(30));
    capped.mul_f64(0.75 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// A cheap jitter source in `[0, 1)` (no RNG dependency; quality does not matter).
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    Running,
    /// A service running and ready: its dependents may start.
    Ready,
    Done,
}

struct Done {
    node: NodeIndex,
    record: NodeRecord,
}

/// The scheduler's bookkeeping of one run.
struct Run {
    plan: Arc<Plan>,
    exec: Arc<dyn Executor>,
    opts: SchedOptions,
    progress: Arc<dyn Progress>,
    t0: Instant,
    state: Vec<State>,
    records: Vec<Option<NodeRecord>>,
    outputs: Vec<Option<Vec<u8>>>,
    ready_at: Vec<Option<Instant>>,
    controls: Arc<Mutex<Vec<Option<NodeControl>>>>,
    /// What the running nodes are told on an abort: the cause, and the words their reports
    /// use.
    abort_tx: watch::Sender<Option<(Abort, Arc<str>)>>,
    abort_rx: watch::Receiver<Option<(Abort, Arc<str>)>>,
    done_tx: mpsc::UnboundedSender<Done>,
    /// Where services say they are ready.
    ready_tx: mpsc::UnboundedSender<(usize, Vec<u8>)>,
    /// Sidecars told to stop because their dependents are done.
    service_stopped: Vec<bool>,
    running: usize,
    mem_used: u64,
    abort: Option<Abort>,
}

impl NodeRecord {
    /// A node that never ran.
    fn skipped() -> NodeRecord {
        NodeRecord {
            status: Status::Skipped,
            attempts: 0,
            started: None,
            duration: None,
            queue_wait: None,
            last: None,
        }
    }
}

impl Run {
    /// Memory a node's VM holds while it runs.
    fn mem_of(&self, idx: NodeIndex) -> u64 {
        self.plan.graph[idx].sandbox.memory_mb + self.opts.vm_overhead_mb
    }

    /// Starts (or skips) every pending node whose inputs are settled, within the slots and
    /// the memory budget.
    fn start_ready(&mut self) {
        let plan = self.plan.clone();
        for idx in plan.graph.node_indices() {
            let i = idx.index();
            if self.state[i] != State::Pending {
                continue;
            }
            let preds: Vec<NodeIndex> = plan
                .graph
                .neighbors_directed(idx, Direction::Incoming)
                .collect();
            // A ready service counts as an input that is there.
            let settled =
                |p: &NodeIndex| matches!(self.state[p.index()], State::Done | State::Ready);
            if !preds.iter().all(settled) {
                continue;
            }
            let inputs_ok = preds.iter().all(|p| {
                self.state[p.index()] == State::Ready
                    || self.records[p.index()].as_ref().map(|r| r.status) == Some(Status::Succeeded)
            });
            if self.abort.is_some() || !inputs_ok {
                self.state[i] = State::Done;
                self.records[i] = Some(NodeRecord::skipped());
                self.progress.event(
                    &plan,
                    &Event::Finished { node: idx },
                    self.records[i].as_ref(),
                );
                continue;
            }
            let ready = *self.ready_at[i].get_or_insert_with(Instant::now);
            let need = self.mem_of(idx);
            let active = self.running - self.ready_sidecars();
            if active >= self.opts.max_parallel
                || (active > 0 && self.mem_used + need > self.opts.memory_budget_mb)
            {
                continue;
            }
            let input = match (&self.opts.given_input, &plan.graph[idx].input) {
                (Some(given), crate::plan::Input::RunInput) => Some(given.clone()),
                _ => node_input(&plan, idx, self.opts.run_input.as_deref(), &self.outputs),
            };
            let Some(input) = input else {
                continue;
            };
            self.state[i] = State::Running;
            self.running += 1;
            self.mem_used += need;
            let ready_sink = plan.graph[idx]
                .service
                .is_some()
                .then(|| (i, self.ready_tx.clone()));
            tokio::spawn(node_task(NodeTask {
                plan: plan.clone(),
                idx,
                input,
                ready: ready_sink,
                exec: self.exec.clone(),
                controls: self.controls.clone(),
                abort: self.abort_rx.clone(),
                done: self.done_tx.clone(),
                progress: self.progress.clone(),
                max_output: self.opts.max_output,
                retry_base: self.opts.retry_base,
                t0: self.t0,
                queue_wait: ready.elapsed(),
            }));
        }
    }

    /// Ready sidecars: they run, but leave their slot to their dependents (and do not stop
    /// them from starting for memory), or a run with fewer slots than services would wait
    /// forever.
    fn ready_sidecars(&self) -> usize {
        self.plan
            .graph
            .node_indices()
            .filter(|&idx| self.state[idx.index()] == State::Ready && self.plan.is_sidecar(idx))
            .count()
    }

    /// A service is ready: its output is its dependents' input, and they may start.
    fn service_ready(&mut self, i: usize, output: Vec<u8>) {
        if self.state[i] != State::Running {
            return; // it ended first
        }
        self.state[i] = State::Ready;
        self.outputs[i] = Some(output);
        let node = NodeIndex::new(i);
        self.progress
            .event(&self.plan, &Event::Ready { node }, None);
    }

    /// Stops every ready sidecar whose dependents have all finished.
    fn stop_idle_services(&mut self) {
        for idx in self.plan.graph.node_indices() {
            let i = idx.index();
            if self.service_stopped[i]
                || !matches!(self.state[i], State::Running | State::Ready)
                || !self.plan.is_sidecar(idx)
            {
                continue;
            }
            let done = self
                .plan
                .graph
                .neighbors_directed(idx, Direction::Outgoing)
                .all(|d| self.state[d.index()] == State::Done);
            if done {
                self.service_stopped[i] = true;
                if let Some(c) = &self.controls.lock().unwrap_or_else(|e| e.into_inner())[i] {
                    c.stop(StopReason::ServiceDone);
                }
            }
        }
    }

    /// A sidecar that ended on its own while dependents still needed it fails, naming how it
    /// ended; its running dependents are cancelled (pending ones are then skipped).
    fn sidecar_died(&mut self, idx: NodeIndex, record: &mut NodeRecord) {
        let i = idx.index();
        if self.service_stopped[i] || !self.plan.is_sidecar(idx) {
            return;
        }
        if record.status == Status::Cancelled || self.abort.is_some() {
            return;
        }
        let name = self.plan.graph[idx].name.clone();
        if self.state[i] != State::Ready {
            // Never ready: a failure is its own; an exit with 0 still leaves its dependents
            // without it.
            if record.status == Status::Succeeded {
                record.status = Status::Failed;
                if let Some(a) = record.last.as_mut() {
                    a.status = Status::Failed;
                    a.error = Some(format!(
                        "service `{name}` exited before it was ready (exit code {})",
                        a.exit_code.unwrap_or(0)
                    ));
                }
            }
            return;
        }
        let how = record
            .last
            .as_ref()
            .and_then(|a| {
                exit_words(a.exit_code, a.signal).or_else(|| {
                    a.error
                        .as_deref()
                        .map(|e| e.lines().next().unwrap_or("").into())
                })
            })
            .unwrap_or_else(|| "ended".to_string());
        let why = format!("service `{name}` ended before its dependents finished ({how})");
        record.status = Status::Failed;
        if let Some(a) = record.last.as_mut() {
            a.status = Status::Failed;
            a.error = Some(why.clone());
            if let Some(s) = a.service.as_mut() {
                s.ended = ServiceEnd::Died;
            }
        }
        let controls = self.controls.lock().unwrap_or_else(|e| e.into_inner());
        for d in self.plan.graph.neighbors_directed(idx, Direction::Outgoing) {
            if let Some(c) = &controls[d.index()] {
                c.stop_because(StopReason::Cancelled, format!("cancelled: {why}"));
            }
        }
    }

    /// A node reached its final status (fail-fast aborts the run on a failure).
    fn finished(&mut self, mut d: Done) {
        let i = d.node.index();
        if self.plan.graph[d.node].service.is_some() {
            self.sidecar_died(d.node, &mut d.record);
        }
        self.state[i] = State::Done;
        self.running -= 1;
        self.mem_used = self.mem_used.saturating_sub(self.mem_of(d.node));
        if d.record.status == Status::Succeeded {
            // A stopped sidecar keeps the output it was ready with.
            if !self.service_stopped[i] || self.outputs[i].is_none() {
                self.outputs[i] = d.record.last.as_ref().map(|a| a.output.clone());
            }
        } else if self.abort.is_none()
            && self.plan.on_failure == OnFailure::FailFast
            && d.record.status != Status::Cancelled
        {
            let failed = self.plan.graph[d.node].name.clone();
            self.abort_with(Abort::FailFast, Some(&failed));
        }
        self.progress.event(
            &self.plan,
            &Event::Finished { node: d.node },
            Some(&d.record),
        );
        self.records[i] = Some(d.record);
    }

    /// Stops the run: every running node is told why, and stopped.
    fn abort_with(&mut self, a: Abort, failed: Option<&str>) {
        self.abort = Some(a);
        let _ = self
            .abort_tx
            .send(Some((a, cancel_reason(&self.plan, a, failed))));
        for c in self
            .controls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
        {
            c.stop(StopReason::Cancelled);
        }
        self.exec.abort_all();
    }

    /// The result, once nothing runs.
    fn result(self) -> RunResult {
        let nodes: Vec<NodeRecord> = self
            .records
            .into_iter()
            .map(|r| r.unwrap_or_else(NodeRecord::skipped))
            .collect();
        let output = if self.abort.is_none() && nodes.iter().all(|r| r.status == Status::Succeeded)
        {
            final_output(&self.plan, &self.outputs)
        } else {
            None
        };
        RunResult {
            nodes,
            output,
            abort: self.abort,
            duration: self.t0.elapsed(),
        }
    }
}

/// Runs `plan` to completion. `cancel` delivers an external abort (a signal).
pub async fn run_plan(
    plan: Arc<Plan>,
    exec: Arc<dyn Executor>,
    opts: SchedOptions,
    progress: Arc<dyn Progress>,
    mut cancel: watch::Receiver<Option<Abort>>,
) -> RunResult {
    let t0 = Instant::now();
    let n = plan.graph.node_count();
    let (abort_tx, abort_rx) = watch::channel(None::<(Abort, Arc<str>)>);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<(usize, Vec<u8>)>();
    let pipeline_deadline = plan.timeout_secs.map(|s| t0 + Duration::from_secs(s));
    let mut run = Run {
        plan,
        exec,
        opts,
        progress,
        t0,
        state: vec![State::Pending; n],
        records: vec![None; n],
        outputs: vec![None; n],
        ready_at: vec![None; n],
        controls: Arc::new(Mutex::new(vec![None; n])),
        abort_tx,
        abort_rx,
        done_tx,
        ready_tx,
        service_stopped: vec![false; n],
        running: 0,
        mem_used: 0,
        abort: None,
    };
    loop {
        run.start_ready();
        run.stop_idle_services();
        if run.running == 0 {
            break;
        }
        let sleep_until = pipeline_deadline.map(tokio::time::Instant::from_std);
        let open = run.abort.is_none();
        tokio::select! {
            Some(d) = done_rx.recv() => run.finished(d),
            Some((i, output)) = ready_rx.recv() => run.service_ready(i, output),
            _ = async {
                match sleep_until {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            }, if open => run.abort_with(Abort::Timeout, None),
            Ok(()) = cancel.changed(), if open => {
                let a = *cancel.borrow();
                if let Some(a) = a {
                    run.abort_with(a, None);
                }
            }
        }
    }
    run.result()
}

/// What a node cancelled by `abort` reports: `cancelled: sibling 'x' failed`,
/// `cancelled: interrupted (SIGINT)`, `cancelled: pipeline timeout_secs=60 s fired`.
pub fn cancel_reason(plan: &Plan, abort: Abort, failed: Option<&str>) -> Arc<str> {
    let why = match (abort, failed) {
        (Abort::FailFast, Some(name)) => {
            format!("cancelled: sibling '{name}' failed (on_failure: fail_fast)")
        }
        (Abort::FailFast, None) => "cancelled: a sibling failed (on_failure: fail_fast)".into(),
        (Abort::Timeout, _) => match plan.timeout_secs {
            Some(s) => format!("cancelled: pipeline timeout_secs={s} s fired"),
            None => "cancelled: the pipeline timed out".into(),
        },
        (Abort::Signal(sig), _) => format!("cancelled: interrupted ({})", signal_name(sig)),
    };
    why.into()
}

/// `SIGINT` for 2, and so on; `signal N` for the rest.
fn signal_name(sig: i32) -> String {
    match sig {
        1 => "SIGHUP".into(),
        2 => "SIGINT".into(),
        3 => "SIGQUIT".into(),
        15 => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// The cancellation words a node task was sent (a stop without an abort is a plain
/// `cancelled`).
fn cancelled_because(abort: &watch::Receiver<Option<(Abort, Arc<str>)>>) -> String {
    abort
        .borrow()
        .as_ref()
        .map_or_else(|| "cancelled".to_string(), |(_, why)| why.to_string())
}

struct NodeTask {
    plan: Arc<Plan>,
    idx: NodeIndex,
    input: NodeInput,
    /// A service's readiness channel.
    ready: Option<cancel::ReadySink>,
    exec: Arc<dyn Executor>,
    controls: Arc<Mutex<Vec<Option<NodeControl>>>>,
    abort: watch::Receiver<Option<(Abort, Arc<str>)>>,
    done: mpsc::UnboundedSender<Done>,
    progress: Arc<dyn Progress>,
    max_output: u64,
    retry_base: Duration,
    t0: Instant,
    queue_wait: Duration,
}

async fn node_task(mut t: NodeTask) {
    let node = t.plan.graph[t.idx].clone();
    let started = Instant::now();
    let mut attempt = 0u32;
    let last = loop {
        attempt += 1;
        let ctl = match &t.ready {
            Some(sink) => NodeControl::with_ready(sink.clone()),
            None => NodeControl::new(),
        };
        t.controls.lock().unwrap_or_else(|e| e.into_inner())[t.idx.index()] = Some(ctl.clone());
        if t.abort.borrow().is_some() {
            ctl.stop(StopReason::Cancelled);
        }
        t.progress.event(
            &t.plan,
            &Event::Started {
                node: t.idx,
                attempt,
            },
            None,
        );
        let job = Job {
            index: t.idx,
            node: node.clone(),
            attempt,
            input: t.input.clone(),
            max_output: t.max_output,
        };
        let exec = t.exec.clone();
        let c2 = ctl.clone();
        let attempt_started = SystemTime::now();
        let mut a = tokio::task::spawn_blocking(move || {
            let a = exec.run(&job, &c2);
            c2.finish();
            a
        })
        .await
        .unwrap_or_else(|e| Attempt::failed(Status::Failed, format!("executor panicked: {e}")));
        t.controls.lock().unwrap_or_else(|e| e.into_inner())[t.idx.index()] = None;
        // A stop from outside overrides whatever the killed attempt reported.
        match ctl.stopped() {
            Some(StopReason::Cancelled) if a.status != Status::Succeeded => {
                // The VM died because it was killed: say why it was, not how it died.
                a.status = Status::Cancelled;
                a.error = Some(ctl.why().unwrap_or_else(|| cancelled_because(&t.abort)));
            }
            // A sidecar stopped because its dependents are done: that is its success.
            Some(StopReason::ServiceDone) => {
                a.status = Status::Succeeded;
                a.error = None;
            }
            Some(StopReason::TimedOut) if a.status != Status::Succeeded => {
                a.status = Status::TimedOut;
                a.error = Some(format!(
                    "timed out: {} fired (host deadline; the VM was killed)",
                    node.timeout()
                ));
            }
            _ => {}
        }
        if let Some(s) = a.service.as_mut() {
            s.ended = match ctl.stopped() {
                Some(StopReason::ServiceDone) => ServiceEnd::Stopped,
                Some(StopReason::NotReady) => ServiceEnd::NotReady,
                Some(StopReason::Cancelled | StopReason::TimedOut) => ServiceEnd::Cancelled,
                None => ServiceEnd::Exited,
            };
        }
        t.progress
            .attempt_ended(&t.plan, t.idx, attempt, attempt_started, &a);
        let retryable = matches!(a.status, Status::Failed | Status::TimedOut) && !a.environment;
        if !retryable || attempt > node.retries || t.abort.borrow().is_some() {
            break a;
        }
        let delay = backoff(t.retry_base, attempt, jitter());
        t.progress.event(
            &t.plan,
            &Event::Retrying {
                node: t.idx,
                attempt,
                delay,
                error: a.error.clone().unwrap_or_default(),
            },
            None,
        );
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            why = t.abort.wait_for(|a| a.is_some()) => {
                let why = why.ok().and_then(|w| w.as_ref().map(|(_, why)| why.to_string()));
                let mut a = a;
                a.status = Status::Cancelled;
                a.error = Some(why.unwrap_or_else(|| "cancelled".into()));
                break a;
            }
        }
    };
    let record = NodeRecord {
        status: last.status,
        attempts: attempt,
        started: Some(started.saturating_duration_since(t.t0)),
        duration: Some(started.elapsed()),
        queue_wait: Some(t.queue_wait),
        last: Some(last),
    };
    let _ = t.done.send(Done {
        node: t.idx,
        record,
    });
}
