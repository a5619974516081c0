//! The VMM's JSON status lines (see `vmm/README.md`), parsed defensively.

use std::io::{BufRead, Read};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// Longest status line accepted (a console tail of 64 lines fits easily).
const MAX_LINE: u64 = 256 * 1024;
/// Most events kept per VM.
const MAX_EVENTS: usize = 256;
/// Shortest time between two `net_denials` lines of the VMM: it holds back a change that
/// comes sooner, and sends it when the interval has passed.
pub const NET_DENIALS_INTERVAL: Duration = Duration::from_millis(250);
/// Longest [`StatusLog::settle_net_denials`] waits in all.
const NET_DENIALS_SETTLE_MAX: Duration = Duration::from_millis(600);

/// One status event of the VMM.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum VmmEvent {
    /// The VMM read its config (after closing stray fds).
    Started {
        /// Its pid.
        pid: u32,
    },
    /// KVM, memory, devices and kernel are set up.
    Configured {
        /// Setup time in µs.
        setup_us: u64,
    },
    /// vCPUs released (seccomp installed); `ms` since VMM start.
    Booting {
        /// Milliseconds since VMM process start.
        ms: u64,
    },
    /// A guest vsock listener accepted the first host connection.
    GuestReady {
        /// Milliseconds since VMM process start.
        ms: u64,
    },
    /// "Kernel panic" appeared on the console.
    KernelPanicSeen,
    /// The VM was restored from a snapshot (instead of booting).
    Restored {
        /// Restore time (state, devices, vCPUs) in µs.
        #[serde(default)]
        restore_us: u64,
        /// Snapshot verification (checksums) in µs.
        #[serde(default)]
        verify_us: u64,
    },
    /// A snapshot requested over the control channel was written; the guest resumed.
    SnapshotSaved {
        /// How long the vCPUs were paused, µs.
        #[serde(default)]
        pause_us: u64,
        /// Request to files written, ms.
        #[serde(default)]
        total_ms: u64,
        /// Size of the state blob.
        #[serde(default)]
        state_bytes: u64,
        /// Guest memory size.
        #[serde(default)]
        memory_bytes: u64,
        /// Bytes allocated on disk by the snapshot files.
        #[serde(default)]
        disk_bytes: u64,
        /// For a layered snapshot: the pages in its memory diff.
        #[serde(default)]
        diff_pages: Option<u64>,
    },
    /// A requested snapshot could not be written; the guest resumed.
    SnapshotFailed {
        /// Why.
        #[serde(default)]
        detail: String,
    },
    /// A virtio device saw a malformed queue.
    DeviceBroken {
        /// Device name.
        #[serde(default)]
        device: String,
        /// Why.
        #[serde(default)]
        reason: String,
    },
    /// The NAT's denials so far, cumulative (each line replaces the previous one).
    NetDenials {
        /// Every denied destination with its count.
        #[serde(default)]
        denials: Vec<voidbox_net::Denial>,
        /// Connections accepted on the NAT's published ports and sockets so far.
        #[serde(default)]
        inbound: u64,
    },
    /// The VMM is exiting.
    Exited {
        /// Reason keyword.
        #[serde(default)]
        reason: String,
        /// Exit code.
        #[serde(default)]
        code: i32,
        /// Detail text.
        #[serde(default)]
        detail: Option<String>,
        /// Last console lines.
        #[serde(default)]
        console_tail: Vec<String>,
    },
    /// An event this engine does not know.
    #[serde(other)]
    Unknown,
}

/// An event with the host time it was read.
#[derive(Debug, Clone)]
pub struct TimedEvent {
    /// When the engine read it.
    pub at: Instant,
    /// The event.
    pub event: VmmEvent,
}

/// Events seen so far, shared with the reader thread.
#[derive(Debug, Default)]
pub struct StatusLog {
    state: Mutex<LogState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct LogState {
    events: Vec<TimedEvent>,
    /// The latest `net_denials` (kept apart: the VMM repeats it as counts grow).
    net_denials: Vec<voidbox_net::Denial>,
    /// The inbound count of that line.
    net_inbound: u64,
    /// When it was read.
    net_denials_at: Option<Instant>,
    closed: bool,
}

impl StatusLog {
    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an event (beyond [`MAX_EVENTS`] only `exited` is kept). A `net_denials`
    /// event replaces the previous denials instead of being appended.
    pub fn push(&self, event: VmmEvent) {
        let mut s = self.lock();
        if let VmmEvent::NetDenials { denials, inbound } = event {
            s.net_denials = denials;
            s.net_inbound = inbound;
            s.net_denials_at = Some(Instant::now());
            self.changed.notify_all();
            return;
        }
        if s.events.len() < MAX_EVENTS || matches!(event, VmmEvent::Exited { .. }) {
            s.events.push(TimedEvent {
                at: Instant::now(),
                event,
            });
        }
        self.changed.notify_all();
    }

    /// Marks the status stream closed (the VMM is gone or closed it).
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// A copy of every event so far.
    pub fn events(&self) -> Vec<TimedEvent> {
        self.lock().events.clone()
    }

    /// The NAT's denials as the VMM last reported them (empty when it reported none).
    pub fn net_denials(&self) -> Vec<voidbox_net::Denial> {
        self.lock().net_denials.clone()
    }

    /// Connections accepted on the NAT's published ports and sockets, as the VMM last
    /// reported them (0 when it reported none).
    pub fn net_inbound(&self) -> u64 {
        self.lock().net_inbound
    }

    /// Waits until a `net_denials` line the VMM may still be holding back has arrived: until
    /// [`NET_DENIALS_INTERVAL`] (and a margin) after the last one, at most 600 ms in all; at
    /// once when no line came recently (the VMM sends a change at once when its last line
    /// is older than the interval). Call before killing a VMM whose denials are reported.
    pub fn settle_net_denials(&self) {
        let start = Instant::now();
        let mut s = self.lock();
        loop {
            let Some(at) = s.net_denials_at else { return };
            let due = (at + NET_DENIALS_INTERVAL + Duration::from_millis(50))
                .min(start + NET_DENIALS_SETTLE_MAX);
            let now = Instant::now();
            if s.closed || now >= due {
                return;
            }
            s = match self.changed.wait_timeout(s, due - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// The `exited` event, if any.
    pub fn exited(&self) -> Option<VmmEvent> {
        self.lock()
            .events
            .iter()
            .rev()
            .find(|e| matches!(e.event, VmmEvent::Exited { .. }))
            .map(|e| e.event.clone())
    }

    /// Waits for the first event at index `from` or later that `pick` selects; `None`
    /// when the stream closes or `timeout` passes first.
    pub fn wait_for<T>(
        &self,
        from: usize,
        timeout: Duration,
        mut pick: impl FnMut(&VmmEvent) -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        let mut seen = from;
        loop {
            for e in s.events.iter().skip(seen) {
                if let Some(v) = pick(&e.event) {
                    return Some(v);
                }
            }
            seen = s.events.len().max(from);
            let now = Instant::now();
            if s.closed || now >= deadline {
                return None;
            }
            s = match self.changed.wait_timeout(s, deadline - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// Number of events recorded so far.
    pub fn len(&self) -> usize {
        self.lock().events.len()
    }

    /// Whether no event was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until the stream is closed or `timeout` passes; returns whether it closed.
    pub fn wait_closed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        while !s.closed {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = match self.changed.wait_timeout(s, deadline - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }
}

/// Reads status lines until EOF into `log` (runs on its own thread).
pub fn pump(reader: impl Read, log: &StatusLog) {
    let mut r = std::io::BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.by_ref().take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') && line.len() as u64 >= MAX_LINE {
            // Oversized line: skip the rest of it.
            let _ = r.by_ref().skip_until(b'\n');
            continue;
        }
        if let Ok(ev) = serde_json::from_slice::<VmmEvent>(&line) {
            log.push(ev);
        }
    }
    log.close();
}

/// Shared handle to a [`StatusLog`].
pub type SharedLog = Arc<StatusLog>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_and_unknown_events() {
        let input = concat!(
            "{\"event\":\"started\",\"pid\":42}\n",
            "{\"event\":\"configured\",\"setup_us\":17000,\"cmdline_len\":300}\n",
            "not json\n",
            "{\"event\":\"kernel_panic_seen\"}\n",
            "{\"event\":\"something_new\",\"x\":1}\n",
            "{\"event\":\"exited\",\"reason\":\"kernel_panic\",\"code\":10,\"detail\":null,\"console_tail\":[\"a\",\"b\"]}\n",
        );
        let log = StatusLog::default();
        pump(input.as_bytes(), &log);
        let evs: Vec<_> = log.events().into_iter().map(|e| e.event).collect();
        assert_eq!(evs[0], VmmEvent::Started { pid: 42 });
        assert_eq!(evs[1], VmmEvent::Configured { setup_us: 17000 });
        assert_eq!(evs[2], VmmEvent::KernelPanicSeen);
        assert_eq!(evs[3], VmmEvent::Unknown);
        assert!(
            matches!(log.exited(), Some(VmmEvent::Exited { code: 10, ref console_tail, .. }) if console_tail.len() == 2)
        );
        assert!(log.wait_closed(Duration::ZERO));
    }

    #[test]
    fn the_latest_net_denials_line_wins() {
        let input = concat!(
            "{\"event\":\"net_denials\",\"denials\":[{\"destination\":\"10.0.0.5\",\"port\":22,\"protocol\":\"tcp\",\"reason\":\"private range\",\"count\":1}]}\n",
            "{\"event\":\"booting\",\"ms\":5}\n",
            "{\"event\":\"net_denials\",\"denials\":[{\"destination\":\"10.0.0.5\",\"port\":22,\"protocol\":\"tcp\",\"reason\":\"private range\",\"count\":3},{\"destination\":\"evil.example\",\"port\":53,\"protocol\":\"dns\",\"reason\":\"not an allowed domain\",\"count\":1}]}\n",
            "{\"event\":\"net_denials\",\"denials\":[{\"destination\":\"x\",\"port\":1,\"protocol\":\"carrier-pigeon\",\"reason\":\"?\",\"count\":1}],\"inbound\":9}\n",
        );
        let log = StatusLog::default();
        assert!(log.net_denials().is_empty());
        pump(input.as_bytes(), &log);
        // The last line that parsed had no `inbound` (an older VMM): 0.
        assert_eq!(log.net_inbound(), 0);
        let d = log.net_denials();
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(
            (d[0].destination.as_str(), d[0].port, d[0].count),
            ("10.0.0.5", 22, 3)
        );
        assert_eq!(d[1].protocol, voidbox_net::Protocol::Dns);
        pump(
            &b"{\"event\":\"net_denials\",\"denials\":[],\"inbound\":2}\n"[..],
            &log,
        );
        assert_eq!((log.net_denials().len(), log.net_inbound()), (0, 2));
        // Denial lines are not events: they never crowd out `exited`.
        let evs: Vec<_> = log.events().into_iter().map(|e| e.event).collect();
        assert_eq!(evs, vec![VmmEvent::Booting { ms: 5 }]);
    }

    #[test]
    fn settling_waits_only_after_a_recent_denials_line() {
        let log = StatusLog::default();
        let t = Instant::now();
        log.settle_net_denials();
        assert!(t.elapsed() < Duration::from_millis(50), "no line: no wait");
        log.push(VmmEvent::NetDenials {
            denials: vec![],
            inbound: 0,
        });
        let t = Instant::now();
        log.settle_net_denials();
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_millis(650),
            "{waited:?}"
        );
        // A closed stream has nothing more to send.
        log.push(VmmEvent::NetDenials {
            denials: vec![],
            inbound: 0,
        });
        log.close();
        let t = Instant::now();
        log.settle_net_denials();
        assert!(t.elapsed() < Duration::from_millis(50));
    }

    #[test]
    fn oversized_lines_are_skipped() {
        let mut input = vec![b'x'; (MAX_LINE as usize) * 2];
        input.extend_from_slice(b"\n{\"event\":\"booting\",\"ms\":5}\n");
        let log = StatusLog::default();
        pump(&input[..], &log);
        let evs: Vec<_> = log.events().into_iter().map(|e| e.event).collect();
        assert_eq!(evs, vec![VmmEvent::Booting { ms: 5 }]);
    }
}
