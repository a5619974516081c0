//! The VMM's seccomp-BPF allowlist, applied to every thread (TSYNC) before the first KVM_RUN.
//!
//! Once the VM is built, the VMM only needs: KVM_RUN (and KVM_GET_REGS for fault reports),
//! reads/writes on eventfds, sockets, the console log and stdout, epoll, accept4, memory
//! management for the allocator (never executable), futexes, signals for vCPU kicks, and exit.

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

/// Builds the BPF program.
pub fn build_filter() -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &nr in PLAIN_SYSCALLS {
        rules.insert(nr, vec![]);
    }
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, SeccompCmpOp::Eq, KVM_RUN)?])?,
            rule(vec![cond(1, SeccompCmpOp::Eq, kvm_get_regs())?])?,
        ],
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

/// Installs the filter on every thread of the process (requires no_new_privs).
pub fn install() -> Result<(), SeccompError> {
    let prog = build_filter()?;
    apply_filter_all_threads(&prog).map_err(|e| SeccompError::Install(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_builds() {
        let p = build_filter().unwrap();
        assert!(!p.is_empty());
        assert_eq!(kvm_get_regs(), 0x8090_ae81);
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
