//! The core of a single-queue request/response device (block, 9p): the driver's queue and
//! guest memory between activation and reset, the negotiated features, the "broken" state,
//! and the loop that answers every available chain.
//!
//! A device keeps a [`RequestQueue`] and implements `RequestDevice`: it answers one
//! validated chain at a time; the loop pops each chain, walks it within the device's bound,
//! adds the used buffer and raises the interrupt once. A malformed ring or chain, an answer
//! that cannot be written, or a used ring that cannot be updated marks the device broken
//! (DEVICE_NEEDS_RESET) and stops processing; nothing here panics on guest input.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};

use super::persist::{check_acked_features, check_broken_reason, QueueSnapshot};
use super::queue::{collect_chain_bounded, pop_chain, Desc};
use super::{announce_broken, checked_queues, ActivateError, Interrupt, INT_VRING};
use crate::exit::VmEvent;
use crate::memory::GuestMem;
use crate::persist::PersistError;

/// The queue side of a single-queue request/response device.
pub struct RequestQueue {
    label: String,
    max_chain_descs: usize,
    irq: Arc<Interrupt>,
    events: Option<Sender<VmEvent>>,
    mem: Option<GuestMem>,
    queue: Option<Queue>,
    acked_features: u64,
    broken: Option<String>,
}

/// What a snapshot holds of a [`RequestQueue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestQueueState {
    /// Features the driver acknowledged (0 unless active).
    pub acked_features: u64,
    /// The device's queue while active (DRIVER_OK and not reset).
    pub queue: Option<QueueSnapshot>,
    /// Why the device is broken, if it is.
    pub broken: Option<String>,
}

impl RequestQueue {
    /// An inactive queue for the device named `label` in logs and broken reports (`block
    /// vda`), accepting chains of at most `max_chain_descs` descriptors, raising `irq`,
    /// reporting a broken queue to `events`.
    pub fn new(
        label: String,
        max_chain_descs: usize,
        irq: Arc<Interrupt>,
        events: Option<Sender<VmEvent>>,
    ) -> Self {
        Self {
            label,
            max_chain_descs,
            irq,
            events,
            mem: None,
            queue: None,
            acked_features: 0,
            broken: None,
        }
    }

    /// Why the device is broken, if it is.
    pub fn broken_reason(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// True once the device was marked broken.
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// True between activation and reset, unless broken.
    pub fn is_active(&self) -> bool {
        self.queue.is_some() && self.broken.is_none()
    }

    /// Takes the driver's queue (DRIVER_OK).
    pub fn activate(
        &mut self,
        mem: GuestMem,
        queues: Vec<Queue>,
        acked_features: u64,
    ) -> Result<(), ActivateError> {
        let [q] = checked_queues::<1>(queues, &mem)?;
        self.mem = Some(mem);
        self.queue = Some(q);
        self.acked_features = acked_features;
        self.broken = None;
        Ok(())
    }

    /// Device reset: forget the queue.
    pub fn reset(&mut self) {
        self.queue = None;
        self.mem = None;
        self.acked_features = 0;
        self.broken = None;
    }

    /// Marks the device broken: processing stops, the driver sees DEVICE_NEEDS_RESET and a
    /// configuration-change interrupt. The VMM keeps running.
    pub fn mark_broken(&mut self, why: String) {
        if self.broken.is_some() {
            return;
        }
        self.broken = Some(announce_broken(
            &self.label,
            why,
            &self.irq,
            self.events.as_ref(),
        ));
    }

    /// Pops and walks the next available chain; `Ok(None)` when there is none (or no queue),
    /// `Err` with the reason to break the device when the ring or chain is malformed.
    fn next_chain(&mut self, mem: &GuestMem) -> Result<Option<(u16, Vec<Desc>)>, String> {
        let Some(q) = self.queue.as_mut() else {
            return Ok(None);
        };
        let max = usize::from(q.size()).min(self.max_chain_descs);
        let chain = match pop_chain(q, mem) {
            Ok(Some(c)) => c,
            Ok(None) => return Ok(None),
            Err(e) => return Err(format!("request queue: {e}")),
        };
        collect_chain_bounded(mem, chain, max)
            .map(Some)
            .map_err(|e| format!("request queue: {e}"))
    }

    /// Returns chain `head` to the driver with `written` bytes; false when it could not be
    /// (no queue, or the used ring is broken: the device then is).
    fn add_used(&mut self, mem: &GuestMem, head: u16, written: u32) -> bool {
        let Some(q) = self.queue.as_mut() else {
            return false;
        };
        match q.add_used(mem, head, written) {
            Ok(()) => true,
            Err(e) => {
                self.mark_broken(format!("used ring: {e}"));
                false
            }
        }
    }

    /// Raises the used-buffer interrupt after `used` buffers were added, unless broken.
    fn signal_used(&self, used: bool) {
        if used && self.broken.is_none() {
            if let Err(e) = self.irq.signal(INT_VRING) {
                log::warn!("{}: cannot raise interrupt: {e}", self.label);
            }
        }
    }

    /// Captures the state a snapshot holds.
    pub fn save(&self) -> RequestQueueState {
        RequestQueueState {
            acked_features: self.acked_features,
            queue: self.queue.as_ref().map(QueueSnapshot::save),
            broken: self.broken.clone(),
        }
    }

    /// Restores `saved` over the restored guest memory `mem`, for `device` (the snapshot's
    /// name for it) offering `offered_features` and a queue of `max_size` entries. Everything
    /// is validated first: on an error nothing changed.
    pub fn restore(
        &mut self,
        device: &'static str,
        saved: RequestQueueState,
        offered_features: u64,
        max_size: u16,
        mem: GuestMem,
    ) -> Result<(), PersistError> {
        check_acked_features(device, saved.acked_features, offered_features)?;
        check_broken_reason(device, saved.broken.as_deref())?;
        let queue = match &saved.queue {
            Some(q) => {
                let q = q.restore(device, max_size, &mem)?;
                if !q.ready() {
                    return Err(PersistError::invalid(device, "active queue not ready"));
                }
                Some(q)
            }
            None if saved.acked_features != 0 => {
                return Err(PersistError::invalid(
                    device,
                    "features acked while inactive",
                ));
            }
            None => None,
        };
        self.mem = queue.as_ref().map(|_| mem);
        self.queue = queue;
        self.acked_features = saved.acked_features;
        self.broken = saved.broken;
        Ok(())
    }
}

/// A device whose requests arrive on a [`RequestQueue`] and are answered one chain at a time,
/// synchronously.
pub(crate) trait RequestDevice {
    /// The device's queue.
    fn requests(&mut self) -> &mut RequestQueue;

    /// Answers one validated chain (`descs`, readable before writable, each inside `mem`):
    /// returns the bytes written into it, or why the device is broken (processing stops).
    fn answer(&mut self, mem: &GuestMem, descs: &[Desc]) -> Result<u32, String>;

    /// Answers every available request; returns true when used buffers were added (the
    /// interrupt is then raised).
    fn process_requests(&mut self) -> bool {
        let rq = self.requests();
        if !rq.is_active() {
            return false;
        }
        let Some(mem) = rq.mem.clone() else {
            return false;
        };
        let mut used = false;
        loop {
            let (head, descs) = match self.requests().next_chain(&mem) {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(why) => {
                    self.requests().mark_broken(why);
                    break;
                }
            };
            let written = match self.answer(&mem, &descs) {
                Ok(n) => n,
                Err(why) => {
                    self.requests().mark_broken(why);
                    break;
                }
            };
            if !self.requests().add_used(&mem, head, written) {
                break;
            }
            used = true;
        }
        self.requests().signal_used(used);
        used
    }
}
