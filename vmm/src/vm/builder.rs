//! Cold boot: a fresh VM with new devices, the kernel and initramfs loaded, a command line
//! that announces every virtio device, and every vCPU set up for 64-bit Linux entry.

use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::{Kvm, VcpuFd};
use vmm_sys_util::eventfd::EventFd;

use super::devices::{new_nat, open_disks, open_shares, Attach, Console, VirtioBackend};
use super::kvm::{create_vcpus, create_vm, register_memory};
use super::{bind_vsock_socket, memory_size, setup, Vm, VmError};
use crate::boot;
use crate::config::{build_cmdline, MmioAnnouncement, VmConfig};
use crate::devices::block::{Block, BlockDevice};
use crate::devices::net::thread::NetThread;
use crate::devices::net::{NetBackend, NetDevice, NetKicks};
use crate::devices::p9::{P9Device, P9};
use crate::devices::serial::SerialDevice;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::vsock::{VsockBackend, VsockDevice};
use crate::memory::{create_guest_memory, GuestMem};
use crate::persist::state::snapshot_key;
use crate::persist::vcpu::VcpuCaps;
use crate::vcpu::configure_vcpu;

/// Builds a VM that boots `cfg.kernel` (everything up to, not including, the first KVM_RUN).
pub(super) fn boot(cfg: &VmConfig, kvm: Kvm, caps: VcpuCaps, t0: Instant) -> Result<Vm, VmError> {
    let disks = open_disks(cfg)?;
    let shares = open_shares(cfg)?;
    let vm_fd = create_vm(&kvm)?;
    let mem = create_guest_memory(memory_size(cfg)).map_err(setup("guest memory"))?;
    register_memory(&vm_fd, &mem)?;

    let (events_tx, events_rx) = channel();
    let mut devices = Attach::new(&vm_fd, Console::open(cfg, &events_tx)?);
    devices.attach_legacy(&events_tx, |evt, log| Ok(SerialDevice::new(evt, log)))?;
    for (index, disk) in disks.into_iter().enumerate() {
        let slot = devices.next_virtio_slot("block")?;
        let block = Arc::new(Mutex::new(Block::new(
            disk,
            index,
            slot.irq.clone(),
            Some(events_tx.clone()),
        )));
        let dev = BlockDevice::new(block.clone());
        let transport = MmioTransport::new(Box::new(dev), mem.clone(), slot.irq.clone());
        devices.attach_virtio(slot, transport, VirtioBackend::Block(block))?;
    }
    if let Some(net) = &cfg.network {
        let nat = new_nat(net)?;
        let slot = devices.next_virtio_slot("net")?;
        let kicks = NetKicks::new().map_err(setup("eventfd"))?;
        let backend = Arc::new(Mutex::new(NetBackend::new(
            net.guest_mac,
            slot.irq.clone(),
            Some(events_tx.clone()),
        )));
        let dev = NetDevice::new(backend.clone(), kicks.clone());
        let transport = MmioTransport::new(Box::new(dev), mem.clone(), slot.irq.clone());
        let thread = NetThread::new(backend.clone(), nat, kicks, devices.stop_flag());
        devices.attach_net(slot, transport, backend, thread)?;
    }
    if let Some(path) = &cfg.vsock_uds {
        let listener = bind_vsock_socket(path)?;
        let slot = devices.next_virtio_slot("vsock")?;
        let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(setup("eventfd"))?);
        let backend = Arc::new(Mutex::new(VsockBackend::new(
            cfg.vsock_cid,
            slot.irq.clone(),
            Some(events_tx.clone()),
        )));
        let dev = VsockDevice::new(backend.clone(), kick.clone());
        let transport = MmioTransport::new(Box::new(dev), mem.clone(), slot.irq.clone());
        devices.attach_vsock(slot, transport, backend, listener, kick)?;
    }
    for (index, share) in shares.into_iter().enumerate() {
        let slot = devices.next_virtio_slot("p9")?;
        let p9 = Arc::new(Mutex::new(P9::new(
            index,
            share,
            slot.irq.clone(),
            Some(events_tx.clone()),
        )));
        let dev = P9Device::new(p9.clone());
        let transport = MmioTransport::new(Box::new(dev), mem.clone(), slot.irq.clone());
        devices.attach_virtio(slot, transport, VirtioBackend::P9(p9))?;
    }

    let vcpus = create_vcpus(&vm_fd, cfg.vcpus)?;
    let cmdline = boot_kernel(&kvm, &mem, cfg, &vcpus, devices.announcements())?;
    let devices = devices.finish()?;
    Ok(Vm {
        cmdline,
        setup_time: t0.elapsed(),
        restored: None,
        kvm,
        vm_fd,
        mem,
        vcpus,
        devices,
        events_tx,
        events_rx,
        key: snapshot_key(cfg),
        caps: Arc::new(caps),
        origin: None,
    })
}

/// Boots `cfg.kernel`: loads kernel and initramfs, writes the command line, boot params, GDT
/// and page tables, and sets up every vCPU for 64-bit entry. Returns the command line.
fn boot_kernel(
    kvm: &Kvm,
    mem: &GuestMem,
    cfg: &VmConfig,
    vcpus: &[VcpuFd],
    announcements: &[MmioAnnouncement],
) -> Result<String, VmError> {
    let tsc_khz = if cfg.vcpus > 1 {
        vcpus.first().and_then(|v| v.get_tsc_khz().ok())
    } else {
        None
    };
    let cmdline = build_cmdline(cfg, tsc_khz, announcements)?;
    let kernel = boot::load_kernel(mem, &cfg.kernel).map_err(setup("kernel"))?;
    let initrd = match &cfg.initramfs {
        Some(p) => Some(boot::load_initramfs(mem, p, &kernel).map_err(setup("initramfs"))?),
        None => None,
    };
    boot::write_cmdline(mem, &cmdline).map_err(setup("cmdline"))?;
    boot::configure_system(mem, cmdline.len(), initrd, kernel.setup_header, cfg.vcpus)
        .map_err(setup("boot params"))?;
    boot::write_gdt_idt(mem).map_err(setup("GDT"))?;
    let cr3 = boot::paging::setup_identity_map(mem).map_err(setup("page tables"))?;
    let cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(setup("KVM_GET_SUPPORTED_CPUID"))?;
    let tsc_deadline = kvm.check_extension(kvm_ioctls::Cap::TscDeadlineTimer);
    for (i, v) in vcpus.iter().enumerate() {
        configure_vcpu(
            v,
            i as u8,
            cfg.vcpus,
            kernel.entry,
            cr3,
            &cpuid,
            tsc_deadline,
        )
        .map_err(setup("vCPU"))?;
    }
    Ok(cmdline)
}
