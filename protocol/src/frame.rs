//! Raw frames: `u32 LE payload length | u8 type | payload`.
//!
//! This layer knows nothing about message semantics; it only enforces the framing and
//! [`MAX_MESSAGE_SIZE`]. The type byte is kept raw so that an unknown type can be skipped
//! (its payload is still consumed) without losing stream synchronisation.

use crate::error::{ProtocolError, Result};

/// Largest accepted payload, in bytes (64 MiB). Checked against the length header before
/// any buffer is allocated, and on encode.
pub const MAX_MESSAGE_SIZE: u32 = 64 * 1024 * 1024;

/// Size of the frame header: 4 bytes of little-endian length plus 1 type byte.
pub const HEADER_LEN: usize = 5;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload length in bytes (excluding the header).
    pub len: u32,
    /// Raw message type byte.
    pub ty: u8,
}

impl FrameHeader {
    /// Parses a header and validates the length against [`MAX_MESSAGE_SIZE`].
    pub fn parse(bytes: [u8; HEADER_LEN]) -> Result<Self> {
        let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        check_len(len as u64)?;
        Ok(FrameHeader { len, ty: bytes[4] })
    }

    /// An empty payload buffer for this frame. Its capacity is capped, so a hostile length
    /// header cannot make a reader allocate before the bytes actually arrive.
    pub fn payload_buffer(self) -> Vec<u8> {
        Vec::with_capacity((self.len as usize).min(INITIAL_PAYLOAD_CAPACITY))
    }

    /// The frame once `payload` has been read from a stream; a short read is
    /// [`ProtocolError::Truncated`].
    pub fn finish(self, payload: Vec<u8>) -> Result<Frame> {
        let len = self.len as usize;
        if payload.len() < len {
            return Err(ProtocolError::Truncated {
                needed: (HEADER_LEN + len) as u64,
                got: (HEADER_LEN + payload.len()) as u64,
            });
        }
        Ok(Frame {
            ty: self.ty,
            payload,
        })
    }

    /// Serializes the header.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let l = self.len.to_le_bytes();
        [l[0], l[1], l[2], l[3], self.ty]
    }
}

/// Initial payload capacity of a stream reader; the buffer grows only as bytes arrive.
const INITIAL_PAYLOAD_CAPACITY: usize = 64 * 1024;

/// Returns [`ProtocolError::Oversized`] when `len` exceeds [`MAX_MESSAGE_SIZE`].
pub(crate) fn check_len(len: u64) -> Result<()> {
    if len > MAX_MESSAGE_SIZE as u64 {
        return Err(ProtocolError::Oversized {
            len,
            max: MAX_MESSAGE_SIZE,
        });
    }
    Ok(())
}

/// One frame: a raw type byte and its payload.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    /// Raw message type byte (see [`crate::MessageType`]).
    pub ty: u8,
    /// Payload bytes (JSON or a binary layout depending on the type).
    pub payload: Vec<u8>,
}

impl std::fmt::Debug for Frame {
    // Never dump payloads: they may carry secrets (Ping) or bulk data.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("ty", &format_args!("0x{:02x}", self.ty))
            .field("len", &self.payload.len())
            .finish()
    }
}

impl Frame {
    /// Creates a frame, failing with [`ProtocolError::Oversized`] if the payload is too large.
    pub fn new(ty: u8, payload: Vec<u8>) -> Result<Self> {
        check_len(payload.len() as u64)?;
        Ok(Frame { ty, payload })
    }

    /// Header of this frame.
    pub fn header(&self) -> FrameHeader {
        // `payload.len()` fits: checked by `new` and by every decoder; saturate defensively.
        FrameHeader {
            len: u32::try_from(self.payload.len()).unwrap_or(u32::MAX),
            ty: self.ty,
        }
    }

    /// Appends the encoded frame (header + payload) to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<()> {
        check_len(self.payload.len() as u64)?;
        out.reserve(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&self.header().to_bytes());
        out.extend_from_slice(&self.payload);
        Ok(())
    }

    /// Encodes the frame into a fresh buffer.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// Incremental decoder: returns `Ok(None)` when `buf` does not yet hold a whole frame,
    /// or the frame and the number of bytes it used. Oversized headers fail immediately.
    pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>> {
        let Some(header) = buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(header);
        let header = FrameHeader::parse(h)?;
        let total = HEADER_LEN + header.len as usize;
        let Some(payload) = buf.get(HEADER_LEN..total) else {
            return Ok(None);
        };
        Ok(Some((
            Frame {
                ty: header.ty,
                payload: payload.to_vec(),
            },
            total,
        )))
    }

    /// Decodes exactly one frame occupying all of `buf`: errors on a short buffer
    /// ([`ProtocolError::Truncated`]) and on leftovers ([`ProtocolError::TrailingBytes`]).
    pub fn decode_exact(buf: &[u8]) -> Result<Frame> {
        match Frame::decode(buf)? {
            Some((frame, used)) if used == buf.len() => Ok(frame),
            Some((_, used)) => Err(ProtocolError::TrailingBytes {
                extra: (buf.len() - used) as u64,
            }),
            None => {
                let needed = if buf.len() < HEADER_LEN {
                    HEADER_LEN as u64
                } else {
                    HEADER_LEN as u64
                        + u64::from(u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]))
                };
                Err(ProtocolError::Truncated {
                    needed,
                    got: buf.len() as u64,
                })
            }
        }
    }
}
