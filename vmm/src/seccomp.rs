//! The VMM's seccomp-BPF allowlist, applied to every thread (TSYNC) before the first KVM_RUN.
//!
//! Once the VM is built, the VMM only needs: KVM_RUN (and KVM_GET_REGS for fault reports),
//! reads/writes on eventfds, sockets, the console log and stdout, epoll, accept4, memory
//! management for the allocator (never executable), futexes, signals for vCPU kicks, and exit.
//!
//! A VMM started with `snapshot_control` may also write snapshots after the filter is in
//! place: it additionally gets the KVM_GET_* ioctls of snapshot capture and the file syscalls
//! of [`crate::snapshot::format::save`] ([`SNAPSHOT_SYSCALLS`]). The engine sets
//! `snapshot_control` only for golden-snapshot creator VMs, which never run user workloads.
//! Restoring needs nothing extra: the memory file is mapped before the filter is installed.

use std::collections::BTreeMap;
use std::convert::TryInto;

use seccompiler::{
    apply_filter_all_threads, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp,
    SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

/// `KVM_RUN` = `_IO(KVMIO, 0x80)`.
pub const KVM_RUN: u64 = 0xae80;

/// `KVM_GET_REGS` = `_IOR(KVMIO, 0x81, struct kvm_regs)`.
pub fn kvm_get_regs() -> u64 {
    const IOC_READ: u64 = 2;
    let size = std::mem::size_of::<kvm_bindings::kvm_regs>() as u64;
    (IOC_READ << 30) | (size << 16) | (0xae << 8) | 0x81
}

/// Errors building or installing the filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// seccompiler rejected the rules.
    #[error("building seccomp filter: {0}")]
    Build(String),
    /// The kernel refused the filter.
    #[error("installing seccomp filter: {0}")]
    Install(String),
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conds).map_err(|e| SeccompError::Build(e.to_string()))
}

fn cond(arg: u8, op: SeccompCmpOp, val: u64) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, val)
        .map_err(|e| SeccompError::Build(e.to_string()))
}

/// Syscalls allowed without argument filtering.
pub const PLAIN_SYSCALLS: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_close,
    libc::SYS_recvfrom,
    libc::SYS_shutdown,
    libc::SYS_accept4,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_ctl,
    libc::SYS_futex,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_brk,
    libc::SYS_madvise,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_sched_yield,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// File syscalls a snapshot save makes (create the directory, write, fsync and rename the
/// files, stat them), allowed only with `snapshot_control`.
pub const SNAPSHOT_SYSCALLS: &[i64] = &[
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_ftruncate,
    libc::SYS_pwrite64,
    libc::SYS_lseek,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
];

fn kvm_ioctl<T>(dir: u32, nr: u32) -> u64 {
    use vmm_sys_util::ioctl::ioctl_expr;
    ioctl_expr(
        dir,
        kvm_bindings::KVMIO,
        nr,
        std::mem::size_of::<T>() as u32,
    ) as u64
}

/// The KVM_GET_* ioctls of snapshot capture (vCPU and VM state), allowed only with
/// `snapshot_control`.
pub fn snapshot_ioctls() -> Vec<u64> {
    use kvm_bindings::*;
    use vmm_sys_util::ioctl::{_IOC_READ, _IOC_WRITE};
    let r = _IOC_READ;
    let rw = _IOC_READ | _IOC_WRITE;
    vec![
        kvm_ioctl::<kvm_cpuid2>(rw, 0x91),     // KVM_GET_CPUID2
        kvm_ioctl::<kvm_mp_state>(r, 0x98),    // KVM_GET_MP_STATE
        kvm_ioctl::<kvm_sregs>(r, 0x83),       // KVM_GET_SREGS
        kvm_ioctl::<kvm_xsave>(r, 0xa4),       // KVM_GET_XSAVE
        kvm_ioctl::<kvm_xcrs>(r, 0xa6),        // KVM_GET_XCRS
        kvm_ioctl::<kvm_debugregs>(r, 0xa1),   // KVM_GET_DEBUGREGS
        kvm_ioctl::<kvm_lapic_state>(r, 0x8e), // KVM_GET_LAPIC
        kvm_ioctl::<kvm_msrs>(rw, 0x88),       // KVM_GET_MSRS
        kvm_ioctl::<kvm_vcpu_events>(r, 0x9f), // KVM_GET_VCPU_EVENTS
        kvm_ioctl::<kvm_irqchip>(rw, 0x62),    // KVM_GET_IRQCHIP
        kvm_ioctl::<kvm_pit_state2>(r, 0x9f),  // KVM_GET_PIT2
        kvm_ioctl::<kvm_clock_data>(r, 0x7c),  // KVM_GET_CLOCK
    ]
}

/// Builds the BPF program; `snapshot` adds [`SNAPSHOT_SYSCALLS`] and [`snapshot_ioctls`].
pub fn build_filter(snapshot: bool) -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &nr in PLAIN_SYSCALLS {
        rules.insert(nr, vec![]);
    }
    let mut ioctls = vec![KVM_RUN, kvm_get_regs()];
    if snapshot {
        for &nr in SNAPSHOT_SYSCALLS {
            rules.insert(nr, vec![]);
        }
        ioctls.extend(snapshot_ioctls());
    }
    rules.insert(
        libc::SYS_ioctl,
        ioctls
            .into_iter()
            .map(|nr| rule(vec![cond(1, SeccompCmpOp::Eq, nr)?]))
            .collect::<Result<Vec<_>, _>>()?,
    );
    // fcntl(F_GETFD) only: std checks descriptors are open when dropping them.
    rules.insert(
        libc::SYS_fcntl,
        vec![rule(vec![cond(
            1,
            SeccompCmpOp::Eq,
            libc::F_GETFD as u64,
        )?])?],
    );
    // send(2) on the vsock muxer's connected Unix streams (std writes them with
    // MSG_NOSIGNAL), never to an explicit address.
    rules.insert(
        libc::SYS_sendto,
        vec![rule(vec![cond(4, SeccompCmpOp::Eq, 0)?])?],
    );
    // Anonymous memory for the allocator, never executable.
    let no_exec = || cond(2, SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64), 0);
    rules.insert(libc::SYS_mmap, vec![rule(vec![no_exec()?])?]);
    rules.insert(libc::SYS_mprotect, vec![rule(vec![no_exec()?])?]);

    let arch: TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| SeccompError::Build(e.to_string()))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        arch,
    )
    .map_err(|e| SeccompError::Build(e.to_string()))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| SeccompError::Build(e.to_string()))
}

/// Installs the filter on every thread of the process (requires no_new_privs); `snapshot`
/// as for [`build_filter`].
pub fn install(snapshot: bool) -> Result<(), SeccompError> {
    let prog = build_filter(snapshot)?;
    apply_filter_all_threads(&prog).map_err(|e| SeccompError::Install(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_builds() {
        let p = build_filter(false).unwrap();
        assert!(!p.is_empty());
        assert_eq!(kvm_get_regs(), 0x8090_ae81);
        let s = build_filter(true).unwrap();
        assert!(s.len() > p.len());
    }

    #[test]
    fn snapshot_ioctl_numbers() {
        let n = snapshot_ioctls();
        // Values from <linux/kvm.h> on x86-64.
        for want in [
            0xc008_ae91u64, // KVM_GET_CPUID2
            0x8004_ae98,    // KVM_GET_MP_STATE
            0x8138_ae83,    // KVM_GET_SREGS
            0x9000_aea4,    // KVM_GET_XSAVE
            0x8188_aea6,    // KVM_GET_XCRS
            0x8080_aea1,    // KVM_GET_DEBUGREGS
            0x8400_ae8e,    // KVM_GET_LAPIC
            0xc008_ae88,    // KVM_GET_MSRS
            0x8040_ae9f,    // KVM_GET_VCPU_EVENTS
            0xc208_ae62,    // KVM_GET_IRQCHIP
            0x8070_ae9f,    // KVM_GET_PIT2
            0x8030_ae7c,    // KVM_GET_CLOCK
        ] {
            assert!(n.contains(&want), "{want:#x} missing");
        }
        // None of them sets state.
        assert!(!n.contains(&KVM_RUN));
    }

    #[test]
    fn file_syscalls_only_with_snapshot_control() {
        for nr in SNAPSHOT_SYSCALLS {
            assert!(!PLAIN_SYSCALLS.contains(nr));
        }
    }

    #[test]
    fn dangerous_syscalls_not_allowed() {
        for nr in [
            libc::SYS_execve,
            libc::SYS_open,
            libc::SYS_openat,
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_clone,
            libc::SYS_fork,
            libc::SYS_ptrace,
            libc::SYS_mount,
        ] {
            assert!(!PLAIN_SYSCALLS.contains(&nr), "{nr} must not be allowed");
        }
    }
}
