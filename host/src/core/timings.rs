//! What ingress and the writer cost, timed in the daemon: how long each write transaction
//! waited for the writer and held it (every write: ingress, the host loop, the API's others),
//! and how long each accepted event waited from the commit that acknowledged it to the commit
//! of the routing decision about it. Kept as HDR histograms (`conduit_supervisor::Latency`)
//! for `GET /v1/metrics` and the OTLP export, with the group commit's counters.
//!
//! What this does not do: read a clock other than the monotonic one, or time an event it did
//! not see accepted (one accepted before the daemon started is routed untimed).
//!
//! Invariant: the acceptance stamps are bounded ([`MAX_STAMPS`]): past it new events go untimed
//! and are counted, so a backlog the routing pass cannot take costs a bounded amount of memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use conduit_store::WriteTimes;
use conduit_supervisor::{Latency, LatencyHistogram};

use super::group_commit::Tally;

/// The most accepted events waiting to be routed that are timed at once (about 4 MiB).
pub const MAX_STAMPS: usize = 100_000;

/// The quantiles exported beside each histogram (`1` is the maximum).
pub const QUANTILES: [(&str, f64); 4] = [("0.5", 0.5), ("0.95", 0.95), ("0.99", 0.99), ("1", 1.0)];

/// One timed quantity, exported: the histogram at fixed bounds and the HDR quantiles.
#[derive(Clone, Debug, PartialEq)]
pub struct Exported {
    pub histogram: LatencyHistogram,
    /// At [`QUANTILES`], in microseconds.
    pub quantiles_us: [u64; 4],
}

/// Counters of the group commit.
#[derive(Debug, Default)]
pub struct IngressCounts {
    /// Group commits (transactions) that committed.
    pub commits: AtomicU64,
    /// Events answered, by outcome: new, a duplicate, or refused (their submission refused by
    /// the store, or with its whole transaction).
    pub new: AtomicU64,
    pub duplicate: AtomicU64,
    pub refused: AtomicU64,
    /// Events accepted while [`MAX_STAMPS`] were already waiting: routed untimed.
    pub untimed: AtomicU64,
}

impl IngressCounts {
    /// Count one commit's outcome (`committed`: its transaction committed).
    pub fn count(&self, committed: bool, t: Tally) {
        let add = |a: &AtomicU64, n: usize| a.fetch_add(n as u64, Ordering::Relaxed);
        add(&self.commits, usize::from(committed));
        add(&self.new, t.new);
        add(&self.duplicate, t.duplicate);
        add(&self.refused, t.refused);
    }

    pub fn load(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }
}

/// The daemon's timings; one per `Core`.
#[derive(Debug, Default)]
pub struct Timings {
    writer_wait: Mutex<Latency>,
    writer_hold: Mutex<Latency>,
    ack_to_route: Mutex<Latency>,
    /// Each new event from just before its acceptance's `COMMIT` until its routing decision
    /// commits: `None` until that `COMMIT` returned, then when it did.
    stamps: Mutex<HashMap<i64, Option<Instant>>>,
    pub ingress: IngressCounts,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Timings {
    /// One write transaction's wait and hold (the store's observer).
    pub fn write(&self, t: WriteTimes) {
        lock(&self.writer_wait).record(t.wait);
        lock(&self.writer_hold).record(t.hold);
    }

    /// New events about to be committed (called inside their transaction, before `COMMIT`):
    /// marked, so that a routing decision made between their `COMMIT` and their stamp (the
    /// committing thread held up right there) still finds them.
    pub fn committing(&self, ids: &[i64]) {
        let mut stamps = lock(&self.stamps);
        for &id in ids {
            if stamps.len() >= MAX_STAMPS {
                self.ingress.untimed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            stamps.insert(id, None);
        }
    }

    /// Events whose acceptance's `COMMIT` returned at `at` (the acknowledgement's moment).
    pub fn accepted(&self, ids: &[i64], at: Instant) {
        let mut stamps = lock(&self.stamps);
        for id in ids {
            // Absent: untimed, or already routed (timed as routed at once).
            if let Some(stamp) = stamps.get_mut(id) {
                *stamp = Some(at);
            }
        }
    }

    /// Events marked by [`Timings::committing`] whose transaction then failed: they were never
    /// written.
    pub fn abandoned(&self, ids: &[i64]) {
        let mut stamps = lock(&self.stamps);
        for id in ids {
            stamps.remove(id);
        }
    }

    /// Events whose routing decision committed at `at`: each timed one's wait is recorded (0
    /// for one routed before its acknowledgement's stamp).
    pub fn routed(&self, ids: &[i64], at: Instant) {
        let waited: Vec<_> = {
            let mut stamps = lock(&self.stamps);
            ids.iter()
                .filter_map(|id| stamps.remove(id))
                .map(|t| t.map_or(Duration::ZERO, |t| at.saturating_duration_since(t)))
                .collect()
        };
        if waited.is_empty() {
            return;
        }
        let mut h = lock(&self.ack_to_route);
        for w in waited {
            h.record(w);
        }
    }

    /// How many new events wait for their routing decision, timed.
    pub fn waiting(&self) -> usize {
        lock(&self.stamps).len()
    }

    /// The writer's wait, its hold, and acknowledgement-to-routing, at `bounds_us`.
    pub fn export(&self, bounds_us: &[u64]) -> [Exported; 3] {
        let one = |m: &Mutex<Latency>| {
            let l = lock(m);
            Exported {
                histogram: l.buckets(bounds_us),
                quantiles_us: QUANTILES.map(|(_, q)| l.quantile_us(q)),
            }
        };
        [
            one(&self.writer_wait),
            one(&self.writer_hold),
            one(&self.ack_to_route),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the committer does for a commit that succeeds: mark, then stamp.
    fn commit(t: &Timings, ids: &[i64], at: Instant) {
        t.committing(ids);
        t.accepted(ids, at);
    }

    #[test]
    fn an_event_is_timed_from_its_acceptance_to_its_routing_once() {
        let t = Timings::default();
        let t0 = Instant::now();
        commit(&t, &[1, 2, 3], t0);
        t.routed(&[1, 3], t0 + Duration::from_millis(4));
        // Routed again, or never accepted here (before a restart): not timed.
        t.routed(&[1, 9], t0 + Duration::from_millis(50));
        t.routed(&[2], t0 + Duration::from_millis(20));
        let [_, _, a2r] = t.export(&[5_000, 25_000]);
        assert_eq!(a2r.histogram.count, 3);
        assert_eq!(a2r.histogram.cumulative, vec![2, 3]);
        // The max, to HDR's precision (3 significant digits).
        assert!((20_000..=20_020).contains(&a2r.quantiles_us[3]), "{a2r:?}");
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn routed_before_its_stamp_is_timed_as_at_once_and_leaves_nothing_behind() {
        let t = Timings::default();
        let t0 = Instant::now();
        t.committing(&[7]);
        // The routing decision commits before the committer stamps the acknowledgement.
        t.routed(&[7], t0);
        t.accepted(&[7], t0 + Duration::from_millis(1));
        assert_eq!(t.waiting(), 0, "no stamp left for an event already routed");
        let [_, _, a2r] = t.export(&[1]);
        assert_eq!((a2r.histogram.count, a2r.histogram.cumulative[0]), (1, 1));
        // A transaction that failed after marking: its events are forgotten.
        t.committing(&[8, 9]);
        t.abandoned(&[8, 9]);
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn past_the_stamp_bound_events_go_untimed_and_are_counted() {
        let t = Timings::default();
        let t0 = Instant::now();
        let all: Vec<i64> = (0..MAX_STAMPS as i64).collect();
        commit(&t, &all, t0);
        assert_eq!(t.ingress.untimed.load(Ordering::Relaxed), 0);
        let past = [MAX_STAMPS as i64, MAX_STAMPS as i64 + 1];
        commit(&t, &past, t0);
        assert_eq!(t.waiting(), MAX_STAMPS);
        assert_eq!(t.ingress.untimed.load(Ordering::Relaxed), 2);
        // Routing frees room.
        t.routed(&[0], t0);
        commit(&t, &[-1], t0);
        assert_eq!(t.waiting(), MAX_STAMPS);
        assert_eq!(t.ingress.untimed.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn each_write_is_counted_in_both_wait_and_hold() {
        let t = Timings::default();
        t.write(WriteTimes {
            wait: Duration::from_micros(30),
            hold: Duration::from_millis(2),
        });
        let [wait, hold, a2r] = t.export(&[100, 10_000]);
        assert_eq!(wait.histogram.cumulative, vec![1, 1]);
        assert_eq!(hold.histogram.cumulative, vec![0, 1]);
        assert_eq!(a2r.histogram.count, 0);
    }
}
