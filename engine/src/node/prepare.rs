//! The one pass that makes a spec's nodes ready to run, before any VM starts, for `apply`,
//! `apply --dry-run` and `shell` alike: what voidbox cannot carry out is refused at its
//! field and line ([`super::refusals`]), telemetry settings are settled, every agent's
//! model endpoint is resolved and reached ([`super::reachable`]), `remote:` skills are
//! fetched, and the DNS upstreams are read. [`check_image`] adds the checks that need the
//! guest image (`cli:` programs, spec-named snapshots).

use std::collections::HashMap;
use std::path::PathBuf;

use super::launch as runtime;
use super::{reachable, refusals};
use crate::plan::Plan;
use crate::sandbox::GuestImage;

pub use super::refusals::Purpose;

/// What [`prepare`] checks, and for which command.
#[derive(Debug, Clone)]
pub struct Checks<'a> {
    /// The spec's text, to refuse fields at their lines; without it only the providers are
    /// checked.
    pub spec: Option<&'a refusals::SpecSource>,
    /// What the nodes are prepared for.
    pub purpose: Purpose,
    /// Connect to every model endpoint (`false`: `--no-endpoint-check`).
    pub endpoint_check: bool,
    /// `apply --trace FILE`.
    pub trace_file: Option<PathBuf>,
}

/// A plan whose nodes passed every check that needs no guest image.
#[derive(Debug)]
pub struct Prepared {
    /// Where telemetry goes.
    pub observe: crate::observe::config::Settings,
    /// Each agent node's model endpoint (by node name).
    pub endpoints: HashMap<String, crate::providers::Endpoint>,
    /// The `remote:` skills, fetched.
    pub remotes: crate::kit::Remotes,
    /// The NATs' DNS upstreams (empty when no node has network).
    pub dns_upstreams: Vec<std::net::SocketAddr>,
}

/// Runs every check that needs no guest image, in the order `apply` always made them;
/// what fails is printed (located when the spec is known) and its exit code returned: 3
/// for what cannot run here, 2 for a bad setting in the environment.
pub fn prepare(plan: &Plan, c: &Checks<'_>) -> Result<Prepared, u8> {
    if let Some(src) = c.spec {
        let r = refusals::check_spec(plan, src, c.purpose);
        if !r.is_empty() {
            eprint!("{}", refusals::render(src, &r));
            return Err(refusals::EXIT_REFUSED);
        }
    }
    // Where telemetry goes is settled (and a bad endpoint refused) before anything starts.
    let observe = crate::observe::config::resolve(
        plan.observe.as_ref(),
        &|k| std::env::var(k).ok(),
        c.trace_file.clone(),
    )
    .map_err(|e| {
        eprintln!("error: {e}");
        2
    })?;
    // Every agent's provider, key or login is checked before anything starts.
    let endpoints = match runtime::endpoints(plan, &|k| std::env::var(k).ok()) {
        Ok(e) => e,
        Err(failures) => {
            match c.spec {
                Some(src) => {
                    let r = runtime::endpoint_refusals(plan, src, failures);
                    eprint!("{}", refusals::render(src, &r));
                }
                None => {
                    for f in failures {
                        eprintln!(
                            "error: node `{}`: {}\n  help: {}",
                            f.node, f.message, f.help
                        );
                    }
                }
            }
            return Err(refusals::EXIT_REFUSED);
        }
    };
    if c.endpoint_check {
        check_endpoints(plan, c.spec, &endpoints)?;
    }
    let remotes = fetch_remotes(plan, c.spec)?;
    let dns_upstreams = dns_upstreams(plan).map_err(|e| {
        eprintln!("error: {e}");
        2
    })?;
    Ok(Prepared {
        observe,
        endpoints,
        remotes,
        dns_upstreams,
    })
}

/// The checks that need the guest image the nodes boot ([`image_refusals`]), printed at
/// their lines; exit 3 when one fails.
pub fn check_image(
    plan: &Plan,
    src: &refusals::SpecSource,
    image: &GuestImage,
    snapshots: bool,
) -> Result<(), u8> {
    let r = image_refusals(plan, src, image, snapshots);
    if r.is_empty() {
        return Ok(());
    }
    eprint!("{}", refusals::render(src, &r));
    Err(refusals::EXIT_REFUSED)
}

/// Fetches `plan`'s `remote:` skills into the cache ([`crate::kit::fetch_remotes`]) and
/// returns them (the kits are staged from them); a skill that cannot be fetched (offline, not found, refused) is
/// reported at its spec line when `spec` is known, and is exit 3 before any VM starts.
pub fn fetch_remotes(
    plan: &Plan,
    spec: Option<&refusals::SpecSource>,
) -> Result<crate::kit::Remotes, u8> {
    let failures = match crate::kit::fetch_remotes(plan, &|k| std::env::var(k).ok(), None) {
        Ok(r) => return Ok(r),
        Err(f) => f,
    };
    const HELP: &str = "check the network and the name, or pin a commit the cache holds (`remote:OWNER/REPO/SKILL@<commit>`); VOIDBOX_GITHUB_API_URL and GITHUB_TOKEN configure the source";
    match spec {
        Some(src) => {
            let r: Vec<refusals::Refusal> = failures
                .into_iter()
                .map(|f| {
                    refusals::locate(
                        plan,
                        src,
                        &f.node,
                        refusals::NodeField::Skill(f.index),
                        f.error.to_string(),
                        HELP,
                    )
                })
                .collect();
            eprint!("{}", refusals::render(src, &r));
        }
        None => {
            for f in failures {
                eprintln!("error: node `{}`: {}\n  help: {HELP}", f.node, f.error);
            }
        }
    }
    Err(refusals::EXIT_REFUSED)
}

/// Connects to every model endpoint of `endpoints` ([`reachable::check`]); on a failure
/// prints where each unreachable URL is set and returns [`refusals::EXIT_REFUSED`].
pub fn check_endpoints(
    plan: &Plan,
    spec: Option<&refusals::SpecSource>,
    endpoints: &HashMap<String, crate::providers::Endpoint>,
) -> Result<(), u8> {
    let env = |k: &str| std::env::var(k).ok();
    let down = reachable::check(plan, endpoints, &env);
    if down.is_empty() {
        return Ok(());
    }
    let help = "start it first (a local model: e.g. `scripts/local-model.sh start`), fix the URL, \
                or pass `--no-endpoint-check` if it comes up while the run starts";
    let mut r = Vec::new();
    for d in &down {
        let via = d
            .via
            .as_ref()
            .map_or(String::new(), |p| format!(" through the proxy {p}"));
        let message = format!("{} is unreachable{via}: {}", d.url, d.why);
        for node in &d.nodes {
            match (reachable::url_field(plan, node, &env), spec) {
                (reachable::UrlSource::Spec(field), Some(src)) => r.push(refusals::locate(
                    plan,
                    src,
                    node,
                    field,
                    message.clone(),
                    help,
                )),
                (reachable::UrlSource::Env(var), _) => {
                    eprintln!("error: node `{node}`: {var}: {message}\n  help: {help}")
                }
                (_, None) => eprintln!("error: node `{node}`: {message}\n  help: {help}"),
            }
        }
    }
    // Nodes sharing the spec's `llm.base_url` share one refusal.
    r.dedup_by(|a, b| (a.line, a.column, &a.message) == (b.line, b.column, &b.message));
    match spec.filter(|_| !r.is_empty()) {
        Some(src) => eprint!("{}", refusals::render(src, &r)),
        None => eprintln!("error: a model endpoint is unreachable; nothing was started"),
    }
    Err(refusals::EXIT_REFUSED)
}

/// The refusals that depend on the guest image the nodes boot: `run.program`s and `cli:`
/// skills whose program is not on its `PATH`, and spec-named snapshots that cannot restore their node (checked
/// only when `snapshots` is on; `--no-snapshot` ignores them).
pub fn image_refusals(
    plan: &Plan,
    src: &refusals::SpecSource,
    image: &GuestImage,
    snapshots: bool,
) -> Vec<refusals::Refusal> {
    let programs = image
        .vmlinux
        .parent()
        .and_then(crate::image::layout::image_path_programs);
    let store = snapshots
        .then(|| crate::snapshot::Store::open(None).ok())
        .flatten();
    let check = |n: &crate::plan::PlanNode, value: &str| -> Result<(), String> {
        let Some(store) = &store else { return Ok(()) };
        let mut cfg = crate::sandbox::SandboxConfig::new(image.clone());
        cfg.memory_mb = u32::try_from(n.sandbox.memory_mb).unwrap_or(u32::MAX);
        cfg.vcpus = u8::try_from(n.sandbox.vcpus).unwrap_or(u8::MAX);
        cfg.network = n
            .sandbox
            .network
            .clone()
            .map(|p| crate::network::nat_config(p, &[]));
        crate::snapshot::explicit(store, value, &plan.spec_dir, &cfg)
            .map(drop)
            .map_err(|e| match e {
                crate::sandbox::SandboxError::Environment(m) => m,
                e => e.to_string(),
            })
    };
    refusals::check_image(
        plan,
        src,
        &refusals::ImageFacts {
            path_programs: programs.as_ref(),
            snapshot: Some(&check),
        },
    )
}

/// The DNS upstreams of `VOIDBOX_DNS_UPSTREAMS` when a node of `plan` has network (an
/// invalid value is an error before any VM starts; without network it is not read).
pub fn dns_upstreams(plan: &Plan) -> Result<Vec<std::net::SocketAddr>, String> {
    if plan
        .graph
        .node_weights()
        .any(|n| n.sandbox.network.is_some())
    {
        crate::network::upstreams::from_env()
    } else {
        Ok(Vec::new())
    }
}
