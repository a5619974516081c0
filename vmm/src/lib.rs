//! The voidbox virtual machine monitor.
//!
//! It owns one KVM micro-VM per process: guest memory, the 64-bit Linux boot protocol,
//! vCPU threads, the serial console, virtio-mmio devices, the seccomp filter and (later)
//! snapshot/restore. [`probe`] detects hosts whose KVM interprets guest kernel code.

pub mod probe;
