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
//! A gateway can instead listen on a Unix socket ([`Listen::Unix`]: mode 0600, in a
//! directory only this user may write; the guest reaches it through a NAT service route at
//! [`UNIX_GUEST_ADDR`]), accept a given placeholder token ([`GatewayOptions::token`], the one
//! baked into a warm snapshot) and give its VM its own identity toward the provider
//! ([`GatewayOptions::fresh_identity`], see [`identity`]).
//!
//! The gateway runs on its own thread with its own single-threaded tokio runtime, so it can
//! be started from async or blocking code; it stops on [`Gateway::stop`] or drop (a Unix
//! socket's file is removed then).

pub mod identity;
mod proxy;
pub(crate) mod tls;
mod usage;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::providers::{Endpoint, Secret};

/// Largest request body forwarded; larger ones get 413. Bodies are streamed, not held
/// (except JSON bodies under [`GatewayOptions::fresh_identity`], read whole to be rewritten).
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
/// The guest's address of a gateway on a Unix socket (a NAT service route to the socket),
/// used by [`Gateway::guest_base_url`] for [`Listen::Unix`].
pub const UNIX_GUEST_ADDR: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 3, 254), 80);

/// Where a gateway listens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Listen {
    /// Host loopback, an ephemeral port (`127.0.0.1:0`).
    #[default]
    Tcp,
    /// A Unix socket created at this path (mode 0600). The path must not exist, and its
    /// directory must belong to this user and be writable by no one else.
    Unix(PathBuf),
}

/// Options of [`Gateway::start_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayOptions {
    /// Extra root CAs (PEM) trusted for the upstream, besides the webpki and native roots.
    pub ca_file: Option<PathBuf>,
    /// Where to listen.
    pub listen: Listen,
    /// The placeholder token to accept (`vbx-` and 48 lowercase hex digits, as minted);
    /// `None` mints a fresh one.
    pub token: Option<Secret>,
    /// Replace the runtime's session and device ids with ones minted for this gateway
    /// ([`identity`]), so clones of one warm runtime do not share them.
    pub fresh_identity: bool,
}

impl GatewayOptions {
    /// Options from the environment ([`ENV_CA_FILE`]); the rest default.
    pub fn from_env() -> GatewayOptions {
        GatewayOptions {
            ca_file: std::env::var_os(ENV_CA_FILE)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            ..GatewayOptions::default()
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
    /// The placeholder token or the identity could not be generated.
    #[error("gateway: no randomness for the token: {0}")]
    Random(String),
    /// The given placeholder token is not one the gateway mints (the value is not shown).
    #[error("gateway: the given placeholder token is not `vbx-` and 48 lowercase hex digits")]
    BadToken,
    /// The Unix socket could not be created where asked.
    #[error("gateway socket {}: {reason}", path.display())]
    Socket {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
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

/// Where a running gateway listens.
#[derive(Debug)]
enum Bound {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// A running per-VM gateway.
pub struct Gateway {
    addr: Bound,
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

    /// Starts a gateway for `endpoint`: binds `127.0.0.1:0` (or the Unix socket of
    /// [`GatewayOptions::listen`]) and serves on its own thread.
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
        let token = match &options.token {
            Some(t) if valid_token(t.expose()) => t.clone(),
            Some(_) => return Err(GatewayError::BadToken),
            None => Secret::new(new_token()?),
        };
        let identity = if options.fresh_identity {
            Some(identity::Identity::mint().map_err(|e| GatewayError::Random(e.to_string()))?)
        } else {
            None
        };
        let counters = Arc::new(Counters::default());
        let guest_path = endpoint.guest_path().to_string();
        let shared = Arc::new(proxy::Shared {
            token: token.clone(),
            upstream,
            prefix: guest_path.clone(),
            credential: endpoint.credential.clone(),
            client,
            counters: counters.clone(),
            identity,
            buffering: tokio::sync::Semaphore::new(proxy::MAX_BUFFERED),
        });

        let (listener, addr) = match &options.listen {
            Listen::Tcp => {
                let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
                l.set_nonblocking(true)?;
                let addr = l.local_addr()?;
                (proxy::Listener::Tcp(l), Bound::Tcp(addr))
            }
            Listen::Unix(path) => {
                let l = bind_unix(path)?;
                let bound = Bound::Unix(path.clone());
                if let Err(e) = l.set_nonblocking(true) {
                    let _ = std::fs::remove_file(path);
                    return Err(e.into());
                }
                (proxy::Listener::Unix(l), bound)
            }
        };
        let unix_path = match &addr {
            Bound::Unix(p) => Some(p.clone()),
            Bound::Tcp(_) => None,
        };
        let cleanup = |e: std::io::Error| {
            if let Some(p) = &unix_path {
                let _ = std::fs::remove_file(p);
            }
            GatewayError::Io(e)
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(cleanup)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("voidbox-gateway".to_string())
            .spawn(move || {
                rt.block_on(proxy::serve(listener, shared, rx));
                // Blocking tasks (name resolution) are not waited on for long.
                rt.shutdown_timeout(Duration::from_millis(500));
            })
            .map_err(cleanup)?;
        Ok(Gateway {
            addr,
            token,
            guest_path,
            counters,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    /// The host loopback port it listens on (allow it in the VM's NAT policy); `None` on a
    /// Unix socket.
    pub fn port(&self) -> Option<u16> {
        match &self.addr {
            Bound::Tcp(a) => Some(a.port()),
            Bound::Unix(_) => None,
        }
    }

    /// The Unix socket it listens on (the target of the VM's NAT service route); `None` on
    /// TCP.
    pub fn unix_path(&self) -> Option<&Path> {
        match &self.addr {
            Bound::Unix(p) => Some(p),
            Bound::Tcp(_) => None,
        }
    }

    /// The per-VM placeholder token the guest's runtime uses as its API key.
    pub fn token(&self) -> &str {
        self.token.expose()
    }

    /// The base URL the guest's runtime uses: `http://10.0.2.2:PORT` (on a Unix socket
    /// `http://10.0.3.254`, [`UNIX_GUEST_ADDR`]) plus the upstream's path
    /// (`ANTHROPIC_BASE_URL` for Claude Code, the model provider's `base_url` for Codex).
    pub fn guest_base_url(&self) -> String {
        match &self.addr {
            Bound::Tcp(a) => format!("http://{GUEST_HOST}:{}{}", a.port(), self.guest_path),
            Bound::Unix(_) => format!("http://{}{}", UNIX_GUEST_ADDR.ip(), self.guest_path),
        }
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
            if let Bound::Unix(p) = &self.addr {
                let _ = std::fs::remove_file(p);
            }
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

/// Creates the listening Unix socket at `path`, mode 0600 from the start (set on the socket
/// before `bind`, so the file never exists with wider permissions).
fn bind_unix(path: &Path) -> Result<UnixListener, GatewayError> {
    let fail = |reason: String| GatewayError::Socket {
        path: path.to_path_buf(),
        reason,
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = std::fs::metadata(parent)
        .map_err(|e| fail(format!("its directory {}: {e}", parent.display())))?;
    if !dir.is_dir() {
        return Err(fail(format!("{} is not a directory", parent.display())));
    }
    if dir.mode() & 0o022 != 0 {
        return Err(fail(format!(
            "its directory {} is writable by group or others (mode {:o}); use a private one",
            parent.display(),
            dir.mode() & 0o7777
        )));
    }
    if dir.uid() != rustix::process::geteuid().as_raw() {
        return Err(fail(format!(
            "its directory {} belongs to another user",
            parent.display()
        )));
    }
    if std::fs::symlink_metadata(path).is_ok() {
        return Err(fail("already exists".to_string()));
    }
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let addr = SocketAddrUnix::new(path).map_err(|e| fail(format!("not a socket path: {e}")))?;
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| fail(format!("socket: {e}")))?;
    // The socket file gets the socket's mode (less the umask) at bind.
    rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o600))
        .map_err(|e| fail(format!("fchmod: {e}")))?;
    rustix::net::bind(&fd, &addr).map_err(|e| fail(format!("bind: {e}")))?;
    let checked = std::fs::symlink_metadata(path)
        .map_err(|e| e.to_string())
        .and_then(|m| {
            if m.mode() & 0o777 == 0o600 {
                Ok(())
            } else {
                Err(format!("created with mode {:o}, not 600", m.mode() & 0o777))
            }
        })
        .and_then(|()| rustix::net::listen(&fd, 128).map_err(|e| format!("listen: {e}")));
    if let Err(reason) = checked {
        let _ = std::fs::remove_file(path);
        return Err(fail(reason));
    }
    Ok(UnixListener::from(fd))
}

/// Whether `t` is a placeholder token as [`new_token`] makes them.
fn valid_token(t: &str) -> bool {
    t.strip_prefix("vbx-")
        .is_some_and(|h| h.len() == 48 && h.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
}

/// A fresh placeholder token: `vbx-` and 192 random bits in hex.
fn new_token() -> Result<String, GatewayError> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| GatewayError::Random(e.to_string()))?;
    Ok(format!("vbx-{}", hex::encode(bytes)))
}

#[cfg(test)]
mod tests;
