//! Logging and tracing. Logs are human-readable lines, or one JSON object a line with
//! `FLEET_LOG_FORMAT=json`. W3C trace context (`traceparent`, `tracestate`) always flows from the
//! API request through AMQP headers to outgoing HTTP. With `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, spans are built by the OpenTelemetry layer and
//! exported over OTLP/HTTP (`OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` or `http/json`), and
//! each hop sends its own span as the parent. Without an exporter no span data is built: the
//! context a request or job arrived with is passed on unchanged (a fresh one is made where none
//! arrived), so a caller's trace still links through the fleet at no cost per job.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use lapin::types::{AMQPValue, FieldTable, LongString};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt, TraceFlags, TraceState, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer, Registry};

use crate::config::LogFormat;

/// Whether the OpenTelemetry layer is installed (an exporter is configured and started). Set
/// once by `init`; until then, and without an exporter, trace context is passed through.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported: a span built only to be exported is not worth building otherwise.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Flushes exported spans when the process ends.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            let _ = provider.shutdown();
        }
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

/// Whether the environment asks for spans to be exported (the SDK's own variables).
fn export_configured(var: impl Fn(&str) -> Option<String>) -> bool {
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|v| var(v).is_some_and(|s| !s.trim().is_empty()))
}

/// The OTLP span exporter, trusting `tls`'s roots like every other connection.
fn exporter(tls: &crate::tls::ClientTls) -> Result<opentelemetry_otlp::SpanExporter, String> {
    // The blocking client owns a runtime of its own, which must not be built (or dropped)
    // inside the process's async runtime.
    let roots = tls.http_config();
    let client = std::thread::spawn(move || {
        // Neither a proxy nor a redirect may send the spans anywhere but the configured collector.
        reqwest::blocking::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .use_preconfigured_tls(roots)
            .timeout(std::time::Duration::from_secs(10))
            .build()
    })
    .join()
    .expect("building the OTLP client does not panic");
    let client = client.map_err(|e| e.to_string())?;
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(BlockingHttp(client))
        .with_timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())
}

/// Installs logging and tracing for `service` (`dispatcher`, `worker`); `RUST_LOG` filters (default
/// `info`). The OpenTelemetry layer is installed only when spans are exported.
pub fn init(format: LogFormat, service: &'static str, tls: &crate::tls::ClientTls) -> Telemetry {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let mut export_error = None;
    let exporter = if export_configured(|v| std::env::var(v).ok()) {
        exporter(tls).map_err(|e| export_error = Some(e)).ok()
    } else {
        None
    };

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
    let registry = tracing_subscriber::registry().with(fmt_layer.with_filter(filter()));
    // Trace context must flow whatever RUST_LOG says, so the fleet's own spans are always enabled
    // (by the OpenTelemetry layer, or else by a layer that only keeps them).
    let provider = match exporter {
        Some(exporter) => {
            let provider = SdkTracerProvider::builder()
                .with_resource(Resource::builder().with_service_name(service).build())
                .with_batch_exporter(exporter)
                .build();
            let tracer = provider.tracer(service);
            opentelemetry::global::set_tracer_provider(provider.clone());
            EXPORTING.store(true, Ordering::Relaxed);
            registry.with(tracing_opentelemetry::layer().with_tracer(tracer).with_filter(fleet_spans())).init();
            Some(provider)
        }
        None => {
            registry.with(KeepSpans.with_filter(fleet_spans())).init();
            None
        }
    };
    if let Some(e) = export_error {
        tracing::warn!(error = %e, "OTLP exporter not started; spans are not exported");
    }
    Telemetry { provider }
}

/// Does nothing with spans: its filter keeps the fleet's spans enabled so they can carry the
/// trace context passed through when nothing exports.
struct KeepSpans;

impl<S: tracing::Subscriber> Layer<S> for KeepSpans {}

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

/// The trace context a span carries when nothing exports: the one it arrived with, or a fresh one.
struct Carried(SpanContext);

/// Continues the trace of `parent` (from `from_amqp_headers`, `from_http_headers`) in `span`.
pub fn set_parent(span: &tracing::Span, parent: Context) {
    if exporting() {
        let _ = OpenTelemetrySpanExt::set_parent(span, parent);
        return;
    }
    let arrived = parent.span().span_context().clone();
    if arrived.is_valid() {
        span.with_subscriber(|(id, dispatch)| {
            let span = dispatch.downcast_ref::<Registry>()?.span(id)?;
            span.extensions_mut().replace(Carried(arrived));
            Some(())
        });
    }
}

/// A new trace's context, sampled like the SDK's default root span.
fn fresh_context() -> SpanContext {
    let ids = RandomIdGenerator::default();
    SpanContext::new(ids.new_trace_id(), ids.new_span_id(), TraceFlags::SAMPLED, false, TraceState::default())
}

/// The context `span` passes on when nothing exports: the nearest one carried by it or a span it
/// is within, else a fresh one that its outermost span keeps for what follows.
fn carried(span: &tracing::Span) -> SpanContext {
    let found = span.with_subscriber(|(id, dispatch)| {
        let span = dispatch.downcast_ref::<Registry>()?.span(id)?;
        let mut outermost = None;
        for within in span.scope() {
            if let Some(Carried(context)) = within.extensions().get::<Carried>() {
                return Some(context.clone());
            }
            outermost = Some(within);
        }
        let outermost = outermost?;
        let mut extensions = outermost.extensions_mut();
        if let Some(Carried(context)) = extensions.get_mut::<Carried>() {
            return Some(context.clone());
        }
        let fresh = fresh_context();
        extensions.insert(Carried(fresh.clone()));
        Some(fresh)
    });
    found.flatten().unwrap_or_else(SpanContext::empty_context)
}

/// The context whose span is the parent of what `span` sends.
fn outgoing(span: &tracing::Span) -> Context {
    if exporting() {
        span.context()
    } else {
        Context::new().with_remote_span_context(carried(span))
    }
}

/// The trace context in `span`, as AMQP headers (`traceparent`, `tracestate`).
pub fn amqp_headers(span: &tracing::Span) -> FieldTable {
    let mut carrier: HashMap<String, String> = HashMap::new();
    propagator().inject_context(&outgoing(span), &mut carrier);
    let mut table = FieldTable::default();
    for (k, v) in carrier {
        table.insert(k.as_str().into(), AMQPValue::LongString(LongString::from(v.into_bytes())));
    }
    table
}

/// Reads trace context straight from AMQP headers (text values only).
struct AmqpExtractor<'a>(Option<&'a FieldTable>);

impl Extractor for AmqpExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match self.0?.inner().get(key)? {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.0.map(|h| h.inner().keys().map(|k| k.as_str()).collect()).unwrap_or_default()
    }
}

/// The trace context carried by AMQP headers.
pub fn from_amqp_headers(headers: Option<&FieldTable>) -> Context {
    propagator().extract(&AmqpExtractor(headers))
}

/// The trace context carried by HTTP request headers.
pub fn from_http_headers(headers: &http::HeaderMap) -> Context {
    propagator().extract(&opentelemetry_http::HeaderExtractor(headers))
}

/// The `traceparent` (and `tracestate`) for an outgoing HTTP request made within `span`.
pub fn http_headers(span: &tracing::Span) -> Vec<(String, String)> {
    let mut carrier: HashMap<String, String> = HashMap::new();
    propagator().inject_context(&outgoing(span), &mut carrier);
    carrier.into_iter().collect()
}

/// The trace id of `span` in hex (for logs).
pub fn trace_id(span: &tracing::Span) -> String {
    outgoing(span).span().span_context().trace_id().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// Runs `f` under a subscriber like the one `init` installs when nothing exports.
    fn passing_through<T>(f: impl FnOnce() -> T) -> T {
        let subscriber = tracing_subscriber::registry().with(KeepSpans.with_filter(fleet_spans()));
        tracing::subscriber::with_default(subscriber, f)
    }

    fn amqp(pairs: &[(&str, &str)]) -> FieldTable {
        let mut table = FieldTable::default();
        for (k, v) in pairs {
            table.insert((*k).into(), AMQPValue::LongString(LongString::from(v.as_bytes().to_vec())));
        }
        table
    }

    fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn only_an_endpoint_turns_exporting_on() {
        assert!(!export_configured(|_| None));
        assert!(!export_configured(|_| Some(" ".into())));
        assert!(export_configured(|v| (v == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").then(|| "http://c:4318".into())));
        assert!(export_configured(|v| (v == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://c:4318".into())));
    }

    #[test]
    fn an_arriving_context_is_passed_on_unchanged_to_nested_spans() {
        passing_through(|| {
            let job = tracing::info_span!(target: "fleet_worker", "job");
            let headers = amqp(&[("traceparent", PARENT), ("tracestate", "vendor=abc"), ("x-delivery-count", "2")]);
            set_parent(&job, from_amqp_headers(Some(&headers)));
            let http = job.in_scope(|| tracing::info_span!(target: "fleet_worker", "http"));
            let sent = http_headers(&http);
            assert_eq!(header(&sent, "traceparent"), Some(PARENT));
            assert_eq!(header(&sent, "tracestate"), Some("vendor=abc"));
            let published = job.in_scope(|| amqp_headers(&tracing::Span::current()));
            let published = from_amqp_headers(Some(&published));
            assert_eq!(published.span().span_context().span_id().to_string(), "00f067aa0ba902b7");
            assert_eq!(published.span().span_context().trace_state().header(), "vendor=abc");
            assert_eq!(trace_id(&http), "4bf92f3577b34da6a3ce929d0e0e4736");
        });
    }

    #[test]
    fn without_an_arriving_context_a_span_tree_shares_one_fresh_trace() {
        passing_through(|| {
            let job = tracing::info_span!(target: "fleet_worker", "job");
            set_parent(&job, from_amqp_headers(Some(&amqp(&[("traceparent", "not a traceparent")]))));
            let first = job.in_scope(|| http_headers(&tracing::info_span!(target: "fleet_worker", "http")));
            let again = job.in_scope(|| http_headers(&tracing::info_span!(target: "fleet_worker", "llm")));
            let first = header(&first, "traceparent").expect("a fresh traceparent");
            assert_eq!(Some(first), header(&again, "traceparent"), "one trace per job");
            let parts: Vec<&str> = first.split('-').collect();
            assert!(parts.len() == 4 && parts[0] == "00" && parts[1].len() == 32 && parts[3] == "01", "{first}");
            let other = http_headers(&tracing::info_span!(target: "fleet_worker", "job"));
            assert_ne!(header(&other, "traceparent"), Some(first), "another job, another trace");
        });
    }

    #[test]
    fn outside_any_span_nothing_is_sent() {
        passing_through(|| {
            assert!(http_headers(&tracing::Span::none()).is_empty());
            assert!(amqp_headers(&tracing::Span::current()).inner().is_empty());
        });
    }

    #[test]
    fn http_headers_are_read_case_insensitively() {
        let mut headers = http::HeaderMap::new();
        headers.insert("TraceParent", PARENT.parse().unwrap());
        let context = from_http_headers(&headers);
        assert_eq!(context.span().span_context().trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }
}
