//! One host-initiated vsock stream connection: state machine and credit accounting.
//!
//! Host side ("local") is a connected Unix stream; guest side ("peer") is a listener in the
//! guest. Guest→host bytes are buffered in `tx_buf` (bounded by the credit we advertise,
//! [`CONN_BUF_ALLOC`]); host→guest bytes are read from the stream only while the guest has
//! credit, into a staging buffer that the RX queue drains.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::num::Wrapping;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

pub mod persist;

use super::packet::{
    Op, VsockHeader, HOST_CID, MAX_PKT_PAYLOAD, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};

/// Receive buffer we advertise to the guest per connection (guest→host direction).
pub const CONN_BUF_ALLOC: u32 = 256 * 1024;
/// How long we wait for the guest's RST after sending a full SHUTDOWN.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Connection state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// REQUEST queued/sent to the guest, waiting for RESPONSE.
    Connecting,
    /// Data flows.
    Established,
    /// We sent a full SHUTDOWN (host stream closed); waiting for the guest's RST.
    Closing,
    /// Finished; will be removed once pending control packets are sent.
    Closed,
}

/// One connection.
#[derive(Debug)]
pub struct Connection {
    /// Host-side port (source port of our packets).
    pub local_port: u32,
    /// Guest-side port.
    pub peer_port: u32,
    guest_cid: u64,
    state: ConnState,
    stream: UnixStream,
    // guest → host
    tx_buf: VecDeque<u8>,
    /// Leading bytes of `tx_buf` that are ours (the "OK <port>" line), not guest data.
    ctl_bytes: usize,
    fwd_cnt: Wrapping<u32>,
    last_fwd_cnt_sent: Wrapping<u32>,
    recv_cnt: Wrapping<u32>,
    // host → guest
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    rx_cnt: Wrapping<u32>,
    rx_stage: Vec<u8>,
    peer_shutdown: u32,
    host_eof: bool,
    stream_write_shut: bool,
    // pending control packets
    send_request: bool,
    request_sent: bool,
    send_credit_update: bool,
    send_shutdown: bool,
    send_rst: bool,
    deadline: Option<Instant>,
}

/// Result of feeding a guest packet to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketOutcome {
    /// Handled.
    Ok,
    /// The connection just became established (RESPONSE received).
    Established,
    /// The guest violated the protocol; the connection is being reset.
    Reset,
}

impl Connection {
    /// A new host-initiated connection; a REQUEST to the guest is pending.
    pub fn new_host_initiated(
        local_port: u32,
        peer_port: u32,
        guest_cid: u64,
        stream: UnixStream,
    ) -> Self {
        Self {
            local_port,
            peer_port,
            guest_cid,
            state: ConnState::Connecting,
            stream,
            tx_buf: VecDeque::new(),
            ctl_bytes: 0,
            fwd_cnt: Wrapping(0),
            last_fwd_cnt_sent: Wrapping(0),
            recv_cnt: Wrapping(0),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            rx_cnt: Wrapping(0),
            rx_stage: Vec::new(),
            peer_shutdown: 0,
            host_eof: false,
            stream_write_shut: false,
            send_request: true,
            request_sent: false,
            send_credit_update: false,
            send_shutdown: false,
            send_rst: false,
            deadline: None,
        }
    }

    /// Current state.
    pub fn state(&self) -> ConnState {
        self.state
    }

    /// The host stream.
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Bytes the guest may still send us (our advertised credit minus what is buffered).
    pub fn local_free(&self) -> u32 {
        let guest_bytes = self.tx_buf.len() - self.ctl_bytes;
        CONN_BUF_ALLOC.saturating_sub(u32::try_from(guest_bytes).unwrap_or(u32::MAX))
    }

    /// Bytes we may still send the guest.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Bytes received from the guest, not yet written to the host stream.
    pub fn tx_pending(&self) -> usize {
        self.tx_buf.len()
    }

    /// Our forward counter (bytes consumed from the guest).
    pub fn fwd_cnt(&self) -> u32 {
        self.fwd_cnt.0
    }

    /// Should the muxer poll the stream for reading?
    pub fn wants_read(&self) -> bool {
        self.state == ConnState::Established
            && !self.host_eof
            && self.peer_shutdown & SHUTDOWN_RCV == 0
            && self.rx_stage.is_empty()
            && self.peer_credit() > 0
    }

    /// Should the muxer poll the stream for writing?
    pub fn wants_write(&self) -> bool {
        !self.tx_buf.is_empty() && self.state != ConnState::Closed
    }

    /// Should the muxer watch for the host hanging up while connecting?
    pub fn wants_hangup(&self) -> bool {
        self.state == ConnState::Connecting
    }

    /// Is there a packet for the guest?
    pub fn has_rx_work(&self) -> bool {
        self.send_rst
            || (self.state != ConnState::Closed
                && (self.send_request
                    || self.send_credit_update
                    || self.send_shutdown
                    || (!self.rx_stage.is_empty() && self.peer_credit() > 0)))
    }

    /// Closed and nothing left to tell the guest.
    pub fn is_done(&self) -> bool {
        self.state == ConnState::Closed && !self.send_rst
    }

    fn header(&mut self, op: Op, flags: u32) -> VsockHeader {
        self.last_fwd_cnt_sent = self.fwd_cnt;
        VsockHeader {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.local_port,
            dst_port: self.peer_port,
            len: 0,
            type_: TYPE_STREAM,
            op: op as u16,
            flags,
            buf_alloc: CONN_BUF_ALLOC,
            fwd_cnt: self.fwd_cnt.0,
        }
    }

    /// Resets the connection: an RST goes to the guest (if it knows about us) and the host
    /// stream is closed.
    pub fn reset(&mut self) {
        if self.request_sent && self.state != ConnState::Closed {
            self.send_rst = true;
        }
        self.state = ConnState::Closed;
        self.tx_buf.clear();
        self.ctl_bytes = 0;
        self.rx_stage.clear();
        // Best effort: the peer may already be gone.
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Takes the next packet for the guest, with at most `max_payload` data bytes.
    pub fn next_packet(&mut self, max_payload: usize) -> Option<(VsockHeader, Vec<u8>)> {
        if self.send_rst {
            self.send_rst = false;
            return Some((self.header(Op::Rst, 0), Vec::new()));
        }
        if self.state == ConnState::Closed {
            return None;
        }
        if self.send_request {
            self.send_request = false;
            self.request_sent = true;
            return Some((self.header(Op::Request, 0), Vec::new()));
        }
        if self.state == ConnState::Established && !self.rx_stage.is_empty() {
            let n = self
                .rx_stage
                .len()
                .min(max_payload)
                .min(MAX_PKT_PAYLOAD)
                .min(self.peer_credit() as usize);
            if n > 0 {
                let data: Vec<u8> = self.rx_stage.drain(..n).collect();
                self.rx_cnt += Wrapping(n as u32);
                self.send_credit_update = false;
                return Some((self.header(Op::Rw, 0), data));
            }
        }
        if self.send_credit_update {
            self.send_credit_update = false;
            return Some((self.header(Op::CreditUpdate, 0), Vec::new()));
        }
        if self.send_shutdown && self.rx_stage.is_empty() {
            self.send_shutdown = false;
            self.state = ConnState::Closing;
            self.deadline = Some(Instant::now() + CLOSE_TIMEOUT);
            return Some((
                self.header(Op::Shutdown, SHUTDOWN_RCV | SHUTDOWN_SEND),
                Vec::new(),
            ));
        }
        None
    }

    /// Feeds a packet from the guest addressed to this connection.
    pub fn on_guest_packet(&mut self, hdr: &VsockHeader, payload: &[u8]) -> PacketOutcome {
        self.peer_buf_alloc = hdr.buf_alloc;
        self.peer_fwd_cnt = Wrapping(hdr.fwd_cnt);
        match hdr.op() {
            Some(Op::Response) if self.state == ConnState::Connecting && self.request_sent => {
                self.state = ConnState::Established;
                let line = format!("OK {}\n", self.local_port);
                self.tx_buf.extend(line.as_bytes());
                self.ctl_bytes = line.len();
                self.flush_tx();
                PacketOutcome::Established
            }
            Some(Op::Rw)
                if matches!(self.state, ConnState::Established | ConnState::Closing)
                    && self.peer_shutdown & SHUTDOWN_SEND == 0 =>
            {
                if payload.len() > self.local_free() as usize {
                    log::warn!(
                        "vsock: guest port {} overran its credit ({} > {}); resetting",
                        self.peer_port,
                        payload.len(),
                        self.local_free()
                    );
                    self.reset();
                    return PacketOutcome::Reset;
                }
                self.recv_cnt += Wrapping(payload.len() as u32);
                if self.state == ConnState::Established && !self.stream_write_shut {
                    self.tx_buf.extend(payload);
                    self.flush_tx();
                } else {
                    // Host side is gone: consume and drop, keeping credit flowing.
                    self.fwd_cnt += Wrapping(payload.len() as u32);
                }
                PacketOutcome::Ok
            }
            Some(Op::CreditUpdate) => PacketOutcome::Ok,
            Some(Op::CreditRequest) => {
                self.send_credit_update = true;
                PacketOutcome::Ok
            }
            Some(Op::Shutdown) if self.state != ConnState::Connecting => {
                self.peer_shutdown |= hdr.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
                if self.peer_shutdown & SHUTDOWN_RCV != 0 {
                    self.rx_stage.clear();
                }
                self.after_tx_progress();
                PacketOutcome::Ok
            }
            Some(Op::Rst) => {
                // The guest refused or tore down the connection; no reply.
                self.state = ConnState::Closed;
                self.send_rst = false;
                let _ = self.stream.shutdown(Shutdown::Both);
                PacketOutcome::Ok
            }
            _ => {
                log::debug!(
                    "vsock: unexpected op {} in state {:?}; resetting",
                    hdr.op,
                    self.state
                );
                self.reset();
                PacketOutcome::Reset
            }
        }
    }

    /// Writes buffered guest data to the host stream (non-blocking).
    pub fn flush_tx(&mut self) {
        while !self.tx_buf.is_empty() {
            let (a, _) = self.tx_buf.as_slices();
            match self.stream.write(a) {
                Ok(0) => {
                    self.reset();
                    return;
                }
                Ok(n) => {
                    self.tx_buf.drain(..n);
                    // The "OK <port>" line is ours, not guest data; it is not credited.
                    let ours = n.min(self.ctl_bytes);
                    self.ctl_bytes -= ours;
                    self.fwd_cnt += Wrapping((n - ours) as u32);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.reset();
                    return;
                }
            }
        }
        self.after_tx_progress();
    }

    fn after_tx_progress(&mut self) {
        if self.state == ConnState::Closed {
            return;
        }
        // Tell the guest about freed space once its view of our credit gets low.
        let unacked = (self.recv_cnt - self.last_fwd_cnt_sent).0;
        let guest_view_free = CONN_BUF_ALLOC.saturating_sub(unacked);
        if guest_view_free < CONN_BUF_ALLOC / 2 && self.fwd_cnt != self.last_fwd_cnt_sent {
            self.send_credit_update = true;
        }
        if self.tx_buf.is_empty() && self.peer_shutdown & SHUTDOWN_SEND != 0 {
            if !self.stream_write_shut {
                self.stream_write_shut = true;
                let _ = self.stream.shutdown(Shutdown::Write);
            }
            if self.peer_shutdown & SHUTDOWN_RCV != 0 || self.host_eof {
                // Both directions finished: acknowledge with RST and drop.
                self.send_rst = true;
                self.state = ConnState::Closed;
                let _ = self.stream.shutdown(Shutdown::Both);
            }
        }
    }

    /// Reads from the host stream into the staging buffer, within the guest's credit.
    pub fn fill_rx_stage(&mut self) {
        if !self.wants_read() {
            return;
        }
        let want = (self.peer_credit() as usize).min(MAX_PKT_PAYLOAD);
        let mut buf = vec![0u8; want];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    self.host_eof = true;
                    self.send_shutdown = true;
                    return;
                }
                Ok(n) => {
                    buf.truncate(n);
                    self.rx_stage = buf;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.reset();
                    return;
                }
            }
        }
    }

    /// Host bytes that arrived together with the CONNECT line; sent once established.
    pub fn preload_rx(&mut self, data: Vec<u8>) {
        self.rx_stage = data;
    }

    /// The host hung up while we were still connecting.
    pub fn host_hung_up(&mut self) {
        if self.state == ConnState::Connecting {
            self.reset();
        }
    }

    /// Handles timeouts (guest never answered our SHUTDOWN).
    pub fn tick(&mut self, now: Instant) {
        if self.state == ConnState::Closing && self.deadline.is_some_and(|d| now >= d) {
            self.reset();
        }
    }
}

#[cfg(test)]
mod tests;
