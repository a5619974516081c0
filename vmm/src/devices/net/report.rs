//! The `net_denials` status line: the NAT's cumulative denial counts and inbound connection
//! count, sent to the engine whenever they changed (at most every [`MIN_INTERVAL`]) and once
//! more when the VM stops, so a report can carry them even when the engine kills the VMM.
//!
//! Shape: `{"event":"net_denials","denials":[{"destination":…,"port":…,"protocol":…,
//! "reason":…,"count":…},…],"inbound":N}` — every denial so far ([`voidbox_net::Denial`])
//! and the connections accepted on published ports and sockets so far
//! (`NatStats::inbound_accepted`), not deltas.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use voidbox_net::Denial;

use crate::status::StatusWriter;

/// Shortest time between two lines.
pub const MIN_INTERVAL: Duration = Duration::from_millis(250);

/// One `net_denials` line (a struct, not a `serde_json::Value`: see
/// [`StatusWriter::emit_serialized`]).
#[derive(Serialize)]
struct Line<'a> {
    event: &'static str,
    denials: &'a [Denial],
    inbound: u64,
}

/// What a line carries.
#[derive(Default, Clone, PartialEq)]
struct Counts {
    denials: Vec<Denial>,
    inbound: u64,
}

#[derive(Default)]
struct State {
    latest: Counts,
    emitted: Counts,
    last_emit: Option<Instant>,
    closed: bool,
}

/// Throttled, change-only emitter of `net_denials` lines, shared by the net thread (which
/// offers the NAT's counts when they changed) and the main thread (which closes it at exit).
pub struct DenialReporter {
    status: StatusWriter,
    state: Mutex<State>,
}

impl DenialReporter {
    /// Emits on `status`.
    pub fn new(status: StatusWriter) -> Self {
        Self {
            status,
            state: Mutex::new(State::default()),
        }
    }

    fn emit(&self, s: &mut State, now: Instant) {
        self.status.emit_serialized(&Line {
            event: "net_denials",
            denials: &s.latest.denials,
            inbound: s.latest.inbound,
        });
        s.emitted = s.latest.clone();
        s.last_emit = Some(now);
    }

    /// Records the NAT's current (cumulative) denials and inbound connection count and emits
    /// them when they changed and the last line is at least [`MIN_INTERVAL`] old. Returns
    /// when a held-back line is due (the caller offers again by then).
    pub fn offer(&self, denials: Vec<Denial>, inbound: u64, now: Instant) -> Option<Instant> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.closed {
            return None;
        }
        s.latest = Counts { denials, inbound };
        if s.latest == s.emitted {
            return None;
        }
        match s.last_emit {
            Some(t) if now.saturating_duration_since(t) < MIN_INTERVAL => Some(t + MIN_INTERVAL),
            _ => {
                self.emit(&mut s, now);
                None
            }
        }
    }

    /// Emits the latest counts if they differ from the last line, then emits nothing more
    /// (the VMM is about to report its exit).
    pub fn close(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.closed {
            return;
        }
        if s.latest != s.emitted {
            self.emit(&mut s, Instant::now());
        }
        s.closed = true;
    }
}
