//! virtio 1.x: the device trait, interrupt line, descriptor-chain helpers, the single-queue
//! request core and the MMIO transport.

pub mod mmio;
pub mod persist;
pub mod queue;
pub mod request_queue;
#[cfg(test)]
pub mod test_driver;

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::Sender;

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use crate::exit::VmEvent;
use crate::memory::GuestMem;

/// Feature bit: virtio 1.x ("modern") device.
pub const VIRTIO_F_VERSION_1: u32 = 32;

/// Device status bits (virtio 1.x §2.1).
pub mod status {
    /// Guest noticed the device.
    pub const ACKNOWLEDGE: u32 = 1;
    /// Guest has a driver.
    pub const DRIVER: u32 = 2;
    /// Driver is ready.
    pub const DRIVER_OK: u32 = 4;
    /// Feature negotiation complete.
    pub const FEATURES_OK: u32 = 8;
    /// Device hit an error and needs a reset.
    pub const DEVICE_NEEDS_RESET: u32 = 0x40;
    /// Driver gave up on the device.
    pub const FAILED: u32 = 0x80;
}

/// InterruptStatus bit: a used buffer was added.
pub const INT_VRING: u32 = 1;
/// InterruptStatus bit: configuration changed (also used for DEVICE_NEEDS_RESET).
pub const INT_CONFIG: u32 = 2;

/// A device's legacy interrupt line: the InterruptStatus register plus an irqfd.
#[derive(Debug)]
pub struct Interrupt {
    status: AtomicU32,
    evt: EventFd,
}

impl Interrupt {
    /// Wraps the irqfd `evt`.
    pub fn new(evt: EventFd) -> Self {
        Self {
            status: AtomicU32::new(0),
            evt,
        }
    }

    /// Sets `bits` in InterruptStatus and raises the line.
    pub fn signal(&self, bits: u32) -> io::Result<()> {
        self.status.fetch_or(bits, Ordering::SeqCst);
        self.evt.write(1)
    }

    /// Clears `bits` (InterruptACK).
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// Current InterruptStatus.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// Clears all bits (device reset).
    pub fn reset(&self) {
        self.status.store(0, Ordering::SeqCst);
    }

    /// The irqfd.
    pub fn eventfd(&self) -> &EventFd {
        &self.evt
    }
}

/// Why activation failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ActivateError {
    /// A required queue is not ready or its rings lie outside guest memory.
    #[error("queue {0} is not ready or invalid")]
    BadQueue(usize),
    /// Wrong number of queues.
    #[error("expected {expected} queues, got {got}")]
    QueueCount {
        /// Expected.
        expected: usize,
        /// Got.
        got: usize,
    },
}

/// Checks the driver's queues at activation: exactly `N` of them, each ready with its rings
/// inside guest memory.
pub fn checked_queues<const N: usize>(
    queues: Vec<Queue>,
    mem: &GuestMem,
) -> Result<[Queue; N], ActivateError> {
    let queues: [Queue; N] =
        queues
            .try_into()
            .map_err(|v: Vec<Queue>| ActivateError::QueueCount {
                expected: N,
                got: v.len(),
            })?;
    for (i, q) in queues.iter().enumerate() {
        if !q.ready() || !q.is_valid(mem) {
            return Err(ActivateError::BadQueue(i));
        }
    }
    Ok(queues)
}

/// Fills `data` with the config space `cfg` from byte `offset` on (zero beyond its end), for
/// [`VirtioDevice::read_config`].
pub fn read_config_bytes(cfg: &[u8], offset: u64, data: &mut [u8]) {
    for (i, b) in data.iter_mut().enumerate() {
        *b = offset
            .checked_add(i as u64)
            .and_then(|o| usize::try_from(o).ok())
            .and_then(|o| cfg.get(o).copied())
            .unwrap_or(0);
    }
}

/// A virtio device behind a transport.
pub trait VirtioDevice: Send {
    /// Short name for logs.
    fn name(&self) -> &'static str;
    /// virtio device id.
    fn device_type(&self) -> u32;
    /// Maximum size of each queue (the queue count is the slice length).
    fn queue_max_sizes(&self) -> &[u16];
    /// Offered features.
    fn features(&self) -> u64;
    /// Reads device config space.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes device config space.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// Starts the device with the driver's queues (DRIVER_OK).
    fn activate(
        &mut self,
        mem: GuestMem,
        queues: Vec<Queue>,
        acked_features: u64,
    ) -> Result<(), ActivateError>;
    /// The driver notified queue `index`.
    fn queue_notify(&mut self, index: u32);
    /// Resets the device to its initial state (status 0 written).
    fn reset(&mut self);
    /// True once the device was marked broken (DEVICE_NEEDS_RESET).
    fn is_broken(&self) -> bool;
}

/// Longest reason a broken device keeps (and its restored snapshot state may carry).
pub const MAX_BROKEN_REASON_LEN: usize = 1024;

/// What a device does when it breaks: cuts `why` to [`MAX_BROKEN_REASON_LEN`] bytes (on a
/// character boundary), logs it, raises the configuration-change interrupt (the driver then
/// reads DEVICE_NEEDS_RESET) and reports it to the VM loop. Returns the reason to keep.
pub fn announce_broken(
    device: &str,
    mut why: String,
    irq: &Interrupt,
    events: Option<&Sender<VmEvent>>,
) -> String {
    log::error!("{device} device broken: {why}");
    if why.len() > MAX_BROKEN_REASON_LEN {
        let mut cut = MAX_BROKEN_REASON_LEN;
        while !why.is_char_boundary(cut) {
            cut -= 1;
        }
        why.truncate(cut);
    }
    if let Err(e) = irq.signal(INT_CONFIG) {
        log::warn!("{device}: cannot raise interrupt: {e}");
    }
    if let Some(ev) = events {
        let _ = ev.send(VmEvent::DeviceBroken(device.to_string(), why.clone()));
    }
    why
}
