//! When to restart an extension that died: a pure policy over recorded facts and an injected
//! clock, so every rule is tested without sleeping.
//!
//! - The n-th consecutive failure waits `initial · 2^(n-1)`, capped at `max` (100 ms, 200 ms,
//!   400 ms, … 30 s).
//! - Each delay is spread by ±`jitter` (20%) so that many extensions that died together (say,
//!   a shared dependency went away) do not all restart in the same instant; the result never
//!   exceeds `max`.
//! - A child that stayed ready for `stable_after` before dying starts the count again.
//! - From `crash_loop_after` consecutive failures on, the extension is shown `crash-looping`.
//!   It is still restarted (at the capped delay): a cause outside it may clear, and an operator
//!   can always `disable` it.

use std::time::{Duration, Instant};

/// The restart policy.
#[derive(Clone, Debug)]
pub struct RestartPolicy {
    pub initial: Duration,
    pub max: Duration,
    pub jitter: f64,
    pub stable_after: Duration,
    pub crash_loop_after: u32,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(30),
            jitter: 0.2,
            stable_after: Duration::from_secs(10),
            crash_loop_after: 5,
        }
    }
}

/// What happened to one run of the child.
#[derive(Clone, Copy, Debug)]
pub struct RunFacts {
    /// When the handshake completed, if it did.
    pub ready_at: Option<Instant>,
    /// When the child was seen dead.
    pub died_at: Instant,
}

/// The policy's answer for one failure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub delay: Duration,
    /// Consecutive failures, this one included.
    pub failures: u32,
    pub crash_looping: bool,
}

/// Consecutive failures so far.
#[derive(Clone, Debug, Default)]
pub struct RestartTracker {
    failures: u32,
}

impl RestartPolicy {
    /// The delay before jitter after `failures` consecutive failures (1-based).
    pub fn base_delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// Record a failure and decide. `unit` is a random number in `[0, 1)` for the jitter (a
    /// fixed one in tests).
    pub fn on_failure(&self, tracker: &mut RestartTracker, run: RunFacts, unit: f64) -> Decision {
        let stable = run
            .ready_at
            .is_some_and(|r| run.died_at.saturating_duration_since(r) >= self.stable_after);
        if stable {
            tracker.failures = 0;
        }
        tracker.failures = tracker.failures.saturating_add(1);
        let base = self.base_delay(tracker.failures).as_secs_f64();
        let spread = 1.0 - self.jitter + 2.0 * self.jitter * unit.clamp(0.0, 1.0);
        let delay = Duration::from_secs_f64(base * spread).min(self.max);
        Decision {
            delay,
            failures: tracker.failures,
            crash_looping: tracker.failures >= self.crash_loop_after,
        }
    }

    /// Forget past failures (an operator asked for a restart, or the package changed).
    pub fn reset(&self, tracker: &mut RestartTracker) {
        tracker.failures = 0;
    }
}

/// A small random source for jitter (xorshift seeded from the clock and an address). Jitter
/// needs spread, not unpredictability.
#[derive(Debug)]
pub struct Jitter(u64);

impl Default for Jitter {
    fn default() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let local = 0u8;
        Jitter((t.as_nanos() as u64) ^ (&local as *const u8 as u64).rotate_left(32) | 1)
    }
}

impl Jitter {
    /// A number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Die `n` times in a row without ever becoming stable; return the delays (no jitter).
    fn delays(
        policy: &RestartPolicy,
        tracker: &mut RestartTracker,
        n: usize,
        t0: Instant,
    ) -> Vec<Duration> {
        (0..n)
            .map(|i| {
                let died_at = t0 + Duration::from_secs(i as u64);
                policy
                    .on_failure(
                        tracker,
                        RunFacts {
                            ready_at: Some(died_at),
                            died_at,
                        },
                        0.5,
                    )
                    .delay
            })
            .collect()
    }

    #[test]
    fn delays_double_from_100ms_to_a_30s_cap() {
        let p = RestartPolicy::default();
        let got = delays(&p, &mut RestartTracker::default(), 12, Instant::now());
        let want: Vec<Duration> = [
            100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000,
        ]
        .into_iter()
        .map(ms)
        .collect();
        assert_eq!(got, want);
        assert_eq!(
            p.base_delay(1000),
            ms(30_000),
            "no overflow far past the cap"
        );
    }

    #[test]
    fn jitter_spreads_within_bounds_and_never_passes_the_cap() {
        let p = RestartPolicy::default();
        let t = Instant::now();
        let facts = RunFacts {
            ready_at: None,
            died_at: t,
        };
        let low = p
            .on_failure(&mut RestartTracker::default(), facts, 0.0)
            .delay;
        let high = p
            .on_failure(&mut RestartTracker::default(), facts, 0.999_999)
            .delay;
        assert_eq!(low, ms(80));
        assert!(high > ms(119) && high <= ms(120), "{high:?}");
        let mut tr = RestartTracker::default();
        for _ in 0..20 {
            let d = p.on_failure(&mut tr, facts, 0.999).delay;
            assert!(d <= p.max);
        }
        let mut j = Jitter::default();
        for _ in 0..1000 {
            let u = j.unit();
            assert!((0.0..1.0).contains(&u));
        }
    }

    #[test]
    fn stable_uptime_resets_the_count() {
        let p = RestartPolicy::default();
        let mut tr = RestartTracker::default();
        let t0 = Instant::now();
        delays(&p, &mut tr, 4, t0);
        // Ready for 9.9 s, then died: not stable, the count goes on.
        let d = p.on_failure(
            &mut tr,
            RunFacts {
                ready_at: Some(t0),
                died_at: t0 + ms(9_900),
            },
            0.5,
        );
        assert_eq!((d.failures, d.delay), (5, ms(1600)));
        // Ready for 10 s, then died: stable, the count starts again.
        let d = p.on_failure(
            &mut tr,
            RunFacts {
                ready_at: Some(t0),
                died_at: t0 + ms(10_000),
            },
            0.5,
        );
        assert_eq!((d.failures, d.delay, d.crash_looping), (1, ms(100), false));
        // Never ready: never stable, however long it ran.
        let d = p.on_failure(
            &mut tr,
            RunFacts {
                ready_at: None,
                died_at: t0 + Duration::from_secs(3600),
            },
            0.5,
        );
        assert_eq!(d.failures, 2);
    }

    #[test]
    fn crash_looping_from_the_fifth_consecutive_failure() {
        let p = RestartPolicy::default();
        let mut tr = RestartTracker::default();
        let t = Instant::now();
        let flags: Vec<bool> = (0..6)
            .map(|_| {
                p.on_failure(
                    &mut tr,
                    RunFacts {
                        ready_at: None,
                        died_at: t,
                    },
                    0.5,
                )
                .crash_looping
            })
            .collect();
        assert_eq!(flags, [false, false, false, false, true, true]);
        p.reset(&mut tr);
        assert!(
            !p.on_failure(
                &mut tr,
                RunFacts {
                    ready_at: None,
                    died_at: t
                },
                0.5
            )
            .crash_looping
        );
    }
}
