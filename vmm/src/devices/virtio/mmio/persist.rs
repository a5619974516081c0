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
mod tests;
