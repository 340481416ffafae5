//! Per-method call counts and latency percentiles, for the status; and [`Latency`], the HDR
//! histogram with its sum that every latency the daemon exports is kept in (the calls here, the
//! writer's wait and hold and ingress's acknowledgement-to-routing in the host).
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

/// Latencies from 1 µs to an hour at 3 significant digits (HDR), with their sum, for the
/// status's percentiles and the metrics' histograms. Not synchronised: hold it in a lock.
#[derive(Clone, Debug)]
pub struct Latency {
    h: Histogram<u64>,
    sum_us: u64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            h: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds"),
            sum_us: 0,
        }
    }
}

impl Latency {
    /// Record one latency (clamped to 1 µs .. 1 h).
    pub fn record(&mut self, took: Duration) {
        let us = (took.as_micros() as u64).clamp(1, 3_600_000_000);
        let _ = self.h.record(us);
        self.sum_us = self.sum_us.saturating_add(us);
    }

    /// How many latencies were recorded.
    pub fn count(&self) -> u64 {
        self.h.len()
    }

    /// The latency at quantile `q` (0..=1; 1 is the maximum), in microseconds; 0 when empty.
    pub fn quantile_us(&self, q: f64) -> u64 {
        if q >= 1.0 {
            self.h.max()
        } else {
            self.h.value_at_quantile(q)
        }
    }

    /// The latencies as a histogram with fixed bounds (ascending, microseconds). HDR keeps 3
    /// significant digits, so a latency within 0.1% of a bound may be counted on either side.
    pub fn buckets(&self, bounds_us: &[u64]) -> LatencyHistogram {
        let mut cumulative = Vec::with_capacity(bounds_us.len());
        let (mut below, mut from) = (0, 1);
        for &b in bounds_us {
            if b >= from {
                below += self.h.count_between(from, b);
                from = self.h.highest_equivalent(b) + 1;
            }
            cumulative.push(below);
        }
        LatencyHistogram {
            cumulative,
            count: self.h.len(),
            sum_us: self.sum_us,
        }
    }
}

#[derive(Default)]
struct Method {
    latency: Latency,
    errors: u64,
}

#[derive(Default)]
pub(crate) struct Stats(Mutex<HashMap<String, Method>>);

impl Stats {
    pub(crate) fn record(&self, method: &str, took: Duration, ok: bool) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(method) {
            map.insert(method.to_owned(), Method::default());
        }
        let m = map.get_mut(method).expect("inserted above");
        m.latency.record(took);
        if !ok {
            m.errors += 1;
        }
    }

    /// Count a failure that has no latency of its own (the extension was not running, or its
    /// answer was malformed after a successful round trip).
    pub(crate) fn mark_error(&self, method: &str) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(method.to_owned()).or_default().errors += 1;
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<String, MethodStats> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .map(|(m, Method { latency: l, errors })| {
                let s = MethodStats {
                    count: l.count(),
                    errors: *errors,
                    p50_us: l.quantile_us(0.50),
                    p95_us: l.quantile_us(0.95),
                    p99_us: l.quantile_us(0.99),
                    max_us: l.quantile_us(1.0),
                };
                (m.clone(), s)
            })
            .collect()
    }

    /// Each method's latencies at `bounds_us` (ascending; see [`Latency::buckets`]).
    pub(crate) fn histograms(&self, bounds_us: &[u64]) -> BTreeMap<String, LatencyHistogram> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .map(|(name, m)| (name.clone(), m.latency.buckets(bounds_us)))
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
