//! Snapshot and restore.
//!
//! [`format`] is the on-disk container (versioned, checksummed, bounded; verified completely
//! before anything is restored). [`state`] is the blob inside it: [`vm_state`] (irqchip, PIT,
//! clock), one [`vcpu`] state per vCPU, and the devices, each of which owns a `persist` module
//! with its serializable state. [`raw`] serializes KVM structs as exact-length bytes.
//! [`PersistError`] is what validating or restoring untrusted state can fail with.

pub mod format;
pub mod raw;
pub mod state;
pub mod vcpu;
pub mod vm_state;

/// Restoring device state failed: the state does not fit the device being restored into.
/// Device state comes from snapshot files, which are untrusted input.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PersistError {
    /// A field has a value the device cannot hold.
    #[error("{device}: invalid snapshot state: {what}")]
    Invalid {
        /// Device name.
        device: &'static str,
        /// What is wrong.
        what: String,
    },
    /// The snapshot was taken of a differently configured device.
    #[error("{device}: snapshot state does not match the device: {what}")]
    Mismatch {
        /// Device name.
        device: &'static str,
        /// What differs.
        what: String,
    },
}

impl PersistError {
    pub(crate) fn invalid(device: &'static str, what: impl Into<String>) -> Self {
        Self::Invalid {
            device,
            what: what.into(),
        }
    }

    pub(crate) fn mismatch(device: &'static str, what: impl Into<String>) -> Self {
        Self::Mismatch {
            device,
            what: what.into(),
        }
    }
}
