//! Telemetry: the subscriber every `conduit` command logs through, the optional OTLP span export
//! of `conduit daemon run`, and the counters the health and metrics endpoints show.
//!
//! Spans (extension calls, host-loop passes) are `debug`-level with fields, not formatted
//! strings. With nothing configured they are disabled at their call sites, so a daemon without
//! export pays nothing for them: no exporter, no thread, no layer. With an endpoint configured
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `--otlp-endpoint`), a second layer hands them to the
//! OpenTelemetry SDK, whose spans go through [`otlp`]'s bounded queue and never block a caller.

pub mod logs;
pub mod metrics;
pub mod otlp;

use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;

pub use logs::LogFormat;

/// What `install` set up; dropping it flushes the export queue for a bounded time.
#[derive(Debug, Default)]
pub struct Guard {
    pipeline: Option<otlp::Pipeline>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(p) = self.pipeline.take() {
            p.shutdown(std::time::Duration::from_secs(2));
        }
    }
}

/// Install the process's subscriber: logs to stderr in `format` at `default_filter` unless
/// `CONDUIT_LOG` says otherwise, and the span export when `export` is given.
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
    let (guard, res) = match export {
        None => (
            Guard::default(),
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(fmt)),
        ),
        Some(cfg) => {
            let (pipeline, layer) = otlp::Pipeline::start(cfg);
            let sub = tracing_subscriber::registry()
                .with(fmt)
                .with(layer.with_filter(otlp::span_filter()));
            (
                Guard {
                    pipeline: Some(pipeline),
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
    guard
}
