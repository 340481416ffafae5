//! OTLP/HTTP (protobuf) span export that never blocks the daemon.
//!
//! The SDK's own batch processor drops the *newest* span when its queue is full; conduit's rule
//! (docs/operations.md, "Telemetry") is the opposite, so the queue is ours: [`RingProcessor`] keeps at most
//! [`QUEUE_CAPACITY`] spans and drops the oldest to make room, one exporter thread sends
//! batches of [`BATCH_SIZE`], each attempt bounded by [`EXPORT_TIMEOUT`], [`ATTEMPTS`] attempts,
//! then the batch is dropped. A span's end costs a lock and a push; a collector that hangs or
//! refuses connections costs only dropped spans, counted in [`STATS`]. The HTTP client is the
//! hyper the daemon already has, on the exporter thread's own single-threaded runtime.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter, SpanProcessor};

use super::export::{ExportThread, HyperHttp, attempts, env, resource};

/// Spans held while the collector is slow or away; the oldest go first.
pub const QUEUE_CAPACITY: usize = 4096;
/// Spans per export request.
pub const BATCH_SIZE: usize = 128;
pub use super::export::{ATTEMPTS, EXPORT_TIMEOUT};
/// How long a partial batch waits for more spans.
const FLUSH_INTERVAL: Duration = Duration::from_millis(200);
/// Where and what to export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The traces URL, `http://host:port/v1/traces`; `None`: spans are not exported.
    pub traces_url: Option<String>,
    /// Where metrics go; `None`: they are not exported.
    pub metrics: Option<super::otlp_metrics::Target>,
}

/// Export counters, for `GET /v1/health` and `GET /v1/metrics`.
#[derive(Debug, Default)]
pub struct ExportStats {
    pub enabled: AtomicBool,
    /// Spans accepted into the queue.
    pub queued: AtomicU64,
    /// Spans the collector acknowledged.
    pub exported: AtomicU64,
    /// Spans pushed out of a full queue.
    pub dropped_queue_full: AtomicU64,
    /// Spans of batches that failed every attempt.
    pub dropped_export_failed: AtomicU64,
    /// Export attempts that failed or timed out.
    pub failed_attempts: AtomicU64,
    /// Spans waiting now.
    pub pending: AtomicU64,
}

impl ExportStats {
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full.load(Ordering::Relaxed)
            + self.dropped_export_failed.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> serde_json::Value {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "export": if self.enabled.load(Ordering::Relaxed) { "otlp-http" } else { "off" },
            "queued": l(&self.queued),
            "exported": l(&self.exported),
            "pending": l(&self.pending),
            "dropped": self.dropped(),
            "dropped_queue_full": l(&self.dropped_queue_full),
            "dropped_export_failed": l(&self.dropped_export_failed),
            "failed_attempts": l(&self.failed_attempts),
            "metrics": super::otlp_metrics::STATS.snapshot(),
        })
    }
}

/// The process's export counters (one exporter per process).
pub static STATS: ExportStats = ExportStats {
    enabled: AtomicBool::new(false),
    queued: AtomicU64::new(0),
    exported: AtomicU64::new(0),
    dropped_queue_full: AtomicU64::new(0),
    dropped_export_failed: AtomicU64::new(0),
    failed_attempts: AtomicU64::new(0),
    pending: AtomicU64::new(0),
};

/// The export configuration from `--otlp-endpoint` (`flag`) and the standard variables:
/// `OTEL_SDK_DISABLED=true` turns export off whatever else is set; per signal (traces,
/// metrics) the endpoint is the flag with `/v1/<signal>` appended, else
/// `OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT` (the full URL), else `OTEL_EXPORTER_OTLP_ENDPOINT`
/// with `/v1/<signal>` appended; `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER` = `none`
/// turns one signal off; the protocol must be `http/protobuf` (the default);
/// `OTEL_METRIC_EXPORT_INTERVAL` sets the metrics interval. `Ok(None)`: nothing configured,
/// export off.
pub fn config_from_env(flag: Option<&str>) -> Result<Option<Config>, String> {
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let flag = flag.map(str::trim).filter(|f| !f.is_empty());
    let traces_url = signal_url(flag, "TRACES", "traces")?;
    let metrics_url = signal_url(flag, "METRICS", "metrics")?;
    let metrics = match metrics_url {
        None => None,
        Some(url) => Some(super::otlp_metrics::Target {
            url,
            interval: super::otlp_metrics::interval_from_env()?,
        }),
    };
    if traces_url.is_none() && metrics.is_none() {
        return Ok(None);
    }
    Ok(Some(Config {
        traces_url,
        metrics,
    }))
}

/// The URL one signal goes to, or `None` if it is not exported.
fn signal_url(flag: Option<&str>, upper: &str, path: &str) -> Result<Option<String>, String> {
    let selector = format!("OTEL_{upper}_EXPORTER");
    match env(&selector).map(|v| v.trim().to_ascii_lowercase()) {
        None => {}
        Some(v) if v == "otlp" => {}
        Some(v) if v == "none" => return Ok(None),
        Some(v) => {
            return Err(format!(
                "{selector} is `{v}`; this build exports `otlp` only: unset it, or set it to `otlp` or `none`"
            ));
        }
    }
    let specific = format!("OTEL_EXPORTER_OTLP_{upper}_ENDPOINT");
    let url = if let Some(f) = flag {
        check_url(f, "--otlp-endpoint")?;
        format!("{}/v1/{path}", f.trim_end_matches('/'))
    } else if let Some(u) = env(&specific) {
        check_url(u.trim(), &specific)?;
        u.trim().to_owned()
    } else if let Some(u) = env("OTEL_EXPORTER_OTLP_ENDPOINT") {
        check_url(u.trim(), "OTEL_EXPORTER_OTLP_ENDPOINT")?;
        format!("{}/v1/{path}", u.trim().trim_end_matches('/'))
    } else {
        return Ok(None);
    };
    for var in [
        format!("OTEL_EXPORTER_OTLP_{upper}_PROTOCOL"),
        "OTEL_EXPORTER_OTLP_PROTOCOL".to_owned(),
    ] {
        if let Some(p) = env(&var) {
            if p.trim() != "http/protobuf" {
                return Err(format!(
                    "{var} is `{p}`; this build exports `http/protobuf` only (no gRPC): unset it or set it to `http/protobuf`, and point the endpoint at the collector's OTLP/HTTP port (4318)"
                ));
            }
            break;
        }
    }
    Ok(Some(url))
}

pub(crate) fn check_url(url: &str, from: &str) -> Result<(), String> {
    let uri: http::Uri = url.parse().map_err(|e| {
        format!("{from} is `{url}`, which is not a URL ({e}); e.g. `http://127.0.0.1:4318`")
    })?;
    match uri.scheme_str() {
        Some("http") if uri.host().is_some() => Ok(()),
        Some("https") => Err(format!(
            "{from} is `{url}`: this build exports over plain `http://` only (no TLS); point it at a local collector, which can forward over TLS"
        )),
        _ => Err(format!(
            "{from} is `{url}`; it must be an `http://host:port` URL, e.g. `http://127.0.0.1:4318`"
        )),
    }
}

/// The layer filter of the exporting layer: conduit's own spans only. Never the HTTP client's
/// or the SDK's own targets, which would feed the exporter with its own work.
pub(crate) fn span_filter<S>() -> impl tracing_subscriber::layer::Filter<S> {
    // The level hint keeps `trace` call sites elsewhere switched off by the level check alone.
    tracing_subscriber::filter::filter_fn(|m| {
        m.is_span()
            && (m.target().starts_with("conduit_host")
                || m.target().starts_with("conduit_supervisor"))
    })
    .with_max_level_hint(tracing::Level::DEBUG)
}

/// The spans waiting for the exporter thread.
type Shared = ExportThread<VecDeque<SpanData>>;

/// The span processor: a bounded queue in front of the exporter thread.
pub struct RingProcessor {
    shared: Shared,
}

impl std::fmt::Debug for RingProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingProcessor").finish_non_exhaustive()
    }
}

impl SpanProcessor for RingProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        let mut q = self.shared.lock();
        if q.closing {
            STATS.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if push_dropping_oldest(&mut q.data, span, QUEUE_CAPACITY) {
            STATS.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
        } else {
            STATS.pending.fetch_add(1, Ordering::Relaxed);
        }
        STATS.queued.fetch_add(1, Ordering::Relaxed);
        if q.data.len() >= BATCH_SIZE {
            self.shared.wake();
        }
    }

    // Never waits: the daemon's own shutdown path drains the queue for a bounded time.
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Queue `item`, first dropping the oldest if `q` already holds `capacity`; true if one was
/// dropped.
fn push_dropping_oldest<T>(q: &mut VecDeque<T>, item: T, capacity: usize) -> bool {
    let full = q.len() >= capacity;
    if full {
        q.pop_front();
    }
    q.push_back(item);
    full
}

/// The running export: the tracer provider and the exporter thread.
#[derive(Debug)]
pub struct Pipeline {
    endpoint: String,
    shared: Shared,
    _provider: SdkTracerProvider,
}

impl Pipeline {
    /// Start the exporter thread; the layer is what the subscriber feeds.
    pub fn start<S>(
        traces_url: String,
    ) -> (Pipeline, impl tracing_subscriber::Layer<S> + Send + Sync)
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        let shared: Shared = ExportThread::new(VecDeque::with_capacity(BATCH_SIZE));
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(HyperHttp)
            .with_endpoint(traces_url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(RingProcessor {
                shared: shared.clone(),
            })
            .with_resource(resource())
            .build();
        let tracer = provider.tracer("conduit");
        match exporter {
            Ok(mut exporter) => {
                exporter.set_resource(&resource());
                if shared.spawn("conduit-otlp", "spans", move |s, rt| {
                    export_thread(s, rt, exporter)
                }) {
                    STATS.enabled.store(true, Ordering::Relaxed);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot build the OTLP exporter; spans are dropped");
                // No thread will drain the queue: the stop does not wait for one.
                shared.shutdown(Duration::ZERO);
            }
        }
        // Only the span's own fields: source locations, thread names and busy/idle timers would
        // cost every call an allocation or a clock read for attributes nobody asked for.
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            // Attaching the OpenTelemetry context on every poll of an instrumented future cost
            // about 15 µs a poll across the runtime's threads; parents come from tracing's own
            // span tree, and nothing in the daemon reads the OpenTelemetry context.
            .with_context_activation(false);
        (
            Pipeline {
                endpoint: traces_url,
                shared,
                _provider: provider,
            },
            layer,
        )
    }

    /// The traces URL spans go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Stop accepting spans and give the exporter thread up to `within` to send what is
    /// queued; a hung collector costs at most that.
    pub fn shutdown(self, within: Duration) {
        self.shared.shutdown(within);
    }
}

/// Send batches of [`BATCH_SIZE`] (or what [`FLUSH_INTERVAL`] gathered) until closed and empty.
fn export_thread(
    shared: &Shared,
    rt: &tokio::runtime::Runtime,
    exporter: opentelemetry_otlp::SpanExporter,
) {
    loop {
        let (batch, closing) = {
            let mut q = shared.wait(Instant::now() + FLUSH_INTERVAL, |q| q.len() >= BATCH_SIZE);
            let n = q.data.len().min(BATCH_SIZE);
            let batch: Vec<SpanData> = q.data.drain(..n).collect();
            STATS.pending.fetch_sub(n as u64, Ordering::Relaxed);
            if batch.is_empty() && q.closing {
                return;
            }
            (batch, q.closing)
        };
        if batch.is_empty() {
            continue;
        }
        let n = batch.len() as u64;
        // While closing, one short attempt each: the daemon's stop is bounded by the caller.
        let (tries, timeout) = if closing {
            (1, Duration::from_secs(1))
        } else {
            (ATTEMPTS, EXPORT_TIMEOUT)
        };
        // The timers are made inside the runtime, which they need.
        let sent = rt.block_on(attempts(tries, timeout, &STATS.failed_attempts, || {
            exporter.export(batch.clone())
        }));
        if sent {
            STATS.exported.fetch_add(n, Ordering::Relaxed);
        } else {
            STATS.dropped_export_failed.fetch_add(n, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_its_oldest() {
        let mut q = VecDeque::new();
        for i in 0..QUEUE_CAPACITY {
            assert!(!push_dropping_oldest(&mut q, i, QUEUE_CAPACITY), "at {i}");
        }
        assert_eq!(q.len(), QUEUE_CAPACITY);
        // One past the limit: the first is gone, the newest kept.
        assert!(push_dropping_oldest(&mut q, QUEUE_CAPACITY, QUEUE_CAPACITY));
        assert_eq!(q.len(), QUEUE_CAPACITY);
        assert_eq!(q.front(), Some(&1));
        assert_eq!(q.back(), Some(&QUEUE_CAPACITY));
    }

    #[test]
    fn endpoints_follow_the_otlp_variables() {
        assert_eq!(
            signal_url(Some("http://127.0.0.1:4318/"), "TRACES", "traces").unwrap(),
            Some("http://127.0.0.1:4318/v1/traces".to_owned())
        );
        assert!(
            check_url("https://c:4318", "x")
                .unwrap_err()
                .contains("no TLS")
        );
        assert!(check_url("c:4318", "x").is_err());
    }
}
