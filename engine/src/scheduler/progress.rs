//! Progress on stderr: indicatif spinners (one line per running node with its elapsed
//! time) on a TTY, plain lines otherwise (with a line every minute naming the nodes still
//! running), nothing when silenced.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use petgraph::graph::NodeIndex;

use super::{Attempt, Event, NodeRecord, Status};
use crate::plan::Plan;
use crate::units::secs;

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

/// One line per event on stderr, and every [`HEARTBEAT`] a line naming the nodes still
/// running (a log without a terminal shows that a long agent node is alive).
pub struct Plain {
    running: Arc<Mutex<BTreeMap<NodeIndex, (String, Instant)>>>,
    out: Sink,
}

/// Where [`Plain`] writes (stderr, or a buffer in tests).
type Sink = Arc<Mutex<dyn Write + Send>>;

/// How often [`Plain`] says which nodes are still running.
pub const HEARTBEAT: Duration = Duration::from_secs(60);

impl Plain {
    /// A reporter on stderr with its heartbeat thread (which ends when the reporter is
    /// dropped).
    pub fn new() -> Plain {
        Plain::with(HEARTBEAT, Arc::new(Mutex::new(std::io::stderr())))
    }

    /// A reporter writing to `out`, naming the running nodes every `every`.
    fn with(every: Duration, out: Sink) -> Plain {
        let running = Arc::new(Mutex::new(BTreeMap::new()));
        let (weak, sink) = (Arc::downgrade(&running), out.clone());
        let _ = std::thread::Builder::new()
            .name("progress-heartbeat".into())
            .spawn(move || heartbeat(every, weak, sink));
        Plain { running, out }
    }

    fn write_line(&self, l: &str) {
        let _ = writeln!(self.out.lock().unwrap_or_else(|e| e.into_inner()), "{l}");
    }
}

impl Default for Plain {
    fn default() -> Self {
        Plain::new()
    }
}

/// Every `every` while anything runs: `voidbox: still running: a (2m0s), b (1m5s)`.
fn heartbeat(
    every: Duration,
    running: std::sync::Weak<Mutex<BTreeMap<NodeIndex, (String, Instant)>>>,
    out: Sink,
) {
    let tick = every.min(Duration::from_millis(500));
    let mut last = Instant::now();
    loop {
        std::thread::sleep(tick);
        let Some(running) = running.upgrade() else {
            return;
        };
        if last.elapsed() < every {
            continue;
        }
        last = Instant::now();
        let list: Vec<String> = running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|(name, t0)| format!("{name} ({})", secs(t0.elapsed())))
            .collect();
        if !list.is_empty() {
            let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(out, "voidbox: still running: {}", list.join(", "));
        }
    }
}

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
        Event::Ready { node } => {
            let ports = plan.graph[*node]
                .service
                .as_ref()
                .map(|s| &s.ports)
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let list: Vec<String> = p.iter().map(u16::to_string).collect();
                    format!(" (ports {} accept connections)", list.join(", "))
                })
                .unwrap_or_default();
            format!("voidbox: {}: service ready{ports}", name(*node))
        }
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
            let service = r
                .last
                .as_ref()
                .and_then(|a| a.service.as_ref())
                .map(|s| {
                    format!(
                        " (service {}, {} connection{})",
                        s.ended.as_str(),
                        s.connections,
                        if s.connections == 1 { "" } else { "s" }
                    )
                })
                .unwrap_or_default();
            format!(
                "voidbox: {}: {}{service}{dur}{err}",
                name(*node),
                r.status.as_str()
            )
        }
    })
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

impl Progress for Plain {
    fn event(&self, plan: &Plan, ev: &Event, record: Option<&NodeRecord>) {
        {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            match ev {
                Event::Started { node, .. } => {
                    running
                        .entry(*node)
                        .or_insert_with(|| (plan.graph[*node].name.clone(), Instant::now()));
                }
                Event::Finished { node } => {
                    running.remove(node);
                }
                Event::Retrying { .. } | Event::Ready { .. } => {}
            }
        }
        if let Some(l) = line(plan, ev, record) {
            self.write_line(&l);
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
            Event::Retrying { node, .. } | Event::Ready { node } => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_the_nodes_still_running() {
        let plan = crate::plan::compile_for_test(
            "api_version: v1\nkind: pipeline\nname: p\npipeline:\n  boxes:\n    - {name: slow, run: {program: sleep}}\n    - {name: quick, run: {program: 'true'}}\n  stages:\n    - {type: fan_out, boxes: [slow, quick]}\n",
        );
        let buf: Arc<Mutex<Vec<u8>>> = Arc::default();
        let sink: Sink = buf.clone();
        let p = Plain::with(Duration::from_millis(150), sink);
        let (slow, quick) = (NodeIndex::new(0), NodeIndex::new(1));
        p.event(
            &plan,
            &Event::Started {
                node: slow,
                attempt: 1,
            },
            None,
        );
        p.event(
            &plan,
            &Event::Started {
                node: quick,
                attempt: 1,
            },
            None,
        );
        p.event(&plan, &Event::Finished { node: quick }, None);
        std::thread::sleep(Duration::from_millis(700));
        drop(p);
        let text = String::from_utf8_lossy(&buf.lock().unwrap()).into_owned();
        assert!(text.contains("voidbox: slow: started"), "{text}");
        assert!(text.contains("voidbox: still running: slow ("), "{text}");
        assert!(
            !text
                .lines()
                .any(|l| l.contains("still running") && l.contains("quick")),
            "{text}"
        );
    }
}
