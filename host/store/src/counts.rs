//! How many Events and Work the store holds, for `GET /v1/metrics`.
//!
//! Read on a reader connection, so a scrape never waits for the writer. The totals count every
//! row (Events are never deleted), which costs a scan of the smallest index: a few
//! milliseconds at a hundred thousand rows, once per scrape. The unrouted count reads only the
//! partial index of the live set.

use crate::error::SqlContext;
use crate::error::StoreError;
use crate::tx::ReadTx;
use crate::work::WorkState;

/// Row counts of the coordination records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Every Event accepted.
    pub events: u64,
    /// Events the routing pass has not decided yet.
    pub events_unrouted: u64,
    /// Work by state: open, ready, done.
    pub work: [(WorkState, u64); 3],
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            events: 0,
            events_unrouted: 0,
            work: [
                (WorkState::Open, 0),
                (WorkState::Ready, 0),
                (WorkState::Done, 0),
            ],
        }
    }
}

impl ReadTx<'_> {
    /// The counts, from one snapshot.
    pub fn counts(&self) -> Result<Counts, StoreError> {
        let one = |sql: &str, what: &'static str| -> Result<u64, StoreError> {
            self.conn
                .prepare_cached(sql)
                .and_then(|mut stmt| stmt.query_row([], |row| row.get::<_, i64>(0)))
                .map(|n| n.max(0) as u64)
                .context(what)
        };
        let events = one("SELECT count(*) FROM events", "count events")?;
        let events_unrouted = one(
            "SELECT count(*) FROM events WHERE routed_at IS NULL",
            "count unrouted events",
        )?;
        let mut work = Counts::default().work;
        let rows = self
            .conn
            .prepare_cached("SELECT state, count(*) FROM work GROUP BY state")
            .and_then(|mut stmt| {
                stmt.query_map([], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                })?
                .collect::<Result<Vec<_>, _>>()
            })
            .context("count work by state")?;
        for (state, n) in rows {
            if let Some(slot) = work.iter_mut().find(|(s, _)| s.as_str() == state) {
                slot.1 = n.max(0) as u64;
            }
        }
        Ok(Counts {
            events,
            events_unrouted,
            work,
        })
    }
}
