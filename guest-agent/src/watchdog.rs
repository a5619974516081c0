//! One timer thread that SIGKILLs the process group of every exec that outlives its
//! deadline, independently of whether the exec's own thread is blocked (e.g. on a host
//! that stopped reading output).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Instant;

use crate::reaper::ExitSlot;

struct Entry {
    deadline: Instant,
    seq: u64,
    slot: Weak<ExitSlot>,
    /// `true`: a timeout (reported as `timed_out`); `false`: a plain kill (PTY hang-up).
    timeout: bool,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.deadline, self.seq) == (o.deadline, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.deadline, self.seq).cmp(&(o.deadline, o.seq))
    }
}

#[derive(Default)]
struct State {
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
}

struct Watchdog {
    state: Mutex<State>,
    cv: Condvar,
}

static WATCHDOG: OnceLock<Arc<Watchdog>> = OnceLock::new();

fn get() -> &'static Arc<Watchdog> {
    WATCHDOG.get_or_init(|| {
        let w = Arc::new(Watchdog {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        let w2 = Arc::clone(&w);
        let spawned = std::thread::Builder::new()
            .name("watchdog".into())
            .stack_size(64 * 1024)
            .spawn(move || w2.run());
        if let Err(e) = spawned {
            crate::log!("cannot start the watchdog thread: {e}");
        }
        w
    })
}

/// Arms the watchdog: at `deadline` the slot's process group gets SIGKILL unless the
/// leader has been reaped by then (dropping the slot also disarms it). The exec then
/// reports `timed_out`.
pub fn arm(slot: &Arc<ExitSlot>, deadline: Instant) {
    schedule(slot, deadline, true);
}

/// Like [`arm`], but the kill is not a timeout (used after a PTY hang-up's SIGHUP).
pub fn kill_at(slot: &Arc<ExitSlot>, deadline: Instant) {
    schedule(slot, deadline, false);
}

fn schedule(slot: &Arc<ExitSlot>, deadline: Instant, timeout: bool) {
    let w = get();
    let mut st = w.state.lock().unwrap_or_else(|e| e.into_inner());
    st.seq += 1;
    let seq = st.seq;
    st.heap.push(Reverse(Entry {
        deadline,
        seq,
        slot: Arc::downgrade(slot),
        timeout,
    }));
    drop(st);
    w.cv.notify_one();
}

impl Watchdog {
    fn run(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            while st.heap.peek().is_some_and(|Reverse(e)| e.deadline <= now) {
                if let Some(Reverse(e)) = st.heap.pop() {
                    if let Some(slot) = e.slot.upgrade() {
                        let killed = if e.timeout {
                            slot.kill_for_timeout()
                        } else {
                            slot.signal_group(libc::SIGKILL)
                        };
                        if killed {
                            crate::debug!("watchdog: killed process group {}", slot.pid());
                        }
                    }
                }
            }
            // Drop entries whose exec is gone so the heap stays small.
            if st.heap.len() > 64 {
                st.heap.retain(|Reverse(e)| e.slot.strong_count() > 0);
            }
            st = match st.heap.peek() {
                Some(Reverse(e)) => {
                    let wait = e.deadline.saturating_duration_since(now);
                    self.cv
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}
