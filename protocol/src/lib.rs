//! The voidbox host ⇄ guest wire protocol: frame codec, message types, limits, handshake.
//!
//! * Framing ([`frame`]): `u32 LE payload length | u8 type | payload`, payloads capped at
//!   [`MAX_MESSAGE_SIZE`] (checked before allocating).
//! * Messages ([`message`]): JSON payloads, except the byte-carrying types (Ping/Pong,
//!   Rekey, exec output/stdin, file chunks, PTY data) which use compact binary layouts
//!   ([`codec`]).
//! * Every message carries a [`RequestId`]; responses echo it, so requests multiplex over
//!   one connection ([`mux`], and [`tokio_io::Demux`] with the `tokio` feature).
//! * Handshake ([`handshake`]): [`Ping`] with version + 32-byte [`SessionSecret`] (+ policy),
//!   answered by [`Pong`]; constant-time secret comparison. An authenticated [`Rekey`]
//!   rotates the secret, reseeds the guest RNG and sets the guest clock (VM clones).
//! * Adapters: [`blocking`] (std `Read`/`Write`) and, with feature `tokio`, [`tokio_io`]
//!   (`AsyncRead`/`AsyncWrite`, a `tokio_util` codec and the demultiplexer).
//!
//! `Debug` output never contains the session secret or re-key entropy (both are zeroed on
//! drop, as are the encoded Ping/Rekey frames in the I/O adapters), and redacts environment
//! values whose names contain KEY, SECRET, TOKEN or PASSWORD ([`redact`]).
//!
//! ```
//! use voidbox_protocol::{blocking, ExecRequest, Message, RequestIdAllocator};
//!
//! let ids = RequestIdAllocator::new();
//! let req = Message::ExecRequest(ExecRequest {
//!     id: ids.next_id(),
//!     program: "echo".into(),
//!     args: vec!["hi".into()],
//!     env: vec![("API_TOKEN".into(), "s3cr3t".into())],
//!     ..Default::default()
//! });
//! let mut wire = Vec::new();
//! blocking::write_message(&mut wire, &req)?;
//! let back = blocking::read_message(&mut wire.as_slice())?;
//! assert_eq!(back, req);
//! assert!(!format!("{back:?}").contains("s3cr3t"));
//! # Ok::<(), voidbox_protocol::ProtocolError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod b64;
pub mod blocking;
pub mod codec;
pub mod error;
pub mod frame;
pub mod guest_paths;
pub mod handshake;
pub mod message;
pub mod mux;
pub mod policy;
pub mod redact;
pub mod restore_page;
#[cfg(feature = "tokio")]
pub mod tokio_io;

pub use error::{ProtocolError, Result};
pub use frame::{Frame, FrameHeader, HEADER_LEN, MAX_MESSAGE_SIZE};
pub use handshake::{ct_eq, InvalidSecret, SessionSecret, PROTOCOL_VERSION, SECRET_LEN};
pub use message::*;
pub use mux::RequestIdAllocator;
pub use policy::{
    valid_allow_entry, GuestInfo, GuestPolicy, ResourceLimits, CAP_HELD, CAP_REKEY,
    CAP_REKEY_SECRET_ONLY,
};
pub use redact::is_sensitive_env_name;
/// Wrapper that zeroes its contents on drop (used for [`Rekey::entropy`]).
pub use zeroize::Zeroizing;

/// Recommended maximum data bytes per [`ExecOutputChunk`] / [`PtyData`] frame.
pub const OUTPUT_CHUNK_SIZE: usize = 64 * 1024;

/// Recommended maximum data bytes per [`FileChunk`] frame (and inline [`WriteFile`] contents).
pub const FILE_CHUNK_SIZE: usize = 1024 * 1024;

/// The guest agent's system `PATH` directories, as paths inside the guest image (no leading
/// `/`), in lookup order: the image builder lists the programs in them, and `validate` checks
/// a bare `run.program` against those.
pub const GUEST_PATH_DIRS: [&str; 6] = [
    "usr/local/bin",
    "usr/bin",
    "bin",
    "usr/local/sbin",
    "usr/sbin",
    "sbin",
];

/// Exec timeout, in seconds, when a request sets none (the engine's documented default node
/// timeout; the engine always sends one).
pub const DEFAULT_EXEC_TIMEOUT_SECS: u64 = 1800;

/// Largest exec timeout, in seconds: the guest agent's ceiling and the spec schema's maximum
/// `timeout_secs`, so no accepted timeout is ever cut short.
pub const MAX_EXEC_TIMEOUT_SECS: u64 = 86_400;
