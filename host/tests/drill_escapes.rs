//! Drills: no process escapes its extension, status says what happened, and an extension that
//! stops reading costs a bounded amount — each beside a healthy extension that must keep
//! answering with the same pid. Each records its line with `support::drill::report`.
//!
//! The misbehaving package runs `host/supervisor/tests/fixtures/escape.py`: in mode `escape` it
//! starts four grandchildren that call setsid(), setpgid(0, 0), are double-forked, or exec with
//! an empty environment; in mode `stop-reading` it never reads stdin after the handshake.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::drill::report;
use support::fixture::{Fixture, kill};

fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .next();
    !matches!(state, Some("Z" | "X"))
}

/// The daemon with `runaway` (escaping grandchildren) and `steady` (healthy) ready; the four
/// escapees' pids once the daemon has seen them, and steady's pid.
fn setup(f: &mut Fixture) -> (Vec<u32>, u64) {
    f.install(&f.escape("runaway", "escape"));
    f.install(&f.misbehave("steady", "ok"));
    f.start_daemon();
    f.wait_state("runaway", "ready", Duration::from_secs(20));
    let steady = f.wait_state("steady", "ready", Duration::from_secs(20))["pid"]
        .as_u64()
        .unwrap();
    let run = f.conduit(&["ext", "call", "runaway", "escapees"]);
    assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
    let escapees: Vec<u32> = serde_json::from_slice(&run.out.stdout).unwrap();
    assert_eq!(escapees.len(), 4);
    assert!(escapees.iter().all(|p| running(*p)));
    f.wait_for("runaway", Duration::from_secs(20), |s| {
        let d: Vec<u64> = s["descendants"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        escapees.iter().all(|p| d.contains(&(*p as u64)))
    });
    (escapees, steady)
}

/// How long until none of `pids` runs (at most `within`); `None` if some still do.
fn gone_within(pids: &[u32], since: Instant, within: Duration) -> Option<Duration> {
    loop {
        if pids.iter().all(|p| !running(*p)) {
            return Some(since.elapsed());
        }
        if since.elapsed() > within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn steady_answers_with(f: &Fixture, pid: u64) -> bool {
    let run = f.conduit(&["ext", "call", "steady", "echo", "\"still\""]);
    run.code() == Some(0) && f.status("steady")["pid"].as_u64() == Some(pid)
}

fn left(pids: &[u32]) -> Vec<u32> {
    pids.iter().copied().filter(|p| running(*p)).collect()
}

fn stop_drill(name: &str, how: &[&str]) {
    let mut f = Fixture::new();
    let (escapees, steady) = setup(&mut f);
    let t = Instant::now();
    let run = f.conduit(how);
    assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
    let took = gone_within(&escapees, t, Duration::from_secs(10));
    let healthy = steady_answers_with(&f, steady);
    let ok = took.is_some_and(|d| d < Duration::from_secs(5)) && healthy;
    report(
        name,
        "setsid/setpgid/double-fork/empty-env grandchildren gone within 5 s; steady keeps its pid",
        &format!(
            "gone after {}; steady same pid and answering: {healthy}",
            took.map_or("never (10 s)".into(), |d| format!("{} ms", d.as_millis()))
        ),
        ok,
    );
    assert!(ok, "still running: {:?}{}", left(&escapees), f.context());
}

#[test]
fn drill_escapees_are_gone_after_ext_disable() {
    stop_drill("escapes-disable", &["ext", "disable", "runaway"]);
}

#[test]
fn drill_escapees_are_gone_after_ext_remove() {
    stop_drill("escapes-remove", &["ext", "remove", "runaway"]);
}

#[test]
fn drill_escapees_are_gone_after_daemon_sigterm() {
    let mut f = Fixture::new();
    let (escapees, _) = setup(&mut f);
    let t = Instant::now();
    let code = f.stop_daemon();
    let at_exit = left(&escapees);
    let took = gone_within(&escapees, t, Duration::from_secs(10));
    let ok = code == Some(0) && at_exit.is_empty();
    report(
        "escapes-sigterm",
        "no grandchild outlives the daemon's graceful stop",
        &format!(
            "daemon exited {code:?}; running at its exit: {}; all gone after {}",
            at_exit.len(),
            took.map_or("never (10 s)".into(), |d| format!("{} ms", d.as_millis()))
        ),
        ok,
    );
    assert!(
        ok,
        "still running at the daemon's exit: {at_exit:?}{}",
        f.context()
    );
}

#[test]
fn drill_escapees_are_swept_after_daemon_sigkill_and_restart() {
    let mut f = Fixture::new();
    let (escapees, _) = setup(&mut f);
    kill(f.daemon_pid(), nix::sys::signal::Signal::SIGKILL);
    let _ = f.daemon.take().unwrap().wait();
    let survivors = left(&escapees);
    assert!(
        !survivors.is_empty(),
        "the drill needs something to sweep: grandchildren outlive a SIGKILLed daemon"
    );
    let t = Instant::now();
    f.start_daemon();
    let took = gone_within(&escapees, t, Duration::from_secs(10));
    let steady = f.wait_state("steady", "ready", Duration::from_secs(20))["pid"]
        .as_u64()
        .unwrap();
    let healthy = steady_answers_with(&f, steady);
    let ok = took.is_some_and(|d| d < Duration::from_secs(5)) && healthy;
    report(
        "escapes-sigkill-restart",
        "what a SIGKILLed daemon's extension left is gone within 5 s of the next start",
        &format!(
            "{} survived the SIGKILL; gone {} after the restart began; steady answering: {healthy}",
            survivors.len(),
            took.map_or("never (10 s)".into(), |d| format!("{} ms", d.as_millis()))
        ),
        ok,
    );
    assert!(ok, "still running: {:?}{}", left(&escapees), f.context());
}

#[test]
fn drill_closed_stdout_is_shown_as_such_and_restarted() {
    let mut f = Fixture::new();
    f.install(&f.misbehave("mute", "close-stdout"));
    f.install(&f.misbehave("steady", "ok"));
    f.start_daemon();
    let steady = f.wait_state("steady", "ready", Duration::from_secs(20))["pid"]
        .as_u64()
        .unwrap();
    let t = Instant::now();
    let s = f.wait_for("mute", Duration::from_secs(20), |s| {
        s["restarts"].as_u64().unwrap_or(0) >= 1 && s["recent_exits"][0]["cause"] == "closed-stdout"
    });
    let error = s["last_error"].as_str().unwrap_or("").to_owned();
    let human = f.conduit(&["ext", "status", "mute"]).stdout();
    let healthy = steady_answers_with(&f, steady);
    let ok = error.contains("closed its stdout") && human.contains("closed its stdout") && healthy;
    report(
        "closed-stdout",
        "status says `closed stdout` (not just SIGKILL) and it is restarted; steady keeps its pid",
        &format!(
            "seen after {} ms: last_error \"{error}\"; restarts {}",
            t.elapsed().as_millis(),
            s["restarts"]
        ),
        ok,
    );
    assert!(ok, "{s:#}\n{human}{}", f.context());
    // The record is kept across disable.
    f.conduit(&["ext", "disable", "mute"]);
    let s = f.wait_state("mute", "disabled", Duration::from_secs(20));
    assert!(
        s["recent_exits"]
            .as_array()
            .is_some_and(|a| a.iter().any(|r| r["cause"] == "closed-stdout")),
        "{s:#}"
    );
}

/// POST a call to `name`'s `echo` with a `size`-byte string; the answer's JSON and how long it
/// took.
fn api_echo(
    socket: &std::path::Path,
    name: &str,
    size: usize,
    timeout_ms: u64,
) -> (Value, Duration) {
    use std::io::{Read, Write};
    let t = Instant::now();
    let body = format!(
        "{{\"method\":\"echo\",\"params\":\"{}\",\"timeout_ms\":{timeout_ms}}}",
        "x".repeat(size)
    );
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    write!(
        s,
        "POST /v1/extensions/{name}/call HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let json = text
        .split("\r\n\r\n")
        .nth(1)
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (json, t.elapsed())
}

fn rss_kib(pid: i32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn drill_an_extension_that_stops_reading_costs_a_bounded_amount() {
    let mut f = Fixture::new();
    f.install(&f.escape("deaf", "stop-reading"));
    f.install(&f.misbehave("steady", "ok"));
    f.start_daemon();
    f.wait_state("deaf", "ready", Duration::from_secs(20));
    let steady = f.wait_state("steady", "ready", Duration::from_secs(20))["pid"]
        .as_u64()
        .unwrap();
    let daemon = f.daemon_pid();
    let before = rss_kib(daemon, "VmRSS:");
    let socket = f.state().join("run/conduit.sock");
    // 128 callers of 600 KiB each: 75 MiB of frames for a peer that reads nothing.
    let callers: Vec<_> = (0..128)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || api_echo(&socket, "deaf", 600 * 1024, 10_000))
        })
        .collect();
    let answers: Vec<(Value, Duration)> = callers.into_iter().map(|c| c.join().unwrap()).collect();
    let peak = rss_kib(daemon, "VmHWM:");
    let overloaded: Vec<Duration> = answers
        .iter()
        .filter(|(v, _)| v["error"]["name"] == "overloaded")
        .map(|(_, d)| *d)
        .collect();
    let timed_out = answers
        .iter()
        .filter(|(v, _)| v["error"]["name"] == "deadline_exceeded")
        .count();
    let slowest_refusal = overloaded.iter().max().copied().unwrap_or_default();
    // Inside the daemon (the call itself, not the HTTP parsing queued behind 127 others).
    let refusal_in_call = answers
        .iter()
        .filter(|(v, _)| v["error"]["name"] == "overloaded")
        .filter_map(|(v, _)| v["took_us"].as_u64())
        .max()
        .map_or(Duration::ZERO, Duration::from_micros);
    let grown_mib = peak.saturating_sub(before) as f64 / 1024.0;
    let healthy = steady_answers_with(&f, steady);
    let ok = !overloaded.is_empty()
        && refusal_in_call < Duration::from_secs(1)
        && overloaded.len() + timed_out == answers.len()
        && grown_mib < 200.0
        && healthy;
    report(
        "stopped-reading",
        "past 48 MiB held, a call fails at once (< 1 s in the call) with overloaded; the daemon's peak RSS grows < 200 MiB; steady keeps its pid",
        &format!(
            "{} of 128 calls refused overloaded (slowest {} µs in the call, {} ms with HTTP), {timed_out} hit their 10 s deadline; peak RSS +{grown_mib:.0} MiB (from {} MiB)",
            overloaded.len(),
            refusal_in_call.as_micros(),
            slowest_refusal.as_millis(),
            before / 1024
        ),
        ok,
    );
    assert!(
        ok,
        "{:?}{}",
        answers
            .iter()
            .map(|(v, _)| v["error"]["name"].clone())
            .collect::<Vec<_>>(),
        f.context()
    );
}
