//! The reads behind the operator views (`conduit top`, `conduit web`, `GET /v1/overview`):
//! counts and pages whose cost follows the page, never the history retained.
//!
//! - [`ReadTx::view_counts`]: the newest Event's id (the primary key's last entry), the unrouted
//!   backlog counted through the partial index `events_unrouted` up to a cap, and Work by kind
//!   and state from `work_counts`, a table the schema's triggers keep (migration 3).
//! - [`ReadTx::work_page`]: Work newest first, filtered by state and kind, from the indexes
//!   `work_by_state (state, id)` and `work_by_kind (kind, state, id)`; a kind in several states
//!   reads one page per state and merges them, so no filter sorts more than a page per state.
//! - [`ReadTx::work_events`]: one Work's Events through `work_inputs`' primary key.
//! - [`ReadTx::list_artifacts`]: artifacts newest first by id.
//!
//! Invariant: no statement here reads a table or an index whole; `tests.rs` holds each to its
//! plan, on an empty file and after `ANALYZE` over a large history.

use rusqlite::{Row, params};
use serde::{Deserialize, Serialize};

use crate::artifacts::{self, Artifact};
use crate::error::{SqlContext, StoreError};
use crate::events::{self, EventRecord};
use crate::rows::{col, collect, page};
use crate::tx::ReadTx;
use crate::work::WorkState;

/// What the views count, from one snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewCounts {
    /// The newest Event's id: how many were ever accepted (ids are never reused), so its change
    /// over time is the accept rate. 0 before the first.
    pub latest_event_id: i64,
    /// Events the routing pass has not decided yet, counted up to the cap asked for.
    pub unrouted: u64,
    /// True when the backlog is at least the cap (`unrouted` is then the cap).
    pub unrouted_capped: bool,
    /// Work by kind and state, every pair with at least one Work, ordered by kind then state.
    pub work: Vec<WorkCount>,
}

/// How many Work of one kind are in one state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkCount {
    pub kind: String,
    pub state: String,
    pub n: u64,
}

/// One Work as a list shows it: without its inputs, with their count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkSummary {
    pub id: i64,
    pub kind: String,
    pub key: String,
    pub state: WorkState,
    pub inputs: u64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// Which Work a page holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkFilter {
    pub state: Option<WorkState>,
    pub kind: Option<String>,
}

const SQL_LATEST_EVENT: &str = "SELECT max(id) FROM events";
pub(crate) const SQL_UNROUTED_CAPPED: &str =
    "SELECT count(*) FROM (SELECT 1 FROM events WHERE routed_at IS NULL LIMIT ?1)";
const SQL_WORK_COUNTS: &str =
    "SELECT kind, state, n FROM work_counts WHERE n > 0 ORDER BY kind, state";

// The filtered pages name their index (`INDEXED BY`): with statistics saying most Work is in
// one state, the planner would otherwise walk the primary key backwards and filter, which reads
// the whole table for a rare state.
macro_rules! summary_select {
    () => {
        "SELECT id, kind, key, state, created_at, updated_at, \
         (SELECT count(*) FROM work_inputs WHERE work_id = work.id) FROM work "
    };
}
const SQL_SUMMARY: &str = concat!(summary_select!(), "WHERE id = ?1");
pub(crate) const SQL_PAGE_ALL: &str =
    concat!(summary_select!(), "WHERE id < ?1 ORDER BY id DESC LIMIT ?2");
pub(crate) const SQL_PAGE_STATE: &str = concat!(
    summary_select!(),
    "INDEXED BY work_by_state WHERE state = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3"
);
pub(crate) const SQL_PAGE_KIND_STATE: &str = concat!(
    summary_select!(),
    "INDEXED BY work_by_kind WHERE kind = ?1 AND state = ?2 AND id < ?3 ORDER BY id DESC LIMIT ?4"
);
pub(crate) const SQL_KIND_STATES: &str =
    "SELECT state FROM work_counts WHERE kind = ?1 AND n > 0 ORDER BY state";
pub(crate) const SQL_WORK_EVENTS: &str = "SELECT e.id, e.source, e.delivery_id, e.kind, \
     e.payload, e.accepted_at, e.routed_at, e.work_id \
     FROM work_inputs AS i JOIN events AS e ON e.id = i.event_id \
     WHERE i.work_id = ?1 AND i.event_id > ?2 ORDER BY i.event_id LIMIT ?3";
pub(crate) const SQL_ARTIFACTS: &str = artifacts::SQL_NEWEST;

fn decode_summary(row: &Row<'_>) -> Result<WorkSummary, StoreError> {
    let id: i64 = col(row, 0)?;
    let state: String = col(row, 3)?;
    let inputs: i64 = col(row, 6)?;
    Ok(WorkSummary {
        id,
        kind: col(row, 1)?,
        key: col(row, 2)?,
        state: WorkState::parse(&state).ok_or_else(|| StoreError::Decode {
            record: "work",
            id,
            field: "state",
            reason: format!("unknown state {state:?}"),
        })?,
        inputs: inputs.max(0) as u64,
        created_at_ms: col(row, 4)?,
        updated_at_ms: col(row, 5)?,
    })
}

/// `before`, as the upper bound of a descending page: `None` is "from the newest".
fn upper(before: Option<i64>) -> i64 {
    before.unwrap_or(i64::MAX)
}

impl ReadTx<'_> {
    /// The counts the views show, with the unrouted backlog counted up to `unrouted_cap`
    /// (at least 1): a backlog of millions costs the cap's index entries, not millions.
    pub fn view_counts(&self, unrouted_cap: u64) -> Result<ViewCounts, StoreError> {
        let cap = unrouted_cap.clamp(1, i64::MAX as u64) as i64;
        let latest: Option<i64> = self
            .conn
            .prepare_cached(SQL_LATEST_EVENT)
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .context("read the newest event id")?;
        let unrouted: i64 = self
            .conn
            .prepare_cached(SQL_UNROUTED_CAPPED)
            .and_then(|mut s| s.query_row([cap], |r| r.get(0)))
            .context("count unrouted events")?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_WORK_COUNTS)
            .context("prepare work counts")?;
        let work = collect(&mut stmt, [], "count work", |row| {
            let n: i64 = col(row, 2)?;
            Ok(WorkCount {
                kind: col(row, 0)?,
                state: col(row, 1)?,
                n: n.max(0) as u64,
            })
        })?;
        Ok(ViewCounts {
            latest_event_id: latest.unwrap_or(0),
            unrouted: unrouted.max(0) as u64,
            unrouted_capped: unrouted >= cap,
            work,
        })
    }

    /// A page of Work, newest first, with ids below `before` (from the newest when `None`),
    /// as `filter` selects. A kind without a state reads a page of each state the kind has
    /// Work in (from `work_counts`) and keeps the newest `limit` of them.
    pub fn work_page(
        &self,
        filter: &WorkFilter,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<WorkSummary>, StoreError> {
        let n = page(limit)?;
        let below = upper(before);
        match (&filter.kind, filter.state) {
            (None, None) => {
                let mut stmt = self
                    .conn
                    .prepare_cached(SQL_PAGE_ALL)
                    .context("prepare work page")?;
                collect(&mut stmt, params![below, n], "page work", decode_summary)
            }
            (None, Some(state)) => {
                let mut stmt = self
                    .conn
                    .prepare_cached(SQL_PAGE_STATE)
                    .context("prepare work page by state")?;
                collect(
                    &mut stmt,
                    params![state.as_str(), below, n],
                    "page work by state",
                    decode_summary,
                )
            }
            (Some(kind), Some(state)) => self.kind_state_page(kind, state.as_str(), below, n),
            (Some(kind), None) => {
                let states: Vec<String> = {
                    let mut stmt = self
                        .conn
                        .prepare_cached(SQL_KIND_STATES)
                        .context("prepare the states of a kind")?;
                    collect(&mut stmt, [kind], "read the states of a kind", |r| {
                        col(r, 0)
                    })?
                };
                let mut all = Vec::new();
                for state in &states {
                    all.extend(self.kind_state_page(kind, state, below, n)?);
                }
                all.sort_by_key(|w| std::cmp::Reverse(w.id));
                all.truncate(n as usize);
                Ok(all)
            }
        }
    }

    fn kind_state_page(
        &self,
        kind: &str,
        state: &str,
        below: i64,
        n: i64,
    ) -> Result<Vec<WorkSummary>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_PAGE_KIND_STATE)
            .context("prepare work page by kind")?;
        collect(
            &mut stmt,
            params![kind, state, below, n],
            "page work by kind",
            decode_summary,
        )
    }

    /// One Work without its inputs (their count instead), or `None`.
    pub fn work_summary(&self, id: i64) -> Result<Option<WorkSummary>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_SUMMARY)
            .context("prepare a work summary")?;
        crate::rows::first(&mut stmt, [id], "read a work summary", decode_summary)
    }

    /// A page of the Events fed to Work `work_id`, oldest first, with ids above `after`.
    pub fn work_events(
        &self,
        work_id: i64,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let n = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_WORK_EVENTS)
            .context("prepare a work's events")?;
        collect(
            &mut stmt,
            params![work_id, after.unwrap_or(0), n],
            "read a work's events",
            events::decode_record,
        )
    }

    /// A page of artifacts, newest first, with ids below `before`.
    pub fn list_artifacts(
        &self,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<Artifact>, StoreError> {
        let n = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_ARTIFACTS)
            .context("prepare artifact list")?;
        collect(
            &mut stmt,
            params![upper(before), n],
            "list artifacts",
            artifacts::decode,
        )
    }
}
