//! A scripted LLM server for tests: a real HTTP server on loopback that speaks the
//! Anthropic Messages API (`POST /v1/messages`, also `?beta=true`) and the OpenAI Responses
//! API (`POST /v1/responses`), streamed as SSE or as plain JSON, answering from a [`Script`]
//! of text, tool-call and error turns. It drives the real agent CLIs (Claude Code, Codex)
//! and records every request ([`Recorded`]) so tests can check what came back to the model
//! and which credentials were sent.
//!
//! ```no_run
//! use voidbox_llm_script::{Script, Server, Turn};
//! let server = Server::start(Script::new([Turn::shell("echo hi"), Turn::text("done")]));
//! // ANTHROPIC_BASE_URL = server.base_url(); Codex: base_url = server.openai_base_url()
//! let seen = server.requests();
//! # let _ = seen;
//! ```

mod anthropic;
mod openai;
mod script;
mod server;
mod sse;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

pub use script::{Script, Turn, Usage};
pub use server::{Hook, Recorded};

/// A running scripted server; it stops when dropped.
pub struct Server {
    addr: SocketAddr,
    state: Arc<server::State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Starts a server for `script` on a free port of 127.0.0.1.
    ///
    /// # Panics
    /// When no loopback port can be bound or no thread started (a broken test host).
    pub fn start(script: Script) -> Server {
        match Server::bind(SocketAddr::from(([127, 0, 0, 1], 0)), script, None) {
            Ok(s) => s,
            Err(e) => panic!("voidbox-llm-script: cannot start on loopback: {e}"),
        }
    }

    /// Starts a server for `script` on `addr`, appending each request as a JSON line to
    /// `record_to` when given.
    pub fn bind(
        addr: SocketAddr,
        script: Script,
        record_to: Option<std::fs::File>,
    ) -> std::io::Result<Server> {
        Server::bind_with_hook(addr, script, record_to, None)
    }

    /// Starts a server for `script` on a free port of 127.0.0.1 that calls `hook` with every
    /// request it receives (its [`Recorded`] complete: position, turn, status) after the
    /// answer is decided and before it is sent. The hook runs on a blocking thread: while it
    /// runs, that client waits for its answer (a test can inspect the client's state
    /// mid-conversation); other connections are served meanwhile.
    ///
    /// # Panics
    /// When no loopback port can be bound or no thread started (a broken test host).
    pub fn start_with_hook(
        script: Script,
        hook: impl Fn(&Recorded) + Send + Sync + 'static,
    ) -> Server {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        match Server::bind_with_hook(addr, script, None, Some(Arc::new(hook))) {
            Ok(s) => s,
            Err(e) => panic!("voidbox-llm-script: cannot start on loopback: {e}"),
        }
    }

    /// [`Server::bind`] with an optional [`Hook`] (see [`Server::start_with_hook`]).
    pub fn bind_with_hook(
        addr: SocketAddr,
        script: Script,
        record_to: Option<std::fs::File>,
        hook: Option<Hook>,
    ) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(server::State::new(script, record_to, hook));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let st = state.clone();
        let thread = std::thread::Builder::new()
            .name("llm-script".into())
            .spawn(move || rt.block_on(server::serve(listener, st, rx)))?;
        Ok(Server {
            addr,
            state,
            stop: Some(tx),
            thread: Some(thread),
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT`: the Anthropic base URL (`ANTHROPIC_BASE_URL`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1`: the OpenAI base URL (Codex's provider `base_url`).
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.base_url())
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests()
    }

    /// The model calls (`/v1/messages`, `/v1/responses`) received so far, in order.
    pub fn model_calls(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_model_call)
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
