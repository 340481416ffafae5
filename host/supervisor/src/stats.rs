//! Per-method call counts and latency percentiles, for the status.
//!
//! Recording takes a short lock (never across an await) and one histogram update.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Counts and latency percentiles of one method, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MethodStats {
    pub count: u64,
    pub errors: u64,
    pub p50_us: u64,
    pub p95_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

/// One method's latencies as a histogram with fixed bounds, for metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyHistogram {
    /// Calls that took at most each bound (cumulative), one per bound asked for.
    pub cumulative: Vec<u64>,
    pub count: u64,
    /// The sum of the recorded latencies, in microseconds (each clamped to at least 1).
    pub sum_us: u64,
}

/// An extension's traffic, for metrics: in flight now, and totals since it was first started
/// by this daemon (across its restarts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Traffic {
    /// Host calls awaiting the extension's answer.
    pub calls_in_flight: u64,
    /// The extension's calls to the host being served.
    pub callbacks_in_flight: u64,
    /// Bytes of messages read from the extension's stdout.
    pub bytes_in: u64,
    /// Bytes written to the extension's stdin.
    pub bytes_out: u64,
    /// Host calls that failed with `overloaded`: not sent (the extension is not reading), or
    /// refused by the extension (too many requests at once).
    pub overloaded_calls: u64,
    /// The extension's calls the host refused with `overloaded`.
    pub overloaded_callbacks: u64,
}

struct Method {
    h: Histogram<u64>,
    errors: u64,
    sum_us: u64,
}

impl Method {
    fn new() -> Method {
        Method {
            h: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds"),
            errors: 0,
            sum_us: 0,
        }
    }
}

#[derive(Default)]
pub(crate) struct Stats(Mutex<HashMap<String, Method>>);

impl Stats {
    pub(crate) fn record(&self, method: &str, took: Duration, ok: bool) {
        let us = (took.as_micros() as u64).clamp(1, 3_600_000_000);
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(method) {
            map.insert(method.to_owned(), Method::new());
        }
        let m = map.get_mut(method).expect("inserted above");
        let _ = m.h.record(us);
        m.sum_us = m.sum_us.saturating_add(us);
        if !ok {
            m.errors += 1;
        }
    }

    /// Count a failure that has no latency of its own (the extension was not running, or its
    /// answer was malformed after a successful round trip).
    pub(crate) fn mark_error(&self, method: &str) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(method.to_owned())
            .or_insert_with(Method::new)
            .errors += 1;
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<String, MethodStats> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .map(|(m, Method { h, errors, .. })| {
                let s = MethodStats {
                    count: h.len(),
                    errors: *errors,
                    p50_us: h.value_at_quantile(0.50),
                    p95_us: h.value_at_quantile(0.95),
                    p99_us: h.value_at_quantile(0.99),
                    max_us: h.max(),
                };
                (m.clone(), s)
            })
            .collect()
    }

    /// Each method's latencies at `bounds_us` (ascending). HDR keeps 3 significant digits, so
    /// a call within 0.1% of a bound may be counted on either side of it.
    pub(crate) fn histograms(&self, bounds_us: &[u64]) -> BTreeMap<String, LatencyHistogram> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .map(|(name, m)| {
                let mut cumulative = Vec::with_capacity(bounds_us.len());
                let (mut below, mut from) = (0, 1);
                for &b in bounds_us {
                    if b >= from {
                        below += m.h.count_between(from, b);
                        from = m.h.highest_equivalent(b) + 1;
                    }
                    cumulative.push(below);
                }
                let h = LatencyHistogram {
                    cumulative,
                    count: m.h.len(),
                    sum_us: m.sum_us,
                };
                (name.clone(), h)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_count_each_call_once_at_its_bound() {
        let s = Stats::default();
        for us in [1, 100, 100, 101, 5_000, 2_000_000] {
            s.record("m", Duration::from_micros(us), true);
        }
        s.mark_error("m");
        let h = &s.histograms(&[100, 1_000, 1_000_000])["m"];
        // At the bound counts; one past it does not.
        assert_eq!(h.cumulative, vec![3, 4, 5]);
        assert_eq!(h.count, 6);
        assert_eq!(h.sum_us, 1 + 100 + 100 + 101 + 5_000 + 2_000_000);
        assert_eq!(s.snapshot()["m"].errors, 1);
    }
}
