//! The daemon's metrics: one [`Snapshot`] gathered from what the status, the session counters,
//! the health records, the store and the export counters already keep — no second registry to
//! keep in step — written as the Prometheus text exposition format (0.0.4) for
//! `GET /v1/metrics`, and mapped to OTLP by `otlp_metrics` for export. Both read the same
//! families, so the two cannot disagree. Every family is listed in docs/operations.md
//! ("Metrics").
//!
//! Gathering reads the store (on a reader connection; never the writer), so it is a blocking
//! call: from async code, run it with `spawn_blocking`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use conduit_supervisor::State;

pub use super::snapshot::{Family, Hist, Kind, LATENCY_BOUNDS_S, Sample, Snapshot, Value};
use crate::daemon::handle::{Daemon, ExtensionView};
use crate::daemon::trouble;

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

fn u(v: u64) -> f64 {
    v as f64
}

/// Let the metrics export (when configured) gather from `d` from now on. It holds the daemon
/// weakly: once the daemon is gone, snapshots are skipped.
pub fn export_from(d: &Arc<Daemon>) {
    let weak = Arc::downgrade(d);
    super::otlp_metrics::gather_with(move || {
        let d = weak.upgrade()?;
        match gather(&d) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain::chain(&e), "metrics export: cannot gather the metrics");
                None
            }
        }
    });
}

/// Gather every family from the daemon. Blocking (it reads the store); a store that cannot be
/// read leaves out the Event and Work families and says so in the log, never the rest.
pub fn gather(d: &Daemon) -> anyhow::Result<Snapshot> {
    let exts = d.extensions()?;
    let counts = match d.core().store.read(|r| r.counts()) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %crate::error_chain::chain(&anyhow::Error::new(e)), "metrics: cannot count events and work");
            None
        }
    };
    let live: Vec<_> = exts
        .iter()
        .map(|e| {
            let handle = d.supervisor().get(&e.status.name);
            let traffic = handle.as_ref().map(|h| h.traffic()).unwrap_or_default();
            let hists = handle
                .as_ref()
                .map(|h| h.latency_histograms(&bounds_us()))
                .unwrap_or_default();
            (traffic, hists)
        })
        .collect();
    let now = conduit_supervisor::now_ms();
    let core = d.core();
    let ingress = Ingress {
        timings: &core.timings,
        queued: core.group_queued(),
    };
    let mut s = build(
        &exts,
        &live,
        &core.stats,
        (core.dropped.snapshot(), &ingress),
        counts.as_ref(),
        d.started_at_ms(),
        now,
    );
    super::storage::families(&mut s, d);
    Ok(s)
}

/// What the writer and ingress report: their timings and counters, and the submissions
/// waiting for a group commit now.
struct Ingress<'a> {
    timings: &'a crate::core::timings::Timings,
    queued: usize,
}

/// [`LATENCY_BOUNDS_S`] in microseconds, as the HDR histograms are kept.
fn bounds_us() -> Vec<u64> {
    LATENCY_BOUNDS_S
        .iter()
        .map(|s| (s * 1e6).round() as u64)
        .collect()
}

/// A histogram sample from an HDR histogram's buckets at [`LATENCY_BOUNDS_S`].
fn hist(labels: Vec<(&'static str, String)>, h: &conduit_supervisor::LatencyHistogram) -> Sample {
    Sample {
        labels,
        value: Value::Hist(Hist {
            cumulative: h.cumulative.clone(),
            count: h.count,
            sum: h.sum_us as f64 / 1e6,
        }),
    }
}

type Live = (
    conduit_supervisor::Traffic,
    std::collections::BTreeMap<String, conduit_supervisor::LatencyHistogram>,
);

fn build(
    exts: &[ExtensionView],
    live: &[Live],
    stats: &crate::core::LoopStats,
    // The core's other counters: work dropped by operators, and the writer's and ingress's.
    (dropped, ingress): (crate::core::pending::Pending, &Ingress<'_>),
    counts: Option<&conduit_store::Counts>,
    started_at_ms: i64,
    now: i64,
) -> Snapshot {
    let mut s = Snapshot {
        families: Vec::with_capacity(40),
        started_at_ms,
        at_ms: now,
    };
    let name = |e: &ExtensionView| e.status.name.clone();

    let f = s.family(
        "conduit_extension_up",
        Kind::Gauge,
        "1 when the extension is ready to serve calls.",
    );
    for e in exts {
        f.num(
            &[("extension", &name(e))],
            u8::from(e.status.state == State::Ready),
        );
    }
    let f = s.family(
        "conduit_extension_state",
        Kind::Gauge,
        "1 for the state the extension is in, 0 for the others.",
    );
    for e in exts {
        for st in State::ALL {
            f.num(
                &[("extension", &name(e)), ("state", st.as_str())],
                u8::from(e.status.state == st),
            );
        }
    }
    let f = s.family(
        "conduit_extension_restarts_total",
        Kind::Counter,
        "Restarts of the extension since the daemon started.",
    );
    for e in exts {
        f.num(&[("extension", &name(e))], e.status.restarts);
    }
    // The on-demand lifecycle: one series per extension each.
    type PerExtension = (&'static str, Kind, &'static str, fn(&ExtensionView) -> f64);
    let lifecycle: [PerExtension; 3] = [
        (
            "conduit_extension_on_demand",
            Kind::Gauge,
            "1 when the extension is started on demand (when something first needs it), 0 when with the daemon.",
            |e| {
                f64::from(u8::from(
                    e.status.start == conduit_supervisor::StartMode::OnDemand,
                ))
            },
        ),
        (
            "conduit_extension_demand_starts_total",
            Kind::Counter,
            "Starts of the extension asked for by a need (an event, a timer, a wait, an emission, an ingress poll, a call) since the daemon started.",
            |e| e.status.demand_starts as f64,
        ),
        (
            "conduit_extension_idle_stops_total",
            Kind::Counter,
            "Runs of the extension stopped after its idle time without calls since the daemon started (not crashes, not restarts).",
            |e| e.status.idle_stops as f64,
        ),
    ];
    for (family, kind, help, value) in lifecycle {
        let f = s.family(family, kind, help);
        for e in exts {
            f.num(&[("extension", &name(e))], value(e));
        }
    }
    let f = s.family(
        "conduit_extension_degraded",
        Kind::Gauge,
        "1 while the host loop does not make the extension's in-transaction calls (degraded or unresponsive).",
    );
    for e in exts {
        let degraded = e
            .health
            .as_ref()
            .is_some_and(|h| h.degraded_since_ms.is_some());
        f.num(&[("extension", &name(e))], u8::from(degraded));
    }
    let f = s.family(
        "conduit_extension_degraded_seconds_total",
        Kind::Counter,
        "Time the extension has been degraded or unresponsive since the daemon started.",
    );
    for e in exts {
        let ms = e.health.as_ref().map_or(0, |h| h.degraded_ms(now));
        f.num(&[("extension", &name(e))], ms as f64 / 1e3);
    }
    let f = s.family(
        "conduit_extension_trouble",
        Kind::Gauge,
        "1 for the trouble the extension is in (crash-looping, refused, incompatible, unresponsive, over-limit, backing-off, degraded), 0 for the others; all 0 when it is in none.",
    );
    let troubles: Vec<Option<trouble::Troubled>> = exts.iter().map(trouble::trouble).collect();
    for (e, t) in exts.iter().zip(&troubles) {
        for kind in trouble::Trouble::ALL {
            f.num(
                &[("extension", &name(e)), ("trouble", kind.as_str())],
                u8::from(t.as_ref().is_some_and(|t| t.trouble == kind)),
            );
        }
    }
    let f = s.family(
        "conduit_extension_trouble_since_seconds",
        Kind::Gauge,
        "When the extension's current trouble began (Unix seconds): its first failure, kept across the host's restarts of it. Only extensions in trouble have a sample.",
    );
    for (e, t) in exts.iter().zip(&troubles) {
        if let Some(at) = t.as_ref().and_then(|t| t.since_ms) {
            f.num(&[("extension", &name(e))], at as f64 / 1e3);
        }
    }
    let summary = trouble::summarize(exts);
    let f = s.family(
        "conduit_extensions",
        Kind::Gauge,
        "Extensions by health, as GET /v1/health counts them: ready (and in no trouble), starting, or in each trouble.",
    );
    f.num(&[("health", "ready")], u(summary.ready as u64));
    f.num(&[("health", "starting")], u(summary.starting as u64));
    for kind in trouble::Trouble::ALL {
        f.num(&[("health", kind.as_str())], u(summary.count(kind) as u64));
    }
    // What `ext status` shows under `using` and `limits`, for the extensions that have them.
    let usage = |e: &ExtensionView| e.status.resources.as_ref().and_then(|r| r.usage);
    let limits = |e: &ExtensionView| e.status.resources.as_ref().map(|r| r.limits);
    let f = s.family(
        "conduit_extension_memory_bytes",
        Kind::Gauge,
        "Resident memory of the extension's whole process tree, as last sampled (while it runs).",
    );
    for e in exts {
        if let Some(us) = usage(e) {
            f.num(&[("extension", &name(e))], u(us.rss_bytes));
        }
    }
    let f = s.family(
        "conduit_extension_memory_limit_bytes",
        Kind::Gauge,
        "The memory limit of the extension's tree.",
    );
    for e in exts {
        if let Some(l) = limits(e) {
            f.num(&[("extension", &name(e))], u(l.memory));
        }
    }
    let f = s.family(
        "conduit_extension_cpu_ratio",
        Kind::Gauge,
        "CPU the extension's tree used over the last second or so, as a share of one CPU (while it runs).",
    );
    for e in exts {
        if let Some(us) = usage(e) {
            f.num(&[("extension", &name(e))], us.cpu);
        }
    }
    let f = s.family(
        "conduit_extension_cpu_limit_ratio",
        Kind::Gauge,
        "The CPU limit of the extension's tree, as a share of one CPU.",
    );
    for e in exts {
        if let Some(l) = limits(e) {
            f.num(&[("extension", &name(e))], l.cpu);
        }
    }
    let f = s.family(
        "conduit_extension_tasks",
        Kind::Gauge,
        "Processes and threads in the extension's tree (while it runs).",
    );
    for e in exts {
        if let Some(us) = usage(e) {
            f.num(&[("extension", &name(e))], us.tasks);
        }
    }
    let f = s.family(
        "conduit_extension_throttled",
        Kind::Gauge,
        "1 while the extension's tree is stopped to hold it to its CPU share (while it runs).",
    );
    for e in exts {
        if let Some(us) = usage(e) {
            f.num(&[("extension", &name(e))], u8::from(us.throttled));
        }
    }
    let f = s.family(
        "conduit_extension_limit_stops_total",
        Kind::Counter,
        "Runs of the extension the host stopped for going over its memory or task limit.",
    );
    for e in exts {
        if let Some(r) = &e.status.resources {
            f.num(&[("extension", &name(e))], r.limit_stops);
        }
    }
    let f = s.family(
        "conduit_extension_calls_total",
        Kind::Counter,
        "Host calls to the extension by method and outcome (ok or error).",
    );
    for e in exts {
        for (m, c) in &e.status.calls {
            let n = name(e);
            f.num(
                &[("extension", &n), ("method", m), ("outcome", "ok")],
                u(c.count - c.errors.min(c.count)),
            );
            f.num(
                &[("extension", &n), ("method", m), ("outcome", "error")],
                u(c.errors),
            );
        }
    }
    let f = s.family(
        "conduit_extension_call_duration_seconds",
        Kind::Histogram,
        "Latency of host calls to the extension, by method, since the daemon started (from the status's HDR histograms).",
    );
    for ((_, hists), e) in live.iter().zip(exts) {
        for (m, h) in hists {
            f.samples
                .push(hist(vec![("extension", name(e)), ("method", m.clone())], h));
        }
    }
    let f = s.family(
        "conduit_extension_call_latency_seconds",
        Kind::Gauge,
        "Latency quantiles of host calls since the daemon started (HDR histogram; quantile=1 is the maximum).",
    );
    for e in exts {
        for (m, c) in &e.status.calls {
            for (q, us) in [
                ("0.5", c.p50_us),
                ("0.95", c.p95_us),
                ("0.99", c.p99_us),
                ("1", c.max_us),
            ] {
                f.num(
                    &[("extension", &name(e)), ("method", m), ("quantile", q)],
                    us as f64 / 1e6,
                );
            }
        }
    }
    let f = s.family(
        "conduit_extension_in_flight",
        Kind::Gauge,
        "Requests awaiting an answer now: host calls to the extension (host_to_extension) and its calls to the host (extension_to_host).",
    );
    for ((t, _), e) in live.iter().zip(exts) {
        let n = name(e);
        f.num(
            &[("extension", &n), ("direction", "host_to_extension")],
            u(t.calls_in_flight),
        );
        f.num(
            &[("extension", &n), ("direction", "extension_to_host")],
            u(t.callbacks_in_flight),
        );
    }
    let f = s.family(
        "conduit_extension_overloaded_total",
        Kind::Counter,
        "Requests refused with `overloaded`: host calls not sent or refused by the extension (host_to_extension), the extension's calls the host refused (extension_to_host).",
    );
    for ((t, _), e) in live.iter().zip(exts) {
        let n = name(e);
        f.num(
            &[("extension", &n), ("direction", "host_to_extension")],
            u(t.overloaded_calls),
        );
        f.num(
            &[("extension", &n), ("direction", "extension_to_host")],
            u(t.overloaded_callbacks),
        );
    }
    let f = s.family(
        "conduit_extension_bytes_total",
        Kind::Counter,
        "Message bytes over the extension's pipes: read from its stdout (in), written to its stdin (out).",
    );
    for ((t, _), e) in live.iter().zip(exts) {
        let n = name(e);
        f.num(&[("extension", &n), ("direction", "in")], u(t.bytes_in));
        f.num(&[("extension", &n), ("direction", "out")], u(t.bytes_out));
    }

    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    for (fam, kind, help, v) in [
        (
            "conduit_host_loop_passes_total",
            Kind::Counter,
            "Host-loop passes.",
            u(l(&stats.passes)),
        ),
        (
            "conduit_host_loop_pass_seconds_total",
            Kind::Counter,
            "Time spent in host-loop passes (divide its rate by the passes' for the mean pass).",
            l(&stats.pass_us_total) as f64 / 1e6,
        ),
        (
            "conduit_host_loop_last_pass_seconds",
            Kind::Gauge,
            "Duration of the last host-loop pass.",
            l(&stats.last_pass_us) as f64 / 1e6,
        ),
        (
            "conduit_host_loop_in_transaction_calls_total",
            Kind::Counter,
            "In-transaction calls the host loop made.",
            u(l(&stats.in_transaction_calls)),
        ),
        (
            "conduit_host_loop_fallbacks_total",
            Kind::Counter,
            "In-transaction calls that failed or missed the deadline and took their fallback.",
            u(l(&stats.fallbacks)),
        ),
        (
            "conduit_host_loop_panics_total",
            Kind::Counter,
            "Host-loop passes that panicked (a bug; the loop goes on).",
            u(l(&stats.panics)),
        ),
    ] {
        s.family(fam, kind, help).num(&[], v);
    }

    let f = s.family(
        "conduit_pending_dropped_total",
        Kind::Counter,
        "Work that waited for a disabled extension and an operator dropped (`--drop-pending`), by record: events routed to no Work, timers deleted, waits cancelled, emissions failed.",
    );
    for (record, n) in [
        ("event", dropped.events),
        ("timer", dropped.timers),
        ("wait", dropped.waits),
        ("emission", dropped.emissions),
    ] {
        f.num(&[("record", record)], u(n));
    }
    write_ingress(&mut s, ingress);

    if let Some(c) = counts {
        s.family(
            "conduit_events_total",
            Kind::Counter,
            "Events the store holds: every Event accepted, ever (they are never deleted; not reset by a restart).",
        )
        .num(&[], u(c.events));
        s.family(
            "conduit_events_unrouted",
            Kind::Gauge,
            "Events the routing pass has not decided yet.",
        )
        .num(&[], u(c.events_unrouted));
        let f = s.family("conduit_work", Kind::Gauge, "Work in the store by state.");
        for (st, n) in c.work {
            f.num(&[("state", st.as_str())], u(n));
        }
    }

    let x = &super::otlp::STATS;
    let m = &super::otlp_metrics::STATS;
    s.family(
        "conduit_telemetry_export_enabled",
        Kind::Gauge,
        "1 when the signal (traces, metrics) is exported over OTLP.",
    )
    .num(
        &[("signal", "traces")],
        u8::from(x.enabled.load(Ordering::Relaxed)),
    )
    .num(
        &[("signal", "metrics")],
        u8::from(m.enabled.load(Ordering::Relaxed)),
    );
    s.family(
        "conduit_telemetry_spans_exported_total",
        Kind::Counter,
        "Spans the collector acknowledged.",
    )
    .num(&[], u(l(&x.exported)));
    s.family(
        "conduit_telemetry_spans_dropped_total",
        Kind::Counter,
        "Spans dropped: pushed out of the full queue, or in a batch that failed every attempt.",
    )
    .num(&[("reason", "queue_full")], u(l(&x.dropped_queue_full)))
    .num(
        &[("reason", "export_failed")],
        u(l(&x.dropped_export_failed)),
    );
    s.family(
        "conduit_telemetry_queue_spans",
        Kind::Gauge,
        "Spans waiting in the export queue.",
    )
    .num(&[], u(l(&x.pending)));
    s.family(
        "conduit_telemetry_metric_exports_total",
        Kind::Counter,
        "Metric snapshots the collector acknowledged.",
    )
    .num(&[], u(l(&m.exported)));
    s.family(
        "conduit_telemetry_metric_exports_dropped_total",
        Kind::Counter,
        "Metric snapshots not delivered: due while the previous one was still being sent (busy), or failed every attempt (export_failed).",
    )
    .num(&[("reason", "busy")], u(l(&m.dropped_busy)))
    .num(
        &[("reason", "export_failed")],
        u(l(&m.dropped_export_failed)),
    );
    s.family(
        "conduit_telemetry_export_failures_total",
        Kind::Counter,
        "Export attempts that failed or timed out, by signal.",
    )
    .num(&[("signal", "traces")], u(l(&x.failed_attempts)))
    .num(&[("signal", "metrics")], u(l(&m.failed_attempts)));
    s
}

/// The writer's wait and hold, acknowledgement-to-routing and the group commit's counters.
fn write_ingress(s: &mut Snapshot, ingress: &Ingress<'_>) {
    use crate::core::timings::{IngressCounts, QUANTILES};
    let [wait, hold, a2r] = ingress.timings.export(&bounds_us());
    for (fam, help, e) in [
        (
            "conduit_store_writer_wait_seconds",
            "Time each write transaction waited for the store's one writer: from asking for it to BEGIN IMMEDIATE done (every writer: ingress, the host loop, the API's other writes).",
            &wait,
        ),
        (
            "conduit_store_writer_hold_seconds",
            "Time each write transaction held the writer: from BEGIN IMMEDIATE done to COMMIT (its fsync included) or the rollback done.",
            &hold,
        ),
        (
            "conduit_ingress_ack_to_route_seconds",
            "Time from the commit that acknowledged an event to the commit of the routing decision about it (events accepted by this daemon).",
            &a2r,
        ),
    ] {
        s.family(fam, Kind::Histogram, help)
            .samples
            .push(hist(Vec::new(), &e.histogram));
    }
    let f = s.family(
        "conduit_latency_quantile_seconds",
        Kind::Gauge,
        "Quantiles of the writer's wait and hold and of acknowledgement-to-routing since the daemon started (HDR histograms, 3 significant digits; quantile=1 is the maximum).",
    );
    for (measure, e) in [
        ("writer_wait", &wait),
        ("writer_hold", &hold),
        ("ack_to_route", &a2r),
    ] {
        for ((q, _), us) in QUANTILES.iter().zip(e.quantiles_us) {
            f.num(&[("measure", measure), ("quantile", q)], us as f64 / 1e6);
        }
    }
    let n = &ingress.timings.ingress;
    let l = IngressCounts::load;
    s.family(
        "conduit_ingress_commits_total",
        Kind::Counter,
        "Group commits of accepted events (transactions; divide the events' rate by its rate for the mean batch).",
    )
    .num(&[], u(l(&n.commits)));
    s.family(
        "conduit_ingress_events_total",
        Kind::Counter,
        "Events answered by the group commit, by outcome: new, duplicate (accepted before), refused (by the store).",
    )
    .num(&[("outcome", "new")], u(l(&n.new)))
    .num(&[("outcome", "duplicate")], u(l(&n.duplicate)))
    .num(&[("outcome", "refused")], u(l(&n.refused)));
    s.family(
        "conduit_ingress_untimed_total",
        Kind::Counter,
        "Events accepted while 100,000 were already waiting to be routed: not in conduit_ingress_ack_to_route_seconds.",
    )
    .num(&[], u(l(&n.untimed)));
    s.family(
        "conduit_ingress_queued",
        Kind::Gauge,
        "Callers' submissions waiting for a group commit now (not the batch being committed).",
    )
    .num(&[], ingress.queued as f64);
}

/// A label value escaped as the format requires (backslash, quote, newline).
fn esc(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

fn labels(out: &mut String, labels: &[(&'static str, String)], extra: Option<(&str, &str)>) {
    if labels.is_empty() && extra.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (k, v) in labels.iter().map(|(k, v)| (*k, v.as_str())).chain(extra) {
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(out, "{k}=\"{}\"", esc(v));
    }
    out.push('}');
}

/// A sample value as the format writes it (`+Inf` for infinity).
fn num(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".into()
    } else {
        v.to_string()
    }
}

/// The Prometheus text exposition of a snapshot.
pub fn prometheus(s: &Snapshot) -> String {
    let mut o = String::with_capacity(8192);
    for f in &s.families {
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(o, "# HELP {} {}\n# TYPE {} {kind}", f.name, f.help, f.name);
        for sample in &f.samples {
            match &sample.value {
                Value::Num(v) => {
                    o.push_str(f.name);
                    labels(&mut o, &sample.labels, None);
                    let _ = writeln!(o, " {}", num(*v));
                }
                Value::Hist(h) => {
                    let bucket = format!("{}_bucket", f.name);
                    for (le, n) in LATENCY_BOUNDS_S.iter().zip(&h.cumulative) {
                        o.push_str(&bucket);
                        labels(&mut o, &sample.labels, Some(("le", &num(*le))));
                        let _ = writeln!(o, " {n}");
                    }
                    o.push_str(&bucket);
                    labels(&mut o, &sample.labels, Some(("le", "+Inf")));
                    let _ = writeln!(o, " {}", h.count);
                    let _ = write!(o, "{}_sum", f.name);
                    labels(&mut o, &sample.labels, None);
                    let _ = writeln!(o, " {}", num(h.sum));
                    let _ = write!(o, "{}_count", f.name);
                    labels(&mut o, &sample.labels, None);
                    let _ = writeln!(o, " {}", h.count);
                }
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    }

    #[test]
    fn a_histogram_is_written_with_its_buckets_sum_and_count() {
        let mut s = Snapshot::default();
        let mut cumulative = vec![0; LATENCY_BOUNDS_S.len()];
        cumulative[4..].iter_mut().for_each(|n| *n = 2);
        s.family("x_seconds", Kind::Histogram, "h.")
            .samples
            .push(Sample {
                labels: vec![("method", "m".into())],
                value: Value::Hist(Hist {
                    cumulative,
                    count: 3,
                    sum: 40.5,
                }),
            });
        let text = prometheus(&s);
        assert!(text.contains("# TYPE x_seconds histogram\n"), "{text}");
        assert!(text.contains("x_seconds_bucket{method=\"m\",le=\"0.0005\"} 0\n"));
        assert!(text.contains("x_seconds_bucket{method=\"m\",le=\"0.001\"} 2\n"));
        assert!(text.contains("x_seconds_bucket{method=\"m\",le=\"+Inf\"} 3\n"));
        assert!(text.contains("x_seconds_sum{method=\"m\"} 40.5\n"));
        assert!(text.contains("x_seconds_count{method=\"m\"} 3\n"));
    }
}
