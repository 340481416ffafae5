//! Timers: fire at `next_at`, then ask their recurrence when to fire next.
//!
//! A timer is active while it has a `next_at`; rescheduling with `None` stops it and keeps the
//! row as history. The host loop finds due timers through the partial index `timers_due`, which
//! holds only active timers, ordered by when they fire.
//!
//! An operator may delete a timer ([`WriteTx::delete_timer`]): it stops and keeps its row, with
//! when it was deleted.
//!
//! Invariant: an active timer has exactly one pending firing time; the store never fires
//! anything itself (it has no clock). A deleted timer never fires again.

use rusqlite::{Row, params};
use serde::{Deserialize, Serialize};

use crate::ended::Ended;
use crate::error::SqlContext;
use crate::error::StoreError;
use crate::rows::{col, collect, first, page};
use crate::tx::{ReadTx, WriteTx};

/// A timer and its schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timer {
    pub id: i64,
    /// The extension whose recurrence schedules it.
    pub extension: String,
    pub recurrence: String,
    /// The spec the recurrence reads, as written when the timer was created.
    pub spec: String,
    /// When it fires next; `None` once stopped.
    pub next_at_ms: Option<i64>,
    pub last_fired_at_ms: Option<i64>,
    pub created_at_ms: i64,
    /// When an operator deleted it (it is kept, stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at_ms: Option<i64>,
}

impl Timer {
    /// Whether it will fire again.
    pub fn is_active(&self) -> bool {
        self.next_at_ms.is_some()
    }
}

macro_rules! timer_select {
    () => {
        "SELECT id, extension, recurrence, spec, next_at, last_fired_at, created_at, deleted_at \
         FROM timers "
    };
}

const SQL_TIMER: &str = concat!(timer_select!(), "WHERE id = ?1");
/// A page of every row, whatever its state, oldest first (for listing).
const SQL_LIST: &str = concat!(timer_select!(), "WHERE id > ?1 ORDER BY id LIMIT ?2");
// `next_at IS NOT NULL` repeats the index's condition so that SQLite uses `timers_due`.
pub(crate) const SQL_DUE: &str = concat!(
    timer_select!(),
    "WHERE next_at IS NOT NULL AND next_at <= ?1 ORDER BY next_at, id LIMIT ?2"
);

fn decode(row: &Row<'_>) -> Result<Timer, StoreError> {
    Ok(Timer {
        id: col(row, 0)?,
        extension: col(row, 1)?,
        recurrence: col(row, 2)?,
        spec: col(row, 3)?,
        next_at_ms: col(row, 4)?,
        last_fired_at_ms: col(row, 5)?,
        created_at_ms: col(row, 6)?,
        deleted_at_ms: col(row, 7)?,
    })
}

impl ReadTx<'_> {
    /// One timer, or `None`.
    pub fn timer(&self, id: i64) -> Result<Option<Timer>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_TIMER)
            .context("prepare timer read")?;
        first(&mut stmt, [id], "read a timer", decode)
    }

    /// Up to `limit` timers with ids above `after_id` (from the start when `None`), active or
    /// not, oldest first.
    pub fn list_timers(&self, after_id: Option<i64>, limit: u32) -> Result<Vec<Timer>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_LIST)
            .context("prepare timers list")?;
        collect(
            &mut stmt,
            params![after_id.unwrap_or(0), limit],
            "list timers",
            decode,
        )
    }

    /// Up to `limit` active timers due at or before `now`, the earliest first.
    pub fn due_timers(&self, now: i64, limit: u32) -> Result<Vec<Timer>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_DUE)
            .context("prepare due timers read")?;
        collect(&mut stmt, params![now, limit], "read due timers", decode)
    }
}

impl WriteTx<'_> {
    /// Creates an active timer that first fires at `next_at`; returns its id.
    pub fn create_timer(
        &mut self,
        extension: &str,
        recurrence: &str,
        spec: &str,
        next_at: i64,
        now: i64,
    ) -> Result<i64, StoreError> {
        self.conn()
            .prepare_cached(
                "INSERT INTO timers (extension, recurrence, spec, next_at, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5) RETURNING id",
            )
            .and_then(|mut stmt| {
                stmt.query_row(params![extension, recurrence, spec, next_at, now], |row| {
                    row.get(0)
                })
            })
            .with_context(|| format!("create timer {extension}/{recurrence}"))
    }

    /// Deletes a timer by hand at `now`: it stops for good and is kept, marked. `None` if there
    /// is no such timer; [`Ended::Already`] if it was deleted before.
    pub fn delete_timer(&mut self, id: i64, now: i64) -> Result<Option<Ended<Timer>>, StoreError> {
        let Some(t) = self.timer(id)? else {
            return Ok(None);
        };
        if t.deleted_at_ms.is_some() {
            return Ok(Some(Ended::Already(t)));
        }
        self.conn()
            .prepare_cached("UPDATE timers SET next_at = NULL, deleted_at = ?2 WHERE id = ?1")
            .and_then(|mut stmt| stmt.execute(params![id, now]))
            .with_context(|| format!("delete timer {id}"))?;
        Ok(self.timer(id)?.map(Ended::Now))
    }

    /// Records that a timer fired at `fired_at` and sets when it fires next; `None` stops it.
    pub fn reschedule_timer(
        &mut self,
        id: i64,
        next_at: Option<i64>,
        fired_at: i64,
    ) -> Result<(), StoreError> {
        let n = self
            .conn()
            .prepare_cached("UPDATE timers SET next_at = ?2, last_fired_at = ?3 WHERE id = ?1")
            .and_then(|mut stmt| stmt.execute(params![id, next_at, fired_at]))
            .with_context(|| format!("reschedule timer {id}"))?;
        if n == 0 {
            return Err(StoreError::NotFound {
                record: "timer",
                id,
            });
        }
        Ok(())
    }
}
