//! Where a run's telemetry goes: the spec's `observe:` block, voidbox's own variables and
//! the standard `OTEL_*` ones, resolved once before anything starts.
//!
//! - Endpoint (per signal): `observe.otlp_endpoint`, else `VOIDBOX_OTLP_ENDPOINT`, else the
//!   standard `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT` (used as is) and
//!   `OTEL_EXPORTER_OTLP_ENDPOINT`. A base URL gets `/v1/traces` or `/v1/metrics` over HTTP.
//!   None of them: no export. `OTEL_{TRACES,METRICS,LOGS}_EXPORTER=none` turns a signal off.
//! - Protocol: `OTEL_EXPORTER_OTLP_{TRACES_,METRICS_,}PROTOCOL` (`grpc`, `http/protobuf`,
//!   `http/json`); unset, port 4317 means gRPC and anything else HTTP/protobuf.
//! - Headers, compression and certificates: the standard `OTEL_EXPORTER_OTLP_*` variables,
//!   read by the exporter.
//! - Service name: `OTEL_SERVICE_NAME`, `VOIDBOX_SERVICE_NAME`, `observe.service_name`,
//!   then `voidbox`.
//! - `observe.traces` / `observe.metrics` switch the parts (absent: on); log records are
//!   opt-in (`observe.logs: true` or `OTEL_LOGS_EXPORTER=otlp`); `OTEL_SDK_DISABLED=true`
//!   turns export off.

use std::path::PathBuf;
use std::time::Duration;

use crate::spec::model::Observe;

/// Port that selects gRPC when no protocol variable says otherwise (OTLP's gRPC default).
const GRPC_PORT: u16 = 4317;
/// Default service name.
pub const DEFAULT_SERVICE_NAME: &str = "voidbox";
/// Longest a run's exit waits for the last export.
pub const FLUSH_BUDGET: Duration = Duration::from_secs(5);
/// Longest one export may take (`OTEL_EXPORTER_OTLP_TIMEOUT` when lower).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP with protobuf bodies.
    HttpProtobuf,
    /// OTLP/HTTP with JSON bodies.
    HttpJson,
}

impl Protocol {
    /// The name used by `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::HttpJson => "http/json",
        }
    }
}

/// Where one signal's OTLP goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The full URL (HTTP: with its `/v1/traces` or `/v1/metrics` path; gRPC: the server).
    pub url: String,
    /// Where it came from (`observe.otlp_endpoint`, a variable's name).
    pub source: &'static str,
    /// Transport.
    pub protocol: Protocol,
}

/// A run's telemetry settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where traces are exported (`None`: not exported).
    pub endpoint: Option<Endpoint>,
    /// Where metrics are exported (`None`: not exported).
    pub metrics_endpoint: Option<Endpoint>,
    /// Where the run's log records are exported (`None`: not exported; they are opt-in).
    pub logs_endpoint: Option<Endpoint>,
    /// Spans are made (exported and/or written to `trace_file`).
    pub traces: bool,
    /// Metrics are exported.
    pub metrics: bool,
    /// `service.name`.
    pub service_name: String,
    /// `apply --trace FILE`.
    pub trace_file: Option<PathBuf>,
    /// `TRACEPARENT` (and `TRACESTATE`) of the caller, as given.
    pub traceparent: Option<(String, Option<String>)>,
    /// Per-export timeout.
    pub export_timeout: Duration,
}

impl Settings {
    /// `true` when nothing is recorded at all.
    pub fn is_off(&self) -> bool {
        !self.traces && !self.metrics && self.logs_endpoint.is_none()
    }

    /// Some signal is exported over OTLP.
    pub fn exports(&self) -> bool {
        self.endpoint.is_some() || self.metrics_endpoint.is_some() || self.logs_endpoint.is_some()
    }
}

/// Resolves the settings from the spec's `observe`, the environment (`env`) and `--trace`.
/// A malformed endpoint, protocol, exporter or timeout is an error naming where it came from.
pub fn resolve(
    observe: Option<&Observe>,
    env: &dyn Fn(&str) -> Option<String>,
    trace_file: Option<PathBuf>,
) -> Result<Settings, String> {
    let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let ours = match (
        observe.and_then(|o| o.otlp_endpoint.clone()),
        var("VOIDBOX_OTLP_ENDPOINT"),
    ) {
        (Some(e), _) => Some((e, "observe.otlp_endpoint")),
        (None, Some(e)) => Some((e, "VOIDBOX_OTLP_ENDPOINT")),
        (None, None) => None,
    };
    // Logs are opt-in (`observe.logs: true` or `OTEL_LOGS_EXPORTER=otlp`); traces and metrics
    // are on unless switched off.
    let logs_wanted = observe.and_then(|o| o.logs) == Some(true)
        || var("OTEL_LOGS_EXPORTER").is_some_and(|v| v.trim() == "otlp");
    let signal = |sig: &'static str, path: &str| -> Result<Option<Endpoint>, String> {
        let exporter_var = format!("OTEL_{sig}_EXPORTER");
        match var(&exporter_var).as_deref().map(str::trim) {
            None if sig == "LOGS" && !logs_wanted => return Ok(None),
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(format!(
                    "{exporter_var}={other}: voidbox exports over OTLP only (otlp or none)"
                ))
            }
        }
        if disabled {
            return Ok(None);
        }
        let own_var: &'static str = match sig {
            "TRACES" => "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "LOGS" => "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            _ => "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        };
        let (url, source, base) = match (&ours, var(own_var), var("OTEL_EXPORTER_OTLP_ENDPOINT")) {
            (Some((u, s)), _, _) => (u.clone(), *s, true),
            (None, Some(u), _) => (u, own_var, false),
            (None, None, Some(u)) => (u, "OTEL_EXPORTER_OTLP_ENDPOINT", true),
            (None, None, None) => return Ok(None),
        };
        let proto_var: &'static str = match sig {
            "TRACES" => "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "LOGS" => "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
            _ => "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        };
        let protocol = [proto_var, "OTEL_EXPORTER_OTLP_PROTOCOL"]
            .into_iter()
            .find_map(|k| var(k).map(|v| (v, k)));
        endpoint(&url, source, base, path, protocol).map(Some)
    };
    let endpoint = signal("TRACES", "/v1/traces")?;
    let metrics_endpoint = signal("METRICS", "/v1/metrics")?;
    let logs_endpoint = signal("LOGS", "/v1/logs")?;
    let export_timeout = match var("OTEL_EXPORTER_OTLP_TIMEOUT") {
        Some(v) => {
            let ms: u64 = v.trim().parse().map_err(|_| {
                format!("OTEL_EXPORTER_OTLP_TIMEOUT={v}: not a number of milliseconds")
            })?;
            Duration::from_millis(ms).min(EXPORT_TIMEOUT)
        }
        None => EXPORT_TIMEOUT,
    };
    let on = |switch: Option<bool>| switch.unwrap_or(true);
    let traces_on = on(observe.and_then(|o| o.traces));
    let metrics_on = on(observe.and_then(|o| o.metrics));
    let service_name = var("OTEL_SERVICE_NAME")
        .or_else(|| var("VOIDBOX_SERVICE_NAME"))
        .or_else(|| observe.and_then(|o| o.service_name.clone()))
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
    let traceparent = var("TRACEPARENT")
        .map(|t| (t.trim().to_string(), var("TRACESTATE")))
        .or_else(|| var(RUN_ID_VAR).map(|id| (run_traceparent(&id), None)));
    let endpoint = endpoint.filter(|_| traces_on);
    let metrics_endpoint = metrics_endpoint.filter(|_| metrics_on);
    Ok(Settings {
        // `--trace FILE` asks for the spans whatever the spec says.
        traces: endpoint.is_some() || trace_file.is_some(),
        metrics: metrics_endpoint.is_some(),
        endpoint,
        metrics_endpoint,
        logs_endpoint,
        service_name,
        trace_file,
        traceparent,
        export_timeout,
    })
}

/// The variable a distributed run's node runners share (`voidbox export` sets it to the
/// engine's run id): without `TRACEPARENT`, each runner's trace is [`run_traceparent`] of it,
/// so the nodes of one run on many machines form one trace.
pub const RUN_ID_VAR: &str = "VOIDBOX_RUN_ID";

/// The W3C traceparent every runner of run `id` derives alike: trace id and parent span id
/// from SHA-256 of the id (the parent is the run's virtual root, which no runner records).
pub fn run_traceparent(id: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::digest(format!("voidbox-run\0{}", id.trim()).as_bytes()).to_vec();
    // All-zero ids are invalid in W3C Trace Context; a digest of zeros is merely unlikely.
    h[15] |= 1;
    h[23] |= 1;
    format!(
        "00-{}-{}-01",
        hex::encode(&h[..16]),
        hex::encode(&h[16..24])
    )
}

/// Checks that `url` can be an OTLP endpoint (`source` names it in the error).
pub fn check_endpoint(url: &str, source: &'static str) -> Result<(), String> {
    endpoint(url, source, true, "", None).map(drop)
}

/// Checks an endpoint URL, makes the signal's URL (`base`: append `path` for HTTP) and picks
/// the protocol.
fn endpoint(
    url: &str,
    source: &'static str,
    base: bool,
    path: &str,
    protocol_var: Option<(String, &'static str)>,
) -> Result<Endpoint, String> {
    let url = url.trim();
    let parsed = url::Url::parse(url).map_err(|e| {
        format!("{source}={url}: not a URL ({e}); use e.g. http://localhost:4317 (gRPC) or http://localhost:4318 (HTTP)")
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!(
            "{source}={url}: an OTLP endpoint is an http:// or https:// URL with a host"
        ));
    }
    let protocol = match protocol_var {
        Some((v, k)) => match v.trim() {
            "grpc" => Protocol::Grpc,
            "http/protobuf" => Protocol::HttpProtobuf,
            "http/json" => Protocol::HttpJson,
            other => {
                return Err(format!(
                    "{k}={other}: unknown OTLP protocol (grpc, http/protobuf or http/json)"
                ))
            }
        },
        None if parsed.port_or_known_default() == Some(GRPC_PORT) => Protocol::Grpc,
        None => Protocol::HttpProtobuf,
    };
    let url = match protocol {
        Protocol::HttpProtobuf | Protocol::HttpJson if base => {
            format!("{}{path}", url.trim_end_matches('/'))
        }
        _ => url.to_string(),
    };
    Ok(Endpoint {
        url,
        source,
        protocol,
    })
}
