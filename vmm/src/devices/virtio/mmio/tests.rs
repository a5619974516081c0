//! Register state machine tests for the virtio-mmio transport (no VM needed).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::*;
use crate::devices::virtio::{ActivateError, VirtioDevice};
use crate::memory::{create_guest_memory, GuestMem};

#[derive(Default)]
struct Seen {
    activated: Option<(usize, u64)>,
    notified: Vec<u32>,
    resets: u32,
}

struct Dummy {
    seen: Arc<Mutex<Seen>>,
    broken: Arc<AtomicU32>,
}

impl VirtioDevice for Dummy {
    fn name(&self) -> &'static str {
        "dummy"
    }
    fn device_type(&self) -> u32 {
        19
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[256, 256, 64]
    }
    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1) | 0b10
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = (offset as u8).wrapping_add(i as u8);
        }
    }
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    fn activate(
        &mut self,
        _mem: GuestMem,
        queues: Vec<Queue>,
        acked: u64,
    ) -> Result<(), ActivateError> {
        if let Some(i) = queues.iter().position(|q| !q.ready()) {
            return Err(ActivateError::BadQueue(i));
        }
        self.seen.lock().unwrap().activated = Some((queues.len(), acked));
        Ok(())
    }
    fn queue_notify(&mut self, index: u32) {
        self.seen.lock().unwrap().notified.push(index);
    }
    fn reset(&mut self) {
        self.seen.lock().unwrap().resets += 1;
        self.broken.store(0, Ordering::SeqCst);
    }
    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst) != 0
    }
}

struct Fixture {
    t: MmioTransport,
    seen: Arc<Mutex<Seen>>,
    broken: Arc<AtomicU32>,
    irq: Arc<Interrupt>,
}

fn fixture() -> Fixture {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let broken = Arc::new(AtomicU32::new(0));
    let mem = create_guest_memory(1 << 20).unwrap();
    let irq = Arc::new(Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
    let dev = Dummy {
        seen: seen.clone(),
        broken: broken.clone(),
    };
    Fixture {
        t: MmioTransport::new(Box::new(dev), mem, irq.clone()),
        seen,
        broken,
        irq,
    }
}

fn r(t: &mut MmioTransport, off: u64) -> u32 {
    let mut d = [0u8; 4];
    t.read(off, &mut d);
    u32::from_le_bytes(d)
}

fn w(t: &mut MmioTransport, off: u64, v: u32) {
    t.write(off, &v.to_le_bytes());
}

/// Drives the driver side up to FEATURES_OK.
fn negotiate(t: &mut MmioTransport) {
    w(t, reg::STATUS, 0);
    w(t, reg::STATUS, status::ACKNOWLEDGE);
    w(t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    w(t, reg::DRIVER_FEATURES_SEL, 0);
    w(t, reg::DRIVER_FEATURES, 0b10);
    w(t, reg::DRIVER_FEATURES_SEL, 1);
    w(t, reg::DRIVER_FEATURES, 1);
    w(
        t,
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
    );
}

fn setup_queue(t: &mut MmioTransport, idx: u32, base: u64) {
    w(t, reg::QUEUE_SEL, idx);
    w(t, reg::QUEUE_NUM, 16);
    w(t, reg::QUEUE_DESC_LOW, base as u32);
    w(t, reg::QUEUE_DESC_HIGH, 0);
    w(t, reg::QUEUE_DRIVER_LOW, (base + 0x1000) as u32);
    w(t, reg::QUEUE_DRIVER_HIGH, 0);
    w(t, reg::QUEUE_DEVICE_LOW, (base + 0x2000) as u32);
    w(t, reg::QUEUE_DEVICE_HIGH, 0);
    w(t, reg::QUEUE_READY, 1);
}

const ALL_OK: u32 = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK;

#[test]
fn identification_registers() {
    let mut f = fixture();
    assert_eq!(r(&mut f.t, reg::MAGIC_VALUE), 0x7472_6976);
    assert_eq!(r(&mut f.t, reg::VERSION), 2);
    assert_eq!(r(&mut f.t, reg::DEVICE_ID), 19);
    assert_eq!(r(&mut f.t, reg::VENDOR_ID), VENDOR_ID);
    assert_eq!(r(&mut f.t, reg::STATUS), 0);
    assert_eq!(r(&mut f.t, reg::CONFIG_GENERATION), 0);
}

#[test]
fn feature_negotiation() {
    let mut f = fixture();
    w(&mut f.t, reg::DEVICE_FEATURES_SEL, 0);
    assert_eq!(r(&mut f.t, reg::DEVICE_FEATURES), 0b10);
    w(&mut f.t, reg::DEVICE_FEATURES_SEL, 1);
    assert_eq!(r(&mut f.t, reg::DEVICE_FEATURES), 1);
    w(&mut f.t, reg::DEVICE_FEATURES_SEL, 7);
    assert_eq!(r(&mut f.t, reg::DEVICE_FEATURES), 0);

    // Features written before DRIVER are ignored.
    w(&mut f.t, reg::DRIVER_FEATURES, 0b10);
    assert_eq!(f.t.acked_features(), 0);

    negotiate(&mut f.t);
    assert_eq!(f.t.acked_features(), (1 << 32) | 0b10);
    assert_eq!(
        r(&mut f.t, reg::STATUS),
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK
    );
    // Features are frozen after FEATURES_OK.
    w(&mut f.t, reg::DRIVER_FEATURES_SEL, 0);
    w(&mut f.t, reg::DRIVER_FEATURES, 0);
    assert_eq!(f.t.acked_features(), (1 << 32) | 0b10);
}

#[test]
fn unoffered_features_are_masked() {
    let mut f = fixture();
    w(&mut f.t, reg::STATUS, status::ACKNOWLEDGE);
    w(&mut f.t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    w(&mut f.t, reg::DRIVER_FEATURES, 0xffff_ffff);
    w(&mut f.t, reg::DRIVER_FEATURES_SEL, 1);
    w(&mut f.t, reg::DRIVER_FEATURES, 0xffff_ffff);
    w(&mut f.t, reg::DRIVER_FEATURES_SEL, 2);
    w(&mut f.t, reg::DRIVER_FEATURES, 0xffff_ffff);
    assert_eq!(f.t.acked_features(), (1 << 32) | 0b10);
}

#[test]
fn features_ok_requires_version_1() {
    let mut f = fixture();
    w(&mut f.t, reg::STATUS, status::ACKNOWLEDGE);
    w(&mut f.t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    w(&mut f.t, reg::DRIVER_FEATURES, 0b10);
    w(
        &mut f.t,
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
    );
    assert_eq!(r(&mut f.t, reg::STATUS) & status::FEATURES_OK, 0);
}

#[test]
fn invalid_status_transitions_are_ignored() {
    let mut f = fixture();
    w(&mut f.t, reg::STATUS, status::DRIVER_OK);
    assert_eq!(r(&mut f.t, reg::STATUS), 0);
    w(&mut f.t, reg::STATUS, status::ACKNOWLEDGE);
    w(
        &mut f.t,
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER_OK,
    );
    assert_eq!(r(&mut f.t, reg::STATUS), status::ACKNOWLEDGE);
    w(&mut f.t, reg::STATUS, status::ACKNOWLEDGE | status::FAILED);
    assert_eq!(
        r(&mut f.t, reg::STATUS),
        status::ACKNOWLEDGE | status::FAILED
    );
    assert!(f.t.bad_accesses() >= 2);
}

#[test]
fn queue_setup_and_activation() {
    let mut f = fixture();
    // Queue registers are locked before FEATURES_OK.
    w(&mut f.t, reg::QUEUE_SEL, 0);
    w(&mut f.t, reg::QUEUE_NUM, 16);
    assert_eq!(
        r(&mut f.t, reg::QUEUE_NUM),
        256,
        "size unchanged before FEATURES_OK"
    );

    negotiate(&mut f.t);
    w(&mut f.t, reg::QUEUE_SEL, 2);
    assert_eq!(r(&mut f.t, reg::QUEUE_NUM_MAX), 64);
    w(&mut f.t, reg::QUEUE_SEL, 3);
    assert_eq!(r(&mut f.t, reg::QUEUE_NUM_MAX), 0, "no such queue");
    w(&mut f.t, reg::QUEUE_READY, 1); // ignored: invalid QueueSel

    for i in 0..3 {
        setup_queue(&mut f.t, i, 0x10000 * (u64::from(i) + 1));
    }
    w(&mut f.t, reg::QUEUE_SEL, 1);
    assert_eq!(r(&mut f.t, reg::QUEUE_NUM), 16);
    assert_eq!(r(&mut f.t, reg::QUEUE_READY), 1);
    assert_eq!(r(&mut f.t, reg::QUEUE_DESC_LOW), 0x20000);
    assert_eq!(r(&mut f.t, reg::QUEUE_DRIVER_LOW), 0x21000);
    assert_eq!(r(&mut f.t, reg::QUEUE_DEVICE_LOW), 0x22000);

    // Bad sizes are rejected.
    w(&mut f.t, reg::QUEUE_NUM, 3);
    w(&mut f.t, reg::QUEUE_NUM, 512);
    w(&mut f.t, reg::QUEUE_NUM, 0x1_0000);
    assert_eq!(r(&mut f.t, reg::QUEUE_NUM), 16);

    // Notify before DRIVER_OK is ignored.
    w(&mut f.t, reg::QUEUE_NOTIFY, 0);
    assert!(f.seen.lock().unwrap().notified.is_empty());

    w(&mut f.t, reg::STATUS, ALL_OK);
    assert!(f.t.is_activated());
    assert_eq!(r(&mut f.t, reg::STATUS), ALL_OK);
    assert_eq!(
        f.seen.lock().unwrap().activated,
        Some((3, (1 << 32) | 0b10))
    );

    w(&mut f.t, reg::QUEUE_NOTIFY, 1);
    w(&mut f.t, reg::QUEUE_NOTIFY, 9); // unknown queue
    assert_eq!(f.seen.lock().unwrap().notified, vec![1]);

    // Queue registers are locked after DRIVER_OK.
    w(&mut f.t, reg::QUEUE_SEL, 0);
    w(&mut f.t, reg::QUEUE_DESC_LOW, 0x5000);
    assert_eq!(r(&mut f.t, reg::QUEUE_DESC_LOW), 0x10000);
}

#[test]
fn activation_fails_with_rings_outside_memory() {
    let mut f = fixture();
    negotiate(&mut f.t);
    setup_queue(&mut f.t, 0, 0x10000);
    setup_queue(&mut f.t, 1, 0x20000);
    setup_queue(&mut f.t, 2, 0xfff0_0000); // beyond the 1 MiB of guest memory
    w(&mut f.t, reg::STATUS, ALL_OK);
    assert!(!f.t.is_activated());
    assert_ne!(r(&mut f.t, reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    assert_ne!(r(&mut f.t, reg::INTERRUPT_STATUS) & INT_CONFIG, 0);
}

#[test]
fn activation_fails_when_device_rejects_queues() {
    let mut f = fixture();
    negotiate(&mut f.t);
    setup_queue(&mut f.t, 0, 0x10000);
    w(&mut f.t, reg::STATUS, ALL_OK);
    assert!(!f.t.is_activated());
    assert_ne!(r(&mut f.t, reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
}

#[test]
fn reset_clears_everything() {
    let mut f = fixture();
    negotiate(&mut f.t);
    for i in 0..3 {
        setup_queue(&mut f.t, i, 0x10000 * (u64::from(i) + 1));
    }
    w(&mut f.t, reg::STATUS, ALL_OK);
    f.irq.signal(1).unwrap();
    assert_eq!(r(&mut f.t, reg::INTERRUPT_STATUS), 1);
    w(&mut f.t, reg::STATUS, 0);
    assert_eq!(r(&mut f.t, reg::STATUS), 0);
    assert_eq!(r(&mut f.t, reg::INTERRUPT_STATUS), 0);
    assert_eq!(f.t.acked_features(), 0);
    assert!(!f.t.is_activated());
    w(&mut f.t, reg::QUEUE_SEL, 0);
    assert_eq!(r(&mut f.t, reg::QUEUE_READY), 0);
    assert_eq!(r(&mut f.t, reg::QUEUE_DESC_LOW), 0);
    assert_eq!(f.seen.lock().unwrap().resets, 2); // negotiate() resets first
}

#[test]
fn interrupt_ack() {
    let mut f = fixture();
    f.irq.signal(INT_CONFIG | 1).unwrap();
    assert_eq!(r(&mut f.t, reg::INTERRUPT_STATUS), 3);
    w(&mut f.t, reg::INTERRUPT_ACK, 1);
    assert_eq!(r(&mut f.t, reg::INTERRUPT_STATUS), INT_CONFIG);
}

#[test]
fn broken_device_reports_needs_reset() {
    let mut f = fixture();
    negotiate(&mut f.t);
    f.broken.store(1, Ordering::SeqCst);
    assert_ne!(r(&mut f.t, reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    w(&mut f.t, reg::STATUS, 0);
    assert_eq!(r(&mut f.t, reg::STATUS), 0);
}

#[test]
fn wrong_width_and_out_of_range_accesses() {
    let mut f = fixture();
    let mut two = [0xaau8; 2];
    f.t.read(reg::MAGIC_VALUE, &mut two);
    assert_eq!(two, [0, 0], "16-bit register read returns 0");
    let mut one = [0xaau8; 1];
    f.t.read(reg::VERSION, &mut one);
    assert_eq!(one, [0]);
    let mut eight = [0xaau8; 8];
    f.t.read(reg::MAGIC_VALUE, &mut eight);
    assert_eq!(eight, [0; 8]);
    let mut four = [0xaau8; 4];
    f.t.read(reg::MAGIC_VALUE + 1, &mut four);
    assert_eq!(four, [0; 4], "unaligned read");

    // A 1-byte status write does not change state.
    f.t.write(reg::STATUS, &[status::ACKNOWLEDGE as u8]);
    assert_eq!(r(&mut f.t, reg::STATUS), 0);
    f.t.write(reg::STATUS + 1, &1u32.to_le_bytes());
    assert_eq!(r(&mut f.t, reg::STATUS), 0);

    // Unknown and write-only registers.
    assert_eq!(r(&mut f.t, 0x0e0), 0);
    assert_eq!(r(&mut f.t, reg::QUEUE_NOTIFY), 0);
    assert_eq!(r(&mut f.t, reg::DRIVER_FEATURES), 0);
    w(&mut f.t, reg::MAGIC_VALUE, 0);
    w(&mut f.t, 0x0e0, 0);
    assert_eq!(r(&mut f.t, reg::MAGIC_VALUE), MMIO_MAGIC_VALUE);
    assert!(f.t.bad_accesses() >= 8);

    // Config space: any width.
    let mut c = [0u8; 2];
    f.t.read(reg::CONFIG + 4, &mut c);
    assert_eq!(c, [4, 5]);
    f.t.write(reg::CONFIG, &[1, 2, 3]);
}
