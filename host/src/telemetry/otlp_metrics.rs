//! OTLP/HTTP (protobuf) metrics export that never blocks the daemon.
//!
//! Every interval (`OTEL_METRIC_EXPORT_INTERVAL`, default 60 s) one exporter thread gathers a
//! [`Snapshot`] — the same families `GET /v1/metrics` serves — maps it to an OTLP
//! `ExportMetricsServiceRequest` (cumulative sums, gauges, explicit-bucket histograms) and
//! posts it to `/v1/metrics`: each attempt bounded by [`EXPORT_TIMEOUT`](super::export::EXPORT_TIMEOUT),
//! [`ATTEMPTS`](super::export::ATTEMPTS) attempts, then the snapshot is dropped. Values are
//! cumulative, so a lost snapshot loses no count: the next one carries it.
//!
//! Bounded by construction: at most one snapshot exists at a time, on the exporter thread. A
//! snapshot that falls due while the previous one is still being sent (a collector that hangs)
//! is not taken, and counted as dropped (`busy`). Nothing on the daemon's side waits for the
//! thread; gathering reads the statuses and the store's reader connections, never the writer.
//!
//! The SDK's metrics pipeline is not used: its instruments record values one by one, while
//! conduit already keeps every figure (the HDR latency histograms included), and its periodic
//! reader would need a runtime of its own for the HTTP client. The wire types are the OTLP
//! crate's own (`opentelemetry-proto`, which `opentelemetry-otlp` is built on).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use opentelemetry_http::HttpClient;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1 as pb;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::export::{ATTEMPTS, EXPORT_TIMEOUT, ExportThread, HyperHttp, attempts};
use super::snapshot::{Kind, LATENCY_BOUNDS_S, Snapshot, Value};

/// The interval when `OTEL_METRIC_EXPORT_INTERVAL` is unset (the OpenTelemetry default).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// The intervals `OTEL_METRIC_EXPORT_INTERVAL` accepts, in milliseconds.
pub const INTERVAL_RANGE_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// Where metrics go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The metrics URL, `http://host:port/v1/metrics`.
    pub url: String,
    pub interval: Duration,
}

/// The export interval from `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds).
pub fn interval_from_env() -> Result<Duration, String> {
    parse_interval(super::export::env("OTEL_METRIC_EXPORT_INTERVAL").as_deref())
}

fn parse_interval(v: Option<&str>) -> Result<Duration, String> {
    let Some(v) = v else {
        return Ok(DEFAULT_INTERVAL);
    };
    match v.trim().parse::<u64>() {
        Ok(ms) if INTERVAL_RANGE_MS.contains(&ms) => Ok(Duration::from_millis(ms)),
        _ => Err(format!(
            "OTEL_METRIC_EXPORT_INTERVAL is `{v}`; it must be a whole number of milliseconds from {} to {}: unset it for the default ({} ms)",
            INTERVAL_RANGE_MS.start(),
            INTERVAL_RANGE_MS.end(),
            DEFAULT_INTERVAL.as_millis()
        )),
    }
}

/// Metrics export counters, for `GET /v1/health` and `GET /v1/metrics`.
#[derive(Debug, Default)]
pub struct MetricStats {
    pub enabled: AtomicBool,
    /// Snapshots the collector acknowledged.
    pub exported: AtomicU64,
    /// Snapshots not taken because the previous one was still being sent.
    pub dropped_busy: AtomicU64,
    /// Snapshots that failed every attempt.
    pub dropped_export_failed: AtomicU64,
    /// Attempts that failed or timed out.
    pub failed_attempts: AtomicU64,
}

impl MetricStats {
    pub fn snapshot(&self) -> serde_json::Value {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "export": if self.enabled.load(Ordering::Relaxed) { "otlp-http" } else { "off" },
            "exported": l(&self.exported),
            "dropped": l(&self.dropped_busy) + l(&self.dropped_export_failed),
            "dropped_busy": l(&self.dropped_busy),
            "dropped_export_failed": l(&self.dropped_export_failed),
            "failed_attempts": l(&self.failed_attempts),
        })
    }
}

/// The process's metrics export counters.
pub static STATS: MetricStats = MetricStats {
    enabled: AtomicBool::new(false),
    exported: AtomicU64::new(0),
    dropped_busy: AtomicU64::new(0),
    dropped_export_failed: AtomicU64::new(0),
    failed_attempts: AtomicU64::new(0),
};

/// What gathers a snapshot (`None`: skip this one), once the daemon runs.
type Gather = Arc<dyn Fn() -> Option<Snapshot> + Send + Sync>;

/// The gatherer the exporter calls; set by the daemon (`metrics::export_from`), which this
/// module does not know.
static SOURCE: Mutex<Option<Gather>> = Mutex::new(None);

/// Tell the exporter (if one runs) how to gather a snapshot. Until then, snapshots are skipped.
pub fn gather_with(f: impl Fn() -> Option<Snapshot> + Send + Sync + 'static) {
    *SOURCE.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(f));
}

fn gather() -> Option<Snapshot> {
    // Taken out of the lock first: gathering reads the store, and nothing waits on it meanwhile.
    let source = SOURCE.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
    source()
}

/// The running metrics export: its thread, stopped by [`MetricsPipeline::shutdown`].
#[derive(Debug)]
pub struct MetricsPipeline {
    url: String,
    thread: ExportThread<()>,
}

impl MetricsPipeline {
    /// Start the exporter thread.
    pub fn start(target: Target) -> MetricsPipeline {
        let thread = ExportThread::new(());
        let t = target.clone();
        if thread.spawn("conduit-otlp-metrics", "metrics", move |s, rt| {
            export_thread(s, rt, t)
        }) {
            STATS.enabled.store(true, Ordering::Relaxed);
        }
        MetricsPipeline {
            url: target.url,
            thread,
        }
    }

    /// The metrics URL.
    pub fn endpoint(&self) -> &str {
        &self.url
    }

    /// Stop the thread; waits at most `within` for an export in progress.
    pub fn shutdown(self, within: Duration) {
        self.thread.shutdown(within);
    }
}

/// Every interval, a snapshot sent, until closed.
fn export_thread(thread: &ExportThread<()>, rt: &tokio::runtime::Runtime, target: Target) {
    let resource = resource();
    let mut due = Instant::now() + target.interval;
    loop {
        if thread.wait(due, |()| false).closing {
            return;
        }
        due += target.interval;
        let Some(snap) = gather() else { continue };
        let body = Bytes::from(request(&snap, &resource).encode_to_vec());
        let send = attempts(ATTEMPTS, EXPORT_TIMEOUT, &STATS.failed_attempts, || {
            post(&target.url, body.clone())
        });
        // Every due time that passes while this snapshot is still being sent is a snapshot not
        // taken: counted as it passes, so a hung collector shows at once.
        let sent = rt.block_on(async {
            tokio::pin!(send);
            loop {
                let wait = due.saturating_duration_since(Instant::now());
                tokio::select! {
                    sent = &mut send => return sent,
                    () = tokio::time::sleep(wait) => {
                        STATS.dropped_busy.fetch_add(1, Ordering::Relaxed);
                        due += target.interval;
                    }
                }
            }
        });
        if sent {
            STATS.exported.fetch_add(1, Ordering::Relaxed);
        } else {
            STATS.dropped_export_failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn post(url: &str, body: Bytes) -> Result<(), String> {
    let req = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/x-protobuf")
        .body(body)
        .map_err(|e| e.to_string())?;
    let res = HyperHttp.send_bytes(req).await.map_err(|e| e.to_string())?;
    if res.status().is_success() {
        Ok(())
    } else {
        Err(format!("the collector answered {}", res.status()))
    }
}

/// The resource attributes, as the span export has them.
fn resource() -> Resource {
    let r = super::export::resource();
    Resource {
        attributes: r
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.as_str().to_owned(),
                value: Some(any(v)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn any(v: &opentelemetry::Value) -> AnyValue {
    use opentelemetry::Value as V;
    let value = match v {
        V::Bool(b) => any_value::Value::BoolValue(*b),
        V::I64(i) => any_value::Value::IntValue(*i),
        V::F64(f) => any_value::Value::DoubleValue(*f),
        other => any_value::Value::StringValue(other.as_str().into_owned()),
    };
    AnyValue { value: Some(value) }
}

fn text(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.to_owned())),
        }),
        ..Default::default()
    }
}

/// The OTLP name of a family: the Prometheus name without the `_total` of a counter, which
/// a Prometheus exporter on the collector's side adds back to monotonic sums.
pub fn otlp_name(name: &str, kind: Kind) -> &str {
    match kind {
        Kind::Counter => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    }
}

/// A snapshot as one OTLP export request.
pub fn request(s: &Snapshot, resource: &Resource) -> ExportMetricsServiceRequest {
    let ns = |ms: i64| (ms.max(0) as u64) * 1_000_000;
    let (start, now) = (ns(s.started_at_ms), ns(s.at_ms));
    let cumulative = pb::AggregationTemporality::Cumulative as i32;
    let metrics = s
        .families
        .iter()
        .filter(|f| !f.samples.is_empty())
        .map(|f| {
            let attrs =
                |labels: &[(&str, String)]| labels.iter().map(|(k, v)| text(k, v)).collect();
            let numbers = || {
                f.samples
                    .iter()
                    .filter_map(|smp| match smp.value {
                        Value::Num(v) => Some(pb::NumberDataPoint {
                            attributes: attrs(&smp.labels),
                            start_time_unix_nano: start,
                            time_unix_nano: now,
                            value: Some(pb::number_data_point::Value::AsDouble(v)),
                            ..Default::default()
                        }),
                        Value::Hist(_) => None,
                    })
                    .collect()
            };
            let data = match f.kind {
                Kind::Counter => pb::metric::Data::Sum(pb::Sum {
                    data_points: numbers(),
                    aggregation_temporality: cumulative,
                    is_monotonic: true,
                }),
                Kind::Gauge => pb::metric::Data::Gauge(pb::Gauge {
                    data_points: numbers(),
                }),
                Kind::Histogram => pb::metric::Data::Histogram(pb::Histogram {
                    aggregation_temporality: cumulative,
                    data_points: f
                        .samples
                        .iter()
                        .filter_map(|smp| match &smp.value {
                            Value::Hist(h) => {
                                // OTLP counts each bucket on its own, the last one past the
                                // highest bound.
                                let mut counts = Vec::with_capacity(h.cumulative.len() + 1);
                                let mut below = 0;
                                for &c in &h.cumulative {
                                    counts.push(c.saturating_sub(below));
                                    below = c;
                                }
                                counts.push(h.count.saturating_sub(below));
                                Some(pb::HistogramDataPoint {
                                    attributes: attrs(&smp.labels),
                                    start_time_unix_nano: start,
                                    time_unix_nano: now,
                                    count: h.count,
                                    sum: Some(h.sum),
                                    bucket_counts: counts,
                                    explicit_bounds: LATENCY_BOUNDS_S.to_vec(),
                                    ..Default::default()
                                })
                            }
                            Value::Num(_) => None,
                        })
                        .collect(),
                }),
            };
            pb::Metric {
                name: otlp_name(f.name, f.kind).to_owned(),
                description: f.help.to_owned(),
                data: Some(data),
                ..Default::default()
            }
        })
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![pb::ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![pb::ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "conduit".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_checked_at_its_edges() {
        assert_eq!(parse_interval(None), Ok(DEFAULT_INTERVAL));
        assert_eq!(parse_interval(Some("100")), Ok(Duration::from_millis(100)));
        assert!(
            parse_interval(Some("99"))
                .unwrap_err()
                .contains("100 to 3600000")
        );
        assert_eq!(
            parse_interval(Some("3600000")),
            Ok(Duration::from_secs(3600))
        );
        assert!(parse_interval(Some("3600001")).is_err());
        assert!(parse_interval(Some("1s")).is_err());
    }

    #[test]
    fn counters_lose_their_total_suffix_in_otlp() {
        assert_eq!(otlp_name("a_calls_total", Kind::Counter), "a_calls");
        assert_eq!(otlp_name("a_up", Kind::Gauge), "a_up");
    }
}
