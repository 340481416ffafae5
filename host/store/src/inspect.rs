//! Reading a store without changing it: [`inspect`] opens the file read-only (no
//! migration, no WAL setup, no checkpoint), reads its schema version and runs
//! `PRAGMA quick_check`, interrupted at a deadline — for `conduit doctor`, which may run beside
//! a daemon that holds the store open and must never write to it; [`read_only`] runs one read
//! the same way — for the CLI's lists when no daemon runs, which must not migrate or create.
//!
//! Invariant: nothing here opens the file for writing, so nothing here can change the store;
//! a check that would need to (a WAL left by a crash that only a writer may recover) fails and
//! says so instead. The one thing it writes, as every reader does, is its read mark in the
//! shared-memory index (`conduit.db-shm`), which is how SQLite's readers and writer agree on
//! what a reader may still see.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use crate::error::{SqlContext, StoreError};
use crate::limits::BUSY_TIMEOUT;
use crate::schema::MIGRATIONS;
use crate::tx::ReadTx;

/// What [`inspect`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspection {
    /// `PRAGMA user_version`: the migrations applied to the file.
    pub schema_version: i64,
    /// The migrations this build knows (a file past them belongs to a newer build).
    pub known_version: usize,
    /// What `quick_check` said: `Ok(())` when it printed `ok`, its problems otherwise, or
    /// `Err(elapsed)` when it was interrupted at the deadline.
    pub quick_check: Result<(), QuickCheck>,
    /// How long the check took.
    pub took: Duration,
}

/// Why `quick_check` did not say `ok`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuickCheck {
    /// It found damage: its lines, joined.
    Problems(String),
    /// It did not finish before the deadline.
    TimedOut(Duration),
}

/// Open `path` read-only and check it, for at most `timeout` (the open waits for locks up to
/// the store's busy timeout, within the same bound).
pub fn inspect(path: &Path, timeout: Duration) -> Result<Inspection, StoreError> {
    let started = Instant::now();
    let conn = open(path, BUSY_TIMEOUT.min(timeout))?;
    // The deadline: a thread that interrupts the connection unless told the check is done.
    let handle = conn.get_interrupt_handle();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if wait.recv_timeout(timeout).is_err() {
            handle.interrupt();
            return true;
        }
        false
    });
    let res = (|| -> rusqlite::Result<(i64, Vec<String>)> {
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        let mut stmt = conn.prepare("PRAGMA quick_check")?;
        let lines = stmt
            .query_map([], |row| row.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok((version, lines))
    })();
    let _ = done.send(());
    let interrupted = watchdog.join().unwrap_or(false);
    let took = started.elapsed();
    let (schema_version, lines) = match res {
        Ok(v) => v,
        Err(rusqlite::Error::SqliteFailure(e, _))
            if interrupted && e.code == rusqlite::ErrorCode::OperationInterrupted =>
        {
            return Ok(Inspection {
                schema_version: -1,
                known_version: MIGRATIONS.len(),
                quick_check: Err(QuickCheck::TimedOut(took)),
                took,
            });
        }
        Err(cause) => {
            return Err(StoreError::Open {
                path: path.to_owned(),
                what: "running quick_check read-only",
                cause,
            });
        }
    };
    let quick_check = if lines.len() == 1 && lines[0] == "ok" {
        Ok(())
    } else {
        Err(QuickCheck::Problems(lines.join("; ")))
    };
    Ok(Inspection {
        schema_version,
        known_version: MIGRATIONS.len(),
        quick_check,
        took,
    })
}

/// Open `path` for reading only, waiting at most `busy` for a lock.
///
/// A store in WAL mode that no connection holds open and that was closed without keeping its
/// WAL has neither `-wal` nor `-shm`; even a read-only connection would create both. Then
/// nobody can be writing it, and it is read as immutable, which creates nothing. (A daemon
/// starting during the read could make it misread; the next read reads it anew.)
fn open(path: &Path, busy: Duration) -> Result<Connection, StoreError> {
    let open_err = |what| {
        let path = path.to_owned();
        move |cause| StoreError::Open { path, what, cause }
    };
    let side = |suffix: &str| {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        std::path::PathBuf::from(p).exists()
    };
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = if side("-wal") || side("-shm") {
        Connection::open_with_flags(path, flags)
    } else {
        Connection::open_with_flags(
            format!("file:{}?immutable=1", uri_path(path)),
            flags | OpenFlags::SQLITE_OPEN_URI,
        )
    }
    .map_err(open_err("opening read-only"))?;
    conn.busy_timeout(busy)
        .map_err(open_err("setting the busy timeout"))?;
    Ok(conn)
}

/// Run `f` on one snapshot of the store at `path`, opened read-only: nothing is migrated,
/// created or checkpointed. A store whose schema is not this build's (older: only a daemon's
/// open migrates it; newer: a newer build wrote it) is refused with [`StoreError::TooNew`] or
/// [`StoreError::NotMigrated`], whose messages say what to run.
pub fn read_only<T>(
    path: &Path,
    f: impl FnOnce(&ReadTx<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut conn = open(path, BUSY_TIMEOUT)?;
    let tx = conn.transaction().context("begin a read transaction")?;
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .context("read the schema version")?;
    let known = MIGRATIONS.len();
    if version > known as i64 {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found: version,
            known,
        });
    }
    if version < known as i64 {
        return Err(StoreError::NotMigrated {
            path: path.to_owned(),
            found: version,
            known,
        });
    }
    f(&ReadTx { conn: &tx })
}

/// `path` as the path of a `file:` URI: `%`, `?` and `#` (and anything not ASCII
/// printable) percent-encoded, byte by byte.
fn uri_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_graphic() && !b"%?#".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each file with its size and content; of the shared-memory index (`-shm`) only the size:
    /// every reader, this one too, writes its read mark there, which is how SQLite's readers
    /// and writer coordinate, not data.
    fn listing(dir: &Path) -> Vec<(String, u64, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let bytes = if name.ends_with("-shm") {
                    Vec::new()
                } else {
                    std::fs::read(e.path()).unwrap()
                };
                (name, e.metadata().unwrap().len(), bytes)
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_sound_store_checks_ok_and_nothing_on_disk_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conduit.db");
        let store = crate::Store::open(&path).unwrap();
        // With the store open (as while a daemon runs) and after it closed.
        let before = listing(dir.path());
        let i = inspect(&path, Duration::from_secs(10)).unwrap();
        assert_eq!(i.quick_check, Ok(()));
        assert_eq!(i.schema_version, MIGRATIONS.len() as i64);
        assert_eq!(i.known_version, MIGRATIONS.len());
        assert_eq!(listing(dir.path()), before);
        drop(store);
        let before = listing(dir.path());
        assert_eq!(
            inspect(&path, Duration::from_secs(10)).unwrap().quick_check,
            Ok(())
        );
        assert_eq!(listing(dir.path()), before);
    }

    #[test]
    fn a_path_is_encoded_for_a_file_uri() {
        assert_eq!(
            uri_path(Path::new("/a b/c?d#e%f/conduit.db")),
            "/a%20b/c%3Fd%23e%25f/conduit.db"
        );
    }

    #[test]
    fn damage_is_reported_not_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conduit.db");
        {
            let store = crate::Store::open(&path).unwrap();
            store
                .write(|tx| {
                    for i in 0..2_000 {
                        tx.accept_event(
                            "s",
                            &format!("d{i}"),
                            "k",
                            &serde_json::json!({"pad": "x".repeat(200)}),
                            0,
                        )?;
                    }
                    Ok(())
                })
                .unwrap();
        }
        // A clean close checkpointed everything into the main file; without the kept WAL (whose
        // frames would shadow the damage) the pages are read from the file itself.
        std::fs::remove_file(dir.path().join("conduit.db-wal")).unwrap();
        std::fs::remove_file(dir.path().join("conduit.db-shm")).unwrap();
        // Scribble over a page in the middle of the file (of the events table or an index).
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() / 2 / 4096 * 4096;
        for b in &mut bytes[at..at + 4096] {
            *b = 0x5a;
        }
        std::fs::write(&path, &bytes).unwrap();
        let i = inspect(&path, Duration::from_secs(10));
        match i {
            Ok(i) => assert!(
                matches!(i.quick_check, Err(QuickCheck::Problems(_))),
                "{i:?}"
            ),
            // A page so damaged SQLite refuses to read it at all is reported too.
            Err(e) => assert!(e.to_string().contains("quick_check"), "{e}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing was repaired");
        let names: Vec<String> = listing(dir.path()).into_iter().map(|(n, ..)| n).collect();
        assert_eq!(names, ["conduit.db"], "no file was created");
    }
}
