//! Events: accepted once per `(source, delivery_id)`, then routed once.
//!
//! An Event row is never deleted or changed after routing; only `routed_at` and `work_id` are
//! set, once, by the routing pass. The routing pass reads the unrouted backlog through the
//! partial index `events_unrouted`, so retained history does not slow it.
//!
//! Invariant: a delivery is accepted at most once. A duplicate returns the first Event's id and
//! writes nothing, so a retried push is acknowledged without a second Event.

use conduit_protocol::CheckedPayload;
use conduit_protocol::calls::{Event, PushResult};
use rusqlite::{Row, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::SqlContext;
use crate::error::StoreError;
use crate::refs::{Referrer, note_refs};
use crate::rows::{col, collect, first, page, parse_json};
use crate::tx::{ReadTx, WriteTx};

/// What accepting a delivery did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    pub event_id: i64,
    /// True when this `(source, delivery_id)` was accepted before: `event_id` is the first
    /// Event's, and nothing was written.
    pub duplicate: bool,
}

impl From<Accepted> for PushResult {
    fn from(a: Accepted) -> PushResult {
        PushResult::new(a.event_id, a.duplicate)
    }
}

/// An Event with what routing decided about it, for management reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    #[serde(flatten)]
    pub event: Event,
    /// When the routing pass decided about it; `None` while it waits to be routed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_at_ms: Option<i64>,
    /// The Work routing sent it to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_id: Option<i64>,
}

// The column lists as macros, so that each statement is one literal built at compile time.
macro_rules! event_cols {
    () => {
        "id, source, delivery_id, kind, payload, accepted_at"
    };
}
macro_rules! record_cols {
    () => {
        concat!(event_cols!(), ", routed_at, work_id")
    };
}

const SQL_EVENT: &str = concat!("SELECT ", record_cols!(), " FROM events WHERE id = ?1");
pub(crate) const SQL_UNROUTED: &str = concat!(
    "SELECT ",
    event_cols!(),
    " FROM events WHERE routed_at IS NULL ORDER BY id LIMIT ?1"
);
pub(crate) const SQL_UNROUTED_AFTER: &str = concat!(
    "SELECT ",
    event_cols!(),
    " FROM events WHERE routed_at IS NULL AND id > ?1 ORDER BY id LIMIT ?2"
);
const SQL_LIST: &str = concat!(
    "SELECT ",
    record_cols!(),
    " FROM events WHERE id > ?1 ORDER BY id LIMIT ?2"
);
const SQL_LIST_BY_SOURCE: &str = concat!(
    "SELECT ",
    record_cols!(),
    " FROM events WHERE source = ?1 AND id > ?2 ORDER BY id LIMIT ?3"
);
const SQL_AFTER: &str = concat!(
    "SELECT ",
    event_cols!(),
    " FROM events WHERE id > ?1 ORDER BY id LIMIT ?2"
);

fn decode_event(row: &Row<'_>) -> Result<Event, StoreError> {
    let id: i64 = col(row, 0)?;
    let payload: String = col(row, 4)?;
    Ok(Event::new(
        id,
        col::<String>(row, 1)?,
        col::<String>(row, 2)?,
        col::<String>(row, 3)?,
        parse_json(&payload, "event", id, "payload")?,
        col(row, 5)?,
    ))
}

pub(crate) fn decode_record(row: &Row<'_>) -> Result<EventRecord, StoreError> {
    Ok(EventRecord {
        event: decode_event(row)?,
        routed_at_ms: col(row, 6)?,
        work_id: col(row, 7)?,
    })
}

impl ReadTx<'_> {
    /// One Event with its routing, or `None`.
    pub fn event(&self, id: i64) -> Result<Option<EventRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_EVENT)
            .context("prepare event read")?;
        first(&mut stmt, [id], "read an event", decode_record)
    }

    /// The oldest `limit` Events not yet routed.
    pub fn unrouted_events(&self, limit: u32) -> Result<Vec<Event>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_UNROUTED)
            .context("prepare unrouted events read")?;
        collect(&mut stmt, [limit], "read unrouted events", decode_event)
    }

    /// Up to `limit` unrouted Events with ids above `after_id`, oldest first: the routing pass
    /// pages past events that wait (their owner is starting or degraded) with it.
    pub fn unrouted_events_after(
        &self,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_UNROUTED_AFTER)
            .context("prepare unrouted events read")?;
        collect(
            &mut stmt,
            rusqlite::params![after_id, limit],
            "read unrouted events",
            decode_event,
        )
    }

    /// A page of Events with ids above `after_id` (from the start when `None`), oldest first,
    /// only from `source` when given.
    pub fn list_events(
        &self,
        after_id: Option<i64>,
        source: Option<&str>,
        limit: u32,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let limit = page(limit)?;
        let after = after_id.unwrap_or(0);
        // Two statements rather than `(?2 IS NULL OR source = ?2)`, which would keep SQLite
        // from using `events_by_source`.
        match source {
            Some(source) => {
                let mut stmt = self
                    .conn
                    .prepare_cached(SQL_LIST_BY_SOURCE)
                    .context("prepare events list")?;
                collect(
                    &mut stmt,
                    params![source, after, limit],
                    "list events",
                    decode_record,
                )
            }
            None => {
                let mut stmt = self
                    .conn
                    .prepare_cached(SQL_LIST)
                    .context("prepare events list")?;
                collect(
                    &mut stmt,
                    params![after, limit],
                    "list events",
                    decode_record,
                )
            }
        }
    }

    /// Events with ids above `after_id`, oldest first: the ones a Wait whose cursor is
    /// `after_id` has not yet considered.
    pub fn events_after(&self, after_id: i64, limit: u32) -> Result<Vec<Event>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_AFTER)
            .context("prepare events read")?;
        collect(
            &mut stmt,
            params![after_id, limit],
            "read events",
            decode_event,
        )
    }

    /// The newest Event's id, or `None` when there is none; read from the primary key, so it
    /// costs the same at any history size. A new Wait starts its cursor here.
    pub fn latest_event_id(&self) -> Result<Option<i64>, StoreError> {
        self.conn
            .prepare_cached("SELECT max(id) FROM events")
            .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
            .context("read the latest event id")
    }
}

impl WriteTx<'_> {
    /// Accepts a delivery whose payload is a parsed value: serialised once and checked against
    /// the payload depth limit here (the only check on this path), then as
    /// [`WriteTx::accept_checked`]. For tools and tests; the daemon's ingress keeps payloads as
    /// text from the request to the row and calls `accept_checked`.
    pub fn accept_event(
        &mut self,
        source: &str,
        delivery_id: &str,
        kind: &str,
        payload: &Value,
        now: i64,
    ) -> Result<Accepted, StoreError> {
        let payload = CheckedPayload::from_value(payload).map_err(|err| StoreError::Invalid {
            field: "payload",
            reason: err.to_string(),
        })?;
        self.accept_checked(source, delivery_id, kind, &payload, now)
    }

    /// Accepts a delivery: a new Event, or the first one's id when `(source, delivery_id)`
    /// was accepted before (in an earlier transaction or earlier in this one). The payload's
    /// text is stored as it is; its depth was checked when it was made (a `CheckedPayload`
    /// cannot be made otherwise), so it is not measured again.
    pub fn accept_checked(
        &mut self,
        source: &str,
        delivery_id: &str,
        kind: &str,
        payload: &CheckedPayload,
        now: i64,
    ) -> Result<Accepted, StoreError> {
        let what = || format!("accept event {source}/{delivery_id}");
        let body = payload.as_str();
        // Insert first: a new delivery, the common case, costs one statement. `DO NOTHING`
        // returns no row on a duplicate, and then the first Event is looked up.
        let mut insert = self
            .conn()
            .prepare_cached(
                "INSERT INTO events (source, delivery_id, kind, payload, accepted_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (source, delivery_id) DO NOTHING RETURNING id",
            )
            .with_context(what)?;
        let inserted = first(
            &mut insert,
            params![source, delivery_id, kind, body, now],
            "insert an event",
            |row| col::<i64>(row, 0),
        )?;
        if let Some(event_id) = inserted {
            // An artifact the payload names is kept while the Event is live.
            note_refs(self, Referrer::Event, event_id, body, now)?;
            return Ok(Accepted {
                event_id,
                duplicate: false,
            });
        }
        let event_id = self
            .conn()
            .prepare_cached("SELECT id FROM events WHERE source = ?1 AND delivery_id = ?2")
            .and_then(|mut stmt| stmt.query_row([source, delivery_id], |row| row.get(0)))
            .with_context(what)?;
        Ok(Accepted {
            event_id,
            duplicate: true,
        })
    }

    /// Records the routing decision for an Event: routed to `work_id`, or to no Work. An Event
    /// is routed once; routing it again is [`StoreError::WrongState`].
    pub fn mark_routed(
        &mut self,
        event_id: i64,
        work_id: Option<i64>,
        now: i64,
    ) -> Result<(), StoreError> {
        let n = self
            .conn()
            .prepare_cached(
                "UPDATE events SET routed_at = ?2, work_id = ?3 \
                 WHERE id = ?1 AND routed_at IS NULL",
            )
            .and_then(|mut stmt| stmt.execute(params![event_id, now, work_id]))
            .with_context(|| format!("mark event {event_id} routed"))?;
        if n == 1 {
            return Ok(());
        }
        match self.event(event_id)? {
            None => Err(StoreError::NotFound {
                record: "event",
                id: event_id,
            }),
            Some(_) => Err(StoreError::WrongState {
                record: "event",
                id: event_id,
                state: "routed".into(),
                expected: "unrouted",
            }),
        }
    }
}
