//! The voidbox virtual machine monitor.
//!
//! It owns one KVM micro-VM per process: guest memory, the 64-bit Linux boot protocol,
//! vCPU threads, the serial console, virtio-mmio devices, the seccomp filter and
//! snapshots ([`persist`]: taken on request over the [`control`] channel, restored instead of a
//! boot).
//! [`probe`] detects hosts whose KVM interprets guest kernel code.
//!
//! The crate is a library plus the `voidbox-vmm` binary (one process per VM). Everything
//! the guest controls (descriptor rings, packet headers, MMIO accesses) is treated as hostile:
//! a malformed queue marks that device broken and the VMM carries on.
//!
//! | module | owns |
//! |---|---|
//! | [`entry`] | the VMM process entry point (`voidbox-vmm`, `voidbox __vmm`): config, status, exit codes |
//! | [`config`] | the JSON VM configuration the engine sends |
//! | [`control`] | the control channel: commands after the config line (`snapshot`) |
//! | [`vm`] | building one VM (cold boot or restore, sharing device attachment), running and snapshotting it |
//! | [`vcpu`] | vCPU threads and their exits |
//! | [`boot`] | 64-bit Linux boot: page tables, GDT, boot params, MP table |
//! | [`memory`] | guest memory layout and mapping |
//! | [`bus`], [`exit`] | port/MMIO dispatch and VM exit reasons |
//! | [`devices`] | serial, i8042, virtio-mmio transport and queues, virtio-blk, virtio-net (and its `net` thread running the VM's NAT), vsock, the virtio-9p share slots — each with its `persist` state |
//! | [`persist`] | the snapshot file: format, checksums, vCPU and VM state (devices own theirs) |
//! | [`seccomp`] | the seccomp-BPF filters: one for every thread, plus the net thread's own (NAT sockets) when the VM has network |
//! | [`probe`] | detecting a KVM that interprets guest kernel code |
//! | [`status`], [`logger`] | status lines to the engine (including the NAT's `net_denials`), logging |
//! | [`xstate`] | paravirtual AVX/AVX-512 state switching for the compat guest kernel |

pub mod boot;
pub mod build_id;
pub mod bus;
pub mod config;
pub mod control;
pub mod cpuid;
pub mod devices;
pub mod entry;
pub mod exit;
pub mod logger;
pub mod memory;
pub mod persist;
pub mod probe;
pub mod restore_page;
pub mod seccomp;
pub mod status;
pub mod vcpu;
pub mod vm;
pub mod xstate;
