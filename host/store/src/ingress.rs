//! Ingress cursors: where the host's polls of each extension's ingress source got to.
//!
//! A poll's events and its new cursor are written in one transaction, so a crash never loses
//! events behind a cursor that moved past them (redelivery is harmless: events are
//! deduplicated by source and delivery id).

use rusqlite::params;

use crate::error::SqlContext;
use crate::error::StoreError;
use crate::tx::{ReadTx, WriteTx};

impl ReadTx<'_> {
    /// The cursor of the last successful poll of `source` from `extension`, if any.
    pub fn ingress_cursor(
        &self,
        extension: &str,
        source: &str,
    ) -> Result<Option<String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT cursor FROM ingress_cursors WHERE extension = ?1 AND source = ?2",
            )
            .context("prepare ingress cursor read")?;
        crate::rows::first(
            &mut stmt,
            params![extension, source],
            "read an ingress cursor",
            |row| crate::rows::col(row, 0),
        )
    }
}

impl WriteTx<'_> {
    /// Records where the next poll of `source` from `extension` starts.
    pub fn set_ingress_cursor(
        &mut self,
        extension: &str,
        source: &str,
        cursor: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.conn()
            .prepare_cached(
                "INSERT INTO ingress_cursors (extension, source, cursor, updated_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (extension, source) DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at",
            )
            .and_then(|mut stmt| stmt.execute(params![extension, source, cursor, now]))
            .with_context(|| format!("set the ingress cursor of {extension}/{source}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::Store;

    #[test]
    fn a_cursor_is_absent_until_set_and_then_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("c.db")).unwrap();
        assert_eq!(
            store.read(|r| r.ingress_cursor("notes", "inbox")).unwrap(),
            None
        );
        store
            .write(|tx| tx.set_ingress_cursor("notes", "inbox", "3", 1))
            .unwrap();
        store
            .write(|tx| tx.set_ingress_cursor("notes", "inbox", "7", 2))
            .unwrap();
        assert_eq!(
            store
                .read(|r| r.ingress_cursor("notes", "inbox"))
                .unwrap()
                .as_deref(),
            Some("7")
        );
        assert_eq!(
            store.read(|r| r.ingress_cursor("other", "inbox")).unwrap(),
            None
        );
    }
}
