//! What the daemon tells systemd while it runs, over `$NOTIFY_SOCKET` (sd_notify(3)):
//! `READY=1` once its socket is bound and every enabled extension has handshaken or failed,
//! `STATUS=` lines (`systemctl status conduit`), `WATCHDOG=1` at half of `$WATCHDOG_USEC` while
//! the host loop and the runtime make progress, `STOPPING=1` and `EXTEND_TIMEOUT_USEC=` while
//! it stops.
//!
//! Without `NOTIFY_SOCKET` none of this exists: [`Notifier::from_env`] is `None` and no task
//! runs. The decisions — when the daemon is settled, whether it is alive, what the status line
//! says — are pure functions of what was observed, tested without a socket; the task only
//! gathers the observations and sends.
//!
//! Extensions never see `NOTIFY_SOCKET` (the supervisor passes an allow-listed environment),
//! and the unit says `NotifyAccess=main`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use conduit_supervisor::State;
use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

use crate::daemon::handle::{Daemon, ExtensionView};
use crate::daemon::trouble;

/// How long the daemon waits for its extensions to settle before it says `READY=1` anyway:
/// past every extension's start timeout (10 s), with room for a slow machine.
pub const READY_CEILING: Duration = Duration::from_secs(60);
/// How often the status line is recomputed (and sent when it changed).
pub const STATUS_EVERY: Duration = Duration::from_secs(2);
/// While a stop is under way, the stop timeout is pushed this far ahead, every
/// [`EXTEND_EVERY`].
pub const EXTEND_BY: Duration = Duration::from_secs(30);
pub const EXTEND_EVERY: Duration = Duration::from_secs(10);

/// The daemon's side of `$NOTIFY_SOCKET`.
#[derive(Clone, Debug)]
pub struct Notifier {
    /// `$WATCHDOG_USEC`, when systemd asks for heartbeats (and `$WATCHDOG_PID` is ours).
    watchdog: Option<Duration>,
}

impl Notifier {
    /// `None` when the daemon does not run under a service manager that listens.
    pub fn from_env() -> Option<Notifier> {
        std::env::var_os("NOTIFY_SOCKET")?;
        Some(Notifier {
            watchdog: sd_notify::watchdog_enabled(),
        })
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if let Err(e) = sd_notify::notify(states) {
            tracing::warn!(error = %e, "cannot notify the service manager");
        }
    }

    /// `STOPPING=1`: a SIGTERM (or SIGINT) was received.
    pub fn stopping(&self) {
        self.send(&[
            NotifyState::Stopping,
            NotifyState::Status("stopping extensions"),
        ]);
    }

    /// Keep the service manager from ending a stop that is still going on.
    pub fn extend_stop(&self) {
        self.send(&[NotifyState::ExtendTimeoutUsec(EXTEND_BY.as_micros() as u32)]);
    }

    /// Say `READY=1` once the daemon has settled, then keep the status line and the heartbeat
    /// going until `shutdown`.
    pub async fn run(self, daemon: Arc<Daemon>, shutdown: CancellationToken) {
        let started = Instant::now();
        loop {
            let views = daemon.extensions().unwrap_or_default();
            if settled(&views) || started.elapsed() >= READY_CEILING {
                let line = status_line(&views, &loop_figures(&daemon));
                self.send(&[NotifyState::Ready, NotifyState::Status(&line)]);
                tracing::info!(status = %line, "told the service manager the daemon is ready");
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
                () = shutdown.cancelled() => return,
            }
        }
        let tick = match self.watchdog {
            Some(w) => (w / 4).clamp(Duration::from_millis(50), Duration::from_millis(500)),
            None => Duration::from_millis(500),
        };
        let mut liveness = Liveness::new(self.watchdog, Instant::now());
        let mut next_beat = Instant::now();
        let mut next_status = Instant::now() + STATUS_EVERY;
        let mut last_line = String::new();
        loop {
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                () = shutdown.cancelled() => return,
            }
            let now = Instant::now();
            let alive = liveness.observe(daemon.core().stats.passes.load(Ordering::Relaxed), now);
            if let Some(w) = self.watchdog
                && now >= next_beat
            {
                if alive {
                    self.send(&[NotifyState::Watchdog]);
                } else {
                    tracing::warn!(
                        stalled_for = ?liveness.stalled_for(now),
                        "the host loop has made no pass; the watchdog heartbeat is withheld"
                    );
                }
                next_beat = now + w / 2;
            }
            if now >= next_status {
                next_status = now + STATUS_EVERY;
                let views = daemon.extensions().unwrap_or_default();
                let line = status_line(&views, &loop_figures(&daemon));
                if line != last_line {
                    self.send(&[NotifyState::Status(&line)]);
                    last_line = line;
                }
            }
        }
    }
}

/// Whether every enabled extension has handshaken or failed: none is still starting.
pub fn settled(views: &[ExtensionView]) -> bool {
    views
        .iter()
        .filter(|v| v.enabled)
        .all(|v| v.status.state != State::Starting)
}

/// What the status line says of the host loop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoopFigures {
    pub passes: u64,
    pub fallbacks: u64,
}

fn loop_figures(daemon: &Daemon) -> LoopFigures {
    let s = &daemon.core().stats;
    LoopFigures {
        passes: s.passes.load(Ordering::Relaxed),
        fallbacks: s.fallbacks.load(Ordering::Relaxed),
    }
}

/// The line `systemctl status conduit` shows, e.g. `5 ready, 1 unresponsive, 1 backing-off,
/// 1 disabled; in trouble since 2026-12-04 17:22:10 UTC; 2 restarts; host loop: 1,234 passes,
/// 0 fallbacks`: the extensions counted as the health endpoint counts them (ready means ready
/// and in no trouble; each one in trouble under its trouble), then the quiet states.
pub fn status_line(views: &[ExtensionView], figures: &LoopFigures) -> String {
    let summary = trouble::summarize(views);
    let mut parts: Vec<String> = Vec::new();
    if summary.ready > 0 {
        parts.push(format!("{} ready", summary.ready));
    }
    let troubles = summary.trouble_counts();
    if !troubles.is_empty() {
        parts.push(troubles);
    }
    // The rest by their state: starting, stopping, stopped, disabled.
    let mut quiet: BTreeMap<u8, (&'static str, usize)> = BTreeMap::new();
    for v in views {
        if trouble::trouble(v).is_some() || (v.enabled && v.status.state == State::Ready) {
            continue;
        }
        let state = if v.enabled {
            v.status.state
        } else {
            State::Disabled
        };
        let order = match state {
            State::Starting => 0,
            State::Stopping => 1,
            State::Stopped => 2,
            State::Disabled => 3,
            _ => 4,
        };
        quiet.entry(order).or_insert((state.as_str(), 0)).1 += 1;
    }
    parts.extend(quiet.values().map(|(name, n)| format!("{n} {name}")));
    let mut line = if views.is_empty() {
        "no extensions installed".to_owned()
    } else {
        parts.join(", ")
    };
    if let Some(at) = summary.since_ms {
        line.push_str(&format!("; in trouble since {}", trouble::utc_seconds(at)));
    }
    let restarts: u64 = views.iter().map(|v| u64::from(v.status.restarts)).sum();
    format!(
        "{line}; {} restart{}; host loop: {} passes, {} fallbacks",
        thousands(restarts),
        if restarts == 1 { "" } else { "s" },
        thousands(figures.passes),
        thousands(figures.fallbacks)
    )
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Whether the host loop makes progress: it has finished a pass within the stall threshold.
/// The loop passes at least once a second when idle, and a pass is bounded (each
/// in-transaction call by its deadline), so a loop that has not passed for half the watchdog
/// interval (at least 3 s) is stuck, and the heartbeat is withheld so the manager restarts
/// the daemon. The runtime's progress is implied: this runs as a task on it.
#[derive(Debug)]
pub struct Liveness {
    passes: Option<u64>,
    progress_at: Instant,
    stall_after: Duration,
}

impl Liveness {
    pub fn new(watchdog: Option<Duration>, now: Instant) -> Self {
        let half = watchdog.map(|w| w / 2).unwrap_or_default();
        Liveness {
            passes: None,
            progress_at: now,
            stall_after: half.max(Duration::from_secs(3)),
        }
    }

    /// Record the loop's pass count at `now`; whether the loop is alive.
    pub fn observe(&mut self, passes: u64, now: Instant) -> bool {
        if self.passes != Some(passes) {
            self.passes = Some(passes);
            self.progress_at = now;
        }
        self.stalled_for(now) <= self.stall_after
    }

    /// How long since the last pass was seen.
    pub fn stalled_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.progress_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::health::Condition;
    use conduit_supervisor::Status;

    fn view(name: &str, state: State, restarts: u32, enabled: bool) -> ExtensionView {
        let mut status = Status::new(name, "1.0.0", state, None);
        status.restarts = restarts;
        ExtensionView {
            status,
            enabled,
            installed_at_ms: 0,
            description: None,
            health: None,
            dev: None,
        }
    }

    #[test]
    fn settled_once_no_enabled_extension_is_starting() {
        assert!(settled(&[]));
        let mut v = vec![
            view("a", State::Ready, 0, true),
            view("b", State::Starting, 0, true),
        ];
        assert!(!settled(&v));
        v[1].status.state = State::BackingOff;
        assert!(settled(&v), "a failed start counts as settled");
        v.push(view("c", State::Starting, 0, false));
        assert!(settled(&v), "a disabled package is not waited for");
    }

    #[test]
    fn the_status_line_counts_states_restarts_and_the_loop() {
        let v = vec![
            view("a", State::Ready, 0, true),
            view("b", State::BackingOff, 3, true),
            view("c", State::Ready, 1, true),
            view("d", State::Disabled, 0, false),
        ];
        let f = LoopFigures {
            passes: 1234567,
            fallbacks: 2,
        };
        assert_eq!(
            status_line(&v, &f),
            "2 ready, 1 backing-off, 1 disabled; 4 restarts; host loop: 1,234,567 passes, 2 fallbacks"
        );
        assert_eq!(
            status_line(&[], &LoopFigures::default()),
            "no extensions installed; 0 restarts; host loop: 0 passes, 0 fallbacks"
        );
        assert_eq!(
            status_line(&[view("a", State::Ready, 1, true)], &LoopFigures::default()),
            "1 ready; 1 restart; host loop: 0 passes, 0 fallbacks"
        );
    }

    #[test]
    fn the_status_line_counts_degraded_and_unresponsive_extensions() {
        let mut v = vec![
            view("a", State::Ready, 0, true),
            view("b", State::Ready, 0, true),
        ];
        let health = |condition, since_ms| crate::core::health::HealthView {
            condition,
            since_ms: Some(since_ms),
            reason: Some("missed the deadline".into()),
            failures: 1,
            unresponsive_after: 5,
            next_probe_at_ms: None,
            unresponsive_restarts: 0,
            degraded_since_ms: Some(since_ms),
            degraded_ms_total: 0,
        };
        v[1].health = Some(health(Condition::Degraded, 61_000));
        assert_eq!(
            status_line(&v, &LoopFigures::default()),
            "1 ready, 1 degraded; in trouble since 1970-01-01 00:01:01 UTC; 0 restarts; host loop: 0 passes, 0 fallbacks"
        );
        // Unresponsive and crash-looping count too, and the earliest trouble gives the time.
        v[0].health = Some(health(Condition::Unresponsive, 1_000));
        let mut looping = view("c", State::CrashLooping, 9, true);
        looping.status.failing_since_ms = Some(30_000);
        v.push(looping);
        assert_eq!(
            status_line(&v, &LoopFigures::default()),
            "1 crash-looping, 1 unresponsive, 1 degraded; in trouble since 1970-01-01 00:00:01 UTC; 9 restarts; host loop: 0 passes, 0 fallbacks"
        );
    }

    #[test]
    fn a_loop_that_stops_passing_is_alive_until_half_the_watchdog_then_not() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Some(Duration::from_secs(30)), t0);
        assert!(l.observe(1, t0));
        assert!(l.observe(2, t0 + Duration::from_secs(10)));
        // No pass since t0 + 10 s: alive until 15 s later, then not.
        assert!(l.observe(2, t0 + Duration::from_secs(25)));
        assert!(!l.observe(2, t0 + Duration::from_millis(25_001)));
        // A pass again: alive again.
        assert!(l.observe(3, t0 + Duration::from_secs(40)));
    }

    #[test]
    fn a_short_watchdog_still_allows_three_seconds_between_passes() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Some(Duration::from_secs(2)), t0);
        assert!(l.observe(7, t0));
        assert!(l.observe(7, t0 + Duration::from_secs(3)));
        assert!(!l.observe(7, t0 + Duration::from_millis(3_001)));
    }
}
