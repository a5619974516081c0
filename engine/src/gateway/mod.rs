//! The per-VM credential gateway: API keys never enter the guest.
//!
//! One [`Gateway`] per agent VM listens on host `127.0.0.1:PORT` (an ephemeral port; the
//! guest reaches it as `GATEWAY_IP:PORT` through the NAT, the one host port its policy
//! allows). The guest's runtime gets [`Gateway::guest_base_url`] and a random per-VM
//! placeholder [`Gateway::token`] as its API key. For every request the gateway:
//!
//! 1. refuses it (401 without a token, 403 with a wrong one; JSON body, counted in
//!    [`GatewayStats::refused`], never forwarded) unless it carries the token as
//!    `x-api-key: TOKEN` or `Authorization: Bearer TOKEN`;
//! 2. refuses a path outside the upstream's own path prefix (404), a body over
//!    [`MAX_REQUEST_BODY`] (413: at once for a declared length, else when the streamed body
//!    passes it, aborting the upstream request) and `CONNECT` (405);
//! 3. drops hop-by-hop headers, `Host`, every client credential (`Authorization`,
//!    `x-api-key`, `api-key`, `Proxy-Authorization`, `Cookie`) and `Accept-Encoding` (asks
//!    for `identity` so usage can be read), adds the real
//!    [`Credential`](crate::providers::Credential), and forwards
//!    method, path, query and body to the upstream (no redirects followed);
//! 4. streams the response back as it arrives (SSE included), reading the token usage from
//!    the stream on the way ([`usage`]).
//!
//! Paths map 1:1: the guest's base URL is `http://GATEWAY_IP:PORT` plus the upstream's path
//! ([`Endpoint::guest_path`]), so guest `POST /v1/messages` goes to
//! `https://api.anthropic.com/v1/messages`, and for codex (upstream
//! `https://api.openai.com/v1`, guest base `http://10.0.2.2:PORT/v1`) guest
//! `POST /v1/responses` goes to `https://api.openai.com/v1/responses`.
//!
//! Upstream TLS is rustls (ring) with the webpki roots and the host's native roots, plus the
//! PEM certificates in `VOIDBOX_GATEWAY_CA_FILE` ([`ENV_CA_FILE`]). Neither the credential
//! nor the token is ever logged or put in an error body.
//!
//! The gateway runs on its own thread with its own single-threaded tokio runtime, so it can
//! be started from async or blocking code; it stops on [`Gateway::stop`] or drop.

mod proxy;
pub(crate) mod tls;
mod usage;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::providers::{Endpoint, Secret};

/// Largest request body forwarded; larger ones get 413. Bodies are streamed, not held.
pub const MAX_REQUEST_BODY: usize = 32 << 20;
/// Most concurrent client connections; more are closed at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Time allowed for a client to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Time allowed to connect to the upstream.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Extra upstream root CAs (a PEM file), read by [`GatewayOptions::from_env`].
pub const ENV_CA_FILE: &str = "VOIDBOX_GATEWAY_CA_FILE";
/// The guest's address of the gateway (the NAT maps it to host loopback).
pub const GUEST_HOST: Ipv4Addr = voidbox_net::GATEWAY_IP;

/// Options of [`Gateway::start_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayOptions {
    /// Extra root CAs (PEM) trusted for the upstream, besides the webpki and native roots.
    pub ca_file: Option<PathBuf>,
}

impl GatewayOptions {
    /// Options from the environment ([`ENV_CA_FILE`]).
    pub fn from_env() -> GatewayOptions {
        GatewayOptions {
            ca_file: std::env::var_os(ENV_CA_FILE)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        }
    }
}

/// Counters of one gateway (cumulative since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GatewayStats {
    /// Requests forwarded upstream (those that failed upstream included).
    pub requests: u64,
    /// Requests refused by the gateway (token, path, size, method): never forwarded.
    pub refused: u64,
    /// Forwarded requests that got no response from the upstream (answered 502).
    pub upstream_errors: u64,
    /// Input tokens the upstream reported (cached ones included).
    pub input_tokens: u64,
    /// Output tokens the upstream reported.
    pub output_tokens: u64,
    /// Input tokens served from the provider's prompt cache (part of `input_tokens`).
    pub cached_tokens: u64,
}

/// A gateway that could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The endpoint has no upstream (`provider: mock`).
    #[error("provider `{0}` has no upstream endpoint to proxy")]
    NoUpstream(&'static str),
    /// Binding the loopback listener or starting its thread failed.
    #[error("gateway: {0}")]
    Io(#[from] std::io::Error),
    /// The upstream TLS configuration could not be built (e.g. a bad CA file).
    #[error("gateway TLS: {0}")]
    Tls(String),
    /// The placeholder token could not be generated.
    #[error("gateway: no randomness for the token: {0}")]
    Random(String),
    /// The HTTP client could not be built.
    #[error("gateway HTTP client: {0}")]
    Client(String),
}

/// Shared counters, updated by the connection tasks.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) upstream_errors: AtomicU64,
    pub(crate) input_tokens: AtomicU64,
    pub(crate) output_tokens: AtomicU64,
    pub(crate) cached_tokens: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> GatewayStats {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        GatewayStats {
            requests: r(&self.requests),
            refused: r(&self.refused),
            upstream_errors: r(&self.upstream_errors),
            input_tokens: r(&self.input_tokens),
            output_tokens: r(&self.output_tokens),
            cached_tokens: r(&self.cached_tokens),
        }
    }
}

/// A running per-VM gateway.
pub struct Gateway {
    addr: SocketAddr,
    token: Secret,
    guest_path: String,
    counters: Arc<Counters>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("addr", &self.addr)
            .field("token", &self.token)
            .field("guest_path", &self.guest_path)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// Starts a gateway for `endpoint` with [`GatewayOptions::from_env`].
    pub fn start(endpoint: &Endpoint) -> Result<Gateway, GatewayError> {
        Gateway::start_with(endpoint, &GatewayOptions::from_env())
    }

    /// Starts a gateway for `endpoint`: binds `127.0.0.1:0` and serves on its own thread.
    pub fn start_with(
        endpoint: &Endpoint,
        options: &GatewayOptions,
    ) -> Result<Gateway, GatewayError> {
        let upstream = endpoint
            .upstream
            .clone()
            .ok_or(GatewayError::NoUpstream(endpoint.provider.as_str()))?;
        let tls = tls::client_config(options.ca_file.as_deref()).map_err(GatewayError::Tls)?;
        let mut client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(UPSTREAM_CONNECT_TIMEOUT)
            .pool_idle_timeout(Duration::from_secs(60));
        if endpoint.local {
            // A loopback upstream never goes through the host's HTTP proxy.
            client = client.no_proxy();
        }
        let client = client
            .build()
            .map_err(|e| GatewayError::Client(e.to_string()))?;
        let token = Secret::new(new_token()?);
        let counters = Arc::new(Counters::default());
        let guest_path = endpoint.guest_path().to_string();
        let shared = Arc::new(proxy::Shared {
            token: token.clone(),
            upstream,
            prefix: guest_path.clone(),
            credential: endpoint.credential.clone(),
            client,
            counters: counters.clone(),
        });

        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("voidbox-gateway".to_string())
            .spawn(move || {
                rt.block_on(proxy::serve(listener, shared, rx));
                // Blocking tasks (name resolution) are not waited on for long.
                rt.shutdown_timeout(Duration::from_millis(500));
            })?;
        Ok(Gateway {
            addr,
            token,
            guest_path,
            counters,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    /// The host loopback port it listens on (allow it in the VM's NAT policy).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The per-VM placeholder token the guest's runtime uses as its API key.
    pub fn token(&self) -> &str {
        self.token.expose()
    }

    /// The base URL the guest's runtime uses: `http://10.0.2.2:PORT` plus the upstream's path
    /// (`ANTHROPIC_BASE_URL` for Claude Code, the model provider's `base_url` for Codex).
    pub fn guest_base_url(&self) -> String {
        format!("http://{GUEST_HOST}:{}{}", self.port(), self.guest_path)
    }

    /// The counters so far.
    pub fn stats(&self) -> GatewayStats {
        self.counters.snapshot()
    }

    /// Stops serving (open connections are closed) and returns the final counters.
    pub fn stop(mut self) -> GatewayStats {
        self.shut_down();
        self.stats()
    }

    fn shut_down(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// The network policy of a VM whose runtime talks to its gateway on host loopback port
/// `gateway_port`: `node`'s own policy with that port allowed, or — for a node without
/// network — a NAT that reaches the gateway only (no public egress). Without a gateway,
/// `node` as it is.
pub fn guest_network(
    node: Option<voidbox_net::NetworkPolicy>,
    gateway_port: Option<u16>,
) -> Option<voidbox_net::NetworkPolicy> {
    match (node, gateway_port) {
        (Some(mut p), Some(port)) => {
            if !p.allow_host_ports.contains(&port) {
                p.allow_host_ports.push(port);
            }
            Some(p)
        }
        (None, Some(port)) => Some(voidbox_net::NetworkPolicy {
            allow_host_ports: vec![port],
            public_egress: false,
            ..voidbox_net::NetworkPolicy::default()
        }),
        (p, None) => p,
    }
}

/// A fresh placeholder token: `vbx-` and 192 random bits in hex.
fn new_token() -> Result<String, GatewayError> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| GatewayError::Random(e.to_string()))?;
    Ok(format!("vbx-{}", hex::encode(bytes)))
}

#[cfg(test)]
mod tests;
