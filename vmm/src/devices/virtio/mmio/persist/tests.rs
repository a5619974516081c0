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
