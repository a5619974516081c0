//! Restoring a VM from a snapshot directory instead of booting a kernel.
//!
//! [`load`] reads and verifies everything (container checksums, the memory digest, the key
//! built from the config, the decoded state's bounds, the disks' count and modes) before the
//! VM is created; the devices then validate their own state before they are built (each disk
//! against the file the config names, reopened here; the network device against the configured
//! MAC, with a new NAT from this config; each share slot bound to this config's directory),
//! and KVM validates the CPU state before
//! any vCPU runs. Any refusal is a [`VmError::Snapshot`] and the VMM exits without having
//! run the guest.
//!
//! A layered snapshot (`cfg.restore_base`) is verified as completely: its state, its base
//! (state and whole memory), its memory diff (header, runs, length, data), that the diff was
//! taken over that base and that the state belongs to that diff
//! ([`format::diff::load_layered`]); the base's memory file is then mapped as usual and the
//! diff's page runs are mapped over it, copy-on-write and lazily read
//! ([`crate::memory::overlay_file_runs`]), so clones share both files' page cache.

use std::path::Path;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vmm_sys_util::eventfd::EventFd;

use super::devices::{new_nat, open_disks, open_shares, Attach, Console, VirtioBackend};
use super::kvm::{create_vcpus, create_vm, register_memory};
use super::snapshot::Origin;
use super::{bind_vsock_socket, memory_size, setup, RestoreTimes, Vm, VmError};
use crate::config::VmConfig;
use crate::devices::block::{Block, BlockDevice};
use crate::devices::net::thread::NetThread;
use crate::devices::net::{NetBackend, NetDevice, NetKicks};
use crate::devices::p9::{P9Device, P9};
use crate::devices::serial::SerialDevice;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::vsock::{VsockBackend, VsockDevice};
use crate::exit::VmEvent;
use crate::memory::{map_guest_memory_file, overlay_file_runs, GuestMem};
use crate::persist::format::diff::{load_layered, LoadedDiff};
use crate::persist::format::{self, decode_state, MemoryCheck};
use crate::persist::state::{snapshot_key, SnapshotState, VirtioDeviceState, VirtioSlotState};
use crate::persist::vcpu::VcpuCaps;

/// A verified and validated snapshot.
struct Loaded {
    /// The decoded state.
    state: SnapshotState,
    /// The verified memory file (of the base, for a layered snapshot).
    memory: format::LoadedSnapshot,
    /// The verified memory diff of a layered snapshot.
    diff: Option<LoadedDiff>,
}

fn refused(e: impl std::fmt::Display) -> VmError {
    VmError::Snapshot(e.to_string())
}

/// Builds the VM saved in `dir` for a VM configured by `cfg` (everything up to, not
/// including, the first KVM_RUN).
pub(super) fn restore(
    cfg: &VmConfig,
    dir: &Path,
    kvm: Kvm,
    caps: VcpuCaps,
    t0: Instant,
) -> Result<Vm, VmError> {
    let t_load = Instant::now();
    let snap = load(cfg, dir, &caps)?;
    let verify = t_load.elapsed();
    let disks = open_disks(cfg)?;
    let shares = open_shares(cfg)?;
    let vm_fd = create_vm(&kvm)?;
    let mem = map_memory(&snap, memory_size(cfg))?;
    register_memory(&vm_fd, &mem)?;
    let origin = Origin::of(cfg, dir, &snap.memory, snap.diff.is_some());

    let saved = &snap.state.devices;
    let mut slots = saved.virtio.iter();
    let mut next_slot = |want: &str| {
        slots
            .next()
            .ok_or_else(|| refused(format!("no state for virtio device {want}")))
    };
    let (events_tx, events_rx) = channel();
    let mut devices = Attach::new(&vm_fd, Console::open(cfg, &events_tx)?);
    devices.attach_legacy(&events_tx, |evt, log| {
        SerialDevice::restore(&saved.serial, evt, log).map_err(refused)
    })?;
    for (index, disk) in disks.into_iter().enumerate() {
        let state = next_slot("block")?;
        let VirtioDeviceState::Block(bs) = &state.device else {
            return Err(refused(format!(
                "virtio device {index} is {}, not a disk",
                state.device.name()
            )));
        };
        let slot = devices.next_virtio_slot("block")?;
        let block = Block::restore(
            bs,
            disk,
            index,
            mem.clone(),
            slot.irq.clone(),
            Some(events_tx.clone()),
        )
        .map_err(refused)?;
        let block = Arc::new(Mutex::new(block));
        let transport = restore_transport(BlockDevice::new(block.clone()), &mem, &slot, state)?;
        devices.attach_virtio(slot, transport, VirtioBackend::Block(block))?;
    }
    if let Some(net) = &cfg.network {
        let state = next_slot("net")?;
        restore_net(&mut devices, net, cfg.disks.len(), state, &mem, &events_tx)?;
    }
    if let Some(path) = &cfg.vsock_uds {
        let state = next_slot("vsock")?;
        restore_vsock(&mut devices, path, state, &mem, &events_tx)?;
    }
    // The share slots: the transport and queue from the snapshot, the binding from this
    // config (nothing was mounted when the snapshot was taken).
    for (index, share) in shares.into_iter().enumerate() {
        let state = next_slot("p9")?;
        let VirtioDeviceState::P9(ps) = &state.device else {
            return Err(refused(format!(
                "share slot {index} is {} in the snapshot",
                state.device.name()
            )));
        };
        let slot = devices.next_virtio_slot("p9")?;
        let p9 = P9::restore(
            ps,
            index,
            share,
            mem.clone(),
            slot.irq.clone(),
            Some(events_tx.clone()),
        )
        .map_err(refused)?;
        let p9 = Arc::new(Mutex::new(p9));
        let transport = restore_transport(P9Device::new(p9.clone()), &mem, &slot, state)?;
        devices.attach_virtio(slot, transport, VirtioBackend::P9(p9))?;
    }

    let vcpus = create_vcpus(&vm_fd, cfg.vcpus)?;
    restore_cpu_state(&vm_fd, &vcpus, &snap.state)?;
    let devices = devices.finish()?;
    fill_restore_page(cfg, snap.state.restore_page, &mem)?;
    Ok(Vm {
        cmdline: String::new(),
        setup_time: t0.elapsed(),
        restored: Some(RestoreTimes {
            verify,
            restore: t_load.elapsed().saturating_sub(verify),
        }),
        kvm,
        vm_fd,
        mem,
        vcpus,
        devices,
        events_tx,
        events_rx,
        key: snapshot_key(cfg),
        caps: Arc::new(caps),
        origin: Some(origin),
    })
}

/// Hands the guest its restore grant (last, so its clock is as fresh as it can be here).
/// A snapshot with a restore page is only restored with a grant, so the guest never resumes
/// on the snapshot's secret; a grant for a snapshot without one is refused, as it would be
/// silently ignored.
fn fill_restore_page(cfg: &VmConfig, has_page: bool, mem: &GuestMem) -> Result<(), VmError> {
    match (&cfg.restore_grant, has_page) {
        (Some(grant), true) => {
            crate::restore_page::fill(mem, grant).map_err(|e| refused(format!("restore page: {e}")))
        }
        (Some(_), false) => Err(refused(
            "this snapshot has no restore page (its guest had not armed one), so the restored \
             guest cannot get a new secret: re-create the snapshot with this voidbox",
        )),
        (None, true) => Err(refused(
            "this snapshot's guest waits for a new secret on its restore page: the restore \
             needs a restore_grant",
        )),
        (None, false) => Ok(()),
    }
}

/// Restores the network device from its saved `state`, with a new NAT from this config.
fn restore_net(
    devices: &mut Attach<'_>,
    net: &voidbox_net::NatConfig,
    index: usize,
    state: &VirtioSlotState,
    mem: &GuestMem,
    events_tx: &Sender<VmEvent>,
) -> Result<(), VmError> {
    let VirtioDeviceState::Net(ns) = &state.device else {
        return Err(refused(format!(
            "virtio device {} is {}, not the network device",
            index,
            state.device.name()
        )));
    };
    let slot = devices.next_virtio_slot("net")?;
    let backend = NetBackend::restore(
        ns,
        net.guest_mac,
        mem.clone(),
        slot.irq.clone(),
        Some(events_tx.clone()),
    )
    .map_err(refused)?;
    let backend = Arc::new(Mutex::new(backend));
    let kicks = NetKicks::new().map_err(setup("eventfd"))?;
    let dev = NetDevice::new(backend.clone(), kicks.clone());
    let transport = restore_transport(dev, mem, &slot, state)?;
    // A new NAT from this config (nothing of the snapshot creator's); the thread looks at
    // both queues at once, so buffers the guest posted before the snapshot are used.
    let nat = new_nat(net)?;
    kicks.kick_both();
    let thread = NetThread::new(backend.clone(), nat, kicks, devices.stop_flag());
    devices.attach_net(slot, transport, backend, thread)?;
    Ok(())
}

/// Restores the vsock device from its saved `state`, listening on `path` (the host ends of
/// saved connections are gone: they are reset).
fn restore_vsock(
    devices: &mut Attach<'_>,
    path: &Path,
    state: &VirtioSlotState,
    mem: &GuestMem,
    events_tx: &Sender<VmEvent>,
) -> Result<(), VmError> {
    let VirtioDeviceState::Vsock(bs) = &state.device else {
        return Err(refused(format!(
            "the last virtio device is {}, not vsock",
            state.device.name()
        )));
    };
    let listener = bind_vsock_socket(path)?;
    let slot = devices.next_virtio_slot("vsock")?;
    let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(setup("eventfd"))?);
    // The host ends of saved connections are gone: they are reset.
    let mut backend = VsockBackend::restore(
        bs,
        mem.clone(),
        slot.irq.clone(),
        Some(events_tx.clone()),
        |_| None,
    )
    .map_err(refused)?;
    backend.rearm_guest_ready();
    let backend = Arc::new(Mutex::new(backend));
    let dev = VsockDevice::new(backend.clone(), kick.clone());
    let transport = restore_transport(dev, mem, &slot, state)?;
    // Let the muxer look at the queues (and send the resets) at once.
    kick.write(1).map_err(setup("eventfd"))?;
    devices.attach_vsock(slot, transport, backend, listener, kick)?;
    Ok(())
}

/// The transport of a restored `device` (already restored from its own state) in `slot`.
fn restore_transport(
    device: impl crate::devices::virtio::VirtioDevice + 'static,
    mem: &GuestMem,
    slot: &super::devices::SlotWiring,
    state: &VirtioSlotState,
) -> Result<MmioTransport, VmError> {
    MmioTransport::restore(
        Box::new(device),
        mem.clone(),
        slot.irq.clone(),
        &state.transport,
    )
    .map_err(refused)
}

/// Loads the snapshot in `dir` for a VM configured by `cfg` and checks it completely.
fn load(cfg: &VmConfig, dir: &Path, caps: &VcpuCaps) -> Result<Loaded, VmError> {
    let key = snapshot_key(cfg);
    let (state, memory, diff) = match &cfg.restore_base {
        None => {
            let snap = format::load(dir, &key, MemoryCheck::Full).map_err(refused)?;
            (decode_state(&snap.state).map_err(refused)?, snap, None)
        }
        Some(base) => {
            let l = load_layered(dir, base, &key).map_err(refused)?;
            (
                decode_state(&l.state).map_err(refused)?,
                l.base,
                Some(l.diff),
            )
        }
    };
    let state: SnapshotState = state;
    state.validate(cfg, caps).map_err(refused)?;
    Ok(Loaded {
        state,
        memory,
        diff,
    })
}

/// Maps the verified memory file as guest RAM (private, copy-on-write, lazily read).
fn map_memory(s: &Loaded, size: u64) -> Result<GuestMem, VmError> {
    let f = s.memory.memory_file.try_clone().map_err(refused)?;
    // The length was verified on this very file; check again that it still holds (a shorter
    // file would fault the guest on access).
    let len = f.metadata().map_err(refused)?.len();
    if len != size {
        return Err(refused(format!(
            "memory file {} changed size to {len}",
            s.memory.memory_path.display()
        )));
    }
    let mem =
        map_guest_memory_file(f, size).map_err(|e| VmError::Setup(format!("guest memory: {e}")))?;
    if let Some(d) = &s.diff {
        // As above: the runs must still be in the file (a shorter one would fault the guest).
        let len = d.file.metadata().map_err(refused)?.len();
        if len != d.diff.data_offset + d.diff.header.data_len {
            return Err(refused(format!(
                "memory diff {} changed size to {len}",
                d.path.display()
            )));
        }
        overlay_file_runs(&mem, &d.file, &d.diff.extents())
            .map_err(|e| VmError::Setup(format!("guest memory diff: {e}")))?;
    }
    Ok(mem)
}

/// Restores the CPU side, in the order that works (see `persist::vcpu`): CPUID on every
/// vCPU, then PIT, clock and irqchip, then each vCPU's registers, LAPIC, MSRs and events.
fn restore_cpu_state(vm: &VmFd, vcpus: &[VcpuFd], state: &SnapshotState) -> Result<(), VmError> {
    if vcpus.len() != state.vcpus.len() {
        return Err(refused("vCPU count changed"));
    }
    for (fd, s) in vcpus.iter().zip(&state.vcpus) {
        s.restore_cpuid(fd).map_err(refused)?;
    }
    state.vm.restore(vm).map_err(refused)?;
    for (fd, s) in vcpus.iter().zip(&state.vcpus) {
        s.restore(fd).map_err(refused)?;
    }
    Ok(())
}
