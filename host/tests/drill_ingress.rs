//! Drills for ingress's group commit, against the real daemon and the `notes` example.
//!
//! - `group_commit_sigkill`: rounds of 8 keep-alive clients pushing `note.*` events back to
//!   back (so their acknowledgements come from shared commits), the daemon killed with SIGKILL
//!   mid-flood after a varying number of acknowledgements, and started again. Then every
//!   delivery acknowledged, and every one in flight when the daemon died, is pushed again.
//!   Bound: no acknowledged event lost (its id holds its delivery), none stored twice, every
//!   push of an acknowledged delivery after the restart a duplicate with the first id, a
//!   delivery in flight at the kill stored at most once, and every event in exactly one Work.
//!   `CONDUIT_DRILL_ROUNDS` sets the rounds (default 5; `make drill` runs 20).

mod support;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::PATIENCE;
use support::fixture::{Fixture, kill};
use support::http::Conn;
use support::{drill, stage_rust_example};

fn socket(f: &Fixture) -> PathBuf {
    f.state().join("run/conduit.sock")
}

const SOURCE: &str = "notes-inbox";

fn payload(i: usize) -> Value {
    json!({"thread": format!("t-{}", i % 7), "author": "ops", "text": "group commit"})
}

/// A stored event: its id, its delivery id, and whether it is routed.
type Stored = (i64, String, bool);

/// Every stored event and how many Work hold each event id, over one connection.
fn stored(sock: &Path) -> (Vec<Stored>, HashMap<i64, usize>) {
    let mut c = Conn::connect(sock).unwrap();
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let (code, page) = c
            .request("GET", &format!("/v1/events?after={after}&limit=200"), None)
            .unwrap();
        assert_eq!(code, 200, "{page}");
        let evs = page["events"].as_array().cloned().unwrap_or_default();
        let Some(last) = evs.last() else { break };
        after = last["id"].as_i64().unwrap();
        events.extend(evs.iter().map(|e| {
            (
                e["id"].as_i64().unwrap(),
                e["delivery_id"].as_str().unwrap().to_owned(),
                e.get("routed_at_ms").is_some(),
            )
        }));
    }
    let mut in_works: HashMap<i64, usize> = HashMap::new();
    let mut after = 0;
    loop {
        let (code, page) = c
            .request("GET", &format!("/v1/work?after={after}&limit=200"), None)
            .unwrap();
        assert_eq!(code, 200, "{page}");
        let works = page["work"].as_array().cloned().unwrap_or_default();
        let Some(last) = works.last() else { break };
        after = last["id"].as_i64().unwrap();
        for w in &works {
            for id in w["event_ids"].as_array().unwrap() {
                *in_works.entry(id.as_i64().unwrap()).or_default() += 1;
            }
        }
    }
    (events, in_works)
}

#[test]
fn group_commit_sigkill() {
    let mut f = Fixture::new();
    let notes = stage_rust_example("notes", &f.dir.path().join("staged")).unwrap();
    f.install(&notes);
    // Delivery → the event id its acknowledgement gave; deliveries sent but never answered.
    let acked: Arc<Mutex<HashMap<String, i64>>> = Arc::default();
    let unanswered: Arc<Mutex<HashSet<String>>> = Arc::default();
    let rounds = drill::rounds();
    for round in 0..rounds {
        f.start_daemon();
        f.wait_state("notes", "ready", PATIENCE);
        let sock = socket(&f);
        let stop = Arc::new(AtomicBool::new(false));
        let this_round = Arc::new(AtomicUsize::new(0));
        let pushers: Vec<_> = (0..8)
            .map(|p| {
                let (sock, stop, acked, unanswered, this_round) = (
                    sock.clone(),
                    stop.clone(),
                    acked.clone(),
                    unanswered.clone(),
                    this_round.clone(),
                );
                std::thread::spawn(move || {
                    let mut conn = None;
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        if conn.is_none() {
                            conn = Conn::connect(&sock).ok();
                            if conn.is_none() {
                                std::thread::sleep(Duration::from_millis(5));
                                continue;
                            }
                        }
                        let c = conn.as_mut().unwrap();
                        let delivery = format!("r{round}-p{p}-{i}");
                        i += 1;
                        match c.push(SOURCE, &delivery, "note.posted", payload(i)) {
                            Ok((201, v)) => {
                                acked
                                    .lock()
                                    .unwrap()
                                    .insert(delivery, v["event_id"].as_i64().unwrap());
                                this_round.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok((code, v)) => panic!("push {delivery} answered {code}: {v}"),
                            Err(_) => {
                                // The daemon died with this push in flight: it may or may not
                                // have been committed.
                                unanswered.lock().unwrap().insert(delivery);
                                conn = None;
                            }
                        }
                    }
                })
            })
            .collect();
        // Kill it after a varying number of acknowledgements, mid-flood.
        let at = 100 + (round * 37) % 300;
        f.wait_until("acknowledgements before the kill", || {
            (this_round.load(Ordering::Relaxed) >= at).then_some(())
        });
        kill(f.daemon_pid(), nix::sys::signal::Signal::SIGKILL);
        let _ = f.daemon.take().unwrap().wait();
        stop.store(true, Ordering::Relaxed);
        for p in pushers {
            p.join().unwrap();
        }
    }

    // The last start. First what the kills left: every acknowledged delivery under its id.
    f.start_daemon();
    f.wait_state("notes", "ready", PATIENCE);
    let sock = socket(&f);
    let acked = acked.lock().unwrap().clone();
    let unanswered = unanswered.lock().unwrap().clone();
    let (before, _) = stored(&sock);
    let by_id: HashMap<i64, &str> = before.iter().map(|(id, d, _)| (*id, d.as_str())).collect();
    let lost = acked
        .iter()
        .filter(|(d, id)| by_id.get(id) != Some(&d.as_str()))
        .count();
    let before_kills: HashSet<&str> = by_id.values().copied().collect();
    let in_flight_committed = unanswered
        .iter()
        .filter(|d| before_kills.contains(d.as_str()))
        .count();
    // Then every one pushed again: an acknowledged one is a duplicate with its first id; one
    // in flight at a kill is stored now, once, whether or not it was before.
    let mut conn = Conn::connect(&sock).unwrap();
    let mut not_duplicate = 0;
    let mut other_id = 0;
    for (delivery, id) in &acked {
        let (code, v) = conn
            .push(SOURCE, delivery, "note.posted", payload(0))
            .unwrap();
        if code != 200 || v["duplicate"] != true {
            not_duplicate += 1;
        }
        if v["event_id"].as_i64() != Some(*id) {
            other_id += 1;
        }
    }
    for delivery in &unanswered {
        let (code, v) = conn
            .push(SOURCE, delivery, "note.posted", payload(0))
            .unwrap();
        assert!(code == 200 || code == 201, "{delivery}: {code} {v}");
    }
    let (events, in_works) = f.wait_until("every event to be routed", || {
        let (events, works) = stored(&sock);
        events.iter().all(|e| e.2).then_some((events, works))
    });
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for (_, d, _) in &events {
        *copies.entry(d).or_default() += 1;
    }
    let duplicated = copies.values().filter(|n| **n > 1).count();
    let not_once = events
        .iter()
        .filter(|(id, _, _)| in_works.get(id).copied().unwrap_or(0) != 1)
        .count();
    let missing = acked
        .keys()
        .chain(&unanswered)
        .filter(|d| !copies.contains_key(d.as_str()))
        .count();
    let ok = lost == 0
        && duplicated == 0
        && missing == 0
        && not_duplicate == 0
        && other_id == 0
        && not_once == 0
        && acked.len() >= rounds * 100;
    drill::report(
        "group_commit_sigkill",
        &format!(
            "{rounds} SIGKILLs mid-flood (8 keep-alive pushers, group commit): 0 acknowledged events lost, 0 stored twice, every re-push of an acknowledged delivery its first id, every event in exactly one Work"
        ),
        &format!(
            "acknowledged {}, stored {}, lost {lost}, stored twice {duplicated}, re-pushes not a duplicate {not_duplicate}, with another id {other_id}, missing after the re-pushes {missing}, not in exactly one Work {not_once}; {} in flight at a kill, {in_flight_committed} of them committed before it",
            acked.len(),
            events.len(),
            unanswered.len()
        ),
        ok,
    );
    assert!(ok, "see the drill line above{}", f.context());
}
