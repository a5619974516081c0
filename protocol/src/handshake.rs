//! Session secret and the Ping/Pong handshake.
//!
//! The host opens a connection and sends a [`Ping`] carrying [`PROTOCOL_VERSION`], the
//! 32-byte per-VM [`SessionSecret`] (also passed to the guest on the kernel command line)
//! and optionally the [`GuestPolicy`]. The guest compares the secret in constant time and
//! answers with a [`Pong`], or with an [`ErrorResponse`] (`Unauthorized` /
//! `VersionMismatch`) and closes the connection. No other message is served before a
//! successful handshake.

use std::fmt;

use subtle::ConstantTimeEq;
use zeroize::Zeroize;

use crate::error::{ProtocolError, Result};
use crate::message::{ErrorCode, ErrorResponse, Message, Ping, Pong, RequestId};
use crate::policy::{GuestInfo, GuestPolicy};

/// Version of this wire protocol; both sides must announce the same value.
pub const PROTOCOL_VERSION: u32 = 1;

/// Length of the session secret in bytes.
pub const SECRET_LEN: usize = 32;

/// The 32-byte per-VM session secret. Its `Debug` output never shows the bytes, equality
/// is constant-time, and the bytes are zeroed on drop.
#[derive(Clone)]
pub struct SessionSecret([u8; SECRET_LEN]);

impl SessionSecret {
    /// Wraps raw secret bytes.
    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> Self {
        SessionSecret(bytes)
    }

    /// Generates a fresh secret from the OS CSPRNG (`/dev/urandom`).
    pub fn random() -> std::io::Result<Self> {
        use std::io::Read;
        let mut b = [0u8; SECRET_LEN];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
        Ok(SessionSecret(b))
    }

    /// Parses 64 hexadecimal digits (the `voidbox.secret=` kernel parameter format).
    pub fn from_hex(s: &str) -> Result<Self, InvalidSecret> {
        let s = s.trim().as_bytes();
        if s.len() != SECRET_LEN * 2 {
            return Err(InvalidSecret);
        }
        let mut b = [0u8; SECRET_LEN];
        for (i, pair) in s.chunks_exact(2).enumerate() {
            let hi = hex_val(pair[0]).ok_or(InvalidSecret)?;
            let lo = hex_val(pair[1]).ok_or(InvalidSecret)?;
            b[i] = (hi << 4) | lo;
        }
        Ok(SessionSecret(b))
    }

    /// Lower-case hexadecimal encoding (64 characters). Handle the result with care.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(SECRET_LEN * 2);
        for b in self.0 {
            s.push(DIGITS[(b >> 4) as usize] as char);
            s.push(DIGITS[(b & 0xf) as usize] as char);
        }
        s
    }

    /// The raw bytes. Handle with care.
    pub fn as_bytes(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }

    /// Constant-time comparison with raw bytes of any length (a length mismatch is `false`).
    pub fn ct_eq_bytes(&self, other: &[u8]) -> bool {
        ct_eq(&self.0, other)
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Constant-time equality of two byte strings (via `subtle`); only the lengths leak.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

impl PartialEq for SessionSecret {
    fn eq(&self, other: &Self) -> bool {
        ct_eq(&self.0, &other.0)
    }
}

impl Eq for SessionSecret {}

impl fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionSecret(<redacted>)")
    }
}

impl Drop for SessionSecret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// A session secret string was not 64 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("session secret must be 64 hexadecimal digits")]
pub struct InvalidSecret;

impl Ping {
    /// A handshake request with the current [`PROTOCOL_VERSION`] and id `0`.
    pub fn new(secret: SessionSecret, policy: Option<GuestPolicy>) -> Self {
        Ping {
            id: RequestId::RESERVED,
            version: PROTOCOL_VERSION,
            secret,
            policy,
        }
    }

    /// Guest side: checks version and secret (constant time). On failure, returns the
    /// error to report locally and the [`Message::Error`] to send before closing.
    #[allow(clippy::result_large_err)] // cold path, once per connection
    pub fn verify(
        &self,
        expected: &SessionSecret,
    ) -> std::result::Result<(), (ProtocolError, Message)> {
        // Compare the secret first so a wrong secret never learns anything else.
        if self.secret != *expected {
            return Err((
                ProtocolError::AuthFailed,
                Message::error(self.id, ErrorCode::Unauthorized, "authentication failed"),
            ));
        }
        if self.version != PROTOCOL_VERSION {
            return Err((
                ProtocolError::VersionMismatch {
                    ours: PROTOCOL_VERSION,
                    theirs: self.version,
                },
                Message::error(
                    self.id,
                    ErrorCode::VersionMismatch,
                    format!(
                        "guest speaks protocol {PROTOCOL_VERSION}, host sent {}",
                        self.version
                    ),
                ),
            ));
        }
        Ok(())
    }
}

impl Pong {
    /// A handshake reply with the current [`PROTOCOL_VERSION`].
    pub fn new(id: RequestId, info: GuestInfo) -> Self {
        Pong {
            id,
            version: PROTOCOL_VERSION,
            info,
        }
    }
}

/// Host side: interprets the guest's reply to a [`Ping`].
pub fn check_pong(reply: Message) -> Result<Pong> {
    match reply {
        Message::Pong(p) if p.version == PROTOCOL_VERSION => Ok(p),
        Message::Pong(p) => Err(ProtocolError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: p.version,
        }),
        Message::Error(ErrorResponse {
            code: ErrorCode::Unauthorized,
            ..
        }) => Err(ProtocolError::AuthFailed),
        Message::Error(e) => Err(ProtocolError::Remote {
            code: e.code,
            message: e.message,
        }),
        other => Err(ProtocolError::UnexpectedMessage {
            expected: "Pong",
            got: other.message_type().name(),
        }),
    }
}

/// Guest side: interprets the first message of a connection. Returns the verified
/// [`Ping`] (whose policy the caller must apply), or the local error plus the reply to
/// send before closing the connection.
#[allow(clippy::result_large_err)] // cold path, once per connection
pub fn accept_ping(
    first: Message,
    expected: &SessionSecret,
) -> std::result::Result<Ping, (ProtocolError, Message)> {
    match first {
        Message::Ping(p) => p.verify(expected).map(|()| p),
        other => {
            let got = other.message_type().name();
            Err((
                ProtocolError::UnexpectedMessage {
                    expected: "Ping",
                    got,
                },
                Message::error(other.id(), ErrorCode::Unauthorized, "handshake required"),
            ))
        }
    }
}
