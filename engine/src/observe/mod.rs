//! Observability of `voidbox apply`: a trace per run and the run's metrics, exported over
//! OTLP (gRPC or HTTP) when an endpoint is configured ([`config`]), and the spans written
//! as OTLP JSON with `apply --trace FILE`.
//!
//! The trace: `voidbox apply NAME` (the run; a child of the caller's `TRACEPARENT`) →
//! `prepare` (images, runtimes, refusals) and one span per stage → one per node → one per
//! attempt → `vm.start` (restore or cold boot, and which snapshot), `provision`, the exec
//! (`exec PROGRAM`, or for an agent the GenAI `invoke_agent NODE` LLM span with a child per
//! tool call) and `collect`. [`Observer`] is a [`Progress`] wrapped around the terminal
//! reporter, so it sees the scheduler's events as they happen.

pub mod config;
pub mod export;
pub mod metrics;
pub mod spans;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use opentelemetry::trace::{Status, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use petgraph::graph::NodeIndex;

use crate::plan::Plan;
use crate::scheduler::progress::Progress;
use crate::scheduler::{Attempt, Event, NodeRecord, RunResult, Status as NodeStatus};
pub use config::Settings;

/// Instrumentation scope of every span and metric.
const SCOPE: &str = "voidbox";

/// Spans still open.
#[derive(Default)]
struct Open {
    run: Context,
    prepare: Option<Context>,
    stages: Vec<Option<Context>>,
    stage_left: Vec<usize>,
    stage_failed: Vec<bool>,
    nodes: HashMap<usize, Context>,
    ended: bool,
}

/// Records a run's trace and metrics and hands the scheduler's events on to `inner`.
pub struct Observer {
    settings: Settings,
    inner: Arc<dyn Progress>,
    resource: Resource,
    tracer: Option<(SdkTracerProvider, SdkTracer)>,
    collected: Option<export::Collected>,
    meters: Option<(
        opentelemetry_sdk::metrics::SdkMeterProvider,
        metrics::Instruments,
    )>,
    logs: Option<(
        opentelemetry_sdk::logs::SdkLoggerProvider,
        opentelemetry_sdk::logs::SdkLogger,
    )>,
    /// The exports' runtime (kept alive for them) and the run's warning.
    export: Option<(Arc<tokio::runtime::Runtime>, Arc<export::Warn>)>,
    stages: Vec<spans::Stage>,
    stage_of: Vec<usize>,
    open: Mutex<Open>,
}

/// What the end of a run's telemetry did.
#[derive(Debug, Default)]
pub struct Flushed {
    /// The flush did not finish within its budget.
    pub timed_out: bool,
    /// Exports that failed during the run.
    pub export_failures: u64,
    /// `--trace FILE` could not be written (why).
    pub trace_file_error: Option<String>,
}

impl Observer {
    /// Sets up the exporters for `settings` and opens the run's span (and its `prepare`
    /// child). `None` when nothing is to be recorded.
    pub fn start(
        settings: Settings,
        plan: &Plan,
        inner: Arc<dyn Progress>,
    ) -> Result<Option<Arc<Observer>>, String> {
        Observer::start_for("apply", settings, plan, inner)
    }

    /// [`Observer::start`] for another command than `apply` (the run's span is named
    /// `voidbox COMMAND NAME`).
    pub fn start_for(
        command: &str,
        settings: Settings,
        plan: &Plan,
        inner: Arc<dyn Progress>,
    ) -> Result<Option<Arc<Observer>>, String> {
        if settings.is_off() {
            return Ok(None);
        }
        let resource = resource(&settings);
        // Anything exported: the runtime the exports run on, and the run's one warning.
        let export = match settings.exports() {
            true => Some((export::export_runtime()?, export::Warn::new())),
            false => None,
        };
        let mut collected = None;
        let tracer = if settings.traces {
            let mut b = SdkTracerProvider::builder()
                .with_resource(resource.clone())
                .with_sampler(opentelemetry_sdk::trace::Sampler::AlwaysOn);
            if let (Some(ep), Some((rt, w))) = (&settings.endpoint, &export) {
                let e = export::span_exporter(ep, rt, settings.export_timeout, w)?;
                b = b.with_span_processor(export::batch_processor(e));
            }
            if settings.trace_file.is_some() {
                let c = export::Collected::default();
                b = b.with_span_processor(c.clone());
                collected = Some(c);
            }
            let provider = b.build();
            let tracer = provider.tracer(SCOPE);
            Some((provider, tracer))
        } else {
            None
        };
        let meters = match (&settings.metrics_endpoint, &export) {
            (Some(ep), Some((rt, w))) => {
                let e = export::metric_exporter(ep, rt, settings.export_timeout, w)?;
                let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
                    .with_resource(resource.clone())
                    .with_reader(export::metric_reader(e))
                    .build();
                use opentelemetry::metrics::MeterProvider as _;
                let instruments = metrics::Instruments::new(&provider.meter(SCOPE));
                Some((provider, instruments))
            }
            _ => None,
        };
        let logs = match (&settings.logs_endpoint, &export) {
            (Some(ep), Some((rt, w))) => {
                let e = export::log_exporter(ep, rt, settings.export_timeout, w)?;
                let provider = opentelemetry_sdk::logs::SdkLoggerProvider::builder()
                    .with_resource(resource.clone())
                    .with_log_processor(export::log_processor(e))
                    .build();
                use opentelemetry::logs::LoggerProvider as _;
                let logger = provider.logger(SCOPE);
                Some((provider, logger))
            }
            _ => None,
        };
        let stages = spans::stages(plan);
        let mut stage_of = vec![0; plan.graph.node_count()];
        for (s, st) in stages.iter().enumerate() {
            for &m in &st.members {
                stage_of[m] = s;
            }
        }
        let obs = Observer {
            inner,
            resource,
            tracer,
            collected,
            meters,
            logs,
            export,
            open: Mutex::new(Open {
                stages: vec![None; stages.len()],
                stage_left: stages.iter().map(|s| s.members.len()).collect(),
                stage_failed: vec![false; stages.len()],
                ..Open::default()
            }),
            stages,
            stage_of,
            settings,
        };
        obs.open_run(command, plan);
        Ok(Some(Arc::new(obs)))
    }

    /// The guest should be asked for telemetry (metrics are exported).
    pub fn wants_guest_telemetry(&self) -> bool {
        self.meters.is_some()
    }

    fn tracer(&self) -> Option<&SdkTracer> {
        self.tracer.as_ref().map(|(_, t)| t)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A started span under `parent`.
    fn span(
        &self,
        parent: &Context,
        name: String,
        start: SystemTime,
        attrs: Vec<KeyValue>,
    ) -> Option<Context> {
        let t = self.tracer()?;
        let span = t
            .span_builder(name)
            .with_start_time(start)
            .with_attributes(attrs)
            .start_with_context(t, parent);
        Some(parent.with_span(span))
    }

    fn open_run(&self, command: &str, plan: &Plan) {
        let parent = self.caller_context();
        let now = SystemTime::now();
        let attrs = vec![
            KeyValue::new("voidbox.spec.name", plan.name.clone()),
            KeyValue::new(
                "voidbox.spec.kind",
                format!("{:?}", plan.kind).to_lowercase(),
            ),
            KeyValue::new("voidbox.nodes", plan.graph.node_count() as i64),
            KeyValue::new("voidbox.stages", self.stages.len() as i64),
            KeyValue::new(spans::OI_KIND, "CHAIN"),
        ];
        let Some(run) = self.span(
            &parent,
            format!("voidbox {command} {}", plan.name),
            now,
            attrs,
        ) else {
            return;
        };
        let prepare = self.span(&run, "prepare".into(), now, Vec::new());
        let mut o = self.lock();
        o.run = run;
        o.prepare = prepare;
    }

    /// The caller's trace from `TRACEPARENT`, else a new trace (an invalid value is said
    /// once and ignored, as W3C Trace Context asks).
    fn caller_context(&self) -> Context {
        use opentelemetry::propagation::TextMapPropagator;
        let Some((tp, ts)) = &self.settings.traceparent else {
            return Context::new();
        };
        let mut carrier = HashMap::new();
        carrier.insert("traceparent".to_string(), tp.clone());
        if let Some(ts) = ts {
            carrier.insert("tracestate".to_string(), ts.clone());
        }
        let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
        if cx.span().span_context().is_valid() {
            cx
        } else {
            eprintln!("voidbox: warning: ignoring TRACEPARENT={tp}: not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)");
            Context::new()
        }
    }

    /// Preparation is over; the scheduler starts.
    pub fn scheduling(&self) {
        if let Some(p) = self.lock().prepare.take() {
            p.span().end();
        }
    }

    /// Ends the run's span of a run that stopped before its nodes ran (exit `code`); a no-op
    /// after [`Observer::end_run`].
    pub fn end_early(&self, code: u8) {
        let now = SystemTime::now();
        let mut o = self.lock();
        if o.ended {
            return;
        }
        o.ended = true;
        if let Some(p) = o.prepare.take() {
            p.span()
                .set_status(Status::error(format!("exit code {code}")));
            p.span().end_with_timestamp(now);
        }
        let run = o.run.span();
        run.set_attributes([
            KeyValue::new("voidbox.run.status", "not_started"),
            KeyValue::new("voidbox.run.exit_code", i64::from(code)),
        ]);
        run.set_status(Status::error(format!(
            "stopped before any node ran: exit code {code}"
        )));
        run.end_with_timestamp(now);
    }

    /// Ends the run's span with its outcome and records the run's duration.
    pub fn end_run(&self, plan: &Plan, r: &RunResult, code: u8) {
        let now = SystemTime::now();
        let mut o = self.lock();
        o.ended = true;
        if let Some(p) = o.prepare.take() {
            p.span().end_with_timestamp(now);
        }
        for cx in o.stages.iter_mut().filter_map(Option::take) {
            cx.span().end_with_timestamp(now);
        }
        for (_, cx) in o.nodes.drain() {
            cx.span().end_with_timestamp(now);
        }
        let count = |s: NodeStatus| r.nodes.iter().filter(|n| n.status == s).count() as i64;
        let ok = code == 0 && r.success();
        let status = if ok { "succeeded" } else { "failed" };
        let run = &o.run;
        run.span().set_attributes([
            KeyValue::new("voidbox.run.status", status),
            KeyValue::new("voidbox.run.exit_code", i64::from(code)),
            KeyValue::new("voidbox.nodes.succeeded", count(NodeStatus::Succeeded)),
            KeyValue::new("voidbox.nodes.failed", count(NodeStatus::Failed)),
            KeyValue::new("voidbox.nodes.timed_out", count(NodeStatus::TimedOut)),
            KeyValue::new("voidbox.nodes.cancelled", count(NodeStatus::Cancelled)),
            KeyValue::new("voidbox.nodes.skipped", count(NodeStatus::Skipped)),
        ]);
        if let Some(a) = r.abort {
            run.span()
                .set_attribute(KeyValue::new("voidbox.run.abort", format!("{a:?}")));
        }
        run.span().set_status(if ok {
            Status::Ok
        } else {
            Status::error(format!("exit code {code}"))
        });
        run.span().end_with_timestamp(now);
        let run_cx = run.clone();
        drop(o);
        self.log(
            if ok {
                opentelemetry::logs::Severity::Info
            } else {
                opentelemetry::logs::Severity::Error
            },
            format!("{}: {status} (exit code {code})", plan.name),
            vec![("voidbox.run.exit_code", i64::from(code).into())],
            Some(&run_cx),
        );
        if let Some((_, m)) = &self.meters {
            m.run(
                &[
                    KeyValue::new("voidbox.spec.name", plan.name.clone()),
                    KeyValue::new("voidbox.run.status", status),
                ],
                r.duration.as_secs_f64(),
            );
        }
    }

    /// Sends what is left (at most [`config::FLUSH_BUDGET`]) and writes `--trace FILE`.
    pub fn shutdown(&self) -> Flushed {
        let mut out = Flushed::default();
        let budget = config::FLUSH_BUDGET;
        let deadline = std::time::Instant::now() + budget;
        // Both providers flush at once, each within the budget.
        std::thread::scope(|s| {
            let t = s.spawn(|| {
                self.tracer
                    .as_ref()
                    .map(|(p, _)| p.shutdown_with_timeout(budget))
            });
            let l = s.spawn(|| {
                self.logs
                    .as_ref()
                    .map(|(p, _)| p.shutdown_with_timeout(budget))
            });
            let m = self
                .meters
                .as_ref()
                .map(|(p, _)| p.shutdown_with_timeout(budget));
            let t = t.join().ok().flatten();
            let l = l.join().ok().flatten();
            out.timed_out = [t, m, l]
                .into_iter()
                .flatten()
                .any(|r| r.is_err() && std::time::Instant::now() >= deadline);
        });
        out.export_failures = self.export.as_ref().map_or(0, |(_, w)| w.failures());
        if let (Some(path), Some(c)) = (&self.settings.trace_file, &self.collected) {
            let (spans, dropped) = c.take();
            if dropped > 0 {
                eprintln!(
                    "voidbox: warning: --trace: {dropped} span(s) beyond {} were dropped",
                    export::MAX_FILE_SPANS
                );
            }
            let r =
                export::otlp_json(spans, &self.resource).and_then(|doc| write_atomic(path, &doc));
            out.trace_file_error = r.err();
        }
        out
    }

    /// One log record, in the trace of `cx` when given.
    fn log(
        &self,
        severity: opentelemetry::logs::Severity,
        body: String,
        attrs: Vec<(&'static str, opentelemetry::logs::AnyValue)>,
        cx: Option<&Context>,
    ) {
        use opentelemetry::logs::{LogRecord as _, Logger as _};
        let Some((_, logger)) = &self.logs else {
            return;
        };
        let mut r = logger.create_log_record();
        r.set_timestamp(SystemTime::now());
        r.set_severity_number(severity);
        r.set_severity_text(severity.name());
        r.set_body(body.into());
        r.add_attributes(attrs);
        if let Some(sc) = cx.map(|c| c.span().span_context().clone()) {
            if sc.is_valid() {
                r.set_trace_context(sc.trace_id(), sc.span_id(), Some(sc.trace_flags()));
            }
        }
        logger.emit(r);
    }

    fn node_cx(&self, i: usize) -> Option<Context> {
        self.lock().nodes.get(&i).cloned()
    }

    fn stage_started(&self, o: &mut Open, s: usize, now: SystemTime) -> Option<Context> {
        if o.stages[s].is_none() {
            let st = &self.stages[s];
            let attrs = vec![
                KeyValue::new("voidbox.stage.index", s as i64),
                KeyValue::new("voidbox.stage.kind", st.kind),
                KeyValue::new("voidbox.stage.nodes", st.members.len() as i64),
                KeyValue::new(spans::OI_KIND, "CHAIN"),
            ];
            let run = o.run.clone();
            o.stages[s] = self.span(&run, format!("stage {}", st.name), now, attrs);
        }
        o.stages[s].clone()
    }

    fn node_started(&self, plan: &Plan, node: NodeIndex, now: SystemTime) {
        let i = node.index();
        let mut o = self.lock();
        if o.nodes.contains_key(&i) {
            return;
        }
        let Some(stage) = self.stage_started(&mut o, self.stage_of[i], now) else {
            return;
        };
        let n = &plan.graph[node];
        if let Some(cx) = self.span(
            &stage,
            format!("node {}", n.name),
            now,
            spans::node_identity(n),
        ) {
            o.nodes.insert(i, cx);
        }
    }

    fn node_finished(&self, plan: &Plan, node: NodeIndex, r: &NodeRecord) {
        let now = SystemTime::now();
        let n = &plan.graph[node];
        if let Some((_, m)) = &self.meters {
            m.node(&spans::node_identity(n), r);
        }
        if self.tracer.is_none() {
            self.log_finished(n, r, &Context::new());
            return;
        }
        // A skipped node never started: its span opens and closes now.
        self.node_started(plan, node, now);
        let i = node.index();
        let s = self.stage_of[i];
        let mut o = self.lock();
        let node_cx = o.nodes.remove(&i);
        let run_cx = o.run.clone();
        drop(o);
        self.log_finished(n, r, node_cx.as_ref().unwrap_or(&run_cx));
        let mut o = self.lock();
        if let Some(cx) = node_cx {
            let span = cx.span();
            span.set_attributes(spans::node_end(n, r));
            let err = r.last.as_ref().and_then(|a| a.error.as_deref());
            span.set_status(spans::status(r.status, err));
            span.end_with_timestamp(now);
        }
        if r.status != NodeStatus::Succeeded {
            o.stage_failed[s] = true;
        }
        o.stage_left[s] = o.stage_left[s].saturating_sub(1);
        if o.stage_left[s] == 0 {
            let failed = o.stage_failed[s];
            if let Some(cx) = o.stages[s].take() {
                cx.span().set_status(if failed {
                    Status::error("a node of the stage did not succeed")
                } else {
                    Status::Ok
                });
                cx.span().end_with_timestamp(now);
            }
        }
    }

    fn attempt_spans(
        &self,
        plan: &Plan,
        node: NodeIndex,
        n: u32,
        started: SystemTime,
        a: &Attempt,
    ) {
        let now = SystemTime::now();
        let parent = match self.lock().nodes.get(&node.index()) {
            Some(cx) => cx.clone(),
            None => return,
        };
        let pn = &plan.graph[node];
        let Some(cx) = self.span(
            &parent,
            format!("attempt {n}"),
            started,
            spans::attempt(n, a),
        ) else {
            return;
        };
        let phase = |name: &str, at: Option<(SystemTime, SystemTime)>, attrs: Vec<KeyValue>| {
            at.and_then(|(s, e)| {
                let c = self.span(&cx, name.to_string(), s, attrs)?;
                Some((c, e))
            })
        };
        if let Some((c, e)) = phase("vm.start", a.phases.vm_start, spans::vm_start(pn, a)) {
            c.span().end_with_timestamp(e);
        }
        if let Some((c, e)) = phase("provision", a.phases.provision, Vec::new()) {
            c.span().end_with_timestamp(e);
        }
        let (exec_name, exec_attrs) = spans::exec(pn, a);
        if let Some((c, e)) = phase(&exec_name, a.phases.exec, exec_attrs) {
            for t in a.agent.iter().flat_map(|ag| ag.tool_timings.iter()) {
                if let Some(tc) = self.span(
                    &c,
                    format!("execute_tool {}", t.name),
                    t.started,
                    spans::tool(&t.name, t.id.as_deref()),
                ) {
                    if t.is_error {
                        tc.span()
                            .set_status(Status::error("the tool reported an error"));
                    }
                    tc.span()
                        .end_with_timestamp(t.ended.unwrap_or(e).max(t.started));
                }
            }
            if let Some(at) = a.service.as_ref().and_then(|s| s.ready_at) {
                c.span()
                    .add_event_with_timestamp("service.ready", at, spans::node_service(a));
            }
            for g in a.guest.iter().flat_map(|g| g.samples.iter()) {
                c.span().add_event_with_timestamp(
                    "guest.telemetry",
                    g.at,
                    vec![
                        KeyValue::new("voidbox.guest.cpu_user_ms", g.cpu_user_ms as i64),
                        KeyValue::new("voidbox.guest.cpu_system_ms", g.cpu_system_ms as i64),
                        KeyValue::new(
                            "voidbox.guest.memory_used_bytes",
                            g.mem_used_kb.saturating_mul(1024) as i64,
                        ),
                        KeyValue::new("voidbox.guest.processes", i64::from(g.processes)),
                    ],
                );
            }
            for d in &a.net_denials {
                c.span().add_event(
                    "network.denied",
                    vec![
                        KeyValue::new("voidbox.network.destination", d.destination.clone()),
                        KeyValue::new("voidbox.network.port", i64::from(d.port)),
                        KeyValue::new(
                            "voidbox.network.protocol",
                            format!("{:?}", d.protocol).to_lowercase(),
                        ),
                        KeyValue::new("voidbox.network.reason", d.reason.clone()),
                        KeyValue::new("voidbox.network.count", d.count as i64),
                    ],
                );
            }
            c.span().end_with_timestamp(e);
        }
        if let Some((c, e)) = phase("collect", a.phases.collect, Vec::new()) {
            c.span().end_with_timestamp(e);
        }
        cx.span()
            .set_status(spans::status(a.status, a.error.as_deref()));
        cx.span().end_with_timestamp(now.max(started));
    }
}

impl Observer {
    fn log_finished(&self, n: &crate::plan::PlanNode, r: &NodeRecord, cx: &Context) {
        use opentelemetry::logs::Severity;
        let err = r.last.as_ref().and_then(|a| a.error.as_deref());
        let (sev, body) = match (r.status, err) {
            (NodeStatus::Succeeded, _) => (Severity::Info, format!("{}: succeeded", n.name)),
            (NodeStatus::Skipped, _) => (Severity::Info, format!("{}: skipped", n.name)),
            (s, Some(e)) => (
                Severity::Error,
                format!(
                    "{}: {}: {}",
                    n.name,
                    s.as_str(),
                    e.lines().next().unwrap_or("")
                ),
            ),
            (s, None) => (Severity::Error, format!("{}: {}", n.name, s.as_str())),
        };
        let mut attrs = vec![
            ("voidbox.node.name", n.name.clone().into()),
            ("voidbox.node.status", r.status.as_str().into()),
            ("voidbox.node.attempts", i64::from(r.attempts).into()),
        ];
        if let Some(d) = r.duration {
            attrs.push(("voidbox.node.duration_ms", (d.as_millis() as i64).into()));
        }
        self.log(sev, body, attrs, Some(cx));
    }
}

impl Progress for Observer {
    fn event(&self, plan: &Plan, ev: &Event, record: Option<&NodeRecord>) {
        self.inner.event(plan, ev, record);
        match ev {
            Event::Started { node, attempt } => {
                if self.tracer.is_some() {
                    self.node_started(plan, *node, SystemTime::now());
                }
                let name = &plan.graph[*node].name;
                self.log(
                    opentelemetry::logs::Severity::Info,
                    format!("{name}: attempt {attempt} started"),
                    vec![
                        ("voidbox.node.name", name.clone().into()),
                        ("voidbox.attempt", i64::from(*attempt).into()),
                    ],
                    self.node_cx(node.index()).as_ref(),
                );
            }
            Event::Retrying {
                node,
                attempt,
                delay,
                error,
            } => {
                let name = &plan.graph[*node].name;
                self.log(
                    opentelemetry::logs::Severity::Warn,
                    format!(
                        "{name}: attempt {attempt} failed ({}); retrying in {:.1}s",
                        error.lines().next().unwrap_or(""),
                        delay.as_secs_f64()
                    ),
                    vec![
                        ("voidbox.node.name", name.clone().into()),
                        ("voidbox.attempt", i64::from(*attempt).into()),
                    ],
                    self.node_cx(node.index()).as_ref(),
                );
            }
            Event::Ready { node } => {
                let name = &plan.graph[*node].name;
                self.log(
                    opentelemetry::logs::Severity::Info,
                    format!("{name}: service ready"),
                    vec![("voidbox.node.name", name.clone().into())],
                    self.node_cx(node.index()).as_ref(),
                );
            }
            Event::Finished { node } => {
                if let Some(r) = record {
                    self.node_finished(plan, *node, r);
                }
            }
        }
    }

    fn attempt_ended(
        &self,
        plan: &Plan,
        node: NodeIndex,
        attempt: u32,
        started: SystemTime,
        a: &Attempt,
    ) {
        self.inner.attempt_ended(plan, node, attempt, started, a);
        if let Some((_, m)) = &self.meters {
            m.attempt(&spans::node_identity(&plan.graph[node]), a);
        }
        let cx = self.node_cx(node.index());
        let name = &plan.graph[node].name;
        for d in &a.net_denials {
            let proto = format!("{:?}", d.protocol).to_lowercase();
            self.log(
                opentelemetry::logs::Severity::Warn,
                format!(
                    "{name}: network denied {proto} {}:{} ({}) x{}",
                    d.destination, d.port, d.reason, d.count
                ),
                vec![("voidbox.node.name", name.clone().into())],
                cx.as_ref(),
            );
        }
        for w in a.agent.iter().flat_map(|ag| ag.warnings.iter()) {
            self.log(
                opentelemetry::logs::Severity::Warn,
                format!("{name}: agent runtime: {w}"),
                vec![("voidbox.node.name", name.clone().into())],
                cx.as_ref(),
            );
        }
        self.attempt_spans(plan, node, attempt, started, a);
    }

    fn finish(&self) {
        self.inner.finish();
    }

    fn notice(&self, msg: &str) {
        self.inner.notice(msg);
        let run = self.lock().run.clone();
        self.log(
            opentelemetry::logs::Severity::Info,
            msg.to_string(),
            Vec::new(),
            Some(&run),
        );
    }
}

/// The resource: `service.name` and version, `OTEL_RESOURCE_ATTRIBUTES`, and the project
/// Phoenix files the spans under (the service name, unless the variables name one).
fn resource(settings: &Settings) -> Resource {
    let from_env = std::env::var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
    let mut b = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if !from_env.contains("openinference.project.name") {
        b = b.with_attribute(KeyValue::new(
            "openinference.project.name",
            settings.service_name.clone(),
        ));
    }
    b.build()
}

/// Writes `data` to `path` through a temporary file in the same directory.
fn write_atomic(path: &std::path::Path, data: &[u8]) -> Result<(), String> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    std::io::Write::write_all(&mut tmp, data)
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    tmp.persist(path)
        .map(drop)
        .map_err(|e| format!("writing {}: {}", path.display(), e.error))
}

/// Ends a run's telemetry after its exit `code` is known: the run's span (if the run
/// stopped before its nodes ran), the final flush and `--trace FILE`. Returns the exit code,
/// 2 instead of 0 when `--trace` could not be written. Says once when telemetry was dropped.
pub fn close(o: Arc<Observer>, code: u8) -> u8 {
    let mut code = code;
    o.end_early(code);
    let flushed = o.shutdown();
    if let Some(e) = &flushed.trace_file_error {
        eprintln!("error: --trace: {e}");
        if code == 0 {
            code = 2;
        }
    }
    // One warning per run: a flush cut short after failed exports was already said.
    if flushed.timed_out && flushed.export_failures == 0 {
        eprintln!(
            "voidbox: warning: the telemetry not sent within {}s of the run's end was dropped",
            config::FLUSH_BUDGET.as_secs()
        );
        // A provider whose export is stuck would block its drop (it joins its thread).
        std::mem::forget(o);
    }
    code
}
