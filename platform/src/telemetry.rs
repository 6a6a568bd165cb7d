//! Logging and tracing. Logs are human-readable lines, or one JSON object a line with
//! `FLEET_LOG_FORMAT=json`. Spans always carry W3C trace context (so `traceparent` flows from the
//! API request through AMQP headers to outgoing HTTP); with `OTEL_EXPORTER_OTLP_ENDPOINT` set they
//! are exported over OTLP/HTTP (`OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` or `http/json`).

use std::collections::HashMap;

use lapin::types::{AMQPValue, FieldTable, LongString};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::Context;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

use crate::config::LogFormat;

/// Flushes exported spans when the process ends.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    pub fn shutdown(self) {
        let _ = self.provider.shutdown();
    }
}

/// The OTLP exporter's HTTP client: reqwest's blocking client, because the SDK's batch processor
/// exports from its own thread, outside any async runtime.
#[derive(Debug)]
struct BlockingHttp(reqwest::blocking::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for BlockingHttp {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let response =
            self.0.request(parts.method, parts.uri.to_string()).headers(parts.headers).body(body.to_vec()).send()?;
        let status = response.status();
        let body = response.bytes()?;
        Ok(http::Response::builder().status(status).body(body)?)
    }
}

/// Installs logging and tracing for `service` (`dispatcher`, `worker`); `RUST_LOG` filters (default
/// `info`). Spans are exported trusting `tls`'s roots, like every other connection.
pub fn init(format: LogFormat, service: &'static str, tls: &crate::tls::ClientTls) -> Telemetry {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let mut builder =
        SdkTracerProvider::builder().with_resource(Resource::builder().with_service_name(service).build());
    let exporting = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| !s.is_empty()));
    let mut export_error = None;
    if exporting {
        // The blocking client owns a runtime of its own, which must not be built (or dropped)
        // inside the process's async runtime.
        let roots = tls.http_config();
        let client = std::thread::spawn(move || {
            reqwest::blocking::Client::builder()
                .no_proxy()
                .use_preconfigured_tls(roots)
                .timeout(std::time::Duration::from_secs(10))
                .build()
        })
        .join()
        .expect("building the OTLP client does not panic");
        match client.map_err(|e| e.to_string()).and_then(|c| {
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(BlockingHttp(c))
                .with_timeout(std::time::Duration::from_secs(10))
                .build()
                .map_err(|e| e.to_string())
        }) {
            Ok(exporter) => builder = builder.with_batch_exporter(exporter),
            Err(e) => export_error = Some(e),
        }
    }
    let provider = builder.build();
    let tracer = provider.tracer(service);
    opentelemetry::global::set_tracer_provider(provider.clone());

    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,lapin=warn"));
    let fmt_layer = match format {
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Text => fmt::layer().with_target(false).with_writer(std::io::stderr).boxed(),
    };
    tracing_subscriber::registry()
        .with(fmt_layer.with_filter(filter()))
        // Trace context must flow whatever RUST_LOG says, so the fleet's own spans always reach
        // the OpenTelemetry layer.
        .with(tracing_opentelemetry::layer().with_tracer(tracer).with_filter(fleet_spans()))
        .init();
    if let Some(e) = export_error {
        tracing::warn!(error = %e, "OTLP exporter not started; spans are not exported");
    }
    Telemetry { provider }
}

fn fleet_spans() -> tracing_subscriber::filter::Targets {
    use tracing::Level;
    tracing_subscriber::filter::Targets::new()
        .with_target("fleet_dispatcher", Level::INFO)
        .with_target("fleet_worker", Level::INFO)
        .with_target("fleet_platform", Level::INFO)
        .with_default(Level::WARN)
}

fn propagator() -> TraceContextPropagator {
    TraceContextPropagator::new()
}

/// The trace context in `span`, as AMQP headers (`traceparent`, `tracestate`).
pub fn amqp_headers(span: &tracing::Span) -> FieldTable {
    let mut carrier: HashMap<String, String> = HashMap::new();
    propagator().inject_context(&span.context(), &mut carrier);
    let mut table = FieldTable::default();
    for (k, v) in carrier {
        table.insert(k.as_str().into(), AMQPValue::LongString(LongString::from(v.into_bytes())));
    }
    table
}

/// The trace context carried by AMQP headers.
pub fn from_amqp_headers(headers: Option<&FieldTable>) -> Context {
    let mut carrier: HashMap<String, String> = HashMap::new();
    if let Some(h) = headers {
        for (k, v) in h.inner() {
            if let AMQPValue::LongString(s) = v {
                if let Ok(text) = std::str::from_utf8(s.as_bytes()) {
                    carrier.insert(k.as_str().to_string(), text.to_string());
                }
            }
        }
    }
    propagator().extract(&carrier)
}

/// The trace context carried by HTTP request headers.
pub fn from_http_headers(headers: &http::HeaderMap) -> Context {
    let carrier: HashMap<String, String> =
        headers.iter().filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_string(), v.to_string()))).collect();
    propagator().extract(&carrier)
}

/// The `traceparent` (and `tracestate`) for an outgoing HTTP request made within `span`.
pub fn http_headers(span: &tracing::Span) -> Vec<(String, String)> {
    let mut carrier: HashMap<String, String> = HashMap::new();
    propagator().inject_context(&span.context(), &mut carrier);
    carrier.into_iter().collect()
}

/// The trace id of `span` in hex (for logs).
pub fn trace_id(span: &tracing::Span) -> String {
    use opentelemetry::trace::TraceContextExt;
    span.context().span().span_context().trace_id().to_string()
}
