//! `voidbox shell AGENT_SPEC`: the agent's own runtime on the terminal, set up as
//! `voidbox apply` sets up an agent box.
//!
//! Before the VM starts: the agent's `llm` is resolved ([`crate::node::launch::endpoints`]:
//! provider, key, overrides; exit 3 when it cannot run here), the mock runtime is refused
//! (it has no interactive mode; exit 2), the runtimes disk is ensured, the agent's
//! credential gateway started ([`crate::gateway`]), and its kit (skills, `prompt_files`)
//! and the runtime's configuration built ([`crate::node::launch::launch_interactive`]).
//! The VM gets the runtimes disk, a NAT that reaches the gateway
//! ([`crate::gateway::guest_network`]), and the files before the terminal opens. The key
//! never enters the guest: the runtime holds the gateway's per-session placeholder.

use voidbox_protocol::ExecRequest;

use super::Failure;
use crate::gateway::{Gateway, GatewayStats};
use crate::node::agent::{kit_files, GuestFile};
use crate::node::launch::{launch_interactive, GatewayAccess, Launch};
use crate::plan::{Action, AgentAction, Plan, PlanNode};
use crate::providers::{Endpoint, Runtime};
use crate::sandbox::disks::ImageDisk;

/// An interactive agent whose runtime can run on this host.
#[derive(Debug, Clone)]
pub struct Agent {
    /// The spec's agent.
    pub action: AgentAction,
    /// Its resolved model endpoint (a real runtime).
    pub endpoint: Endpoint,
    /// Its `remote:` skills, once fetched ([`crate::node::prepare::fetch_remotes`]).
    pub remotes: crate::kit::Remotes,
}

impl Agent {
    /// The agent `node` opens, if it is one: `None` for a sandbox. Refuses `--program` /
    /// `--arg` with an agent (the terminal runs the agent's runtime; exit 2), an endpoint
    /// that cannot run here (exit 3, as `apply`) and the mock runtime (exit 2). `env`
    /// reads the host's variables.
    pub fn of(
        plan: &Plan,
        node: Option<&PlanNode>,
        program_flags: bool,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Agent>, Failure> {
        let Some(node) = node else { return Ok(None) };
        let Action::Agent(action) = &node.action else {
            return Ok(None);
        };
        if program_flags {
            return Err(Failure::usage(format!(
                "`{}` is an agent: its terminal runs the agent's runtime, not `--program`/`--arg`\n  help: drop `--program`/`--arg`, or open a shell in a `kind: sandbox` without `run:`",
                plan.name
            )));
        }
        // The mock is refused first, whatever else the spec says.
        if matches!(crate::providers::resolve(&action.llm, env), Ok(e) if e.runtime == Runtime::Mock)
        {
            return Err(Failure::usage(format!(
                "`{}`: {}\n  help: use a real runtime (`provider: claude`, `codex`, …), or run the task with `voidbox apply`",
                plan.name,
                crate::node::launch::MOCK_NOT_INTERACTIVE
            )));
        }
        let mut endpoints = crate::node::launch::endpoints(plan, env).map_err(|failures| {
            let lines: Vec<String> = failures
                .into_iter()
                .map(|f| format!("node `{}`: {}\n  help: {}", f.node, f.message, f.help))
                .collect();
            Failure {
                code: 3,
                message: lines.join("\nerror: "),
            }
        })?;
        let endpoint = endpoints.remove(&node.name).ok_or_else(|| Failure {
            code: 3,
            message: format!("internal: agent `{}` has no resolved endpoint", node.name),
        })?;
        Ok(Some(Agent {
            action: action.clone(),
            endpoint,
            remotes: crate::kit::Remotes::new(),
        }))
    }

    /// Prepares the session on the host: the runtimes disk (fetched once), the gateway
    /// (running from here on), the runtime's launch in `workdir` and the files to stage.
    pub fn prepare(&self, plan: &Plan, node: &PlanNode, workdir: &str) -> Result<Session, Failure> {
        let disk =
            crate::runtimes::ensure(&mut |l| eprintln!("runtimes: {l}")).map_err(|e| Failure {
                code: e.exit_code(),
                message: e.to_string(),
            })?;
        let gateway = Gateway::start(&self.endpoint).map_err(|e| Failure {
            code: 3,
            message: format!("cannot start the credential gateway: {e}"),
        })?;
        let access = GatewayAccess {
            base_url: gateway.guest_base_url(),
            token: gateway.token().to_string(),
        };
        let launch = launch_interactive(&self.action, &self.endpoint, &access, workdir)
            .map_err(Failure::usage)?;
        let mut secrets = crate::kit::Secrets::for_node(node);
        if let Some(c) = &self.endpoint.credential {
            secrets = secrets.with(c.secret().expose());
        }
        let src = crate::kit::Sources {
            spec_dir: &plan.spec_dir,
            skills: &self.action.skills,
            prompt_files: &self.action.prompt_files,
            layout: launch.layout,
            remotes: &self.remotes,
        };
        let (kit, _) = kit_files(&src, &secrets).map_err(Failure::usage)?;
        let mut files = launch.files.clone();
        files.extend(kit);
        Ok(Session {
            gateway,
            disk: disk.image_disk(),
            launch,
            files,
        })
    }
}

/// The host side of an agent's session.
pub struct Session {
    /// The agent's credential gateway; stopped at the end ([`Session::finish`]).
    pub gateway: Gateway,
    /// The runtimes disk, attached to the VM.
    pub disk: ImageDisk,
    /// How the runtime starts.
    pub launch: Launch,
    /// Written into the guest before the terminal opens: the runtime's configuration, then
    /// the kit.
    pub files: Vec<GuestFile>,
}

impl Session {
    /// The runtime's request with `extra` (image, spec and flag variables) after its own
    /// environment, except the variables the runtime sets itself (gateway, token, `HOME`…).
    pub fn request(&self, extra: Vec<(String, String)>) -> ExecRequest {
        let mut req = self.launch.request.clone();
        req.env = merge_env(req.env, extra);
        req
    }

    /// Stops the gateway and prints its counters to stderr.
    pub fn finish(self) {
        eprintln!("voidbox: {}", summary(&self.gateway.stop()));
    }
}

pub use crate::node::launch::merge_env;

/// The gateway's counters in one line: `gateway: 3 requests, 120 input tokens (40 cached),
/// 15 output tokens`, with refused requests and upstream errors when there were any.
pub fn summary(s: &GatewayStats) -> String {
    let plural = |n: u64, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
    let mut line = format!(
        "gateway: {}, {} ({} cached), {}",
        plural(s.requests, "request"),
        plural(s.input_tokens, "input token"),
        s.cached_tokens,
        plural(s.output_tokens, "output token"),
    );
    if s.refused > 0 {
        line.push_str(&format!(", {} refused", s.refused));
    }
    if s.upstream_errors > 0 {
        line.push_str(&format!(
            ", {}",
            plural(s.upstream_errors, "upstream error")
        ));
    }
    line
}
