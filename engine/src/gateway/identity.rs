//! A fresh identity toward the provider ([`GatewayOptions::fresh_identity`]): clones of one
//! running runtime (a warm snapshot) would all send the ids it chose at start; the gateway
//! replaces them with ids minted once per gateway, the same in every request of its VM.
//!
//! What is replaced (each field keeps its own format; nothing else in a request changes):
//! - Claude Code: the header `X-Claude-Code-Session-Id`, and in the JSON body's
//!   `metadata.user_id` (a JSON string holding a JSON object) its `session_id` and
//!   `device_id`.
//! - Codex: its installation id — `installation_id` in the header `x-codex-turn-metadata`
//!   (a JSON object), and in the body's `client_metadata` the `x-codex-installation-id`
//!   string and `installation_id` inside the `x-codex-turn-metadata` string. Its session
//!   and thread ids are those of the thread, started per clone, so they stay.
//!
//! Edits are made on the bytes: a body is rewritten only where such a field is, the rest
//! stays byte for byte. A body that is not a JSON object passes unchanged. The ids are
//! never logged.
//!
//! [`GatewayOptions::fresh_identity`]: super::GatewayOptions::fresh_identity

use std::ops::Range;

use hyper::header::{HeaderMap, HeaderValue};
use serde::de::IgnoredAny;

/// Claude Code's session header.
pub(crate) const CLAUDE_SESSION_HEADER: &str = "x-claude-code-session-id";
/// Codex's per-turn metadata header (a JSON object).
pub(crate) const CODEX_TURN_HEADER: &str = "x-codex-turn-metadata";

/// The ids one gateway gives its VM.
pub(crate) struct Identity {
    /// Claude Code's session id (a UUID v4).
    session: String,
    /// Claude Code's device id (64 hex digits, as Claude Code's own).
    device: String,
    /// Codex's installation id (a UUID v4).
    installation: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Identity(<redacted>)")
    }
}

impl Identity {
    /// Fresh random ids.
    pub(crate) fn mint() -> Result<Identity, getrandom::Error> {
        let mut device = [0u8; 32];
        getrandom::fill(&mut device)?;
        Ok(Identity {
            session: uuid_v4()?,
            device: hex::encode(device),
            installation: uuid_v4()?,
        })
    }

    /// Replaces the ids in the request headers sent upstream.
    pub(crate) fn rewrite_headers(&self, headers: &mut HeaderMap) {
        if headers.contains_key(CLAUDE_SESSION_HEADER) {
            if let Ok(v) = HeaderValue::from_str(&self.session) {
                headers.insert(CLAUDE_SESSION_HEADER, v);
            }
        }
        let turn: Vec<HeaderValue> = headers.get_all(CODEX_TURN_HEADER).iter().cloned().collect();
        if turn.is_empty() {
            return;
        }
        let fields = [("installation_id", self.installation.as_str())];
        headers.remove(CODEX_TURN_HEADER);
        for v in turn {
            let v = rewrite_object(v.as_bytes(), &fields)
                .and_then(|new| HeaderValue::from_bytes(&new).ok())
                .unwrap_or(v);
            headers.append(CODEX_TURN_HEADER, v);
        }
    }

    /// The body with the ids replaced, or `None` when it has none (send it as it is).
    pub(crate) fn rewrite_body(&self, body: &[u8]) -> Option<Vec<u8>> {
        if !contains(body, b"metadata\"") {
            return None;
        }
        let top = members(body)?;
        // Only a valid JSON document is edited.
        serde_json::from_slice::<IgnoredAny>(body).ok()?;
        let mut edits: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
        for (key, range) in &top {
            let wanted: &[(&str, Field)] = match key.as_str() {
                "metadata" => &[("user_id", Field::ClaudeUserId)],
                "client_metadata" => &[
                    ("x-codex-installation-id", Field::CodexInstallation),
                    (CODEX_TURN_HEADER, Field::CodexTurnMetadata),
                ],
                _ => continue,
            };
            let Some(fields) = members(&body[range.clone()]) else {
                continue;
            };
            for (name, field) in fields {
                let Some((_, kind)) = wanted.iter().find(|(w, _)| *w == name) else {
                    continue;
                };
                let at = range.start + field.start..range.start + field.end;
                if let Some(new) = self.rewrite_field(*kind, &body[at.clone()]) {
                    edits.push((at, new));
                }
            }
        }
        splice(body, edits)
    }
}

impl Identity {
    /// The new text of one id-bearing field (a JSON value), or `None` to leave it.
    fn rewrite_field(&self, kind: Field, value: &[u8]) -> Option<Vec<u8>> {
        match kind {
            Field::ClaudeUserId => rewrite_json_string(
                value,
                &[
                    ("session_id", self.session.as_str()),
                    ("device_id", self.device.as_str()),
                ],
            ),
            Field::CodexInstallation => {
                (value.first() == Some(&b'"')).then(|| json_string(&self.installation))
            }
            Field::CodexTurnMetadata => {
                rewrite_json_string(value, &[("installation_id", self.installation.as_str())])
            }
        }
    }
}

/// A body field that carries ids.
#[derive(Debug, Clone, Copy)]
enum Field {
    /// `metadata.user_id`: a JSON string of an object with `session_id` and `device_id`.
    ClaudeUserId,
    /// `client_metadata.x-codex-installation-id`: the id as a string.
    CodexInstallation,
    /// `client_metadata.x-codex-turn-metadata`: a JSON string of an object with
    /// `installation_id`.
    CodexTurnMetadata,
}

/// A random UUID, version 4.
fn uuid_v4() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> Vec<u8> {
    serde_json::to_vec(s).unwrap_or_default()
}

/// `text` with the (non-overlapping) edits applied; `None` without edits.
fn splice(text: &[u8], mut edits: Vec<(Range<usize>, Vec<u8>)>) -> Option<Vec<u8>> {
    if edits.is_empty() {
        return None;
    }
    edits.sort_by_key(|(r, _)| r.start);
    let mut out = Vec::with_capacity(text.len() + 64);
    let mut at = 0;
    for (r, new) in edits {
        if r.start < at {
            return None; // overlapping: cannot happen for members of one object
        }
        out.extend_from_slice(&text[at..r.start]);
        out.extend_from_slice(&new);
        at = r.end;
    }
    out.extend_from_slice(&text[at..]);
    Some(out)
}

/// A JSON object's text with the string values of `fields` replaced (byte edits), or `None`
/// when it is not a JSON object or has none of them.
fn rewrite_object(text: &[u8], fields: &[(&str, &str)]) -> Option<Vec<u8>> {
    let members = members(text)?;
    serde_json::from_slice::<IgnoredAny>(text).ok()?;
    let edits = members
        .into_iter()
        .filter(|(_, r)| text.get(r.start) == Some(&b'"'))
        .filter_map(|(k, r)| {
            fields
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, new)| (r, json_string(new)))
        })
        .collect();
    splice(text, edits)
}

/// A JSON string literal whose content is a JSON object, with the string values of `fields`
/// in that object replaced; `None` when it is not such a string or has none of them.
fn rewrite_json_string(literal: &[u8], fields: &[(&str, &str)]) -> Option<Vec<u8>> {
    let inner: String = serde_json::from_slice(literal).ok()?;
    let new = rewrite_object(inner.as_bytes(), fields)?;
    let new = String::from_utf8(new).ok()?;
    Some(json_string(&new))
}

fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The end (exclusive) of the string literal starting at `b[i] == '"'`.
fn skip_string(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The end (exclusive) of the JSON value starting at `b[i]`.
fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// The members of the JSON object that is `b` (surrounding whitespace allowed): each key
/// and its value's byte range. `None` when `b` is not an object.
fn members(b: &[u8]) -> Option<Vec<(String, Range<usize>)>> {
    let mut i = ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = ws(b, i + 1);
    let mut out = Vec::new();
    if b.get(i) == Some(&b'}') {
        return (ws(b, i + 1) == b.len()).then_some(out);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let end = skip_string(b, i)?;
        let key: String = serde_json::from_slice(&b[i..end]).ok()?;
        i = ws(b, end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = ws(b, i + 1);
        let vend = skip_value(b, i)?;
        out.push((key, i..vend));
        i = ws(b, vend);
        match b.get(i) {
            Some(b',') => i = ws(b, i + 1),
            Some(b'}') => break,
            _ => return None,
        }
    }
    (ws(b, i + 1) == b.len()).then_some(out)
}

#[cfg(test)]
mod unit {
    use super::*;

    fn id() -> Identity {
        Identity {
            session: "11111111-1111-4111-8111-111111111111".into(),
            device: "d".repeat(64),
            installation: "22222222-2222-4222-8222-222222222222".into(),
        }
    }

    #[test]
    fn uuids_are_v4() {
        let u = uuid_v4().unwrap();
        let b = u.as_bytes();
        assert_eq!(u.len(), 36);
        assert_eq!(
            (b[8], b[13], b[14], b[18], b[23]),
            (b'-', b'-', b'4', b'-', b'-')
        );
        assert!(matches!(b[19], b'8' | b'9' | b'a' | b'b'), "{u}");
        assert_ne!(u, uuid_v4().unwrap());
    }

    #[test]
    fn claude_user_id_is_edited_in_place() {
        let body = br#"{"model":"m", "messages":[{"c":"metadata\"}"}],"metadata" : {"user_id":"{\"device_id\":\"abc\",\"account_uuid\":\"\",\"session_id\":\"9728c8e4\"}"},"n":1.50}"#;
        let out = String::from_utf8(id().rewrite_body(body).unwrap()).unwrap();
        let want = format!(
            r#"{{"model":"m", "messages":[{{"c":"metadata\"}}"}}],"metadata" : {{"user_id":"{{\"device_id\":\"{}\",\"account_uuid\":\"\",\"session_id\":\"11111111-1111-4111-8111-111111111111\"}}"}},"n":1.50}}"#,
            "d".repeat(64)
        );
        assert_eq!(out, want);
    }

    #[test]
    fn codex_installation_id_is_edited_in_place() {
        let body = br#"{"client_metadata":{"session_id":"s1","x-codex-installation-id":"old","x-codex-turn-metadata":"{\"installation_id\":\"old\",\"session_id\":\"s1\"}"}}"#;
        let out = String::from_utf8(id().rewrite_body(body).unwrap()).unwrap();
        let new = "22222222-2222-4222-8222-222222222222";
        assert_eq!(
            out,
            format!(
                r#"{{"client_metadata":{{"session_id":"s1","x-codex-installation-id":"{new}","x-codex-turn-metadata":"{{\"installation_id\":\"{new}\",\"session_id\":\"s1\"}}"}}}}"#
            )
        );
        let mut h = HeaderMap::new();
        h.insert(
            CODEX_TURN_HEADER,
            HeaderValue::from_static(r#"{"installation_id":"old","turn_id":"t"}"#),
        );
        h.insert("session-id", HeaderValue::from_static("s1"));
        id().rewrite_headers(&mut h);
        assert_eq!(
            h[CODEX_TURN_HEADER],
            format!(r#"{{"installation_id":"{new}","turn_id":"t"}}"#)
        );
        assert_eq!(h["session-id"], "s1");
        assert!(h.get(CLAUDE_SESSION_HEADER).is_none());
    }

    #[test]
    fn other_bodies_are_left_alone() {
        for body in [
            &br#"{"model":"m","messages":[]}"#[..],
            br#"{"metadata":{"user_id":"plain-string"}}"#,
            br#"{"metadata":{"user_id":{"session_id":"x"}}}"#,
            br#"{"metadata":{"user_id":"{\"session_id\":1}"}}"#,
            br#"{"metadata":{"user_id":"{\"session_id\":\"x\"}"}"#, // not JSON
            br#"[{"metadata":{}}]"#,
            b"not json metadata\"",
            b"",
        ] {
            assert_eq!(
                id().rewrite_body(body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
