//! `GET /v1/metrics`: the daemon's state in the Prometheus text exposition format (0.0.4),
//! written by hand from what the status and the counters already keep — no second registry
//! to keep in step. Every family is listed in docs/operations.md ("Metrics").

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use conduit_supervisor::State;

use crate::daemon::ExtensionView;

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const STATES: [State; 9] = [
    State::Starting,
    State::Ready,
    State::BackingOff,
    State::CrashLooping,
    State::Incompatible,
    State::Refused,
    State::Stopping,
    State::Stopped,
    State::Disabled,
];

/// A label value escaped as the format requires (backslash, quote, newline).
fn esc(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", esc(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }
}

/// The exposition for these extensions and the process's counters.
pub fn render(exts: &[ExtensionView], stats: &crate::core::LoopStats) -> String {
    let mut o = Out(String::with_capacity(4096));
    o.family(
        "conduit_extension_up",
        "gauge",
        "1 when the extension is ready to serve calls.",
    );
    for e in exts {
        let up = u8::from(e.status.state == State::Ready);
        o.sample("conduit_extension_up", &[("extension", &e.status.name)], up);
    }
    o.family(
        "conduit_extension_state",
        "gauge",
        "1 for the state the extension is in, 0 for the others.",
    );
    for e in exts {
        for s in STATES {
            let v = u8::from(e.status.state == s);
            o.sample(
                "conduit_extension_state",
                &[("extension", &e.status.name), ("state", s.as_str())],
                v,
            );
        }
    }
    o.family(
        "conduit_extension_restarts_total",
        "counter",
        "Restarts of the extension since the daemon started.",
    );
    for e in exts {
        o.sample(
            "conduit_extension_restarts_total",
            &[("extension", &e.status.name)],
            e.status.restarts,
        );
    }
    o.family(
        "conduit_extension_calls_total",
        "counter",
        "Host calls to the extension by method and outcome (ok or error).",
    );
    for e in exts {
        for (m, c) in &e.status.calls {
            let labels = |outcome| {
                [
                    ("extension", e.status.name.as_str()),
                    ("method", m),
                    ("outcome", outcome),
                ]
            };
            o.sample(
                "conduit_extension_calls_total",
                &labels("ok"),
                c.count - c.errors.min(c.count),
            );
            o.sample("conduit_extension_calls_total", &labels("error"), c.errors);
        }
    }
    o.family(
        "conduit_extension_call_latency_seconds",
        "gauge",
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
                o.sample(
                    "conduit_extension_call_latency_seconds",
                    &[
                        ("extension", &e.status.name),
                        ("method", m),
                        ("quantile", q),
                    ],
                    us as f64 / 1e6,
                );
            }
        }
    }
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    for (name, kind, help, v) in [
        (
            "conduit_host_loop_passes_total",
            "counter",
            "Host-loop passes.",
            l(&stats.passes) as f64,
        ),
        (
            "conduit_host_loop_last_pass_seconds",
            "gauge",
            "Duration of the last host-loop pass.",
            l(&stats.last_pass_us) as f64 / 1e6,
        ),
        (
            "conduit_host_loop_in_transaction_calls_total",
            "counter",
            "In-transaction calls the host loop made.",
            l(&stats.in_transaction_calls) as f64,
        ),
        (
            "conduit_host_loop_fallbacks_total",
            "counter",
            "In-transaction calls that failed or missed the deadline and took their fallback.",
            l(&stats.fallbacks) as f64,
        ),
        (
            "conduit_host_loop_panics_total",
            "counter",
            "Host-loop passes that panicked (a bug; the loop goes on).",
            l(&stats.panics) as f64,
        ),
    ] {
        o.family(name, kind, help);
        o.sample(name, &[], v);
    }
    let x = &super::otlp::STATS;
    o.family(
        "conduit_telemetry_export_enabled",
        "gauge",
        "1 when spans are exported over OTLP.",
    );
    o.sample(
        "conduit_telemetry_export_enabled",
        &[],
        u8::from(x.enabled.load(Ordering::Relaxed)),
    );
    o.family(
        "conduit_telemetry_spans_exported_total",
        "counter",
        "Spans the collector acknowledged.",
    );
    o.sample(
        "conduit_telemetry_spans_exported_total",
        &[],
        l(&x.exported),
    );
    o.family(
        "conduit_telemetry_spans_dropped_total",
        "counter",
        "Spans dropped: pushed out of the full queue, or in a batch that failed every attempt.",
    );
    o.sample(
        "conduit_telemetry_spans_dropped_total",
        &[("reason", "queue_full")],
        l(&x.dropped_queue_full),
    );
    o.sample(
        "conduit_telemetry_spans_dropped_total",
        &[("reason", "export_failed")],
        l(&x.dropped_export_failed),
    );
    o.family(
        "conduit_telemetry_export_failures_total",
        "counter",
        "Export attempts that failed or timed out.",
    );
    o.sample(
        "conduit_telemetry_export_failures_total",
        &[],
        l(&x.failed_attempts),
    );
    o.family(
        "conduit_telemetry_queue_spans",
        "gauge",
        "Spans waiting in the export queue.",
    );
    o.sample("conduit_telemetry_queue_spans", &[], l(&x.pending));
    o.0
}

#[cfg(test)]
mod tests {
    use super::esc;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    }
}
