//! The server loop: one thread reading requests and notifications in order, documents kept
//! up to date from incremental changes (ranges in UTF-16 positions), diagnostics published
//! after every open and change (none for YAML files that are not specs, as `validate <dir>`
//! skips them).

use std::collections::HashMap;
use std::path::PathBuf;

use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidCloseTextDocument, DidOpenTextDocument, Notification as _,
    PublishDiagnostics,
};
use lsp_types::request::{
    Completion, DocumentSymbolRequest, GotoDefinition, HoverRequest, Request as _,
};
use lsp_types::{
    CompletionOptions, CompletionParams, CompletionResponse, DocumentSymbolParams,
    DocumentSymbolResponse, GotoDefinitionParams, GotoDefinitionResponse, HoverParams,
    HoverProviderCapability, Location, OneOf, PublishDiagnosticsParams, ServerCapabilities,
    ServerInfo, TextDocumentSyncCapability, TextDocumentSyncKind, Uri,
};
use voidbox_spec::validate::HostFacts;

use crate::document::Document;
use crate::{completion, definition, diagnostics, hover, symbols};

/// What the server announces.
pub fn capabilities() -> ServerCapabilities {
    ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Kind(
            TextDocumentSyncKind::INCREMENTAL,
        )),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        completion_provider: Some(CompletionOptions {
            trigger_characters: Some(vec![":".into(), " ".into()]),
            ..CompletionOptions::default()
        }),
        definition_provider: Some(OneOf::Left(true)),
        document_symbol_provider: Some(OneOf::Left(true)),
        ..ServerCapabilities::default()
    }
}

/// The local path of a `file:` URI (its path percent-decoded by the URI parser lsp-types
/// uses); `None` for other schemes and for a file on another host.
pub fn uri_path(uri: &Uri) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    if !uri.scheme()?.as_str().eq_ignore_ascii_case("file") {
        return None;
    }
    if let Some(host) = uri.authority().map(|a| a.as_str()) {
        if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
            return None;
        }
    }
    let bytes = uri.path().as_estr().decode().into_bytes().into_owned();
    Some(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

/// The open documents and what validation may know of the host.
pub struct Server<'f> {
    docs: HashMap<String, Document>,
    facts: HostFacts<'f>,
}

impl<'f> Server<'f> {
    /// A server without documents.
    pub fn new(facts: HostFacts<'f>) -> Self {
        Server {
            docs: HashMap::new(),
            facts,
        }
    }

    /// Serves `conn` until the client shuts down; `conn` must be initialized already.
    pub fn run(&mut self, conn: &Connection) -> Result<(), Box<dyn std::error::Error>> {
        for msg in &conn.receiver {
            match msg {
                Message::Request(req) => {
                    if conn.handle_shutdown(&req)? {
                        return Ok(());
                    }
                    let resp = self.request(req);
                    conn.sender.send(Message::Response(resp))?;
                }
                Message::Notification(n) => {
                    if let Some(uri) = self.notification(n) {
                        self.publish(conn, &uri)?;
                    }
                }
                Message::Response(_) => {}
            }
        }
        Ok(())
    }

    /// Publishes the diagnostics of the document at `uri` (none once it is closed).
    fn publish(&self, conn: &Connection, uri: &Uri) -> Result<(), Box<dyn std::error::Error>> {
        let (diagnostics, version) = match self.docs.get(uri.as_str()) {
            Some(doc) => {
                let path = uri_path(uri);
                let name = path
                    .as_ref()
                    .map_or_else(|| uri.as_str().to_string(), |p| p.display().to_string());
                let base = path
                    .as_ref()
                    .and_then(|p| p.parent().map(PathBuf::from))
                    .unwrap_or_else(|| PathBuf::from("."));
                (
                    diagnostics::of(uri, &name, doc, &base, self.facts),
                    Some(doc.version),
                )
            }
            None => (Vec::new(), None),
        };
        let params = PublishDiagnosticsParams {
            uri: uri.clone(),
            diagnostics,
            version,
        };
        conn.sender.send(Message::Notification(Notification::new(
            PublishDiagnostics::METHOD.to_string(),
            params,
        )))?;
        Ok(())
    }

    /// Applies a notification; the URI whose diagnostics changed, if any.
    fn notification(&mut self, n: Notification) -> Option<Uri> {
        match n.method.as_str() {
            DidOpenTextDocument::METHOD => {
                let p: lsp_types::DidOpenTextDocumentParams =
                    serde_json::from_value(n.params).ok()?;
                let doc = Document::new(p.text_document.text, p.text_document.version);
                self.docs
                    .insert(p.text_document.uri.as_str().to_string(), doc);
                Some(p.text_document.uri)
            }
            DidChangeTextDocument::METHOD => {
                let p: lsp_types::DidChangeTextDocumentParams =
                    serde_json::from_value(n.params).ok()?;
                let uri = p.text_document.uri;
                let whole = p.content_changes.first().is_some_and(|c| c.range.is_none());
                let doc = match self.docs.entry(uri.as_str().to_string()) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    // Not opened: only a whole text can start it.
                    std::collections::hash_map::Entry::Vacant(e) if whole => {
                        e.insert(Document::new(String::new(), p.text_document.version))
                    }
                    std::collections::hash_map::Entry::Vacant(_) => return None,
                };
                // Applied in order: each change's range is in the text the previous left.
                for change in &p.content_changes {
                    doc.edit(change.range, &change.text);
                }
                doc.version = p.text_document.version;
                Some(uri)
            }
            DidCloseTextDocument::METHOD => {
                let p: lsp_types::DidCloseTextDocumentParams =
                    serde_json::from_value(n.params).ok()?;
                self.docs.remove(p.text_document.uri.as_str());
                Some(p.text_document.uri)
            }
            _ => None,
        }
    }

    fn request(&self, req: Request) -> Response {
        let id = req.id.clone();
        let result = match req.method.as_str() {
            HoverRequest::METHOD => self.params(req).map(|p: HoverParams| {
                let pos = p.text_document_position_params;
                self.doc(&pos.text_document.uri)
                    .and_then(|d| hover::at(d, d.offset(pos.position)))
                    .map_or(serde_json::Value::Null, |h| json(&h))
            }),
            Completion::METHOD => self.params(req).map(|p: CompletionParams| {
                let pos = p.text_document_position;
                let items = self.doc(&pos.text_document.uri).map_or_else(Vec::new, |d| {
                    let line = pos.position.line as usize;
                    let start = d.offset(lsp_types::Position::new(pos.position.line, 0));
                    completion::at(d, line, d.offset(pos.position) - start)
                });
                json(&CompletionResponse::Array(items))
            }),
            GotoDefinition::METHOD => self.params(req).map(|p: GotoDefinitionParams| {
                let pos = p.text_document_position_params;
                let uri = pos.text_document.uri;
                self.doc(&uri)
                    .and_then(|d| {
                        let span = definition::at(d.root()?, d.offset(pos.position))?;
                        Some(GotoDefinitionResponse::Scalar(Location::new(
                            uri.clone(),
                            d.range(span),
                        )))
                    })
                    .map_or(serde_json::Value::Null, |r| json(&r))
            }),
            DocumentSymbolRequest::METHOD => self.params(req).map(|p: DocumentSymbolParams| {
                self.doc(&p.text_document.uri)
                    .and_then(|d| Some(DocumentSymbolResponse::Nested(symbols::of(d, d.root()?))))
                    .map_or(serde_json::Value::Null, |r| json(&r))
            }),
            other => Err(Box::new(Response::new_err(
                id.clone(),
                ErrorCode::MethodNotFound as i32,
                format!("voidbox lsp does not serve `{other}`"),
            ))),
        };
        match result {
            Ok(v) => Response::new_ok(id, v),
            Err(e) => *e,
        }
    }

    fn doc(&self, uri: &Uri) -> Option<&Document> {
        self.docs.get(uri.as_str())
    }

    fn params<P: serde::de::DeserializeOwned>(&self, req: Request) -> Result<P, Box<Response>> {
        serde_json::from_value(req.params).map_err(|e| {
            Box::new(Response::new_err(
                req.id,
                ErrorCode::InvalidParams as i32,
                format!("invalid parameters: {e}"),
            ))
        })
    }
}

fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// Initializes `conn` (announcing [`capabilities`]) and serves it until shutdown.
pub fn serve(conn: &Connection, facts: HostFacts<'_>) -> Result<(), Box<dyn std::error::Error>> {
    let init = lsp_types::InitializeResult {
        capabilities: capabilities(),
        server_info: Some(ServerInfo {
            name: "voidbox".into(),
            version: Some(env!("CARGO_PKG_VERSION").into()),
        }),
    };
    let (id, _params) = conn.initialize_start()?;
    conn.initialize_finish(id, json(&init))?;
    Server::new(facts).run(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(uri: &str) -> Option<PathBuf> {
        uri_path(&uri.parse().unwrap())
    }

    #[test]
    fn file_uris_become_local_paths() {
        assert_eq!(
            path("file:///specs/a%20b.yaml"),
            Some("/specs/a b.yaml".into())
        );
        assert_eq!(path("file://localhost/x.yaml"), Some("/x.yaml".into()));
        assert_eq!(path("file://build-host/x.yaml"), None);
        assert_eq!(path("untitled:Untitled-1"), None);
    }
}
