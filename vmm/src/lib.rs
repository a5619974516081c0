//! The voidbox virtual machine monitor.
//!
//! It owns one KVM micro-VM per process: guest memory, the 64-bit Linux boot protocol,
//! vCPU threads, the serial console, virtio-mmio devices, the seccomp filter and
//! [`snapshot`]s (taken on request over the [`control`] channel, restored instead of a boot).
//! [`probe`] detects hosts whose KVM interprets guest kernel code.
//!
//! The crate is a library plus the `voidbox-vmm` binary (one process per VM). Everything
//! the guest controls (descriptor rings, packet headers, MMIO accesses) is treated as hostile:
//! a malformed queue marks that device broken and the VMM carries on.

pub mod boot;
pub mod bus;
pub mod config;
pub mod control;
pub mod devices;
pub mod exit;
pub mod logger;
pub mod memory;
pub mod probe;
pub mod process;
pub mod seccomp;
pub mod snapshot;
pub mod status;
pub mod vcpu;
pub mod vm;
