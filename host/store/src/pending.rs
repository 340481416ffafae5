//! The work that waits for one extension, counted and dropped: unrouted Events by kind, and an
//! extension's active Timers, active Waits and planned Emissions.
//!
//! Which Event kinds an extension owns is the host's question (its capabilities), so Events are
//! counted and dropped by kind here; Timers, Waits and Emissions carry their extension.
//! Dropping routes Events to no Work, deletes Timers and cancels Waits as an operator's hand
//! would (kept, with when), and fails Emissions with the reason given: no row goes, so what
//! was dropped stays visible.
//!
//! Invariant: each read goes through the live set's partial index (`events_unrouted`,
//! `timers_due`, `waits_active`, `emissions_planned`), so its cost follows what waits, not the
//! history.

use rusqlite::params;

use crate::error::SqlContext;
use crate::error::StoreError;
use crate::tx::{ReadTx, WriteTx};

/// How many Timers, Waits and Emissions of one extension are pending.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owned {
    /// Active Timers (they fire again).
    pub timers: u64,
    /// Active Waits.
    pub waits: u64,
    /// Planned Emissions.
    pub emissions: u64,
}

const SQL_UNROUTED_KINDS: &str = "SELECT kind, count(*) FROM events WHERE routed_at IS NULL \
     GROUP BY kind ORDER BY kind";
const SQL_TIMERS_OF: &str =
    "SELECT count(*) FROM timers WHERE next_at IS NOT NULL AND extension = ?1";
const SQL_WAITS_OF: &str = "SELECT count(*) FROM waits WHERE state = 'active' AND extension = ?1";
const SQL_EMISSIONS_OF: &str =
    "SELECT count(*) FROM emissions WHERE state = 'planned' AND extension = ?1";

impl ReadTx<'_> {
    /// The unrouted Events by kind: each kind with how many wait, in kind order.
    pub fn unrouted_kinds(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.conn
            .prepare_cached(SQL_UNROUTED_KINDS)
            .and_then(|mut stmt| {
                stmt.query_map([], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, i64>(1)?.max(0) as u64,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()
            })
            .context("count unrouted events by kind")
    }

    /// `extension`'s active Timers, active Waits and planned Emissions.
    pub fn owned_pending(&self, extension: &str) -> Result<Owned, StoreError> {
        let one = |sql: &str, what: &'static str| -> Result<u64, StoreError> {
            self.conn
                .prepare_cached(sql)
                .and_then(|mut stmt| stmt.query_row([extension], |row| row.get::<_, i64>(0)))
                .map(|n| n.max(0) as u64)
                .context(what)
        };
        Ok(Owned {
            timers: one(SQL_TIMERS_OF, "count an extension's timers")?,
            waits: one(SQL_WAITS_OF, "count an extension's waits")?,
            emissions: one(SQL_EMISSIONS_OF, "count an extension's emissions")?,
        })
    }
}

impl WriteTx<'_> {
    /// Marks every unrouted Event of kind `kind` routed to no Work at `now`; how many.
    pub fn route_kind_to_nothing(&mut self, kind: &str, now: i64) -> Result<u64, StoreError> {
        self.conn()
            .prepare_cached(
                "UPDATE events SET routed_at = ?2, work_id = NULL \
                 WHERE routed_at IS NULL AND kind = ?1",
            )
            .and_then(|mut stmt| stmt.execute(params![kind, now]))
            .map(|n| n as u64)
            .with_context(|| format!("route the events of kind {kind} to no Work"))
    }

    /// Deletes every active Timer of `extension` at `now` (it never fires again; the row is
    /// kept, with when); how many.
    pub fn delete_timers_of(&mut self, extension: &str, now: i64) -> Result<u64, StoreError> {
        self.conn()
            .prepare_cached(
                "UPDATE timers SET next_at = NULL, deleted_at = ?2 \
                 WHERE next_at IS NOT NULL AND extension = ?1",
            )
            .and_then(|mut stmt| stmt.execute(params![extension, now]))
            .map(|n| n as u64)
            .with_context(|| format!("stop the timers of {extension}"))
    }

    /// Cancels every active Wait of `extension` at `now`; how many.
    pub fn cancel_waits_of(&mut self, extension: &str, now: i64) -> Result<u64, StoreError> {
        self.conn()
            .prepare_cached(
                "UPDATE waits SET state = 'cancelled', cancelled_at = ?2 \
                 WHERE state = 'active' AND extension = ?1",
            )
            .and_then(|mut stmt| stmt.execute(params![extension, now]))
            .map(|n| n as u64)
            .with_context(|| format!("cancel the waits of {extension}"))
    }

    /// Fails every planned Emission of `extension` with `error` at `now`; how many.
    pub fn fail_emissions_of(
        &mut self,
        extension: &str,
        error: &str,
        now: i64,
    ) -> Result<u64, StoreError> {
        self.conn()
            .prepare_cached(
                "UPDATE emissions SET state = 'failed', error = ?2, finished_at = ?3 \
                 WHERE state = 'planned' AND extension = ?1",
            )
            .and_then(|mut stmt| stmt.execute(params![extension, error, now]))
            .map(|n| n as u64)
            .with_context(|| format!("fail the emissions of {extension}"))
    }
}
