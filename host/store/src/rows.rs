//! Helpers the record modules share to run a query and decode its rows.
//!
//! Invariant: a row that cannot be decoded is a [`StoreError`] naming what was read, never a
//! panic.

use rusqlite::types::FromSql;
use rusqlite::{Params, Row, Statement};

use crate::error::{SqlContext, StoreError};
use crate::limits::MAX_PAGE;

/// Checks a page size: 1 to [`MAX_PAGE`].
pub(crate) fn page(limit: u32) -> Result<i64, StoreError> {
    if (1..=MAX_PAGE).contains(&limit) {
        Ok(i64::from(limit))
    } else {
        Err(StoreError::InvalidLimit {
            limit,
            max: MAX_PAGE,
        })
    }
}

/// Reads a JSON column back, naming the record when it cannot be parsed.
pub(crate) fn parse_json(
    text: &str,
    record: &'static str,
    id: i64,
    field: &'static str,
) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|err| StoreError::Decode {
        record,
        id,
        field,
        reason: err.to_string(),
    })
}

/// Runs a prepared query and decodes every row with `decode`.
pub(crate) fn collect<T>(
    stmt: &mut Statement<'_>,
    params: impl Params,
    what: &'static str,
    mut decode: impl FnMut(&Row<'_>) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut rows = stmt.query(params).context(what)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().context(what)? {
        out.push(decode(row)?);
    }
    Ok(out)
}

/// Runs a prepared query and decodes its first row, if any.
pub(crate) fn first<T>(
    stmt: &mut Statement<'_>,
    params: impl Params,
    what: &'static str,
    decode: impl FnOnce(&Row<'_>) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    let mut rows = stmt.query(params).context(what)?;
    match rows.next().context(what)? {
        Some(row) => decode(row).map(Some),
        None => Ok(None),
    }
}

/// Reads one column. The tables are `STRICT`, so a type mismatch here means a damaged file.
pub(crate) fn col<T: FromSql>(row: &Row<'_>, idx: usize) -> Result<T, StoreError> {
    row.get(idx).context("read a column")
}
