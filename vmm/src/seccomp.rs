//! The VMM's seccomp-BPF allowlist, applied to every thread (TSYNC) before the first KVM_RUN.
//!
//! Once the VM is built, the VMM only needs: KVM_RUN (and KVM_GET_REGS for fault reports),
//! KVM_GET_XSAVE/KVM_SET_XSAVE for the compat kernel's extended-state requests,
//! reads/writes on eventfds, sockets, the console log and stdout, epoll, accept4, memory
//! management for the allocator (never executable), futexes, signals for vCPU kicks (`tgkill`
//! to this process only), positioned writes and truncation of the console log (its fd only;
//! the log is capped, see [`crate::devices::serial::ConsoleLog`]), disk I/O (`preadv` on
//! every disk's fd, `pwritev` and `fdatasync` on read-write disks' fds only: the vCPU threads
//! run virtio-blk requests, see [`crate::devices::block`]), and exit.
//!
//! **A VM with a bound share** serves 9P on its vCPU threads ([`crate::devices::p9`]), as the
//! `p9` crate does it: descriptor-relative lookups and opens (`openat`, also through
//! `/proc/self/fd`), `newfstatat`/`fstatfs`, `pread64`, directory reads (`getdents64`,
//! `lseek`, and `fcntl` `F_DUPFD_CLOEXEC`/`F_GETFL`/`F_SETFD` for `fdopendir`),
//! `readlinkat`, `fsync`/`fdatasync` ([`SHARE_READ_SYSCALLS`]). With only read-only shares,
//! `openat` may not ask for write access, creation, truncation or append; a read-write share
//! adds `pwrite64`, `ftruncate`, `mkdirat`, `unlinkat`, `renameat`, `linkat`, `fchmodat` and
//! `utimensat` on any descriptor ([`SHARE_WRITE_SYSCALLS`]). Never `fchownat` (ownership never
//! changes), `symlinkat` or `mknodat` (refused by the server).
//!
//! A VMM started with `snapshot_control` may also write snapshots after the filter is in
//! place: it additionally gets the KVM_GET_* ioctls of snapshot capture and the file syscalls
//! of [`crate::persist::format::save`] ([`SNAPSHOT_SYSCALLS`]). The engine sets
//! `snapshot_control` only for golden-snapshot creator VMs, which never run user workloads.
//! Restoring needs nothing extra: the memory file is mapped before the filter is installed.
//! A layered snapshot also reads `/proc/self/pagemap`, opened during the restore (before the
//! filter), with `lseek` and `read`, which the snapshot filter already allows.
//!
//! **A VM with a network device** runs its NAT on the `net` thread, which needs sockets: only
//! that thread's filter grows, by what the NAT needs: `socket(2)` for exactly the families,
//! types and protocols of [`net_socket_args`], [`NET_SYSCALLS`], and `getsockopt` for
//! `SOL_SOCKET`/`SO_ERROR` only. The NAT's sockets are all connected, so it sends and receives
//! with `send`/`recv` (`sendto`/`recvfrom` without an address, which the base filter allows
//! for the vsock streams already) and closes them with `shutdown`/`close`. Seccomp filters only
//! ever narrow, so the filter installed on every thread (TSYNC) is then the union (base +
//! NAT) plus what narrowing takes (`seccomp(SECCOMP_SET_MODE_FILTER, 0)` and
//! `prctl(PR_SET_NO_NEW_PRIVS)`), and each thread at once stacks its own filter on top
//! ([`ThreadSeccomp::narrow`]): the base filter on the main, vCPU, vsock and control threads
//! (so they end with exactly the filter of a VM without network), the NAT filter on the net
//! thread. Neither allows `seccomp` or `prctl`, so narrowing happens once. A VM without
//! network installs the base filter alone, as before.

use std::collections::BTreeMap;
use std::convert::TryInto;
use std::sync::OnceLock;

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

/// `arg == val` on the low 32 bits (an `int` argument: pid, fd).
fn cond_int(arg: u8, val: i32) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        u64::from(val as u32),
    )
    .map_err(|e| SeccompError::Build(e.to_string()))
}

/// A disk's backing file descriptor, as the filter sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskFd {
    /// The descriptor.
    pub fd: i32,
    /// Read-write disk: `pwritev` and `fdatasync` are allowed on it too.
    pub writable: bool,
}

/// What the VM's share slots need.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareAccess {
    /// At least one share is bound: [`SHARE_READ_SYSCALLS`].
    pub bound: bool,
    /// At least one bound share is read-write: [`SHARE_WRITE_SYSCALLS`] and writable opens.
    pub writable: bool,
}

/// Syscalls a bound share needs (reading the tree), without argument filtering;
/// `openat` and `fcntl` are argument-filtered on top.
pub const SHARE_READ_SYSCALLS: &[i64] = &[
    libc::SYS_newfstatat,
    libc::SYS_fstatfs,
    libc::SYS_pread64,
    libc::SYS_getdents64,
    libc::SYS_lseek,
    libc::SYS_readlinkat,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
];

/// Syscalls a read-write share adds, without argument filtering.
pub const SHARE_WRITE_SYSCALLS: &[i64] = &[
    libc::SYS_pwrite64,
    libc::SYS_ftruncate,
    libc::SYS_mkdirat,
    libc::SYS_unlinkat,
    libc::SYS_renameat,
    libc::SYS_linkat,
    libc::SYS_fchmodat,
    libc::SYS_utimensat,
];

/// `fcntl` commands besides `F_GETFD` that a bound share's directory reads make
/// (`fdopendir` on a duplicate of the directory's descriptor).
const SHARE_FCNTL_CMDS: [i32; 3] = [libc::F_DUPFD_CLOEXEC, libc::F_GETFL, libc::F_SETFD];

/// Adds what the share slots need.
fn add_share_rules(
    rules: &mut BTreeMap<i64, Vec<SeccompRule>>,
    access: ShareAccess,
) -> Result<(), SeccompError> {
    if !access.bound {
        return Ok(());
    }
    for &nr in SHARE_READ_SYSCALLS {
        merge(rules, nr, vec![]);
    }
    if access.writable {
        for &nr in SHARE_WRITE_SYSCALLS {
            merge(rules, nr, vec![]);
        }
        merge(rules, libc::SYS_openat, vec![]);
    } else {
        let writes = (libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND) as u64;
        merge(
            rules,
            libc::SYS_openat,
            vec![rule(vec![cond(2, SeccompCmpOp::MaskedEq(writes), 0)?])?],
        );
    }
    let fcntl = SHARE_FCNTL_CMDS
        .iter()
        .map(|&c| rule(vec![cond(1, SeccompCmpOp::Eq, c as u64)?]))
        .collect::<Result<Vec<_>, _>>()?;
    merge(rules, libc::SYS_fcntl, fcntl);
    Ok(())
}

/// What a filter is built for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterParams {
    /// Allow what taking a snapshot needs ([`SNAPSHOT_SYSCALLS`], [`snapshot_ioctls`]).
    pub snapshot: bool,
    /// This process's pid: `tgkill` may only signal threads of this thread group.
    pub pid: i32,
    /// The console log's fd: `pwrite64` and `ftruncate` are allowed on it (and, without
    /// `snapshot`, on nothing else).
    pub console_fd: Option<i32>,
    /// The disks: `preadv` is allowed on each, `pwritev` and `fdatasync` on the writable
    /// ones (without `snapshot`, on nothing else).
    pub disks: Vec<DiskFd>,
    /// The VM has a network device: the net thread gets the NAT's syscalls (see the module
    /// documentation).
    pub network: bool,
    /// What the bound shares need (nothing when none is bound).
    pub shares: ShareAccess,
}

impl FilterParams {
    /// Parameters for the calling process (no disks).
    pub fn for_this_process(snapshot: bool, console_fd: Option<i32>) -> Self {
        // SAFETY: getpid has no preconditions and cannot fail.
        let pid = unsafe { libc::getpid() };
        Self {
            snapshot,
            pid,
            console_fd,
            disks: Vec::new(),
            network: false,
            shares: ShareAccess::default(),
        }
    }

    /// The same parameters with `disks`.
    pub fn with_disks(mut self, disks: &[DiskFd]) -> Self {
        self.disks = disks.to_vec();
        self
    }

    /// The same parameters for a VM with (or without) a network device.
    pub fn with_network(mut self, network: bool) -> Self {
        self.network = network;
        self
    }

    /// The same parameters for a VM whose shares need `shares`.
    pub fn with_shares(mut self, shares: ShareAccess) -> Self {
        self.shares = shares;
        self
    }
}

/// Allows syscall `nr` when its first argument is one of `fds` (kept unconditional when it
/// already is).
fn allow_on_fds(
    rules: &mut BTreeMap<i64, Vec<SeccompRule>>,
    nr: i64,
    fds: impl IntoIterator<Item = i32>,
) -> Result<(), SeccompError> {
    let fd_rules = fds
        .into_iter()
        .map(|fd| rule(vec![cond_int(0, fd)?]))
        .collect::<Result<Vec<_>, _>>()?;
    if fd_rules.is_empty() {
        return Ok(());
    }
    match rules.get_mut(&nr) {
        // An empty rule list already allows every call.
        Some(existing) if existing.is_empty() => {}
        Some(existing) => existing.extend(fd_rules),
        None => {
            rules.insert(nr, fd_rules);
        }
    }
    Ok(())
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

/// `KVM_GET_XSAVE` and `KVM_SET_XSAVE`, which [`crate::xstate`] needs on every vCPU thread.
pub fn xstate_ioctls() -> Vec<u64> {
    use kvm_bindings::kvm_xsave;
    use vmm_sys_util::ioctl::{_IOC_READ, _IOC_WRITE};
    vec![
        kvm_ioctl::<kvm_xsave>(_IOC_READ, 0xa4),  // KVM_GET_XSAVE
        kvm_ioctl::<kvm_xsave>(_IOC_WRITE, 0xa5), // KVM_SET_XSAVE
    ]
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

/// Syscalls allowed on the net thread only, without argument filtering: `connect` on the
/// NAT's sockets (created at run time, so their descriptors are not known when the filter is
/// built; a non-blocking connect is also re-issued to learn its state), and `poll`/`ppoll`,
/// where the thread waits. `socket(2)` ([`net_socket_args`]) and `getsockopt` are
/// argument-filtered. (`accept4`, for published ports, is in [`PLAIN_SYSCALLS`]: the vsock
/// listener needs it on every thread.)
pub const NET_SYSCALLS: &[i64] = &[libc::SYS_connect, libc::SYS_poll, libc::SYS_ppoll];

/// `(domain, type, protocol)` of every `socket(2)` call the net thread may make, all
/// non-blocking and close-on-exec (as `voidbox_net` creates them): TCP over IPv4 (guest
/// connections), UDP over IPv4 (guest flows, DNS upstreams) and IPv6 (DNS upstreams), ICMP
/// echo ("ping") sockets over IPv4, and Unix stream sockets (protocol 0) for connections to a
/// workflow service's socket (`NatConfig::services`). The NAT's listeners (published ports
/// and Unix sockets) are bound and listening before the filter is installed.
pub fn net_socket_args() -> Vec<(i32, i32, i32)> {
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    vec![
        (libc::AF_INET, libc::SOCK_STREAM | flags, libc::IPPROTO_TCP),
        (libc::AF_INET, libc::SOCK_DGRAM | flags, libc::IPPROTO_UDP),
        (libc::AF_INET6, libc::SOCK_DGRAM | flags, libc::IPPROTO_UDP),
        (libc::AF_INET, libc::SOCK_DGRAM | flags, libc::IPPROTO_ICMP),
        (libc::AF_UNIX, libc::SOCK_STREAM | flags, 0),
    ]
}

/// `SECCOMP_SET_MODE_FILTER`, the `seccomp(2)` operation that stacks a filter.
const SECCOMP_SET_MODE_FILTER: u64 = 1;

/// Adds `new` to the rules of `nr` (an empty list means "unconditionally allowed", on either
/// side).
fn merge(rules: &mut BTreeMap<i64, Vec<SeccompRule>>, nr: i64, new: Vec<SeccompRule>) {
    match rules.get_mut(&nr) {
        Some(existing) if existing.is_empty() => {}
        Some(existing) if new.is_empty() => existing.clear(),
        Some(existing) => existing.extend(new),
        None => {
            rules.insert(nr, new);
        }
    }
}

/// Adds what the NAT needs on the net thread.
fn add_net_rules(rules: &mut BTreeMap<i64, Vec<SeccompRule>>) -> Result<(), SeccompError> {
    for &nr in NET_SYSCALLS {
        merge(rules, nr, vec![]);
    }
    let socket = net_socket_args()
        .into_iter()
        .map(|(domain, ty, proto)| {
            rule(vec![
                cond_int(0, domain)?,
                cond_int(1, ty)?,
                cond_int(2, proto)?,
            ])
        })
        .collect::<Result<Vec<_>, _>>()?;
    merge(rules, libc::SYS_socket, socket);
    // The outcome of a non-blocking connect.
    merge(
        rules,
        libc::SYS_getsockopt,
        vec![rule(vec![
            cond_int(1, libc::SOL_SOCKET)?,
            cond_int(2, libc::SO_ERROR)?,
        ])?],
    );
    Ok(())
}

/// Adds what stacking a thread's own filter needs (seccompiler's `apply_filter`).
fn add_narrowing_rules(rules: &mut BTreeMap<i64, Vec<SeccompRule>>) -> Result<(), SeccompError> {
    merge(
        rules,
        libc::SYS_seccomp,
        vec![rule(vec![
            cond(0, SeccompCmpOp::Eq, SECCOMP_SET_MODE_FILTER)?,
            cond(1, SeccompCmpOp::Eq, 0)?,
        ])?],
    );
    merge(
        rules,
        libc::SYS_prctl,
        vec![rule(vec![cond_int(0, libc::PR_SET_NO_NEW_PRIVS)?])?],
    );
    Ok(())
}

/// Which filter a thread ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterKind {
    /// The base filter: every thread of a VM without network; every thread but the net
    /// thread of a VM with network.
    Base,
    /// The net thread's: base + the NAT's syscalls.
    Net,
    /// What TSYNC installs on every thread of a VM with network before each narrows: base +
    /// NAT + `seccomp`/`prctl` for narrowing. Never the last filter of a thread.
    Process,
}

/// Builds the base BPF program for `p` (without the NAT's syscalls, whatever
/// `p.network` says).
pub fn build_filter(p: &FilterParams) -> Result<BpfProgram, SeccompError> {
    build(p, FilterKind::Base)
}

/// Builds the BPF program of `kind` for `p`.
pub fn build(p: &FilterParams, kind: FilterKind) -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &nr in PLAIN_SYSCALLS {
        rules.insert(nr, vec![]);
    }
    let mut ioctls = vec![KVM_RUN, kvm_get_regs()];
    // The paravirtual extended-state requests of the compat guest kernel (crate::xstate).
    ioctls.extend(xstate_ioctls());
    if p.snapshot {
        for &nr in SNAPSHOT_SYSCALLS {
            rules.insert(nr, vec![]);
        }
        ioctls.extend(snapshot_ioctls());
    } else if let Some(fd) = p.console_fd {
        // The console log is written at explicit offsets and cut down when it grows too big.
        for nr in [libc::SYS_pwrite64, libc::SYS_ftruncate] {
            rules.insert(nr, vec![rule(vec![cond_int(0, fd)?])?]);
        }
    }
    // Disk requests run on the vCPU threads: vectored positioned I/O straight into guest
    // memory, and flushes; writes only to read-write disks.
    allow_on_fds(&mut rules, libc::SYS_preadv, p.disks.iter().map(|d| d.fd))?;
    let writable = || p.disks.iter().filter(|d| d.writable).map(|d| d.fd);
    allow_on_fds(&mut rules, libc::SYS_pwritev, writable())?;
    allow_on_fds(&mut rules, libc::SYS_fdatasync, writable())?;
    // Signals (vCPU kicks, abort) only to threads of this process: tgkill(tgid == pid, …).
    rules.insert(libc::SYS_tgkill, vec![rule(vec![cond_int(0, p.pid)?])?]);
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
    // 9P requests on bound shares run on the vCPU threads.
    add_share_rules(&mut rules, p.shares)?;
    match kind {
        FilterKind::Base => {}
        FilterKind::Net => add_net_rules(&mut rules)?,
        FilterKind::Process => {
            add_net_rules(&mut rules)?;
            add_narrowing_rules(&mut rules)?;
        }
    }

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

/// The per-thread filters of a VM with network, handed from [`install`] (main thread) to
/// the other threads, each of which calls [`ThreadSeccomp::narrow`] once it passed the start
/// barrier. Empty (narrowing does nothing) for a VM without network.
#[derive(Default)]
pub struct ThreadSeccomp {
    filters: OnceLock<(BpfProgram, BpfProgram)>,
}

impl ThreadSeccomp {
    /// No per-thread filters (yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// Stacks the filter of `kind` ([`FilterKind::Base`] or [`FilterKind::Net`]) on the
    /// calling thread, when [`install`] left per-thread filters; otherwise does nothing.
    pub fn narrow(&self, kind: FilterKind) -> Result<(), SeccompError> {
        let Some((base, net)) = self.filters.get() else {
            return Ok(());
        };
        let prog = match kind {
            FilterKind::Base => base,
            FilterKind::Net => net,
            FilterKind::Process => {
                return Err(SeccompError::Install(
                    "the process filter is not a thread's own".into(),
                ))
            }
        };
        seccompiler::apply_filter(prog).map_err(|e| SeccompError::Install(e.to_string()))
    }
}

/// Installs the filter on every thread of the calling process (requires no_new_privs), built
/// from `p` (made by [`FilterParams::for_this_process`]). With `p.network`, installs the
/// process filter, narrows the calling (main) thread to the base filter and leaves the base
/// and net filters in `threads` for the others to narrow to.
pub fn install(p: &FilterParams, threads: &ThreadSeccomp) -> Result<(), SeccompError> {
    if !p.network {
        let prog = build_filter(p)?;
        return apply_filter_all_threads(&prog).map_err(|e| SeccompError::Install(e.to_string()));
    }
    let process = build(p, FilterKind::Process)?;
    let own = (build_filter(p)?, build(p, FilterKind::Net)?);
    apply_filter_all_threads(&process).map_err(|e| SeccompError::Install(e.to_string()))?;
    if threads.filters.set(own).is_err() {
        return Err(SeccompError::Install("installed twice".into()));
    }
    threads.narrow(FilterKind::Base)
}

#[cfg(test)]
mod tests;
