//! The KVM side shared by boot and restore: opening `/dev/kvm`, creating the VM with its
//! in-kernel irqchip and PIT, registering guest memory, creating the vCPUs.

use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Cap, Kvm, VcpuFd, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::{setup, VmError};
use crate::memory::{GuestMem, KVM_TSS_ADDRESS};

/// Opens /dev/kvm and checks the capabilities the VMM relies on.
pub fn open_kvm() -> Result<Kvm, VmError> {
    let kvm =
        Kvm::new().map_err(|e| VmError::KvmUnavailable(format!("cannot open /dev/kvm: {e}")))?;
    if kvm.get_api_version() != 12 {
        return Err(VmError::KvmUnavailable(format!(
            "unsupported KVM API version {}",
            kvm.get_api_version()
        )));
    }
    for (cap, name) in [
        (Cap::Irqchip, "IRQCHIP"),
        (Cap::Pit2, "PIT2"),
        (Cap::Irqfd, "IRQFD"),
        (Cap::ImmediateExit, "IMMEDIATE_EXIT"),
        (Cap::UserMemory, "USER_MEMORY"),
        (Cap::SetTssAddr, "SET_TSS_ADDR"),
        (Cap::ExtCpuid, "EXT_CPUID"),
    ] {
        if !kvm.check_extension(cap) {
            return Err(VmError::KvmUnavailable(format!(
                "missing capability KVM_CAP_{name}"
            )));
        }
    }
    Ok(kvm)
}

/// Creates the VM: TSS, in-kernel irqchip (PIC + IOAPIC), PIT.
pub(super) fn create_vm(kvm: &Kvm) -> Result<VmFd, VmError> {
    let vm_fd = kvm
        .create_vm()
        .map_err(|e| VmError::KvmUnavailable(format!("KVM_CREATE_VM: {e}")))?;
    vm_fd
        .set_tss_address(KVM_TSS_ADDRESS)
        .map_err(setup("KVM_SET_TSS_ADDR"))?;
    vm_fd
        .create_irq_chip()
        .map_err(setup("KVM_CREATE_IRQCHIP"))?;
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm_fd.create_pit2(pit).map_err(setup("KVM_CREATE_PIT2"))?;
    Ok(vm_fd)
}

/// Gives every region of `mem` to the VM, one memory slot each.
pub(super) fn register_memory(vm_fd: &VmFd, mem: &GuestMem) -> Result<(), VmError> {
    for (slot, region) in mem.iter().enumerate() {
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
            flags: 0,
        };
        // SAFETY: the region is a live mmap owned by `mem`, which the Vm keeps alive for
        // as long as the VM fd (both are dropped together, after all vCPU threads stop or
        // the process exits); the range does not overlap another slot.
        unsafe { vm_fd.set_user_memory_region(r) }.map_err(setup("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

/// Creates vCPUs `0..n` (after the irqchip, so each gets a local APIC).
pub(super) fn create_vcpus(vm_fd: &VmFd, n: u8) -> Result<Vec<VcpuFd>, VmError> {
    (0..n)
        .map(|i| {
            vm_fd
                .create_vcpu(u64::from(i))
                .map_err(setup("KVM_CREATE_VCPU"))
        })
        .collect()
}
