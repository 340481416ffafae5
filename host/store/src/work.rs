//! Work: the unit routing opens and feeds, named by `(kind, key)` while unfinished.
//!
//! A Work is `open` (inputs queued), `ready` (inputs make it runnable) or `done`. Routing finds
//! the unfinished Work for a `(kind, key)` through the partial unique index `work_live_key`, and
//! the host loop reads unfinished Work through `work_live`; done Work is history that neither
//! read touches. An operator may close an unfinished Work ([`WriteTx::close_work`]): it is
//! `done`, with when and why.
//!
//! Invariant: at most one unfinished Work per `(kind, key)` (the unique partial index enforces
//! it); once that Work is done, the same key opens a new one.

use std::fmt;

use conduit_protocol::calls::Work;
use rusqlite::{Row, params};
use serde::{Deserialize, Serialize};

use crate::ended::Ended;
use crate::error::SqlContext;
use crate::error::StoreError;
use crate::rows::{col, collect, first, page};
use crate::tx::{ReadTx, WriteTx};

/// Where a Work is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkState {
    /// Inputs are queued; nothing has made it runnable yet.
    Open,
    /// Runnable.
    Ready,
    /// Finished; its key is free for a new Work.
    Done,
}

impl WorkState {
    /// The name stored and shown on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkState::Open => "open",
            WorkState::Ready => "ready",
            WorkState::Done => "done",
        }
    }

    /// The state named `s` as stored (`open`, `ready`, `done`), if it is one.
    pub fn parse(s: &str) -> Option<WorkState> {
        match s {
            "open" => Some(WorkState::Open),
            "ready" => Some(WorkState::Ready),
            "done" => Some(WorkState::Done),
            _ => None,
        }
    }
}

impl fmt::Display for WorkState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Work with its inputs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkRecord {
    pub id: i64,
    pub kind: String,
    pub key: String,
    pub state: WorkState,
    /// The Events fed to it, in id order.
    pub event_ids: Vec<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// When an operator closed it (it is then `done`), and why, if they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_reason: Option<String>,
}

impl From<WorkRecord> for Work {
    fn from(w: WorkRecord) -> Work {
        Work::new(w.id, w.kind, w.key, w.state.as_str(), w.event_ids)
    }
}

// Inputs come back as one ordered list per row, so a page of Work is one statement.
macro_rules! work_select {
    () => {
        "SELECT id, kind, key, state, created_at, updated_at, \
         (SELECT group_concat(event_id, ',' ORDER BY event_id) \
          FROM work_inputs WHERE work_id = work.id), closed_at, close_reason \
         FROM work "
    };
}

const SQL_WORK: &str = concat!(work_select!(), "WHERE id = ?1");
pub(crate) const SQL_OPEN_WORK: &str =
    concat!(work_select!(), "WHERE state != 'done' ORDER BY id LIMIT ?1");
const SQL_LIST_WORK: &str = concat!(work_select!(), "WHERE id > ?1 ORDER BY id LIMIT ?2");
pub(crate) const SQL_LIVE_BY_KEY: &str =
    "SELECT id, state FROM work WHERE kind = ?1 AND key = ?2 AND state != 'done'";

fn decode(row: &Row<'_>) -> Result<WorkRecord, StoreError> {
    let id: i64 = col(row, 0)?;
    let state: String = col(row, 3)?;
    let inputs: Option<String> = col(row, 6)?;
    let bad = |field, reason: String| StoreError::Decode {
        record: "work",
        id,
        field,
        reason,
    };
    let state =
        WorkState::parse(&state).ok_or_else(|| bad("state", format!("unknown state {state:?}")))?;
    let event_ids = match inputs {
        None => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|s| s.parse::<i64>())
            .collect::<Result<_, _>>()
            .map_err(|err| bad("event_ids", err.to_string()))?,
    };
    Ok(WorkRecord {
        id,
        kind: col(row, 1)?,
        key: col(row, 2)?,
        state,
        event_ids,
        created_at_ms: col(row, 4)?,
        updated_at_ms: col(row, 5)?,
        closed_at_ms: col(row, 7)?,
        close_reason: col(row, 8)?,
    })
}

impl ReadTx<'_> {
    /// One Work with its inputs, or `None`.
    pub fn work(&self, id: i64) -> Result<Option<WorkRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_WORK)
            .context("prepare work read")?;
        first(&mut stmt, [id], "read a work", decode)
    }

    /// The oldest `limit` unfinished (open or ready) Work.
    pub fn open_work(&self, limit: u32) -> Result<Vec<WorkRecord>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_OPEN_WORK)
            .context("prepare open work read")?;
        collect(&mut stmt, [limit], "read open work", decode)
    }

    /// A page of all Work with ids above `after_id` (from the start when `None`), oldest first.
    pub fn list_work(
        &self,
        after_id: Option<i64>,
        limit: u32,
    ) -> Result<Vec<WorkRecord>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_LIST_WORK)
            .context("prepare work list")?;
        collect(
            &mut stmt,
            params![after_id.unwrap_or(0), limit],
            "list work",
            decode,
        )
    }
}

impl WriteTx<'_> {
    /// Routes inputs to the unfinished Work for `(kind, key)`, opening one if there is none,
    /// and returns its id. A new Work starts `ready` when `start`, else `open`; an `open` Work
    /// fed with `start` becomes `ready`; a `ready` Work stays ready. Feeding an Event twice is
    /// a no-op.
    pub fn open_or_feed_work(
        &mut self,
        kind: &str,
        key: &str,
        event_ids: &[i64],
        start: bool,
        now: i64,
    ) -> Result<i64, StoreError> {
        let conn = self.conn();
        let what = || format!("open or feed work {kind}/{key}");
        let live = {
            let mut stmt = conn.prepare_cached(SQL_LIVE_BY_KEY).with_context(what)?;
            first(&mut stmt, [kind, key], "find live work", |row| {
                Ok((col::<i64>(row, 0)?, col::<String>(row, 1)?))
            })?
        };
        let work_id = match live {
            None => {
                let state = if start {
                    WorkState::Ready
                } else {
                    WorkState::Open
                };
                conn.prepare_cached(
                    "INSERT INTO work (kind, key, state, created_at, updated_at) \
                     VALUES (?1, ?2, ?3, ?4, ?4) RETURNING id",
                )
                .and_then(|mut stmt| {
                    stmt.query_row(params![kind, key, state.as_str(), now], |row| row.get(0))
                })
                .with_context(what)?
            }
            Some((id, state)) => {
                let next = if start && state == WorkState::Open.as_str() {
                    WorkState::Ready.as_str()
                } else {
                    state.as_str()
                };
                conn.prepare_cached("UPDATE work SET state = ?2, updated_at = ?3 WHERE id = ?1")
                    .and_then(|mut stmt| stmt.execute(params![id, next, now]))
                    .with_context(what)?;
                id
            }
        };
        let mut feed = conn
            .prepare_cached(
                "INSERT INTO work_inputs (work_id, event_id, added_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT DO NOTHING",
            )
            .with_context(what)?;
        for &event_id in event_ids {
            feed.execute(params![work_id, event_id, now])
                .with_context(|| format!("feed work {work_id} with event {event_id}"))?;
        }
        Ok(work_id)
    }

    /// Closes an unfinished Work by hand at `now`: it becomes `done`, kept with when and
    /// `reason`, and its key is free for a new Work. `None` if there is no such Work;
    /// [`Ended::Already`] if an operator closed it before, [`Ended::Refused`] if it was done
    /// already.
    pub fn close_work(
        &mut self,
        id: i64,
        reason: Option<&str>,
        now: i64,
    ) -> Result<Option<Ended<WorkRecord>>, StoreError> {
        let Some(w) = self.work(id)? else {
            return Ok(None);
        };
        if w.closed_at_ms.is_some() {
            return Ok(Some(Ended::Already(w)));
        }
        if w.state == WorkState::Done {
            return Ok(Some(Ended::Refused(w)));
        }
        self.conn()
            .prepare_cached(
                "UPDATE work SET state = 'done', closed_at = ?2, close_reason = ?3, updated_at = ?2 \
                 WHERE id = ?1 AND state != 'done'",
            )
            .and_then(|mut stmt| stmt.execute(params![id, now, reason]))
            .with_context(|| format!("close work {id}"))?;
        Ok(self.work(id)?.map(Ended::Now))
    }

    /// Moves a Work to `state`. Reopening a done Work fails while another unfinished Work
    /// holds its `(kind, key)`.
    pub fn set_work_state(
        &mut self,
        id: i64,
        state: WorkState,
        now: i64,
    ) -> Result<(), StoreError> {
        let n = self
            .conn()
            .prepare_cached("UPDATE work SET state = ?2, updated_at = ?3 WHERE id = ?1")
            .and_then(|mut stmt| stmt.execute(params![id, state.as_str(), now]))
            .with_context(|| format!("set work {id} to {state}"))?;
        if n == 0 {
            return Err(StoreError::NotFound { record: "work", id });
        }
        Ok(())
    }
}
