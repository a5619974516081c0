//! Emulated devices: the 8250 serial console, the i8042 reset port, virtio-mmio, virtio-blk,
//! virtio-net (backed by the VM's user-mode NAT), vsock and the virtio-9p share slots.

pub mod block;
pub mod i8042;
pub mod net;
pub mod p9;
pub mod serial;
pub mod virtio;
pub mod vsock;
