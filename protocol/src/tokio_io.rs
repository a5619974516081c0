//! Tokio adapter (feature `tokio`): async frame I/O, a `tokio_util` codec, and the
//! request-id demultiplexer used by the host to share one connection between many
//! concurrent requests.
//!
//! The free functions are **not** cancellation-safe (a cancelled read loses its partial
//! frame): call them from a dedicated reader task, or use [`FrameCodec`] /
//! [`MessageCodec`] with `tokio_util::codec::FramedRead`, which are.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use ::tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use ::tokio::sync::mpsc;
use bytes::{Buf, BufMut, BytesMut};

use crate::codec::{from_owned_frame, scrub_secret};
use crate::error::{ProtocolError, Result};
use crate::frame::{Frame, FrameHeader, HEADER_LEN};
use crate::handshake::{accept_ping, check_pong, SessionSecret};
use crate::message::{ErrorCode, Message, MessageType, Ping, Pong, RequestId};
use crate::mux::RequestIdAllocator;
use crate::policy::{GuestInfo, GuestPolicy};

/// Reads one frame; same contract as [`crate::blocking::read_frame`].
pub async fn read_frame<R: AsyncRead + Unpin + ?Sized>(r: &mut R) -> Result<Frame> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut h[got..]).await? {
            0 if got == 0 => return Err(ProtocolError::Closed),
            0 => {
                return Err(ProtocolError::Truncated {
                    needed: HEADER_LEN as u64,
                    got: got as u64,
                })
            }
            n => got += n,
        }
    }
    let header = FrameHeader::parse(h)?;
    let mut payload = header.payload_buffer();
    r.take(header.len as u64).read_to_end(&mut payload).await?;
    header.finish(payload)
}

/// Writes one frame and flushes.
pub async fn write_frame<W: AsyncWrite + Unpin + ?Sized>(w: &mut W, frame: &Frame) -> Result<()> {
    let mut buf = Vec::new();
    frame.encode_into(&mut buf)?;
    w.write_all(&buf).await?;
    w.flush().await?;
    Ok(())
}

/// Reads and decodes one message; same contract as [`crate::blocking::read_message`].
pub async fn read_message<R: AsyncRead + Unpin + ?Sized>(r: &mut R) -> Result<Message> {
    from_owned_frame(read_frame(r).await?)
}

/// Encodes and writes one message, then flushes; same contract as
/// [`crate::blocking::write_message`].
pub async fn write_message<W: AsyncWrite + Unpin + ?Sized>(w: &mut W, msg: &Message) -> Result<()> {
    let mut buf = msg.encode()?;
    let written = write_all_flush(w, &buf).await;
    scrub_secret(msg.message_type().as_u8(), &mut buf);
    written
}

async fn write_all_flush<W: AsyncWrite + Unpin + ?Sized>(w: &mut W, buf: &[u8]) -> Result<()> {
    w.write_all(buf).await?;
    w.flush().await?;
    Ok(())
}

/// Host side of the handshake; see [`crate::blocking::client_handshake`].
pub async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin + ?Sized>(
    stream: &mut S,
    secret: &SessionSecret,
    policy: Option<GuestPolicy>,
) -> Result<Pong> {
    write_message(stream, &Message::Ping(Ping::new(secret.clone(), policy))).await?;
    check_pong(read_message(stream).await?)
}

/// Guest side of the handshake; see [`crate::blocking::server_handshake`].
pub async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin + ?Sized>(
    stream: &mut S,
    secret: &SessionSecret,
    info: GuestInfo,
) -> Result<Ping> {
    let first = read_message(stream).await?;
    match accept_ping(first, secret) {
        Ok(ping) => {
            write_message(stream, &Message::Pong(Pong::new(ping.id, info))).await?;
            Ok(ping)
        }
        Err((err, reply)) => {
            let _ = write_message(stream, &reply).await;
            Err(err)
        }
    }
}

/// `tokio_util` codec for raw [`Frame`]s. Rejects oversized headers before buffering the
/// payload. Unknown types pass through (decode them with [`Message::from_frame`]), which
/// makes this the codec of choice for servers that must survive bad frames.
#[derive(Debug, Clone, Copy, Default)]
pub struct FrameCodec;

impl tokio_util::codec::Decoder for FrameCodec {
    type Item = Frame;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>> {
        let Some(h) = src.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(h);
        let header = FrameHeader::parse(hb)?;
        let total = HEADER_LEN + header.len as usize;
        if src.len() < total {
            return Ok(None);
        }
        let mut frame = src.split_to(total);
        frame.advance(HEADER_LEN);
        Ok(Some(Frame {
            ty: header.ty,
            payload: frame.to_vec(),
        }))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>> {
        match self.decode(src)? {
            Some(f) => Ok(Some(f)),
            None if src.is_empty() => Ok(None),
            None => {
                let needed = if src.len() < HEADER_LEN {
                    HEADER_LEN as u64
                } else {
                    HEADER_LEN as u64
                        + u64::from(u32::from_le_bytes([src[0], src[1], src[2], src[3]]))
                };
                Err(ProtocolError::Truncated {
                    needed,
                    got: src.len() as u64,
                })
            }
        }
    }
}

impl tokio_util::codec::Encoder<Frame> for FrameCodec {
    type Error = ProtocolError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<()> {
        <Self as tokio_util::codec::Encoder<&Frame>>::encode(self, &frame, dst)
    }
}

impl tokio_util::codec::Encoder<&Frame> for FrameCodec {
    type Error = ProtocolError;

    fn encode(&mut self, frame: &Frame, dst: &mut BytesMut) -> Result<()> {
        crate::frame::check_len(frame.payload.len() as u64)?;
        let h = frame.header();
        dst.reserve(HEADER_LEN + frame.payload.len());
        dst.put_slice(&h.to_bytes());
        dst.put_slice(&frame.payload);
        Ok(())
    }
}

/// `tokio_util` codec for typed [`Message`]s. Any decode error ends a `FramedRead`
/// stream; use [`FrameCodec`] when bad frames should be skipped instead.
#[derive(Debug, Clone, Copy, Default)]
pub struct MessageCodec;

impl tokio_util::codec::Decoder for MessageCodec {
    type Item = Message;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Message>> {
        match FrameCodec.decode(src)? {
            Some(f) => from_owned_frame(f).map(Some),
            None => Ok(None),
        }
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Message>> {
        match FrameCodec.decode_eof(src)? {
            Some(f) => from_owned_frame(f).map(Some),
            None => Ok(None),
        }
    }
}

impl tokio_util::codec::Encoder<Message> for MessageCodec {
    type Error = ProtocolError;

    fn encode(&mut self, msg: Message, dst: &mut BytesMut) -> Result<()> {
        <Self as tokio_util::codec::Encoder<&Message>>::encode(self, &msg, dst)
    }
}

impl tokio_util::codec::Encoder<&Message> for MessageCodec {
    type Error = ProtocolError;

    fn encode(&mut self, msg: &Message, dst: &mut BytesMut) -> Result<()> {
        let mut buf = msg.encode()?;
        dst.put_slice(&buf);
        scrub_secret(msg.message_type().as_u8(), &mut buf);
        Ok(())
    }
}

/// Default capacity of each per-request channel of a [`Demux`].
pub const DEFAULT_ROUTE_CAPACITY: usize = 64;

/// A request id is already routed (still in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("request id {0} is already in flight")]
pub struct DuplicateRequestId(pub RequestId);

/// What [`Demux::dispatch`] did with a message.
#[derive(Debug)]
pub enum Dispatch {
    /// Delivered to the request's channel; more messages are expected.
    Delivered,
    /// Delivered, and it was the request's final message: the route is gone.
    Finished,
    /// No route for this id (unsolicited, late, or already finished): the message back.
    Unrouted(Message),
    /// The route existed but its receiver was dropped; the route has been removed.
    ReceiverGone,
}

struct Route {
    tx: mpsc::Sender<Message>,
    request: MessageType,
}

/// Routes incoming messages to per-request channels by [`RequestId`].
///
/// Register a route *before* sending the request, feed every incoming message to
/// [`Demux::dispatch`] from the connection's reader task (or let [`Demux::pump`] do it),
/// and the route disappears after the request's final message ([`Message::is_terminal_for`]).
/// Channels are bounded: a slow consumer applies back-pressure to the reader.
pub struct Demux {
    routes: Mutex<HashMap<RequestId, Route>>,
    capacity: usize,
}

impl Default for Demux {
    fn default() -> Self {
        Self::new(DEFAULT_ROUTE_CAPACITY)
    }
}

impl std::fmt::Debug for Demux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demux")
            .field("in_flight", &self.len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Demux {
    /// Creates a demultiplexer whose per-request channels hold `capacity` messages (min 1).
    pub fn new(capacity: usize) -> Self {
        Demux {
            routes: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    fn routes(&self) -> MutexGuard<'_, HashMap<RequestId, Route>> {
        // A poisoned map is still structurally valid; keep routing.
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a route for `id`, whose request is of type `request` (used to decide which
    /// reply is final). Returns the receiving end.
    pub fn register(
        &self,
        id: RequestId,
        request: MessageType,
    ) -> std::result::Result<mpsc::Receiver<Message>, DuplicateRequestId> {
        let mut routes = self.routes();
        if routes.contains_key(&id) {
            return Err(DuplicateRequestId(id));
        }
        let (tx, rx) = mpsc::channel(self.capacity);
        routes.insert(id, Route { tx, request });
        Ok(rx)
    }

    /// Removes the route for `id` (e.g. when the caller gives up on a request).
    pub fn unregister(&self, id: RequestId) -> bool {
        self.routes().remove(&id).is_some()
    }

    /// Number of requests in flight.
    pub fn len(&self) -> usize {
        self.routes().len()
    }

    /// `true` when no request is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every route: all receivers observe the end of their channel (connection lost).
    pub fn close_all(&self) {
        self.routes().clear();
    }

    /// Routes one incoming message, waiting for channel capacity if needed.
    pub async fn dispatch(&self, msg: Message) -> Dispatch {
        let id = msg.id();
        let (tx, last) = {
            let mut routes = self.routes();
            let Some(route) = routes.get(&id) else {
                return Dispatch::Unrouted(msg);
            };
            let last = msg.is_terminal_for(route.request);
            let tx = route.tx.clone();
            if last {
                routes.remove(&id);
            }
            (tx, last)
        };
        match tx.send(msg).await {
            Ok(()) if last => Dispatch::Finished,
            Ok(()) => Dispatch::Delivered,
            Err(_) => {
                if !last {
                    // Only remove if it is still the same (closed) route.
                    let mut routes = self.routes();
                    if routes.get(&id).is_some_and(|r| r.tx.is_closed()) {
                        routes.remove(&id);
                    }
                }
                Dispatch::ReceiverGone
            }
        }
    }

    /// Reads messages from `reader` and dispatches them until the peer closes (`Ok`) or a
    /// fatal error occurs (`Err`). Unrouted messages go to `on_unrouted`. A non-fatal
    /// decode error whose request id is known is delivered to that request as a
    /// [`Message::Error`] with code `Malformed`; otherwise it is skipped. On return every
    /// route is closed.
    pub async fn pump<R, F>(&self, reader: &mut R, mut on_unrouted: F) -> Result<()>
    where
        R: AsyncRead + Unpin + ?Sized,
        F: FnMut(Message),
    {
        let result = loop {
            let msg = match read_message(reader).await {
                Ok(m) => m,
                Err(ProtocolError::Closed) => break Ok(()),
                Err(e) if !e.is_fatal() => match e.request_id() {
                    Some(id) => Message::error(id, ErrorCode::Malformed, e.to_string()),
                    None => continue,
                },
                Err(e) => break Err(e),
            };
            if let Dispatch::Unrouted(m) = self.dispatch(msg).await {
                on_unrouted(m);
            }
        };
        self.close_all();
        result
    }
}

/// Host-side connection helper: allocates request ids, registers routes on a shared
/// [`Demux`] and serializes frame writes. Run [`Demux::pump`] on the read half in a task.
pub struct Client<W> {
    writer: ::tokio::sync::Mutex<W>,
    demux: Arc<Demux>,
    ids: RequestIdAllocator,
}

impl<W> std::fmt::Debug for Client<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("demux", &self.demux)
            .field("ids", &self.ids)
            .finish()
    }
}

impl<W: AsyncWrite + Unpin> Client<W> {
    /// Wraps the write half of an (already handshaken) connection.
    pub fn new(writer: W, demux: Arc<Demux>) -> Self {
        Client {
            writer: ::tokio::sync::Mutex::new(writer),
            demux,
            ids: RequestIdAllocator::new(),
        }
    }

    /// The demultiplexer shared with the reader task.
    pub fn demux(&self) -> &Arc<Demux> {
        &self.demux
    }

    /// A fresh request id for building a request.
    pub fn next_id(&self) -> RequestId {
        self.ids.next_id()
    }

    /// Registers a route for `msg.id()` and sends `msg`; replies arrive on the returned
    /// receiver, which ends after the final reply (or when the connection is lost).
    pub async fn request(&self, msg: &Message) -> Result<mpsc::Receiver<Message>> {
        let id = msg.id();
        let rx = self.demux.register(id, msg.message_type()).map_err(|e| {
            ProtocolError::Io(std::io::Error::new(std::io::ErrorKind::AlreadyExists, e))
        })?;
        if let Err(e) = self.send(msg).await {
            self.demux.unregister(id);
            return Err(e);
        }
        Ok(rx)
    }

    /// Sends a message without registering a route (stdin, signals, resizes, chunks).
    pub async fn send(&self, msg: &Message) -> Result<()> {
        let mut buf = msg.encode()?;
        let mut w = self.writer.lock().await;
        let written = write_all_flush(&mut *w, &buf).await;
        scrub_secret(msg.message_type().as_u8(), &mut buf);
        written
    }
}
