//! Blocking adapter over [`std::io::Read`] / [`std::io::Write`].
//!
//! Writers emit one frame per `write_all` + `flush`; when several threads share one
//! stream, serialize writes (e.g. behind a `Mutex`) so frames never interleave.

use std::io::{ErrorKind, Read, Write};

use crate::codec::{from_owned_frame, scrub_secret};
use crate::error::{ProtocolError, Result};
use crate::frame::{Frame, FrameHeader, HEADER_LEN};
use crate::handshake::{accept_ping, check_pong, SessionSecret};
use crate::message::{Message, Ping, Pong};
use crate::policy::{GuestInfo, GuestPolicy};

/// Reads one frame. Returns [`ProtocolError::Closed`] on EOF at a frame boundary,
/// [`ProtocolError::Truncated`] on EOF inside a frame, and [`ProtocolError::Oversized`]
/// (before reading or allocating the payload) when the header announces too much.
pub fn read_frame<R: Read + ?Sized>(r: &mut R) -> Result<Frame> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Err(ProtocolError::Closed),
            Ok(0) => {
                return Err(ProtocolError::Truncated {
                    needed: HEADER_LEN as u64,
                    got: got as u64,
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let header = FrameHeader::parse(h)?;
    let mut payload = header.payload_buffer();
    r.take(header.len as u64).read_to_end(&mut payload)?;
    header.finish(payload)
}

/// Writes one frame and flushes.
pub fn write_frame<W: Write + ?Sized>(w: &mut W, frame: &Frame) -> Result<()> {
    let mut buf = Vec::new();
    frame.encode_into(&mut buf)?;
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// Reads and decodes one message. Errors for which [`ProtocolError::is_fatal`] is
/// `false` (unknown type, malformed payload) leave the stream positioned at the next frame.
pub fn read_message<R: Read + ?Sized>(r: &mut R) -> Result<Message> {
    from_owned_frame(read_frame(r)?)
}

/// Encodes and writes one message, then flushes. The encoded bytes of a secret-carrying
/// message are zeroed afterwards.
pub fn write_message<W: Write + ?Sized>(w: &mut W, msg: &Message) -> Result<()> {
    let mut buf = msg.encode()?;
    let written = w.write_all(&buf).and_then(|()| w.flush());
    scrub_secret(msg.message_type().as_u8(), &mut buf);
    written?;
    Ok(())
}

/// Host side of the handshake: sends a [`Ping`] and waits for the [`Pong`].
pub fn client_handshake<S: Read + Write + ?Sized>(
    stream: &mut S,
    secret: &SessionSecret,
    policy: Option<GuestPolicy>,
) -> Result<Pong> {
    write_message(stream, &Message::Ping(Ping::new(secret.clone(), policy)))?;
    check_pong(read_message(stream)?)
}

/// Guest side of the handshake: reads the first message, verifies it, and answers with a
/// [`Pong`] carrying `info`. On failure an error reply is sent (best effort) and the error
/// returned; the caller must then close the connection. Returns the verified [`Ping`].
pub fn server_handshake<S: Read + Write + ?Sized>(
    stream: &mut S,
    secret: &SessionSecret,
    info: GuestInfo,
) -> Result<Ping> {
    let first = read_message(stream)?;
    match accept_ping(first, secret) {
        Ok(ping) => {
            write_message(stream, &Message::Pong(Pong::new(ping.id, info)))?;
            Ok(ping)
        }
        Err((err, reply)) => {
            let _ = write_message(stream, &reply);
            Err(err)
        }
    }
}
