//! The store's public API over real SQLite files: transactions (BEGIN IMMEDIATE, snapshot reads,
//! rollback on error and panic), each record's lifecycle, and paging bounds.
//!
//! Invariant: every test opens its own file in a temporary directory, and passes times in
//! explicitly; nothing here reads the clock or sleeps to make a point.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use conduit_protocol::calls::{Record, Work};
use conduit_store::{EmissionState, MAX_PAGE, Store, StoreError, WaitState, WorkState};
use serde_json::json;

fn temp_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("conduit.db")).unwrap();
    (dir, store)
}

fn n_events(store: &Store) -> usize {
    store
        .read(|r| r.list_events(None, None, MAX_PAGE))
        .unwrap()
        .len()
}

// ---- transactions ------------------------------------------------------------------------

#[test]
fn a_held_write_transaction_blocks_other_writers_but_not_readers() {
    let (_dir, store) = temp_store();
    store
        .write(|tx| tx.accept_event("s", "committed", "k", &json!({}), 1))
        .unwrap();

    let (held_tx, held_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let first_committed = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (store, first_committed) = (&store, &first_committed);
        s.spawn(move || {
            store
                .write(|tx| {
                    tx.accept_event("s", "uncommitted", "k", &json!({}), 2)?;
                    // The writer sees its own uncommitted Event.
                    assert_eq!(tx.list_events(None, None, 10)?.len(), 2);
                    // A read from inside the write (an extension's read-only callback during an
                    // in-transaction call) runs on a reader and sees the committed snapshot.
                    assert_eq!(store.read(|r| r.list_events(None, None, 10))?.len(), 1);
                    held_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    first_committed.store(true, Ordering::SeqCst);
                    Ok(())
                })
                .unwrap();
        });
        held_rx.recv().unwrap();

        // Another connection, on another thread, cannot begin a write while it is held.
        let path = store.path().to_owned();
        let other = std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_millis(100)).unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap_err()
        })
        .join()
        .unwrap();
        assert_eq!(
            other.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy),
            "{other}"
        );

        // A reader on another thread reads the last committed snapshot meanwhile.
        let seen = s
            .spawn(|| store.read(|r| r.list_events(None, None, 10)).unwrap())
            .join()
            .unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].event.delivery_id, "committed");

        // A second write through the store waits for the first to commit.
        let second = s.spawn(|| {
            store
                .write(|tx| {
                    assert!(first_committed.load(Ordering::SeqCst));
                    tx.accept_event("s", "second", "k", &json!({}), 3)
                })
                .unwrap()
        });
        release_tx.send(()).unwrap();
        assert!(!second.join().unwrap().duplicate);
    });
    assert_eq!(n_events(&store), 3);
}

#[test]
fn an_error_rolls_back_everything() {
    let (_dir, store) = temp_store();
    let err = store
        .write(|tx| {
            let ev = tx.accept_event("s", "d", "k", &json!({}), 1)?;
            let work = tx.open_or_feed_work("k", "key", &[ev.event_id], true, 1)?;
            tx.mark_routed(ev.event_id, Some(work), 1)?;
            tx.create_timer("x", "every", "1m", 5, 1)?;
            // Fails: no such Work.
            tx.set_work_state(999, WorkState::Done, 1)
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotFound {
                record: "work",
                id: 999
            }
        ),
        "{err:?}"
    );
    store
        .read(|r| {
            assert!(r.list_events(None, None, 10)?.is_empty());
            assert!(r.list_work(None, 10)?.is_empty());
            assert!(r.due_timers(i64::MAX, 10)?.is_empty());
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_panic_rolls_back_and_the_store_stays_usable() {
    let (_dir, store) = temp_store();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store
            .write(|tx| -> Result<(), StoreError> {
                tx.accept_event("s", "d", "k", &json!({}), 1)?;
                panic!("a bug in the closure")
            })
            .ok();
    }));
    assert!(res.is_err());
    assert_eq!(n_events(&store), 0);
    let again = store
        .write(|tx| tx.accept_event("s", "d", "k", &json!({}), 2))
        .unwrap();
    assert!(!again.duplicate);
    assert_eq!(n_events(&store), 1);
}

#[test]
fn reads_queue_for_a_reader_and_all_complete() {
    let (_dir, store) = temp_store();
    store
        .write(|tx| tx.accept_event("s", "d", "k", &json!({}), 1))
        .unwrap();
    // More concurrent reads than readers: the extra ones wait for a reader, then run.
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..12)
            .map(|_| {
                s.spawn(|| {
                    store
                        .read(|r| {
                            std::thread::sleep(Duration::from_millis(20));
                            r.list_events(None, None, 10)
                        })
                        .unwrap()
                        .len()
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), 1);
        }
    });
}

// ---- events ------------------------------------------------------------------------------

#[test]
fn a_duplicate_delivery_returns_the_first_event_and_writes_nothing() {
    let (_dir, store) = temp_store();
    let first = store
        .write(|tx| tx.accept_event("github", "d-1", "push", &json!({"n": 1}), 10))
        .unwrap();
    assert!(!first.duplicate);
    let again = store
        .write(|tx| tx.accept_event("github", "d-1", "other", &json!({"n": 2}), 20))
        .unwrap();
    assert_eq!(again.event_id, first.event_id);
    assert!(again.duplicate);
    // The same delivery id from another source is another delivery.
    let other = store
        .write(|tx| tx.accept_event("slack", "d-1", "push", &json!({}), 30))
        .unwrap();
    assert!(!other.duplicate);
    assert_ne!(other.event_id, first.event_id);

    let ev = store.read(|r| r.event(first.event_id)).unwrap().unwrap();
    assert_eq!(ev.event.kind, "push");
    assert_eq!(ev.event.payload, json!({"n": 1}));
    assert_eq!(ev.event.accepted_at_ms, 10);
    assert_eq!(n_events(&store), 2);
}

#[test]
fn event_routing_lifecycle() {
    let (_dir, store) = temp_store();
    let ids: Vec<i64> = store
        .write(|tx| {
            (0..3)
                .map(|i| {
                    tx.accept_event("s", &format!("d{i}"), "k", &json!({"i": i}), 100 + i)
                        .map(|a| a.event_id)
                })
                .collect()
        })
        .unwrap();
    assert_eq!(store.read(|r| r.latest_event_id()).unwrap(), Some(ids[2]));

    let unrouted = store.read(|r| r.unrouted_events(10)).unwrap();
    assert_eq!(unrouted.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
    // Oldest first, bounded by the limit.
    let first_two = store.read(|r| r.unrouted_events(2)).unwrap();
    assert_eq!(first_two.len(), 2);
    assert_eq!(first_two[0].id, ids[0]);

    let work = store
        .write(|tx| {
            let work = tx.open_or_feed_work("k", "key", &[ids[0]], true, 200)?;
            tx.mark_routed(ids[0], Some(work), 200)?;
            tx.mark_routed(ids[1], None, 200)?;
            Ok(work)
        })
        .unwrap();
    let unrouted = store.read(|r| r.unrouted_events(10)).unwrap();
    assert_eq!(
        unrouted.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![ids[2]]
    );

    let routed = store.read(|r| r.event(ids[0])).unwrap().unwrap();
    assert_eq!(routed.routed_at_ms, Some(200));
    assert_eq!(routed.work_id, Some(work));
    let dropped = store.read(|r| r.event(ids[1])).unwrap().unwrap();
    assert_eq!((dropped.routed_at_ms, dropped.work_id), (Some(200), None));

    // Routing twice, or routing nothing, is refused with the reason.
    let err = store
        .write(|tx| tx.mark_routed(ids[0], None, 300))
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::WrongState {
                record: "event",
                ..
            }
        ),
        "{err:?}"
    );
    let err = store
        .write(|tx| tx.mark_routed(999, None, 300))
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotFound {
                record: "event",
                id: 999
            }
        ),
        "{err:?}"
    );
    assert!(store.read(|r| r.event(999)).unwrap().is_none());

    // A Wait's view: the Events after a cursor.
    let after = store.read(|r| r.events_after(ids[0], 10)).unwrap();
    assert_eq!(after.iter().map(|e| e.id).collect::<Vec<_>>(), ids[1..]);
}

#[test]
fn list_events_pages_by_id_and_source() {
    let (_dir, store) = temp_store();
    store
        .write(|tx| {
            for i in 0..10 {
                let source = if i % 2 == 0 { "even" } else { "odd" };
                tx.accept_event(source, &i.to_string(), "k", &json!(i), i)?;
            }
            Ok(())
        })
        .unwrap();
    let page1 = store.read(|r| r.list_events(None, None, 4)).unwrap();
    let page2 = store
        .read(|r| r.list_events(Some(page1[3].event.id), None, 4))
        .unwrap();
    let page3 = store
        .read(|r| r.list_events(Some(page2[3].event.id), None, 4))
        .unwrap();
    let ids: Vec<i64> = [page1, page2, page3]
        .concat()
        .iter()
        .map(|e| e.event.id)
        .collect();
    assert_eq!(ids, (1..=10).collect::<Vec<_>>());

    let odd = store.read(|r| r.list_events(None, Some("odd"), 3)).unwrap();
    assert_eq!(
        odd.iter().map(|e| e.event.id).collect::<Vec<_>>(),
        vec![2, 4, 6]
    );
    let odd = store
        .read(|r| r.list_events(Some(6), Some("odd"), 3))
        .unwrap();
    assert_eq!(
        odd.iter().map(|e| e.event.id).collect::<Vec<_>>(),
        vec![8, 10]
    );
    assert!(
        store
            .read(|r| r.list_events(None, Some("none"), 3))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn paging_limits_are_1_to_200() {
    let (_dir, store) = temp_store();
    store
        .write(|tx| {
            for i in 0..250 {
                tx.accept_event("s", &i.to_string(), "k", &json!(i), i)?;
            }
            Ok(())
        })
        .unwrap();
    for bad in [0, MAX_PAGE + 1] {
        let check = |res: Result<usize, StoreError>| {
            let err = res.unwrap_err();
            assert!(
                matches!(err, StoreError::InvalidLimit { limit, max: 200 } if limit == bad),
                "{err:?}"
            );
            assert_eq!(err.to_string(), format!("limit {bad} is outside 1..=200"));
        };
        check(store.read(|r| r.list_events(None, None, bad).map(|v| v.len())));
        check(store.read(|r| r.unrouted_events(bad).map(|v| v.len())));
        check(store.read(|r| r.events_after(0, bad).map(|v| v.len())));
        check(store.read(|r| r.list_work(None, bad).map(|v| v.len())));
        check(store.read(|r| r.open_work(bad).map(|v| v.len())));
        check(store.read(|r| r.due_timers(0, bad).map(|v| v.len())));
        check(store.read(|r| r.active_waits(None, bad).map(|v| v.len())));
        check(store.read(|r| r.planned_emissions(bad).map(|v| v.len())));
    }
    for (good, expect) in [(1, 1), (MAX_PAGE, 200)] {
        assert_eq!(
            store
                .read(|r| r.list_events(None, None, good))
                .unwrap()
                .len(),
            expect
        );
        assert_eq!(
            store.read(|r| r.unrouted_events(good)).unwrap().len(),
            expect
        );
        assert_eq!(
            store.read(|r| r.events_after(0, good)).unwrap().len(),
            expect
        );
    }
}

// ---- work --------------------------------------------------------------------------------

#[test]
fn work_lifecycle() {
    let (_dir, store) = temp_store();
    let ev: Vec<i64> = store
        .write(|tx| {
            (0..4)
                .map(|i| {
                    tx.accept_event("s", &i.to_string(), "k", &json!({}), 1)
                        .map(|a| a.event_id)
                })
                .collect()
        })
        .unwrap();

    // Queued without start: open.
    let w = store
        .write(|tx| tx.open_or_feed_work("review", "pr-1", &[ev[0]], false, 10))
        .unwrap();
    let rec = store.read(|r| r.work(w)).unwrap().unwrap();
    assert_eq!(rec.state, WorkState::Open);
    assert_eq!(rec.event_ids, vec![ev[0]]);
    assert_eq!((rec.created_at_ms, rec.updated_at_ms), (10, 10));

    // Fed again with start: the same Work, now ready; a repeated input is not added twice.
    let again = store
        .write(|tx| tx.open_or_feed_work("review", "pr-1", &[ev[1], ev[0]], true, 20))
        .unwrap();
    assert_eq!(again, w);
    let rec = store.read(|r| r.work(w)).unwrap().unwrap();
    assert_eq!(rec.state, WorkState::Ready);
    assert_eq!(rec.event_ids, vec![ev[0], ev[1]]);
    assert_eq!(rec.updated_at_ms, 20);

    // Fed without start: stays ready.
    store
        .write(|tx| tx.open_or_feed_work("review", "pr-1", &[ev[2]], false, 30))
        .unwrap();
    assert_eq!(
        store.read(|r| r.work(w)).unwrap().unwrap().state,
        WorkState::Ready
    );

    // Another key, and the same key of another kind, are other Work.
    let (w2, w3) = store
        .write(|tx| {
            Ok((
                tx.open_or_feed_work("review", "pr-2", &[], false, 40)?,
                tx.open_or_feed_work("deploy", "pr-1", &[], true, 40)?,
            ))
        })
        .unwrap();
    assert!(w2 != w && w3 != w && w2 != w3);
    let open: Vec<i64> = store
        .read(|r| r.open_work(10))
        .unwrap()
        .iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(open, vec![w, w2, w3]);

    // Done: out of the live set, and its key opens a new Work.
    store
        .write(|tx| tx.set_work_state(w, WorkState::Done, 50))
        .unwrap();
    let open: Vec<i64> = store
        .read(|r| r.open_work(10))
        .unwrap()
        .iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(open, vec![w2, w3]);
    let w4 = store
        .write(|tx| tx.open_or_feed_work("review", "pr-1", &[ev[3]], true, 60))
        .unwrap();
    assert_ne!(w4, w);

    // Reopening the old one while the new one is live breaks the one-live-Work-per-key rule.
    let err = store
        .write(|tx| tx.set_work_state(w, WorkState::Open, 70))
        .unwrap_err();
    assert!(matches!(err, StoreError::Sql { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!("set work {w} to open")),
        "{err}"
    );

    // The history list includes done Work; the protocol shape carries the state as text.
    let all = store.read(|r| r.list_work(None, 10)).unwrap();
    assert_eq!(all.len(), 4);
    let page2 = store.read(|r| r.list_work(Some(all[1].id), 10)).unwrap();
    assert_eq!(page2.len(), 2);
    let wire: Work = all[0].clone().into();
    assert_eq!(wire.state, "done");
    assert_eq!(wire.event_ids, vec![ev[0], ev[1], ev[2]]);

    // Feeding an Event that does not exist fails and says which.
    let err = store
        .write(|tx| tx.open_or_feed_work("review", "pr-9", &[999], true, 80))
        .unwrap_err();
    assert!(err.to_string().contains("with event 999"), "{err}");
    let err = store
        .write(|tx| tx.set_work_state(999, WorkState::Done, 1))
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::NotFound {
            record: "work",
            id: 999
        }
    ));
}

// ---- timers ------------------------------------------------------------------------------

#[test]
fn timer_lifecycle() {
    let (_dir, store) = temp_store();
    let (late, early, later) = store
        .write(|tx| {
            Ok((
                tx.create_timer("digest", "every", "15m", 2_000, 1)?,
                tx.create_timer("digest", "cron", "0 9 * * *", 1_000, 1)?,
                tx.create_timer("digest", "every", "1h", 9_000, 1)?,
            ))
        })
        .unwrap();
    assert!(store.read(|r| r.due_timers(999, 10)).unwrap().is_empty());
    let due: Vec<i64> = store
        .read(|r| r.due_timers(2_000, 10))
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(due, vec![early, late], "earliest first, inclusive of now");

    store
        .write(|tx| {
            tx.reschedule_timer(early, Some(5_000), 1_000)?;
            tx.reschedule_timer(late, None, 2_000)
        })
        .unwrap();
    let t = store.read(|r| r.timer(early)).unwrap().unwrap();
    assert_eq!(
        (t.next_at_ms, t.last_fired_at_ms),
        (Some(5_000), Some(1_000))
    );
    assert!(t.is_active());
    assert_eq!(t.spec, "0 9 * * *");
    let stopped = store.read(|r| r.timer(late)).unwrap().unwrap();
    assert!(!stopped.is_active());
    assert_eq!(stopped.last_fired_at_ms, Some(2_000));

    let due: Vec<i64> = store
        .read(|r| r.due_timers(10_000, 10))
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(due, vec![early, later], "a stopped timer is never due");
    let due = store.read(|r| r.due_timers(10_000, 1)).unwrap();
    assert_eq!(due.len(), 1);

    let err = store
        .write(|tx| tx.reschedule_timer(999, None, 1))
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::NotFound {
            record: "timer",
            id: 999
        }
    ));
}

// ---- waits -------------------------------------------------------------------------------

#[test]
fn wait_lifecycle() {
    let (_dir, store) = temp_store();
    let (w1, w2, ev) = store
        .write(|tx| {
            let ev = tx
                .accept_event("ci", "run-1", "ci.finished", &json!({}), 1)?
                .event_id;
            let after = tx.latest_event_id()?.unwrap_or(0);
            let w1 = tx.create_wait("deps", "ci_green", "pr-1", None, after, 2)?;
            let w2 = tx.create_wait("deps", "ci_green", "pr-2", None, 0, 2)?;
            Ok((w1, w2, ev))
        })
        .unwrap();
    let wait = store.read(|r| r.wait(w1)).unwrap().unwrap();
    assert_eq!(wait.cursor_event_id, ev);
    assert_eq!(wait.state, WaitState::Active);
    assert_eq!(wait.subject, "pr-1");

    let active: Vec<i64> = store
        .read(|r| r.active_waits(None, 10))
        .unwrap()
        .iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(active, vec![w1, w2]);
    // Rotation: the next page starts after the last id seen.
    let rest = store.read(|r| r.active_waits(Some(w1), 10)).unwrap();
    assert_eq!(rest.iter().map(|w| w.id).collect::<Vec<_>>(), vec![w2]);

    // The cursor moves forward only.
    store
        .write(|tx| {
            tx.advance_wait(w2, 5)?;
            tx.advance_wait(w2, 3)
        })
        .unwrap();
    assert_eq!(
        store.read(|r| r.wait(w2)).unwrap().unwrap().cursor_event_id,
        5
    );

    store.write(|tx| tx.satisfy_wait(w1, ev, 10)).unwrap();
    let wait = store.read(|r| r.wait(w1)).unwrap().unwrap();
    assert_eq!(wait.state, WaitState::Satisfied);
    assert_eq!(wait.satisfied_by_event_id, Some(ev));
    assert_eq!(wait.satisfied_at_ms, Some(10));
    let active: Vec<i64> = store
        .read(|r| r.active_waits(None, 10))
        .unwrap()
        .iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(active, vec![w2]);

    // A satisfied Wait does not change again.
    let err = store.write(|tx| tx.satisfy_wait(w1, ev, 11)).unwrap_err();
    assert!(
        matches!(err, StoreError::WrongState { record: "wait", ref state, .. } if state == "satisfied"),
        "{err:?}"
    );
    let err = store.write(|tx| tx.advance_wait(w1, 99)).unwrap_err();
    assert!(matches!(err, StoreError::WrongState { .. }), "{err:?}");
    let err = store.write(|tx| tx.advance_wait(999, 1)).unwrap_err();
    assert!(matches!(
        err,
        StoreError::NotFound {
            record: "wait",
            id: 999
        }
    ));
}

// ---- emissions ---------------------------------------------------------------------------

#[test]
fn emission_lifecycle() {
    let (_dir, store) = temp_store();
    let (a, b) = store
        .write(|tx| {
            let work = tx.open_or_feed_work("k", "key", &[], true, 1)?;
            Ok((
                tx.plan_emission("notes", "note", Some(work), &json!({"text": "hi"}), 5)?,
                tx.plan_emission("notes", "note", None, &json!({}), 6)?,
            ))
        })
        .unwrap();
    for p in [&a, &b] {
        let prefix = format!("em-{}-", p.emission_id);
        let nonce = p.commit_id.strip_prefix(&prefix).unwrap();
        assert_eq!(nonce.len(), 16, "{}", p.commit_id);
        assert!(
            nonce
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }
    assert_ne!(a.commit_id, b.commit_id);

    let planned = store.read(|r| r.planned_emissions(10)).unwrap();
    assert_eq!(
        planned.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![a.emission_id, b.emission_id]
    );
    assert_eq!(planned[0].commit_id, a.commit_id);
    assert_eq!(planned[0].payload, json!({"text": "hi"}));
    assert_eq!(planned[0].state, EmissionState::Planned);

    let records = vec![
        Record::new("note", json!({"id": 1})),
        Record::new("index", json!(["a", "b"])),
    ];
    store
        .write(|tx| {
            tx.commit_emission(a.emission_id, &records, 7)?;
            tx.fail_emission(b.emission_id, "deadline exceeded", 8)
        })
        .unwrap();
    let done = store.read(|r| r.emission(a.emission_id)).unwrap().unwrap();
    assert_eq!(done.state, EmissionState::Committed);
    assert_eq!(done.records, records);
    assert_eq!(done.finished_at_ms, Some(7));
    let failed = store.read(|r| r.emission(b.emission_id)).unwrap().unwrap();
    assert_eq!(failed.state, EmissionState::Failed);
    assert_eq!(failed.error.as_deref(), Some("deadline exceeded"));
    assert!(failed.records.is_empty());
    assert!(store.read(|r| r.planned_emissions(10)).unwrap().is_empty());

    // An Emission leaves `planned` once; a repeated commit writes no second set of records.
    let err = store
        .write(|tx| tx.commit_emission(a.emission_id, &records, 9))
        .unwrap_err();
    assert!(
        matches!(err, StoreError::WrongState { record: "emission", ref state, .. } if state == "committed"),
        "{err:?}"
    );
    assert_eq!(
        store
            .read(|r| r.emission(a.emission_id))
            .unwrap()
            .unwrap()
            .records
            .len(),
        2
    );
    let err = store.write(|tx| tx.fail_emission(999, "x", 1)).unwrap_err();
    assert!(matches!(
        err,
        StoreError::NotFound {
            record: "emission",
            id: 999
        }
    ));
}

// ---- artifacts ---------------------------------------------------------------------------

#[test]
fn artifact_lifecycle() {
    let (_dir, store) = temp_store();
    let sha = "ab".repeat(32);
    let first = store
        .write(|tx| tx.record_artifact(&sha, 42, "report.txt", Some("text/plain"), "notes", 1))
        .unwrap();
    assert_eq!(first.size, 42);
    assert_eq!(first.media_type.as_deref(), Some("text/plain"));

    // Idempotent on the digest: the first row stays (name, media type, creator), and it
    // counts as stored again now for retention.
    assert_eq!(first.touched_at_ms, 1);
    let again = store
        .write(|tx| tx.record_artifact(&sha, 42, "copy.txt", None, "echo", 2))
        .unwrap();
    assert_eq!(
        again,
        conduit_store::Artifact {
            touched_at_ms: 2,
            ..first.clone()
        }
    );
    assert_eq!(
        store.read(|r| r.artifact(first.id)).unwrap(),
        Some(again.clone())
    );
    assert_eq!(
        store.read(|r| r.artifact_by_sha256(&sha)).unwrap(),
        Some(again.clone())
    );

    let err = store
        .write(|tx| tx.record_artifact(&sha, 43, "x", None, "notes", 3))
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::ArtifactMismatch {
                recorded: 42,
                size: 43,
                ..
            }
        ),
        "{err:?}"
    );
    for bad in ["AB".repeat(32), "ab".repeat(31), "zz".repeat(32)] {
        let err = store
            .write(|tx| tx.record_artifact(&bad, 1, "x", None, "notes", 3))
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Invalid {
                    field: "sha256",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    assert!(store.read(|r| r.artifact(999)).unwrap().is_none());
}

// ---- ended by hand ---------------------------------------------------------------------------

#[test]
fn a_timer_deleted_a_wait_cancelled_and_a_work_closed_are_kept_and_leave_the_live_reads() {
    use conduit_store::Ended;
    let (_dir, store) = temp_store();
    let (timer, wait, satisfied, work) = store
        .write(|tx| {
            let e = tx.accept_event("s", "d1", "job.x", &json!({}), 1)?.event_id;
            let timer = tx.create_timer("ext", "tick", "every 1m", 5, 1)?;
            let wait = tx.create_wait("ext", "f", "a", None, 0, 1)?;
            let satisfied = tx.create_wait("ext", "f", "b", None, 0, 1)?;
            tx.satisfy_wait(satisfied, e, 2)?;
            let work = tx.open_or_feed_work("job", "k", &[e], true, 2)?;
            Ok((timer, wait, satisfied, work))
        })
        .unwrap();
    let ended = store
        .write(|tx| {
            Ok((
                tx.delete_timer(timer, 10)?,
                tx.cancel_wait(wait, 11)?,
                tx.cancel_wait(satisfied, 11)?,
                tx.close_work(work, Some("handled by hand"), 12)?,
                tx.delete_timer(999, 10)?,
            ))
        })
        .unwrap();
    let Some(Ended::Now(t)) = ended.0 else {
        panic!("{:?}", ended.0)
    };
    assert_eq!((t.deleted_at_ms, t.next_at_ms), (Some(10), None));
    let Some(Ended::Now(w)) = ended.1 else {
        panic!("{:?}", ended.1)
    };
    assert_eq!(
        (w.state, w.cancelled_at_ms),
        (WaitState::Cancelled, Some(11))
    );
    // A satisfied wait is not cancelled; it stays as it was.
    let Some(Ended::Refused(s)) = ended.2 else {
        panic!("{:?}", ended.2)
    };
    assert_eq!(s.state, WaitState::Satisfied);
    let Some(Ended::Now(k)) = ended.3 else {
        panic!("{:?}", ended.3)
    };
    assert_eq!(k.state, WorkState::Done);
    assert_eq!(k.closed_at_ms, Some(12));
    assert_eq!(k.close_reason.as_deref(), Some("handled by hand"));
    assert_eq!(ended.4, None);
    // Again: already so, nothing changes.
    let again = store
        .write(|tx| {
            Ok((
                tx.delete_timer(timer, 20)?,
                tx.cancel_wait(wait, 20)?,
                tx.close_work(work, None, 20)?,
            ))
        })
        .unwrap();
    assert!(matches!(again.0, Some(Ended::Already(t)) if t.deleted_at_ms == Some(10)));
    assert!(matches!(again.1, Some(Ended::Already(w)) if w.cancelled_at_ms == Some(11)));
    assert!(matches!(again.2, Some(Ended::Already(w)) if w.closed_at_ms == Some(12)));
    // Kept in the lists, gone from the live reads; the Work's key opens a new one.
    store
        .read(|r| {
            assert_eq!(r.list_timers(None, 10)?.len(), 1);
            assert!(r.due_timers(i64::MAX, 10)?.is_empty());
            assert_eq!(r.list_waits(None, 10)?.len(), 2);
            assert!(r.active_waits(None, 10)?.is_empty());
            assert!(r.open_work(10)?.is_empty());
            Ok(())
        })
        .unwrap();
    let next = store
        .write(|tx| {
            let e = tx
                .accept_event("s", "d2", "job.x", &json!({}), 30)?
                .event_id;
            tx.open_or_feed_work("job", "k", &[e], true, 30)
        })
        .unwrap();
    assert_ne!(next, work);
    // A Work the host finished is not closed by hand.
    let refused = store
        .write(|tx| {
            tx.set_work_state(next, WorkState::Done, 31)?;
            tx.close_work(next, None, 32)
        })
        .unwrap();
    assert!(matches!(refused, Some(Ended::Refused(w)) if w.closed_at_ms.is_none()));
}
