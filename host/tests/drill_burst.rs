//! Drill: memory taken in a burst is given back. A fresh daemon with one extension that stops
//! reading after its handshake is sent 64 concurrent management-API calls of 600 KiB each
//! (38 MiB of payload, more than the pipe and less than the session's held-bytes bound, so
//! every call is accepted and waits until its deadline); then the extension is removed. The
//! drill prints the daemon's RSS before, at its peak, when the calls have ended and once back
//! after the removal (under `make drill`, `CONDUIT_DRILL_ROUNDS` set, it watches on to 10 s
//! after), and holds the bound of docs/operations.md ("Memory after a burst"): RSS back within
//! 20 MiB of its value before, within 10 s of the removal.
//!
//! The 10 s is the feature, so it is asserted (polled, not slept); everything else waits
//! under `support::PATIENCE`. The removal itself takes the stop's grace (the extension never
//! reads its shutdown request), so the 10 s count from when `conduit ext remove` returned.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::PATIENCE;
use support::drill::report;
use support::fixture::{Fixture, proc_status};

/// Concurrent calls in the burst, and each one's payload.
const CALLERS: usize = 64;
const PAYLOAD: usize = 600 * 1024;
/// Each call's deadline: short, so the drill is short; the calls hold their frames until then.
const CALL_TIMEOUT_MS: u64 = 2_000;
/// The bound: RSS within this much of its value before the burst, within `BACK_WITHIN` of the
/// extension's removal.
const SLACK_KIB: u64 = 20 * 1024;
const BACK_WITHIN: Duration = Duration::from_secs(10);

/// A field of the daemon's `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`).
fn kib(pid: i32, field: &str) -> u64 {
    proc_status(pid, field)
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// One caller: `echo` with a `PAYLOAD`-byte string to `name`, over its own connection.
fn call(socket: &Path, name: &str) -> Value {
    let body = format!(
        "{{\"method\":\"echo\",\"params\":\"{}\",\"timeout_ms\":{CALL_TIMEOUT_MS}}}",
        "x".repeat(PAYLOAD)
    );
    support::http::request_text(
        socket,
        "POST",
        &format!("/v1/extensions/{name}/call"),
        &body,
    )
    .1
}

#[test]
fn drill_memory_returns_after_a_burst() {
    let mut f = Fixture::new();
    f.install(&f.escape("deaf", "stop-reading"));
    f.start_daemon();
    f.wait_state("deaf", "ready", PATIENCE);
    let daemon = f.daemon_pid();
    let socket = f.state().join("run/conduit.sock");
    // One small call first, so the API's first-use allocations are in the figure before.
    let (code, _) = support::http::request(&socket, "GET", "/v1/health", None);
    assert_eq!(code, 200, "{}", f.context());
    let before = kib(daemon, "VmRSS");

    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || call(&socket, "deaf"))
        })
        .collect();
    let answers: Vec<Value> = callers.into_iter().map(|c| c.join().unwrap()).collect();
    let peak = kib(daemon, "VmHWM");
    let after_calls = kib(daemon, "VmRSS");
    let names: Vec<&str> = answers
        .iter()
        .map(|a| a["error"]["name"].as_str().unwrap_or("answered"))
        .collect();
    // The peer reads nothing: every call times out or is refused, none is answered.
    let failed_as_they_should = names
        .iter()
        .all(|n| matches!(*n, "deadline_exceeded" | "overloaded"));

    let t = Instant::now();
    let run = f.conduit(&["ext", "remove", "deaf"]);
    assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
    // The stop waits out its grace: the peer never reads the shutdown request.
    let remove_took = t.elapsed();
    // Poll until RSS is back within the bound; under `make drill` on to 10 s after the
    // removal, for the figure the bound is stated at.
    let removed = Instant::now();
    let watch = std::env::var_os("CONDUIT_DRILL_ROUNDS").is_some();
    let mut back = None;
    let (last, last_at) = loop {
        let rss = kib(daemon, "VmRSS");
        let t = removed.elapsed();
        if back.is_none() && rss <= before + SLACK_KIB {
            back = Some((t, rss));
        }
        if t >= BACK_WITHIN || (back.is_some() && !watch) {
            break (rss, t);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let ok = failed_as_they_should && back.is_some_and(|(t, _)| t <= BACK_WITHIN);
    report(
        "burst-memory",
        "after 64 concurrent 600 KiB calls to an extension that stopped reading and its removal, RSS within 20 MiB of before, within 10 s",
        &format!(
            "RSS {:.1} MiB before, peak {:.1}, {:.1} when the calls had ended; `ext remove` took {} ms; after it {}, {:.1} at {:.1} s",
            mib(before),
            mib(peak),
            mib(after_calls),
            remove_took.as_millis(),
            match back {
                Some((t, rss)) => format!("back to {:.1} at {} ms", mib(rss), t.as_millis()),
                None => "never back".to_owned(),
            },
            mib(last),
            last_at.as_secs_f64(),
        ),
        ok,
    );
    assert!(ok, "{names:?}{}", f.context());
}
