//! The `net` thread: owns the VM's [`Nat`] and all queue processing of the network device.
//!
//! It waits in `poll(2)` on the two kick eventfds (the guest posted frames to transmit, or
//! receive buffers) and on the NAT's host sockets ([`Nat::poll_fds`]), for at most
//! [`Nat::poll_timeout`] (and [`STOP_CHECK`], to notice the stop flag). Each round
//! ([`NetThread::round`]): drain the transmit queue into [`Nat::from_guest`], let the NAT
//! service its sockets and timers ([`Nat::poll`]), then fill receive buffers from
//! [`Nat::to_guest`] while the guest has buffers — frames it has no buffer for stay queued in
//! the NAT, whose bounded queue then stops reading host sockets (backpressure). After each
//! round the NAT's denial counts go to the [`DenialReporter`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use voidbox_net::Nat;

use super::report::DenialReporter;
use super::{lock, NetBackend, NetKicks, QUEUE_SIZE};

/// Longest sleep between two looks at the stop flag.
pub const STOP_CHECK: Duration = Duration::from_millis(250);
/// Most transmit chains taken per round (then the NAT and the receive side get a turn).
pub const TX_BATCH: usize = QUEUE_SIZE as usize;

/// The net thread's state.
pub struct NetThread {
    backend: Arc<Mutex<NetBackend>>,
    nat: Nat,
    kicks: NetKicks,
    stop: Arc<AtomicBool>,
}

/// Start-up of the net thread, before its seccomp filter is in place: seeds the thread's std
/// hash keys (which otherwise cost a `getrandom` on first use, a syscall the filter lacks).
pub fn prepare_thread() {
    let _ = std::collections::hash_map::RandomState::new();
}

/// `d` in whole milliseconds, rounded up (a timer due in 0.3 ms must not become a busy loop),
/// capped to what `poll(2)` takes.
fn poll_ms(d: Duration) -> i32 {
    i32::try_from(d.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
}

impl NetThread {
    /// A thread body serving `backend` with `nat`, woken by `kicks`, stopping when `stop`
    /// is set.
    pub fn new(
        backend: Arc<Mutex<NetBackend>>,
        nat: Nat,
        kicks: NetKicks,
        stop: Arc<AtomicBool>,
    ) -> Self {
        Self {
            backend,
            nat,
            kicks,
            stop,
        }
    }

    /// The NAT (for tests and diagnostics).
    pub fn nat(&self) -> &Nat {
        &self.nat
    }

    /// Runs until the stop flag is set, offering the denial and inbound counts to `reporter`.
    pub fn run(mut self, reporter: Option<Arc<DenialReporter>>) {
        let mut interest: Vec<(std::os::fd::RawFd, i16)> = Vec::new();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut report_due: Option<Instant> = None;
        let mut offered_total = 0u64;
        let mut offered_inbound = 0u64;
        // The first round runs at once: a restored guest may have posted buffers already.
        let mut more = true;
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let mut wait = if more { Duration::ZERO } else { STOP_CHECK };
            if let Some(t) = self.nat.poll_timeout(now) {
                wait = wait.min(t);
            }
            if let Some(t) = report_due {
                wait = wait.min(t.saturating_duration_since(now));
            }
            interest.clear();
            self.nat.poll_fds(&mut interest);
            fds.clear();
            for evt in [&self.kicks.tx, &self.kicks.rx] {
                fds.push(libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(evt.as_ref()),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            fds.extend(interest.iter().map(|&(fd, events)| libc::pollfd {
                fd,
                events,
                revents: 0,
            }));
            // SAFETY: `fds` is a live, initialised array of `fds.len()` pollfd structs that
            // poll only reads and writes within; the descriptors belong to this VMM.
            let n =
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, poll_ms(wait)) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    log::error!("net thread: poll failed: {e}");
                    std::thread::sleep(STOP_CHECK);
                }
            }
            for (evt, pfd) in [&self.kicks.tx, &self.kicks.rx].into_iter().zip(&fds) {
                if pfd.revents & libc::POLLIN != 0 {
                    // A failed read only means there was nothing to consume.
                    let _ = evt.read();
                }
            }
            let now = Instant::now();
            more = self.round(now);
            if let Some(r) = &reporter {
                // The list is built only when a count changed or a held-back line is due.
                let total = self.nat.denial_total();
                let inbound = self.nat.stats().inbound_accepted;
                if total != offered_total
                    || inbound != offered_inbound
                    || report_due.is_some_and(|t| now >= t)
                {
                    offered_total = total;
                    offered_inbound = inbound;
                    report_due = r.offer(self.nat.denials(), inbound, now);
                }
            }
        }
    }

    /// One round: transmit queue → NAT, NAT sockets and timers, NAT → receive buffers.
    /// Returns true when transmit chains are still waiting (run again without sleeping).
    pub fn round(&mut self, now: Instant) -> bool {
        let batch = lock(&self.backend).drain_tx(TX_BATCH);
        for frame in &batch.frames {
            self.nat.from_guest(frame, now);
        }
        self.nat.poll(now);
        let nat = &mut self.nat;
        lock(&self.backend).fill_rx(|| nat.to_guest(now));
        batch.more
    }
}
