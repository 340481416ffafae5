//! No escapes, and what the status keeps of each exit: the supervisor against real processes
//! whose grandchildren leave the extension's process group and session
//! (`fixtures/escape.py`), and against `fixtures/misbehave.py`.
//!
//! This test process makes itself a child subreaper, as the daemon does, so orphans come to it;
//! it forks nothing but through the supervisor once a supervisor runs (the Python path is
//! looked up first).

use std::time::Duration;

use conduit_supervisor::backoff::RestartPolicy;
use conduit_supervisor::tree;
use conduit_supervisor::{ExitCause, Extension, ExtensionSpec, State, Supervisor, no_callbacks};
use serde_json::{Value, json};

mod common;
use common::{PATIENCE, fixture_spec, python, until};

fn spec(dir: &tempfile::TempDir, name: &str, script: &str, mode: &str) -> ExtensionSpec {
    let mut s = fixture_spec(dir.path(), name, script, mode);
    s.ledger = Some(dir.path().join(format!("{name}{}", tree::LEDGER_SUFFIX)));
    s
}

fn supervisor() -> Supervisor {
    python();
    assert!(
        conduit_supervisor::process::become_subreaper(),
        "this test needs Linux's child subreaper"
    );
    Supervisor::new(no_callbacks())
}

fn running(pid: u32) -> bool {
    tree::stat(pid).is_some_and(|s| !s.is_zombie())
}

const READY: Duration = PATIENCE;

/// The pids of the processes the fixture started outside its group or session.
async fn escapees(ext: &Extension) -> Vec<u32> {
    common::call(ext, "escapees", json!({}), Some(Duration::from_secs(5)))
        .await
        .unwrap()
}

/// Wait until the status lists every one of `escapees` among the extension's descendants.
async fn listed(ext: &Extension, escapees: &[u32]) {
    until("the status lists every escapee", || {
        let d = ext.status().descendants;
        escapees.iter().all(|p| d.contains(p))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grandchildren_that_leave_the_group_or_session_are_stopped_with_the_extension() {
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor();
    let ext = sup
        .start(spec(&dir, "runaway", "escape.py", "escape"))
        .await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    let pid = ext.status().pid.unwrap();
    let escapees = escapees(&ext).await;
    assert_eq!(escapees.len(), 4);
    for p in &escapees {
        let s = tree::stat(*p).unwrap();
        assert!(!s.is_zombie());
        if s.pgrp == pid {
            assert_eq!(
                p, &escapees[3],
                "only the empty-environment one stays in the group"
            );
        }
    }
    // Each is seen in the extension's tree (the double-forked one too: the extension is a
    // subreaper, so it was re-parented to it) and recorded.
    listed(&ext, &escapees).await;
    let ledger = tree::Ledger::new(dir.path().join("runaway.pids")).read();
    for p in &escapees {
        assert!(
            ledger.iter().any(|r| r.pid == *p),
            "{p} not in the ledger {ledger:?}"
        );
    }
    sup.stop("runaway").await;
    let left: Vec<u32> = escapees.iter().copied().filter(|p| running(*p)).collect();
    assert_eq!(
        left,
        Vec::<u32>::new(),
        "escapees still running after the stop"
    );
    assert!(!running(pid));
    // No zombie is left among this process's children: the orphans were reaped.
    until("every orphan is reaped", || {
        tree::children(std::process::id())
            .iter()
            .all(|c| !escapees.contains(c))
    })
    .await;
    assert!(
        !dir.path().join("runaway.pids").exists(),
        "the ledger is removed once everything it named is gone"
    );
    let rec = &ext.status().recent_exits[0];
    assert_eq!(rec.cause, ExitCause::StoppedByHost);
    assert_eq!(
        rec.requested_by,
        Some(conduit_supervisor::Requester::Operator)
    );
    assert!(
        rec.summary.contains("an operator's stop"),
        "{}",
        rec.summary
    );
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resting_extension_that_starts_processes_is_read_again_and_they_stop_with_it() {
    // With limits, so both the tracking and the sampling rest and wake.
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor();
    let mut s = spec(&dir, "sleeper", "escape.py", "escape-later");
    s.confine.limits = Some(conduit_supervisor::limits::Limits::DEFAULT);
    let ext = sup.start(s).await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    // Idle, alone and far from its limits: it rests, watched by its CPU clock only.
    until("the idle extension rests", || sup.resting() == 1).await;
    let escapees = escapees(&ext).await;
    // Its clock moved: it is read again, its new processes seen and recorded.
    listed(&ext, &escapees).await;
    let ledger = tree::Ledger::new(dir.path().join("sleeper.pids")).read();
    for p in &escapees {
        assert!(
            ledger.iter().any(|r| r.pid == *p),
            "{p} not in the ledger {ledger:?}"
        );
    }
    // The limits' sample wakes too (on its own timer, so it may follow the tracking's read).
    until("the limits' sample counts the escapees", || {
        ext.status()
            .resources
            .and_then(|r| r.usage)
            .is_some_and(|u| u.processes >= 5)
    })
    .await;
    // A tree with descendants does not rest.
    assert_eq!(sup.resting(), 0);
    sup.stop("sleeper").await;
    let left: Vec<u32> = escapees.iter().copied().filter(|p| running(*p)).collect();
    assert_eq!(
        left,
        Vec::<u32>::new(),
        "escapees still running after the stop"
    );
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_kills_what_the_extension_left_and_the_ledger_sweep_finds_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor();
    let ext = sup.start(spec(&dir, "crashy", "escape.py", "escape")).await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    let pid = ext.status().pid.unwrap();
    let escapees = escapees(&ext).await;
    listed(&ext, &escapees).await;
    // A crash of the extension: its orphans come to this process, and are killed.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    until("the escapees of a crashed extension are killed", || {
        escapees.iter().all(|p| !running(*p))
    })
    .await;
    until("it is restarted", || {
        let st = ext.status();
        st.restarts == 1 && st.state == State::Ready
    })
    .await;
    let st = ext.status();
    assert_eq!(st.recent_exits[0].cause, ExitCause::Signalled, "{st:?}");
    assert_eq!(st.restarts, 1);
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_stdout_is_recorded_as_such_and_exits_keep_the_calls_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor();
    let ext = sup
        .start(spec(&dir, "mute", "misbehave.py", "close-stdout"))
        .await;
    ext.wait_for(Duration::from_secs(10), |s| {
        matches!(s, State::BackingOff | State::CrashLooping)
    })
    .await
    .unwrap();
    let st = ext.status();
    let rec = &st.recent_exits[0];
    assert_eq!(rec.cause, ExitCause::ClosedStdout, "{st:?}");
    assert!(rec.summary.contains("closed its stdout"), "{}", rec.summary);
    let err = st.last_error.unwrap();
    assert!(
        err.contains("closed its stdout while still running") && err.contains("SIGKILL"),
        "{err}"
    );
    sup.stop("mute").await;

    // A call in flight when the child dies is listed in the exit's record, with its age.
    let ext = sup.start(spec(&dir, "holder", "misbehave.py", "ok")).await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    let pid: i32 = common::call(&ext, "pid", json!({}), Some(Duration::from_secs(5)))
        .await
        .unwrap();
    let pending = {
        let ext = ext.clone();
        tokio::spawn(async move {
            common::call::<Value>(&ext, "hold", json!({}), Some(Duration::from_secs(30))).await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(pending.await.unwrap().is_err());
    until("it is restarted", || {
        let st = ext.status();
        st.restarts == 1 && st.state == State::Ready
    })
    .await;
    let st = ext.status();
    let rec = &st.recent_exits[0];
    assert_eq!(rec.exit.and_then(|e| e.signal), Some(9));
    assert_eq!(rec.in_flight.len(), 1, "{rec:?}");
    assert_eq!(rec.in_flight[0].method, "hold");
    assert!(rec.in_flight[0].age_ms >= 150, "{rec:?}");
    sup.stop("holder").await;
    // Kept after the stop, and carried into the next start of the same package.
    let last = sup.last_status("holder").unwrap();
    assert_eq!(last.recent_exits.len(), 2, "{:?}", last.recent_exits);
    assert_eq!(last.recent_exits[0].cause, ExitCause::StoppedByHost);
    let again = sup.start(spec(&dir, "holder", "misbehave.py", "ok")).await;
    assert_eq!(again.status().recent_exits.len(), 2);
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_counts_restarts_not_failures_and_keeps_five_exits() {
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor();
    let mut s = spec(&dir, "once", "misbehave.py", "exit-at-start");
    s.policy = RestartPolicy {
        initial: Duration::from_secs(60),
        max: Duration::from_secs(60),
        ..RestartPolicy::default()
    };
    let ext = sup.start(s).await;
    ext.wait_for(Duration::from_secs(10), |s| s == State::BackingOff)
        .await
        .unwrap();
    let st = ext.status();
    assert_eq!(
        st.restarts, 0,
        "it failed once and has not been restarted yet"
    );
    assert_eq!(st.recent_exits.len(), 1);
    assert_eq!(st.recent_exits[0].cause, ExitCause::Exited);
    // Restarted by hand six times: counted, and only the last five exits are kept.
    for n in 1..=6u32 {
        ext.restart(conduit_supervisor::StopRequest::operator_restart());
        until("the restart is counted", || {
            let st = ext.status();
            st.restarts == n
                && st.state == State::BackingOff
                && st.recent_exits.len() as u32 == (n + 1).min(5)
        })
        .await;
    }
    assert_eq!(
        ext.status().recent_exits.len(),
        conduit_supervisor::RECENT_EXITS
    );
    sup.shutdown().await;
}
