//! Telemetry: the subscriber every `conduit` command logs through, the optional OTLP export
//! (spans and metrics) of `conduit daemon run`, and the metrics the health and metrics
//! endpoints show.
//!
//! Spans (extension calls, host-loop passes) are `debug`-level with fields, not formatted
//! strings. With nothing configured they are disabled at their call sites, so a daemon without
//! export pays nothing for them: no exporter, no thread, no layer. With an endpoint configured
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `--otlp-endpoint`), a second layer hands them to the
//! OpenTelemetry SDK, whose spans go through [`otlp`]'s bounded queue and never block a caller.
//! Metrics export ([`otlp_metrics`]) is one thread that sends a snapshot of [`metrics`] every
//! interval; without it, nothing runs.

mod export;
pub mod logs;
pub mod metrics;
pub mod otlp;
pub mod otlp_metrics;
pub mod snapshot;
mod storage;

use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;

pub use logs::LogFormat;

/// What `install` set up; dropping it flushes the export queue for a bounded time.
#[derive(Debug, Default)]
pub struct Guard {
    pipeline: Option<otlp::Pipeline>,
    metrics: Option<otlp_metrics::MetricsPipeline>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(p) = self.metrics.take() {
            p.shutdown(std::time::Duration::from_millis(500));
        }
        if let Some(p) = self.pipeline.take() {
            p.shutdown(std::time::Duration::from_secs(2));
        }
    }
}

/// Install the process's subscriber: logs to stderr in `format` at `default_filter` unless
/// `CONDUIT_LOG` says otherwise, and the export of each signal `export` names.
pub fn install(format: LogFormat, default_filter: &str, export: Option<otlp::Config>) -> Guard {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CONDUIT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // Records of the `log` crate (some dependencies log per poll at `trace`) are bridged only
    // up to the log filter's own level. Left to `init`, the bridge would take the highest level
    // any layer wants — `debug`, for the exporting layer's spans — and every one of those
    // records would be built and filtered again on the hot path.
    let log_level = filter
        .max_level_hint()
        .unwrap_or(tracing_subscriber::filter::LevelFilter::TRACE);
    let _ = tracing_log::LogTracer::init_with_filter(tracing_log::AsLog::as_log(&log_level));
    let fmt = logs::layer(format).with_filter(filter);
    let (traces, metrics) = match export {
        Some(c) => (c.traces_url, c.metrics),
        None => (None, None),
    };
    let (mut guard, res) = match traces {
        None => (
            Guard::default(),
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(fmt)),
        ),
        Some(url) => {
            let (pipeline, layer) = otlp::Pipeline::start(url);
            let sub = tracing_subscriber::registry()
                .with(fmt)
                .with(layer.with_filter(otlp::span_filter()));
            (
                Guard {
                    pipeline: Some(pipeline),
                    metrics: None,
                },
                tracing::subscriber::set_global_default(sub),
            )
        }
    };
    if let Err(e) = res {
        eprintln!("warning: logging is already set up: {e}");
    }
    if let Some(p) = &guard.pipeline {
        tracing::info!(endpoint = %p.endpoint(), "exporting spans over OTLP/HTTP");
    }
    if let Some(target) = metrics {
        let interval_ms = target.interval.as_millis() as u64;
        let p = otlp_metrics::MetricsPipeline::start(target);
        tracing::info!(endpoint = %p.endpoint(), interval_ms, "exporting metrics over OTLP/HTTP");
        guard.metrics = Some(p);
    }
    guard
}
