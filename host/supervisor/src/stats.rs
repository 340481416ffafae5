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

#[derive(Default)]
pub(crate) struct Stats(Mutex<HashMap<String, (Histogram<u64>, u64)>>);

impl Stats {
    pub(crate) fn record(&self, method: &str, took: Duration, ok: bool) {
        let us = (took.as_micros() as u64).clamp(1, 3_600_000_000);
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(method) {
            let h =
                Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
            map.insert(method.to_owned(), (h, 0));
        }
        let (h, errors) = map.get_mut(method).expect("inserted above");
        let _ = h.record(us);
        if !ok {
            *errors += 1;
        }
    }

    /// Count a failure that has no latency of its own (the extension was not running, or its
    /// answer was malformed after a successful round trip).
    pub(crate) fn mark_error(&self, method: &str) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(method) {
            let h =
                Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
            map.insert(method.to_owned(), (h, 0));
        }
        if let Some((_, errors)) = map.get_mut(method) {
            *errors += 1;
        }
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<String, MethodStats> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .map(|(m, (h, errors))| {
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
}
