//! Tests of what only the crate can see: the pragmas on each connection, the migrations'
//! bookkeeping, and the query plans of the live reads. The public API's behaviour is tested in
//! `tests/store.rs`.
//!
//! Invariant: every test uses its own SQLite file in a temporary directory.

use std::time::Duration;

use rusqlite::Connection;
use serde_json::json;

use super::*;
use crate::schema::MIGRATIONS;
use crate::work::WorkState;
use crate::{emissions, events, refs, retention, timers, waits, work};

fn temp_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("conduit.db")).unwrap();
    (dir, store)
}

fn user_version(conn: &Connection) -> i64 {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap()
}

#[test]
fn writer_pragmas() {
    let (_dir, store) = temp_store();
    let conn = store.writer.lock().unwrap();
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    let sync: i64 = conn
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .unwrap();
    let fk: i64 = conn
        .pragma_query_value(None, "foreign_keys", |r| r.get(0))
        .unwrap();
    let busy: i64 = conn
        .pragma_query_value(None, "busy_timeout", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    assert_eq!(sync, 2, "synchronous=FULL is 2");
    assert_eq!(fk, 1);
    assert_eq!(busy, 5000);
}

#[test]
fn readers_are_query_only() {
    let (_dir, store) = temp_store();
    let err = store
        .read(|r| {
            r.conn
                .execute("INSERT INTO timers (extension, recurrence, spec, created_at) VALUES ('x', 'y', 'z', 0)", [])
                .context("write on a reader")
        })
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Sql { ref cause, .. } if cause.to_string().contains("readonly")),
        "{err:?}"
    );
}

#[test]
fn migrations_from_empty_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conduit.db");
    {
        let store = Store::open(&path).unwrap();
        assert_eq!(
            user_version(&store.writer.lock().unwrap()),
            MIGRATIONS.len() as i64
        );
        store
            .write(|tx| tx.accept_event("s", "d1", "k", &json!({}), 1))
            .unwrap();
    }
    // Reopening applies nothing and keeps the data.
    let store = Store::open(&path).unwrap();
    assert_eq!(
        user_version(&store.writer.lock().unwrap()),
        MIGRATIONS.len() as i64
    );
    let ev = store.read(|r| r.event(1)).unwrap().unwrap();
    assert_eq!(ev.event.delivery_id, "d1");
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conduit.db");
    drop(Store::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", MIGRATIONS.len() as i64 + 1)
        .unwrap();
    drop(conn);
    let err = Store::open(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::TooNew { found, known, .. } if found == MIGRATIONS.len() as i64 + 1 && known == MIGRATIONS.len()),
        "{err:?}"
    );
}

#[test]
fn a_damaged_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conduit.db");
    std::fs::write(&path, b"this is not a database, not even close to one").unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::Open { .. } | StoreError::Corrupt { .. }),
        "{err:?}"
    );
}

/// The plan SQLite chooses for `sql`, one detail line per step.
fn plan(conn: &Connection, sql: &str) -> Vec<String> {
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let n = stmt.parameter_count();
    let params: Vec<i64> = vec![1; n];
    stmt.query_map(rusqlite::params_from_iter(params), |row| {
        row.get::<_, String>(3)
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// Asserts that the plan reads `table` only through `index`, and scans no table whole.
fn assert_uses(conn: &Connection, sql: &str, table: &str, index: &str) {
    let plan = plan(conn, sql);
    let through_index = plan.iter().any(|line| {
        line.starts_with(&format!("SCAN {table} USING INDEX {index}"))
            || line.starts_with(&format!("SCAN {table} USING COVERING INDEX {index}"))
            || line.starts_with(&format!("SEARCH {table} USING INDEX {index}"))
            || line.starts_with(&format!("SEARCH {table} USING COVERING INDEX {index}"))
    });
    assert!(through_index, "{sql}\ndoes not use {index}: {plan:#?}");
    for line in &plan {
        // A `SCAN t` without `USING` reads every row of `t`.
        let whole = line.starts_with("SCAN ") && !line.contains(" USING ");
        assert!(!whole, "{sql}\nscans a table: {plan:#?}");
    }
}

fn assert_live_reads_use_partial_indexes(conn: &Connection) {
    assert_uses(conn, events::SQL_UNROUTED, "events", "events_unrouted");
    assert_uses(
        conn,
        events::SQL_UNROUTED_AFTER,
        "events",
        "events_unrouted",
    );
    assert_uses(conn, work::SQL_OPEN_WORK, "work", "work_live");
    assert_uses(conn, work::SQL_LIVE_BY_KEY, "work", "work_live_key");
    assert_uses(conn, timers::SQL_DUE, "timers", "timers_due");
    assert_uses(conn, waits::SQL_ACTIVE, "waits", "waits_active");
    assert_uses(
        conn,
        emissions::SQL_PLANNED,
        "emissions",
        "emissions_planned",
    );
}

#[test]
fn live_reads_use_their_partial_indexes() {
    let (_dir, store) = temp_store();
    // On an empty file, where SQLite has no statistics.
    assert_live_reads_use_partial_indexes(&store.writer.lock().unwrap());

    // With retained history, and after ANALYZE, where the statistics say the history is large.
    store
        .write(|tx| {
            for thread in 0..40 {
                let mut ids = Vec::new();
                for i in 0..25 {
                    let delivery = format!("{thread}-{i}");
                    ids.push(
                        tx.accept_event("s", &delivery, "k", &json!({"i": i}), 1)?
                            .event_id,
                    );
                }
                let work = tx.open_or_feed_work("k", &thread.to_string(), &ids, true, 1)?;
                for id in ids {
                    tx.mark_routed(id, Some(work), 1)?;
                }
                tx.set_work_state(work, WorkState::Done, 2)?;
                let timer = tx.create_timer("x", "every", "1m", 10, 1)?;
                tx.reschedule_timer(timer, None, 10)?;
                let wait = tx.create_wait("x", "f", "s", Some(work), 0, 1)?;
                tx.satisfy_wait(wait, 1, 2)?;
                let planned = tx.plan_emission("x", "e", Some(work), &json!({}), 1)?;
                tx.commit_emission(planned.emission_id, &[], 2)?;
            }
            Ok(())
        })
        .unwrap();
    let conn = store.writer.lock().unwrap();
    assert_live_reads_use_partial_indexes(&conn);
    conn.execute_batch("ANALYZE").unwrap();
    assert_live_reads_use_partial_indexes(&conn);
}

#[test]
fn history_reads_use_their_indexes() {
    let (_dir, store) = temp_store();
    let conn = store.writer.lock().unwrap();
    // Paging by source must not scan every Event of every source.
    let by_source = plan(
        &conn,
        "SELECT id FROM events WHERE source = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
    );
    assert!(
        by_source.iter().any(|l| l.contains("events_by_source")),
        "{by_source:#?}"
    );
}

#[test]
fn reader_checkout_waits_at_most_its_timeout() {
    let (_dir, store) = temp_store();
    let held: Vec<_> = (0..MAX_READERS)
        .map(|_| store.readers.checkout(Duration::from_millis(10)).unwrap())
        .collect();
    let start = std::time::Instant::now();
    let err = store
        .readers
        .checkout(Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(err, StoreError::ReaderTimeout { .. }), "{err:?}");
    assert!(start.elapsed() >= Duration::from_millis(50));
    // A returned reader is handed to the next checkout.
    drop(held);
    store.readers.checkout(Duration::from_millis(10)).unwrap();
}

#[test]
fn cached_live_reads_are_not_reprepared() {
    let (_dir, store) = temp_store();
    // Different limits each time: a changed binding must not force a new plan (see
    // `configure_statements`).
    for limit in [1, 100, 200, 7] {
        store
            .write(|tx| {
                tx.unrouted_events(limit)?;
                tx.due_timers(i64::from(limit), limit)?;
                tx.active_waits(Some(i64::from(limit)), limit)?;
                tx.planned_emissions(limit)?;
                tx.open_work(limit).map(drop)
            })
            .unwrap();
        store.read(|r| r.unrouted_events(limit).map(drop)).unwrap();
    }
    let conn = store.writer.lock().unwrap();
    for sql in [
        events::SQL_UNROUTED,
        timers::SQL_DUE,
        waits::SQL_ACTIVE,
        emissions::SQL_PLANNED,
        work::SQL_OPEN_WORK,
    ] {
        let stmt = conn.prepare_cached(sql).unwrap();
        let n = stmt.get_status(rusqlite::StatementStatus::RePrepare);
        assert_eq!(n, 0, "{sql} was re-prepared {n} times");
    }
    let reader = store.readers.checkout(Duration::from_millis(10)).unwrap();
    assert!(
        reader
            .db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG)
            .unwrap()
    );
}

#[test]
fn counts_follow_events_and_work_exactly() {
    let (_dir, store) = temp_store();
    let empty = store.read(|r| r.counts()).unwrap();
    assert_eq!((empty.events, empty.events_unrouted), (0, 0));
    assert!(empty.work.iter().all(|(_, n)| *n == 0));
    store
        .write(|tx| {
            let a = tx.accept_event("s", "d1", "k", &json!({}), 1)?.event_id;
            let b = tx.accept_event("s", "d2", "k", &json!({}), 1)?.event_id;
            // A repeated delivery is not a new Event.
            tx.accept_event("s", "d2", "k", &json!({}), 1)?;
            tx.accept_event("s", "d3", "k", &json!({}), 1)?;
            let open = tx.open_or_feed_work("k", "one", &[a], true, 1)?;
            let done = tx.open_or_feed_work("k", "two", &[b], true, 1)?;
            tx.mark_routed(a, Some(open), 1)?;
            tx.mark_routed(b, Some(done), 1)?;
            tx.set_work_state(done, WorkState::Done, 2)?;
            Ok(())
        })
        .unwrap();
    let c = store.read(|r| r.counts()).unwrap();
    assert_eq!(c.events, 3);
    assert_eq!(c.events_unrouted, 1);
    let work = |s: WorkState| c.work.iter().find(|(w, _)| *w == s).unwrap().1;
    assert_eq!(work(WorkState::Done), 1);
    assert_eq!(work(WorkState::Open) + work(WorkState::Ready), 1);
}

fn assert_view_reads_use_their_indexes(conn: &Connection) {
    use crate::views;
    assert_uses(conn, views::SQL_PAGE_STATE, "work", "work_by_state");
    assert_uses(conn, views::SQL_PAGE_KIND_STATE, "work", "work_by_kind");
    let unrouted = plan(conn, views::SQL_UNROUTED_CAPPED);
    assert!(
        unrouted.iter().any(|l| l.contains("INDEX events_unrouted")),
        "{unrouted:#?}"
    );
    let inputs = plan(conn, views::SQL_WORK_EVENTS);
    assert!(
        inputs[0].starts_with("SEARCH i USING PRIMARY KEY (work_id=?"),
        "{inputs:#?}"
    );
    for sql in [
        views::SQL_PAGE_ALL,
        views::SQL_KIND_STATES,
        views::SQL_WORK_EVENTS,
        views::SQL_ARTIFACTS,
        views::SQL_UNROUTED_CAPPED,
    ] {
        for line in plan(conn, sql) {
            // `SCAN (subquery-1)` reads the subquery's rows, not a table.
            let whole = line.starts_with("SCAN ")
                && !line.contains(" USING ")
                && !line.starts_with("SCAN (subquery");
            assert!(!whole, "{sql}\nscans a table: {line}");
        }
    }
}

#[test]
fn view_reads_use_their_indexes_on_a_large_history() {
    let (_dir, store) = temp_store();
    // On an empty file, where SQLite has no statistics.
    assert_view_reads_use_their_indexes(&store.writer.lock().unwrap());
    store
        .write(|tx| {
            for thread in 0..40 {
                let mut ids = Vec::new();
                for i in 0..25 {
                    let delivery = format!("{thread}-{i}");
                    ids.push(
                        tx.accept_event("s", &delivery, "k", &json!({}), 1)?
                            .event_id,
                    );
                }
                let kind = if thread % 2 == 0 { "even" } else { "odd" };
                let work = tx.open_or_feed_work(kind, &thread.to_string(), &ids, true, 1)?;
                for id in ids {
                    tx.mark_routed(id, Some(work), 1)?;
                }
                tx.set_work_state(work, WorkState::Done, 2)?;
            }
            Ok(())
        })
        .unwrap();
    let conn = store.writer.lock().unwrap();
    conn.execute_batch("ANALYZE").unwrap();
    assert_view_reads_use_their_indexes(&conn);
    assert_live_reads_use_partial_indexes(&conn);
}

#[test]
fn work_counts_follow_inserts_state_changes_and_deletes() {
    let (_dir, store) = temp_store();
    let count = |store: &Store| -> Vec<(String, String, u64)> {
        store
            .read(|r| r.view_counts(10))
            .unwrap()
            .work
            .into_iter()
            .map(|c| (c.kind, c.state, c.n))
            .collect()
    };
    assert!(count(&store).is_empty());
    let (a, b) = store
        .write(|tx| {
            let e1 = tx.accept_event("s", "1", "k", &json!({}), 1)?.event_id;
            let e2 = tx.accept_event("s", "2", "k", &json!({}), 1)?.event_id;
            let a = tx.open_or_feed_work("x", "a", &[e1], false, 1)?;
            let b = tx.open_or_feed_work("y", "b", &[e2], true, 1)?;
            Ok((a, b))
        })
        .unwrap();
    assert_eq!(
        count(&store),
        vec![
            ("x".into(), "open".into(), 1),
            ("y".into(), "ready".into(), 1)
        ]
    );
    store
        .write(|tx| {
            // Fed with `start`: open -> ready.
            let e3 = tx.accept_event("s", "3", "k", &json!({}), 1)?.event_id;
            tx.open_or_feed_work("x", "a", &[e3], true, 2)?;
            tx.set_work_state(b, WorkState::Done, 2)?;
            // The same state again changes nothing.
            tx.set_work_state(b, WorkState::Done, 3)?;
            Ok(())
        })
        .unwrap();
    assert_eq!(
        count(&store),
        vec![
            ("x".into(), "ready".into(), 1),
            ("y".into(), "done".into(), 1)
        ]
    );
    store
        .writer
        .lock()
        .unwrap()
        .execute_batch(&format!(
            "DELETE FROM work_inputs WHERE work_id = {a}; DELETE FROM work WHERE id = {a}"
        ))
        .unwrap();
    assert_eq!(count(&store), vec![("y".into(), "done".into(), 1)]);
}

#[test]
fn the_views_migration_counts_the_work_already_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conduit.db");
    // A file at the schema before the views' migration, with Work in it, as an earlier build
    // left it.
    let views = MIGRATIONS
        .iter()
        .position(|m| m.contains("CREATE TABLE work_counts"))
        .unwrap();
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "journal_mode", "wal").unwrap();
    for (i, m) in MIGRATIONS[..views].iter().enumerate() {
        conn.execute_batch(m).unwrap();
        conn.pragma_update(None, "user_version", i as i64 + 1)
            .unwrap();
    }
    conn.execute_batch(
        "INSERT INTO work (kind, key, state, created_at, updated_at) VALUES
           ('x', 'a', 'done', 1, 1), ('x', 'b', 'done', 1, 1), ('x', 'c', 'open', 1, 1)",
    )
    .unwrap();
    drop(conn);
    let store = Store::open(&path).unwrap();
    let c = store.read(|r| r.view_counts(10)).unwrap();
    let got: Vec<_> = c.work.iter().map(|w| (w.state.as_str(), w.n)).collect();
    assert_eq!(got, vec![("done", 2), ("open", 1)]);
}

#[test]
fn the_unrouted_count_stops_at_its_cap() {
    let (_dir, store) = temp_store();
    store
        .write(|tx| {
            for i in 0..5 {
                tx.accept_event("s", &i.to_string(), "k", &json!({}), 1)?;
            }
            Ok(())
        })
        .unwrap();
    let at = |cap| store.read(|r| r.view_counts(cap)).unwrap();
    let c = at(5);
    assert_eq!(
        (c.unrouted, c.unrouted_capped, c.latest_event_id),
        (5, true, 5)
    );
    let c = at(6);
    assert_eq!((c.unrouted, c.unrouted_capped), (5, false));
    let c = at(4);
    assert_eq!((c.unrouted, c.unrouted_capped), (4, true));
}

#[test]
fn work_pages_go_newest_first_by_state_and_kind() {
    use crate::views::WorkFilter;
    let (_dir, store) = temp_store();
    store
        .write(|tx| {
            for i in 0..10 {
                let e = tx
                    .accept_event("s", &i.to_string(), "k", &json!({}), 1)?
                    .event_id;
                let kind = if i % 2 == 0 { "even" } else { "odd" };
                let w = tx.open_or_feed_work(kind, &i.to_string(), &[e], true, 1)?;
                if i % 3 == 0 {
                    tx.set_work_state(w, WorkState::Done, 2)?;
                }
            }
            Ok(())
        })
        .unwrap();
    let ids = |f: WorkFilter, before: Option<i64>, n: u32| -> Vec<i64> {
        store
            .read(|r| r.work_page(&f, before, n))
            .unwrap()
            .iter()
            .map(|w| w.id)
            .collect()
    };
    let all = WorkFilter::default();
    assert_eq!(ids(all.clone(), None, 3), vec![10, 9, 8]);
    assert_eq!(ids(all, Some(8), 3), vec![7, 6, 5]);
    let done = WorkFilter {
        state: Some(WorkState::Done),
        kind: None,
    };
    assert_eq!(ids(done, None, 10), vec![10, 7, 4, 1]);
    let even = WorkFilter {
        state: None,
        kind: Some("even".into()),
    };
    // Work 1, 3, 5, … are kind `even` (event i = id - 1); in two states, merged.
    assert_eq!(ids(even.clone(), None, 3), vec![9, 7, 5]);
    assert_eq!(ids(even, Some(5), 10), vec![3, 1]);
    let even_ready = WorkFilter {
        state: Some(WorkState::Ready),
        kind: Some("even".into()),
    };
    assert_eq!(ids(even_ready, None, 10), vec![9, 5, 3]);
    let page = store
        .read(|r| r.work_page(&WorkFilter::default(), None, 1))
        .unwrap();
    assert_eq!(page[0].inputs, 1);
    let evs = store.read(|r| r.work_events(10, None, 5)).unwrap();
    assert_eq!(evs.iter().map(|e| e.event.id).collect::<Vec<_>>(), vec![10]);
    assert!(
        store
            .read(|r| r.work_events(10, Some(10), 5))
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store.read(|r| r.work_page(&WorkFilter::default(), None, 0)),
        Err(StoreError::InvalidLimit { .. })
    ));
}

/// A trigger that refuses the event with delivery id `bad`: a store refusal of that one row
/// (a constraint error, as SQLite reports it), for the tests of isolation.
fn refuse_bad_deliveries(store: &Store) {
    store
        .writer
        .lock()
        .unwrap()
        .execute_batch(
            "CREATE TEMP TRIGGER refuse_bad BEFORE INSERT ON events WHEN NEW.delivery_id = 'bad' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
}

fn deliveries(store: &Store) -> Vec<String> {
    store
        .read(|r| r.list_events(None, None, 200))
        .unwrap()
        .into_iter()
        .map(|e| e.event.delivery_id)
        .collect()
}

#[test]
fn a_delivery_accepted_twice_in_one_transaction_is_one_event() {
    let (_dir, store) = temp_store();
    let (first, second, third) = store
        .write(|tx| {
            let a = tx.accept_event("s", "d1", "k", &json!({"n": 1}), 1)?;
            let b = tx.accept_event("s", "d1", "k", &json!({"n": 2}), 1)?;
            // Another source's delivery of the same id is another event.
            let c = tx.accept_event("t", "d1", "k", &json!({}), 1)?;
            Ok((a, b, c))
        })
        .unwrap();
    assert!(!first.duplicate && second.duplicate && !third.duplicate);
    assert_eq!(second.event_id, first.event_id);
    assert_ne!(third.event_id, first.event_id);
    // And in a later transaction, still the first.
    let later = store
        .write(|tx| tx.accept_event("s", "d1", "k", &json!({}), 2))
        .unwrap();
    assert_eq!((later.event_id, later.duplicate), (first.event_id, true));
    let kept = store.read(|r| r.event(first.event_id)).unwrap().unwrap();
    assert_eq!(
        kept.event.payload,
        json!({"n": 1}),
        "the first payload stays"
    );
}

#[test]
fn an_isolated_failure_undoes_only_its_own_writes() {
    let (_dir, store) = temp_store();
    refuse_bad_deliveries(&store);
    let (a, b, c) = store
        .write(|tx| {
            let a = tx.isolated(|tx| tx.accept_event("s", "a", "k", &json!({}), 1))?;
            // Two events and a cursor, the second event refused: none of the three stays.
            let b = tx.isolated(|tx| {
                tx.accept_event("s", "x", "k", &json!({}), 1)?;
                tx.set_ingress_cursor("ext", "s", "9", 1)?;
                tx.accept_event("s", "bad", "k", &json!({}), 1)
            })?;
            // The delivery undone with `b` is new again here.
            let c = tx.isolated(|tx| tx.accept_event("s", "x", "k", &json!({}), 1))?;
            Ok((a, b, c))
        })
        .unwrap();
    assert!(!a.unwrap().duplicate);
    let refused = b.unwrap_err();
    assert!(
        refused.to_string().contains("refused by the test"),
        "{refused}"
    );
    assert!(!c.unwrap().duplicate);
    assert_eq!(deliveries(&store), ["a", "x"]);
    assert_eq!(store.read(|r| r.ingress_cursor("ext", "s")).unwrap(), None);
}

#[test]
fn a_full_disk_refuses_only_the_isolated_part_that_needs_room() {
    let (_dir, store) = temp_store();
    // Room for small events in the pages the file has, none for a new page.
    store
        .write(|tx| tx.accept_event("s", "warm", "k", &json!({}), 1))
        .unwrap();
    {
        let conn = store.writer.lock().unwrap();
        let pages: i64 = conn
            .pragma_query_value(None, "page_count", |r| r.get(0))
            .unwrap();
        conn.pragma_update(None, "max_page_count", pages).unwrap();
    }
    let big = json!({ "text": "x".repeat(64 * 1024) });
    let (small, large) = store
        .write(|tx| {
            let small = tx.isolated(|tx| tx.accept_event("s", "small", "k", &json!({}), 1))?;
            let large = tx.isolated(|tx| tx.accept_event("s", "large", "k", &big, 1))?;
            Ok((small, large))
        })
        .unwrap();
    // SQLite undoes the one statement that needed room (it may also give up a whole
    // transaction on a full disk, which `isolated` reports as the outer error): the small
    // event commits, the large one is refused as a full disk.
    assert!(!small.unwrap().duplicate);
    assert!(large.unwrap_err().is_disk_full());
    assert_eq!(deliveries(&store), ["warm", "small"]);
}

#[test]
fn every_write_is_timed_after_the_writer_is_released() {
    let (_dir, store) = temp_store();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    assert!(store.observe_writes(move |t| s2.lock().unwrap().push(t)));
    assert!(!store.observe_writes(|_| {}), "one observer");
    store
        .write(|_| {
            std::thread::sleep(Duration::from_millis(20));
            Ok(())
        })
        .unwrap();
    // A failed write and a panicking one are timed too.
    let _ = store.write(|_| -> Result<(), StoreError> {
        Err(StoreError::Invalid {
            field: "f",
            reason: "r".into(),
        })
    });
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store.write(|_| -> Result<(), StoreError> { panic!("a bug") })
    }));
    assert!(panicked.is_err());
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    assert!(seen[0].hold >= Duration::from_millis(20), "{:?}", seen[0]);
    // The observer ran with the writer free: a write from inside it would not deadlock.
    assert!(store.writer.try_lock().is_ok());
}

#[test]
fn a_deferred_write_commits_without_its_own_fsync_and_the_next_synced_one_is_full_again() {
    let (dir, store) = temp_store();
    let level = |store: &Store| -> i64 {
        store
            .writer
            .lock()
            .unwrap()
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap()
    };
    let seen_inside: i64 = store
        .write_with(Durability::Deferred, |tx| {
            tx.accept_event("s", "routed-later", "k", &json!({}), 1)?;
            tx.read
                .conn
                .pragma_query_value(None, "synchronous", |r| r.get(0))
                .context("read synchronous")
        })
        .unwrap();
    assert_eq!(seen_inside, 1, "NORMAL while deferred");
    assert_eq!(level(&store), 1, "left as it is until a synced write asks");
    store
        .write(|tx| tx.accept_event("s", "acknowledged", "k", &json!({}), 1))
        .unwrap();
    assert_eq!(level(&store), 2, "FULL for every synced write");
    // Both are committed: a new connection (as after a crash) reads them.
    drop(store);
    let again = Store::open(dir.path().join("conduit.db")).unwrap();
    assert_eq!(deliveries(&again), ["routed-later", "acknowledged"]);
}

/// The sweep's reads go through their partial indexes, and the liveness rule looks each record
/// up by its key: a sweep with nothing to do reads nothing of the history.
fn assert_sweep_reads_use_their_indexes(conn: &Connection) {
    assert_uses(
        conn,
        retention::SQL_CANDIDATES,
        "artifacts",
        "artifacts_retained",
    );
    assert_uses(
        conn,
        retention::SQL_PURGING,
        "artifacts",
        "artifacts_purging",
    );
    let live = plan(conn, refs::SQL_LIVE);
    for line in &live {
        // The outer `SELECT EXISTS (…)` is one constant row, not a table.
        let whole =
            line.starts_with("SCAN ") && !line.contains(" USING ") && line != "SCAN CONSTANT ROW";
        assert!(!whole, "the liveness rule scans a table: {live:#?}");
    }
    for table in ["r", "e", "w", "m", "x"] {
        assert!(
            live.iter()
                .any(|l| l.starts_with(&format!("SEARCH {table} USING"))),
            "the liveness rule does not look `{table}` up by key: {live:#?}"
        );
    }
}

#[test]
fn sweep_reads_use_their_indexes() {
    let (_dir, store) = temp_store();
    assert_sweep_reads_use_their_indexes(&store.writer.lock().unwrap());
    store
        .write(|tx| {
            for i in 0..200 {
                let sha = format!("{i:064x}");
                tx.record_artifact(&sha, 1, "f", None, "x", 1)?;
                tx.accept_event(
                    "s",
                    &i.to_string(),
                    "k",
                    &json!({"a": format!("sha256:{sha}")}),
                    1,
                )?;
            }
            Ok(())
        })
        .unwrap();
    let conn = store.writer.lock().unwrap();
    conn.execute_batch(
        "UPDATE artifacts SET removed_at = 2, purged_at = 3 WHERE id % 2 = 0; ANALYZE",
    )
    .unwrap();
    assert_sweep_reads_use_their_indexes(&conn);
}
