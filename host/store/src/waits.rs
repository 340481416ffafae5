//! Waits: a dependency on a future Event, decided by an extension's filter.
//!
//! A Wait is `active` until an Event satisfies it (or an operator drops it with the pending work
//! of its extension: `cancelled`). Its cursor is the last Event id its filter
//! has been asked about, so each pass offers it only newer Events (`events_after(cursor)`). The
//! host loop finds active Waits through the partial index `waits_active`.
//!
//! An operator may cancel an active Wait ([`WriteTx::cancel_wait`]): it is kept, `cancelled`,
//! with when.
//!
//! Invariant: the cursor only moves forward, and a satisfied or cancelled Wait never changes
//! again.

use std::fmt;

use rusqlite::{Row, params};
use serde::{Deserialize, Serialize};

use crate::ended::Ended;
use crate::error::SqlContext;
use crate::error::StoreError;
use crate::refs::{Referrer, note_refs};
use crate::rows::{col, collect, first, page};
use crate::tx::{ReadTx, WriteTx};

/// Where a Wait is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WaitState {
    Active,
    Satisfied,
    /// Cancelled by an operator before anything satisfied it (`waits cancel`, or dropped with
    /// its extension's pending work).
    Cancelled,
}

impl WaitState {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitState::Active => "active",
            WaitState::Satisfied => "satisfied",
            WaitState::Cancelled => "cancelled",
        }
    }

    fn parse(s: &str) -> Option<WaitState> {
        match s {
            "active" => Some(WaitState::Active),
            "satisfied" => Some(WaitState::Satisfied),
            "cancelled" => Some(WaitState::Cancelled),
            _ => None,
        }
    }
}

impl fmt::Display for WaitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Wait and how far it has looked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wait {
    pub id: i64,
    /// The extension that owns the filter.
    pub extension: String,
    pub filter: String,
    /// What the wait is for, as written when it was created.
    pub subject: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_id: Option<i64>,
    /// The last Event id considered; only later Events can satisfy it.
    pub cursor_event_id: i64,
    pub state: WaitState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub satisfied_by_event_id: Option<i64>,
    pub created_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub satisfied_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_at_ms: Option<i64>,
}

macro_rules! wait_select {
    () => {
        "SELECT id, extension, filter, subject, work_id, cursor_event_id, state, satisfied_by, \
         created_at, satisfied_at, cancelled_at FROM waits "
    };
}

const SQL_WAIT: &str = concat!(wait_select!(), "WHERE id = ?1");
/// A page of every row, whatever its state, oldest first (for listing).
const SQL_LIST: &str = concat!(wait_select!(), "WHERE id > ?1 ORDER BY id LIMIT ?2");
pub(crate) const SQL_ACTIVE: &str = concat!(
    wait_select!(),
    "WHERE state = 'active' AND id > ?1 ORDER BY id LIMIT ?2"
);

fn decode(row: &Row<'_>) -> Result<Wait, StoreError> {
    let id: i64 = col(row, 0)?;
    let state: String = col(row, 6)?;
    let state = WaitState::parse(&state).ok_or_else(|| StoreError::Decode {
        record: "wait",
        id,
        field: "state",
        reason: format!("unknown state {state:?}"),
    })?;
    Ok(Wait {
        id,
        extension: col(row, 1)?,
        filter: col(row, 2)?,
        subject: col(row, 3)?,
        work_id: col(row, 4)?,
        cursor_event_id: col(row, 5)?,
        state,
        satisfied_by_event_id: col(row, 7)?,
        created_at_ms: col(row, 8)?,
        satisfied_at_ms: col(row, 9)?,
        cancelled_at_ms: col(row, 10)?,
    })
}

impl ReadTx<'_> {
    /// One Wait, or `None`.
    pub fn wait(&self, id: i64) -> Result<Option<Wait>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_WAIT)
            .context("prepare wait read")?;
        first(&mut stmt, [id], "read a wait", decode)
    }

    /// Up to `limit` Waits with ids above `after_id` (from the start when `None`), in any
    /// state, oldest first.
    pub fn list_waits(&self, after_id: Option<i64>, limit: u32) -> Result<Vec<Wait>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_LIST)
            .context("prepare waits list")?;
        collect(
            &mut stmt,
            params![after_id.unwrap_or(0), limit],
            "list waits",
            decode,
        )
    }

    /// Up to `limit` active Waits with ids above `after_id` (from the start when `None`),
    /// oldest first. A pass that gets a full page passes its last id next time, so Waits
    /// that stay active for long do not keep later ones from being matched.
    pub fn active_waits(&self, after_id: Option<i64>, limit: u32) -> Result<Vec<Wait>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_ACTIVE)
            .context("prepare active waits read")?;
        collect(
            &mut stmt,
            params![after_id.unwrap_or(0), limit],
            "read active waits",
            decode,
        )
    }
}

impl WriteTx<'_> {
    /// Creates an active Wait that considers only Events after `after_event_id` (usually
    /// [`ReadTx::latest_event_id`], or 0); returns its id.
    pub fn create_wait(
        &mut self,
        extension: &str,
        filter: &str,
        subject: &str,
        work_id: Option<i64>,
        after_event_id: i64,
        now: i64,
    ) -> Result<i64, StoreError> {
        let id = self
            .conn()
            .prepare_cached(
                "INSERT INTO waits (extension, filter, subject, work_id, cursor_event_id, state, \
                 created_at) VALUES (?1, ?2, ?3, ?4, ?5, 'active', ?6) RETURNING id",
            )
            .and_then(|mut stmt| {
                stmt.query_row(
                    params![extension, filter, subject, work_id, after_event_id, now],
                    |row| row.get(0),
                )
            })
            .with_context(|| format!("create wait {extension}/{filter}"))?;
        // An artifact named in the subject is kept while the Wait is active.
        note_refs(self, Referrer::Wait, id, subject, now)?;
        Ok(id)
    }

    /// Records that an active Wait's filter has considered every Event up to
    /// `cursor_event_id`. A cursor behind the current one leaves it where it is.
    pub fn advance_wait(&mut self, id: i64, cursor_event_id: i64) -> Result<(), StoreError> {
        let n = self
            .conn()
            .prepare_cached(
                "UPDATE waits SET cursor_event_id = max(cursor_event_id, ?2) \
                 WHERE id = ?1 AND state = 'active'",
            )
            .and_then(|mut stmt| stmt.execute(params![id, cursor_event_id]))
            .with_context(|| format!("advance wait {id}"))?;
        self.expect_active(id, n)
    }

    /// Records that `event_id` satisfied an active Wait.
    pub fn satisfy_wait(&mut self, id: i64, event_id: i64, now: i64) -> Result<(), StoreError> {
        let n = self
            .conn()
            .prepare_cached(
                "UPDATE waits SET state = 'satisfied', satisfied_by = ?2, satisfied_at = ?3, \
                 cursor_event_id = max(cursor_event_id, ?2) \
                 WHERE id = ?1 AND state = 'active'",
            )
            .and_then(|mut stmt| stmt.execute(params![id, event_id, now]))
            .with_context(|| format!("satisfy wait {id} with event {event_id}"))?;
        self.expect_active(id, n)
    }

    /// Cancels an active Wait by hand at `now`; it is kept, `cancelled`. `None` if there is no
    /// such Wait; [`Ended::Already`] if it was cancelled before, [`Ended::Refused`] if an
    /// Event satisfied it.
    pub fn cancel_wait(&mut self, id: i64, now: i64) -> Result<Option<Ended<Wait>>, StoreError> {
        let Some(w) = self.wait(id)? else {
            return Ok(None);
        };
        match w.state {
            WaitState::Cancelled => return Ok(Some(Ended::Already(w))),
            WaitState::Satisfied => return Ok(Some(Ended::Refused(w))),
            WaitState::Active => {}
        }
        self.conn()
            .prepare_cached(
                "UPDATE waits SET state = 'cancelled', cancelled_at = ?2 \
                 WHERE id = ?1 AND state = 'active'",
            )
            .and_then(|mut stmt| stmt.execute(params![id, now]))
            .with_context(|| format!("cancel wait {id}"))?;
        Ok(self.wait(id)?.map(Ended::Now))
    }

    /// Turns "no row changed" into the reason: the Wait is missing or no longer active.
    fn expect_active(&self, id: i64, changed: usize) -> Result<(), StoreError> {
        if changed == 1 {
            return Ok(());
        }
        match self.wait(id)? {
            None => Err(StoreError::NotFound { record: "wait", id }),
            Some(w) => Err(StoreError::WrongState {
                record: "wait",
                id,
                state: w.state.to_string(),
                expected: "active",
            }),
        }
    }
}
