//! The OTLP exporters and the providers around them.
//!
//! The SDK's batch span processor and periodic metric reader run on their own threads and
//! drive exports with a plain executor, but the OTLP transports (tonic, reqwest) need a
//! tokio reactor. [`OnRuntime`] runs each export on a small runtime owned by the exporter,
//! under a timeout, and turns the first failure into one warning. The queues are the SDK's
//! bounded ones (spans beyond them are dropped, never waited for), and the final flush is
//! bounded by [`super::config::FLUSH_BUDGET`]: a collector that is down or slow never fails
//! or delays a run by more than that.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;

use super::config::{Endpoint, Protocol};

/// Spans queued for export at most (more are dropped and counted by the SDK).
pub const MAX_QUEUED_SPANS: usize = 8192;
/// Spans kept for `--trace FILE` at most (more are dropped and counted).
pub const MAX_FILE_SPANS: usize = 100_000;
/// How often queued spans are sent.
const SPAN_DELAY: Duration = Duration::from_secs(1);
/// How often metrics are sent during a run (the last collection is sent at its end).
const METRIC_INTERVAL: Duration = Duration::from_secs(15);

/// Says once per run that exports fail; counts the failures.
#[derive(Debug, Default)]
pub struct Warn {
    warned: AtomicBool,
    failures: AtomicU64,
}

impl Warn {
    /// A new one, shared by a run's exporters.
    pub fn new() -> Arc<Warn> {
        Arc::new(Warn::default())
    }

    fn failed(&self, what: &str, target: &str, why: &str) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::AcqRel) {
            eprintln!(
                "voidbox: warning: cannot export {what} to {target}: {why}; the run goes on without them (said once){}",
                signal_hint(what, why)
            );
        }
    }

    /// Exports that failed so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// A hint for a collector that does not take `what` at all (HTTP 404/405, gRPC
/// `Unimplemented`): Arize Phoenix, for one, takes traces only.
fn signal_hint(what: &str, why: &str) -> String {
    let absent = why.contains("status code: 404")
        || why.contains("status code: 405")
        || why.contains("Unimplemented")
        || why.contains("unimplemented");
    if absent && what != "traces" {
        let var = if what == "metrics" {
            "OTEL_METRICS_EXPORTER"
        } else {
            "OTEL_LOGS_EXPORTER"
        };
        format!("\n  help: this collector does not take {what} (Arize Phoenix takes traces only); set {var}=none, or send traces alone with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    } else {
        String::new()
    }
}

/// An exporter whose exports run on `rt` under `timeout`.
#[derive(Debug)]
pub struct OnRuntime<E> {
    inner: E,
    rt: Arc<tokio::runtime::Runtime>,
    timeout: Duration,
    /// Where it sends (for the warning).
    target: String,
    warn: Arc<Warn>,
}

impl<E> OnRuntime<E> {
    fn run<F>(&self, what: &str, fut: F) -> OTelSdkResult
    where
        F: std::future::Future<Output = OTelSdkResult>,
    {
        let r = self.rt.block_on(async {
            match tokio::time::timeout(self.timeout, fut).await {
                Ok(r) => r,
                Err(_) => Err(OTelSdkError::Timeout(self.timeout)),
            }
        });
        if let Err(e) = &r {
            self.warn.failed(what, &self.target, &e.to_string());
        }
        r
    }
}

impl SpanExporter for OnRuntime<opentelemetry_otlp::SpanExporter> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.run("traces", self.inner.export(batch))
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

impl PushMetricExporter for OnRuntime<opentelemetry_otlp::MetricExporter> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        self.run("metrics", self.inner.export(metrics))
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

impl opentelemetry_sdk::logs::LogExporter for OnRuntime<opentelemetry_otlp::LogExporter> {
    async fn export(&self, batch: opentelemetry_sdk::logs::LogBatch<'_>) -> OTelSdkResult {
        self.run("logs", self.inner.export(batch))
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The runtime exports run on: one worker, its own thread, independent of the run's.
pub fn export_runtime() -> Result<Arc<tokio::runtime::Runtime>, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("voidbox-otlp")
        .enable_all()
        .build()
        .map(Arc::new)
        .map_err(|e| format!("cannot start the OTLP export runtime: {e}"))
}

/// One quick retry: the exporter's default (3 retries with growing delays) makes every batch
/// pending for a collector that is down cost ~0.85 s at the final flush.
fn retry_policy() -> opentelemetry_otlp::RetryPolicy {
    opentelemetry_otlp::RetryPolicy::recommended()
        .with_max_retries(1)
        .with_initial_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_millis(100))
        .with_max_jitter(Duration::from_millis(20))
}

/// An HTTP client for OTLP/HTTP: rustls with the webpki and native roots, no redirects.
fn http_client() -> Result<reqwest::Client, String> {
    let tls = crate::gateway::tls::client_config(None)?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("OTLP HTTP client: {e}"))
}

fn http_protocol(p: Protocol) -> opentelemetry_otlp::Protocol {
    match p {
        Protocol::HttpJson => opentelemetry_otlp::Protocol::HttpJson,
        _ => opentelemetry_otlp::Protocol::HttpBinary,
    }
}

/// Builds the OTLP exporter of one signal for `ep` from its builder (the three signals'
/// builders are distinct types with the same methods), inside `rt` so that tonic's channel
/// captures it, and wraps it to export on `rt`.
macro_rules! otlp_exporter {
    ($builder:expr, $what:literal, $ep:expr, $rt:expr, $timeout:expr, $warn:expr) => {{
        let (ep, rt, timeout): (&Endpoint, &Arc<tokio::runtime::Runtime>, Duration) =
            ($ep, $rt, $timeout);
        let _guard = rt.enter();
        let built = match ep.protocol {
            Protocol::Grpc => $builder
                .with_tonic()
                .with_retry_policy(retry_policy())
                .with_timeout(timeout)
                .with_endpoint(ep.url.clone())
                .build(),
            p => $builder
                .with_http()
                .with_protocol(http_protocol(p))
                .with_http_client(http_client()?)
                .with_retry_policy(retry_policy())
                .with_timeout(timeout)
                .with_endpoint(ep.url.clone())
                .build(),
        };
        let inner = built.map_err(|e| format!("OTLP {} exporter ({}): {e}", $what, ep.source))?;
        Ok(OnRuntime {
            inner,
            rt: rt.clone(),
            timeout,
            target: format!("{} ({})", ep.url, ep.protocol.as_str()),
            warn: $warn.clone(),
        })
    }};
}

/// The OTLP span exporter for `ep`, wrapped to run on `rt`.
pub fn span_exporter(
    ep: &Endpoint,
    rt: &Arc<tokio::runtime::Runtime>,
    timeout: Duration,
    warn: &Arc<Warn>,
) -> Result<OnRuntime<opentelemetry_otlp::SpanExporter>, String> {
    let b = opentelemetry_otlp::SpanExporter::builder();
    otlp_exporter!(b, "trace", ep, rt, timeout, warn)
}

/// The OTLP metric exporter for `ep` (cumulative), wrapped to run on `rt`.
pub fn metric_exporter(
    ep: &Endpoint,
    rt: &Arc<tokio::runtime::Runtime>,
    timeout: Duration,
    warn: &Arc<Warn>,
) -> Result<OnRuntime<opentelemetry_otlp::MetricExporter>, String> {
    let b = opentelemetry_otlp::MetricExporter::builder().with_temporality(Temporality::Cumulative);
    otlp_exporter!(b, "metric", ep, rt, timeout, warn)
}

/// The OTLP log exporter for `ep`, wrapped to run on `rt`.
pub fn log_exporter(
    ep: &Endpoint,
    rt: &Arc<tokio::runtime::Runtime>,
    timeout: Duration,
    warn: &Arc<Warn>,
) -> Result<OnRuntime<opentelemetry_otlp::LogExporter>, String> {
    let b = opentelemetry_otlp::LogExporter::builder();
    otlp_exporter!(b, "log", ep, rt, timeout, warn)
}

/// The batch log processor for `exporter`: bounded queue, sent every second.
pub fn log_processor(
    exporter: OnRuntime<opentelemetry_otlp::LogExporter>,
) -> opentelemetry_sdk::logs::BatchLogProcessor {
    let config = opentelemetry_sdk::logs::BatchConfigBuilder::default()
        .with_max_queue_size(MAX_QUEUED_SPANS)
        .with_scheduled_delay(SPAN_DELAY)
        .build();
    opentelemetry_sdk::logs::BatchLogProcessor::builder(exporter)
        .with_batch_config(config)
        .build()
}

/// The batch processor for `exporter`: bounded queue, sent every second.
pub fn batch_processor(
    exporter: OnRuntime<opentelemetry_otlp::SpanExporter>,
) -> opentelemetry_sdk::trace::BatchSpanProcessor {
    let config = opentelemetry_sdk::trace::BatchConfigBuilder::default()
        .with_max_queue_size(MAX_QUEUED_SPANS)
        .with_max_export_batch_size(512)
        .with_scheduled_delay(SPAN_DELAY)
        .build();
    opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter)
        .with_batch_config(config)
        .build()
}

/// The periodic reader for `exporter`.
pub fn metric_reader(
    exporter: OnRuntime<opentelemetry_otlp::MetricExporter>,
) -> opentelemetry_sdk::metrics::PeriodicReader<OnRuntime<opentelemetry_otlp::MetricExporter>> {
    opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
        .with_interval(METRIC_INTERVAL)
        .build()
}

/// Keeps every ended span (up to [`MAX_FILE_SPANS`]) for `--trace FILE`.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    spans: Arc<Mutex<Vec<SpanData>>>,
    dropped: Arc<AtomicU64>,
}

impl Collected {
    /// The spans so far, and how many were dropped.
    pub fn take(&self) -> (Vec<SpanData>, u64) {
        let spans = std::mem::take(&mut *self.spans.lock().unwrap_or_else(|e| e.into_inner()));
        (spans, self.dropped.load(Ordering::Relaxed))
    }
}

impl SpanProcessor for Collected {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        if spans.len() < MAX_FILE_SPANS {
            spans.push(span);
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The spans as an OTLP JSON document (`ExportTraceServiceRequest`, the OTLP/HTTP JSON
/// encoding: hex ids, times as decimal strings).
pub fn otlp_json(spans: Vec<SpanData>, resource: &Resource) -> Result<Vec<u8>, String> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    let resource_spans =
        group_spans_by_resource_and_scope(spans, &ResourceAttributesWithSchema::from(resource));
    let doc = ExportTraceServiceRequest { resource_spans };
    serde_json::to_vec(&doc).map_err(|e| format!("encoding the trace: {e}"))
}
