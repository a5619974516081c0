//! Restoring a VM from a snapshot directory instead of booting a kernel.
//!
//! [`load`] reads and verifies everything (container checksums, the memory digest, the key
//! built from the config, the decoded state's bounds) before the VM is created; the devices
//! then validate their own state before they are built, and KVM validates the CPU state
//! before any vCPU runs. Any refusal is a [`VmError::Snapshot`] and the VMM exits without
//! having run the guest.

use std::path::Path;

use kvm_ioctls::{VcpuFd, VmFd};

use super::VmError;
use crate::config::VmConfig;
use crate::memory::{map_guest_memory_file, GuestMem};
use crate::persist::format::{self, decode_state, MemoryCheck};
use crate::persist::state::{snapshot_key, SnapshotState};
use crate::persist::vcpu::VcpuCaps;

/// A verified and validated snapshot.
pub(super) struct Loaded {
    /// The decoded state.
    pub state: SnapshotState,
    /// The verified memory file.
    memory: format::LoadedSnapshot,
}

fn refused(e: impl std::fmt::Display) -> VmError {
    VmError::Snapshot(e.to_string())
}

/// Loads the snapshot in `dir` for a VM configured by `cfg` and checks it completely.
pub(super) fn load(cfg: &VmConfig, dir: &Path, caps: &VcpuCaps) -> Result<Loaded, VmError> {
    let key = snapshot_key(cfg);
    let snap = format::load(dir, &key, MemoryCheck::Full).map_err(refused)?;
    let state: SnapshotState = decode_state(&snap.state).map_err(refused)?;
    state.validate(cfg, caps).map_err(refused)?;
    Ok(Loaded {
        state,
        memory: snap,
    })
}

/// Maps the verified memory file as guest RAM (private, copy-on-write, lazily read).
pub(super) fn map_memory(s: &Loaded, size: u64) -> Result<GuestMem, VmError> {
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
    map_guest_memory_file(f, size).map_err(|e| VmError::Setup(format!("guest memory: {e}")))
}

/// Restores the CPU side, in the order that works (see `snapshot::vcpu`): CPUID on every
/// vCPU, then PIT, clock and irqchip, then each vCPU's registers, LAPIC, MSRs and events.
pub(super) fn restore_cpu_state(
    vm: &VmFd,
    vcpus: &[VcpuFd],
    state: &SnapshotState,
) -> Result<(), VmError> {
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
