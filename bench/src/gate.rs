//! The in-transaction budget gate: times the four in-transaction calls, round trip from the
//! host's call adapter ([`Extension::call_raw`]) to an extension process and back, and judges
//! them against a latency budget.
//!
//! ```text
//!   warm-up: 20 calls of each method (answers checked, times thrown away)
//!   round 1: 300 × trigger │ 300 × recurrence │ 300 × filter │ 300 × commit   → median, p95 each
//!   round 2: …                                                             (p99, max reported)
//! ```
//!
//! - A wrong answer, or a call that fails (an error, the 250 ms deadline), fails the gate at
//!   once: in the daemon it would have meant the host's fallback, not a slow call.
//! - A method whose median or p95 is over budget in [`STRIKES`] rounds running fails the gate;
//!   the gate then finishes that round and stops. One bad round is the scheduler's; three in a
//!   row are the code's.
//! - The 99th percentile and the slowest call are reported, never gated: on a shared machine
//!   they belong to the scheduler.
//!
//! Methods take turns round by round, so drift in the machine (a neighbour's build, a
//! frequency change) falls on all four alike rather than on whichever runs last.
//!
//! What is timed: [`Extension::call_raw`] with params serialized beforehand, from the call to
//! its raw answer — the framing, both pipes, the extension's parse, handler and reply, and the
//! session's bookkeeping on both sides. Planning the call (the host's `operation.emit` for a
//! commit, building the batch for a trigger) and checking its answer happen outside the timer.
//!
//! Not here: starting the extension, printing, files. The `bench-extension` binary and the
//! negative-control test share this module and do those themselves.

mod calls;

use std::time::{Duration, Instant};

use conduit_protocol::IN_TRANSACTION_DEADLINE;
use conduit_supervisor::Extension;
use hdrhistogram::Histogram;

pub use calls::{Method, NOTE_BYTES, Planned, Planner, SUBJECT, TRIGGER_INPUTS, text};

/// Rounds running over budget that fail a method.
pub const STRIKES: usize = 3;

/// The gated percentiles' limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub median: Duration,
    pub p95: Duration,
}

impl Budget {
    /// Release builds.
    pub const RELEASE: Budget = Budget {
        median: Duration::from_millis(2),
        p95: Duration::from_millis(10),
    };

    /// Debug builds, whose unoptimized serde and session code is several times slower.
    pub const DEBUG: Budget = Budget {
        median: Duration::from_millis(10),
        p95: Duration::from_millis(50),
    };

    /// The budget for the profile this crate was built in: [`Budget::DEBUG`] when debug
    /// assertions are on, else [`Budget::RELEASE`].
    pub fn for_this_build() -> Budget {
        if cfg!(debug_assertions) {
            Budget::DEBUG
        } else {
            Budget::RELEASE
        }
    }

    fn limit(self, p: Percentile) -> Duration {
        match p {
            Percentile::Median => self.median,
            Percentile::P95 => self.p95,
        }
    }
}

/// A gated percentile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Percentile {
    Median,
    P95,
}

impl Percentile {
    pub const GATED: [Percentile; 2] = [Percentile::Median, Percentile::P95];

    fn quantile(self) -> f64 {
        match self {
            Percentile::Median => 0.5,
            Percentile::P95 => 0.95,
        }
    }
}

impl std::fmt::Display for Percentile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Percentile::Median => "median",
            Percentile::P95 => "p95",
        })
    }
}

/// How the gate runs.
#[derive(Clone, Debug)]
pub struct GateConfig {
    /// Untimed calls of each method before the first round.
    pub warmup: usize,
    /// Timed calls of each method per round.
    pub calls_per_round: usize,
    /// Rounds at most; the gate stops early once a method has failed.
    pub rounds: usize,
    pub budget: Budget,
    /// Each call's deadline, as the host gives it.
    pub deadline: Duration,
    /// The methods to time, in turn.
    pub methods: Vec<Method>,
    /// Prefix of the commit ids, unique to the run.
    pub run_tag: String,
}

impl Default for GateConfig {
    /// 20 warm-up calls, then 5 rounds of 300 calls of each of the four methods, this build's
    /// budget and the protocol's in-transaction deadline.
    fn default() -> Self {
        GateConfig {
            warmup: 20,
            calls_per_round: 300,
            rounds: 5,
            budget: Budget::for_this_build(),
            deadline: IN_TRANSACTION_DEADLINE,
            methods: Method::ALL.to_vec(),
            run_tag: format!("gate-{}", std::process::id()),
        }
    }
}

impl GateConfig {
    /// Refuse a configuration under which the gate could never fail on time.
    pub fn validate(&self) -> Result<(), String> {
        if self.rounds < STRIKES {
            return Err(format!(
                "{} rounds: the gate needs at least {STRIKES}, since a method fails only when \
                 it is over budget in {STRIKES} rounds running",
                self.rounds
            ));
        }
        if self.calls_per_round == 0 {
            return Err("a round needs at least one call".into());
        }
        if self.methods.is_empty() {
            return Err("no methods to time".into());
        }
        Ok(())
    }
}

/// A gated percentile that was over its limit in a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Over {
    pub percentile: Percentile,
    pub value: Duration,
    pub budget: Duration,
}

/// One method's figures in one round (or over all of them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stats {
    /// 1-based; 0 for figures over every round.
    pub round: usize,
    pub calls: u64,
    pub median: Duration,
    pub p95: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// The gated percentiles over budget (always empty over every round: only rounds count).
    pub over: Vec<Over>,
}

impl Stats {
    fn of(h: &Histogram<u64>, round: usize, budget: Option<Budget>) -> Stats {
        let at = |q: f64| Duration::from_nanos(h.value_at_quantile(q));
        let mut s = Stats {
            round,
            calls: h.len(),
            median: at(0.5),
            p95: at(0.95),
            p99: at(0.99),
            max: Duration::from_nanos(h.max()),
            over: Vec::new(),
        };
        if let Some(budget) = budget {
            s.over = Percentile::GATED
                .into_iter()
                .map(|p| Over {
                    percentile: p,
                    value: at(p.quantile()),
                    budget: budget.limit(p),
                })
                .filter(|o| o.value > o.budget)
                .collect();
        }
        s
    }
}

/// One method over the whole run.
#[derive(Clone, Debug)]
pub struct MethodReport {
    pub method: Method,
    /// Every completed round, in order.
    pub rounds: Vec<Stats>,
    /// All timed calls of every round together.
    pub total: Stats,
}

/// A method over budget in [`STRIKES`] rounds running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub method: Method,
    /// The rounds, each with what was over.
    pub rounds: Vec<Stats>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let numbers: Vec<String> = self.rounds.iter().map(|r| r.round.to_string()).collect();
        write!(
            f,
            "`{}` was over budget in {} rounds running (rounds {}):",
            self.method,
            self.rounds.len(),
            numbers.join(", ")
        )?;
        for (i, r) in self.rounds.iter().enumerate() {
            let over: Vec<String> = r
                .over
                .iter()
                .map(|o| {
                    format!(
                        "{} {} > {}",
                        o.percentile,
                        fmt_ms(o.value),
                        fmt_ms(o.budget)
                    )
                })
                .collect();
            let sep = if i == 0 { " " } else { "; " };
            write!(f, "{sep}round {}: {}", r.round, over.join(", "))?;
        }
        Ok(())
    }
}

/// A call that answered wrongly or failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrongAnswer {
    pub method: Method,
    /// 0 for the warm-up.
    pub round: usize,
    /// 1-based, within the warm-up or the round.
    pub call: usize,
    pub detail: String,
}

impl std::fmt::Display for WrongAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let when = match self.round {
            0 => "warm-up".to_owned(),
            r => format!("round {r}"),
        };
        write!(
            f,
            "`{}` answered wrongly ({when}, call {}): {}",
            self.method, self.call, self.detail
        )
    }
}

/// How the gate ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// One entry per failed method.
    OverBudget(Vec<Failure>),
    WrongAnswer(WrongAnswer),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Passed => f.write_str("passed"),
            Outcome::OverBudget(fails) => {
                for (i, fail) in fails.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{fail}")?;
                }
                Ok(())
            }
            Outcome::WrongAnswer(w) => write!(f, "{w}"),
        }
    }
}

/// What the gate found.
#[derive(Clone, Debug)]
pub struct GateReport {
    pub budget: Budget,
    /// In the configured order; a method the gate never reached has no rounds.
    pub methods: Vec<MethodReport>,
    pub outcome: Outcome,
}

impl GateReport {
    pub fn passed(&self) -> bool {
        self.outcome == Outcome::Passed
    }
}

/// Tracks each method's rounds over budget, and says when one has had [`STRIKES`] running.
///
/// A pure function of the rounds it is shown, so the rule is tested without timing anything.
#[derive(Debug, Default)]
pub struct Strikes {
    running: Vec<(Method, Vec<Stats>)>,
}

impl Strikes {
    /// Record `method`'s figures for a round; returns the failure when this round makes
    /// [`STRIKES`] over budget in a row.
    pub fn record(&mut self, method: Method, round: &Stats) -> Option<Failure> {
        let i = match self.running.iter().position(|(m, _)| *m == method) {
            Some(i) => i,
            None => {
                self.running.push((method, Vec::new()));
                self.running.len() - 1
            }
        };
        let streak = &mut self.running[i].1;
        if round.over.is_empty() {
            streak.clear();
            return None;
        }
        streak.push(round.clone());
        (streak.len() >= STRIKES).then(|| Failure {
            method,
            rounds: streak[streak.len() - STRIKES..].to_vec(),
        })
    }
}

fn histogram() -> Histogram<u64> {
    // Nanoseconds, 1 ns to 1 min, 3 significant figures: 0.1% resolution at every scale.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Make one planned call, timed; the error is what the gate reports as a wrong answer.
async fn call(ext: &Extension, planned: &Planned, deadline: Duration) -> Result<Duration, String> {
    let t = Instant::now();
    let res = ext
        .call_raw(planned.method.name(), &planned.params, Some(deadline))
        .await;
    let elapsed = t.elapsed();
    let answer = res.map_err(|e| format!("the call failed: {e}"))?;
    planned.check(&answer)?;
    Ok(elapsed)
}

/// Run the gate against `ext`, which must be ready and serve the notes example's handlers.
/// `on_round` sees each method's figures as each round ends (for progress output).
pub async fn run_gate(
    ext: &Extension,
    cfg: &GateConfig,
    mut on_round: impl FnMut(Method, &Stats),
) -> GateReport {
    let mut planner = Planner::new(cfg.run_tag.clone());
    let mut totals: Vec<(Method, Histogram<u64>, Vec<Stats>)> = cfg
        .methods
        .iter()
        .map(|&m| (m, histogram(), Vec::new()))
        .collect();
    let report = |totals: Vec<(Method, Histogram<u64>, Vec<Stats>)>, outcome| GateReport {
        budget: cfg.budget,
        methods: totals
            .into_iter()
            .map(|(method, h, rounds)| MethodReport {
                method,
                total: Stats::of(&h, 0, None),
                rounds,
            })
            .collect(),
        outcome,
    };

    for &method in &cfg.methods {
        for i in 0..cfg.warmup {
            let planned = planner.plan(method);
            if let Err(detail) = call(ext, &planned, cfg.deadline).await {
                let wrong = WrongAnswer {
                    method,
                    round: 0,
                    call: i + 1,
                    detail,
                };
                return report(totals, Outcome::WrongAnswer(wrong));
            }
        }
    }

    let mut strikes = Strikes::default();
    let mut failures = Vec::new();
    for round in 1..=cfg.rounds {
        for (method, total, rounds) in &mut totals {
            let mut h = histogram();
            for i in 0..cfg.calls_per_round {
                let planned = planner.plan(*method);
                match call(ext, &planned, cfg.deadline).await {
                    Ok(t) => h.saturating_record(t.as_nanos().try_into().unwrap_or(u64::MAX)),
                    Err(detail) => {
                        let wrong = WrongAnswer {
                            method: *method,
                            round,
                            call: i + 1,
                            detail,
                        };
                        return report(totals, Outcome::WrongAnswer(wrong));
                    }
                }
            }
            let stats = Stats::of(&h, round, Some(cfg.budget));
            // Same bounds on both sides, so adding cannot fail.
            let _ = total.add(&h);
            on_round(*method, &stats);
            if let Some(f) = strikes.record(*method, &stats) {
                failures.push(f);
            }
            rounds.push(stats);
        }
        if !failures.is_empty() {
            break;
        }
    }
    let outcome = if failures.is_empty() {
        Outcome::Passed
    } else {
        Outcome::OverBudget(failures)
    };
    report(totals, outcome)
}

/// A duration in milliseconds for people: three decimals below 10 ms, one above.
pub fn fmt_ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.3} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(n: usize, median_ms: u64, p95_ms: u64) -> Stats {
        let mut h = histogram();
        // 50 calls at the median, 45 more up to the p95, 5 slow ones.
        for _ in 0..50 {
            h.record(median_ms * 1_000_000).unwrap();
        }
        for _ in 0..45 {
            h.record(p95_ms * 1_000_000).unwrap();
        }
        for _ in 0..5 {
            h.record(p95_ms * 4_000_000).unwrap();
        }
        Stats::of(&h, n, Some(Budget::RELEASE))
    }

    #[test]
    fn figures_come_from_the_histogram_and_name_what_is_over() {
        let ok = round(1, 1, 5);
        assert_eq!(ok.calls, 100);
        assert!(ok.over.is_empty());
        assert_eq!(ok.median.as_millis(), 1);
        assert_eq!(ok.p95.as_millis(), 5);
        // p99 and max are far over the p95 budget, and that alone is not a failure.
        assert_eq!(ok.max.as_millis(), 20);

        let slow = round(2, 3, 12);
        let what: Vec<Percentile> = slow.over.iter().map(|o| o.percentile).collect();
        assert_eq!(what, [Percentile::Median, Percentile::P95]);
        assert_eq!(round(3, 1, 12).over[0].percentile, Percentile::P95);
    }

    #[test]
    fn three_rounds_running_over_budget_fail_a_method() {
        let mut s = Strikes::default();
        assert_eq!(s.record(Method::Filter, &round(1, 3, 1)), None);
        assert_eq!(s.record(Method::Filter, &round(2, 3, 1)), None);
        // Another method's rounds do not count towards this one.
        assert_eq!(s.record(Method::Commit, &round(2, 3, 1)), None);
        let f = s.record(Method::Filter, &round(3, 1, 11)).unwrap();
        assert_eq!(f.method, Method::Filter);
        let numbers: Vec<usize> = f.rounds.iter().map(|r| r.round).collect();
        assert_eq!(numbers, [1, 2, 3]);
        expect_message(
            &f,
            "`dependency.filter` was over budget in 3 rounds running (rounds 1, 2, 3): \
             round 1: median 3.000 ms > 2.000 ms; round 2: median 3.000 ms > 2.000 ms; \
             round 3: p95 11.0 ms > 10.0 ms",
        );
    }

    #[test]
    fn a_round_within_budget_resets_the_count() {
        let mut s = Strikes::default();
        for (n, median) in [(1, 3), (2, 3), (3, 1), (4, 3), (5, 3)] {
            assert_eq!(s.record(Method::Trigger, &round(n, median, 1)), None, "{n}");
        }
        let f = s.record(Method::Trigger, &round(6, 3, 1)).unwrap();
        let numbers: Vec<usize> = f.rounds.iter().map(|r| r.round).collect();
        assert_eq!(numbers, [4, 5, 6]);
    }

    #[test]
    fn fewer_rounds_than_strikes_are_refused() {
        let cfg = GateConfig {
            rounds: 2,
            ..GateConfig::default()
        };
        assert!(cfg.validate().unwrap_err().contains("at least 3"));
        assert_eq!(GateConfig::default().validate(), Ok(()));
    }

    #[test]
    fn the_budget_follows_the_build() {
        let b = Budget::for_this_build();
        assert_eq!(b == Budget::DEBUG, cfg!(debug_assertions));
        assert_eq!(GateConfig::default().deadline, Duration::from_millis(250));
    }

    fn expect_message(f: &Failure, want: &str) {
        assert_eq!(f.to_string(), want);
    }
}
