//! Message ⇄ payload encoding: JSON for structured messages, compact little-endian binary
//! layouts for byte-carrying ones.
//!
//! Binary layouts (all integers little-endian):
//!
//! | type | layout |
//! |------|--------|
//! | `Ping` | `id u64 · version u32 · secret [u8; 32] · policy JSON (empty = none)` |
//! | `Pong` | `id u64 · version u32 · guest-info JSON` |
//! | `Rekey` | `id u64 · secret [u8; 32] · unix_time_ns u64 · entropy (32..=256 bytes)` |
//! | `ExecOutputChunk` | `id u64 · stream u8 (1 stdout, 2 stderr) · seq u64 · data` |
//! | `ExecStdin` | `id u64 · flags u8 (bit 0 = eof) · data` |
//! | `FileChunk` | `id u64 · offset u64 · flags u8 (bit 0 = last) · data` |
//! | `PtyData` | `id u64 · data` |

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, Zeroizing};

use crate::error::{ProtocolError, Result};
use crate::frame::{check_len, Frame, FrameHeader, HEADER_LEN};
use crate::handshake::{SessionSecret, SECRET_LEN};
use crate::message::{check_rekey_entropy, *};

const FLAG_END: u8 = 0x01;

impl Message {
    /// Serializes the payload (without the frame header).
    pub fn encode_payload(&self) -> Result<Vec<u8>> {
        let out = match self {
            Message::Ping(m) => {
                let mut b = bin_head(m.id, 12 + SECRET_LEN);
                b.extend_from_slice(&m.version.to_le_bytes());
                b.extend_from_slice(m.secret.as_bytes());
                if let Some(p) = &m.policy {
                    json_into(&mut b, p)?;
                }
                b
            }
            Message::Pong(m) => {
                let mut b = bin_head(m.id, 12);
                b.extend_from_slice(&m.version.to_le_bytes());
                json_into(&mut b, &m.info)?;
                b
            }
            Message::Rekey(m) => {
                check_rekey_entropy(m.entropy.len())
                    .map_err(|d| ProtocolError::malformed("Rekey", Some(m.id), d))?;
                // Sized exactly: no reallocation leaves a stray copy of the secret behind.
                let mut b = bin_head(m.id, SECRET_LEN + 8 + m.entropy.len());
                b.extend_from_slice(m.secret.as_bytes());
                b.extend_from_slice(&m.unix_time_ns.to_le_bytes());
                b.extend_from_slice(&m.entropy);
                b
            }
            Message::ExecOutputChunk(m) => {
                let mut b = bin_head(m.id, 17 + m.data.len());
                b.push(m.stream.as_u8());
                b.extend_from_slice(&m.seq.to_le_bytes());
                b.extend_from_slice(&m.data);
                b
            }
            Message::ExecStdin(m) => {
                let mut b = bin_head(m.id, 9 + m.data.len());
                b.push(if m.eof { FLAG_END } else { 0 });
                b.extend_from_slice(&m.data);
                b
            }
            Message::FileChunk(m) => {
                let mut b = bin_head(m.id, 17 + m.data.len());
                b.extend_from_slice(&m.offset.to_le_bytes());
                b.push(if m.last { FLAG_END } else { 0 });
                b.extend_from_slice(&m.data);
                b
            }
            Message::PtyData(m) => {
                let mut b = bin_head(m.id, 8 + m.data.len());
                b.extend_from_slice(&m.data);
                b
            }
            Message::Shutdown(m) => json(m)?,
            Message::Ack(m) => json(m)?,
            Message::Error(m) => json(m)?,
            Message::ExecRequest(m) => json(m)?,
            Message::ExecResponse(m) => json(m)?,
            Message::ExecSignal(m) => json(m)?,
            Message::ExecAttach(m) => json(m)?,
            Message::HeldQuery(m) => json(m)?,
            Message::HeldInfo(m) => json(m)?,
            Message::WriteFile(m) => json(m)?,
            Message::ReadFile(m) => json(m)?,
            Message::MkdirP(m) => json(m)?,
            Message::FileStat(m) => json(m)?,
            Message::FileStatResponse(m) => json(m)?,
            Message::ListDir(m) => json(m)?,
            Message::DirListing(m) => json(m)?,
            Message::MountShare(m) => json(m)?,
            Message::PtyOpen(m) => json(m)?,
            Message::PtyResize(m) => json(m)?,
            Message::PtyClose(m) => json(m)?,
            Message::TelemetryRequest(m) => json(m)?,
            Message::Telemetry(m) => json(m)?,
            Message::ProbePorts(m) => json(m)?,
            Message::PortsOpen(m) => json(m)?,
        };
        check_len(out.len() as u64)?;
        Ok(out)
    }

    /// Converts the message into a [`Frame`].
    pub fn to_frame(&self) -> Result<Frame> {
        Ok(Frame {
            ty: self.message_type().as_u8(),
            payload: self.encode_payload()?,
        })
    }

    /// Encodes the complete frame (header + payload).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut payload = self.encode_payload()?;
        let header = FrameHeader {
            len: u32::try_from(payload.len()).map_err(|_| ProtocolError::Oversized {
                len: payload.len() as u64,
                max: crate::MAX_MESSAGE_SIZE,
            })?,
            ty: self.message_type().as_u8(),
        };
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        out.extend_from_slice(&header.to_bytes());
        out.extend_from_slice(&payload);
        scrub_secret(header.ty, &mut payload);
        Ok(out)
    }

    /// Decodes a payload of raw type `ty`.
    pub fn decode_payload(ty: u8, payload: &[u8]) -> Result<Message> {
        let mt = MessageType::from_u8(ty).ok_or(ProtocolError::UnknownType(ty))?;
        check_len(payload.len() as u64)?;
        let name = mt.name();
        if !mt.is_binary() {
            return decode_json(mt, payload);
        }
        let mut r = BinReader {
            buf: payload,
            pos: 0,
            ty: name,
            id: None,
        };
        let id = RequestId(r.u64()?);
        r.id = Some(id);
        let msg = match mt {
            MessageType::Ping => {
                let version = r.u32()?;
                let secret = SessionSecret::from_bytes(r.array::<SECRET_LEN>()?);
                let rest = r.rest();
                let policy = if rest.is_empty() {
                    None
                } else {
                    Some(r.json(rest)?)
                };
                Message::Ping(Ping {
                    id,
                    version,
                    secret,
                    policy,
                })
            }
            MessageType::Pong => {
                let version = r.u32()?;
                let rest = r.rest();
                let info = r.json(rest)?;
                Message::Pong(Pong { id, version, info })
            }
            MessageType::Rekey => {
                let secret = SessionSecret::from_bytes(r.array::<SECRET_LEN>()?);
                let unix_time_ns = r.u64()?;
                let entropy = r.rest();
                check_rekey_entropy(entropy.len()).map_err(|d| r.err(d))?;
                Message::Rekey(Rekey {
                    id,
                    secret,
                    unix_time_ns,
                    entropy: Zeroizing::new(entropy.to_vec()),
                })
            }
            MessageType::ExecOutputChunk => {
                let sb = r.u8()?;
                let stream = OutputStream::from_u8(sb)
                    .ok_or_else(|| r.err(format!("invalid output stream {sb}")))?;
                let seq = r.u64()?;
                Message::ExecOutputChunk(ExecOutputChunk {
                    id,
                    stream,
                    seq,
                    data: r.rest().to_vec(),
                })
            }
            MessageType::ExecStdin => {
                let eof = r.flags()?;
                Message::ExecStdin(ExecStdin {
                    id,
                    eof,
                    data: r.rest().to_vec(),
                })
            }
            MessageType::FileChunk => {
                let offset = r.u64()?;
                let last = r.flags()?;
                Message::FileChunk(FileChunk {
                    id,
                    offset,
                    last,
                    data: r.rest().to_vec(),
                })
            }
            MessageType::PtyData => Message::PtyData(PtyData {
                id,
                data: r.rest().to_vec(),
            }),
            _ => {
                return Err(ProtocolError::malformed(
                    name,
                    Some(id),
                    "not a binary type",
                ))
            }
        };
        Ok(msg)
    }

    /// Decodes a [`Frame`] into a message.
    pub fn from_frame(frame: &Frame) -> Result<Message> {
        Message::decode_payload(frame.ty, &frame.payload)
    }

    /// Incremental decoder over a byte buffer: `Ok(None)` until a whole frame is
    /// available, then the message and the number of bytes consumed. On a non-fatal error
    /// (see [`ProtocolError::is_fatal`]) the bad frame is still `used` bytes long; callers
    /// that want to skip it can use [`Frame::decode`] + [`Message::from_frame`].
    pub fn decode(buf: &[u8]) -> Result<Option<(Message, usize)>> {
        match Frame::decode(buf)? {
            None => Ok(None),
            Some((frame, used)) => Ok(Some((from_owned_frame(frame)?, used))),
        }
    }

    /// Decodes exactly one complete frame occupying all of `buf` (no truncation, no
    /// trailing bytes).
    pub fn decode_exact(buf: &[u8]) -> Result<Message> {
        from_owned_frame(Frame::decode_exact(buf)?)
    }
}

/// Zeroes `buf` (an encoded frame or payload of raw type `ty`) when the type carries a
/// session secret; other buffers are left alone.
pub(crate) fn scrub_secret(ty: u8, buf: &mut Vec<u8>) {
    if MessageType::from_u8(ty).is_some_and(MessageType::carries_secret) {
        buf.zeroize();
    }
}

/// [`Message::from_frame`] for a frame the caller no longer needs: a secret-carrying
/// payload is zeroed once decoded.
pub(crate) fn from_owned_frame(mut frame: Frame) -> Result<Message> {
    let msg = Message::from_frame(&frame);
    scrub_secret(frame.ty, &mut frame.payload);
    msg
}

fn bin_head(id: RequestId, extra: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(8 + extra);
    b.extend_from_slice(&id.0.to_le_bytes());
    b
}

fn json<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| ProtocolError::malformed("json", None, e.to_string()))
}

fn json_into<T: Serialize>(out: &mut Vec<u8>, v: &T) -> Result<()> {
    serde_json::to_writer(out, v).map_err(|e| ProtocolError::malformed("json", None, e.to_string()))
}

#[derive(Deserialize)]
struct IdOnly {
    id: RequestId,
}

fn decode_json(mt: MessageType, payload: &[u8]) -> Result<Message> {
    // serde's derived struct visitors also accept JSON arrays; the wire format is objects only.
    if payload.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ProtocolError::malformed(
            mt.name(),
            None,
            "payload is not a JSON object",
        ));
    }
    fn de<T: DeserializeOwned>(mt: MessageType, p: &[u8]) -> Result<T> {
        serde_json::from_slice(p).map_err(|e| {
            let id = serde_json::from_slice::<IdOnly>(p).ok().map(|i| i.id);
            ProtocolError::malformed(mt.name(), id, e.to_string())
        })
    }
    Ok(match mt {
        MessageType::Shutdown => Message::Shutdown(de(mt, payload)?),
        MessageType::Ack => Message::Ack(de(mt, payload)?),
        MessageType::Error => Message::Error(de(mt, payload)?),
        MessageType::ExecRequest => Message::ExecRequest(de(mt, payload)?),
        MessageType::ExecResponse => Message::ExecResponse(de(mt, payload)?),
        MessageType::ExecSignal => Message::ExecSignal(de(mt, payload)?),
        MessageType::ExecAttach => Message::ExecAttach(de(mt, payload)?),
        MessageType::HeldQuery => Message::HeldQuery(de(mt, payload)?),
        MessageType::HeldInfo => Message::HeldInfo(de(mt, payload)?),
        MessageType::WriteFile => Message::WriteFile(de(mt, payload)?),
        MessageType::ReadFile => Message::ReadFile(de(mt, payload)?),
        MessageType::MkdirP => Message::MkdirP(de(mt, payload)?),
        MessageType::FileStat => Message::FileStat(de(mt, payload)?),
        MessageType::FileStatResponse => Message::FileStatResponse(de(mt, payload)?),
        MessageType::ListDir => Message::ListDir(de(mt, payload)?),
        MessageType::DirListing => Message::DirListing(de(mt, payload)?),
        MessageType::MountShare => Message::MountShare(de(mt, payload)?),
        MessageType::PtyOpen => Message::PtyOpen(de(mt, payload)?),
        MessageType::PtyResize => Message::PtyResize(de(mt, payload)?),
        MessageType::PtyClose => Message::PtyClose(de(mt, payload)?),
        MessageType::TelemetryRequest => Message::TelemetryRequest(de(mt, payload)?),
        MessageType::Telemetry => Message::Telemetry(de(mt, payload)?),
        MessageType::ProbePorts => Message::ProbePorts(de(mt, payload)?),
        MessageType::PortsOpen => Message::PortsOpen(de(mt, payload)?),
        _ => return Err(ProtocolError::malformed(mt.name(), None, "not a JSON type")),
    })
}

/// Bounds-checked little-endian reader over a binary payload.
struct BinReader<'a> {
    buf: &'a [u8],
    pos: usize,
    ty: &'static str,
    id: Option<RequestId>,
}

impl<'a> BinReader<'a> {
    fn err(&self, detail: impl Into<String>) -> ProtocolError {
        ProtocolError::malformed(self.ty, self.id, detail)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                self.err(format!(
                    "payload too short: need {n} bytes at offset {}, have {}",
                    self.pos,
                    self.buf.len().saturating_sub(self.pos)
                ))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn flags(&mut self) -> Result<bool> {
        let f = self.u8()?;
        if f & !FLAG_END != 0 {
            return Err(self.err(format!("unknown flag bits 0x{f:02x}")));
        }
        Ok(f & FLAG_END != 0)
    }

    fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    fn json<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T> {
        serde_json::from_slice(bytes).map_err(|e| self.err(e.to_string()))
    }
}
