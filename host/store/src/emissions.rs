//! Emissions: planned by an extension, committed by the host loop with the records the
//! extension's `emit.commit` returns, in the same transaction.
//!
//! An Emission is `planned`, then `committed` (with its records) or `failed` (with the reason).
//! The host loop finds planned Emissions through the partial index `emissions_planned`.
//!
//! Invariant: an Emission leaves `planned` once, and its records are written in the transaction
//! that commits it, so they exist exactly when it is `committed`. Its commit id is
//! `em-<id>-<16 random hex digits>`: unique within the store through the id, and, through the
//! random part, never repeated by another store or by this one restored from a backup, so an
//! extension that remembers commit ids cannot mistake a new Emission for one it committed.

use std::fmt;

use conduit_protocol::calls::{EmitResult, Record};
use rusqlite::{Row, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::SqlContext;
use crate::error::StoreError;
use crate::refs::{Referrer, note_refs};
use crate::rows::{col, collect, first, page, parse_json};
use crate::tx::{ReadTx, WriteTx};

/// Where an Emission is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmissionState {
    Planned,
    Committed,
    Failed,
}

impl EmissionState {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            EmissionState::Planned => "planned",
            EmissionState::Committed => "committed",
            EmissionState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<EmissionState> {
        match s {
            "planned" => Some(EmissionState::Planned),
            "committed" => Some(EmissionState::Committed),
            "failed" => Some(EmissionState::Failed),
            _ => None,
        }
    }
}

impl fmt::Display for EmissionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What planning an Emission returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Planned {
    pub emission_id: i64,
    pub commit_id: String,
}

impl From<Planned> for EmitResult {
    fn from(p: Planned) -> EmitResult {
        EmitResult::new(p.emission_id, p.commit_id)
    }
}

/// An Emission, with its records once committed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Emission {
    pub id: i64,
    /// The extension that planned it and whose `emit.commit` commits it.
    pub extension: String,
    pub emission: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_id: Option<i64>,
    pub payload: Value,
    pub commit_id: String,
    pub state: EmissionState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The records written when it was committed, in the order returned; empty otherwise.
    #[serde(default)]
    pub records: Vec<Record>,
    pub planned_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<i64>,
}

macro_rules! emission_select {
    () => {
        "SELECT id, extension, emission, work_id, payload, commit_nonce, state, error, \
         planned_at, finished_at FROM emissions "
    };
}

const SQL_EMISSION: &str = concat!(emission_select!(), "WHERE id = ?1");
/// A page of every row, whatever its state, oldest first (for listing).
const SQL_LIST: &str = concat!(emission_select!(), "WHERE id > ?1 ORDER BY id LIMIT ?2");
pub(crate) const SQL_PLANNED: &str = concat!(
    emission_select!(),
    "WHERE state = 'planned' ORDER BY id LIMIT ?1"
);
const SQL_RECORDS: &str =
    "SELECT seq, kind, body FROM emission_records WHERE emission_id = ?1 ORDER BY seq";

fn commit_id(id: i64, nonce: &str) -> String {
    format!("em-{id}-{nonce}")
}

fn decode(row: &Row<'_>) -> Result<Emission, StoreError> {
    let id: i64 = col(row, 0)?;
    let payload: String = col(row, 4)?;
    let nonce: String = col(row, 5)?;
    let state: String = col(row, 6)?;
    let state = EmissionState::parse(&state).ok_or_else(|| StoreError::Decode {
        record: "emission",
        id,
        field: "state",
        reason: format!("unknown state {state:?}"),
    })?;
    Ok(Emission {
        id,
        extension: col(row, 1)?,
        emission: col(row, 2)?,
        work_id: col(row, 3)?,
        payload: parse_json(&payload, "emission", id, "payload")?,
        commit_id: commit_id(id, &nonce),
        state,
        error: col(row, 7)?,
        records: Vec::new(),
        planned_at_ms: col(row, 8)?,
        finished_at_ms: col(row, 9)?,
    })
}

impl ReadTx<'_> {
    /// One Emission with its records, or `None`.
    pub fn emission(&self, id: i64) -> Result<Option<Emission>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_EMISSION)
            .context("prepare emission read")?;
        let Some(mut emission) = first(&mut stmt, [id], "read an emission", decode)? else {
            return Ok(None);
        };
        let mut stmt = self
            .conn
            .prepare_cached(SQL_RECORDS)
            .context("prepare emission records read")?;
        emission.records = collect(&mut stmt, [id], "read emission records", |row| {
            let seq: i64 = col(row, 0)?;
            let body: String = col(row, 2)?;
            let body = serde_json::from_str(&body).map_err(|err| StoreError::Decode {
                record: "emission",
                id,
                field: "records",
                reason: format!("record {seq}: {err}"),
            })?;
            Ok(Record::new(col::<String>(row, 1)?, body))
        })?;
        Ok(Some(emission))
    }

    /// Up to `limit` Emissions with ids above `after_id` (from the start when `None`), in any
    /// state, oldest first, without their records ([`ReadTx::emission`] has them).
    pub fn list_emissions(
        &self,
        after_id: Option<i64>,
        limit: u32,
    ) -> Result<Vec<Emission>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_LIST)
            .context("prepare emissions list")?;
        collect(
            &mut stmt,
            params![after_id.unwrap_or(0), limit],
            "list emissions",
            decode,
        )
    }

    /// The oldest `limit` planned Emissions (their records are empty: they have none yet).
    pub fn planned_emissions(&self, limit: u32) -> Result<Vec<Emission>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_PLANNED)
            .context("prepare planned emissions read")?;
        collect(&mut stmt, [limit], "read planned emissions", decode)
    }
}

impl WriteTx<'_> {
    /// Plans an Emission for the host loop to commit; returns its id and commit id.
    pub fn plan_emission(
        &mut self,
        extension: &str,
        emission: &str,
        work_id: Option<i64>,
        payload: &Value,
        now: i64,
    ) -> Result<Planned, StoreError> {
        let body = serde_json::to_string(payload).map_err(|err| StoreError::Invalid {
            field: "payload",
            reason: err.to_string(),
        })?;
        // Every caller checks the depth before it parses a payload; this is the backstop that
        // keeps a payload no receiver could read out of the store whatever the path.
        conduit_protocol::check_payload_depth(&body).map_err(|err| StoreError::Invalid {
            field: "payload",
            reason: err.to_string(),
        })?;
        // SQLite's `randomblob` draws from its own generator, seeded from the operating
        // system, so the store needs no random number crate of its own.
        let (id, nonce): (i64, String) = self
            .conn()
            .prepare_cached(
                "INSERT INTO emissions (extension, emission, work_id, payload, commit_nonce, \
                 state, planned_at) \
                 VALUES (?1, ?2, ?3, ?4, lower(hex(randomblob(8))), 'planned', ?5) \
                 RETURNING id, commit_nonce",
            )
            .and_then(|mut stmt| {
                stmt.query_row(params![extension, emission, work_id, body, now], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
            })
            .with_context(|| format!("plan emission {extension}/{emission}"))?;
        // An artifact the payload names is kept while the Emission is planned.
        note_refs(self, Referrer::Emission, id, &body, now)?;
        Ok(Planned {
            emission_id: id,
            commit_id: commit_id(id, &nonce),
        })
    }

    /// Commits a planned Emission with the records its extension returned.
    pub fn commit_emission(
        &mut self,
        id: i64,
        records: &[Record],
        now: i64,
    ) -> Result<(), StoreError> {
        let conn = self.conn();
        let what = || format!("commit emission {id}");
        let n = conn
            .prepare_cached(
                "UPDATE emissions SET state = 'committed', finished_at = ?2 \
                 WHERE id = ?1 AND state = 'planned'",
            )
            .and_then(|mut stmt| stmt.execute(params![id, now]))
            .with_context(what)?;
        self.expect_planned(id, n)?;
        let mut insert = conn
            .prepare_cached(
                "INSERT INTO emission_records (emission_id, seq, kind, body) \
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .with_context(what)?;
        for (seq, record) in records.iter().enumerate() {
            let body = serde_json::to_string(&record.body).map_err(|err| StoreError::Invalid {
                field: "record body",
                reason: err.to_string(),
            })?;
            insert
                .execute(params![id, seq as i64, record.kind, body])
                .with_context(what)?;
            // Records are history: they keep an artifact's id, not its content, but the
            // reference is recorded so an artifact's answer can show them.
            note_refs(self, Referrer::EmissionRecord, id, &body, now)?;
        }
        Ok(())
    }

    /// Marks a planned Emission failed, with the reason.
    pub fn fail_emission(&mut self, id: i64, error: &str, now: i64) -> Result<(), StoreError> {
        let n = self
            .conn()
            .prepare_cached(
                "UPDATE emissions SET state = 'failed', error = ?2, finished_at = ?3 \
                 WHERE id = ?1 AND state = 'planned'",
            )
            .and_then(|mut stmt| stmt.execute(params![id, error, now]))
            .with_context(|| format!("fail emission {id}"))?;
        self.expect_planned(id, n)
    }

    /// Turns "no row changed" into the reason: the Emission is missing or already finished.
    fn expect_planned(&self, id: i64, changed: usize) -> Result<(), StoreError> {
        if changed == 1 {
            return Ok(());
        }
        let mut stmt = self
            .conn
            .prepare_cached("SELECT state FROM emissions WHERE id = ?1")
            .context("prepare emission state read")?;
        match first(&mut stmt, [id], "read an emission's state", |row| {
            col::<String>(row, 0)
        })? {
            None => Err(StoreError::NotFound {
                record: "emission",
                id,
            }),
            Some(state) => Err(StoreError::WrongState {
                record: "emission",
                id,
                state,
                expected: "planned",
            }),
        }
    }
}
