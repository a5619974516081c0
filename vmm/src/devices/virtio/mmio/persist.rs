//! Snapshot state of the virtio-mmio transport: selector and feature registers, device
//! status, per-queue configuration and InterruptStatus.
//!
//! The transport's queues are the driver's configuration; a device that was activated
//! processes its own copies (with their own ring indices) and saves them in its own
//! `persist` state. [`MmioTransport::restore`] therefore never calls
//! [`VirtioDevice::activate`]: restore the device from its own state first, then the
//! transport around it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::super::persist::QueueSnapshot;
use super::super::{status, Interrupt, VirtioDevice};
use super::MmioTransport;
use crate::memory::GuestMem;
use crate::persist::PersistError;

/// Serializable transport state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmioTransportState {
    /// virtio device id of the device behind the transport (checked on restore).
    pub device_type: u32,
    /// DeviceFeaturesSel.
    pub device_features_sel: u32,
    /// DriverFeaturesSel.
    pub driver_features_sel: u32,
    /// Features the driver acknowledged.
    pub acked_features: u64,
    /// QueueSel.
    pub queue_sel: u32,
    /// Per-queue configuration, in queue order.
    pub queues: Vec<QueueSnapshot>,
    /// Device status (without the device's own DEVICE_NEEDS_RESET).
    pub status: u32,
    /// ConfigGeneration.
    pub config_generation: u32,
    /// DRIVER_OK was accepted and the device activated.
    pub activated: bool,
    /// InterruptStatus.
    pub interrupt_status: u32,
    /// Ignored accesses (diagnostics).
    pub bad_accesses: u64,
}

/// Status values the transport's state machine can reach (before the FAILED and
/// DEVICE_NEEDS_RESET bits).
fn status_reachable(s: u32) -> bool {
    use status::*;
    let base = s & !(FAILED | DEVICE_NEEDS_RESET);
    [
        0,
        ACKNOWLEDGE,
        ACKNOWLEDGE | DRIVER,
        ACKNOWLEDGE | DRIVER | FEATURES_OK,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    ]
    .contains(&base)
}

impl MmioTransport {
    /// Captures the transport state (the vCPUs must be paused).
    pub fn save(&self) -> MmioTransportState {
        MmioTransportState {
            device_type: self.device.device_type(),
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            acked_features: self.acked_features,
            queue_sel: self.queue_sel,
            queues: self.queues.iter().map(QueueSnapshot::save).collect(),
            status: self.status,
            config_generation: self.config_generation,
            activated: self.activated,
            interrupt_status: self.interrupt.status(),
            bad_accesses: self.bad_accesses,
        }
    }

    /// A transport around `device` (already restored from its own state) in `state`.
    /// Everything is validated before the transport is built; a pending interrupt is
    /// re-raised on `interrupt`.
    pub fn restore(
        device: Box<dyn VirtioDevice>,
        mem: GuestMem,
        interrupt: Arc<Interrupt>,
        state: &MmioTransportState,
    ) -> Result<Self, PersistError> {
        let name = device.name();
        if state.device_type != device.device_type() {
            return Err(PersistError::mismatch(
                name,
                format!(
                    "device type {} in snapshot, device is {}",
                    state.device_type,
                    device.device_type()
                ),
            ));
        }
        let max_sizes = device.queue_max_sizes();
        if state.queues.len() != max_sizes.len() {
            return Err(PersistError::mismatch(
                name,
                format!(
                    "{} queues in snapshot, device has {}",
                    state.queues.len(),
                    max_sizes.len()
                ),
            ));
        }
        if state.acked_features & !device.features() != 0 {
            return Err(PersistError::mismatch(
                name,
                format!(
                    "acked features {:#x} not offered ({:#x})",
                    state.acked_features,
                    device.features()
                ),
            ));
        }
        if !status_reachable(state.status) {
            return Err(PersistError::invalid(
                name,
                format!("status {:#x}", state.status),
            ));
        }
        if state.activated && state.status & status::DRIVER_OK == 0 {
            return Err(PersistError::invalid(name, "activated without DRIVER_OK"));
        }
        let queues = state
            .queues
            .iter()
            .zip(max_sizes)
            .map(|(q, &max)| q.restore(name, max, &mem))
            .collect::<Result<Vec<_>, _>>()?;
        interrupt
            .status
            .store(state.interrupt_status, Ordering::SeqCst);
        if state.interrupt_status != 0 {
            interrupt
                .eventfd()
                .write(1)
                .map_err(|e| PersistError::invalid(name, format!("cannot raise interrupt: {e}")))?;
        }
        Ok(Self {
            device,
            mem,
            interrupt,
            device_features_sel: state.device_features_sel,
            driver_features_sel: state.driver_features_sel,
            acked_features: state.acked_features,
            queue_sel: state.queue_sel,
            queues,
            status: state.status,
            config_generation: state.config_generation,
            activated: state.activated,
            bad_accesses: state.bad_accesses,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use virtio_queue::Queue;
    use vmm_sys_util::eventfd::EventFd;

    use super::super::reg;
    use super::*;
    use crate::bus::BusDevice;
    use crate::devices::virtio::{ActivateError, INT_VRING, VIRTIO_F_VERSION_1};
    use crate::memory::create_guest_memory;

    #[derive(Default)]
    struct Seen {
        activations: u32,
        notified: Vec<u32>,
    }

    struct Dummy(Arc<Mutex<Seen>>);

    impl VirtioDevice for Dummy {
        fn name(&self) -> &'static str {
            "dummy"
        }
        fn device_type(&self) -> u32 {
            19
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[256, 64]
        }
        fn features(&self) -> u64 {
            (1 << VIRTIO_F_VERSION_1) | 0b10
        }
        fn read_config(&self, _offset: u64, data: &mut [u8]) {
            data.fill(0xab);
        }
        fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
        fn activate(
            &mut self,
            _mem: GuestMem,
            _queues: Vec<Queue>,
            _acked: u64,
        ) -> Result<(), ActivateError> {
            self.0.lock().unwrap().activations += 1;
            Ok(())
        }
        fn queue_notify(&mut self, index: u32) {
            self.0.lock().unwrap().notified.push(index);
        }
        fn reset(&mut self) {}
        fn is_broken(&self) -> bool {
            false
        }
    }

    fn irq() -> Arc<Interrupt> {
        Arc::new(Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()))
    }

    fn r(t: &mut MmioTransport, off: u64) -> u32 {
        let mut d = [0u8; 4];
        t.read(off, &mut d);
        u32::from_le_bytes(d)
    }

    fn w(t: &mut MmioTransport, off: u64, v: u32) {
        t.write(off, &v.to_le_bytes());
    }

    /// A transport driven to DRIVER_OK with both queues configured.
    fn running() -> (MmioTransport, Arc<Mutex<Seen>>, Arc<Interrupt>) {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mem = create_guest_memory(1 << 20).unwrap();
        let irq = irq();
        let mut t = MmioTransport::new(Box::new(Dummy(seen.clone())), mem, irq.clone());
        use status::*;
        w(&mut t, reg::STATUS, ACKNOWLEDGE);
        w(&mut t, reg::STATUS, ACKNOWLEDGE | DRIVER);
        w(&mut t, reg::DRIVER_FEATURES_SEL, 0);
        w(&mut t, reg::DRIVER_FEATURES, 0b10);
        w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
        w(&mut t, reg::DRIVER_FEATURES, 1);
        w(&mut t, reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        for (i, base) in [(0u32, 0x1_0000u64), (1, 0x2_0000)] {
            w(&mut t, reg::QUEUE_SEL, i);
            w(&mut t, reg::QUEUE_NUM, 16);
            w(&mut t, reg::QUEUE_DESC_LOW, base as u32);
            w(&mut t, reg::QUEUE_DRIVER_LOW, (base + 0x1000) as u32);
            w(&mut t, reg::QUEUE_DEVICE_LOW, (base + 0x2000) as u32);
            w(&mut t, reg::QUEUE_READY, 1);
        }
        w(
            &mut t,
            reg::STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        w(&mut t, reg::DEVICE_FEATURES_SEL, 1);
        w(&mut t, reg::QUEUE_SEL, 1);
        assert!(t.is_activated());
        irq.signal(INT_VRING).unwrap();
        (t, seen, irq)
    }

    const REGS: [u64; 16] = [
        reg::DEVICE_ID,
        reg::DEVICE_FEATURES,
        reg::QUEUE_NUM_MAX,
        reg::QUEUE_NUM,
        reg::QUEUE_READY,
        reg::QUEUE_DESC_LOW,
        reg::QUEUE_DESC_HIGH,
        reg::QUEUE_DRIVER_LOW,
        reg::QUEUE_DRIVER_HIGH,
        reg::QUEUE_DEVICE_LOW,
        reg::QUEUE_DEVICE_HIGH,
        reg::INTERRUPT_STATUS,
        reg::STATUS,
        reg::CONFIG_GENERATION,
        reg::SHM_LEN_LOW,
        reg::CONFIG,
    ];

    fn snapshot_regs(t: &mut MmioTransport) -> Vec<u32> {
        let mut v = Vec::new();
        for q in 0..2 {
            w(t, reg::QUEUE_SEL, q);
            v.extend(REGS.iter().map(|&o| r(t, o)));
        }
        v
    }

    #[test]
    fn round_trip_restores_registers_without_reactivating() {
        let (mut t, _seen, _irq) = running();
        let state = t.save();
        let json = serde_json::to_vec(&state).unwrap();
        let state: MmioTransportState = serde_json::from_slice(&json).unwrap();

        let seen2 = Arc::new(Mutex::new(Seen::default()));
        let irq2 = irq();
        let mut t2 = MmioTransport::restore(
            Box::new(Dummy(seen2.clone())),
            create_guest_memory(1 << 20).unwrap(),
            irq2.clone(),
            &state,
        )
        .unwrap();
        // The pending interrupt is raised again on the new line.
        assert_eq!(irq2.eventfd().read().unwrap(), 1);
        assert_eq!(t2.save(), state);
        // Selectors survive: the first reads (before re-selecting) agree.
        assert_eq!(
            r(&mut t, reg::DEVICE_FEATURES),
            r(&mut t2, reg::DEVICE_FEATURES)
        );
        assert_eq!(r(&mut t, reg::QUEUE_NUM), r(&mut t2, reg::QUEUE_NUM));
        assert_eq!(snapshot_regs(&mut t), snapshot_regs(&mut t2));
        assert!(t2.is_activated());
        assert_eq!(seen2.lock().unwrap().activations, 0);
        // Live: notifications reach the device; a late queue write is refused as before.
        w(&mut t2, reg::QUEUE_NOTIFY, 1);
        assert_eq!(seen2.lock().unwrap().notified, vec![1]);
        let bad = t2.bad_accesses();
        w(&mut t2, reg::QUEUE_NUM, 8);
        assert_eq!(t2.bad_accesses(), bad + 1);
        // Reset still works after restore.
        w(&mut t2, reg::STATUS, 0);
        assert_eq!(r(&mut t2, reg::STATUS), 0);
        assert!(!t2.is_activated());
    }

    #[test]
    fn fresh_transport_round_trips() {
        let mem = create_guest_memory(1 << 20).unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let t = MmioTransport::new(Box::new(Dummy(seen.clone())), mem.clone(), irq());
        let s = t.save();
        let t2 = MmioTransport::restore(Box::new(Dummy(seen)), mem, irq(), &s).unwrap();
        assert_eq!(t2.save(), s);
    }

    #[test]
    fn mismatched_or_invalid_state_is_refused() {
        let (t, seen, _) = running();
        let good = t.save();
        let mem = create_guest_memory(1 << 20).unwrap();
        let try_restore = |s: &MmioTransportState| {
            MmioTransport::restore(Box::new(Dummy(seen.clone())), mem.clone(), irq(), s)
        };
        assert!(try_restore(&good).is_ok());
        let mut s = good.clone();
        s.device_type = 2;
        assert!(matches!(
            try_restore(&s),
            Err(PersistError::Mismatch { .. })
        ));
        let mut s = good.clone();
        s.queues.pop();
        assert!(matches!(
            try_restore(&s),
            Err(PersistError::Mismatch { .. })
        ));
        let mut s = good.clone();
        s.acked_features |= 1 << 40;
        assert!(matches!(
            try_restore(&s),
            Err(PersistError::Mismatch { .. })
        ));
        let mut s = good.clone();
        s.status = status::DRIVER_OK;
        assert!(matches!(try_restore(&s), Err(PersistError::Invalid { .. })));
        let mut s = good.clone();
        s.status = status::ACKNOWLEDGE;
        assert!(matches!(try_restore(&s), Err(PersistError::Invalid { .. })));
        let mut s = good.clone();
        s.queues[0].desc_table = 1 << 30;
        assert!(matches!(try_restore(&s), Err(PersistError::Invalid { .. })));
        let mut s = good;
        s.queues[1].size = 100;
        assert!(matches!(try_restore(&s), Err(PersistError::Invalid { .. })));
    }
}
