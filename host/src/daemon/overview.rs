//! The overview: everything `conduit top` shows in one answer (`GET /v1/overview`), and the
//! extensions table of `conduit web`.
//!
//! One request gives the daemon's figures, the counts the views show, one page of the
//! extensions table (filtered, sorted and paged here, so a client asks for the rows it draws)
//! and, when asked, one extension's detail. Its cost does not follow the history retained:
//! the records come from [`Daemon::records`] (read again only when the registry changed), each
//! extension's figures from [`conduit_supervisor::Extension::glance`], the counts from the
//! store's indexes and counters ([`conduit_store::ViewCounts`]).
//!
//! [`select`] (filter, sort, page) is a pure function of the rows and the [`Query`], tested
//! without a daemon. The types are shared with the clients, which read the answer back into
//! them, so the shape has one home.

use std::collections::BTreeMap;

use conduit_supervisor::{Glance, State};
use serde::{Deserialize, Serialize};

use super::handle::{Daemon, ExtensionView};
use crate::core::health::{Condition, HealthView};

/// The unrouted backlog is counted up to this many events (then shown as "at least").
pub const UNROUTED_CAP: u64 = 10_000;

/// The columns the table sorts by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SortKey {
    #[default]
    Name,
    State,
    Health,
    Restarts,
    Uptime,
    InFlight,
    /// Calls in the last minute.
    Rate,
    Calls,
    Errors,
    P50,
    P99,
    Memory,
    Cpu,
}

impl SortKey {
    pub const ALL: [SortKey; 13] = [
        SortKey::Name,
        SortKey::State,
        SortKey::Health,
        SortKey::Restarts,
        SortKey::Uptime,
        SortKey::InFlight,
        SortKey::Rate,
        SortKey::Calls,
        SortKey::Errors,
        SortKey::P50,
        SortKey::P99,
        SortKey::Memory,
        SortKey::Cpu,
    ];

    /// The name in a query string (`sort=p99`).
    pub fn as_str(self) -> &'static str {
        match self {
            SortKey::Name => "name",
            SortKey::State => "state",
            SortKey::Health => "health",
            SortKey::Restarts => "restarts",
            SortKey::Uptime => "uptime",
            SortKey::InFlight => "in_flight",
            SortKey::Rate => "rate",
            SortKey::Calls => "calls",
            SortKey::Errors => "errors",
            SortKey::P50 => "p50",
            SortKey::P99 => "p99",
            SortKey::Memory => "memory",
            SortKey::Cpu => "cpu",
        }
    }

    pub fn parse(s: &str) -> Option<SortKey> {
        SortKey::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// What a client asks of the overview.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    pub sort: SortKey,
    /// Largest first.
    pub desc: bool,
    /// Rows whose name, state or health contains this text (any case); empty: every row.
    pub filter: String,
    pub offset: usize,
    /// 1 to [`conduit_protocol::rules::MAX_PAGE`] rows.
    pub limit: usize,
    /// The extension whose detail to include.
    pub detail: Option<String>,
}

/// One extension as the table shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub name: String,
    pub version: String,
    pub enabled: bool,
    /// `healthy`, `degraded` or `unresponsive` while the daemon runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Condition>,
    /// Calls in the last minute (the last six periods of the recent counts).
    pub calls_last_min: u64,
    #[serde(flatten)]
    pub glance: Glance,
}

impl Row {
    fn matches(&self, needle: &str) -> bool {
        if needle.is_empty() {
            return true;
        }
        let hay = |s: &str| s.to_ascii_lowercase().contains(needle);
        hay(&self.name)
            || hay(self.glance.state.as_str())
            || self.health.is_some_and(|h| hay(h.as_str()))
    }

    /// How long it has been ready at `now`, 0 when it is not.
    pub fn uptime_ms(&self, now: i64) -> i64 {
        match (self.glance.state, self.glance.ready_since_ms) {
            (State::Ready, Some(since)) => now.saturating_sub(since).max(0),
            _ => 0,
        }
    }
}

/// The sort position of a health (healthy first; no daemon-side health last).
fn health_rank(h: Option<Condition>) -> u8 {
    match h {
        Some(Condition::Healthy) => 0,
        Some(Condition::Degraded) => 1,
        Some(Condition::Unresponsive) => 2,
        None => 3,
    }
}

/// The sort position of a state: the states that need a look sort after `ready`.
fn state_rank(s: State) -> u8 {
    match s {
        State::Ready => 0,
        State::Starting => 1,
        State::Stopping => 2,
        State::BackingOff => 3,
        State::CrashLooping => 4,
        State::Refused => 5,
        State::Incompatible => 6,
        State::Stopped => 7,
        State::Disabled => 8,
    }
}

/// Filter, sort and page `rows`: the number that matched and the page. Ties sort by name, so a
/// page is stable from one refresh to the next.
pub fn select(mut rows: Vec<Row>, q: &Query, now: i64) -> (usize, Vec<Row>) {
    let needle = q.filter.trim().to_ascii_lowercase();
    rows.retain(|r| r.matches(&needle));
    let matched = rows.len();
    let key = |r: &Row| -> (u64, f64) {
        let g = &r.glance;
        match q.sort {
            SortKey::Name => (0, 0.0),
            SortKey::State => (u64::from(state_rank(g.state)), 0.0),
            SortKey::Health => (u64::from(health_rank(r.health)), 0.0),
            SortKey::Restarts => (u64::from(g.restarts), 0.0),
            SortKey::Uptime => (r.uptime_ms(now) as u64, 0.0),
            SortKey::InFlight => (u64::from(g.in_flight), 0.0),
            SortKey::Rate => (r.calls_last_min, 0.0),
            SortKey::Calls => (g.calls.count, 0.0),
            SortKey::Errors => (g.calls.errors, 0.0),
            SortKey::P50 => (g.calls.p50_us, 0.0),
            SortKey::P99 => (g.calls.p99_us, 0.0),
            SortKey::Memory => (g.rss_bytes.unwrap_or(0), 0.0),
            SortKey::Cpu => (0, g.cpu.unwrap_or(0.0)),
        }
    };
    rows.sort_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        let by_key = ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1));
        let by_key = if q.desc { by_key.reverse() } else { by_key };
        let by_name = a.name.cmp(&b.name);
        let by_name = if q.desc && q.sort == SortKey::Name {
            by_name.reverse()
        } else {
            by_name
        };
        by_key.then(by_name)
    });
    let page = rows.into_iter().skip(q.offset).take(q.limit).collect();
    (matched, page)
}

/// The daemon's own figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DaemonFigures {
    pub pid: u32,
    pub version: String,
    pub started_at_ms: i64,
    /// The host loop's counters (`passes`, `last_pass_us`, `in_transaction_calls`,
    /// `fallbacks`, `panics`), as `GET /v1/health` has them.
    pub host_loop: serde_json::Value,
}

/// The extensions part of an overview.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub installed: usize,
    /// Installed packages by state.
    pub by_state: BTreeMap<String, usize>,
    /// Ready but degraded or unresponsive.
    pub degraded: usize,
    /// Rows that matched the filter.
    pub matched: usize,
    pub offset: usize,
    pub sort: SortKey,
    pub desc: bool,
    /// The length of one period of each row's `calls.recent`, in milliseconds.
    pub period_ms: u64,
    pub rows: Vec<Row>,
}

/// One extension's detail: its whole view (status, health, stderr tail, recent exits).
pub type Detail = ExtensionView;

/// `GET /v1/overview`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Overview {
    pub at_ms: i64,
    pub daemon: DaemonFigures,
    pub store: conduit_store::ViewCounts,
    pub extensions: Table,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Detail>,
}

/// Calls in the last minute from a row's recent periods.
fn last_minute(recent: &[u32]) -> u64 {
    let per_min = (60_000 / conduit_supervisor::RATE_BUCKET.as_millis().max(1)) as usize;
    recent
        .iter()
        .rev()
        .take(per_min.max(1))
        .map(|n| u64::from(*n))
        .sum()
}

impl Daemon {
    /// Every installed package's row, unsorted.
    pub fn rows(&self) -> anyhow::Result<Vec<Row>> {
        let records = self.records()?;
        Ok(records
            .iter()
            .map(|rec| {
                let (glance, health) = match self.supervisor().get(&rec.name) {
                    Some(ext) if rec.enabled => {
                        let h: HealthView = self.core().health_view(&rec.name);
                        (ext.glance(), Some(h.condition))
                    }
                    _ => {
                        let mut v = ExtensionView::offline(rec, true);
                        if let Some(last) = self.supervisor().last_status(&rec.name) {
                            v.status.carry_history(&last);
                        }
                        (Glance::of(&v.status), None)
                    }
                };
                Row {
                    name: rec.name.clone(),
                    version: rec.version.clone(),
                    enabled: rec.enabled,
                    health,
                    calls_last_min: last_minute(&glance.calls.recent),
                    glance,
                }
            })
            .collect())
    }

    /// The overview, but for the store's counts (which the caller reads off the runtime).
    pub fn overview(
        &self,
        q: &Query,
        store: conduit_store::ViewCounts,
    ) -> anyhow::Result<Overview> {
        let now = conduit_supervisor::now_ms();
        let rows = self.rows()?;
        let mut by_state = BTreeMap::new();
        let mut degraded = 0;
        for r in &rows {
            *by_state
                .entry(r.glance.state.as_str().to_owned())
                .or_insert(0) += 1;
            if matches!(
                r.health,
                Some(Condition::Degraded | Condition::Unresponsive)
            ) {
                degraded += 1;
            }
        }
        let installed = rows.len();
        let (matched, page) = select(rows, q, now);
        let detail = match &q.detail {
            Some(name) => self.extension(name)?,
            None => None,
        };
        Ok(Overview {
            at_ms: now,
            daemon: DaemonFigures {
                pid: std::process::id(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                started_at_ms: self.started_at_ms(),
                host_loop: self.core().stats.snapshot(),
            },
            store,
            extensions: Table {
                installed,
                by_state,
                degraded,
                matched,
                offset: q.offset,
                sort: q.sort,
                desc: q.desc,
                period_ms: conduit_supervisor::RATE_BUCKET.as_millis() as u64,
                rows: page,
            },
            detail,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conduit_supervisor::Status;

    /// A status as the table shows a package the daemon does not run, for tests.
    fn row(name: &str, state: State, f: impl FnOnce(&mut Row)) -> Row {
        let status = Status::new(name, "1.0.0", state, None);
        let mut r = Row {
            name: name.to_owned(),
            version: "1.0.0".to_owned(),
            enabled: true,
            health: Some(Condition::Healthy),
            calls_last_min: 0,
            glance: Glance::of(&status),
        };
        f(&mut r);
        r
    }

    fn names(rows: &[Row]) -> Vec<&str> {
        rows.iter().map(|r| r.name.as_str()).collect()
    }

    fn q(sort: SortKey, desc: bool) -> Query {
        Query {
            sort,
            desc,
            limit: 50,
            ..Query::default()
        }
    }

    fn sample() -> Vec<Row> {
        vec![
            row("echo", State::Ready, |r| {
                r.glance.calls.p99_us = 300;
                r.glance.restarts = 1;
            }),
            row("flaky", State::CrashLooping, |r| {
                r.glance.restarts = 9;
                r.health = Some(Condition::Unresponsive);
            }),
            row("notes", State::Ready, |r| {
                r.glance.calls.p99_us = 900;
                r.glance.cpu = Some(0.25);
            }),
            row("zeta", State::Disabled, |r| r.health = None),
        ]
    }

    #[test]
    fn rows_sort_by_any_column_either_way_with_ties_by_name() {
        let (_, p) = select(sample(), &q(SortKey::Name, false), 0);
        assert_eq!(names(&p), ["echo", "flaky", "notes", "zeta"]);
        let (_, p) = select(sample(), &q(SortKey::Name, true), 0);
        assert_eq!(names(&p), ["zeta", "notes", "flaky", "echo"]);
        let (_, p) = select(sample(), &q(SortKey::P99, true), 0);
        assert_eq!(names(&p), ["notes", "echo", "flaky", "zeta"]);
        let (_, p) = select(sample(), &q(SortKey::Restarts, true), 0);
        assert_eq!(names(&p), ["flaky", "echo", "notes", "zeta"]);
        let (_, p) = select(sample(), &q(SortKey::State, false), 0);
        assert_eq!(names(&p), ["echo", "notes", "flaky", "zeta"]);
        let (_, p) = select(sample(), &q(SortKey::Health, true), 0);
        assert_eq!(names(&p), ["zeta", "flaky", "echo", "notes"]);
        let (_, p) = select(sample(), &q(SortKey::Cpu, true), 0);
        assert_eq!(names(&p)[0], "notes");
    }

    #[test]
    fn the_filter_matches_name_state_and_health_in_any_case() {
        let mut query = q(SortKey::Name, false);
        query.filter = " LOOP ".into();
        let (n, p) = select(sample(), &query, 0);
        assert_eq!((n, names(&p)), (1, vec!["flaky"]));
        query.filter = "unresp".into();
        assert_eq!(names(&select(sample(), &query, 0).1), ["flaky"]);
        query.filter = "e".into();
        assert_eq!(select(sample(), &query, 0).0, 4);
        query.filter = "nothing-like-it".into();
        assert_eq!(select(sample(), &query, 0), (0, vec![]));
    }

    #[test]
    fn a_page_is_offset_and_limit_of_the_matched_rows() {
        let rows: Vec<Row> = (0..250)
            .map(|i| row(&format!("ext-{i:04}"), State::Ready, |_| {}))
            .collect();
        let query = Query {
            offset: 200,
            limit: 100,
            ..q(SortKey::Name, false)
        };
        let (n, p) = select(rows.clone(), &query, 0);
        assert_eq!((n, p.len()), (250, 50));
        assert_eq!(p[0].name, "ext-0200");
        let past = Query {
            offset: 250,
            ..query
        };
        assert_eq!(select(rows, &past, 0), (250, vec![]));
    }

    #[test]
    fn the_last_minute_is_the_last_six_periods() {
        let mut recent = vec![0u32; conduit_supervisor::RATE_BUCKETS];
        let n = recent.len();
        recent[n - 1] = 1;
        recent[n - 6] = 2;
        recent[n - 7] = 100;
        assert_eq!(last_minute(&recent), 3);
    }

    #[test]
    fn the_answer_reads_back_into_its_types() {
        let o = Overview {
            at_ms: 5,
            daemon: DaemonFigures {
                pid: 1,
                version: "0.1.0".into(),
                started_at_ms: 1,
                host_loop: serde_json::json!({"passes": 3}),
            },
            store: conduit_store::ViewCounts::default(),
            extensions: Table {
                installed: 4,
                by_state: BTreeMap::new(),
                degraded: 1,
                matched: 4,
                offset: 0,
                sort: SortKey::P99,
                desc: true,
                period_ms: 10_000,
                rows: sample(),
            },
            detail: None,
        };
        let text = serde_json::to_string(&o).unwrap();
        let back: Overview = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
        assert!(text.contains(r#""sort":"p99""#), "{text}");
    }
}
