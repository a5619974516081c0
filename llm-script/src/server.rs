//! The HTTP server: routes, the key check, and the record of every request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;
use serde_json::{json, Value};

use crate::script::{pick, Pick};
use crate::sse::Sse;
use crate::{anthropic, openai, Script, Turn};

/// Largest request body read (larger ones get 413).
const MAX_BODY: usize = 64 << 20;

/// One request the server received.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// Path with its query (`/v1/messages?beta=true`).
    pub path: String,
    /// Headers in arrival order, names lower-case.
    pub headers: Vec<(String, String)>,
    /// The body as JSON; `Null` when it was empty or not JSON.
    pub body: Value,
    /// The conversation position (assistant turns the request carried), for model calls.
    pub position: Option<usize>,
    /// The script turn that answered it, if any.
    pub turn: Option<usize>,
    /// The HTTP status answered.
    pub status: u16,
}

impl Recorded {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The credential sent: `x-api-key`, else the bearer token of `authorization`.
    pub fn credential(&self) -> Option<&str> {
        self.header("x-api-key").or_else(|| {
            self.header("authorization")
                .and_then(|a| a.strip_prefix("Bearer "))
        })
    }

    /// Whether the body's JSON text contains `needle` anywhere (in any string, escaped
    /// the way JSON escapes it).
    pub fn body_contains(&self, needle: &str) -> bool {
        let mut found = false;
        walk_strings(&self.body, &mut |s| found |= s.contains(needle));
        found
    }

    /// Whether this was a model call (`/v1/messages` or `/v1/responses`).
    pub fn is_model_call(&self) -> bool {
        self.position.is_some()
    }
}

fn walk_strings(v: &Value, f: &mut impl FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter().for_each(|x| walk_strings(x, f)),
        Value::Object(o) => o.iter().for_each(|(k, x)| {
            f(k);
            walk_strings(x, f)
        }),
        _ => {}
    }
}

/// A function called with every request just before its answer is sent (see
/// [`crate::Server::start_with_hook`]).
pub type Hook = Arc<dyn Fn(&Recorded) + Send + Sync>;

/// State shared by the connections.
pub(crate) struct State {
    script: Script,
    served: Mutex<Vec<u32>>,
    requests: Mutex<Vec<Recorded>>,
    seq: AtomicU64,
    record_to: Option<Mutex<std::fs::File>>,
    hook: Option<Hook>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    pub(crate) fn new(
        script: Script,
        record_to: Option<std::fs::File>,
        hook: Option<Hook>,
    ) -> State {
        let n = script.turns.len();
        State {
            script,
            served: Mutex::new(vec![0; n]),
            requests: Mutex::new(Vec::new()),
            seq: AtomicU64::new(1),
            record_to: record_to.map(Mutex::new),
            hook,
        }
    }

    pub(crate) fn requests(&self) -> Vec<Recorded> {
        lock(&self.requests).clone()
    }

    fn record(&self, r: Recorded) {
        if let Some(f) = &self.record_to {
            if let Ok(mut line) = serde_json::to_vec(&r) {
                line.push(b'\n');
                let _ = lock(f).write_all(&line);
            }
        }
        lock(&self.requests).push(r);
    }
}

/// The response body: frames sent one by one (SSE events), or one frame with a length.
pub(crate) struct Frames {
    frames: VecDeque<Bytes>,
    len: Option<u64>,
}

impl Frames {
    fn whole(data: Vec<u8>) -> Frames {
        let len = data.len() as u64;
        Frames {
            frames: VecDeque::from([Bytes::from(data)]),
            len: Some(len),
        }
    }

    fn sse(s: Sse) -> Frames {
        // One frame per event: the client sees the stream arrive in pieces.
        let data = s.into_bytes();
        let mut frames = VecDeque::new();
        let mut start = 0;
        for i in 0..data.len().saturating_sub(1) {
            if data[i] == b'\n' && data[i + 1] == b'\n' {
                frames.push_back(Bytes::copy_from_slice(&data[start..i + 2]));
                start = i + 2;
            }
        }
        if start < data.len() {
            frames.push_back(Bytes::copy_from_slice(&data[start..]));
        }
        Frames { frames, len: None }
    }
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.frames.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        match self.len {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

fn json_response(status: u16, v: &Value) -> Response<Frames> {
    let mut r = Response::new(Frames::whole(v.to_string().into_bytes()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn sse_response(s: Sse) -> Response<Frames> {
    let mut r = Response::new(Frames::sse(s));
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache"),
    );
    r
}

/// Which model API a path is.
#[derive(Clone, Copy, PartialEq)]
enum Api {
    Anthropic,
    OpenAi,
}

/// Answers one request.
pub(crate) async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Frames>, Infallible> {
    let method = req.method().as_str().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let seq = state.seq.fetch_add(1, Ordering::Relaxed);
    let mut rec = Recorded {
        method,
        path,
        headers,
        body: Value::Null,
        position: None,
        turn: None,
        status: 200,
    };
    let raw = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            rec.status = 413;
            let r = json_response(
                413,
                &json!({"error": {"message": "request body too large"}}),
            );
            let rec = run_hook(&state, rec).await;
            state.record(rec);
            return Ok(r);
        }
    };
    rec.body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let route = rec.path.split('?').next().unwrap_or("").to_string();
    let resp = match (rec.method.as_str(), route.trim_end_matches('/')) {
        ("POST", "/v1/messages") => model_call(&state, &mut rec, Api::Anthropic, seq),
        ("POST", "/v1/responses") => model_call(&state, &mut rec, Api::OpenAi, seq),
        ("POST", "/v1/messages/count_tokens") => {
            json_response(200, &anthropic::count_tokens(raw.len()))
        }
        ("GET", "/v1/models") => json_response(200, &openai::models(&["voidbox-script"])),
        ("GET" | "HEAD", "" | "/v1" | "/health") => json_response(200, &json!({"status": "ok"})),
        _ => json_response(
            404,
            &json!({"error": {"message": format!("voidbox-llm-script: no route {} {}", rec.method, route)}}),
        ),
    };
    rec.status = resp.status().as_u16();
    let rec = run_hook(&state, rec).await;
    state.record(rec);
    Ok(resp)
}

/// Calls the hook, if any, with `rec` on a blocking thread (a slow hook holds back this
/// answer only, not other connections), and gives `rec` back.
async fn run_hook(state: &Arc<State>, rec: Recorded) -> Recorded {
    let Some(hook) = state.hook.clone() else {
        return rec;
    };
    let copy = rec.clone();
    // A hook that panics loses nothing of the record: the copy is kept.
    match tokio::task::spawn_blocking(move || {
        hook(&rec);
        rec
    })
    .await
    {
        Ok(rec) => rec,
        Err(_) => copy,
    }
}

fn model_call(state: &State, rec: &mut Recorded, api: Api, seq: u64) -> Response<Frames> {
    let error = |status: u16, msg: &str| match api {
        Api::Anthropic => json_response(status, &anthropic::error(status, msg, seq)),
        Api::OpenAi => json_response(status, &openai::error(status, msg)),
    };
    let body = &rec.body;
    if !body.is_object() {
        return error(400, "voidbox-llm-script: the body is not a JSON object");
    }
    let position = match api {
        Api::Anthropic => anthropic::position(body),
        Api::OpenAi => openai::position(body),
    };
    rec.position = Some(position);
    if let Some(key) = &state.script.expect_key {
        if rec.credential() != Some(key.as_str()) {
            return error(401, "invalid x-api-key");
        }
    }
    let i = match pick(&state.script.turns, &mut lock(&state.served), position) {
        Pick::Turn(i) => i,
        Pick::Exhausted => {
            return error(
                400,
                &format!("voidbox-llm-script: the script has no turn at position {position}"),
            )
        }
    };
    rec.turn = Some(i);
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("voidbox-script");
    let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
    let u = &state.script.usage;
    let turn = &state.script.turns[i];
    match api {
        Api::Anthropic => {
            let r = match turn {
                Turn::Text(t) => anthropic::Reply::Text(t),
                Turn::Tool { name, input } => anthropic::tool(name.as_deref(), input),
                Turn::Error {
                    status, message, ..
                } => return error(*status, message),
            };
            if stream {
                sse_response(anthropic::stream(&r, model, seq, u))
            } else {
                json_response(200, &anthropic::message(&r, model, seq, u))
            }
        }
        Api::OpenAi => {
            let r = match turn {
                Turn::Text(t) => openai::Reply::Text(t),
                Turn::Tool { name, input } => openai::tool(name.as_deref(), input, body),
                Turn::Error {
                    status, message, ..
                } => return error(*status, message),
            };
            if stream {
                sse_response(openai::stream(&r, model, seq, u))
            } else {
                json_response(200, &openai::body(&r, model, seq, u))
            }
        }
    }
}

/// Serves `listener` until `stop` fires.
pub(crate) async fn serve(
    listener: std::net::TcpListener,
    state: Arc<State>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let conn = tokio::select! {
            _ = &mut stop => return,
            c = listener.accept() => c,
        };
        let Ok((tcp, _peer)): std::io::Result<(tokio::net::TcpStream, SocketAddr)> = conn else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(state.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                .await;
        });
    }
}
