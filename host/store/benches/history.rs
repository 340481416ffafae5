//! How the host loop's storage work scales with retained history.
//!
//! Run with
//!
//! ```text
//! cargo bench -p conduit-store --bench history
//! CONDUIT_HISTORY_SIZES=1000,50000 cargo bench -p conduit-store --bench history
//! ```
//!
//! For each size N it seeds a fresh store with N Events of about 1 KiB, in threads of 25: each
//! thread's Events are routed to one Work, which is then done; each thread also leaves a
//! stopped timer, a satisfied Wait and a committed Emission, so every live read has history
//! beside it and nothing live. Then it times, as the median of 20 iterations after 2 warm-ups:
//!
//! - accept and route: one write transaction that accepts a new Event, opens its Work and
//!   marks it routed (it commits at `synchronous=FULL`, so this includes one fsync);
//! - routing pass: a write transaction reading the unrouted backlog, which is empty;
//! - idle poll: a write transaction reading due timers, active Waits, planned Emissions and
//!   unfinished Work, all empty.
//!
//! The store file goes in a temporary directory, or under `CONDUIT_HISTORY_DIR` when set (a
//! million Events take about 1.5 GB with the WAL). The design goal is that the last two rows stay flat as N
//! grows; see `schema.rs` for the partial indexes that make them so.
//!
//! Invariant: the timed closures are the same calls the host loop makes; nothing is timed
//! through a path the daemon does not take.

use std::time::{Duration, Instant};

use conduit_protocol::calls::Record;
use conduit_store::{Store, StoreError, WorkState};
use serde_json::{Value, json};

const THREAD_LEN: usize = 25;
const ITERATIONS: usize = 20;
const WARMUP: usize = 2;
/// Events per seeding transaction: large enough that per-commit costs vanish, small enough to
/// keep the WAL (which holds a transaction until it commits) to a few tens of MB.
const SEED_CHUNK: usize = 50_000;

fn main() {
    let sizes: Vec<usize> = std::env::var("CONDUIT_HISTORY_SIZES")
        .unwrap_or_else(|_| "1000,50000,1000000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("CONDUIT_HISTORY_SIZES is a comma-separated list of Event counts")
        })
        .collect();
    let filler = "conduit history benchmark payload. ".repeat(28);

    let mut rows = Vec::new();
    for &n in &sizes {
        let dir = match std::env::var_os("CONDUIT_HISTORY_DIR") {
            Some(base) => tempfile::tempdir_in(base),
            None => tempfile::tempdir(),
        }
        .expect("create a directory for the store");
        let path = dir.path().join("conduit.db");
        let store = Store::open(&path).expect("open the store");

        let started = Instant::now();
        seed(&store, n, &filler).expect("seed the store");
        let seed_time = started.elapsed();
        let size_mb = file_mb(&path);
        eprintln!(
            "seeded {n} events in {:.2} s ({size_mb:.0} MB with WAL)",
            seed_time.as_secs_f64()
        );

        // The clock the bench passes in: after everything seeded, before any timer could fire.
        let now = 10_000_000_000_i64;

        let routing = median(|| {
            timed(|| {
                store.write(|tx| {
                    let pending = tx.unrouted_events(200)?;
                    assert!(pending.is_empty());
                    Ok(())
                })
            })
        });
        let poll = median(|| {
            timed(|| {
                store.write(|tx| {
                    assert!(tx.due_timers(now, 100)?.is_empty());
                    assert!(tx.active_waits(None, 100)?.is_empty());
                    assert!(tx.planned_emissions(100)?.is_empty());
                    assert!(tx.open_work(100)?.is_empty());
                    Ok(())
                })
            })
        });
        let mut next = 0usize;
        let accept = median(|| {
            next += 1;
            let key = format!("new-{next}");
            let payload = payload(n + next, 0, &filler);
            let started = Instant::now();
            let work = store
                .write(|tx| {
                    let ev = tx.accept_event("bench", &key, "message", &payload, now)?;
                    let work = tx.open_or_feed_work("thread", &key, &[ev.event_id], true, now)?;
                    tx.mark_routed(ev.event_id, Some(work), now)?;
                    Ok(work)
                })
                .expect("accept and route");
            let took = started.elapsed();
            // Finish the Work outside the timing, so the live set stays empty for the next size
            // and the next iteration measures the same thing.
            store
                .write(|tx| tx.set_work_state(work, WorkState::Done, now))
                .expect("finish the work");
            took
        });
        rows.push((n, seed_time, size_mb, accept, routing, poll));
        drop(store);
    }

    println!();
    println!("| events | seed | db size | accept and route | routing pass (idle) | poll (idle) |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for (n, seed_time, size_mb, accept, routing, poll) in rows {
        println!(
            "| {n} | {:.2} s | {size_mb:.0} MB | {} | {} | {} |",
            seed_time.as_secs_f64(),
            micros(accept),
            micros(routing),
            micros(poll),
        );
    }
    println!();
    println!("median of {ITERATIONS} iterations after {WARMUP} warm-ups; release build");
}

/// Seeds `n` routed Events in threads of 25, each thread's Work done, in large transactions.
fn seed(store: &Store, n: usize, filler: &str) -> Result<(), StoreError> {
    let mut seeded = 0;
    while seeded < n {
        let end = (seeded + SEED_CHUNK).min(n);
        store.write(|tx| {
            let mut event_ids = Vec::with_capacity(THREAD_LEN);
            let mut i = seeded;
            while i < end {
                let thread = i / THREAD_LEN;
                let thread_end = ((thread + 1) * THREAD_LEN).min(end);
                let at = i as i64;
                event_ids.clear();
                for j in i..thread_end {
                    let payload = payload(thread, j % THREAD_LEN, filler);
                    let ev = tx.accept_event("bench", &j.to_string(), "message", &payload, at)?;
                    event_ids.push(ev.event_id);
                }
                let key = format!("t-{thread}");
                let work = tx.open_or_feed_work("thread", &key, &event_ids, true, at)?;
                for &id in &event_ids {
                    tx.mark_routed(id, Some(work), at)?;
                }
                tx.set_work_state(work, WorkState::Done, at)?;

                let timer = tx.create_timer("bench", "every", "15m", at, at)?;
                tx.reschedule_timer(timer, None, at)?;
                let wait = tx.create_wait("bench", "reply", &key, Some(work), 0, at)?;
                tx.satisfy_wait(wait, event_ids[0], at)?;
                let planned = tx.plan_emission("bench", "summary", Some(work), &json!({}), at)?;
                let record = Record::new("summary", json!({"thread": thread}));
                tx.commit_emission(planned.emission_id, &[record], at)?;
                i = thread_end;
            }
            Ok(())
        })?;
        seeded = end;
    }
    Ok(())
}

fn payload(thread: usize, seq: usize, filler: &str) -> Value {
    json!({"thread": thread, "seq": seq, "text": filler})
}

fn timed(f: impl FnOnce() -> Result<(), StoreError>) -> Duration {
    let started = Instant::now();
    f().expect("a timed store call");
    started.elapsed()
}

fn median(mut sample: impl FnMut() -> Duration) -> Duration {
    for _ in 0..WARMUP {
        sample();
    }
    let mut times: Vec<Duration> = (0..ITERATIONS).map(|_| sample()).collect();
    times.sort();
    times[ITERATIONS / 2]
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn file_mb(path: &std::path::Path) -> f64 {
    let wal = path.with_extension("db-wal");
    let bytes: u64 = [path, wal.as_path()]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    bytes as f64 / 1e6
}
