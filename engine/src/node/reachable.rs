//! The pre-flight check of the endpoints a run depends on: before any VM starts, every agent
//! node's model endpoint (`llm.base_url`, `VOIDBOX_LLM_BASE_URL` or the provider's default)
//! must accept a TCP connection from this host, so that a local model server that is not up
//! costs a second, not the minutes an agent VM takes to find out. `apply --no-endpoint-check`
//! skips it (for an endpoint that comes up while the run starts).
//!
//! Only reachability is checked (DNS, then a TCP connect within [`CONNECT_TIMEOUT`]): no
//! request is sent, so nothing is billed and no credential leaves the host. An endpoint the
//! host reaches through an HTTP proxy (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, minus
//! `NO_PROXY`; never for loopback, as the gateway does) is checked by connecting to the proxy.

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use url::Url;

use super::refusals::NodeField;
use crate::plan::{Action, Plan};
use crate::providers::{Endpoint, ENV_BASE_URL};

/// How long one connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// An endpoint that did not accept a connection, and the nodes that depend on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreachable {
    /// The URL as configured.
    pub url: String,
    /// What was connected to, when it is not the URL's own host (a proxy).
    pub via: Option<String>,
    /// Why: `connection refused (127.0.0.1:8091)`, `no address for …`, `timed out …`.
    pub why: String,
    /// The nodes using it, in plan order.
    pub nodes: Vec<String>,
}

/// Where a node's endpoint URL was set, for locating the refusal.
pub fn url_field(plan: &Plan, node: &str, env: &dyn Fn(&str) -> Option<String>) -> UrlSource {
    if env(ENV_BASE_URL).is_some_and(|v| !v.is_empty()) {
        return UrlSource::Env(ENV_BASE_URL);
    }
    let set = plan.graph.node_weights().any(|n| {
        n.name == node && matches!(&n.action, Action::Agent(a) if a.llm.base_url.is_some())
    });
    UrlSource::Spec(if set {
        NodeField::Llm("base_url")
    } else {
        NodeField::Provider
    })
}

/// Where an endpoint URL came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlSource {
    /// An environment variable overriding the spec.
    Env(&'static str),
    /// A spec field (`llm.base_url`, or the provider whose default it is).
    Spec(NodeField<'static>),
}

/// Connects to every distinct endpoint of `endpoints` (in parallel) and returns those that
/// failed. `env` reads the proxy variables.
pub fn check(
    plan: &Plan,
    endpoints: &HashMap<String, Endpoint>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<Unreachable> {
    // One check per URL, with its nodes in plan order.
    let mut by_url: BTreeMap<String, (Url, bool, Vec<String>)> = BTreeMap::new();
    for n in plan.graph.node_weights() {
        let Some(e) = endpoints.get(&n.name) else {
            continue;
        };
        let Some(u) = &e.upstream else {
            continue;
        };
        by_url
            .entry(u.to_string())
            .or_insert_with(|| (u.clone(), e.local, Vec::new()))
            .2
            .push(n.name.clone());
    }
    let targets: Vec<(String, Vec<String>, Option<Url>, Url)> = by_url
        .into_iter()
        .map(|(s, (u, local, nodes))| {
            let proxy = if local { None } else { proxy_for(&u, env) };
            (s, nodes, proxy, u)
        })
        .collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = targets
            .iter()
            .map(|(_, _, proxy, u)| scope.spawn(move || connect(proxy.as_ref().unwrap_or(u))))
            .collect();
        targets
            .iter()
            .zip(handles)
            .filter_map(|((url, nodes, proxy, _), h)| {
                let res = h
                    .join()
                    .unwrap_or_else(|_| Err("the check panicked".into()));
                res.err().map(|why| Unreachable {
                    url: url.clone(),
                    via: proxy.as_ref().map(redact_userinfo),
                    why,
                    nodes: nodes.clone(),
                })
            })
            .collect()
    })
}

/// `u` without its user and password (a proxy URL may carry credentials).
fn redact_userinfo(u: &Url) -> String {
    let mut u = u.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.to_string()
}

/// The HTTP proxy the gateway's client would use for `u` (reqwest reads the same variables),
/// or `None`.
fn proxy_for(u: &Url, env: &dyn Fn(&str) -> Option<String>) -> Option<Url> {
    let var = |k: &str| {
        env(k)
            .or_else(|| env(&k.to_ascii_uppercase()))
            .filter(|v| !v.trim().is_empty())
    };
    let host = u.host_str()?.to_ascii_lowercase();
    if let Some(no) = var("no_proxy") {
        let excluded = no.split(',').map(str::trim).any(|p| {
            let p = p.trim_start_matches('.').to_ascii_lowercase();
            p == "*" || (!p.is_empty() && (host == p || host.ends_with(&format!(".{p}"))))
        });
        if excluded {
            return None;
        }
    }
    let raw = match u.scheme() {
        "https" => var("https_proxy"),
        _ => var("http_proxy"),
    }
    .or_else(|| var("all_proxy"))?;
    // reqwest takes a proxy without a scheme as http://.
    Url::parse(&raw)
        .ok()
        .filter(|p| p.host_str().is_some())
        .or_else(|| Url::parse(&format!("http://{raw}")).ok())
}

/// Resolves `u`'s host and connects to its addresses in turn; `Err(why)` when none accepts.
fn connect(u: &Url) -> Result<(), String> {
    let host = u.host_str().ok_or_else(|| format!("{u} has no host"))?;
    let port = u
        .port_or_known_default()
        .ok_or_else(|| format!("{u} has no port"))?;
    // `[::1]` → `::1` for the resolver.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host} does not resolve: {e}"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("{host} has no address"));
    }
    let mut last = String::new();
    for a in &addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                last = format!("no answer within {} s ({a})", CONNECT_TIMEOUT.as_secs());
            }
            Err(e) => last = format!("{} ({a})", crate::validate::io_reason(&e)),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_closed_port_is_refused_and_an_open_one_accepted() {
        let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = open.local_addr().unwrap().port();
        let ok = Url::parse(&format!("http://127.0.0.1:{port}/v1")).unwrap();
        assert_eq!(connect(&ok), Ok(()));
        drop(open);
        let why = connect(&ok).unwrap_err();
        assert!(
            why.contains("refused") && why.contains(&format!("127.0.0.1:{port}")),
            "{why}"
        );
        let why = connect(&Url::parse("http://no-such-host.invalid:80").unwrap()).unwrap_err();
        assert!(
            why.contains("no-such-host.invalid does not resolve"),
            "{why}"
        );
    }

    #[test]
    fn proxies_apply_as_the_gateway_s_client_would() {
        let api = Url::parse("https://api.example.com/v1").unwrap();
        let none = env(&[]);
        assert_eq!(proxy_for(&api, &none), None);
        let set = env(&[("HTTPS_PROXY", "user:pw@proxy.corp:3128")]);
        let p = proxy_for(&api, &set).expect("proxy");
        assert_eq!((p.host_str(), p.port()), (Some("proxy.corp"), Some(3128)));
        assert_eq!(redact_userinfo(&p), "http://proxy.corp:3128/");
        let excluded = env(&[
            ("https_proxy", "http://proxy.corp:3128"),
            ("no_proxy", "localhost, .example.com"),
        ]);
        assert_eq!(proxy_for(&api, &excluded), None);
        let http_only = env(&[("http_proxy", "http://proxy.corp:3128")]);
        assert_eq!(proxy_for(&api, &http_only), None, "https takes https_proxy");
    }
}
