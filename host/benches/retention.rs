//! What a retention sweep costs against retained history, and how long it holds the writer.
//!
//! Run with
//!
//! ```text
//! make bench-history                      # this after the history benchmark
//! cargo bench -p conduit-host --bench retention
//! CONDUIT_RETENTION_SIZES=1000,100000 cargo bench -p conduit-host --bench retention
//! ```
//!
//! For each size N it makes a state directory whose store holds N Events of about 1 KiB in
//! threads of 25, each thread's Work done, and one artifact per thread (a 1 KiB content file on
//! disk) that the thread's first Event mentions, all stored 31 days before the clock the bench
//! passes in; `logs/` holds ten packages' logs of earlier runs. Then it times the daemon's own
//! sweep (`conduit_host::retention::sweep`, the function `conduit gc` and the periodic sweep
//! call) with the default settings:
//!
//! - catch-up: the first sweep, which removes the content of every one of the N/25 artifacts
//!   (their records are all finished): its cost follows what it removes, not the history;
//! - steady: 100 new artifacts past their age and nobody's, and 100 past their age that an
//!   unrouted Event mentions, then one sweep (it removes the first 100 and keeps the others),
//!   median of 10 after a warm-up: the sweep every 10 minutes of a daemon that keeps up;
//! - idle: a sweep with nothing to remove, median of 10 (these two as the daemon's periodic
//!   sweeps run, without the content-file scan);
//! - idle with the scan: the same with the scan for content files no row records, as `conduit
//!   gc` and every 16th periodic sweep run it (one listing of `artifacts/sha256/`, whose cost
//!   follows the most files the folder ever held, not the Events);
//! - hold: the longest transaction of all those sweeps (how long one held the writer, its
//!   commit and fsync included), the TRUNCATE's, a single Event's commit as the floor, and the
//!   WAL checkpoint's passive part, which does not hold it.
//!
//! The design goal: steady and idle stay flat as N grows, and no transaction holds the writer
//! more than a few milliseconds. The state directory goes in a temporary directory, or under
//! `CONDUIT_HISTORY_DIR` when set (a million Events take about 1.5 GB).
//!
//! Invariant: the timed calls are the daemon's own; nothing is timed through a path it does not
//! take.

use std::path::Path;
use std::time::{Duration, Instant};

use conduit_host::retention::sweep::{Orphans, SweepReport};
use conduit_host::retention::{RetentionSettings, sweep};
use conduit_host::state_dir::StateDir;
use conduit_store::{Store, StoreError, WorkState};
use serde_json::json;

const THREAD_LEN: usize = 25;
const ITERATIONS: usize = 10;
const SEED_CHUNK: usize = 50_000;
const DAY_MS: i64 = 86_400_000;
/// The clock the bench passes in: every seeded record is 31 days older.
const NOW: i64 = 40 * DAY_MS;
const SEEDED_AT: i64 = NOW - 31 * DAY_MS;
const CONTENT: usize = 1024;

fn main() {
    let sizes: Vec<usize> = std::env::var("CONDUIT_RETENTION_SIZES")
        .unwrap_or_else(|_| "1000,100000,1000000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("CONDUIT_RETENTION_SIZES is a comma-separated list of Event counts")
        })
        .collect();
    let retention = RetentionSettings::default().resolved();
    let filler = "conduit retention benchmark payload. ".repeat(26);
    let mut rows = Vec::new();
    for &n in &sizes {
        let dir = match std::env::var_os("CONDUIT_HISTORY_DIR") {
            Some(base) => tempfile::tempdir_in(base),
            None => tempfile::tempdir(),
        }
        .expect("create a directory for the state");
        let state = StateDir::open(dir.path().join("state")).expect("a state directory");
        let store = Store::open(state.path().join("conduit.db")).expect("open the store");
        let started = Instant::now();
        seed(&store, &state, n, &filler).expect("seed the store");
        let seed_time = started.elapsed();
        eprintln!(
            "seeded {n} events and {} artifacts in {:.1} s",
            n / THREAD_LEN,
            seed_time.as_secs_f64()
        );
        let run = |now, orphans| {
            sweep(&state, &store, &retention, now, false, orphans, &|| false).expect("a sweep")
        };

        let catch_up = run(NOW, Orphans::All);
        eprintln!(
            "catch-up at {n}: {:.0} ms; decide {:?}; delete {:?}; WAL passive {} µs, truncate {} µs",
            catch_up.took_us as f64 / 1e3,
            catch_up.artifacts.decide,
            catch_up.artifacts.delete,
            catch_up.wal.passive_us,
            catch_up.wal.truncate_us
        );
        assert_eq!(
            catch_up.artifacts.removed_count as usize,
            n / THREAD_LEN,
            "the catch-up sweep removes every seeded artifact"
        );
        // Checkpointed by the catch-up sweep: the file holds everything.
        let db_mb =
            std::fs::metadata(state.path().join("conduit.db")).map_or(0, |m| m.len()) as f64 / 1e6;
        let mut hold_us = 0;
        let mut truncate_us = 0;
        let mut passive_us = 0;
        let (mut tx_n, mut tx_us) = (0, 0);

        let mut steady = Vec::new();
        let mut idle = Vec::new();
        let mut scan = Vec::new();
        for i in 0..=ITERATIONS {
            let now = NOW + (i as i64 + 1) * 600_000;
            add_batch(&store, &state, i, now).expect("a batch of new artifacts");
            let t = Instant::now();
            let r = run(now, Orphans::Skip);
            let took = t.elapsed();
            check_steady(&r);
            let t = Instant::now();
            let quiet = run(now + 1, Orphans::Skip);
            let idle_took = t.elapsed();
            assert_eq!(quiet.artifacts.removed_count, 0);
            let t = Instant::now();
            let scanned = run(now + 2, Orphans::All);
            let scan_took = t.elapsed();
            assert_eq!(scanned.artifacts.unrecorded_count, 0);
            if i == 0 {
                continue; // the warm-up
            }
            steady.push(took);
            idle.push(idle_took);
            scan.push(scan_took);
            for x in [&r, &quiet, &scanned] {
                hold_us = hold_us.max(x.longest_transaction_us);
                truncate_us = truncate_us.max(x.wal.truncate_us);
                passive_us = passive_us.max(x.wal.passive_us);
                tx_n += x.transactions;
                tx_us += x.transactions_us;
            }
        }
        let wal_after =
            std::fs::metadata(state.path().join("conduit.db-wal")).map_or(0, |m| m.len());
        rows.push(Row {
            n,
            db_mb,
            catch_up,
            steady: median(steady),
            idle: median(idle),
            scan: median(scan),
            hold_us,
            tx_n,
            mean_tx_us: tx_us / tx_n.max(1),
            floor: commit_floor(&store),
            truncate_us,
            passive_us,
            wal_after,
        });
        drop(store);
    }
    println!();
    println!("Cost against retained history:");
    println!();
    println!(
        "| events | db | steady sweep (100 removed, 100 kept live) | idle sweep | idle sweep with the content-file scan | catch-up: removed | catch-up: took | catch-up: transactions | catch-up: longest transaction |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {:.0} MB | {:.1} ms | {:.1} ms | {:.1} ms | {} | {:.0} ms | {} | {:.2} ms |",
            r.n,
            r.db_mb,
            ms(r.steady),
            ms(r.idle),
            ms(r.scan),
            r.catch_up.artifacts.removed_count,
            r.catch_up.took_us as f64 / 1e3,
            r.catch_up.transactions,
            r.catch_up.longest_transaction_us as f64 / 1e3,
        );
    }
    println!();
    println!(
        "How long the steady and idle sweeps held the writer (each transaction, its commit included):"
    );
    println!();
    println!(
        "| events | transactions | mean | longest | longest TRUNCATE | one event's commit (floor) | passive checkpoint, writer not held (longest) | WAL after |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} ms | {} B |",
            r.n,
            r.tx_n,
            r.mean_tx_us as f64 / 1e3,
            r.hold_us as f64 / 1e3,
            r.truncate_us as f64 / 1e3,
            ms(r.floor),
            r.passive_us as f64 / 1e3,
            r.wal_after
        );
    }
    println!();
    println!(
        "steady and idle: median of {ITERATIONS} after a warm-up; the floor: median of 20 single-event write transactions on the same store; release build; the catch-up's files are deleted off the writer, which is most of its time"
    );
}

struct Row {
    n: usize,
    db_mb: f64,
    catch_up: SweepReport,
    steady: Duration,
    idle: Duration,
    scan: Duration,
    hold_us: u64,
    tx_n: u64,
    mean_tx_us: u64,
    floor: Duration,
    truncate_us: u64,
    passive_us: u64,
    wal_after: u64,
}

fn check_steady(r: &SweepReport) {
    assert_eq!(r.artifacts.removed_count, 100, "{:?}", r.artifacts);
    assert_eq!(r.artifacts.kept_live, 100, "{:?}", r.artifacts);
}

fn content(state: &StateDir, sha: &str) {
    std::fs::write(
        state.artifacts_dir().join("sha256").join(sha),
        [b'c'; CONTENT],
    )
    .expect("write a content file");
}

fn digest(tag: &str, i: usize) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(format!("{tag}-{i}")))
}

/// N routed Events in threads of 25, each thread's Work done and one artifact the thread's
/// first Event mentions; ten packages' logs of earlier runs.
fn seed(store: &Store, state: &StateDir, n: usize, filler: &str) -> Result<(), StoreError> {
    std::fs::create_dir_all(state.artifacts_dir().join("sha256")).expect("the content folder");
    let mut seeded = 0;
    while seeded < n {
        let end = (seeded + SEED_CHUNK).min(n);
        store.write(|tx| {
            let mut ids = Vec::with_capacity(THREAD_LEN);
            let mut i = seeded;
            while i < end {
                let thread = i / THREAD_LEN;
                let thread_end = ((thread + 1) * THREAD_LEN).min(end);
                let sha = digest("history", thread);
                content(state, &sha);
                tx.record_artifact(&sha, CONTENT as u64, "run.log", None, "bench", SEEDED_AT)?;
                ids.clear();
                for j in i..thread_end {
                    let mut payload =
                        json!({"thread": thread, "seq": j % THREAD_LEN, "text": filler});
                    if j == thread * THREAD_LEN {
                        payload["log"] = json!(format!("sha256:{sha}"));
                    }
                    ids.push(
                        tx.accept_event("bench", &j.to_string(), "message", &payload, SEEDED_AT)?
                            .event_id,
                    );
                }
                let work =
                    tx.open_or_feed_work("thread", &format!("t-{thread}"), &ids, true, SEEDED_AT)?;
                for &id in &ids {
                    tx.mark_routed(id, Some(work), SEEDED_AT)?;
                }
                tx.set_work_state(work, WorkState::Done, SEEDED_AT)?;
                i = thread_end;
            }
            Ok(())
        })?;
        seeded = end;
    }
    let logs = state.logs_dir();
    for p in 0..10 {
        write_log(&logs.join(format!("pkg-{p}.log.1")), 64 * 1024);
    }
    Ok(())
}

fn write_log(path: &Path, size: usize) {
    std::fs::write(path, vec![b'l'; size]).expect("write a log");
}

/// 100 artifacts past their age that nothing mentions, and 100 that an unrouted Event
/// mentions, all stored 31 days before `now`.
fn add_batch(store: &Store, state: &StateDir, i: usize, now: i64) -> Result<(), StoreError> {
    let at = now - 31 * DAY_MS;
    store.write(|tx| {
        for k in 0..100 {
            let gone = digest(&format!("gone-{i}"), k);
            content(state, &gone);
            tx.record_artifact(&gone, CONTENT as u64, "x", None, "bench", at)?;
            let kept = digest(&format!("kept-{i}"), k);
            content(state, &kept);
            tx.record_artifact(&kept, CONTENT as u64, "y", None, "bench", at - 1)?;
            tx.accept_event(
                "bench-live",
                &format!("{i}-{k}"),
                "unrouted",
                &json!({"needs": format!("sha256:{kept}")}),
                at - 1,
            )?;
        }
        Ok(())
    })
}

/// One event accepted in its own write transaction (commit and fsync): the least a write
/// holds the writer on this machine now.
fn commit_floor(store: &Store) -> Duration {
    let times = (0..20)
        .map(|i| {
            let t = Instant::now();
            store
                .write(|tx| {
                    tx.accept_event("floor", &i.to_string(), "k", &json!({}), NOW)
                        .map(drop)
                })
                .expect("a single write");
            t.elapsed()
        })
        .collect();
    median(times)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
