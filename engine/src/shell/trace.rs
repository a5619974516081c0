//! A shell session in the spec's telemetry (`observe`, `OTEL_*`): the run's span with the
//! session's node and its one attempt, as `apply` records a run, ended with the session's
//! exit code.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use petgraph::graph::NodeIndex;

use crate::observe::config::Settings;
use crate::observe::Observer;
use crate::plan::{Plan, PlanNode};
use crate::scheduler::progress::{Progress, Silent};
use crate::scheduler::{Attempt, Event, NodeRecord, RunResult, Status};

/// The session's spans, open while it runs.
pub struct SessionTrace {
    observer: Arc<Observer>,
    node: NodeIndex,
    started: SystemTime,
    t0: Instant,
}

impl SessionTrace {
    /// Opens the run's span and the node's attempt; `None` when nothing is recorded.
    pub fn start(
        settings: Settings,
        plan: &Plan,
        node: &PlanNode,
    ) -> Result<Option<SessionTrace>, String> {
        let Some(idx) = plan.node(&node.name) else {
            return Err(format!("node `{}` is not in the plan", node.name));
        };
        let Some(observer) = Observer::start_for("shell", settings, plan, Arc::new(Silent))? else {
            return Ok(None);
        };
        observer.event(
            plan,
            &Event::Started {
                node: idx,
                attempt: 1,
            },
            None,
        );
        Ok(Some(SessionTrace {
            observer,
            node: idx,
            started: SystemTime::now(),
            t0: Instant::now(),
        }))
    }

    /// Ends the attempt, the node and the run with the session's exit `code` (and the
    /// error that ended it outside the session), flushes, and returns the exit code (2
    /// instead of 0 when telemetry could not be written where asked).
    pub fn end(self, plan: &Plan, code: u8, error: Option<String>) -> u8 {
        let status = match code {
            0 => Status::Succeeded,
            124 => Status::TimedOut,
            _ => Status::Failed,
        };
        let mut attempt = match status {
            Status::Succeeded => Attempt::ok(Vec::new()),
            _ => Attempt::failed(
                status,
                error.unwrap_or_else(|| format!("the session ended with exit code {code}")),
            ),
        };
        attempt.exit_code = Some(i32::from(code));
        self.observer
            .attempt_ended(plan, self.node, 1, self.started, &attempt);
        let duration = self.t0.elapsed();
        let record = NodeRecord {
            status,
            attempts: 1,
            started: Some(std::time::Duration::ZERO),
            duration: Some(duration),
            queue_wait: Some(std::time::Duration::ZERO),
            last: Some(attempt),
        };
        self.observer
            .event(plan, &Event::Finished { node: self.node }, Some(&record));
        let result = RunResult {
            nodes: vec![record],
            output: None,
            abort: None,
            duration,
        };
        self.observer.end_run(plan, &result, code);
        crate::observe::close(self.observer, code)
    }
}
