use super::*;

fn params(snapshot: bool) -> FilterParams {
    FilterParams::for_this_process(snapshot, Some(2))
}

#[test]
fn filter_builds() {
    let p = build_filter(&params(false)).unwrap();
    assert!(!p.is_empty());
    assert_eq!(kvm_get_regs(), 0x8090_ae81);
    let s = build_filter(&params(true)).unwrap();
    assert!(s.len() > p.len());
}

/// Forks a child that installs `prog` and runs `body` (raw syscalls only: the child of a
/// multi-threaded process must not allocate), then `_exit(0)`. Returns the wait status.
fn run_filtered(prog: &BpfProgram, body: impl Fn()) -> libc::c_int {
    // SAFETY: the child only makes raw syscalls (prctl, seccomp, those of `body`, _exit)
    // and never returns into the test harness; the parent only waits for it.
    unsafe {
        let child = libc::fork();
        assert!(child >= 0, "fork failed");
        if child == 0 {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || seccompiler::apply_filter(prog).is_err()
            {
                libc::_exit(99);
            }
            body();
            libc::_exit(0);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(child, &mut status, 0), child);
        status
    }
}

/// `tgkill(tgid, tid, 0)`: checks the target exists, delivers nothing.
fn tgkill0(tgid: i64, tid: i64) {
    // SAFETY: signal 0 delivers no signal; the call has no other effect.
    unsafe { libc::syscall(libc::SYS_tgkill, tgid, tid, 0) };
}

fn own_pid() -> i64 {
    // SAFETY: getpid has no preconditions.
    i64::from(unsafe { libc::getpid() })
}

fn pwrite1(fd: i32) {
    // SAFETY: writes one byte from a static buffer to an fd the test owns.
    unsafe { libc::pwrite(fd, b"x".as_ptr().cast(), 1, 0) };
}

fn truncate0(fd: i32) {
    // SAFETY: truncates a file the test owns.
    unsafe { libc::ftruncate(fd, 0) };
}

fn killed_by_sigsys(status: libc::c_int) -> bool {
    libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS
}

fn exited_ok(status: libc::c_int) -> bool {
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

#[test]
fn tgkill_only_to_the_vmm_process() {
    // The filter is built for this (the parent's) pid; the forked child runs under it, so
    // the parent stands for "the VMM" and the child's own pid for "another process".
    let parent = FilterParams::for_this_process(false, None);
    let prog = build_filter(&parent).unwrap();
    let vmm = i64::from(parent.pid);
    let s = run_filtered(&prog, || tgkill0(vmm, vmm));
    assert!(exited_ok(s), "tgkill to the VMM's own pid refused: {s:#x}");
    let s = run_filtered(&prog, || tgkill0(own_pid(), own_pid()));
    assert!(killed_by_sigsys(s), "tgkill to another pid allowed: {s:#x}");
    // Upper bits of the pid argument do not sneak another pid past the check.
    let s = run_filtered(&prog, || tgkill0(own_pid() | (1 << 40), own_pid()));
    assert!(killed_by_sigsys(s), "{s:#x}");
}

#[test]
fn console_fd_is_the_only_pwrite_and_ftruncate_target() {
    use std::os::unix::io::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let console = std::fs::File::create(dir.path().join("console")).unwrap();
    let other = std::fs::File::create(dir.path().join("other")).unwrap();
    let (fd, other_fd) = (console.as_raw_fd(), other.as_raw_fd());
    let prog = build_filter(&FilterParams::for_this_process(false, Some(fd))).unwrap();
    let s = run_filtered(&prog, || {
        pwrite1(fd);
        truncate0(fd);
    });
    assert!(exited_ok(s), "{s:#x}");
    for f in [pwrite1 as fn(i32), truncate0] {
        let s = run_filtered(&prog, || f(other_fd));
        assert!(killed_by_sigsys(s), "{s:#x}");
    }
    // Without a console fd neither is allowed at all.
    let prog = build_filter(&FilterParams::for_this_process(false, None)).unwrap();
    let s = run_filtered(&prog, || pwrite1(fd));
    assert!(killed_by_sigsys(s), "{s:#x}");
}

fn preadv1(fd: i32) {
    let mut b = [0u8; 1];
    let iov = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: reads one byte into a local buffer described by a valid iovec.
    unsafe { libc::preadv(fd, &iov, 1, 0) };
}

fn pwritev1(fd: i32) {
    let b = [b'x'];
    let iov = libc::iovec {
        iov_base: b.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    // SAFETY: writes one byte from a local buffer to a file the test owns.
    unsafe { libc::pwritev(fd, &iov, 1, 0) };
}

fn fdatasync(fd: i32) {
    // SAFETY: syncs a file the test owns.
    unsafe { libc::fdatasync(fd) };
}

#[test]
fn disk_io_only_on_disk_fds_and_writes_only_on_writable_ones() {
    use std::os::unix::io::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let file = |n: &str| {
        let p = dir.path().join(n);
        std::fs::write(&p, [0u8; 512]).unwrap();
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap()
    };
    let (ro, rw, other) = (file("ro"), file("rw"), file("other"));
    let (ro, rw, other) = (ro.as_raw_fd(), rw.as_raw_fd(), other.as_raw_fd());
    let disks = [
        DiskFd {
            fd: ro,
            writable: false,
        },
        DiskFd {
            fd: rw,
            writable: true,
        },
    ];
    let prog =
        build_filter(&FilterParams::for_this_process(false, None).with_disks(&disks)).unwrap();
    let s = run_filtered(&prog, || {
        preadv1(ro);
        preadv1(rw);
        pwritev1(rw);
        fdatasync(rw);
    });
    assert!(exited_ok(s), "{s:#x}");
    for (f, fd) in [
        (preadv1 as fn(i32), other),
        (pwritev1, ro),
        (pwritev1, other),
        (fdatasync, ro),
        (fdatasync, other),
        (pwrite1, rw),
    ] {
        let s = run_filtered(&prog, || f(fd));
        assert!(killed_by_sigsys(s), "fd {fd}: {s:#x}");
    }
    // Without disks none of them is allowed; with snapshot_control fdatasync stays
    // unconditional (snapshot files are synced) and disk reads still work.
    let prog = build_filter(&FilterParams::for_this_process(false, None)).unwrap();
    let s = run_filtered(&prog, || preadv1(ro));
    assert!(killed_by_sigsys(s), "{s:#x}");
    let prog =
        build_filter(&FilterParams::for_this_process(true, None).with_disks(&disks)).unwrap();
    let s = run_filtered(&prog, || {
        fdatasync(other);
        preadv1(ro);
    });
    assert!(exited_ok(s), "{s:#x}");
}

fn socket_call(domain: i32, ty: i32, proto: i32) {
    // SAFETY: creates (and closes) a socket; no memory is passed.
    unsafe {
        let fd = libc::socket(domain, ty, proto);
        if fd >= 0 {
            libc::close(fd);
        }
    }
}

fn getsockopt_call(level: i32, name: i32) {
    let mut v = 0i32;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: getsockopt on an invalid fd into a local int; fails with EBADF.
    unsafe { libc::getsockopt(-1, level, name, (&mut v as *mut i32).cast(), &mut len) };
}

fn connect_call() {
    // SAFETY: connect on an invalid fd with a null address fails with EBADF; the filter
    // decides before the kernel looks at the arguments.
    unsafe { libc::connect(-1, std::ptr::null(), 0) };
}

/// Like [`run_filtered`], stacking `progs` in order.
fn run_stacked(progs: &[&BpfProgram], body: impl Fn()) -> libc::c_int {
    // SAFETY: as in run_filtered: raw syscalls only in the child, which never returns.
    unsafe {
        let child = libc::fork();
        assert!(child >= 0, "fork failed");
        if child == 0 {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                libc::_exit(99);
            }
            for p in progs {
                if seccompiler::apply_filter(p).is_err() {
                    libc::_exit(98);
                }
            }
            body();
            libc::_exit(0);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(child, &mut status, 0), child);
        status
    }
}

fn net_params() -> FilterParams {
    FilterParams::for_this_process(false, Some(2)).with_network(true)
}

#[test]
fn only_the_net_filter_has_the_nats_sockets() {
    let net = build(&net_params(), FilterKind::Net).unwrap();
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    for (d, t, p) in net_socket_args() {
        let s = run_filtered(&net, || socket_call(d, t, p));
        assert!(exited_ok(s), "socket({d}, {t:#x}, {p}) refused: {s:#x}");
    }
    let s = run_filtered(&net, || {
        connect_call();
        getsockopt_call(libc::SOL_SOCKET, libc::SO_ERROR);
    });
    assert!(exited_ok(s), "{s:#x}");
    for (level, name) in [
        (libc::SOL_SOCKET, libc::SO_RCVBUF),
        (libc::IPPROTO_TCP, libc::SO_ERROR),
    ] {
        let s = run_filtered(&net, || getsockopt_call(level, name));
        assert!(killed_by_sigsys(s), "getsockopt({level}, {name}): {s:#x}");
    }
    for (d, t, p) in [
        (libc::AF_UNIX, libc::SOCK_DGRAM | flags, 0),
        (libc::AF_UNIX, libc::SOCK_STREAM, 0),
        (libc::AF_UNIX, libc::SOCK_SEQPACKET | flags, 0),
        (libc::AF_NETLINK, libc::SOCK_DGRAM | flags, 0),
        (libc::AF_PACKET, libc::SOCK_DGRAM | flags, 0),
        (libc::AF_INET, libc::SOCK_RAW | flags, libc::IPPROTO_ICMP),
        (libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_TCP),
        (
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        ),
        (libc::AF_INET, libc::SOCK_STREAM | flags, 0),
        (libc::AF_INET, libc::SOCK_STREAM | flags, libc::IPPROTO_ICMP),
        (libc::AF_INET, libc::SOCK_DGRAM | flags, libc::IPPROTO_RAW),
        (libc::AF_INET6, libc::SOCK_STREAM | flags, libc::IPPROTO_TCP),
        (
            libc::AF_INET6,
            libc::SOCK_DGRAM | flags,
            libc::IPPROTO_ICMPV6,
        ),
    ] {
        let s = run_filtered(&net, || socket_call(d, t, p));
        assert!(
            killed_by_sigsys(s),
            "socket({d}, {t:#x}, {p}) allowed: {s:#x}"
        );
    }
    // The base filter has none of it, and is the same with or without network.
    let base = build_filter(&net_params()).unwrap();
    assert_eq!(base, build_filter(&params(false)).unwrap());
    let (d, t, p) = net_socket_args()[0];
    let s = run_filtered(&base, || socket_call(d, t, p));
    assert!(killed_by_sigsys(s), "{s:#x}");
    let s = run_filtered(&base, connect_call);
    assert!(killed_by_sigsys(s), "{s:#x}");
    // Neither thread filter may stack another one.
    for prog in [&base, &net] {
        let s = run_stacked(&[prog, prog], || {});
        assert!(libc::WIFSIGNALED(s) || libc::WEXITSTATUS(s) != 0, "{s:#x}");
    }
}

#[test]
fn threads_narrow_the_process_filter_to_their_own() {
    let p = net_params();
    let process = build(&p, FilterKind::Process).unwrap();
    let base = build_filter(&p).unwrap();
    let net = build(&p, FilterKind::Net).unwrap();
    let (d, t, pr) = net_socket_args()[1];
    // Under the process filter alone a socket is allowed (the net thread needs it)...
    let s = run_stacked(&[&process], || socket_call(d, t, pr));
    assert!(exited_ok(s), "{s:#x}");
    // ...a thread narrowed to the base filter is killed for it, the net thread is not.
    let s = run_stacked(&[&process, &base], || socket_call(d, t, pr));
    assert!(killed_by_sigsys(s), "{s:#x}");
    let s = run_stacked(&[&process, &net], || socket_call(d, t, pr));
    assert!(exited_ok(s), "{s:#x}");
    // Narrowed threads cannot stack more filters; the process filter cannot widen.
    let s = run_stacked(&[&process, &net], || {
        // SAFETY: prctl with constant arguments; expected to be killed.
        unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    });
    assert!(killed_by_sigsys(s), "{s:#x}");
    let s = run_stacked(&[&process], || {
        // SAFETY: prctl with constant arguments; another option than NO_NEW_PRIVS.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    });
    assert!(killed_by_sigsys(s), "{s:#x}");
    // The base filter's other argument checks survive the union: tgkill elsewhere is
    // still refused on the net thread.
    let s = run_stacked(&[&process, &net], || tgkill0(own_pid(), own_pid()));
    assert!(killed_by_sigsys(s), "{s:#x}");
    // Without network there is no per-thread filter to hand out.
    let t = ThreadSeccomp::new();
    t.narrow(FilterKind::Base).unwrap();
    t.narrow(FilterKind::Net).unwrap();
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

fn openat_flags(flags: i32) {
    // SAFETY: opens /dev/null (a static NUL-terminated path) and closes what it got.
    unsafe {
        let fd = libc::openat(libc::AT_FDCWD, c"/dev/null".as_ptr(), flags);
        if fd >= 0 {
            libc::close(fd);
        }
    }
}

fn mkdirat_tmp() {
    // SAFETY: a mkdirat of a relative name under /proc (it fails; only the filter matters).
    unsafe { libc::mkdirat(libc::AT_FDCWD, c"/proc/voidbox-test".as_ptr(), 0o700) };
}

#[test]
fn shares_open_the_file_syscalls_they_need_and_no_more() {
    let ro = ShareAccess {
        bound: true,
        writable: false,
    };
    let rw = ShareAccess {
        bound: true,
        writable: true,
    };
    let params = |a| FilterParams::for_this_process(false, None).with_shares(a);
    // Without a bound share: no open at all.
    let none = build_filter(&params(ShareAccess::default())).unwrap();
    let s = run_filtered(&none, || openat_flags(libc::O_RDONLY));
    assert!(killed_by_sigsys(s), "{s:#x}");
    // Read-only shares: read-only opens (O_PATH, directories) but no write access,
    // creation, truncation or append, and no tree changes.
    let prog = build_filter(&params(ro)).unwrap();
    let s = run_filtered(&prog, || {
        openat_flags(libc::O_RDONLY | libc::O_CLOEXEC);
        openat_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC);
    });
    assert!(exited_ok(s), "{s:#x}");
    for flags in [
        libc::O_WRONLY,
        libc::O_RDWR,
        libc::O_ACCMODE,
        libc::O_RDONLY | libc::O_CREAT,
        libc::O_RDONLY | libc::O_TRUNC,
        libc::O_RDONLY | libc::O_APPEND,
    ] {
        let s = run_filtered(&prog, || openat_flags(flags));
        assert!(killed_by_sigsys(s), "flags {flags:#o}: {s:#x}");
    }
    let s = run_filtered(&prog, mkdirat_tmp);
    assert!(killed_by_sigsys(s), "{s:#x}");
    // A read-write share: writable opens and tree changes.
    let prog = build_filter(&params(rw)).unwrap();
    let s = run_filtered(&prog, || {
        openat_flags(libc::O_RDWR);
        mkdirat_tmp();
    });
    assert!(exited_ok(s), "{s:#x}");
    // Never chown, symlink or mknod.
    for nr in [libc::SYS_fchownat, libc::SYS_symlinkat, libc::SYS_mknodat] {
        assert!(!SHARE_READ_SYSCALLS.contains(&nr) && !SHARE_WRITE_SYSCALLS.contains(&nr));
    }
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
        libc::SYS_preadv,
        libc::SYS_pwritev,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_fdatasync,
    ] {
        assert!(!PLAIN_SYSCALLS.contains(&nr), "{nr} must not be allowed");
    }
}
