//! Artifact metadata. The content lives on disk under its sha256, written and verified by the
//! caller before it records the artifact here; the store holds only what describes it.
//!
//! Invariant: one row per digest. Recording the same content again returns the existing row
//! (the first name and media type stay); recording a digest with a different size is refused,
//! since the same digest with two sizes means one of the claims is wrong.

use rusqlite::{Row, params};
use serde::{Deserialize, Serialize};

use crate::error::SqlContext;
use crate::error::StoreError;
use crate::rows::{col, first};
use crate::tx::{ReadTx, WriteTx};

/// An artifact's metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub id: i64,
    /// Lower-case hex; the content's address on disk.
    pub sha256: String,
    pub size: u64,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The extension that sent it.
    pub extension: String,
    pub created_at_ms: i64,
}

macro_rules! artifact_select {
    () => {
        "SELECT id, sha256, size, name, media_type, extension, created_at FROM artifacts "
    };
}

const SQL_BY_ID: &str = concat!(artifact_select!(), "WHERE id = ?1");
const SQL_BY_SHA: &str = concat!(artifact_select!(), "WHERE sha256 = ?1");

pub(crate) fn decode(row: &Row<'_>) -> Result<Artifact, StoreError> {
    let id: i64 = col(row, 0)?;
    let size: i64 = col(row, 2)?;
    Ok(Artifact {
        id,
        sha256: col(row, 1)?,
        size: u64::try_from(size).map_err(|_| StoreError::Decode {
            record: "artifact",
            id,
            field: "size",
            reason: format!("negative size {size}"),
        })?,
        name: col(row, 3)?,
        media_type: col(row, 4)?,
        extension: col(row, 5)?,
        created_at_ms: col(row, 6)?,
    })
}

fn check_digest(sha256: &str) -> Result<(), StoreError> {
    let ok = sha256.len() == 64
        && sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid {
            field: "sha256",
            reason: format!("{sha256:?} is not 64 lower-case hex digits"),
        })
    }
}

impl ReadTx<'_> {
    /// One artifact by id, or `None`.
    pub fn artifact(&self, id: i64) -> Result<Option<Artifact>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_BY_ID)
            .context("prepare artifact read")?;
        first(&mut stmt, [id], "read an artifact", decode)
    }

    /// One artifact by its content digest (lower-case hex), or `None`.
    pub fn artifact_by_sha256(&self, sha256: &str) -> Result<Option<Artifact>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_BY_SHA)
            .context("prepare artifact read")?;
        first(&mut stmt, [sha256], "read an artifact", decode)
    }
}

impl WriteTx<'_> {
    /// Records an artifact whose content is already on disk under `sha256`; returns its row,
    /// the existing one when the digest was recorded before.
    pub fn record_artifact(
        &mut self,
        sha256: &str,
        size: u64,
        name: &str,
        media_type: Option<&str>,
        extension: &str,
        now: i64,
    ) -> Result<Artifact, StoreError> {
        check_digest(sha256)?;
        let stored_size = i64::try_from(size).map_err(|_| StoreError::Invalid {
            field: "size",
            reason: format!("{size} is larger than the store can hold"),
        })?;
        if let Some(artifact) = self.artifact_by_sha256(sha256)? {
            if artifact.size != size {
                return Err(StoreError::ArtifactMismatch {
                    sha256: sha256.to_owned(),
                    recorded: artifact.size,
                    size,
                });
            }
            return Ok(artifact);
        }
        let mut stmt = self
            .conn()
            .prepare_cached(
                "INSERT INTO artifacts (sha256, size, name, media_type, extension, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                 RETURNING id, sha256, size, name, media_type, extension, created_at",
            )
            .with_context(|| format!("record artifact {sha256}"))?;
        first(
            &mut stmt,
            params![sha256, stored_size, name, media_type, extension, now],
            "insert an artifact",
            decode,
        )?
        .ok_or_else(|| StoreError::Invalid {
            field: "sha256",
            reason: format!("inserting {sha256} returned no row"),
        })
    }
}
