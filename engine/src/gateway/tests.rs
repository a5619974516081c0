//! The gateway against real upstream HTTP(S) servers started here (hyper, rustls with a
//! self-signed CA from rcgen) that record what they received.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::header::HeaderMap;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, Notify};
use url::Url;

use super::*;
use crate::providers::{Credential, Endpoint, Runtime, Secret};
use crate::spec::model::Provider;

const REAL_KEY: &str = "sk-real-upstream-key-0123456789";
const WAIT: Duration = Duration::from_secs(10);

const MESSAGE_START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":2000,\"output_tokens\":1}}}\n\n";
const MESSAGE_REST: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":57}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
const RESPONSES_SSE: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"usage\":null}}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":328,\"input_tokens_details\":{\"cached_tokens\":256},\"output_tokens\":52,\"total_tokens\":380}}}\n\n";
const MESSAGE_JSON: &str = r#"{"id":"msg_2","type":"message","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":7,"cache_read_input_tokens":3,"output_tokens":4}}"#;

/// One request the upstream received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path_and_query: String,
    headers: HeaderMap,
    body: Bytes,
}

/// A body fed from a channel (the upstream's streamed responses).
struct ChanBody(mpsc::Receiver<Bytes>);

impl Body for ChanBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// A real upstream: `/v1/messages` streams Anthropic SSE and holds back everything after
/// `message_start` until `release` is notified; `/v1/responses` streams OpenAI SSE;
/// `/json` answers a non-streamed message; anything else `ok`.
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    release: Arc<Notify>,
    finished: Arc<std::sync::atomic::AtomicBool>,
}

impl Upstream {
    async fn start(tls: Option<tokio_rustls::TlsAcceptor>) -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let release = Arc::new(Notify::new());
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, r, f) = (seen.clone(), release.clone(), finished.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (s, r, f, tls) = (s.clone(), r.clone(), f.clone(), tls.clone());
                tokio::spawn(async move {
                    let service =
                        service_fn(move |req| respond(req, s.clone(), r.clone(), f.clone()));
                    match tls {
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                        None => {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        Upstream {
            addr,
            seen,
            release,
            finished,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

async fn respond(
    req: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    release: Arc<Notify>,
    finished: Arc<std::sync::atomic::AtomicBool>,
) -> Result<Response<ChanBody>, std::convert::Infallible> {
    use http_body_util::BodyExt;
    let (parts, body) = req.into_parts();
    let (tx, rx) = mpsc::channel(8);
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        // A request cut short (the gateway aborted it) is not a request.
        return Ok(Response::new(ChanBody(rx)));
    };
    seen.lock().expect("lock").push(Seen {
        method: parts.method.to_string(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts.headers.clone(),
        body,
    });
    let (content_type, chunks): (&str, Vec<&'static str>) = match parts.uri.path() {
        "/v1/messages" => {
            let _ = tx.send(Bytes::from_static(MESSAGE_START.as_bytes())).await;
            tokio::spawn(async move {
                release.notified().await;
                let _ = tx.send(Bytes::from_static(MESSAGE_REST.as_bytes())).await;
                finished.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            return Ok(sse(rx));
        }
        "/v1/responses" => ("text/event-stream", vec![RESPONSES_SSE]),
        "/json" => ("application/json", vec![MESSAGE_JSON]),
        _ => ("text/plain", vec!["ok"]),
    };
    for c in chunks {
        let _ = tx.send(Bytes::from_static(c.as_bytes())).await;
    }
    drop(tx);
    let mut resp = Response::new(ChanBody(rx));
    resp.headers_mut()
        .insert("content-type", content_type.parse().expect("header"));
    resp.headers_mut()
        .insert("x-upstream", "yes".parse().expect("header"));
    Ok(resp)
}

fn sse(rx: mpsc::Receiver<Bytes>) -> Response<ChanBody> {
    let mut resp = Response::new(ChanBody(rx));
    resp.headers_mut()
        .insert("content-type", "text/event-stream".parse().expect("header"));
    resp
}

fn endpoint(upstream: &str, credential: Option<Credential>) -> Endpoint {
    let url = Url::parse(upstream).expect("url");
    let local = url.host_str() == Some("127.0.0.1");
    Endpoint {
        provider: Provider::Custom,
        runtime: Runtime::ClaudeCode,
        upstream: Some(url),
        credential,
        model: None,
        local,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls::client_config(None).expect("tls"))
        .no_proxy()
        .build()
        .expect("client")
}

fn start(ep: &Endpoint) -> Gateway {
    Gateway::start_with(ep, &GatewayOptions::default()).expect("gateway")
}

/// `http://127.0.0.1:PORT` plus the guest path: what the guest's base URL maps to.
fn host_base(gw: &Gateway) -> String {
    gw.guest_base_url()
        .replace(&GUEST_HOST.to_string(), "127.0.0.1")
}

/// Waits until the counters satisfy `ok` (usage is counted as the stream passes).
async fn stats_until(gw: &Gateway, ok: impl Fn(&GatewayStats) -> bool) -> GatewayStats {
    let deadline = Instant::now() + WAIT;
    loop {
        let s = gw.stats();
        if ok(&s) || Instant::now() > deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn header<'h>(h: &'h HeaderMap, name: &str) -> Vec<&'h str> {
    h.get_all(name)
        .iter()
        .map(|v| v.to_str().expect("ascii"))
        .collect()
}

#[tokio::test]
async fn swaps_the_token_for_the_key_and_streams_sse_incrementally() {
    let up = Upstream::start(None).await;
    let ep = endpoint(
        &format!("http://{}", up.addr),
        Some(Credential::ApiKey(Secret::new(REAL_KEY))),
    );
    let gw = start(&ep);
    assert_eq!(
        gw.guest_base_url(),
        format!("http://10.0.2.2:{}", gw.port().expect("tcp"))
    );
    let token = gw.token().to_string();
    assert!(
        token.starts_with("vbx-") && token.len() >= 4 + 32,
        "{token}"
    );

    let body = r#"{"model":"m","stream":true,"messages":[]}"#;
    let request = client()
        .post(format!("{}/v1/messages?beta=true", host_base(&gw)))
        .header("x-api-key", &token)
        .header("anthropic-version", "2023-06-01")
        .header("cookie", "session=abc")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "drop me")
        .header("api-key", "azure-style")
        .body(body)
        .send();
    // Headers come back while the upstream still holds back the rest of the stream.
    let mut resp = tokio::time::timeout(WAIT, request)
        .await
        .expect("response headers before the upstream finished")
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"text/event-stream"[..])
    );
    // The first event arrives while the upstream still holds back the rest.
    let first = tokio::time::timeout(WAIT, resp.chunk())
        .await
        .expect("first event before the upstream finished")
        .expect("read")
        .expect("a chunk");
    assert!(
        std::str::from_utf8(&first)
            .expect("utf8")
            .contains("message_start"),
        "{first:?}"
    );
    assert!(!up.finished.load(std::sync::atomic::Ordering::SeqCst));
    let s = stats_until(&gw, |s| s.input_tokens > 0).await;
    assert_eq!(
        (s.input_tokens, s.cached_tokens, s.output_tokens),
        (2112, 2000, 1)
    );

    up.release.notify_one();
    let mut rest = Vec::new();
    while let Some(c) = tokio::time::timeout(WAIT, resp.chunk())
        .await
        .expect("rest")
        .expect("read")
    {
        rest.extend_from_slice(&c);
    }
    let mut all = first.to_vec();
    all.extend_from_slice(&rest);
    assert_eq!(
        String::from_utf8(all).expect("utf8"),
        format!("{MESSAGE_START}{MESSAGE_REST}")
    );
    let s = stats_until(&gw, |s| s.output_tokens == 57).await;
    assert_eq!(
        s,
        GatewayStats {
            requests: 1,
            refused: 0,
            upstream_errors: 0,
            input_tokens: 2112,
            output_tokens: 57,
            cached_tokens: 2000,
        }
    );

    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    let r = &seen[0];
    assert_eq!(
        (r.method.as_str(), r.path_and_query.as_str()),
        ("POST", "/v1/messages?beta=true")
    );
    assert_eq!(r.body, body.as_bytes());
    assert_eq!(header(&r.headers, "x-api-key"), [REAL_KEY]);
    assert_eq!(header(&r.headers, "anthropic-version"), ["2023-06-01"]);
    assert_eq!(header(&r.headers, "accept-encoding"), ["identity"]);
    assert_eq!(header(&r.headers, "host"), [up.addr.to_string()]);
    for dropped in ["authorization", "cookie", "x-hop", "api-key"] {
        assert!(r.headers.get(dropped).is_none(), "{dropped} was forwarded");
    }
    for (name, value) in &r.headers {
        assert!(
            !value
                .as_bytes()
                .windows(token.len())
                .any(|w| w == token.as_bytes()),
            "the placeholder token reached the upstream in {name}"
        );
    }
}

#[tokio::test]
async fn refuses_requests_without_this_vms_token_and_never_forwards_them() {
    let up = Upstream::start(None).await;
    let ep = endpoint(
        &format!("http://{}", up.addr),
        Some(Credential::ApiKey(Secret::new(REAL_KEY))),
    );
    let gw = start(&ep);
    let other = start(&ep);
    assert_ne!(gw.token(), other.token(), "tokens are per gateway");
    let url = format!("{}/v1/messages", host_base(&gw));
    let c = client();
    let cases = [
        (None, 401, "authentication_error"),
        (
            Some(("x-api-key", "vbx-wrong".into())),
            403,
            "permission_error",
        ),
        (
            Some(("x-api-key", other.token().into())),
            403,
            "permission_error",
        ),
        (
            Some(("x-api-key", REAL_KEY.into())),
            403,
            "permission_error",
        ),
        (
            Some(("authorization", format!("Basic {}", gw.token()))),
            403,
            "permission_error",
        ),
    ];
    for (h, status, kind) in &cases {
        let mut req = c.post(&url).body("{}");
        if let Some((name, value)) = h {
            req = req.header(*name, value);
        }
        let resp = req.send().await.expect("send");
        assert_eq!(resp.status().as_u16(), *status, "{h:?}");
        let v = json(resp).await;
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], *kind, "{v}");
        let text = v.to_string();
        assert!(
            !text.contains(REAL_KEY) && !text.contains(gw.token()),
            "{text}"
        );
    }
    assert!(
        up.seen().is_empty(),
        "a refused request reached the upstream"
    );
    let s = gw.stats();
    assert_eq!((s.requests, s.refused), (0, cases.len() as u64));
}

/// Codex: the upstream carries `/v1`, so does the guest's base URL; the key goes as a bearer
/// token, and paths outside `/v1` are refused.
#[tokio::test]
async fn codex_bearer_key_prefix_and_openai_usage() {
    let up = Upstream::start(None).await;
    let mut ep = endpoint(
        &format!("http://{}/v1", up.addr),
        Some(Credential::Bearer(Secret::new(REAL_KEY))),
    );
    ep.provider = Provider::Codex;
    ep.runtime = Runtime::Codex;
    let gw = start(&ep);
    assert_eq!(
        gw.guest_base_url(),
        format!("http://10.0.2.2:{}/v1", gw.port().expect("tcp"))
    );
    let c = client();
    let resp = c
        .post(format!("{}/responses", host_base(&gw)))
        .header("authorization", format!("Bearer {}", gw.token()))
        .body(r#"{"model":"gpt-5","stream":true}"#)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers().get("x-upstream").map(|v| v.as_bytes()),
        Some(&b"yes"[..])
    );
    assert_eq!(resp.text().await.expect("body"), RESPONSES_SSE);
    let s = stats_until(&gw, |s| s.output_tokens > 0).await;
    assert_eq!(
        (s.input_tokens, s.output_tokens, s.cached_tokens),
        (328, 52, 256)
    );

    let resp = c
        .get(format!(
            "http://127.0.0.1:{}/admin",
            gw.port().expect("tcp")
        ))
        .header("authorization", format!("Bearer {}", gw.token()))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 404);

    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path_and_query, "/v1/responses");
    assert_eq!(
        header(&seen[0].headers, "authorization"),
        [format!("Bearer {REAL_KEY}")]
    );
    assert!(seen[0].headers.get("x-api-key").is_none());
    let s = gw.stats();
    assert_eq!((s.requests, s.refused), (1, 1));
}

/// The host's Claude Code login: bearer plus the OAuth beta flag, merged with the client's.
#[tokio::test]
async fn claude_login_is_a_bearer_with_the_oauth_beta_and_json_usage_counts() {
    let up = Upstream::start(None).await;
    let login = "sk-ant-oat01-login";
    let ep = endpoint(
        &format!("http://{}", up.addr),
        Some(Credential::ClaudeLogin(Secret::new(login))),
    );
    let gw = start(&ep);
    let resp = client()
        .post(format!("{}/json", host_base(&gw)))
        .header("authorization", format!("Bearer {}", gw.token()))
        .header(
            "anthropic-beta",
            "claude-code-20250219, fine-grained-tool-streaming-2025-05-14",
        )
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.expect("body"), MESSAGE_JSON);
    let s = stats_until(&gw, |s| s.output_tokens > 0).await;
    assert_eq!(
        (s.input_tokens, s.output_tokens, s.cached_tokens),
        (10, 4, 3)
    );
    let seen = up.seen();
    assert_eq!(
        header(&seen[0].headers, "authorization"),
        [format!("Bearer {login}")]
    );
    assert_eq!(
        header(&seen[0].headers, "anthropic-beta"),
        ["claude-code-20250219,fine-grained-tool-streaming-2025-05-14,oauth-2025-04-20"]
    );
}

/// A self-signed CA: trusted through the CA file, refused (502, certificate error) without.
#[tokio::test]
async fn https_upstream_trusted_through_the_ca_file() {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "voidbox test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("ca");
    let leaf_key = rcgen::KeyPair::generate().expect("key");
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("params")
        .signed_by(&leaf_key, &ca)
        .expect("leaf");
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
    .expect("server config");
    let up = Upstream::start(Some(tokio_rustls::TlsAcceptor::from(Arc::new(server)))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).expect("write");
    let ep = endpoint(
        &format!("https://127.0.0.1:{}", up.addr.port()),
        Some(Credential::ApiKey(Secret::new(REAL_KEY))),
    );

    let gw = Gateway::start_with(
        &ep,
        &GatewayOptions {
            ca_file: Some(ca_file.clone()),
            ..GatewayOptions::default()
        },
    )
    .expect("gateway");
    let resp = client()
        .post(format!("{}/v1/responses", host_base(&gw)))
        .header("x-api-key", gw.token())
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.expect("body"), RESPONSES_SSE);
    assert_eq!(header(&up.seen()[0].headers, "x-api-key"), [REAL_KEY]);

    let untrusted = start(&ep);
    let resp = client()
        .post(format!("{}/v1/responses", host_base(&untrusted)))
        .header("x-api-key", untrusted.token())
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 502);
    let text = resp.text().await.expect("body");
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    assert_eq!(
        up.seen().len(),
        1,
        "no request over an untrusted connection"
    );

    std::fs::write(&ca_file, "not a certificate").expect("write");
    let err = Gateway::start_with(
        &ep,
        &GatewayOptions {
            ca_file: Some(ca_file),
            ..GatewayOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, GatewayError::Tls(_)), "{err}");
}

/// A declared body over the limit is refused before it is read.
#[tokio::test]
async fn oversize_body_is_413_and_not_forwarded() {
    let up = Upstream::start(None).await;
    let ep = endpoint(&format!("http://{}", up.addr), None);
    let gw = start(&ep);
    let port = gw.port().expect("tcp");
    let token = gw.token().to_string();
    let token2 = token.clone();
    let reply = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        write!(
            s,
            "POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {token}\r\ncontent-length: {}\r\n\r\n",
            MAX_REQUEST_BODY + 1
        )
        .expect("write");
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).expect("read");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .expect("join");
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("request_too_large"), "{reply}");
    assert!(up.seen().is_empty());
    assert_eq!(gw.stats().refused, 1);

    // A chunked body is cut where it passes the limit; the upstream never gets a whole
    // request.
    let reply = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        let mut r = s.try_clone().expect("clone");
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut buf = [0u8; 1024];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
                if out.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        });
        let head = format!(
            "POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {token2}\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let _ = s.write_all(head.as_bytes());
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..(MAX_REQUEST_BODY >> 20) + 2 {
            let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
            if s.write_all(&framed).is_err() {
                break; // the gateway answered and closed
            }
        }
        let _ = s.write_all(b"0\r\n\r\n");
        reader.join().expect("reader")
    })
    .await
    .expect("join");
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(up.seen().is_empty(), "{:?}", up.seen().len());
    assert_eq!(gw.stats().refused, 2);
    assert_eq!(gw.stats().requests, 0);

    // Just under the limit is forwarded whole.
    let big = vec![b'a'; MAX_REQUEST_BODY];
    let resp = client()
        .post(format!("{}/other", host_base(&gw)))
        .header("x-api-key", gw.token())
        .body(big)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(up.seen()[0].body.len(), MAX_REQUEST_BODY);
}

#[tokio::test]
async fn upstream_down_is_502_with_a_clear_body() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let ep = endpoint(
        &format!("http://127.0.0.1:{port}"),
        Some(Credential::ApiKey(Secret::new(REAL_KEY))),
    );
    let gw = start(&ep);
    let resp = client()
        .post(format!("{}/v1/messages", host_base(&gw)))
        .header("x-api-key", gw.token())
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 502);
    let v = json(resp).await;
    let msg = v["error"]["message"].as_str().expect("message");
    assert!(
        msg.contains(&format!("upstream http://127.0.0.1:{port} unreachable")),
        "{msg}"
    );
    assert!(msg.to_lowercase().contains("refused"), "{msg}");
    assert!(!msg.contains(REAL_KEY));
    let s = gw.stats();
    assert_eq!((s.requests, s.upstream_errors, s.refused), (1, 1, 0));
}

#[test]
fn stop_closes_the_port_and_mock_has_no_gateway() {
    let ep = endpoint("http://127.0.0.1:9", None);
    let gw = start(&ep);
    let port = gw.port().expect("tcp");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let debug = format!("{gw:?}");
    assert!(!debug.contains(gw.token()), "{debug}");
    assert_eq!(gw.stop(), GatewayStats::default());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());

    let mock = Endpoint {
        provider: Provider::Mock,
        runtime: Runtime::Mock,
        upstream: None,
        credential: None,
        model: None,
        local: true,
    };
    assert!(matches!(
        Gateway::start_with(&mock, &GatewayOptions::default()),
        Err(GatewayError::NoUpstream("mock"))
    ));
}

/// Reads a JSON response body.
async fn json(resp: reqwest::Response) -> serde_json::Value {
    let bytes = resp.bytes().await.expect("body");
    serde_json::from_slice(&bytes).expect("json body")
}

#[test]
fn the_guest_network_reaches_the_gateway_and_keeps_the_nodes_policy() {
    // No network of its own: the gateway only, no public egress.
    let only = guest_network(None, Some(4321)).unwrap();
    assert_eq!(only.allow_host_ports, [4321]);
    assert!(!only.public_egress);
    // A node's policy keeps everything it says, plus the gateway's port (once).
    let node = voidbox_net::NetworkPolicy {
        allow_host_ports: vec![8080],
        allow_domains: vec!["example.com".into()],
        ..voidbox_net::NetworkPolicy::default()
    };
    let merged = guest_network(Some(node.clone()), Some(4321)).unwrap();
    assert_eq!(merged.allow_host_ports, [8080, 4321]);
    assert_eq!(merged.allow_domains, node.allow_domains);
    assert_eq!(merged.public_egress, node.public_egress);
    let again = guest_network(Some(merged.clone()), Some(4321)).unwrap();
    assert_eq!(again.allow_host_ports, [8080, 4321]);
    // Without a gateway nothing changes, and no network stays none.
    assert_eq!(guest_network(Some(node.clone()), None), Some(node));
    assert_eq!(guest_network(None, None), None);
}

/// One raw HTTP/1.1 exchange over a Unix socket (`connection: close`), blocking.
fn unix_exchange(path: &std::path::Path, request: String) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(path).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    s.write_all(request.as_bytes()).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn post(path: &str, token: Option<&str>, body: &str) -> String {
    let auth = token.map_or(String::new(), |t| format!("x-api-key: {t}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nhost: 10.0.3.254\r\nconnection: close\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn unix_socket_is_0600_and_serves_as_tcp_does() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let up = Upstream::start(None).await;
    let ep = endpoint(
        &format!("http://{}", up.addr),
        Some(Credential::ApiKey(Secret::new(REAL_KEY))),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let sock = dir.path().join("gateway.sock");
    let options = GatewayOptions {
        listen: Listen::Unix(sock.clone()),
        ..GatewayOptions::default()
    };
    let gw = Gateway::start_with(&ep, &options).expect("gateway");
    assert_eq!(gw.port(), None);
    assert_eq!(gw.unix_path(), Some(sock.as_path()));
    assert_eq!(gw.guest_base_url(), "http://10.0.3.254");
    let meta = std::fs::symlink_metadata(&sock).expect("socket file");
    assert_eq!(meta.mode() & 0o170777, 0o140600, "a socket, mode 0600");

    let token = gw.token().to_string();
    let (s1, s2) = (sock.clone(), sock.clone());
    let ok =
        tokio::task::spawn_blocking(move || unix_exchange(&s1, post("/json", Some(&token), "{}")))
            .await
            .expect("join");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains(MESSAGE_JSON), "{ok}");
    let refused =
        tokio::task::spawn_blocking(move || unix_exchange(&s2, post("/json", None, "{}")))
            .await
            .expect("join");
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    let s = stats_until(&gw, |s| s.output_tokens > 0).await;
    assert_eq!(
        (s.requests, s.refused, s.input_tokens, s.output_tokens),
        (1, 1, 10, 4)
    );
    assert_eq!(header(&up.seen()[0].headers, "x-api-key"), [REAL_KEY]);

    // Taken, or in a directory others may write: refused, nothing replaced.
    let again = Gateway::start_with(&ep, &options).unwrap_err();
    assert!(again.to_string().contains("already exists"), "{again}");
    let open = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let err = Gateway::start_with(
        &ep,
        &GatewayOptions {
            listen: Listen::Unix(open.path().join("gw.sock")),
            ..GatewayOptions::default()
        },
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("writable by group or others"),
        "{err}"
    );
    assert!(!open.path().join("gw.sock").exists());

    // Stopping removes the socket.
    gw.stop();
    assert!(
        std::fs::symlink_metadata(&sock).is_err(),
        "socket left behind"
    );
    assert!(std::os::unix::net::UnixStream::connect(&sock).is_err());
}

#[tokio::test]
async fn a_given_token_is_accepted_and_a_minted_one_is_not() {
    let up = Upstream::start(None).await;
    let ep = endpoint(&format!("http://{}", up.addr), None);
    let given = format!("vbx-{}", "0123456789abcdef".repeat(3));
    let gw = Gateway::start_with(
        &ep,
        &GatewayOptions {
            token: Some(Secret::new(given.clone())),
            ..GatewayOptions::default()
        },
    )
    .expect("gateway");
    assert_eq!(gw.token(), given);
    let minted = start(&ep);
    assert_ne!(minted.token(), given);
    let c = client();
    let send = |token: String| {
        c.post(format!("{}/other", host_base(&gw)))
            .header("x-api-key", token)
            .body("{}")
            .send()
    };
    assert_eq!(send(given.clone()).await.expect("send").status(), 200);
    assert_eq!(
        send(minted.token().to_string())
            .await
            .expect("send")
            .status(),
        403
    );
    assert_eq!(up.seen().len(), 1);

    for bad in [
        "vbx-abc".to_string(),
        format!("vbx-{}", "0123456789ABCDEF".repeat(3)),
        format!("vbx-{}0", "0123456789abcdef".repeat(3)),
        format!("sk-{}", "0123456789abcdef".repeat(3)),
        format!("vbx-{}", "0123456789abcdeg".repeat(3)),
    ] {
        let err = Gateway::start_with(
            &ep,
            &GatewayOptions {
                token: Some(Secret::new(bad.clone())),
                ..GatewayOptions::default()
            },
        )
        .unwrap_err();
        assert!(matches!(err, GatewayError::BadToken), "{bad}: {err}");
        assert!(!err.to_string().contains(&bad));
    }
}

const ORIG_SESSION: &str = "9728c8e4-68a3-42a9-ac97-8b6f8d0d23a8";
const ORIG_DEVICE: &str = "d643c067f1f1490565794ed0e72962fb3202c5ff9118a1d574e81ce468e34ae3";
const ORIG_INSTALL: &str = "5c9112f3-835c-45b4-9a1c-0c7a47e4016d";

/// A Claude Code request body as 2.1.330 sends it (abridged): `metadata.user_id` is a JSON
/// string.
fn claude_body(turn: u32) -> String {
    format!(
        r#"{{"model":"claude-x","messages":[{{"role":"user","content":[{{"type":"text","text":"turn {turn} \u00e9 \ud83e\udd16"}}]}}],"metadata":{{"user_id":"{{\"device_id\":\"{ORIG_DEVICE}\",\"account_uuid\":\"\",\"session_id\":\"{ORIG_SESSION}\"}}"}},"max_tokens":32000,"temperature":1.0,"stream":false}}"#
    )
}

fn codex_body() -> String {
    format!(
        r#"{{"model":"gpt-x","prompt_cache_key":"thread-1","client_metadata":{{"session_id":"thread-1","x-codex-turn-metadata":"{{\"installation_id\":\"{ORIG_INSTALL}\",\"session_id\":\"thread-1\"}}","x-codex-installation-id":"{ORIG_INSTALL}"}}}}"#
    )
}

/// The ids a Claude Code request carried upstream: header session, body session, device;
/// and the body with the ids put back as the runtime sent them.
fn claude_ids(seen: &Seen) -> (String, String, String, String) {
    let header_session = header(&seen.headers, "x-claude-code-session-id")[0].to_string();
    let v: serde_json::Value = serde_json::from_slice(&seen.body).expect("json");
    let user: serde_json::Value =
        serde_json::from_str(v["metadata"]["user_id"].as_str().expect("string")).expect("json");
    assert_eq!(user["account_uuid"], "", "other fields kept");
    let session = user["session_id"].as_str().expect("session").to_string();
    let device = user["device_id"].as_str().expect("device").to_string();
    let restored = String::from_utf8(seen.body.to_vec())
        .expect("utf8")
        .replace(&session, ORIG_SESSION)
        .replace(&device, ORIG_DEVICE);
    (header_session, session, device, restored)
}

fn is_uuid_v4(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() == 36
        && [8, 13, 18, 23].iter().all(|&i| b[i] == b'-')
        && b[14] == b'4'
        && s.bytes().all(|c| c == b'-' || c.is_ascii_hexdigit())
}

#[tokio::test]
async fn fresh_identity_gives_each_gateway_its_own_consistent_ids() {
    let up = Upstream::start(None).await;
    let ep = endpoint(
        &format!("http://{}", up.addr),
        Some(Credential::ApiKey(Secret::new(REAL_KEY))),
    );
    let fresh = GatewayOptions {
        fresh_identity: true,
        ..GatewayOptions::default()
    };
    let gws = [
        Gateway::start_with(&ep, &fresh).expect("gateway"),
        Gateway::start_with(&ep, &fresh).expect("gateway"),
        start(&ep), // without: the runtime's ids pass as they are
    ];
    let c = client();
    for gw in &gws {
        for turn in 0..2 {
            let resp = c
                .post(format!("{}/json", host_base(gw)))
                .header("x-api-key", gw.token())
                .header("content-type", "application/json")
                .header("x-claude-code-session-id", ORIG_SESSION)
                .body(claude_body(turn))
                .send()
                .await
                .expect("send");
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.text().await.expect("body"), MESSAGE_JSON);
        }
    }
    let seen = up.seen();
    assert_eq!(seen.len(), 6);
    let ids: Vec<_> = seen.iter().map(claude_ids).collect();
    for (i, (h, s, d, restored)) in ids.iter().enumerate() {
        assert_eq!(h, s, "header and body agree");
        assert_eq!(restored, &claude_body(i as u32 % 2), "nothing else changed");
        if i < 4 {
            assert!(is_uuid_v4(s), "{s}");
            assert!(d.len() == 64 && d.bytes().all(|c| c.is_ascii_hexdigit()));
            assert_ne!((s.as_str(), d.as_str()), (ORIG_SESSION, ORIG_DEVICE));
            assert!(s != ORIG_SESSION && d != ORIG_DEVICE);
        } else {
            assert_eq!((s.as_str(), d.as_str()), (ORIG_SESSION, ORIG_DEVICE));
        }
    }
    // Consistent within a gateway, different between gateways.
    assert_eq!(ids[0].1, ids[1].1);
    assert_eq!(ids[0].2, ids[1].2);
    assert_eq!(ids[2].1, ids[3].1);
    assert_eq!(ids[2].2, ids[3].2);
    assert_ne!(ids[0].1, ids[2].1);
    assert_ne!(ids[0].2, ids[2].2);

    // Codex: its installation id, in the header and the body; its thread ids stay.
    let gw = &gws[0];
    let turn_header = format!(r#"{{"installation_id":"{ORIG_INSTALL}","session_id":"thread-1"}}"#);
    let resp = c
        .post(format!("{}/json", host_base(gw)))
        .header("authorization", format!("Bearer {}", gw.token()))
        .header("content-type", "application/json")
        .header("session-id", "thread-1")
        .header("x-codex-turn-metadata", &turn_header)
        .body(codex_body())
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    let r = &up.seen()[6];
    let h: serde_json::Value =
        serde_json::from_str(header(&r.headers, "x-codex-turn-metadata")[0]).expect("json");
    let install = h["installation_id"].as_str().expect("id").to_string();
    assert!(is_uuid_v4(&install) && install != ORIG_INSTALL, "{install}");
    assert_eq!(header(&r.headers, "session-id"), ["thread-1"]);
    let body = String::from_utf8(r.body.to_vec()).expect("utf8");
    assert_eq!(body.matches(&install).count(), 2, "{body}");
    assert_eq!(body.replace(&install, ORIG_INSTALL), codex_body());

    // A body without those fields, JSON or not, passes byte for byte.
    let plain = "{ \"model\" : \"m\", \"metadata\": {\"other\": 1.50} }";
    for (ct, body) in [("application/json", plain), ("text/plain", "metadata\"")] {
        let resp = c
            .post(format!("{}/json", host_base(gw)))
            .header("x-api-key", gw.token())
            .header("content-type", ct)
            .body(body)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), 200);
        assert_eq!(up.seen().last().expect("seen").body, body.as_bytes());
    }
    let s = stats_until(gw, |s| s.output_tokens >= 20).await;
    assert_eq!(
        s,
        GatewayStats {
            requests: 5,
            refused: 0,
            upstream_errors: 0,
            input_tokens: 50,
            output_tokens: 20,
            cached_tokens: 15,
        }
    );
}

/// With fresh identity a JSON body is read whole: over the limit it is 413, not forwarded.
#[tokio::test]
async fn fresh_identity_still_refuses_an_oversize_streamed_body() {
    let up = Upstream::start(None).await;
    let ep = endpoint(&format!("http://{}", up.addr), None);
    let gw = Gateway::start_with(
        &ep,
        &GatewayOptions {
            fresh_identity: true,
            ..GatewayOptions::default()
        },
    )
    .expect("gateway");
    let port = gw.port().expect("tcp");
    let token = gw.token().to_string();
    let reply = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        let mut r = s.try_clone().expect("clone");
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut buf = [0u8; 1024];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
                if out.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        });
        let head = format!(
            "POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {token}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let _ = s.write_all(head.as_bytes());
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..(MAX_REQUEST_BODY >> 20) + 2 {
            let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
            if s.write_all(&framed).is_err() {
                break;
            }
        }
        let _ = s.write_all(b"0\r\n\r\n");
        reader.join().expect("reader")
    })
    .await
    .expect("join");
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(up.seen().is_empty());
    assert_eq!((gw.stats().refused, gw.stats().requests), (1, 0));
}
