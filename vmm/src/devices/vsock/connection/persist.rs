//! Snapshot state of one vsock connection: state machine, credit counters, buffered bytes in
//! both directions and pending control packets. The host stream is not state: a restored
//! connection is given a new stream, or, without one, is reset (the guest gets an RST).

use std::num::Wrapping;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::super::packet::{MAX_PKT_PAYLOAD, SHUTDOWN_RCV, SHUTDOWN_SEND};
use super::{ConnState, Connection, CLOSE_TIMEOUT, CONN_BUF_ALLOC};
use crate::persist::PersistError;

const NAME: &str = "vsock";
/// Most control bytes ("OK <port>\n") that can precede guest data in the TX buffer.
pub const MAX_CTL_BYTES: usize = 16;

/// Serializable [`ConnState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConnStateSnapshot {
    /// REQUEST pending or sent.
    Connecting,
    /// Data flows.
    Established,
    /// Our SHUTDOWN sent; waiting for the guest's RST.
    Closing,
    /// Finished.
    Closed,
}

impl From<ConnState> for ConnStateSnapshot {
    fn from(s: ConnState) -> Self {
        match s {
            ConnState::Connecting => Self::Connecting,
            ConnState::Established => Self::Established,
            ConnState::Closing => Self::Closing,
            ConnState::Closed => Self::Closed,
        }
    }
}

impl From<ConnStateSnapshot> for ConnState {
    fn from(s: ConnStateSnapshot) -> Self {
        match s {
            ConnStateSnapshot::Connecting => Self::Connecting,
            ConnStateSnapshot::Established => Self::Established,
            ConnStateSnapshot::Closing => Self::Closing,
            ConnStateSnapshot::Closed => Self::Closed,
        }
    }
}

/// Serializable connection state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionState {
    /// Host-side port.
    pub local_port: u32,
    /// Guest-side port.
    pub peer_port: u32,
    /// Guest CID.
    pub guest_cid: u64,
    /// State machine.
    pub state: ConnStateSnapshot,
    /// Guest→host bytes not yet written to the host stream (control bytes first).
    pub tx_buf: Vec<u8>,
    /// Leading control bytes of `tx_buf`.
    pub ctl_bytes: u32,
    /// Bytes of guest data consumed.
    pub fwd_cnt: u32,
    /// `fwd_cnt` last advertised to the guest.
    pub last_fwd_cnt_sent: u32,
    /// Bytes of guest data received.
    pub recv_cnt: u32,
    /// Guest's receive buffer size.
    pub peer_buf_alloc: u32,
    /// Guest's forward counter.
    pub peer_fwd_cnt: u32,
    /// Host→guest bytes sent.
    pub rx_cnt: u32,
    /// Host→guest bytes read from the stream, not yet sent to the guest.
    pub rx_stage: Vec<u8>,
    /// SHUTDOWN flags received from the guest.
    pub peer_shutdown: u32,
    /// The host stream reached EOF.
    pub host_eof: bool,
    /// The host stream's write side was shut down.
    pub stream_write_shut: bool,
    /// REQUEST still to be sent.
    pub send_request: bool,
    /// REQUEST was sent (the guest knows the connection).
    pub request_sent: bool,
    /// CREDIT_UPDATE pending.
    pub send_credit_update: bool,
    /// SHUTDOWN pending.
    pub send_shutdown: bool,
    /// RST pending.
    pub send_rst: bool,
}

impl Connection {
    /// Captures the connection (the muxer must be stopped).
    pub fn save(&self) -> ConnectionState {
        ConnectionState {
            local_port: self.local_port,
            peer_port: self.peer_port,
            guest_cid: self.guest_cid,
            state: self.state.into(),
            tx_buf: self.tx_buf.iter().copied().collect(),
            ctl_bytes: u32::try_from(self.ctl_bytes).unwrap_or(u32::MAX),
            fwd_cnt: self.fwd_cnt.0,
            last_fwd_cnt_sent: self.last_fwd_cnt_sent.0,
            recv_cnt: self.recv_cnt.0,
            peer_buf_alloc: self.peer_buf_alloc,
            peer_fwd_cnt: self.peer_fwd_cnt.0,
            rx_cnt: self.rx_cnt.0,
            rx_stage: self.rx_stage.clone(),
            peer_shutdown: self.peer_shutdown,
            host_eof: self.host_eof,
            stream_write_shut: self.stream_write_shut,
            send_request: self.send_request,
            request_sent: self.request_sent,
            send_credit_update: self.send_credit_update,
            send_shutdown: self.send_shutdown,
            send_rst: self.send_rst,
        }
    }

    /// Checks the bounds of a state from an untrusted snapshot.
    pub fn validate(state: &ConnectionState) -> Result<(), PersistError> {
        let ctl = state.ctl_bytes as usize;
        if ctl > MAX_CTL_BYTES || ctl > state.tx_buf.len() {
            return Err(PersistError::invalid(
                NAME,
                format!(
                    "{ctl} control bytes in a {}-byte TX buffer",
                    state.tx_buf.len()
                ),
            ));
        }
        if state.tx_buf.len() - ctl > CONN_BUF_ALLOC as usize {
            return Err(PersistError::invalid(
                NAME,
                format!(
                    "TX buffer of {} bytes exceeds the credit",
                    state.tx_buf.len()
                ),
            ));
        }
        if state.rx_stage.len() > MAX_PKT_PAYLOAD {
            return Err(PersistError::invalid(
                NAME,
                format!("RX staging buffer of {} bytes", state.rx_stage.len()),
            ));
        }
        if state.peer_shutdown & !(SHUTDOWN_RCV | SHUTDOWN_SEND) != 0 {
            return Err(PersistError::invalid(
                NAME,
                format!("shutdown flags {:#x}", state.peer_shutdown),
            ));
        }
        Ok(())
    }

    /// Rebuilds a connection from `state`. With `stream` (the new host side), data flows on
    /// as before; without one, the connection is reset: the guest gets an RST if it knew
    /// about the connection, and the connection is reaped.
    pub fn restore(
        state: &ConnectionState,
        stream: Option<UnixStream>,
    ) -> Result<Self, PersistError> {
        Self::validate(state)?;
        let (stream, detached) = match stream {
            Some(s) => (s, false),
            None => {
                let (a, _b) = UnixStream::pair()
                    .map_err(|e| PersistError::invalid(NAME, format!("socketpair: {e}")))?;
                (a, true)
            }
        };
        let st: ConnState = state.state.into();
        let mut c = Self {
            local_port: state.local_port,
            peer_port: state.peer_port,
            guest_cid: state.guest_cid,
            state: st,
            stream,
            tx_buf: state.tx_buf.iter().copied().collect(),
            ctl_bytes: state.ctl_bytes as usize,
            fwd_cnt: Wrapping(state.fwd_cnt),
            last_fwd_cnt_sent: Wrapping(state.last_fwd_cnt_sent),
            recv_cnt: Wrapping(state.recv_cnt),
            peer_buf_alloc: state.peer_buf_alloc,
            peer_fwd_cnt: Wrapping(state.peer_fwd_cnt),
            rx_cnt: Wrapping(state.rx_cnt),
            rx_stage: state.rx_stage.clone(),
            peer_shutdown: state.peer_shutdown,
            host_eof: state.host_eof,
            stream_write_shut: state.stream_write_shut,
            send_request: state.send_request,
            request_sent: state.request_sent,
            send_credit_update: state.send_credit_update,
            send_shutdown: state.send_shutdown,
            send_rst: state.send_rst,
            // The guest gets the full close timeout again after a restore.
            deadline: (st == ConnState::Closing).then(|| Instant::now() + CLOSE_TIMEOUT),
        };
        if detached {
            c.reset();
        }
        Ok(c)
    }
}
