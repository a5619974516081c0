//! Progress on stderr: indicatif spinners (one line per running node with its elapsed
//! time) on a TTY, plain lines otherwise, nothing when silenced.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use petgraph::graph::NodeIndex;

use super::report::secs;
use super::scheduler::{Attempt, Event, NodeRecord, Status};
use crate::plan::Plan;

/// Receives scheduler events.
pub trait Progress: Send + Sync {
    /// One event; `record` is set for `Finished`.
    fn event(&self, plan: &Plan, ev: &Event, record: Option<&NodeRecord>);
    /// An attempt of `node` that started at `started` ended with `a` (before any retry).
    fn attempt_ended(
        &self,
        _plan: &Plan,
        _node: NodeIndex,
        _attempt: u32,
        _started: std::time::SystemTime,
        _a: &Attempt,
    ) {
    }
    /// The run is over (clear bars).
    fn finish(&self) {}
    /// A one-line notice (snapshot created, cold-boot fallback) on stderr.
    fn notice(&self, msg: &str) {
        eprintln!("voidbox: {msg}");
    }
}

/// No progress output.
pub struct Silent;

impl Progress for Silent {
    fn event(&self, _: &Plan, _: &Event, _: Option<&NodeRecord>) {}
}

/// One line per event on stderr.
pub struct Plain;

/// The line for an event (shared by both reporters).
fn line(plan: &Plan, ev: &Event, record: Option<&NodeRecord>) -> Option<String> {
    let name = |n: NodeIndex| plan.graph[n].name.clone();
    Some(match ev {
        Event::Started { node, attempt: 1 } => format!("voidbox: {}: started", name(*node)),
        Event::Started { node, attempt } => {
            format!("voidbox: {}: attempt {attempt} started", name(*node))
        }
        Event::Retrying {
            node,
            attempt,
            delay,
            error,
        } => format!(
            "voidbox: {}: attempt {attempt} failed ({}); retrying in {:.1}s",
            name(*node),
            first_line(error),
            delay.as_secs_f64()
        ),
        Event::Finished { node } => {
            let r = record?;
            let dur = r
                .duration
                .map(|d| format!(" in {}", secs(d)))
                .unwrap_or_default();
            let err = r
                .last
                .as_ref()
                .and_then(|a| a.error.as_deref())
                .filter(|_| r.status != Status::Succeeded)
                .map(|e| format!(": {}", first_line(e)))
                .unwrap_or_default();
            format!("voidbox: {}: {}{dur}{err}", name(*node), r.status.as_str())
        }
    })
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

impl Progress for Plain {
    fn event(&self, plan: &Plan, ev: &Event, record: Option<&NodeRecord>) {
        if let Some(l) = line(plan, ev, record) {
            let _ = writeln!(std::io::stderr(), "{l}");
        }
    }
}

/// Spinners on a TTY.
pub struct Bars {
    multi: MultiProgress,
    bars: Mutex<HashMap<NodeIndex, ProgressBar>>,
}

impl Bars {
    /// Bars drawn on stderr.
    pub fn new() -> Bars {
        Bars {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            bars: Mutex::new(HashMap::new()),
        }
    }
}

impl Default for Bars {
    fn default() -> Self {
        Bars::new()
    }
}

impl Progress for Bars {
    fn notice(&self, msg: &str) {
        let _ = self.multi.println(format!("voidbox: {msg}"));
    }

    fn event(&self, plan: &Plan, ev: &Event, record: Option<&NodeRecord>) {
        let mut bars = self.bars.lock().unwrap_or_else(|e| e.into_inner());
        match ev {
            Event::Started { node, attempt } => {
                let pb = bars.entry(*node).or_insert_with(|| {
                    let pb = self.multi.add(ProgressBar::new_spinner());
                    pb.set_style(
                        ProgressStyle::with_template("{spinner} {prefix:.bold} {elapsed:>4} {msg}")
                            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                    );
                    pb.set_prefix(plan.graph[*node].name.clone());
                    pb.enable_steady_tick(Duration::from_millis(200));
                    pb
                });
                if *attempt > 1 {
                    pb.set_message(format!("attempt {attempt}"));
                }
            }
            Event::Retrying { node, .. } => {
                if let (Some(pb), Some(l)) = (bars.get(node), line(plan, ev, record)) {
                    pb.set_message(l);
                }
            }
            Event::Finished { node } => {
                let l = line(plan, ev, record);
                if let Some(pb) = bars.remove(node) {
                    pb.finish_and_clear();
                    self.multi.remove(&pb);
                }
                if let Some(l) = l {
                    let _ = self.multi.println(l);
                }
            }
        }
    }

    fn finish(&self) {
        let mut bars = self.bars.lock().unwrap_or_else(|e| e.into_inner());
        for (_, pb) in bars.drain() {
            pb.finish_and_clear();
        }
        let _ = self.multi.clear();
    }
}
