//! Session-secret loading, scrubbing and the server side of the handshake.
//!
//! The secret comparison itself is the protocol crate's constant-time one
//! ([`SessionSecret`]'s `PartialEq`, via [`voidbox_protocol::handshake::accept_ping`]).

use std::time::Duration;

use voidbox_protocol::{handshake::accept_ping, Message, Ping, ProtocolError, SessionSecret};

/// How long a fresh connection may take to send its Ping before it is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Parses a hex secret and scrubs the input string.
pub fn secret_from_hex(mut hex: String) -> Result<SessionSecret, String> {
    let parsed = SessionSecret::from_hex(&hex).map_err(|e| e.to_string());
    scrub_string(&mut hex);
    parsed
}

/// Reads a hex secret from a file (host mode `--secret-file`).
pub fn secret_from_file(path: &str) -> Result<SessionSecret, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
    secret_from_hex(text)
}

/// Checks the first message of a connection: it must be a Ping with our protocol version
/// and the session secret. Returns the Ping, or the error and the reply to send before
/// closing the connection (boxed: it is large and rare).
pub fn authenticate(
    first: Message,
    secret: &SessionSecret,
) -> Result<Ping, Box<(ProtocolError, Message)>> {
    accept_ping(first, secret).map_err(Box::new)
}

/// Overwrites a buffer with zeros in a way the optimiser may not elide.
pub fn scrub(buf: &mut [u8]) {
    for b in buf.iter_mut() {
        // SAFETY: `b` is a valid, aligned, exclusive reference to a byte of `buf`.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// Scrubs a `String`'s contents and empties it.
pub fn scrub_string(s: &mut String) {
    // SAFETY: zero bytes are valid UTF-8, so the string stays valid after the overwrite.
    scrub(unsafe { s.as_mut_vec() });
    s.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use voidbox_protocol::{ErrorCode, RequestId, PROTOCOL_VERSION};

    #[test]
    fn handshake_checks_secret_and_version() {
        let secret = secret_from_hex("ab".repeat(32)).unwrap();
        let good = Message::Ping(Ping::new(secret.clone(), None));
        assert!(authenticate(good, &secret).is_ok());
        let wrong = SessionSecret::from_bytes([0xac; 32]);
        let bad = Message::Ping(Ping::new(wrong, None));
        let (_, reply) = *authenticate(bad, &secret).unwrap_err();
        assert!(matches!(reply, Message::Error(e) if e.code == ErrorCode::Unauthorized));
        let mut old = Ping::new(secret.clone(), None);
        old.version = PROTOCOL_VERSION + 1;
        let (_, reply) = *authenticate(Message::Ping(old), &secret).unwrap_err();
        assert!(matches!(reply, Message::Error(e) if e.code == ErrorCode::VersionMismatch));
        let other =
            Message::TelemetryRequest(voidbox_protocol::TelemetryRequest { id: RequestId(1) });
        assert!(authenticate(other, &secret).is_err());
    }

    #[test]
    fn scrubbing_clears() {
        let mut s = String::from("secret");
        scrub_string(&mut s);
        assert!(s.is_empty());
        assert!(secret_from_hex("zz".into()).is_err());
    }
}
