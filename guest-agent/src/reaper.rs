//! The one place that calls `waitpid`: a SIGCHLD-driven reaper thread.
//!
//! As PID 1 (or a subreaper on the host) the agent inherits every orphan of the guest.
//! A single thread owns `waitpid(-1)`, so no exit status is ever "stolen": the exec engine
//! registers a child *while holding the registry lock across the spawn*, which guarantees
//! the registration exists before the reaper can look the pid up. Statuses of registered
//! children are delivered to an [`ExitSlot`] (which wakes pollers through an eventfd);
//! everything else is an orphan and is simply reaped.
//!
//! Exits are first observed with `waitid(WNOWAIT)`, i.e. while the child is still a zombie
//! and its pid (= its process-group id) cannot be reused. That makes "kill the rest of the
//! process group when the leader exits" and the watchdog's group kill race-free: both only
//! signal `-pgid` while the leader is unreaped, under the slot's lock.
//!
//! [`Reaper::start`] blocks SIGCHLD in the calling thread; it must run before any other
//! thread is created so that every thread inherits the blocked mask and the signal is only
//! consumed through the reaper's signalfd.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Normal exit with this code.
    Exited(i32),
    /// Killed by this signal.
    Signaled {
        /// Signal number.
        signal: i32,
        /// Whether a core dump was produced.
        core_dumped: bool,
    },
}

impl ExitStatus {
    fn from_wait(status: libc::c_int) -> Option<ExitStatus> {
        if libc::WIFEXITED(status) {
            Some(ExitStatus::Exited(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(ExitStatus::Signaled {
                signal: libc::WTERMSIG(status),
                core_dumped: libc::WCOREDUMP(status),
            })
        } else {
            None
        }
    }

    /// Shell-style exit code: the code, or 128 + signal.
    pub fn code(self) -> i32 {
        match self {
            ExitStatus::Exited(c) => c,
            ExitStatus::Signaled { signal, .. } => 128 + signal,
        }
    }

    /// The terminating signal, if any.
    pub fn signal(self) -> Option<i32> {
        match self {
            ExitStatus::Exited(_) => None,
            ExitStatus::Signaled { signal, .. } => Some(signal),
        }
    }
}

/// Where the reaper delivers the status of one registered child.
#[derive(Debug)]
pub struct ExitSlot {
    pid: AtomicI32,
    status: Mutex<Option<ExitStatus>>,
    cv: Condvar,
    event: OwnedFd,
    kill_group_on_exit: bool,
    killed: AtomicBool,
}

impl ExitSlot {
    fn new(kill_group_on_exit: bool) -> io::Result<ExitSlot> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ExitSlot {
            pid: AtomicI32::new(0),
            kill_group_on_exit,
            killed: AtomicBool::new(false),
            status: Mutex::new(None),
            cv: Condvar::new(),
            // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
            event: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn deliver(&self, mut guard: MutexGuard<'_, Option<ExitStatus>>, status: ExitStatus) {
        *guard = Some(status);
        drop(guard);
        self.cv.notify_all();
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own eventfd.
        unsafe { libc::write(self.event.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// The status, if the child has been reaped.
    pub fn try_get(&self) -> Option<ExitStatus> {
        *lock(&self.status)
    }

    /// Blocks until the child has been reaped.
    pub fn wait(&self) -> ExitStatus {
        let mut g = lock(&self.status);
        loop {
            if let Some(s) = *g {
                return s;
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The child's pid (also its process-group id).
    pub fn pid(&self) -> libc::pid_t {
        self.pid.load(Ordering::Acquire)
    }

    /// Sends `signal` to the child's whole process group, unless the leader has already
    /// been reaped (then its pgid may be reused and nothing is sent). Returns whether the
    /// signal was sent. Used by the watchdog (SIGKILL on timeout) and PTY close (SIGHUP).
    pub fn signal_group(&self, signal: libc::c_int) -> bool {
        let guard = lock(&self.status);
        let pid = self.pid();
        if guard.is_some() || pid <= 0 {
            return false;
        }
        // SAFETY: the leader is not reaped (we hold the lock the reaper needs), so `-pid`
        // still names the child's process group.
        unsafe { libc::kill(-pid, signal) == 0 }
    }

    /// SIGKILLs the process group because its deadline passed; remembered for
    /// [`ExitSlot::timed_out`]. Returns whether the group was still there to kill.
    pub fn kill_for_timeout(&self) -> bool {
        let guard = lock(&self.status);
        let pid = self.pid();
        if guard.is_some() || pid <= 0 {
            return false;
        }
        self.killed.store(true, Ordering::Release);
        // SAFETY: as in `signal_group`: the leader is unreaped, `-pid` is its group.
        unsafe { libc::kill(-pid, libc::SIGKILL) == 0 }
    }

    /// Whether the watchdog killed the process group.
    pub fn timed_out(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }

    /// An fd that becomes readable once the status is available (for `poll`).
    pub fn event_fd(&self) -> RawFd {
        self.event.as_raw_fd()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Handle to the process-wide reaper.
#[derive(Debug)]
pub struct Reaper {
    waiters: Mutex<HashMap<libc::pid_t, Arc<ExitSlot>>>,
    orphans_reaped: AtomicU64,
}

static REAPER: OnceLock<Reaper> = OnceLock::new();

impl Reaper {
    /// Blocks SIGCHLD in the calling thread and starts the reaper thread (once).
    /// Call from `main` before spawning any other thread.
    pub fn start() -> io::Result<&'static Reaper> {
        if let Some(r) = REAPER.get() {
            return Ok(r);
        }
        // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t; SIGCHLD is a valid signal number.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
        }
        // SAFETY: `set` is initialised; the old mask is not needed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        // SAFETY: `set` is initialised; -1 creates a new signalfd.
        let sfd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
        if sfd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: freshly created descriptor owned by nothing else.
        let sfd = unsafe { OwnedFd::from_raw_fd(sfd) };
        let reaper = REAPER.get_or_init(|| Reaper {
            waiters: Mutex::new(HashMap::new()),
            orphans_reaped: AtomicU64::new(0),
        });
        std::thread::Builder::new()
            .name("reaper".into())
            .stack_size(64 * 1024)
            .spawn(move || reaper.run(sfd))?;
        Ok(reaper)
    }

    /// The running reaper, if started.
    pub fn get() -> Option<&'static Reaper> {
        REAPER.get()
    }

    fn run(&self, sfd: OwnedFd) {
        // SAFETY: signalfd_siginfo is plain data.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        loop {
            self.reap_all();
            // SAFETY: reads at most `size` bytes into `info`, which is that large.
            let n = unsafe {
                libc::read(
                    sfd.as_raw_fd(),
                    (&mut info as *mut libc::signalfd_siginfo).cast(),
                    size,
                )
            };
            if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                // Should never happen; fall back to periodic polling rather than dying.
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }

    /// Reaps every child that has exited (SIGCHLD coalesces, so loop until none is left).
    fn reap_all(&self) {
        loop {
            // SAFETY: siginfo_t is plain data, filled in by waitid.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // Peek first (WNOWAIT): the zombie keeps its pid/pgid reserved meanwhile.
            // SAFETY: `info` is a valid out-pointer.
            let rc = unsafe {
                libc::waitid(
                    libc::P_ALL,
                    0,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            // SAFETY: waitid filled `info` for a child event (si_pid is 0 when none).
            let pid = unsafe { info.si_pid() };
            if rc < 0 || pid <= 0 {
                return; // ECHILD, or children remain but none has exited
            }
            let slot = lock(&self.waiters).remove(&pid);
            let mut status: libc::c_int = 0;
            let Some(slot) = slot else {
                // SAFETY: reaps exactly the child waitid reported; `status` is valid.
                unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                self.orphans_reaped.fetch_add(1, Ordering::Relaxed);
                crate::debug!("reaped orphan {pid}: {:?}", ExitStatus::from_wait(status));
                continue;
            };
            let guard = lock(&slot.status);
            if slot.kill_group_on_exit {
                // SAFETY: `pid` is an unreaped zombie, so its process group id is still its own.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            // SAFETY: reaps exactly the child waitid reported; `status` is a valid pointer.
            let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            // Anything but a clean reap should not happen; report something rather than
            // leave the exec waiting forever.
            let exit = ExitStatus::from_wait(status)
                .filter(|_| reaped == pid)
                .unwrap_or(ExitStatus::Exited(255));
            slot.deliver(guard, exit);
        }
    }

    /// Runs `spawn` (which must create exactly one child and return its pid) with the
    /// registry locked, and registers the child before the lock is released.
    ///
    /// `spawn` returns the pid and a result; a child that was created but failed before
    /// `execve` is still registered (and reaped) but the error is passed through. With
    /// `kill_group_on_exit`, the rest of the child's process group is SIGKILLed when the
    /// leader exits, so an exec's processes never outlive it.
    pub fn spawn_registered<F, T>(
        &self,
        kill_group_on_exit: bool,
        spawn: F,
    ) -> io::Result<(Arc<ExitSlot>, T)>
    where
        F: FnOnce() -> (Option<libc::pid_t>, T),
    {
        let slot = Arc::new(ExitSlot::new(kill_group_on_exit)?);
        let mut waiters = lock(&self.waiters);
        let (pid, result) = spawn();
        if let Some(pid) = pid {
            slot.pid.store(pid, Ordering::Release);
            waiters.insert(pid, Arc::clone(&slot));
        }
        Ok((slot, result))
    }

    /// Number of orphans (unregistered children) reaped so far.
    pub fn orphans_reaped(&self) -> u64 {
        self.orphans_reaped.load(Ordering::Relaxed)
    }
}
