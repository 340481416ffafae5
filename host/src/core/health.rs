//! Whether the host loop makes an extension's in-transaction calls: healthy, degraded or
//! unresponsive.
//!
//! An extension that misses an in-transaction deadline or answers one with an error is
//! *degraded*: the host loop stops making its in-transaction calls (its events, timers, waits
//! and emissions wait, durable, where they are), so a hung extension costs a pass at most one
//! deadline. It is probed off the writer by making the call it failed again, with the same
//! deadline, after 1 s, 2 s, 4 s, … (capped at 30 s); any answer restores it. After
//! `unresponsive_after` consecutive failures (misses, error answers, unanswered probes) with no
//! in-transaction answer between them it is *unresponsive* and the host restarts it; the new
//! run starts degraded and is probed at once, so a process that hangs again costs the writer
//! nothing.
//!
//! Everything here is a pure function of recorded facts and an injected `now` (Unix ms), so
//! the rules are tested without processes; the host loop (`host_loop/mod.rs`) records the
//! facts and acts on what [`tend`] decides for a pass.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The first probe comes this long after the failure that degraded the extension.
pub const PROBE_FIRST_MS: i64 = 1_000;
/// Probes back off by doubling up to this interval.
pub const PROBE_MAX_MS: i64 = 30_000;
/// Consecutive failures that make an extension unresponsive, unless the daemon is told
/// otherwise (`CONDUIT_UNRESPONSIVE_AFTER`).
pub const DEFAULT_UNRESPONSIVE_AFTER: u32 = 5;
/// The range `CONDUIT_UNRESPONSIVE_AFTER` accepts.
pub const UNRESPONSIVE_AFTER_RANGE: std::ops::RangeInclusive<u32> = 1..=100;

/// The environment variable that sets the unresponsive threshold of a daemon.
pub const UNRESPONSIVE_AFTER_ENV: &str = "CONDUIT_UNRESPONSIVE_AFTER";

/// Read the unresponsive threshold from its environment variable's value.
pub fn parse_unresponsive_after(value: Option<&str>) -> Result<u32, String> {
    let Some(v) = value else {
        return Ok(DEFAULT_UNRESPONSIVE_AFTER);
    };
    match v.trim().parse::<u32>() {
        Ok(n) if UNRESPONSIVE_AFTER_RANGE.contains(&n) => Ok(n),
        _ => Err(format!(
            "{UNRESPONSIVE_AFTER_ENV}={v:?} is not a whole number from {} to {}; unset it for the default ({DEFAULT_UNRESPONSIVE_AFTER})",
            UNRESPONSIVE_AFTER_RANGE.start(),
            UNRESPONSIVE_AFTER_RANGE.end()
        )),
    }
}

/// How an extension's in-transaction calls stand, as `ext status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Condition {
    Healthy,
    Degraded,
    Unresponsive,
}

impl Condition {
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::Healthy => "healthy",
            Condition::Degraded => "degraded",
            Condition::Unresponsive => "unresponsive",
        }
    }
}

/// What the status shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthView {
    pub condition: Condition,
    /// Since when (Unix ms) it has been in trouble: the first failure of this spell, kept
    /// across the restarts the host makes of it for being unresponsive (a new run after one
    /// is still the same spell). Absent when healthy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Consecutive failures since its last in-transaction answer.
    pub failures: u32,
    pub unresponsive_after: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_probe_at_ms: Option<i64>,
    /// Restarts the host made because the extension was unresponsive.
    pub unresponsive_restarts: u32,
    /// Since when (Unix ms) it has been degraded (unresponsive included); absent when healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded_since_ms: Option<i64>,
    /// Time it was degraded in earlier, ended spells (the current one counts from
    /// `degraded_since_ms`), since the daemon started.
    #[serde(default)]
    pub degraded_ms_total: i64,
}

impl HealthView {
    /// All the time it has been degraded, the current spell up to `now` included.
    pub fn degraded_ms(&self, now: i64) -> i64 {
        self.degraded_ms_total
            + self
                .degraded_since_ms
                .map_or(0, |since| now.saturating_sub(since).max(0))
    }
}

/// The call a probe makes again: the one that failed.
#[derive(Clone, Debug)]
pub struct ProbeCall {
    pub method: String,
    pub params: Box<RawValue>,
}

/// What the host loop should do for an extension now.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// Make the probe call off the writer, then report with [`Health::probed`].
    Probe,
    /// Restart the extension (it is unresponsive).
    Restart,
}

/// The facts recorded about one extension.
#[derive(Clone, Debug, Default)]
pub struct Health {
    /// The run (pid) the facts are about; a new run starts afresh.
    pid: Option<u32>,
    degraded_since_ms: Option<i64>,
    reason: Option<String>,
    failures: u32,
    next_probe_at_ms: Option<i64>,
    probing: bool,
    unresponsive_since_ms: Option<i64>,
    restart_asked: bool,
    unresponsive_restarts: u32,
    probe_call: Option<ProbeCall>,
    /// The length of the degraded spells that have ended.
    degraded_ms_total: i64,
    /// The first failure since its last in-transaction answer (or a run that started
    /// healthy): when it went wrong, whatever restarts the host made since.
    troubled_since_ms: Option<i64>,
}

/// The probe interval after `failures` consecutive failures.
pub fn probe_interval_ms(failures: u32) -> i64 {
    let doublings = failures.saturating_sub(1).min(20);
    (PROBE_FIRST_MS << doublings).min(PROBE_MAX_MS)
}

impl Health {
    /// Whether its in-transaction calls are made.
    pub fn callable(&self) -> bool {
        self.degraded_since_ms.is_none()
    }

    pub fn condition(&self) -> Condition {
        if self.unresponsive_since_ms.is_some() {
            Condition::Unresponsive
        } else if self.degraded_since_ms.is_some() {
            Condition::Degraded
        } else {
            Condition::Healthy
        }
    }

    /// End a degraded spell at `now`, adding it to the total.
    fn end_degraded(&mut self, now: i64) {
        if let Some(since) = self.degraded_since_ms.take() {
            self.degraded_ms_total += now.saturating_sub(since).max(0);
        }
    }

    /// The call a probe makes.
    pub fn probe_call(&self) -> Option<&ProbeCall> {
        self.probe_call.as_ref()
    }

    /// Tell it which run is current. A new run after a restart for unresponsiveness starts
    /// degraded and is probed at once; any other new run starts healthy.
    pub fn observe_run(&mut self, pid: Option<u32>, now: i64) {
        if pid.is_none() || pid == self.pid {
            return;
        }
        self.pid = pid;
        self.failures = 0;
        self.probing = false;
        self.unresponsive_since_ms = None;
        self.end_degraded(now);
        if std::mem::take(&mut self.restart_asked) && self.probe_call.is_some() {
            // The same spell goes on: `troubled_since_ms` is kept.
            self.degraded_since_ms = Some(now);
            self.reason = Some(
                "restarted after being unresponsive; probed before its in-transaction calls resume"
                    .into(),
            );
            self.next_probe_at_ms = Some(now);
        } else {
            self.reason = None;
            self.next_probe_at_ms = None;
            self.troubled_since_ms = None;
        }
    }

    /// An in-transaction call was answered at `now` (a malformed answer is an answer too).
    pub fn answered(&mut self, now: i64) {
        self.failures = 0;
        self.troubled_since_ms = None;
        self.end_degraded(now);
        self.reason = None;
        self.next_probe_at_ms = None;
        self.unresponsive_since_ms = None;
    }

    fn failed(&mut self, threshold: u32, now: i64, why: String) {
        self.failures = self.failures.saturating_add(1);
        self.degraded_since_ms.get_or_insert(now);
        self.troubled_since_ms.get_or_insert(now);
        self.reason = Some(why);
        self.next_probe_at_ms = Some(now + probe_interval_ms(self.failures));
        if self.failures >= threshold {
            self.unresponsive_since_ms.get_or_insert(now);
        }
    }

    /// An in-transaction call missed its deadline or was answered with an error.
    pub fn missed(&mut self, threshold: u32, now: i64, why: String, call: ProbeCall) {
        self.probe_call = Some(call);
        self.failed(threshold, now, why);
    }

    /// What to do now; marks the probe or the restart as started.
    pub fn next_action(&mut self, now: i64) -> Action {
        if self.unresponsive_since_ms.is_some() {
            if self.restart_asked {
                return Action::Nothing;
            }
            self.restart_asked = true;
            self.unresponsive_restarts += 1;
            return Action::Restart;
        }
        match (self.degraded_since_ms, self.next_probe_at_ms) {
            (Some(_), Some(at)) if !self.probing && at <= now => {
                if self.probe_call.is_none() {
                    // Nothing to probe with: let the next in-transaction call decide.
                    self.answered(now);
                    return Action::Nothing;
                }
                self.probing = true;
                Action::Probe
            }
            _ => Action::Nothing,
        }
    }

    /// A probe of run `pid` ended: `Ok` if it was answered within its deadline (whatever the
    /// answer), `Err(why)` if not. A probe of an earlier run is ignored. Whether it restored
    /// the extension.
    pub fn probed(
        &mut self,
        threshold: u32,
        pid: Option<u32>,
        now: i64,
        res: Result<(), String>,
    ) -> bool {
        if pid != self.pid || !self.probing {
            return false;
        }
        self.probing = false;
        match res {
            // Restored, but the failures stay counted until an in-transaction call is
            // answered: an extension that answers probes yet misses every real call still
            // becomes unresponsive, and its probes keep backing off.
            Ok(()) => {
                self.end_degraded(now);
                self.reason = None;
                self.next_probe_at_ms = None;
                true
            }
            Err(why) => {
                self.failed(threshold, now, format!("probe: {why}"));
                false
            }
        }
    }

    pub fn view(&self, threshold: u32) -> HealthView {
        HealthView {
            condition: self.condition(),
            since_ms: match self.condition() {
                Condition::Healthy => None,
                _ => self
                    .troubled_since_ms
                    .or(self.unresponsive_since_ms)
                    .or(self.degraded_since_ms),
            },
            reason: self.reason.clone(),
            failures: self.failures,
            unresponsive_after: threshold,
            next_probe_at_ms: if self.probing {
                None
            } else {
                self.degraded_since_ms.and(self.next_probe_at_ms)
            },
            unresponsive_restarts: self.unresponsive_restarts,
            degraded_since_ms: self.degraded_since_ms,
            degraded_ms_total: self.degraded_ms_total,
        }
    }
}

/// What a pass knows of one live extension's run, for [`tend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunFacts<'a> {
    pub name: &'a str,
    pub pid: Option<u32>,
    /// Whether it is ready (its handshake done): only a ready run is probed or restarted.
    pub ready: bool,
}

/// A probe to make off the writer: `call` again to the run `pid` of `name`.
#[derive(Clone, Debug)]
pub struct Probe {
    pub name: String,
    pub pid: Option<u32>,
    pub call: ProbeCall,
}

/// What a pass does about its extensions' health, decided by [`tend`].
#[derive(Debug, Default)]
pub struct Tending {
    /// The extensions whose in-transaction calls this pass does not make (degraded).
    pub skip: HashSet<String>,
    /// The probes to start, in the order of the runs given.
    pub probes: Vec<Probe>,
    /// The unresponsive extensions to restart, with how they stand (for the log).
    pub restarts: Vec<(String, HealthView)>,
}

/// Bring the recorded health of the live extensions up to date at `now` and decide what the
/// pass does: forget extensions no longer live, note new runs, start due probes, restart the
/// unresponsive, and skip the degraded.
pub fn tend(
    all: &mut HashMap<String, Health>,
    runs: &[RunFacts<'_>],
    threshold: u32,
    now: i64,
) -> Tending {
    all.retain(|name, _| runs.iter().any(|r| r.name == name));
    let mut t = Tending::default();
    for run in runs {
        let h = all.entry(run.name.to_owned()).or_default();
        h.observe_run(run.pid, now);
        if run.ready {
            match h.next_action(now) {
                Action::Probe => {
                    if let Some(call) = h.probe_call().cloned() {
                        t.probes.push(Probe {
                            name: run.name.to_owned(),
                            pid: run.pid,
                            call,
                        });
                    }
                }
                Action::Restart => t.restarts.push((run.name.to_owned(), h.view(threshold))),
                Action::Nothing => {}
            }
        }
        if !h.callable() {
            t.skip.insert(run.name.to_owned());
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> ProbeCall {
        ProbeCall {
            method: "work_kind.trigger".into(),
            params: serde_json::value::to_raw_value(&serde_json::json!({})).unwrap(),
        }
    }

    fn run(name: &str, pid: u32, ready: bool) -> RunFacts<'_> {
        RunFacts {
            name,
            pid: Some(pid),
            ready,
        }
    }

    #[test]
    fn a_pass_skips_the_degraded_probes_the_due_and_restarts_the_unresponsive() {
        let mut all = HashMap::new();
        let runs = [run("a", 1, true), run("b", 2, true), run("c", 3, true)];
        let t = tend(&mut all, &runs, 2, 0);
        assert!(t.skip.is_empty() && t.probes.is_empty() && t.restarts.is_empty());
        all.get_mut("b")
            .unwrap()
            .missed(2, 0, "late".into(), call());
        all.get_mut("c")
            .unwrap()
            .missed(2, 0, "late".into(), call());
        all.get_mut("c")
            .unwrap()
            .missed(2, 0, "late".into(), call());
        // Before b's probe is due: both skipped, c restarted once.
        let t = tend(&mut all, &runs, 2, 500);
        let mut skip: Vec<&str> = t.skip.iter().map(String::as_str).collect();
        skip.sort_unstable();
        assert_eq!(skip, ["b", "c"]);
        assert!(t.probes.is_empty());
        assert_eq!(t.restarts.len(), 1);
        assert_eq!(t.restarts[0].0, "c");
        assert_eq!(t.restarts[0].1.condition, Condition::Unresponsive);
        // b's probe is due, and made once; c's restart is asked once.
        let t = tend(&mut all, &runs, 2, 1_000);
        assert_eq!(t.probes.len(), 1);
        assert_eq!((t.probes[0].name.as_str(), t.probes[0].pid), ("b", Some(2)));
        assert!(t.restarts.is_empty());
        let t = tend(&mut all, &runs, 2, 1_100);
        assert!(t.probes.is_empty());
        // c's new run is probed at once.
        let runs = [run("a", 1, true), run("b", 2, true), run("c", 4, true)];
        let t = tend(&mut all, &runs, 2, 2_000);
        assert_eq!(t.probes.len(), 1);
        assert_eq!(t.probes[0].name, "c");
        assert!(t.skip.contains("c"));
    }

    #[test]
    fn a_run_not_ready_is_neither_probed_nor_restarted_and_the_gone_are_forgotten() {
        let mut all = HashMap::new();
        tend(&mut all, &[run("a", 1, true), run("b", 2, true)], 1, 0);
        all.get_mut("a")
            .unwrap()
            .missed(1, 0, "late".into(), call());
        let t = tend(&mut all, &[run("a", 1, false)], 1, 5_000);
        assert!(t.probes.is_empty() && t.restarts.is_empty());
        assert!(t.skip.contains("a"));
        assert_eq!(all.keys().collect::<Vec<_>>(), ["a"]);
    }

    fn running(pid: u32) -> Health {
        let mut h = Health::default();
        h.observe_run(Some(pid), 0);
        h
    }

    #[test]
    fn a_miss_degrades_and_the_probe_backs_off_until_it_answers() {
        let mut h = running(7);
        assert!(h.callable());
        h.missed(5, 1_000, "no answer within 250ms".into(), call());
        assert!(!h.callable());
        assert_eq!(h.condition(), Condition::Degraded);
        assert_eq!(h.view(5).since_ms, Some(1_000));
        assert_eq!(h.next_action(1_999), Action::Nothing);
        assert_eq!(h.next_action(2_000), Action::Probe);
        // One probe at a time.
        assert_eq!(h.next_action(2_500), Action::Nothing);
        h.probed(5, Some(7), 2_250, Err("no answer".into()));
        assert_eq!(h.view(5).failures, 2);
        assert_eq!(h.view(5).next_probe_at_ms, Some(4_250));
        assert_eq!(h.next_action(4_249), Action::Nothing);
        assert_eq!(h.next_action(4_250), Action::Probe);
        h.probed(5, Some(7), 4_300, Ok(()));
        assert!(h.callable());
        assert_eq!(h.condition(), Condition::Healthy);
        // The failures stay counted until a real call is answered.
        assert_eq!(h.view(5).failures, 2);
        h.answered(4_400);
        assert_eq!(h.view(5).failures, 0);
    }

    #[test]
    fn degraded_time_adds_up_its_spells() {
        let mut h = running(7);
        assert_eq!(h.view(5).degraded_ms(10_000), 0);
        h.missed(5, 1_000, "late".into(), call());
        // The current spell counts up to now.
        assert_eq!(h.view(5).degraded_since_ms, Some(1_000));
        assert_eq!(h.view(5).degraded_ms(1_500), 500);
        // A second miss does not start a second spell.
        h.missed(5, 1_200, "late".into(), call());
        assert_eq!(h.next_action(3_200), Action::Probe);
        h.probed(5, Some(7), 4_000, Ok(()));
        assert_eq!(h.view(5).degraded_since_ms, None);
        assert_eq!(h.view(5).degraded_ms(9_000), 3_000);
        h.missed(5, 10_000, "late".into(), call());
        h.answered(10_250);
        assert_eq!(h.view(5).degraded_ms(20_000), 3_250);
        // A new run ends a spell too.
        h.missed(5, 30_000, "late".into(), call());
        h.observe_run(Some(8), 30_100);
        assert_eq!(h.view(5).degraded_ms(40_000), 3_350);
    }

    #[test]
    fn the_probe_interval_doubles_to_its_cap() {
        let got: Vec<i64> = (1..=7).map(probe_interval_ms).collect();
        assert_eq!(got, [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]);
        assert_eq!(probe_interval_ms(u32::MAX), PROBE_MAX_MS);
    }

    #[test]
    fn the_threshold_th_failure_makes_it_unresponsive_and_asks_one_restart() {
        let mut h = running(7);
        h.missed(3, 0, "late".into(), call());
        assert_eq!(h.next_action(1_000), Action::Probe);
        h.probed(3, Some(7), 1_250, Err("late".into()));
        assert_eq!(h.condition(), Condition::Degraded);
        assert_eq!(h.next_action(3_250), Action::Probe);
        h.probed(3, Some(7), 3_500, Err("late".into()));
        assert_eq!(h.condition(), Condition::Unresponsive);
        // Since the first failure of the spell, not since it crossed the threshold.
        assert_eq!(h.view(3).since_ms, Some(0));
        assert_eq!(h.next_action(3_500), Action::Restart);
        assert_eq!(h.next_action(9_000), Action::Nothing);
        // Still the old run: still unresponsive, still not callable.
        h.observe_run(Some(7), 9_000);
        assert_eq!(h.condition(), Condition::Unresponsive);
        // The new run is on probation: degraded, probed at once.
        h.observe_run(Some(8), 10_000);
        assert_eq!(h.condition(), Condition::Degraded);
        assert!(!h.callable());
        assert_eq!(h.view(3).failures, 0);
        assert_eq!(h.view(3).unresponsive_restarts, 1);
        // The host's restart does not start a new spell: it went wrong at 0, and says so.
        assert_eq!(h.view(3).since_ms, Some(0));
        assert_eq!(h.next_action(10_000), Action::Probe);
        // A late answer to a probe of the old run changes nothing.
        assert!(!h.probed(3, Some(7), 10_100, Ok(())));
        assert!(!h.callable());
        assert!(h.probed(3, Some(8), 10_200, Ok(())));
        assert!(h.callable());
        assert_eq!(h.view(3).since_ms, None);
        // Failing again before any real answer: the spell that began at 0 goes on.
        h.missed(3, 11_000, "late".into(), call());
        assert_eq!(h.view(3).since_ms, Some(0));
        h.answered(11_500);
        h.missed(3, 12_000, "late".into(), call());
        assert_eq!(h.view(3).since_ms, Some(12_000));
    }

    #[test]
    fn a_threshold_of_one_makes_the_first_miss_unresponsive() {
        let mut h = running(7);
        h.missed(1, 0, "late".into(), call());
        assert_eq!(h.condition(), Condition::Unresponsive);
        assert_eq!(h.next_action(0), Action::Restart);
    }

    #[test]
    fn a_restart_for_another_reason_starts_healthy() {
        let mut h = running(7);
        h.missed(5, 0, "late".into(), call());
        h.observe_run(None, 100); // backing off: nothing to say about it
        assert!(!h.callable());
        h.observe_run(Some(9), 200);
        assert!(h.callable());
        assert_eq!(h.condition(), Condition::Healthy);
        assert_eq!(h.view(5).since_ms, None);
        h.missed(5, 300, "late".into(), call());
        assert_eq!(h.view(5).since_ms, Some(300));
    }

    #[test]
    fn an_answer_restores_at_once() {
        let mut h = running(7);
        h.missed(5, 0, "late".into(), call());
        h.missed(5, 0, "late".into(), call());
        h.answered(10);
        assert!(h.callable());
        assert_eq!(h.view(5).failures, 0);
        assert_eq!(h.view(5).next_probe_at_ms, None);
    }

    #[test]
    fn the_threshold_is_read_at_its_edges() {
        assert_eq!(
            parse_unresponsive_after(None),
            Ok(DEFAULT_UNRESPONSIVE_AFTER)
        );
        assert_eq!(parse_unresponsive_after(Some("1")), Ok(1));
        assert_eq!(parse_unresponsive_after(Some("100")), Ok(100));
        for bad in ["0", "101", "-1", "2.5", "", "five"] {
            let err = parse_unresponsive_after(Some(bad)).unwrap_err();
            assert!(
                err.contains("CONDUIT_UNRESPONSIVE_AFTER") && err.contains("1 to 100"),
                "{err}"
            );
        }
    }
}
