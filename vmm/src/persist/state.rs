//! The state blob of a snapshot: VM, vCPUs and devices, plus the [`SnapshotKey`] a config
//! produces. Decoded from an untrusted file, so [`SnapshotState::validate`] checks everything
//! that does not depend on a built VM before anything is created.

use serde::{Deserialize, Serialize};

use super::format::SnapshotKey;
use super::vcpu::{VcpuCaps, VcpuState};
use super::vm_state::VmState;
use super::PersistError;
use crate::config::{VmConfig, SHARE_SLOTS};
use crate::devices::block::disk_name;
use crate::devices::block::persist::BlockState;
use crate::devices::net::persist::{fmt_mac, NetState};
use crate::devices::p9::persist::P9State;
use crate::devices::serial::persist::SerialDeviceState;
use crate::devices::virtio::mmio::persist::MmioTransportState;
use crate::devices::vsock::persist::VsockBackendState;

/// Device names, in bus order, of a VM built from `cfg` (the key's device set).
pub fn device_names(cfg: &VmConfig) -> Vec<String> {
    let mut d = vec!["serial".to_string(), "i8042".to_string()];
    d.extend(virtio_device_names(cfg).into_iter().map(String::from));
    d
}

/// The virtio-mmio devices of a VM built from `cfg`, in bus order: one `block` per disk
/// (`/dev/vda` first), then `net` (with a network config), then `vsock`, then the
/// [`SHARE_SLOTS`] share slots with `share_slots` (`p9`, bound or not: the binding is not
/// part of the key).
pub fn virtio_device_names(cfg: &VmConfig) -> Vec<&'static str> {
    let mut d = vec!["block"; cfg.disks.len()];
    if cfg.network.is_some() {
        d.push("net");
    }
    if cfg.vsock_uds.is_some() {
        d.push("vsock");
    }
    if cfg.share_slots {
        d.extend([crate::devices::p9::SNAPSHOT_NAME; SHARE_SLOTS]);
    }
    d
}

/// What a snapshot of a VM built from `cfg` is keyed by.
pub fn snapshot_key(cfg: &VmConfig) -> SnapshotKey {
    SnapshotKey {
        memory_size: u64::from(cfg.memory_mb) << 20,
        vcpus: u32::from(cfg.vcpus),
        devices: device_names(cfg),
        image_hash: cfg.image_hash.clone(),
    }
}

/// State of a virtio device behind its transport.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum VirtioDeviceState {
    /// A virtio-blk disk (its size and mode are checked against the reopened file).
    Block(BlockState),
    /// The network device (its queues and MAC; the NAT is new on restore).
    Net(NetState),
    /// The vsock device (its backend; connections are reset on restore).
    Vsock(VsockBackendState),
    /// A share slot (transport side only; the restored VM binds its own directory).
    P9(P9State),
}

impl VirtioDeviceState {
    /// The device name used in the key's device set.
    pub fn name(&self) -> &'static str {
        match self {
            VirtioDeviceState::Block(_) => "block",
            VirtioDeviceState::Net(_) => "net",
            VirtioDeviceState::Vsock(_) => "vsock",
            VirtioDeviceState::P9(_) => crate::devices::p9::SNAPSHOT_NAME,
        }
    }
}

/// One virtio-mmio slot: transport registers and device state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtioSlotState {
    /// The transport.
    pub transport: MmioTransportState,
    /// The device behind it.
    pub device: VirtioDeviceState,
}

/// State of every device with state (the i8042 reset latch has none worth keeping).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicesState {
    /// The UART.
    pub serial: SerialDeviceState,
    /// virtio-mmio devices, in bus order.
    pub virtio: Vec<VirtioSlotState>,
}

/// The whole state blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotState {
    /// VM-level state.
    pub vm: VmState,
    /// One entry per vCPU, in index order.
    pub vcpus: Vec<VcpuState>,
    /// Devices.
    pub devices: DevicesState,
    /// The guest had armed its restore page ([`crate::restore_page`]) when the snapshot was
    /// taken: a restore must fill it with a new secret (a restore grant).
    pub restore_page: bool,
}

impl SnapshotState {
    /// Checks the state against the VM `cfg` describes and this host's `caps`: vCPU count and
    /// order, every vCPU's bounds, VM state, the virtio device list (a network device present
    /// in one and absent in the other is refused), each disk's mode, the guest MAC and the
    /// vsock CID. Device registers (and each disk's size, against its reopened file) are
    /// checked again by each device's own restore, before the device is built.
    pub fn validate(&self, cfg: &VmConfig, caps: &VcpuCaps) -> Result<(), PersistError> {
        if self.vcpus.len() != usize::from(cfg.vcpus) {
            return Err(PersistError::mismatch(
                "vcpu",
                format!(
                    "{} vCPUs in the state, {} configured",
                    self.vcpus.len(),
                    cfg.vcpus
                ),
            ));
        }
        for (i, v) in self.vcpus.iter().enumerate() {
            v.validate(i as u32, caps)?;
        }
        self.vm.validate()?;
        let disks = self
            .devices
            .virtio
            .iter()
            .filter(|s| matches!(s.device, VirtioDeviceState::Block(_)))
            .count();
        if disks != cfg.disks.len() {
            return Err(PersistError::mismatch(
                "block",
                format!(
                    "{disks} disks in the snapshot, {} configured",
                    cfg.disks.len()
                ),
            ));
        }
        let want = virtio_device_names(cfg);
        let have: Vec<&str> = self
            .devices
            .virtio
            .iter()
            .map(|s| s.device.name())
            .collect();
        if want != have {
            return Err(PersistError::mismatch(
                "virtio",
                format!("devices {have:?} in the state, {want:?} configured"),
            ));
        }
        let mut disk_cfgs = cfg.disks.iter().enumerate();
        for slot in &self.devices.virtio {
            match &slot.device {
                VirtioDeviceState::Block(b) => {
                    // The device list matched, so there is a configured disk for each.
                    if let Some((i, d)) = disk_cfgs.next() {
                        if d.read_only != b.read_only {
                            let mode = |ro| if ro { "read-only" } else { "read-write" };
                            return Err(PersistError::mismatch(
                                "block",
                                format!(
                                    "disk {i} ({}, {}) is {} in the snapshot, {} configured",
                                    disk_name(i),
                                    d.path.display(),
                                    mode(b.read_only),
                                    mode(d.read_only)
                                ),
                            ));
                        }
                    }
                }
                VirtioDeviceState::Vsock(b) if b.cid != cfg.vsock_cid => {
                    return Err(PersistError::mismatch(
                        "vsock",
                        format!(
                            "guest CID {} in the state, {} configured",
                            b.cid, cfg.vsock_cid
                        ),
                    ));
                }
                VirtioDeviceState::Vsock(_) | VirtioDeviceState::P9(_) => {}
                VirtioDeviceState::Net(n) => {
                    // The device list matched, so there is a network config.
                    if let Some(net) = &cfg.network {
                        if net.guest_mac != n.mac {
                            return Err(PersistError::mismatch(
                                "net",
                                format!(
                                    "guest MAC {} in the snapshot, {} configured",
                                    fmt_mac(n.mac),
                                    fmt_mac(net.guest_mac)
                                ),
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
