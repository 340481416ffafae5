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
use tracing_subscriber::util::SubscriberInitExt;

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
    let fmt = logs::layer(format).with_filter(filter);
    match export {
        None => {
            tracing_subscriber::registry().with(fmt).init();
            Guard::default()
        }
        Some(cfg) => {
            let (pipeline, layer) = otlp::Pipeline::start(cfg);
            tracing_subscriber::registry()
                .with(fmt)
                .with(layer.with_filter(otlp::span_filter()))
                .init();
            Guard {
                pipeline: Some(pipeline),
            }
        }
    }
}
