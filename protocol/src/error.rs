//! Typed errors of the wire protocol.

use crate::message::RequestId;

/// Everything that can go wrong while encoding, decoding or exchanging frames.
///
/// Use [`ProtocolError::is_fatal`] to decide whether the connection must be dropped
/// (the byte stream is no longer in sync) or whether only the offending frame is bad.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The length header announced a payload larger than [`crate::MAX_MESSAGE_SIZE`];
    /// detected before anything was allocated.
    #[error("frame payload of {len} bytes exceeds the maximum of {max} bytes")]
    Oversized {
        /// Announced (or, when encoding, actual) payload length.
        len: u64,
        /// The limit in force.
        max: u32,
    },
    /// The frame's type byte is not a known [`crate::MessageType`].
    #[error("unknown message type 0x{0:02x}")]
    UnknownType(u8),
    /// The input ended in the middle of a frame.
    #[error("truncated frame: needed {needed} bytes, got {got}")]
    Truncated {
        /// Bytes required to complete the header or frame.
        needed: u64,
        /// Bytes actually available.
        got: u64,
    },
    /// The frame was complete but its payload does not decode as the announced type.
    #[error("malformed {ty} payload: {detail}")]
    Malformed {
        /// Name of the message type whose payload was bad.
        ty: &'static str,
        /// Best-effort request id recovered from the bad payload, so the peer can be answered.
        id: Option<RequestId>,
        /// Human-readable reason (JSON error, missing bytes, ...).
        detail: String,
    },
    /// Bytes remained after a complete frame where exactly one frame was expected.
    #[error("{extra} trailing bytes after a complete frame")]
    TrailingBytes {
        /// Number of unexpected bytes.
        extra: u64,
    },
    /// The peer speaks an incompatible protocol version.
    #[error("protocol version mismatch: ours {ours}, peer {theirs}")]
    VersionMismatch {
        /// Our [`crate::PROTOCOL_VERSION`].
        ours: u32,
        /// The version the peer announced.
        theirs: u32,
    },
    /// The handshake secret did not match.
    #[error("authentication failed: session secret mismatch")]
    AuthFailed,
    /// A message arrived that is not valid at this point of the conversation.
    #[error("unexpected message: expected {expected}, got {got}")]
    UnexpectedMessage {
        /// What the protocol state required.
        expected: &'static str,
        /// What arrived.
        got: &'static str,
    },
    /// The peer answered with an [`crate::Message::Error`] (e.g. during the handshake).
    #[error("peer error {code:?}: {message}")]
    Remote {
        /// The peer's error code.
        code: crate::message::ErrorCode,
        /// The peer's message.
        message: String,
    },
    /// The peer closed the connection at a frame boundary.
    #[error("connection closed by peer")]
    Closed,
    /// Underlying I/O failure.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl ProtocolError {
    /// `true` when the byte stream can no longer be trusted to be in sync (or the peer is
    /// gone / unauthenticated) and the connection must be closed. `false` for errors that
    /// concern one fully-consumed frame only (unknown type, malformed payload), after which
    /// reading the next frame is safe.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            ProtocolError::UnknownType(_)
                | ProtocolError::Malformed { .. }
                | ProtocolError::Remote { .. }
        )
    }

    /// The request id the bad frame belonged to, when it could be recovered.
    pub fn request_id(&self) -> Option<RequestId> {
        match self {
            ProtocolError::Malformed { id, .. } => *id,
            _ => None,
        }
    }

    pub(crate) fn malformed(
        ty: &'static str,
        id: Option<RequestId>,
        detail: impl Into<String>,
    ) -> Self {
        ProtocolError::Malformed {
            ty,
            id,
            detail: detail.into(),
        }
    }
}

/// Convenience alias.
pub type Result<T, E = ProtocolError> = std::result::Result<T, E>;
