//! Per-method call counts and latency percentiles, for the status; and, across methods, the
//! figures an overview shows of every extension at once ([`CallSummary`]: counts, p50/p99 and
//! the calls of each of the last [`RATE_BUCKETS`] periods of [`RATE_BUCKET`]); and [`Latency`],
//! the HDR histogram with its sum that every latency the daemon exports is kept in (the calls
//! here, the writer's wait and hold and ingress's acknowledgement-to-routing in the host).
//!
//! Recording takes a short lock (never across an await), two histogram updates and a bucket
//! increment. A summary's percentiles are computed again only when calls were recorded since
//! the last one, so an overview of a thousand idle extensions computes none.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long one bucket of the recent call counts spans.
pub const RATE_BUCKET: Duration = Duration::from_secs(10);
/// How many buckets are kept: with [`RATE_BUCKET`], the last five minutes.
pub const RATE_BUCKETS: usize = 30;

/// An extension's calls across methods, for an overview.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CallSummary {
    pub count: u64,
    pub errors: u64,
    /// Over every call since the daemon started the extension; 0 before the first.
    pub p50_us: u64,
    pub p99_us: u64,
    /// Calls that ended in each of the last [`RATE_BUCKETS`] periods of [`RATE_BUCKET`], oldest
    /// first; the last is the period under way.
    pub recent: Vec<u32>,
}

/// Calls per period, in a ring indexed by the period's number since `base`.
struct Recent {
    base: Instant,
    /// The newest period counted so far.
    newest: u64,
    counts: [u32; RATE_BUCKETS],
}

impl Recent {
    fn new(base: Instant) -> Recent {
        Recent {
            base,
            newest: 0,
            counts: [0; RATE_BUCKETS],
        }
    }

    fn period(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.base).as_millis() / RATE_BUCKET.as_millis()) as u64
    }

    /// Move the ring on to `period`, emptying the buckets of the periods skipped.
    fn advance(&mut self, period: u64) {
        if period <= self.newest {
            return;
        }
        let gap = (period - self.newest).min(RATE_BUCKETS as u64);
        for p in period + 1 - gap..=period {
            self.counts[(p % RATE_BUCKETS as u64) as usize] = 0;
        }
        self.newest = period;
    }

    fn count(&mut self, at: Instant) {
        let p = self.period(at);
        self.advance(p);
        // A call that ended in a period already passed (clocks read out of order between
        // threads) counts in the newest.
        let slot = (self.newest % RATE_BUCKETS as u64) as usize;
        self.counts[slot] = self.counts[slot].saturating_add(1);
    }

    /// Oldest first, the last being the period of `now`.
    fn series(&mut self, now: Instant) -> Vec<u32> {
        let p = self.period(now);
        self.advance(p);
        (0..RATE_BUCKETS as u64)
            .map(|i| {
                let q = self.newest + 1 + i; // ≡ newest - (RATE_BUCKETS - 1) + i
                self.counts[(q % RATE_BUCKETS as u64) as usize]
            })
            .collect()
    }
}

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
/// The histogram (about 180 KiB at these bounds) is made at the first latency recorded, so an
/// extension never called (1,000 idle on-demand ones) costs none.
#[derive(Clone, Debug, Default)]
pub struct Latency {
    h: Option<Box<Histogram<u64>>>,
    sum_us: u64,
}

impl Latency {
    /// Record one latency (clamped to 1 µs .. 1 h).
    pub fn record(&mut self, took: Duration) {
        let us = (took.as_micros() as u64).clamp(1, 3_600_000_000);
        let h = self.h.get_or_insert_with(|| {
            Box::new(
                Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds"),
            )
        });
        let _ = h.record(us);
        self.sum_us = self.sum_us.saturating_add(us);
    }

    /// How many latencies were recorded.
    pub fn count(&self) -> u64 {
        self.h.as_ref().map_or(0, |h| h.len())
    }

    /// The latency at quantile `q` (0..=1; 1 is the maximum), in microseconds; 0 when empty.
    pub fn quantile_us(&self, q: f64) -> u64 {
        match &self.h {
            None => 0,
            Some(h) if q >= 1.0 => h.max(),
            Some(h) => h.value_at_quantile(q),
        }
    }

    /// The latencies as a histogram with fixed bounds (ascending, microseconds). HDR keeps 3
    /// significant digits, so a latency within 0.1% of a bound may be counted on either side.
    pub fn buckets(&self, bounds_us: &[u64]) -> LatencyHistogram {
        let Some(h) = &self.h else {
            return LatencyHistogram {
                cumulative: vec![0; bounds_us.len()],
                count: 0,
                sum_us: 0,
            };
        };
        let mut cumulative = Vec::with_capacity(bounds_us.len());
        let (mut below, mut from) = (0, 1);
        for &b in bounds_us {
            if b >= from {
                below += h.count_between(from, b);
                from = h.highest_equivalent(b) + 1;
            }
            cumulative.push(below);
        }
        LatencyHistogram {
            cumulative,
            count: h.len(),
            sum_us: self.sum_us,
        }
    }
}

#[derive(Default)]
struct Method {
    latency: Latency,
    errors: u64,
}

/// Every method's figures, and the figures across methods.
struct Table {
    methods: HashMap<String, Method>,
    /// Every call, whatever its method.
    all: Method,
    recent: Recent,
    /// The percentiles of `all` when it held this many calls: (count, p50, p99).
    cached: Option<(u64, u64, u64)>,
}

pub(crate) struct Stats(Mutex<Table>);

impl Default for Stats {
    fn default() -> Self {
        Stats::starting_at(Instant::now())
    }
}

impl Stats {
    /// Statistics whose recent periods are counted from `base`.
    fn starting_at(base: Instant) -> Stats {
        Stats(Mutex::new(Table {
            methods: HashMap::new(),
            all: Method::default(),
            recent: Recent::new(base),
            cached: None,
        }))
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn record(&self, method: &str, took: Duration, ok: bool) {
        self.record_at(method, took, ok, Instant::now());
    }

    fn record_at(&self, method: &str, took: Duration, ok: bool, at: Instant) {
        let mut t = self.table();
        let t = &mut *t;
        if !t.methods.contains_key(method) {
            t.methods.insert(method.to_owned(), Method::default());
        }
        let m = t.methods.get_mut(method).expect("inserted above");
        for m in [m, &mut t.all] {
            m.latency.record(took);
            if !ok {
                m.errors += 1;
            }
        }
        t.recent.count(at);
    }

    /// Count a failure that has no latency of its own (the extension was not running, or its
    /// answer was malformed after a successful round trip).
    pub(crate) fn mark_error(&self, method: &str) {
        let mut t = self.table();
        t.methods.entry(method.to_owned()).or_default().errors += 1;
        t.all.errors += 1;
    }

    /// The figures across methods, the recent periods ending at `now`.
    pub(crate) fn summary(&self, now: Instant) -> CallSummary {
        let mut t = self.table();
        let count = t.all.latency.count();
        let (p50_us, p99_us) = match t.cached {
            Some((n, p50, p99)) if n == count => (p50, p99),
            _ if count == 0 => (0, 0),
            _ => {
                let (p50, p99) = (
                    t.all.latency.quantile_us(0.50),
                    t.all.latency.quantile_us(0.99),
                );
                t.cached = Some((count, p50, p99));
                (p50, p99)
            }
        };
        CallSummary {
            count,
            errors: t.all.errors,
            p50_us,
            p99_us,
            recent: t.recent.series(now),
        }
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<String, MethodStats> {
        let t = self.table();
        t.methods
            .iter()
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
        let t = self.table();
        t.methods
            .iter()
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

    #[test]
    fn the_summary_spans_every_method_and_keeps_its_percentiles_until_a_call() {
        let s = Stats::default();
        let now = Instant::now();
        assert_eq!(s.summary(now).count, 0);
        assert_eq!((s.summary(now).p50_us, s.summary(now).p99_us), (0, 0));
        for _ in 0..98 {
            s.record("a", Duration::from_micros(100), true);
        }
        s.record("b", Duration::from_millis(50), false);
        s.record("b", Duration::from_millis(50), true);
        let sum = s.summary(Instant::now());
        assert_eq!((sum.count, sum.errors), (100, 1));
        assert_eq!(sum.p50_us, 100);
        assert!((49_900..=50_100).contains(&sum.p99_us), "{sum:?}");
        // Cached: the same answer without a call in between, a new one after.
        assert_eq!(s.summary(Instant::now()).p99_us, sum.p99_us);
        for _ in 0..100 {
            s.record("b", Duration::from_millis(50), true);
        }
        assert!(s.summary(Instant::now()).p50_us >= 49_900);
        s.mark_error("c");
        assert_eq!(s.summary(Instant::now()).errors, 2);
    }

    #[test]
    fn recent_calls_fall_in_their_period_and_old_periods_empty() {
        let base = Instant::now();
        let s = Stats::starting_at(base);
        let at =
            |periods: u64, ms: u64| base + RATE_BUCKET * periods as u32 + Duration::from_millis(ms);
        let call = |t| s.record_at("m", Duration::from_micros(5), true, t);
        call(at(0, 0));
        call(at(0, 9_999));
        call(at(1, 0));
        call(at(3, 5));
        let series = s.summary(at(3, 6)).recent;
        assert_eq!(series.len(), RATE_BUCKETS);
        assert_eq!(&series[RATE_BUCKETS - 4..], &[2, 1, 0, 1]);
        assert!(series[..RATE_BUCKETS - 4].iter().all(|n| *n == 0));
        // The ring moves on with time alone: the first periods fall out of it.
        let later = s.summary(at(RATE_BUCKETS as u64, 0)).recent;
        assert_eq!(later[RATE_BUCKETS - 1], 0);
        assert_eq!(later[RATE_BUCKETS - 1 - (RATE_BUCKETS - 3)], 1, "{later:?}");
        assert_eq!(later.iter().sum::<u32>(), 2, "{later:?}");
        // Far later, nothing is left.
        let empty = s.summary(at(10 * RATE_BUCKETS as u64, 0)).recent;
        assert!(empty.iter().all(|n| *n == 0));
        // A call stamped before the newest period counts in the newest.
        call(at(10 * RATE_BUCKETS as u64 - 1, 0));
        assert_eq!(
            s.summary(at(10 * RATE_BUCKETS as u64, 1)).recent[RATE_BUCKETS - 1],
            1
        );
    }
}
