//! The gateway's HTTP/1.1 server and its one handler: token check, header filtering,
//! credential swap, forwarding, streamed and metered responses.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use url::Url;

use super::identity::Identity;
use super::usage::Sniffer;
use super::{Counters, HEADER_READ_TIMEOUT, MAX_CONNECTIONS, MAX_REQUEST_BODY};
use crate::error_chain::error_chain;
use crate::providers::{Credential, Secret, OAUTH_BETA};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The gateway's response body.
pub(crate) type GatewayBody = UnsyncBoxBody<Bytes, BoxError>;

/// What every connection task needs.
pub(crate) struct Shared {
    pub(crate) token: Secret,
    pub(crate) upstream: Url,
    /// The upstream's path without a trailing `/` (`""` for a root URL).
    pub(crate) prefix: String,
    pub(crate) credential: Option<Credential>,
    pub(crate) client: reqwest::Client,
    pub(crate) counters: Arc<Counters>,
    /// Set with [`super::GatewayOptions::fresh_identity`]: JSON bodies are read whole (up to
    /// [`MAX_REQUEST_BODY`]) and rewritten.
    pub(crate) identity: Option<Identity>,
    /// Bodies being read whole at a time ([`MAX_BUFFERED`]); more wait their turn.
    pub(crate) buffering: tokio::sync::Semaphore,
}

/// Most request bodies held in memory at once (for a [`Shared::identity`] rewrite).
pub(crate) const MAX_BUFFERED: usize = 4;

/// A bound listening socket, handed to [`serve`].
pub(crate) enum Listener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded either way.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];
/// Request headers the gateway drops: the client's credentials (the placeholder token among
/// them), what the HTTP client sets itself, and compression (usage is read as it streams).
const DROPPED_REQUEST: [&str; 8] = [
    "host",
    "content-length",
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "cookie",
    "accept-encoding",
];

/// The listener on the tokio runtime.
enum Accepting {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// One accepted connection.
enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl Accepting {
    async fn accept(&self) -> std::io::Result<Conn> {
        match self {
            Accepting::Tcp(l) => l.accept().await.map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Conn::Tcp(s)
            }),
            Accepting::Unix(l) => l.accept().await.map(|(s, _)| Conn::Unix(s)),
        }
    }
}

/// Accepts connections until `shutdown` fires (or its sender is dropped).
pub(crate) async fn serve(
    listener: Listener,
    shared: Arc<Shared>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match listener {
        Listener::Tcp(l) => tokio::net::TcpListener::from_std(l).map(Accepting::Tcp),
        Listener::Unix(l) => tokio::net::UnixListener::from_std(l).map(Accepting::Unix),
    };
    let Ok(listener) = listener else {
        return;
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => {
                let Ok(conn) = accepted else {
                    // Out of descriptors or an aborted handshake: try again shortly.
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    continue; // over MAX_CONNECTIONS: closed at once
                };
                let shared = shared.clone();
                match conn {
                    Conn::Tcp(s) => spawn_connection(s, shared, slot),
                    Conn::Unix(s) => spawn_connection(s, shared, slot),
                }
            }
        }
    }
}

/// Serves HTTP/1.1 on one connection, holding its `slot` until it closes.
fn spawn_connection<S>(stream: S, shared: Arc<Shared>, slot: tokio::sync::OwnedSemaphorePermit)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let _slot = slot;
        let service = service_fn(move |req| handle(shared.clone(), req));
        let _ = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service)
            .await;
    });
}

/// Whether a request carries the placeholder token.
#[derive(Debug, PartialEq, Eq)]
enum Auth {
    Ok,
    Missing,
    Wrong,
}

fn check_token(headers: &HeaderMap, token: &Secret) -> Auth {
    let token = token.expose().as_bytes();
    let mut any = false;
    for v in headers.get_all("x-api-key") {
        any = true;
        if ct_eq(v.as_bytes(), token) {
            return Auth::Ok;
        }
    }
    for v in headers.get_all(header::AUTHORIZATION) {
        any = true;
        let v = v.as_bytes();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") && ct_eq(&v[7..], token) {
            return Auth::Ok;
        }
    }
    if any {
        Auth::Wrong
    } else {
        Auth::Missing
    }
}

/// Equality whose time does not depend on where the inputs differ.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An Anthropic-shaped error (`error.message` is also what OpenAI clients print).
fn error(status: StatusCode, kind: &str, message: &str) -> Response<GatewayBody> {
    let body = serde_json::json!({
        "type": "error",
        "error": {"type": kind, "message": format!("voidbox gateway: {message}")},
    });
    let mut resp = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Handles one request (never fails: errors become responses).
async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<GatewayBody>, Infallible> {
    let refuse = |status, kind, message: &str| {
        shared.counters.refused.fetch_add(1, Ordering::Relaxed);
        Ok(error(status, kind, message))
    };
    match check_token(req.headers(), &shared.token) {
        Auth::Ok => {}
        Auth::Missing => {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing API key: send this VM's token as x-api-key or a bearer token",
            )
        }
        Auth::Wrong => {
            return refuse(
                StatusCode::FORBIDDEN,
                "permission_error",
                "the API key is not this VM's gateway token",
            )
        }
    }
    if req.method() == Method::CONNECT {
        return refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "CONNECT is not supported",
        );
    }
    let Some(url) = target(&shared.upstream, &shared.prefix, req.uri()) else {
        return refuse(
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!("path outside the upstream's prefix `{}/`", shared.prefix),
        );
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_REQUEST_BODY as u64) {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            &format!("request body over {MAX_REQUEST_BODY} bytes"),
        );
    }
    let (parts, body) = req.into_parts();
    let fault = Arc::new(AtomicU8::new(BODY_OK));
    let mut headers = upstream_headers(&parts.headers, shared.credential.as_ref());
    let body = match &shared.identity {
        Some(identity) if is_json(&parts.headers) => {
            identity.rewrite_headers(&mut headers);
            // A JSON body is read whole to replace the ids in it (a few at a time).
            let permit = shared.buffering.acquire().await;
            let read = http_body_util::Limited::new(body, MAX_REQUEST_BODY)
                .collect()
                .await
                .map(|b| b.to_bytes());
            let bytes = match read {
                Ok(b) => b,
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    return refuse(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "request_too_large",
                        &format!("request body over {MAX_REQUEST_BODY} bytes"),
                    )
                }
                Err(_) => {
                    return refuse(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        "the request body could not be read",
                    )
                }
            };
            let bytes = identity
                .rewrite_body(&bytes)
                .map(Bytes::from)
                .unwrap_or(bytes);
            drop(permit);
            reqwest::Body::from(bytes)
        }
        identity => {
            if let Some(identity) = identity {
                identity.rewrite_headers(&mut headers);
            }
            reqwest::Body::wrap(Capped {
                inner: body,
                left: MAX_REQUEST_BODY,
                fault: fault.clone(),
            })
        }
    };

    let sent = shared
        .client
        .request(parts.method, url)
        .headers(headers)
        .body(body)
        .send()
        .await;
    // On a body fault the upstream got a cut request and its connection was aborted.
    match fault.load(Ordering::Relaxed) {
        BODY_TOO_LARGE => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                &format!("request body over {MAX_REQUEST_BODY} bytes"),
            )
        }
        BODY_BROKEN => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "the request body could not be read",
            )
        }
        _ => {}
    }
    shared.counters.requests.fetch_add(1, Ordering::Relaxed);
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            shared
                .counters
                .upstream_errors
                .fetch_add(1, Ordering::Relaxed);
            return Ok(error(
                StatusCode::BAD_GATEWAY,
                "api_error",
                &format!(
                    "upstream {} unreachable: {}",
                    origin(&shared.upstream),
                    error_chain(&e)
                ),
            ));
        }
    };
    let resp: Response<reqwest::Body> = resp.into();
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let sniffer = Sniffer::new(content_type, shared.counters.clone());
    let body = Metered {
        inner: body,
        sniffer,
        done: false,
    };
    Ok(Response::from_parts(
        parts,
        body.map_err(|e| Box::new(e) as BoxError).boxed_unsync(),
    ))
}

/// Whether the request says its body is JSON (`application/json`, `…+json`).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase())
        .is_some_and(|m| m == "application/json" || m.ends_with("+json"))
}

/// The upstream URL for a request path: the same path and query on the upstream's origin,
/// when the path (after normalization) is the prefix or under it.
fn target(upstream: &Url, prefix: &str, uri: &hyper::Uri) -> Option<Url> {
    let path = uri.path();
    if !path.starts_with('/') {
        return None;
    }
    let mut url = upstream.clone();
    url.set_path(path);
    url.set_query(uri.query());
    let p = url.path();
    let inside = prefix.is_empty()
        || p == prefix
        || p.strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'));
    inside.then_some(url)
}

/// The request headers sent upstream: the client's minus hop-by-hop, credentials and
/// compression, plus the real credential.
fn upstream_headers(client: &HeaderMap, credential: Option<&Credential>) -> HeaderMap {
    let named = connection_named(client);
    let mut out = HeaderMap::with_capacity(client.len() + 2);
    for (name, value) in client {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || DROPPED_REQUEST.contains(&n) || named.contains(name) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    let sensitive = |s: &str| {
        // The provider module admits only visible ASCII, so this cannot fail in practice.
        let mut v = HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(""));
        v.set_sensitive(true);
        v
    };
    match credential {
        None => {}
        Some(Credential::ApiKey(k)) => {
            out.insert("x-api-key", sensitive(k.expose()));
        }
        Some(Credential::Bearer(k)) => {
            out.insert(
                header::AUTHORIZATION,
                sensitive(&format!("Bearer {}", k.expose())),
            );
        }
        Some(Credential::ClaudeLogin(k)) => {
            out.insert(
                header::AUTHORIZATION,
                sensitive(&format!("Bearer {}", k.expose())),
            );
            let mut betas: Vec<String> = out
                .get_all("anthropic-beta")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(|b| b.trim().to_string())
                .filter(|b| !b.is_empty())
                .collect();
            if !betas.iter().any(|b| b == OAUTH_BETA) {
                betas.push(OAUTH_BETA.to_string());
            }
            if let Ok(v) = HeaderValue::from_str(&betas.join(",")) {
                out.insert("anthropic-beta", v);
            }
        }
    }
    out
}

/// Header names listed in `Connection` (hop-by-hop for this message).
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect()
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in connection_named(headers) {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// `scheme://host[:port]` of the upstream (no path, nothing secret).
fn origin(url: &Url) -> String {
    url.origin().ascii_serialization()
}

/// [`Capped::fault`]: the body was read without fault.
const BODY_OK: u8 = 0;
/// [`Capped::fault`]: the body was longer than [`MAX_REQUEST_BODY`].
const BODY_TOO_LARGE: u8 = 1;
/// [`Capped::fault`]: the client's body broke off.
const BODY_BROKEN: u8 = 2;

/// The client's request body, streamed upstream (memory per request stays small). More than
/// `left` bytes, or a read error, is an error that aborts the upstream request, recorded in
/// `fault` so the client gets 413 or 400 rather than 502.
struct Capped {
    inner: Incoming,
    left: usize,
    fault: Arc<AtomicU8>,
}

impl Body for Capped {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, Bytes::len);
                if n > this.left {
                    this.fault.store(BODY_TOO_LARGE, Ordering::Relaxed);
                    return Poll::Ready(Some(Err("request body too large".into())));
                }
                this.left -= n;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.fault.store(BODY_BROKEN, Ordering::Relaxed);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The upstream body, passed through frame by frame while its usage is read.
struct Metered {
    inner: reqwest::Body,
    sniffer: Sniffer,
    done: bool,
}

impl Metered {
    fn end(&mut self) {
        if !self.done {
            self.done = true;
            self.sniffer.finish();
        }
    }
}

impl Body for Metered {
    type Data = Bytes;
    type Error = reqwest::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, reqwest::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.sniffer.feed(data);
                }
                if this.inner.is_end_stream() {
                    this.end();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.end();
                Poll::Ready(None)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn token_check() {
        let token = Secret::new("vbx-abc");
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(*k, HeaderValue::from_static(v));
            }
            m
        };
        assert_eq!(check_token(&h(&[]), &token), Auth::Missing);
        assert_eq!(
            check_token(&h(&[("x-api-key", "vbx-abc")]), &token),
            Auth::Ok
        );
        assert_eq!(
            check_token(&h(&[("authorization", "bearer vbx-abc")]), &token),
            Auth::Ok
        );
        assert_eq!(
            check_token(&h(&[("authorization", "Bearer vbx-abd")]), &token),
            Auth::Wrong
        );
        assert_eq!(
            check_token(&h(&[("x-api-key", "vbx-ab")]), &token),
            Auth::Wrong
        );
        assert_eq!(
            check_token(&h(&[("authorization", "Basic vbx-abc")]), &token),
            Auth::Wrong
        );
    }

    #[test]
    fn paths_map_under_the_prefix_only() {
        let up = Url::parse("https://api.openai.com/v1").unwrap();
        let t =
            |p: &str| target(&up, "/v1", &p.parse::<hyper::Uri>().unwrap()).map(|u| u.to_string());
        assert_eq!(
            t("/v1/responses?x=1").as_deref(),
            Some("https://api.openai.com/v1/responses?x=1")
        );
        assert_eq!(t("/v1").as_deref(), Some("https://api.openai.com/v1"));
        assert_eq!(t("/v1x/responses"), None);
        assert_eq!(t("/v1/../admin"), None);
        assert_eq!(t("/v1/%2e%2e/admin"), None);
        assert_eq!(t("/other"), None);
        let root = Url::parse("https://api.anthropic.com").unwrap();
        assert_eq!(
            target(&root, "", &"/v1/messages?beta=true".parse().unwrap())
                .map(|u| u.to_string())
                .as_deref(),
            Some("https://api.anthropic.com/v1/messages?beta=true")
        );
    }
}
