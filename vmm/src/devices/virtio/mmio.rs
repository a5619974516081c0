//! virtio-mmio transport, version 2 ("modern"), virtio 1.x §4.2.2.
//!
//! Register accesses below 0x100 must be 32 bits wide; anything else is ignored (reads give 0).
//! Feature registers are writable only between DRIVER and FEATURES_OK, queue registers only
//! between FEATURES_OK and DRIVER_OK; invalid status transitions are ignored.

use std::sync::Arc;

use virtio_queue::{Queue, QueueT};

use super::{status, Interrupt, VirtioDevice, INT_CONFIG, VIRTIO_F_VERSION_1};
use crate::bus::BusDevice;
use crate::memory::GuestMem;

pub mod persist;

/// "virt".
pub const MMIO_MAGIC_VALUE: u32 = 0x7472_6976;
/// Transport version 2 (non-legacy).
pub const MMIO_VERSION: u32 = 2;
/// VendorID we report.
pub const VENDOR_ID: u32 = 0;

/// Register offsets.
pub mod reg {
    #![allow(missing_docs)]
    pub const MAGIC_VALUE: u64 = 0x000;
    pub const VERSION: u64 = 0x004;
    pub const DEVICE_ID: u64 = 0x008;
    pub const VENDOR_ID: u64 = 0x00c;
    pub const DEVICE_FEATURES: u64 = 0x010;
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    pub const DRIVER_FEATURES: u64 = 0x020;
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    pub const QUEUE_SEL: u64 = 0x030;
    pub const QUEUE_NUM_MAX: u64 = 0x034;
    pub const QUEUE_NUM: u64 = 0x038;
    pub const QUEUE_READY: u64 = 0x044;
    pub const QUEUE_NOTIFY: u64 = 0x050;
    pub const INTERRUPT_STATUS: u64 = 0x060;
    pub const INTERRUPT_ACK: u64 = 0x064;
    pub const STATUS: u64 = 0x070;
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    pub const QUEUE_DRIVER_LOW: u64 = 0x090;
    pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
    pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
    pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
    pub const SHM_LEN_LOW: u64 = 0x0b0;
    pub const SHM_LEN_HIGH: u64 = 0x0b4;
    pub const CONFIG_GENERATION: u64 = 0x0fc;
    pub const CONFIG: u64 = 0x100;
}

/// One virtio device behind an MMIO register window.
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: GuestMem,
    interrupt: Arc<Interrupt>,
    device_features_sel: u32,
    driver_features_sel: u32,
    acked_features: u64,
    queue_sel: u32,
    queues: Vec<Queue>,
    status: u32,
    config_generation: u32,
    activated: bool,
    bad_accesses: u64,
}

impl MmioTransport {
    /// Wraps `device`; `interrupt` must be the same line the device signals.
    pub fn new(device: Box<dyn VirtioDevice>, mem: GuestMem, interrupt: Arc<Interrupt>) -> Self {
        let queues = Self::fresh_queues(device.as_ref());
        Self {
            device,
            mem,
            interrupt,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            queue_sel: 0,
            queues,
            status: 0,
            config_generation: 0,
            activated: false,
            bad_accesses: 0,
        }
    }

    fn fresh_queues(device: &dyn VirtioDevice) -> Vec<Queue> {
        device
            .queue_max_sizes()
            .iter()
            // A max size that virtio-queue rejects would be a VMM bug; fall back to 256.
            .map(|&max| {
                Queue::new(max).unwrap_or_else(|_| {
                    Queue::new(256).unwrap_or_else(|_| unreachable!("256 is a valid queue size"))
                })
            })
            .collect()
    }

    /// Current device status as the driver sees it.
    pub fn status(&self) -> u32 {
        if self.device.is_broken() {
            self.status | status::DEVICE_NEEDS_RESET
        } else {
            self.status
        }
    }

    /// Features the driver acknowledged.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// True after a successful DRIVER_OK.
    pub fn is_activated(&self) -> bool {
        self.activated
    }

    /// Number of ignored (invalid) register accesses so far.
    pub fn bad_accesses(&self) -> u64 {
        self.bad_accesses
    }

    fn selected_queue(&self) -> Option<&Queue> {
        self.queues.get(self.queue_sel as usize)
    }

    fn queue_config_allowed(&self) -> bool {
        self.status & (status::FEATURES_OK | status::DRIVER_OK | status::FAILED)
            == status::FEATURES_OK
    }

    fn update_queue(&mut self, f: impl FnOnce(&mut Queue)) {
        if !self.queue_config_allowed() {
            self.bad("queue register written outside FEATURES_OK..DRIVER_OK");
            return;
        }
        match self.queues.get_mut(self.queue_sel as usize) {
            // Spec: the driver must not change a live queue; only ready=0 is meaningful.
            Some(q) => f(q),
            None => self.bad("queue register written with an invalid QueueSel"),
        }
    }

    fn bad(&mut self, what: &str) {
        self.bad_accesses += 1;
        log::debug!("virtio-mmio({}): ignored: {what}", self.device.name());
    }

    fn reset(&mut self) {
        self.device.reset();
        self.queues = Self::fresh_queues(self.device.as_ref());
        self.acked_features = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        self.status = 0;
        self.activated = false;
        self.interrupt.reset();
    }

    fn set_status(&mut self, v: u32) {
        use status::*;
        if v == 0 {
            self.reset();
            return;
        }
        let cur = self.status;
        if v & FAILED != 0 {
            self.status |= FAILED;
            return;
        }
        match (cur, v) {
            (0, ACKNOWLEDGE) => self.status = v,
            (ACKNOWLEDGE, x) if x == ACKNOWLEDGE | DRIVER => self.status = v,
            (x, y) if x == ACKNOWLEDGE | DRIVER && y == x | FEATURES_OK => {
                if self.acked_features & (1u64 << VIRTIO_F_VERSION_1) == 0 {
                    // Refuse: the driver re-reads Status, sees no FEATURES_OK, and gives up.
                    self.bad("FEATURES_OK without VIRTIO_F_VERSION_1");
                } else {
                    self.status = v;
                }
            }
            (x, y) if x == ACKNOWLEDGE | DRIVER | FEATURES_OK && y == x | DRIVER_OK => {
                self.status = v;
                self.activate();
            }
            _ => self.bad("invalid status transition"),
        }
    }

    fn activate(&mut self) {
        // A ready queue must have its rings inside guest memory.
        for (i, q) in self.queues.iter().enumerate() {
            if q.ready() && !q.is_valid(&self.mem) {
                log::warn!(
                    "virtio-mmio({}): queue {i} invalid at DRIVER_OK",
                    self.device.name()
                );
                self.fail_activation();
                return;
            }
        }
        let mut queues = Vec::with_capacity(self.queues.len());
        for (i, q) in self.queues.iter().enumerate() {
            match Queue::try_from(q.state()) {
                Ok(q) => queues.push(q),
                Err(e) => {
                    log::warn!("virtio-mmio({}): queue {i}: {e}", self.device.name());
                    self.fail_activation();
                    return;
                }
            }
        }
        match self
            .device
            .activate(self.mem.clone(), queues, self.acked_features)
        {
            Ok(()) => self.activated = true,
            Err(e) => {
                log::warn!(
                    "virtio-mmio({}): activation failed: {e}",
                    self.device.name()
                );
                self.fail_activation();
            }
        }
    }

    fn fail_activation(&mut self) {
        self.status |= status::DEVICE_NEEDS_RESET;
        if let Err(e) = self.interrupt.signal(INT_CONFIG) {
            log::warn!(
                "virtio-mmio({}): cannot raise interrupt: {e}",
                self.device.name()
            );
        }
    }

    fn read_reg(&mut self, offset: u64) -> u32 {
        let q = self.selected_queue();
        let lo = |v: u64| v as u32;
        let hi = |v: u64| (v >> 32) as u32;
        match offset {
            reg::MAGIC_VALUE => MMIO_MAGIC_VALUE,
            reg::VERSION => MMIO_VERSION,
            reg::DEVICE_ID => self.device.device_type(),
            reg::VENDOR_ID => VENDOR_ID,
            reg::DEVICE_FEATURES => match self.device_features_sel {
                0 => lo(self.device.features()),
                1 => hi(self.device.features()),
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => q.map_or(0, |q| u32::from(q.max_size())),
            reg::QUEUE_NUM => q.map_or(0, |q| u32::from(q.size())),
            reg::QUEUE_READY => q.map_or(0, |q| u32::from(q.ready())),
            reg::QUEUE_DESC_LOW => q.map_or(0, |q| lo(q.desc_table())),
            reg::QUEUE_DESC_HIGH => q.map_or(0, |q| hi(q.desc_table())),
            reg::QUEUE_DRIVER_LOW => q.map_or(0, |q| lo(q.avail_ring())),
            reg::QUEUE_DRIVER_HIGH => q.map_or(0, |q| hi(q.avail_ring())),
            reg::QUEUE_DEVICE_LOW => q.map_or(0, |q| lo(q.used_ring())),
            reg::QUEUE_DEVICE_HIGH => q.map_or(0, |q| hi(q.used_ring())),
            reg::INTERRUPT_STATUS => self.interrupt.status(),
            reg::STATUS => self.status(),
            // No shared memory regions: length -1 means "absent".
            reg::SHM_LEN_LOW | reg::SHM_LEN_HIGH => u32::MAX,
            reg::CONFIG_GENERATION => self.config_generation,
            _ => {
                self.bad("read of an unknown or write-only register");
                0
            }
        }
    }

    fn write_reg(&mut self, offset: u64, v: u32) {
        match offset {
            reg::DEVICE_FEATURES_SEL => self.device_features_sel = v,
            reg::DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            reg::DRIVER_FEATURES => {
                let allowed = self.status & (status::DRIVER | status::FEATURES_OK | status::FAILED)
                    == status::DRIVER;
                if !allowed {
                    self.bad("DriverFeatures written outside DRIVER..FEATURES_OK");
                    return;
                }
                let shift = match self.driver_features_sel {
                    0 => 0,
                    1 => 32,
                    _ => {
                        self.bad("DriverFeaturesSel out of range");
                        return;
                    }
                };
                let offered = self.device.features();
                let mask = 0xffff_ffffu64 << shift;
                let mut val = u64::from(v) << shift;
                if val & !offered != 0 {
                    self.bad("driver acked features the device did not offer");
                    val &= offered;
                }
                self.acked_features = (self.acked_features & !mask) | val;
            }
            reg::QUEUE_SEL => self.queue_sel = v,
            reg::QUEUE_NUM => {
                let mut bad = false;
                self.update_queue(|q| match u16::try_from(v) {
                    Ok(n) => bad = q.try_set_size(n).is_err(),
                    Err(_) => bad = true,
                });
                if bad {
                    self.bad("QueueNum not a power of two within QueueNumMax");
                }
            }
            reg::QUEUE_READY => self.update_queue(|q| q.set_ready(v == 1)),
            reg::QUEUE_DESC_LOW => self.update_queue(|q| q.set_desc_table_address(Some(v), None)),
            reg::QUEUE_DESC_HIGH => self.update_queue(|q| q.set_desc_table_address(None, Some(v))),
            reg::QUEUE_DRIVER_LOW => self.update_queue(|q| q.set_avail_ring_address(Some(v), None)),
            reg::QUEUE_DRIVER_HIGH => {
                self.update_queue(|q| q.set_avail_ring_address(None, Some(v)))
            }
            reg::QUEUE_DEVICE_LOW => self.update_queue(|q| q.set_used_ring_address(Some(v), None)),
            reg::QUEUE_DEVICE_HIGH => self.update_queue(|q| q.set_used_ring_address(None, Some(v))),
            reg::QUEUE_NOTIFY => {
                if self.activated && (v as usize) < self.queues.len() {
                    self.device.queue_notify(v);
                } else {
                    self.bad("QueueNotify before DRIVER_OK or for an unknown queue");
                }
            }
            reg::INTERRUPT_ACK => self.interrupt.ack(v),
            reg::STATUS => self.set_status(v),
            _ => self.bad("write to an unknown or read-only register"),
        }
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= reg::CONFIG {
            self.device.read_config(offset - reg::CONFIG, data);
            return;
        }
        if data.len() != 4 || offset & 3 != 0 {
            self.bad("register read not 32-bit aligned");
            return;
        }
        let v = self.read_reg(offset);
        data.copy_from_slice(&v.to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= reg::CONFIG {
            self.device.write_config(offset - reg::CONFIG, data);
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            self.bad("register write not 32-bit wide");
            return;
        };
        if offset & 3 != 0 {
            self.bad("register write not aligned");
            return;
        }
        self.write_reg(offset, u32::from_le_bytes(bytes));
    }
}

#[cfg(test)]
mod tests;
