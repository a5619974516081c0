//! Stopping a running attempt from another thread: the scheduler (fail-fast, pipeline
//! timeout, signals) and the per-node host deadline both go through a [`NodeControl`], which
//! SIGKILLs the attempt's registered VMM so a blocking `exec` returns at once.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why an attempt was stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Cancelled (fail-fast, pipeline timeout, signal).
    Cancelled,
    /// Its own deadline passed.
    TimedOut,
    /// A service whose dependents are all done: stopping it is how it ends.
    ServiceDone,
    /// A service that did not become ready within its `ready_timeout_secs`.
    NotReady,
}

/// Where a service's readiness goes: the scheduler's channel and the node's index.
pub type ReadySink = (usize, tokio::sync::mpsc::UnboundedSender<(usize, Vec<u8>)>);

#[derive(Debug, Default)]
struct State {
    stopped: Option<StopReason>,
    pid: Option<u32>,
    finished: bool,
    ready: Option<ReadySink>,
    /// What a stop from outside tells the node (its report's error), when not the run's.
    why: Option<String>,
}

/// Shared stop handle of one attempt.
#[derive(Debug, Clone, Default)]
pub struct NodeControl {
    inner: Arc<(Mutex<State>, Condvar)>,
}

impl NodeControl {
    /// A fresh handle.
    pub fn new() -> NodeControl {
        NodeControl::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A handle whose [`ready`](Self::ready) reaches the scheduler (a service's attempt).
    pub fn with_ready(sink: ReadySink) -> NodeControl {
        let c = NodeControl::default();
        c.lock().ready = Some(sink);
        c
    }

    /// A service became ready with `output` (what its dependents get as input): told to
    /// the scheduler once; later calls, or a handle without a sink, do nothing.
    pub fn ready(&self, output: Vec<u8>) {
        if let Some((index, tx)) = self.lock().ready.take() {
            let _ = tx.send((index, output));
        }
    }

    /// Stops the attempt: records the reason (the first one wins) and kills its VMM.
    pub fn stop(&self, reason: StopReason) {
        let mut s = self.lock();
        if s.finished {
            return;
        }
        s.stopped.get_or_insert(reason);
        if let Some(pid) = s.pid {
            kill(pid);
        }
        self.inner.1.notify_all();
    }

    /// [`stop`](Self::stop), with the words the node's report gives as its error.
    pub fn stop_because(&self, reason: StopReason, why: String) {
        {
            let mut s = self.lock();
            if s.finished || s.stopped.is_some() {
                return;
            }
            s.why = Some(why);
        }
        self.stop(reason);
    }

    /// The words given to [`stop_because`](Self::stop_because), if any.
    pub fn why(&self) -> Option<String> {
        self.lock().why.clone()
    }

    /// Why the attempt was stopped, if it was.
    pub fn stopped(&self) -> Option<StopReason> {
        self.lock().stopped
    }

    /// Registers the VMM to kill on [`stop`](Self::stop). Returns `false` (and registers
    /// nothing) when the attempt was already stopped: the caller tears the VM down itself.
    pub fn register_pid(&self, pid: u32) -> bool {
        let mut s = self.lock();
        if s.stopped.is_some() {
            return false;
        }
        s.pid = Some(pid);
        true
    }

    /// Forgets the VMM (call before the sandbox is dropped, so its pid is never reused).
    pub fn clear_pid(&self) {
        self.lock().pid = None;
    }

    /// Marks the attempt finished: later stops are no-ops, a deadline thread ends.
    pub fn finish(&self) {
        let mut s = self.lock();
        s.finished = true;
        s.pid = None;
        self.inner.1.notify_all();
    }

    /// Blocks until stopped or `timeout` passes (fake executors and tests "sleep" here).
    pub fn wait_stopped(&self, timeout: Duration) -> Option<StopReason> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            if s.stopped.is_some() || s.finished {
                return s.stopped;
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            s = self
                .inner
                .1
                .wait_timeout(s, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Starts a host-side deadline: after `after`, the attempt is stopped as timed out
    /// unless it finished (or was stopped) first.
    pub fn arm_deadline(&self, after: Duration) {
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("voidbox-deadline".into())
            .spawn(move || {
                if me.wait_stopped(after).is_none() && !me.lock().finished {
                    me.stop(StopReason::TimedOut);
                }
            });
    }
}

/// SIGKILL to one pid (errors such as "already gone" are ignored).
pub fn kill(pid: u32) {
    if let Some(p) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

/// Kills every VMM child of this process (`voidbox __vmm …`, or `$VOIDBOX_VMM`), including
/// ones still booting whose pid no attempt has registered yet. Used by the CLI on
/// fail-fast, pipeline timeout and signals, where every running VM must go.
pub fn kill_vmm_children() -> usize {
    let me = std::process::id();
    let vmm_env = std::env::var_os(crate::sandbox::vmm_process::VMM_ENV);
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat.get(i + 2..))
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(me) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_vmm = args
            .iter()
            .any(|a| *a == crate::sandbox::VMM_SUBCOMMAND.as_bytes())
            || vmm_env
                .as_ref()
                .is_some_and(|v| args.first().is_some_and(|a0| *a0 == v.as_encoded_bytes()));
        if is_vmm {
            kill(pid);
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_reason_wins_and_finish_blocks_later_stops() {
        let c = NodeControl::new();
        assert_eq!(c.stopped(), None);
        c.stop(StopReason::TimedOut);
        c.stop(StopReason::Cancelled);
        assert_eq!(c.stopped(), Some(StopReason::TimedOut));
        assert!(!c.register_pid(1));
        let d = NodeControl::new();
        d.finish();
        d.stop(StopReason::Cancelled);
        assert_eq!(d.stopped(), None);
    }

    #[test]
    fn deadline_stops_a_waiting_attempt() {
        let c = NodeControl::new();
        c.arm_deadline(Duration::from_millis(30));
        let t0 = Instant::now();
        assert_eq!(
            c.wait_stopped(Duration::from_secs(5)),
            Some(StopReason::TimedOut)
        );
        assert!(t0.elapsed() < Duration::from_secs(2));
    }
}
