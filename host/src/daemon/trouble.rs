//! Whether an extension is in trouble, of which kind and since when, and the daemon's health
//! summed up from that: the one rule that `GET /v1/health`, `conduit service status`, the
//! service manager's `STATUS=` line, the metrics and `conduit doctor` all read, so none of them
//! can say "all is well" while another says an extension is failing.
//!
//! Pure functions of the views (the supervisor's status and the host loop's health record of
//! each extension); nothing here reads a clock except through the times the views carry.
//!
//! Invariant: an extension is counted under one trouble at most, the most serious it has
//! (the order of [`Trouble::ALL`]); a disabled package is never in trouble.

use conduit_supervisor::{ExitCause, State};
use serde::{Deserialize, Serialize};

use super::handle::ExtensionView;
use crate::core::health::Condition;

/// What is wrong with an extension, most serious first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trouble {
    /// Failing again and again (five failures in a row or more); still restarted.
    CrashLooping,
    /// A check before its start failed (files changed after install, a command not found);
    /// not retried until an operator acts.
    Refused,
    /// Its handshake found no protocol version in common; not retried.
    Incompatible,
    /// Alive but answering none of its in-transaction calls; the host restarts it.
    Unresponsive,
    /// Stopped for going over a memory or task limit, and not yet stable since.
    OverLimit,
    /// It died or failed to start and waits for its next start.
    BackingOff,
    /// It missed an in-transaction call; its calls wait until a probe answers.
    Degraded,
}

impl Trouble {
    pub const ALL: [Trouble; 7] = [
        Trouble::CrashLooping,
        Trouble::Refused,
        Trouble::Incompatible,
        Trouble::Unresponsive,
        Trouble::OverLimit,
        Trouble::BackingOff,
        Trouble::Degraded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Trouble::CrashLooping => "crash-looping",
            Trouble::Refused => "refused",
            Trouble::Incompatible => "incompatible",
            Trouble::Unresponsive => "unresponsive",
            Trouble::OverLimit => "over-limit",
            Trouble::BackingOff => "backing-off",
            Trouble::Degraded => "degraded",
        }
    }

    /// Whether it needs someone: the extension will not recover by itself (or has kept
    /// failing for a while). The others may clear on their own.
    pub fn needs_someone(self) -> bool {
        matches!(
            self,
            Trouble::CrashLooping
                | Trouble::Refused
                | Trouble::Incompatible
                | Trouble::Unresponsive
        )
    }
}

impl std::fmt::Display for Trouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One extension in trouble.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Troubled {
    pub name: String,
    pub trouble: Trouble,
    /// When it first went wrong (Unix ms): the first failure of the spell, kept across the
    /// restarts the host makes of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// Why, in the words of its status (its last error, the call that failed, the limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The trouble `v` is in, if any.
pub fn trouble(v: &ExtensionView) -> Option<Troubled> {
    if !v.enabled {
        return None;
    }
    let s = &v.status;
    let failing = |trouble| Troubled {
        name: s.name.clone(),
        trouble,
        since_ms: s
            .failing_since_ms
            .or_else(|| s.recent_exits.last().map(|e| e.at_ms)),
        reason: s.last_error.clone(),
    };
    // A retry in progress (starting, or ready but not yet stable) is still the streak it is
    // in: a crash-looping extension spends part of each round starting.
    let streak = s.failing_since_ms.is_some();
    let retrying = matches!(s.state, State::Starting | State::Ready);
    let looping = s.state == State::CrashLooping
        || (streak && retrying && s.failing_as == Some(State::CrashLooping));
    match s.state {
        _ if looping => return Some(failing(Trouble::CrashLooping)),
        State::Refused => return Some(failing(Trouble::Refused)),
        State::Incompatible => return Some(failing(Trouble::Incompatible)),
        _ => {}
    }
    if let Some(h) = &v.health
        && h.condition == Condition::Unresponsive
    {
        return Some(Troubled {
            name: s.name.clone(),
            trouble: Trouble::Unresponsive,
            since_ms: h.since_ms,
            reason: h.reason.clone(),
        });
    }
    // Its last run was stopped for a limit and no run has been stable since.
    let last = s.recent_exits.first();
    if s.failing_since_ms.is_some()
        && let Some(e) = last.filter(|e| e.cause == ExitCause::OverLimit)
    {
        return Some(Troubled {
            reason: e.reason.clone(),
            ..failing(Trouble::OverLimit)
        });
    }
    if s.state == State::BackingOff
        || (streak && s.state == State::Starting && s.failing_as == Some(State::BackingOff))
    {
        return Some(failing(Trouble::BackingOff));
    }
    if let Some(h) = &v.health
        && h.condition == Condition::Degraded
    {
        return Some(Troubled {
            name: s.name.clone(),
            trouble: Trouble::Degraded,
            since_ms: h.since_ms,
            reason: h.reason.clone(),
        });
    }
    None
}

/// The daemon's health summed up over its extensions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Installed packages, enabled or not.
    pub installed: usize,
    pub enabled: usize,
    /// Ready and in no trouble: its calls flow.
    pub ready: usize,
    /// Starting now (not in trouble yet).
    pub starting: usize,
    pub crash_looping: usize,
    pub refused: usize,
    pub incompatible: usize,
    pub unresponsive: usize,
    pub over_limit: usize,
    pub backing_off: usize,
    pub degraded: usize,
    /// When the earliest trouble now began (Unix ms); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// Every extension in trouble, the earliest first.
    pub troubled: Vec<Troubled>,
}

impl Summary {
    /// `ok` when no extension is in trouble, else `degraded`.
    pub fn status(&self) -> &'static str {
        if self.troubled.is_empty() {
            "ok"
        } else {
            "degraded"
        }
    }

    /// How many are in `t`.
    pub fn count(&self, t: Trouble) -> usize {
        match t {
            Trouble::CrashLooping => self.crash_looping,
            Trouble::Refused => self.refused,
            Trouble::Incompatible => self.incompatible,
            Trouble::Unresponsive => self.unresponsive,
            Trouble::OverLimit => self.over_limit,
            Trouble::BackingOff => self.backing_off,
            Trouble::Degraded => self.degraded,
        }
    }

    fn count_mut(&mut self, t: Trouble) -> &mut usize {
        match t {
            Trouble::CrashLooping => &mut self.crash_looping,
            Trouble::Refused => &mut self.refused,
            Trouble::Incompatible => &mut self.incompatible,
            Trouble::Unresponsive => &mut self.unresponsive,
            Trouble::OverLimit => &mut self.over_limit,
            Trouble::BackingOff => &mut self.backing_off,
            Trouble::Degraded => &mut self.degraded,
        }
    }

    /// The troubles counted, most serious first, as `1 unresponsive, 2 backing-off` (empty
    /// when none).
    pub fn trouble_counts(&self) -> String {
        Trouble::ALL
            .iter()
            .filter(|t| self.count(**t) > 0)
            .map(|t| format!("{} {t}", self.count(*t)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// One line for people, as `conduit service status` prints it: `7 of 7 extensions ready`,
    /// or `5 of 7 extensions ready; 1 crash-looping (crashy), 1 unresponsive (flaky) since
    /// 2026-12-04 17:22:10 UTC` (the earliest trouble's time).
    pub fn line(&self) -> String {
        let mut out = format!(
            "{} of {} extension{} ready",
            self.ready,
            self.enabled,
            if self.enabled == 1 { "" } else { "s" }
        );
        if !self.troubled.is_empty() {
            let each: Vec<String> = Trouble::ALL
                .iter()
                .filter(|t| self.count(**t) > 0)
                .map(|t| {
                    let names: Vec<&str> = self
                        .troubled
                        .iter()
                        .filter(|x| x.trouble == *t)
                        .map(|x| x.name.as_str())
                        .collect();
                    format!("{} {t} ({})", self.count(*t), names.join(", "))
                })
                .collect();
            out.push_str(&format!("; {}", each.join(", ")));
            if let Some(at) = self.since_ms {
                out.push_str(&format!(" since {}", utc_seconds(at)));
            }
        }
        out
    }
}

/// Sum up `views`.
pub fn summarize(views: &[ExtensionView]) -> Summary {
    let mut s = Summary {
        installed: views.len(),
        ..Summary::default()
    };
    for v in views.iter().filter(|v| v.enabled) {
        s.enabled += 1;
        match trouble(v) {
            Some(t) => {
                *s.count_mut(t.trouble) += 1;
                s.troubled.push(t);
            }
            None if v.status.state == State::Ready => s.ready += 1,
            None if v.status.state == State::Starting => s.starting += 1,
            None => {}
        }
    }
    s.troubled
        .sort_by(|a, b| (a.since_ms, &a.name).cmp(&(b.since_ms, &b.name)));
    s.since_ms = s.troubled.iter().filter_map(|t| t.since_ms).min();
    s
}

/// A moment as people read it in a status line: `2026-12-04 17:22:10 UTC`.
pub fn utc_seconds(at_ms: i64) -> String {
    let iso = conduit_supervisor::log::utc_timestamp(at_ms);
    format!("{} UTC", iso[..19].replace('T', " "))
}

/// A moment and how long ago it was: `2026-12-04 17:22:10 UTC (3.2 min ago)`.
pub fn since_text(at_ms: i64, now_ms: i64) -> String {
    format!(
        "{} ({} ago)",
        utc_seconds(at_ms),
        duration_text((now_ms - at_ms).max(0) as f64 / 1000.0)
    )
}

/// Seconds as people read them: `8.0 s`, `3.2 min`, `5.1 h`, `2.0 d`.
pub fn duration_text(secs: f64) -> String {
    if secs >= 86_400.0 {
        format!("{:.1} d", secs / 86_400.0)
    } else if secs >= 3600.0 {
        format!("{:.1} h", secs / 3600.0)
    } else if secs >= 60.0 {
        format!("{:.1} min", secs / 60.0)
    } else {
        format!("{secs:.1} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::health::HealthView;
    use conduit_supervisor::{ExitRecord, Status};

    fn view(name: &str, state: State) -> ExtensionView {
        ExtensionView {
            status: Status::new(name, "1.0.0", state, None),
            enabled: true,
            installed_at_ms: 0,
            description: None,
            health: None,
            dev: None,
        }
    }

    fn health(condition: Condition, since: i64) -> HealthView {
        HealthView {
            condition,
            since_ms: Some(since),
            reason: Some("work_kind.trigger: no answer within 250ms".into()),
            failures: 5,
            unresponsive_after: 5,
            next_probe_at_ms: None,
            unresponsive_restarts: 4,
            degraded_since_ms: Some(since + 10_000),
            degraded_ms_total: 0,
        }
    }

    fn exit(cause: ExitCause, at: i64) -> ExitRecord {
        let mut e: ExitRecord = serde_json::from_value(serde_json::json!({
            "at_ms": at, "pid": 7, "cause": cause, "summary": "x",
        }))
        .unwrap();
        e.reason = Some("over its 64 MiB memory limit (resident 80 MiB)".into());
        e
    }

    #[test]
    fn a_ready_but_unresponsive_extension_is_not_counted_ready() {
        let mut flaky = view("flaky", State::Ready);
        flaky.health = Some(health(Condition::Unresponsive, 1_000));
        let mut views: Vec<ExtensionView> = (0..6)
            .map(|i| view(&format!("ok{i}"), State::Ready))
            .collect();
        views.push(flaky);
        let s = summarize(&views);
        assert_eq!((s.installed, s.enabled, s.ready), (7, 7, 6));
        assert_eq!(s.unresponsive, 1);
        assert_eq!(s.status(), "degraded");
        // Since the first failure, not since the current run.
        assert_eq!(s.since_ms, Some(1_000));
        assert_eq!(
            s.line(),
            "6 of 7 extensions ready; 1 unresponsive (flaky) since 1970-01-01 00:00:01 UTC"
        );
    }

    #[test]
    fn each_extension_counts_under_its_most_serious_trouble() {
        let mut looping = view("looping", State::CrashLooping);
        looping.status.failing_since_ms = Some(5_000);
        looping.status.last_error = Some("exit code 3".into());
        let mut hog = view("hog", State::BackingOff);
        hog.status.failing_since_ms = Some(2_000);
        hog.status.recent_exits = vec![exit(ExitCause::OverLimit, 2_000)];
        // Ready again after a limit stop, but not stable yet: still over-limit.
        let mut back = view("back", State::Ready);
        back.status.failing_since_ms = Some(3_000);
        back.status.recent_exits = vec![exit(ExitCause::OverLimit, 3_000)];
        // Stable since (the streak cleared): fine.
        let mut stable = view("stable", State::Ready);
        stable.status.recent_exits = vec![exit(ExitCause::OverLimit, 3_000)];
        let mut slow = view("slow", State::Ready);
        slow.health = Some(health(Condition::Degraded, 4_000));
        let mut off = view("off", State::Disabled);
        off.enabled = false;
        let crashed = {
            let mut v = view("crashed", State::BackingOff);
            v.status.failing_since_ms = Some(6_000);
            v
        };
        // Starting again within a crash loop, and ready again but not yet stable after one:
        // still crash-looping. Starting again after one crash: backing off.
        let mut retrying = view("retrying", State::Starting);
        retrying.status.failing_since_ms = Some(7_000);
        retrying.status.failing_as = Some(State::CrashLooping);
        let mut unsteady = view("unsteady", State::Ready);
        unsteady.status.failing_since_ms = Some(8_000);
        unsteady.status.failing_as = Some(State::CrashLooping);
        let mut again = view("again", State::Starting);
        again.status.failing_since_ms = Some(9_000);
        again.status.failing_as = Some(State::BackingOff);
        // Ready again after one crash: recovered.
        let mut recovered = view("recovered", State::Ready);
        recovered.status.failing_since_ms = Some(9_500);
        recovered.status.failing_as = Some(State::BackingOff);
        let s = summarize(&[
            looping, hog, back, stable, slow, off, crashed, retrying, unsteady, again, recovered,
        ]);
        let counts = (s.crash_looping, s.over_limit, s.degraded, s.backing_off);
        assert_eq!(counts, (3, 2, 1, 2));
        assert_eq!((s.installed, s.enabled, s.ready), (11, 10, 2));
        let order: Vec<&str> = s.troubled.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            order,
            [
                "hog", "back", "slow", "looping", "crashed", "retrying", "unsteady", "again"
            ]
        );
        assert_eq!(
            s.troubled[0].reason.as_deref(),
            Some("over its 64 MiB memory limit (resident 80 MiB)")
        );
        assert_eq!(
            s.trouble_counts(),
            "3 crash-looping, 2 over-limit, 2 backing-off, 1 degraded"
        );
        assert_eq!(s.since_ms, Some(2_000));
    }

    #[test]
    fn all_well_is_ok() {
        let s = summarize(&[view("a", State::Ready), view("b", State::Starting)]);
        assert_eq!(s.status(), "ok");
        assert_eq!((s.ready, s.starting), (1, 1));
        assert_eq!(s.line(), "1 of 2 extensions ready");
        assert_eq!(
            since_text(90_000, 90_000 + 192_000),
            "1970-01-01 00:01:30 UTC (3.2 min ago)"
        );
    }
}
