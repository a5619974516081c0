//! Snapshot round trips of the vsock device: save → restore into a fresh backend → the guest
//! and the host see the same connection, counters and pending bytes.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::*;
use crate::devices::vsock::persist::VsockBackendState;
use crate::persist::PersistError;

/// Replaces the harness's backend with one restored from its own saved state.
fn swap_in_restored(
    h: &mut H,
    identical: bool,
    mut stream_for: impl FnMut(ConnKey) -> Option<UnixStream>,
) -> VsockBackendState {
    let state = h.b.save();
    let json = serde_json::to_vec(&state).unwrap();
    let state: VsockBackendState = serde_json::from_slice(&json).unwrap();
    let irq = irq();
    let restored =
        VsockBackend::restore(&state, h.mem.clone(), irq.clone(), None, &mut stream_for).unwrap();
    if identical {
        assert_eq!(restored.save(), state);
    }
    h.b = restored;
    h.irq = irq;
    state
}

#[test]
fn connection_survives_restore_with_pending_bytes_and_credit() {
    let mut h = H::new();
    let (mut host, local) = establish(&mut h, 1234);
    // Guest → host data, consumed by the host.
    h.guest_send(&rw(1234, local, b"from guest"), b"from guest");
    let mut buf = [0u8; 10];
    host.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"from guest");
    // Host → guest data staged, but the guest has no RX buffer yet.
    host.write_all(b"pending").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let key =
        h.b.key_for_fd(std::os::unix::io::AsRawFd::as_raw_fd(
            h.b.connections().next().unwrap().stream(),
        ))
        .unwrap();
    h.b.stream_event(key, true, false, false);
    let before = h.b.connections().next().unwrap().fwd_cnt();
    let stats = h.b.stats();

    let (mut new_host, vmm_side) = UnixStream::pair().unwrap();
    vmm_side.set_nonblocking(true).unwrap();
    let mut vmm_side = Some(vmm_side);
    let state = swap_in_restored(&mut h, true, |k| {
        assert_eq!(k, key);
        vmm_side.take()
    });
    assert_eq!(state.connections.len(), 1);
    assert_eq!(state.connections[0].rx_stage, b"pending");
    assert_eq!(h.b.stats(), stats);
    assert_eq!(h.b.connections().next().unwrap().fwd_cnt(), before);
    assert!(h.b.is_active());

    // The staged bytes reach the guest, with the credit counters carried over.
    h.give_rx(1, 4096 + 44);
    let pkts = h.guest_recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    assert_eq!(pkts[0].0.op(), Some(Op::Rw));
    assert_eq!(pkts[0].0.src_port, local);
    assert_eq!(pkts[0].0.fwd_cnt, before);
    assert_eq!(pkts[0].1, b"pending");
    // Guest → host continues on the new stream, queue indices continue on the same rings.
    h.guest_send(&rw(1234, local, b"after"), b"after");
    new_host
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = [0u8; 5];
    new_host.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"after");
    assert!(!h.broken());
    // The old host stream is no longer used by the restored device.
    drop(host);
}

#[test]
fn connection_without_new_stream_is_reset_towards_the_guest() {
    let mut h = H::new();
    let (_host, local) = establish(&mut h, 1234);
    swap_in_restored(&mut h, false, |_| None);
    h.give_rx(1, 4096 + 44);
    let pkts = h.guest_recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].0.op(), Some(Op::Rst));
    assert_eq!(pkts[0].0.src_port, local);
    assert_eq!(pkts[0].0.dst_port, 1234);
    assert_eq!(h.b.reap(Instant::now()).len(), 1);
    assert_eq!(h.b.connections().count(), 0);
}

#[test]
fn queued_orphan_rst_survives_restore() {
    let mut h = H::new();
    h.guest_send(&rw(999, 4242, b"x"), b"x");
    swap_in_restored(&mut h, false, |_| None);
    h.give_rx(1, 4096 + 44);
    let pkts = h.guest_recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].0.op(), Some(Op::Rst));
    assert_eq!((pkts[0].0.src_port, pkts[0].0.dst_port), (4242, 999));
}

#[test]
fn inactive_device_round_trips() {
    let irq = irq();
    let b = VsockBackend::new(GUEST_CID, irq.clone(), None);
    let s = b.save();
    let mem = create_guest_memory(MEM_SIZE as u64).unwrap();
    let r = VsockBackend::restore(&s, mem, irq, None, |_| None).unwrap();
    assert!(!r.is_active());
    assert_eq!(r.save(), s);
}

#[test]
fn hostile_state_is_refused() {
    let mut h = H::new();
    let (_host, _local) = establish(&mut h, 1234);
    let good = h.b.save();
    let check = |s: &VsockBackendState| {
        VsockBackend::restore(s, h.mem.clone(), h.irq.clone(), None, |_| None)
    };
    assert!(check(&good).is_ok());
    let mut cases: Vec<VsockBackendState> = Vec::new();
    let mut s = good.clone();
    s.connections[0].rx_stage = vec![0; MAX_PKT_PAYLOAD + 1];
    cases.push(s);
    let mut s = good.clone();
    s.connections[0].tx_buf = vec![0; CONN_BUF_ALLOC as usize + 1];
    cases.push(s);
    let mut s = good.clone();
    s.connections[0].ctl_bytes = 5;
    cases.push(s);
    let mut s = good.clone();
    s.connections[0].peer_shutdown = 4;
    cases.push(s);
    let mut s = good.clone();
    s.connections[0].guest_cid = 99;
    cases.push(s);
    let mut s = good.clone();
    let dup = s.connections[0].clone();
    s.connections.push(dup);
    cases.push(s);
    let mut s = good.clone();
    s.connections = vec![good.connections[0].clone(); MAX_CONNECTIONS + 1];
    cases.push(s);
    let mut s = good.clone();
    s.orphan_rsts = vec![(1, 2); 1025];
    cases.push(s);
    let mut s = good.clone();
    s.next_local_port = 5;
    cases.push(s);
    let mut s = good.clone();
    s.queues[1].desc_table = 1 << 40;
    cases.push(s);
    let mut s = good.clone();
    s.queues[2].ready = false;
    cases.push(s);
    let mut s = good.clone();
    s.active = false;
    cases.push(s);
    let mut s = good.clone();
    s.broken = Some("x".repeat(5000));
    cases.push(s);
    for (i, s) in cases.iter().enumerate() {
        assert!(
            matches!(check(s), Err(PersistError::Invalid { .. })),
            "case {i} accepted"
        );
    }
    let mut s = good;
    s.queues.pop();
    assert!(matches!(check(&s), Err(PersistError::Mismatch { .. })));
}
