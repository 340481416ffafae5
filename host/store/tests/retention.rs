//! Retention in the store over real SQLite files and real content files: which records keep an
//! artifact alive, the sweep's order (age, then oldest first over the budget), the grace
//! period, crash safety (marked before deleted, finished by the next sweep), dry runs, content
//! no row records, and the WAL checkpoint.
//!
//! Invariant: every test opens its own store and content folder in a temporary directory and
//! passes times in; nothing sleeps.

use std::path::{Path, PathBuf};

use conduit_protocol::calls::Record;
use conduit_store::{ArtifactPolicy, RemovalReason, SWEEP_BATCH, Store, StoreError, WorkState};
use serde_json::json;

const DAY: i64 = 86_400_000;
const HOUR: i64 = 3_600_000;

struct Fixture {
    _dir: tempfile::TempDir,
    store: Store,
    content: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("conduit.db")).unwrap();
    let content = dir.path().join("sha256");
    std::fs::create_dir_all(&content).unwrap();
    Fixture {
        _dir: dir,
        store,
        content,
    }
}

fn digest(n: u32) -> String {
    format!("{n:064x}")
}

fn id(n: u32) -> String {
    format!("sha256:{}", digest(n))
}

impl Fixture {
    /// Stores content `n` of `size` bytes at time `at`: the file, then its row.
    fn stored(&self, n: u32, size: u64, at: i64) {
        std::fs::write(self.content.join(digest(n)), vec![b'x'; size as usize]).unwrap();
        self.store
            .write(|tx| tx.record_artifact(&digest(n), size, "f.bin", None, "ext", at))
            .unwrap();
    }

    fn on_disk(&self, n: u32) -> bool {
        self.content.join(digest(n)).exists()
    }

    fn kept(&self, n: u32) -> bool {
        self.store
            .read(|r| r.artifact_by_sha256(&digest(n)))
            .unwrap()
            .unwrap()
            .retained()
    }

    fn sweep(&self, policy: ArtifactPolicy, now: i64) -> conduit_store::ArtifactSweep {
        let dir = self.content.clone();
        self.store
            .sweep_artifacts(policy, now, false, |sha| delete(&dir, sha), &|| false)
            .unwrap()
    }

    fn live(&self, n: u32) -> bool {
        self.store.read(|r| r.artifact_live(&digest(n))).unwrap()
    }
}

fn delete(dir: &Path, sha: &str) -> std::io::Result<()> {
    std::fs::remove_file(dir.join(sha))
}

fn policy(max_age_ms: i64, max_bytes: u64, grace_ms: i64) -> ArtifactPolicy {
    ArtifactPolicy {
        max_age_ms,
        max_bytes,
        grace_ms,
    }
}

fn removed(s: &conduit_store::ArtifactSweep) -> Vec<(String, RemovalReason)> {
    s.removed
        .iter()
        .map(|r| (format!("sha256:{}", r.sha256), r.reason))
        .collect()
}

#[test]
fn content_past_its_age_goes_oldest_first_and_a_referenced_one_is_kept() {
    let f = fixture();
    f.stored(1, 10, DAY);
    f.stored(2, 10, 2 * DAY);
    f.stored(3, 10, 3 * DAY);
    f.stored(4, 10, 35 * DAY);
    // An unrouted Event mentions 2 in its payload: live.
    f.store
        .write(|tx| {
            tx.accept_event(
                "s",
                "d1",
                "report.ready",
                &json!({"report": id(2)}),
                3 * DAY,
            )
        })
        .unwrap();
    assert!(f.live(2) && !f.live(1));
    let now = 40 * DAY;
    let s = f.sweep(policy(30 * DAY, u64::MAX, HOUR), now);
    assert_eq!(
        removed(&s),
        vec![(id(1), RemovalReason::Age), (id(3), RemovalReason::Age)]
    );
    assert_eq!((s.kept_live, s.deleted, s.deleted_bytes), (1, 2, 20));
    assert!(!f.on_disk(1) && !f.on_disk(3), "removed content is deleted");
    assert!(f.on_disk(2) && f.on_disk(4), "live and young content stays");
    assert!(!f.kept(1) && f.kept(2) && !f.kept(3) && f.kept(4));
    // The live one is counted as touched now: its age starts again.
    let two = f
        .store
        .read(|r| r.artifact_by_sha256(&digest(2)))
        .unwrap()
        .unwrap();
    assert_eq!(two.touched_at_ms, now);
    let t = f.store.read(|r| r.artifact_totals()).unwrap();
    assert_eq!((t.retained, t.retained_bytes, t.removing), (2, 20, 0));
    // A second sweep at the same time has nothing to do.
    let again = f.sweep(policy(30 * DAY, u64::MAX, HOUR), now);
    assert!(again.removed.is_empty() && again.deleted == 0, "{again:?}");
}

#[test]
fn over_the_budget_the_oldest_no_live_record_needs_go_first_until_it_fits() {
    let f = fixture();
    f.stored(1, 100, DAY); // live
    f.stored(2, 200, 2 * DAY);
    f.stored(3, 300, 3 * DAY);
    f.stored(4, 50, 4 * DAY);
    f.store
        .write(|tx| {
            let ev = tx.accept_event("s", "d1", "k", &json!({"a": [id(1)]}), DAY)?;
            let w = tx.open_or_feed_work("k", "x", &[ev.event_id], true, DAY)?;
            tx.mark_routed(ev.event_id, Some(w), DAY)
        })
        .unwrap();
    assert!(f.live(1), "an Event of a Work not done keeps its artifacts");
    // 650 bytes against 400: 1 is live, 2 goes (450), 3 goes (150): within; 4 stays.
    let s = f.sweep(policy(365 * DAY, 400, 0), 5 * DAY);
    assert_eq!(
        removed(&s),
        vec![
            (id(2), RemovalReason::Budget),
            (id(3), RemovalReason::Budget)
        ]
    );
    assert_eq!(s.over_budget_bytes, 0);
    assert!(f.on_disk(1) && !f.on_disk(2) && !f.on_disk(3) && f.on_disk(4));
    // Exactly at the budget: nothing more goes.
    let s = f.sweep(policy(365 * DAY, 150, 0), 6 * DAY);
    assert!(s.removed.is_empty(), "{s:?}");
    // One byte under what is kept: the oldest that may go goes (4: 1 is live), and what is
    // left over the budget is reported.
    let s = f.sweep(policy(365 * DAY, 149, 0), 7 * DAY);
    assert_eq!(removed(&s), vec![(id(4), RemovalReason::Budget)]);
    assert_eq!(s.over_budget_bytes, 0);
    let s = f.sweep(policy(365 * DAY, 10, 0), 8 * DAY);
    assert!(s.removed.is_empty());
    assert_eq!(
        s.over_budget_bytes, 90,
        "the live artifact is over the budget alone"
    );
}

#[test]
fn each_kind_of_live_record_keeps_an_artifact_and_its_finished_form_does_not() {
    let f = fixture();
    for n in 1..=6 {
        f.stored(n, 1, 0);
    }
    let (work, event, planned, wait) = f
        .store
        .write(|tx| {
            let ev = tx.accept_event("s", "e1", "k", &json!({"x": id(1)}), 1)?;
            // Routed to no Work: history at once.
            let none = tx.accept_event("s", "e2", "k", &json!({"x": id(2)}), 1)?;
            tx.mark_routed(none.event_id, None, 2)?;
            let planned = tx.plan_emission("ext", "note", None, &json!({"y": id(3)}), 1)?;
            let wait = tx.create_wait("ext", "f", &format!("waiting for {}", id(4)), None, 0, 1)?;
            let other = tx.plan_emission("ext", "note", None, &json!({}), 1)?;
            let rec = Record::new("note", json!({"z": id(5)}));
            tx.commit_emission(other.emission_id, &[rec], 2)?;
            let w = tx.open_or_feed_work("k", "key", &[ev.event_id], false, 2)?;
            tx.mark_routed(ev.event_id, Some(w), 2)?;
            Ok((w, ev.event_id, planned.emission_id, wait))
        })
        .unwrap();
    assert_eq!(
        (1..=6).map(|n| f.live(n)).collect::<Vec<_>>(),
        [true, false, true, true, false, false],
        "open Work's event, routed-to-none event, planned emission, active wait, record, nothing"
    );
    let refs = f
        .store
        .read(|r| r.artifact_references(&digest(5), 10))
        .unwrap();
    assert_eq!(refs.total, 1);
    assert_eq!(
        serde_json::to_value(&refs.references[0]).unwrap(),
        json!({"record": "emission_record", "id": planned + 1, "live": false})
    );
    f.store
        .write(|tx| {
            tx.set_work_state(work, WorkState::Done, 3)?;
            tx.commit_emission(planned, &[], 3)?;
            tx.satisfy_wait(wait, event, 3)
        })
        .unwrap();
    assert!((1..=6).all(|n| !f.live(n)), "every record finished");
    let refs = f
        .store
        .read(|r| r.artifact_references(&digest(1), 10))
        .unwrap();
    assert_eq!(
        serde_json::to_value(&refs).unwrap(),
        json!({"references": [{"record": "event", "id": event, "live": false}], "total": 1})
    );
}

#[test]
fn a_reference_before_the_upload_and_the_grace_period_keep_new_content() {
    let f = fixture();
    // An Event names content not stored yet; the content comes later: it is live at once.
    f.store
        .write(|tx| tx.accept_event("s", "d1", "k", &json!({"later": id(7)}), DAY))
        .unwrap();
    f.stored(7, 10, 2 * DAY);
    assert!(f.live(7));
    // Content stored within the grace period stays, whatever the budget and age say.
    f.stored(8, 10, 10 * DAY);
    let s = f.sweep(policy(0, 0, HOUR), 10 * DAY + HOUR - 1);
    assert!(s.removed.is_empty(), "{s:?}");
    assert_eq!(s.over_budget_bytes, 20);
    // Stored again later (the same content sent again): touched, so kept again for the grace.
    f.stored(8, 10, 20 * DAY);
    let s = f.sweep(policy(0, 0, HOUR), 20 * DAY + HOUR - 1);
    assert!(s.removed.is_empty());
    // Mentioned by a new record: touched too.
    f.store
        .write(|tx| {
            let p = tx.plan_emission("ext", "n", None, &json!({"a": id(8)}), 30 * DAY)?;
            tx.fail_emission(p.emission_id, "no", 30 * DAY)
        })
        .unwrap();
    // At exactly the grace period it is still within it; a millisecond past, it goes.
    let s = f.sweep(policy(0, 0, HOUR), 30 * DAY + HOUR);
    assert!(s.removed.is_empty());
    let s = f.sweep(policy(0, 0, HOUR), 30 * DAY + HOUR + 1);
    assert_eq!(removed(&s), vec![(id(8), RemovalReason::Age)]);
}

#[test]
fn removal_is_marked_before_any_file_is_deleted_and_the_next_sweep_finishes_it() {
    let f = fixture();
    for n in 1..=3 {
        f.stored(n, 10, DAY);
    }
    // Every deletion fails, as after a crash between the mark and the unlink: the rows are
    // marked (no longer kept), the files are still there.
    let s = f
        .store
        .sweep_artifacts(
            policy(DAY, u64::MAX, 0),
            10 * DAY,
            false,
            |_| Err(std::io::Error::other("crash")),
            &|| false,
        )
        .unwrap();
    assert_eq!(
        (s.removed.len(), s.deleted, s.delete_errors.len()),
        (3, 0, 3)
    );
    assert!((1..=3).all(|n| f.on_disk(n) && !f.kept(n)));
    let t = f.store.read(|r| r.artifact_totals()).unwrap();
    assert_eq!((t.retained, t.removing, t.removing_bytes), (0, 3, 30));
    // A sweep that stops before it starts leaves everything for the next one.
    let stopped = f
        .store
        .sweep_artifacts(
            policy(DAY, u64::MAX, 0),
            10 * DAY,
            false,
            |_| Ok(()),
            &|| true,
        )
        .unwrap();
    assert_eq!(stopped.deleted, 0);
    // Content 2 is stored again before the next sweep: it is kept (checked on disk inside the
    // recording transaction), so the sweep must not delete its file.
    let back = f
        .store
        .write(|tx| {
            tx.record_stored_artifact(&digest(2), 10, "again.bin", None, "other", 11 * DAY, || {
                true
            })
        })
        .unwrap();
    assert!(back.retained());
    assert_eq!(back.extension, "ext", "the creator stays the first");
    let s = f.sweep(policy(DAY, u64::MAX, 0), 11 * DAY);
    assert_eq!((s.removed.len(), s.deleted, s.deleted_bytes), (0, 2, 20));
    assert!(!f.on_disk(1) && f.on_disk(2) && !f.on_disk(3));
    let t = f.store.read(|r| r.artifact_totals()).unwrap();
    assert_eq!((t.retained, t.removing), (1, 0));
}

#[test]
fn content_missing_inside_its_recording_transaction_records_nothing() {
    let f = fixture();
    f.stored(1, 10, DAY);
    f.sweep(policy(DAY, u64::MAX, 0), 10 * DAY);
    assert!(!f.kept(1) && !f.on_disk(1));
    let err = f
        .store
        .write(|tx| tx.record_stored_artifact(&digest(1), 10, "x", None, "ext", 11 * DAY, || false))
        .unwrap_err();
    assert!(matches!(err, StoreError::ContentMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("send it again"), "{err}");
    assert!(!f.kept(1), "the row stays removed");
}

#[test]
fn a_dry_run_writes_and_deletes_nothing_and_lists_what_a_sweep_would_remove() {
    let f = fixture();
    for n in 1..=4 {
        f.stored(n, 10, i64::from(n) * DAY);
    }
    let dir = f.content.clone();
    let dry = f
        .store
        .sweep_artifacts(
            policy(30 * DAY, 25, 0),
            33 * DAY,
            true,
            |sha| delete(&dir, sha),
            &|| false,
        )
        .unwrap();
    // 1, 2 past 30 days at day 33; then 20 bytes against 25: within.
    assert_eq!(
        removed(&dry),
        vec![(id(1), RemovalReason::Age), (id(2), RemovalReason::Age)]
    );
    assert!((1..=4).all(|n| f.on_disk(n) && f.kept(n)));
    let real = f.sweep(policy(30 * DAY, 25, 0), 33 * DAY);
    assert_eq!(
        real.removed, dry.removed,
        "the dry run said what the sweep did"
    );
}

#[test]
fn a_large_sweep_is_many_short_transactions() {
    let f = fixture();
    let n = 3 * SWEEP_BATCH + 7;
    f.store
        .write(|tx| {
            for i in 0..n {
                tx.record_artifact(&digest(i), 1, "f", None, "ext", DAY)?;
            }
            Ok(())
        })
        .unwrap();
    let s = f.sweep(policy(DAY, u64::MAX, 0), 3 * DAY);
    assert_eq!(s.removed.len() as u32, n);
    // Phase 1 and phase 2 each take at least n / SWEEP_BATCH transactions.
    assert!(
        s.tx.transactions >= 2 * u64::from(n.div_ceil(SWEEP_BATCH)),
        "{:?}",
        s.tx
    );
}

#[test]
fn content_no_row_records_is_removed_and_recorded_content_stays() {
    let f = fixture();
    f.stored(1, 10, DAY);
    std::fs::write(f.content.join(digest(2)), b"orphan").unwrap();
    f.stored(3, 10, DAY);
    f.sweep(policy(DAY, u64::MAX, 0), 10 * DAY); // removes 1 and 3: rows kept, purged
    std::fs::write(f.content.join(digest(3)), b"back, unrecorded").unwrap();
    let names = vec![digest(1), digest(2), digest(3), digest(4)];
    let dir = f.content.clone();
    let (dry, _) = f
        .store
        .remove_unrecorded(&names, true, |sha| delete(&dir, sha))
        .unwrap();
    assert_eq!(dry, vec![digest(1), digest(2), digest(3), digest(4)]);
    assert!(f.on_disk(2) && f.on_disk(3), "a dry run deletes nothing");
    f.stored(4, 10, 11 * DAY);
    let (gone, tx) = f
        .store
        .remove_unrecorded(&names, false, |sha| delete(&dir, sha))
        .unwrap();
    assert_eq!(
        gone,
        vec![digest(2), digest(3)],
        "1 was gone already; 4 is kept"
    );
    assert!(tx.transactions >= 1);
    assert!(!f.on_disk(2) && !f.on_disk(3) && f.on_disk(4));
}

#[test]
fn the_wal_is_truncated_when_idle_and_checkpointed_passively_while_a_reader_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conduit.db");
    let wal = dir.path().join("conduit.db-wal");
    let store = Store::open(&path).unwrap();
    let grow = |from: u32| {
        store
            .write(|tx| {
                let filler = "w".repeat(2000);
                for i in from..from + 2000 {
                    tx.accept_event("s", &i.to_string(), "k", &json!({"f": filler}), 1)?;
                }
                Ok(())
            })
            .unwrap();
    };
    grow(0);
    let before = std::fs::metadata(&wal).unwrap().len();
    assert!(before > 1 << 20, "the WAL grew to {before} bytes");
    let c = store.checkpoint_wal().unwrap();
    let after = std::fs::metadata(&wal).unwrap().len();
    assert!(c.truncated, "{c:?}");
    assert_eq!(after, 0, "the WAL went from {before} to {after} bytes");
    // Nothing was lost.
    assert_eq!(store.read(|r| r.latest_event_id()).unwrap(), Some(2000));

    // A reader holding a snapshot older than the last write: only a passive checkpoint.
    grow(10_000);
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let store = &store;
        s.spawn(move || {
            store
                .read(|r| {
                    r.latest_event_id()?;
                    held_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    Ok(())
                })
                .unwrap();
        });
        held_rx.recv().unwrap();
        grow(20_000);
        let c = store.checkpoint_wal().unwrap();
        assert!(!c.truncated, "a reader holds frames: {c:?}");
        assert!(std::fs::metadata(&wal).unwrap().len() > 0);
        release_tx.send(()).unwrap();
    });
    let c = store.checkpoint_wal().unwrap();
    assert!(c.truncated, "{c:?}");
    assert_eq!(std::fs::metadata(&wal).unwrap().len(), 0);
}

#[test]
fn a_store_from_before_retention_gets_its_totals_and_touch_times_from_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conduit.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        for (i, m) in conduit_store::MIGRATIONS[..2].iter().enumerate() {
            conn.execute_batch(m).unwrap();
            conn.pragma_update(None, "user_version", i as i64 + 1)
                .unwrap();
        }
        conn.execute_batch(&format!(
            "INSERT INTO artifacts (sha256, size, name, extension, created_at) VALUES \
             ('{}', 5, 'a', 'x', 100), ('{}', 7, 'b', 'x', 200)",
            digest(1),
            digest(2)
        ))
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    let t = store.read(|r| r.artifact_totals()).unwrap();
    assert_eq!((t.retained, t.retained_bytes), (2, 12));
    let a = store
        .read(|r| r.artifact_by_sha256(&digest(2)))
        .unwrap()
        .unwrap();
    assert_eq!((a.touched_at_ms, a.removed_at_ms), (200, None));
}
