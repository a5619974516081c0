//! Snapshot and restore.
//!
//! [`format`] is the on-disk container (versioned, checksummed, bounded; verified completely
//! before anything is restored). Each device owns a `persist` module with its serializable
//! state; [`PersistError`] is what restoring that state into a device can fail with.

pub mod format;

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
