//! The voidbox OCI client.
//!
//! It will own pulling images from OCI registries (anonymous and authenticated), platform
//! selection, a digest-verified content-addressed cache, layer unpacking with whiteouts and
//! path-escape protection, and turning a rootfs into an ext4 disk image. Nothing is
//! implemented here yet.
