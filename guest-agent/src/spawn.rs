//! Low-level process creation: `clone(CLONE_VM | CLONE_VFORK)` + raw syscalls + `execve`.
//!
//! This is how glibc's `posix_spawn` works, extended with what it cannot do: dropping to
//! uid/gid 1000 (with an empty supplementary group list), setting rlimits, a new session
//! (own process group, optional controlling tty), `no_new_privs`, and joining the node's
//! image root (a mount namespace, see [`crate::rootfs`]). Sharing the address
//! space avoids copying the agent's page tables and the copy-on-write faults that follow a
//! `fork` — both expensive when the guest kernel is interpreted.
//!
//! The child runs on a private stack inside the parent's memory while the calling thread
//! is suspended, so it must not allocate, lock or touch thread-local state beyond `errno`:
//! everything it needs is prepared in a [`SpawnPlan`] beforehand and it issues raw system
//! calls only (glibc's `setuid` & co. would broadcast to the parent's threads).

use std::ffi::{CString, NulError};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

/// Identity every child is dropped to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credentials {
    /// User id (1000 in the guest).
    pub uid: u32,
    /// Group id (1000 in the guest).
    pub gid: u32,
}

/// The sandbox user of the guest.
pub const SANDBOX: Credentials = Credentials {
    uid: 1000,
    gid: 1000,
};

/// Which failure stage the child reports back (for error messages).
const STAGES: [&str; 12] = [
    "ok",
    "resetting signals",
    "creating a session",
    "setting the controlling terminal",
    "redirecting stdio",
    "setting resource limits",
    "changing directory",
    "dropping supplementary groups",
    "setting the group id",
    "setting the user id",
    "executing the program",
    "entering the image root",
];

/// Everything the child needs, prepared before the clone.
pub struct SpawnPlan {
    path: CString,
    _args: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    _env: Vec<CString>,
    envp: Vec<*const libc::c_char>,
    cwd: Option<CString>,
    /// Fds to install as 0, 1, 2.
    stdio: [RawFd; 3],
    /// Make `stdio[0]` the controlling terminal of the new session.
    controlling_tty: bool,
    creds: Option<Credentials>,
    rlimits: Vec<(libc::c_int, u64)>,
    /// Mount namespace to join first (the node's image root).
    mntns: Option<RawFd>,
    /// Written by the child on failure: (stage, errno).
    failure: (usize, i32),
}

// SAFETY: the raw pointers point into the CStrings owned by the same plan, which are never
// mutated; moving the plan between threads keeps them valid.
unsafe impl Send for SpawnPlan {}

impl SpawnPlan {
    /// Prepares a plan for executing `path` with `args` (argv[0] included) and `env`
    /// (`KEY=VALUE` strings). Fails when a string contains a NUL byte.
    pub fn new(
        path: &Path,
        args: &[String],
        env: &[String],
        cwd: Option<&Path>,
        stdio: [RawFd; 3],
    ) -> Result<SpawnPlan, NulError> {
        let path = CString::new(path.as_os_str().as_bytes())?;
        let args = args
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let env = env
            .iter()
            .map(|e| CString::new(e.as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let cwd = cwd
            .map(|c| CString::new(c.as_os_str().as_bytes()))
            .transpose()?;
        let argv = args
            .iter()
            .map(|a| a.as_ptr())
            .chain([ptr::null()])
            .collect();
        let envp = env
            .iter()
            .map(|e| e.as_ptr())
            .chain([ptr::null()])
            .collect();
        Ok(SpawnPlan {
            path,
            _args: args,
            argv,
            _env: env,
            envp,
            cwd,
            stdio,
            controlling_tty: false,
            creds: None,
            rlimits: Vec::new(),
            mntns: None,
            failure: (0, 0),
        })
    }

    /// Drops the child to these credentials (`None` keeps the agent's).
    pub fn credentials(&mut self, creds: Option<Credentials>) -> &mut Self {
        self.creds = creds;
        self
    }

    /// Sets soft and hard limit of `resource` in the child.
    pub fn rlimit(&mut self, resource: libc::c_int, value: u64) -> &mut Self {
        self.rlimits.push((resource, value));
        self
    }

    /// Makes the child join this mount namespace (an fd of `/proc/…/ns/mnt`) before it
    /// changes directory: its root and working directory become the namespace's `/`. The
    /// fd must stay open until [`SpawnPlan::spawn`] returns.
    pub fn mount_namespace(&mut self, fd: Option<RawFd>) -> &mut Self {
        self.mntns = fd;
        self
    }

    /// Makes stdin (a pty slave) the controlling terminal of the child's session.
    pub fn controlling_tty(&mut self, yes: bool) -> &mut Self {
        self.controlling_tty = yes;
        self
    }

    /// Creates the child and returns its pid once it has called `execve` successfully.
    /// The child is the leader of a new session and process group (pgid = pid).
    ///
    /// If the child fails before `execve` it exits with status 127 (it still has to be
    /// reaped) and the error is returned together with its pid: `Err((Some(pid), e))`.
    pub fn spawn(&mut self) -> Result<libc::pid_t, (Option<libc::pid_t>, io::Error)> {
        const STACK: usize = 64 * 1024;
        let mut stack = vec![0u8; STACK];
        // The stack grows down; hand over its 16-byte aligned top.
        let top = (stack.as_mut_ptr() as usize + STACK) & !15;
        self.failure = (0, 0);
        // SAFETY: `child_main` only reads `self` and writes `self.failure`; the calling
        // thread is suspended (CLONE_VFORK) until the child has exec'ed or exited, so the
        // plan and the stack outlive every use. SIGCHLD makes it a normal child for waitpid.
        let pid = unsafe {
            libc::clone(
                child_main,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                (self as *mut SpawnPlan).cast(),
            )
        };
        drop(stack);
        if pid < 0 {
            return Err((None, io::Error::last_os_error()));
        }
        let (stage, errno) = self.failure;
        if stage != 0 {
            let what = STAGES.get(stage).copied().unwrap_or("spawning");
            let err = io::Error::from_raw_os_error(errno);
            return Err((
                Some(pid),
                io::Error::new(err.kind(), format!("{what}: {err}")),
            ));
        }
        Ok(pid)
    }
}

/// The child side. Only raw system calls; returns only on failure.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `SpawnPlan` passed by `spawn`, alive while the parent waits.
    let plan = unsafe { &mut *(arg as *mut SpawnPlan) };
    // SAFETY: all calls below are plain system calls on values prepared in `plan`.
    let stage = unsafe { child_setup(plan) };
    plan.failure = (stage, errno());
    // SAFETY: terminates the child immediately without running any parent state teardown.
    unsafe { libc::_exit(127) }
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Performs the child setup; returns the failing stage (index into STAGES).
///
/// # Safety
/// Must only be called in the cloned child created by [`SpawnPlan::spawn`].
unsafe fn child_setup(plan: &SpawnPlan) -> usize {
    // 1. Signals: default dispositions for the ones Rust/agent ignore, then unblock all
    //    (the agent blocks SIGCHLD; masks and SIG_IGN survive execve).
    for sig in [
        libc::SIGPIPE,
        libc::SIGCHLD,
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGTERM,
    ] {
        // SAFETY: SIG_DFL is always a valid disposition; the handler table is private to
        // the child (no CLONE_SIGHAND).
        if unsafe { libc::signal(sig, libc::SIG_DFL) } == libc::SIG_ERR {
            return 1;
        }
    }
    // 2. New session => new process group whose id is our pid.
    // SAFETY: raw syscall without arguments.
    if unsafe { libc::syscall(libc::SYS_setsid) } < 0 {
        return 2;
    }
    // 3. Controlling terminal.
    // SAFETY: ioctl on an fd we were given; arg 0 = do not steal.
    if plan.controlling_tty && unsafe { libc::ioctl(plan.stdio[0], libc::TIOCSCTTY, 0) } < 0 {
        return 3;
    }
    // 4. stdio. Sources are >= 3 (the agent keeps 0..2 open), but handle equality anyway.
    for (target, &src) in plan.stdio.iter().enumerate() {
        let target = target as RawFd;
        let rc = if src == target {
            // SAFETY: clears FD_CLOEXEC on an fd we own.
            unsafe { libc::syscall(libc::SYS_fcntl, src, libc::F_SETFD, 0) }
        } else {
            // SAFETY: dup3 onto 0..2 without O_CLOEXEC.
            unsafe { libc::syscall(libc::SYS_dup3, src, target, 0) }
        };
        if rc < 0 {
            return 4;
        }
    }
    // Everything else the agent holds is O_CLOEXEC already; make sure of it (ignore
    // ENOSYS on old kernels).
    // SAFETY: marks fds >= 3 close-on-exec in the child's private fd table.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    // 5. Resource limits (soft = hard so the child cannot raise them).
    for &(resource, value) in &plan.rlimits {
        let lim = libc::rlimit64 {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: prlimit64 on ourselves (pid 0) with a valid new limit and no old-limit out.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_prlimit64,
                0,
                resource,
                &lim as *const libc::rlimit64,
                ptr::null_mut::<libc::rlimit64>(),
            )
        };
        if rc < 0 {
            return 5;
        }
    }
    // 6. The image root: join its mount namespace, which also moves our root and working
    //    directory to its `/` (the cwd below is a path inside it). Our fs_struct is our own
    //    (no CLONE_FS), as setns requires.
    if let Some(fd) = plan.mntns {
        // SAFETY: setns on an fd the plan's owner keeps open across the spawn.
        if unsafe { libc::syscall(libc::SYS_setns, fd, libc::CLONE_NEWNS) } < 0 {
            return 11;
        }
    }
    // 7. Working directory (before dropping privileges: it is checked again by execve).
    if let Some(cwd) = &plan.cwd {
        // SAFETY: `cwd` is a valid NUL-terminated string.
        if unsafe { libc::syscall(libc::SYS_chdir, cwd.as_ptr()) } < 0 {
            return 6;
        }
    }
    // 8. Identity: groups, gid, uid — in that order, via raw syscalls.
    if let Some(c) = plan.creds {
        // SAFETY: setgroups(0, NULL) clears the supplementary groups.
        if unsafe { libc::syscall(libc::SYS_setgroups, 0, ptr::null::<libc::gid_t>()) } < 0 {
            return 7;
        }
        // SAFETY: plain syscall with integer arguments.
        if unsafe { libc::syscall(libc::SYS_setresgid, c.gid, c.gid, c.gid) } < 0 {
            return 8;
        }
        // SAFETY: plain syscall with integer arguments.
        if unsafe { libc::syscall(libc::SYS_setresuid, c.uid, c.uid, c.uid) } < 0 {
            return 9;
        }
        // No set-uid escalation back out of the sandbox user.
        // SAFETY: prctl with integer arguments.
        unsafe { libc::syscall(libc::SYS_prctl, libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    }
    // 9. Unblock every signal, then exec.
    let empty: u64 = 0;
    // SAFETY: kernel sigset of 8 bytes, no old-mask out-pointer.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            ptr::null_mut::<u64>(),
            8,
        )
    };
    // SAFETY: path/argv/envp are NUL-terminated and the arrays NULL-terminated.
    unsafe {
        libc::syscall(
            libc::SYS_execve,
            plan.path.as_ptr(),
            plan.argv.as_ptr(),
            plan.envp.as_ptr(),
        )
    };
    10
}
