use super::*;
use crate::devices::serial::{ConsoleLog, SerialDevice};
use crate::devices::virtio::Interrupt;
use crate::devices::vsock::VsockBackend;
use crate::persist::format::{decode_state, encode_state};
use crate::persist::vcpu::tests::sample as vcpu_sample;
use crate::persist::vm_state::tests::sample as vm_sample;
use std::sync::Arc;
use vmm_sys_util::eventfd::EventFd;

fn cfg(vcpus: u8, vsock: bool) -> VmConfig {
    let mut c =
        VmConfig::from_json(r#"{"kernel":"/k","console_log":"/c","image_hash":"h1"}"#).unwrap();
    c.vcpus = vcpus;
    c.share_slots = true;
    if vsock {
        c.vsock_uds = Some("/tmp/v.sock".into());
    }
    c
}

fn caps() -> VcpuCaps {
    VcpuCaps {
        msr_indices: vec![0x10],
        xcrs: true,
    }
}

fn state(vcpus: u32, vsock: bool) -> SnapshotState {
    let evt = || EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let serial = SerialDevice::new(evt(), ConsoleLog::new(None, None)).save();
    let mut virtio = Vec::new();
    if vsock {
        let irq = Arc::new(Interrupt::new(evt()));
        let backend = VsockBackend::new(3, irq, None).save();
        let mem = crate::memory::create_guest_memory(1 << 20).unwrap();
        let dev = crate::devices::vsock::VsockDevice::new(
            Arc::new(std::sync::Mutex::new(VsockBackend::new(
                3,
                Arc::new(Interrupt::new(evt())),
                None,
            ))),
            Arc::new(evt()),
        );
        let t = crate::devices::virtio::mmio::MmioTransport::new(
            Box::new(dev),
            mem,
            Arc::new(Interrupt::new(evt())),
        );
        virtio.push(VirtioSlotState {
            transport: t.save(),
            device: VirtioDeviceState::Vsock(backend),
        });
    }
    for slot in 0..SHARE_SLOTS {
        use crate::devices::p9::{P9Device, Share, P9};
        let p9 = || {
            P9::new(
                slot,
                Share::unbound(),
                Arc::new(Interrupt::new(evt())),
                None,
            )
        };
        let t = crate::devices::virtio::mmio::MmioTransport::new(
            Box::new(P9Device::new(Arc::new(std::sync::Mutex::new(p9())))),
            crate::memory::create_guest_memory(1 << 20).unwrap(),
            Arc::new(Interrupt::new(evt())),
        );
        virtio.push(VirtioSlotState {
            transport: t.save(),
            device: VirtioDeviceState::P9(p9().save().unwrap()),
        });
    }
    SnapshotState {
        vm: vm_sample(),
        vcpus: (0..vcpus).map(vcpu_sample).collect(),
        devices: DevicesState { serial, virtio },
        restore_page: true,
    }
}

#[test]
fn key_follows_config() {
    let k = snapshot_key(&cfg(2, true));
    assert_eq!(
        k.devices,
        ["serial", "i8042", "vsock", "p9", "p9", "p9", "p9"]
    );
    assert_eq!(k.vcpus, 2);
    assert_eq!(k.memory_size, 256 << 20);
    assert_eq!(k.image_hash, "h1");
    assert_eq!(
        snapshot_key(&cfg(1, false)).devices,
        ["serial", "i8042", "p9", "p9", "p9", "p9"]
    );
    // Binding a share does not change the key.
    let mut bound = cfg(2, true);
    bound.shares = vec![crate::config::ShareConfig {
        path: "/srv".into(),
        read_only: false,
        guest_uid: 1000,
        guest_gid: 1000,
    }];
    assert_eq!(snapshot_key(&bound), k);
    // Without share slots the guest has no 9p devices, and the key says so.
    let mut bare = cfg(2, true);
    bare.share_slots = false;
    assert_eq!(snapshot_key(&bare).devices, ["serial", "i8042", "vsock"]);
}

#[test]
fn blob_round_trip_and_validation() {
    let s = state(2, true);
    let blob = encode_state(&s).unwrap();
    let back: SnapshotState = decode_state(&blob).unwrap();
    assert_eq!(back, s);
    back.validate(&cfg(2, true), &caps()).unwrap();
    // Wrong vCPU count, wrong device set, wrong CID.
    assert!(back.validate(&cfg(1, true), &caps()).is_err());
    assert!(back.validate(&cfg(2, false), &caps()).is_err());
    let mut c = cfg(2, true);
    c.vsock_cid = 4;
    assert!(back.validate(&c, &caps()).is_err());
    // vCPUs out of order.
    let mut swapped = back.clone();
    swapped.vcpus.swap(0, 1);
    assert!(swapped.validate(&cfg(2, true), &caps()).is_err());
    // No vsock in a config without one.
    state(1, false).validate(&cfg(1, false), &caps()).unwrap();
}

fn block_slot(transport: &MmioTransportState, read_only: bool) -> VirtioSlotState {
    VirtioSlotState {
        transport: transport.clone(),
        device: VirtioDeviceState::Block(BlockState {
            capacity: 8,
            read_only,
            acked_features: 0,
            queue: None,
            broken: None,
            reads: 0,
            writes: 0,
            flushes: 0,
            errors: 0,
        }),
    }
}

#[test]
fn disks_come_before_vsock_and_must_match() {
    use crate::config::DiskConfig;
    let disk = |p: &str, read_only| DiskConfig {
        path: p.into(),
        read_only,
    };
    let mut c = cfg(1, true);
    c.disks = vec![disk("/sys.img", true), disk("/data.img", false)];
    assert_eq!(
        snapshot_key(&c).devices,
        ["serial", "i8042", "block", "block", "vsock", "p9", "p9", "p9", "p9"]
    );
    let mut s = state(1, true);
    let t = s.devices.virtio[0].transport.clone();
    s.devices
        .virtio
        .splice(0..0, [block_slot(&t, true), block_slot(&t, false)]);
    let back: SnapshotState = decode_state(&encode_state(&s).unwrap()).unwrap();
    assert_eq!(back, s);
    back.validate(&c, &caps()).unwrap();
    // Fewer or more disks configured.
    let mut fewer = c.clone();
    fewer.disks.pop();
    let e = back.validate(&fewer, &caps()).unwrap_err();
    assert!(
        e.to_string()
            .contains("2 disks in the snapshot, 1 configured"),
        "{e}"
    );
    assert!(back.validate(&cfg(1, true), &caps()).is_err());
    // Another mode.
    let mut flipped = c.clone();
    flipped.disks[1].read_only = true;
    let e = back.validate(&flipped, &caps()).unwrap_err();
    assert!(
        e.to_string()
            .contains("disk 1 (vdb, /data.img) is read-write in the snapshot"),
        "{e}"
    );
    // Disks after vsock are out of order.
    let mut misordered = s.clone();
    misordered.devices.virtio.rotate_left(1);
    assert!(misordered.validate(&c, &caps()).is_err());
}

fn net_slot(transport: &MmioTransportState, mac: [u8; 6]) -> VirtioSlotState {
    let irq = Arc::new(Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
    VirtioSlotState {
        transport: transport.clone(),
        device: VirtioDeviceState::Net(crate::devices::net::NetBackend::new(mac, irq, None).save()),
    }
}

#[test]
fn the_network_device_is_keyed_after_the_disks_and_must_match() {
    use crate::config::DiskConfig;
    let mut c = cfg(1, true);
    c.disks = vec![DiskConfig {
        path: "/sys.img".into(),
        read_only: true,
    }];
    let no_net = c.clone();
    c.network = Some(serde_json::from_str("{}").unwrap());
    assert_eq!(
        snapshot_key(&c).devices,
        ["serial", "i8042", "block", "net", "vsock", "p9", "p9", "p9", "p9"]
    );
    assert_ne!(snapshot_key(&c), snapshot_key(&no_net));
    let mut s = state(1, true);
    let t = s.devices.virtio[0].transport.clone();
    let mac = voidbox_net::DEFAULT_GUEST_MAC;
    s.devices
        .virtio
        .splice(0..0, [block_slot(&t, true), net_slot(&t, mac)]);
    let back: SnapshotState = decode_state(&encode_state(&s).unwrap()).unwrap();
    assert_eq!(back, s);
    back.validate(&c, &caps()).unwrap();
    // Network in the snapshot, none configured; and the other way round.
    let e = back.validate(&no_net, &caps()).unwrap_err();
    assert!(e.to_string().contains("\"net\""), "{e}");
    let mut without = s.clone();
    without.devices.virtio.remove(1);
    assert!(without.validate(&c, &caps()).is_err());
    without.validate(&no_net, &caps()).unwrap();
    // Another guest MAC configured.
    let mut other = c.clone();
    if let Some(n) = other.network.as_mut() {
        n.guest_mac = [0x52, 0x54, 0, 0, 0, 1];
    }
    let e = back.validate(&other, &caps()).unwrap_err();
    assert!(e.to_string().contains("52:54:00:00:00:01"), "{e}");
    // The network device before a disk is out of order.
    let mut misordered = s.clone();
    misordered.devices.virtio.swap(0, 1);
    assert!(misordered.validate(&c, &caps()).is_err());
}

#[test]
fn hostile_blobs_are_typed_errors() {
    let s = state(1, true);
    let mut v = serde_json::to_value(&s).unwrap();
    v["devices"]["virtio"][0]["device"] = serde_json::json!({"blk": {}});
    assert!(decode_state::<SnapshotState>(&serde_json::to_vec(&v).unwrap()).is_err());
    let mut v = serde_json::to_value(&s).unwrap();
    v["vcpus"][0]["msrs"] = serde_json::json!([[1, -1]]);
    assert!(decode_state::<SnapshotState>(&serde_json::to_vec(&v).unwrap()).is_err());
    let mut v = serde_json::to_value(&s).unwrap();
    v["vm"]["pit"] = serde_json::json!("ff");
    assert!(decode_state::<SnapshotState>(&serde_json::to_vec(&v).unwrap()).is_err());
    let mut v = serde_json::to_value(&s).unwrap();
    v["surprise"] = serde_json::json!(true);
    assert!(decode_state::<SnapshotState>(&serde_json::to_vec(&v).unwrap()).is_err());
    for junk in [&b""[..], b"null", b"[]", b"{\"vm\":1}", b"\xff\xfe"] {
        assert!(decode_state::<SnapshotState>(junk).is_err());
    }
}
