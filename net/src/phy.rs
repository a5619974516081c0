//! The smoltcp device between the NAT and the guest: one guest frame at a time in, a queue of
//! frames out bounded in frames and in bytes.

use std::collections::VecDeque;

use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::time::Instant;

use crate::MTU;

/// Ethernet header length.
const ETH_HEADER: usize = 14;

/// The frames queued toward the guest, bounded in number and bytes.
pub(crate) struct OutQueue {
    frames: VecDeque<Vec<u8>>,
    bytes: usize,
    cap: usize,
    cap_bytes: usize,
}

impl OutQueue {
    /// Full: `cap` frames, or at least `cap_bytes` bytes (so it never holds more than
    /// `cap_bytes - 1` plus one frame).
    fn is_full(&self) -> bool {
        self.frames.len() >= self.cap || self.bytes >= self.cap_bytes
    }

    /// Queues `frame`; false (frame not queued) when full.
    fn push(&mut self, frame: Vec<u8>) -> bool {
        if self.is_full() {
            return false;
        }
        self.bytes += frame.len();
        self.frames.push_back(frame);
        true
    }

    fn pop(&mut self) -> Option<Vec<u8>> {
        let frame = self.frames.pop_front()?;
        self.bytes -= frame.len();
        Some(frame)
    }
}

/// Frames in (one at a time) and out (bounded queue) of smoltcp.
pub(crate) struct Phy {
    rx: Vec<u8>,
    rx_ready: bool,
    tx: OutQueue,
    /// smoltcp wanted to send while the queue was full (cleared by every `Nat::poll`).
    pub(crate) tx_blocked: bool,
    /// Frames smoltcp built as immediate replies while the queue was full.
    pub(crate) tx_dropped: u64,
}

impl Phy {
    /// A device queueing at most `tx_cap` frames and (about) `tx_cap_bytes` bytes for the guest.
    pub(crate) fn new(tx_cap: usize, tx_cap_bytes: usize) -> Phy {
        Phy {
            rx: Vec::new(),
            rx_ready: false,
            tx: OutQueue {
                frames: VecDeque::new(),
                bytes: 0,
                cap: tx_cap,
                cap_bytes: tx_cap_bytes,
            },
            tx_blocked: false,
            tx_dropped: 0,
        }
    }

    /// Offers one guest frame to the next ingress poll.
    pub(crate) fn set_rx(&mut self, frame: &[u8]) {
        self.rx.clear();
        self.rx.extend_from_slice(frame);
        self.rx_ready = true;
    }

    /// Forgets a frame smoltcp did not take.
    pub(crate) fn clear_rx(&mut self) {
        self.rx_ready = false;
    }

    /// Queues a frame for the guest; false (frame dropped) when the queue is full.
    pub(crate) fn push(&mut self, frame: Vec<u8>) -> bool {
        self.tx.push(frame)
    }

    /// The oldest frame for the guest.
    pub(crate) fn pop(&mut self) -> Option<Vec<u8>> {
        self.tx.pop()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.tx.is_full()
    }

    /// Frames queued for the guest.
    pub(crate) fn len(&self) -> usize {
        self.tx.frames.len()
    }

    /// Bytes queued for the guest.
    pub(crate) fn bytes(&self) -> usize {
        self.tx.bytes
    }
}

/// A guest frame for smoltcp.
pub(crate) struct Rx<'a>(&'a [u8]);

impl RxToken for Rx<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        f(self.0)
    }
}

/// Room for one frame toward the guest.
pub(crate) struct Tx<'a> {
    queue: &'a mut OutQueue,
    dropped: &'a mut u64,
}

impl TxToken for Tx<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let mut frame = vec![0; len];
        let r = f(&mut frame);
        // A reply token handed out with a received frame may find the queue full.
        if !self.queue.push(frame) {
            *self.dropped += 1;
        }
        r
    }
}

impl Device for Phy {
    type RxToken<'a> = Rx<'a>;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _timestamp: Instant) -> Option<(Rx<'_>, Tx<'_>)> {
        if !self.rx_ready {
            return None;
        }
        self.rx_ready = false;
        let Phy {
            rx, tx, tx_dropped, ..
        } = self;
        Some((
            Rx(rx.as_slice()),
            Tx {
                queue: tx,
                dropped: tx_dropped,
            },
        ))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<Tx<'_>> {
        if self.is_full() {
            self.tx_blocked = true;
            return None;
        }
        Some(Tx {
            queue: &mut self.tx,
            dropped: &mut self.tx_dropped,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        // For Ethernet, smoltcp's MTU includes the 14-byte header.
        caps.max_transmission_unit = MTU + ETH_HEADER;
        caps
    }
}
