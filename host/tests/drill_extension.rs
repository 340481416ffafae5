//! The extension drills (listed with their bounds and figures in
//! `docs/reliability.md`): a real daemon runs a misbehaving test extension
//! (`host/supervisor/tests/fixtures/misbehave.py`, the misbehaviour chosen by its argument or
//! by the method called) beside a healthy one, and each drill checks the same five things:
//! the daemon stays up, the healthy extension keeps answering with the same pid, the caller's
//! error arrives within its bound (measured and reported), the status says what happened, and
//! no process of the misbehaving extension is left. Each records one line for `make drill`.
//!
//! Clocks: only the bound that is the feature is asserted on wall-clock time, and upper bounds
//! carry a generous margin for a busy machine; everything else is waited for by polling.

mod support;

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use support::drill::report;
use support::fixture::{Fixture, kill, spawner_of, wait_gone};

/// How long any condition that should come quickly is waited for before the drill fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// A daemon running the misbehaving package `victim` (misbehave.py in `mode`) and the healthy
/// package `steady`, both up (or, for `victim`, started).
struct Drill {
    f: Fixture,
    steady_pid: i64,
}

impl Drill {
    fn new(mode: &str) -> Self {
        let mut f = Fixture::new();
        f.install(&f.misbehave("steady", "ok"));
        f.install(&f.misbehave("victim", mode));
        f.start_daemon();
        let steady_pid = f.wait_state("steady", "ready", PATIENCE)["pid"]
            .as_i64()
            .unwrap();
        Drill { f, steady_pid }
    }

    /// The victim's pid once it is `ready`.
    fn victim_ready(&self) -> i32 {
        let pid = self.f.wait_state("victim", "ready", PATIENCE)["pid"]
            .as_u64()
            .unwrap() as u32;
        // What "no process left" is later checked with sees this one now.
        assert_eq!(ext_processes(&self.f, "victim"), vec![pid]);
        pid as i32
    }

    /// `conduit ext call`: its JSON output, how long it took, its exit code.
    fn call(
        &self,
        ext: &str,
        method: &str,
        params: &str,
        timeout_ms: u64,
    ) -> (Value, Duration, i32) {
        let t = Instant::now();
        let run = self.f.conduit(&[
            "ext",
            "call",
            ext,
            method,
            params,
            "--timeout-ms",
            &timeout_ms.to_string(),
        ]);
        let took = t.elapsed();
        let v = serde_json::from_slice(&run.out.stdout).unwrap_or(Value::Null);
        (v, took, run.code().unwrap_or(-1))
    }

    /// The same, started in the background.
    fn spawn_call(&self, ext: &str, method: &str, params: &str, timeout_ms: u64) -> Child {
        self.f
            .command(&[
                "ext",
                "call",
                ext,
                method,
                params,
                "--timeout-ms",
                &timeout_ms.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The daemon runs, and `steady` is ready with the pid it started with and answers.
    #[track_caller]
    fn assert_others_untouched(&mut self) {
        let f = &mut self.f;
        assert!(
            f.daemon.as_mut().unwrap().try_wait().unwrap().is_none(),
            "the daemon exited{}",
            f.context()
        );
        let s = f.status("steady");
        assert_eq!(
            (
                s["state"].as_str(),
                s["pid"].as_i64(),
                s["restarts"].as_i64()
            ),
            (Some("ready"), Some(self.steady_pid), Some(0)),
            "the healthy extension was disturbed: {s:#}{}",
            f.context()
        );
        let run = f.conduit(&["ext", "call", "steady", "echo", r#"{"still":"here"}"#]);
        assert_eq!(
            run.stdout().trim(),
            "{\n  \"still\": \"here\"\n}",
            "{}",
            run.context()
        );
    }

    /// Disable the victim and wait until none of its processes is left.
    #[track_caller]
    fn disable_victim_and_expect_nothing_left(&self) {
        let run = self.f.conduit(&["ext", "disable", "victim"]);
        assert_eq!(run.code(), Some(0), "{}", run.context());
        self.f.wait_state("victim", "disabled", PATIENCE);
        let left = wait_until_none(&self.f, "victim");
        assert!(
            left.is_empty(),
            "processes of `victim` left: {left:?}{}",
            self.f.context()
        );
    }

    fn log(&self, ext: &str) -> String {
        std::fs::read_to_string(self.f.state().join("logs").join(format!("{ext}.log")))
            .unwrap_or_default()
    }

    /// Poll the extension's log until it contains `needle`.
    #[track_caller]
    fn wait_log(&self, ext: &str, needle: &str) {
        let start = Instant::now();
        while !self.log(ext).contains(needle) {
            assert!(
                start.elapsed() < PATIENCE,
                "`{ext}` never logged {needle:?}; its log:\n{}{}",
                self.log(ext),
                self.f.context()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Every live process the daemon of `f` started for package `name`, or that one of those
/// started: each carries `CONDUIT_DATA_DIR=<state>/data/<name>` in its environment, which no
/// process of another fixture can.
fn ext_processes(f: &Fixture, name: &str) -> Vec<u32> {
    let marker = format!(
        "CONDUIT_DATA_DIR={}",
        f.state().join("data").join(name).display()
    );
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // A zombie has an empty environment, so it never matches.
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|v| v == marker.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

/// Poll until no process of `name` is left; what is left after [`PATIENCE`].
fn wait_until_none(f: &Fixture, name: &str) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let left = ext_processes(f, name);
        if left.is_empty() || start.elapsed() > PATIENCE {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The output of a background call, parsed, and how long after `since` it ended.
fn finish(child: Child, since: Instant) -> (Value, Duration, String) {
    let out = child.wait_with_output().unwrap();
    let took = since.elapsed();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let text = format!(
        "exit {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (v, took, text)
}

/// The daemon's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib(f: &Fixture) -> u64 {
    memory_kib(f, "VmHWM:")
}

/// A `/proc/<daemon>/status` memory figure, in KiB.
fn memory_kib(f: &Fixture, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", f.daemon_pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

#[test]
fn sigkill_mid_call() {
    let mut d = Drill::new("ok");
    let pid = d.victim_ready();
    let call = d.spawn_call("victim", "hold", "{}", 60_000);
    d.wait_log("victim", "holding call");
    let t = Instant::now();
    kill(pid, Signal::SIGKILL);
    let (v, took, out) = finish(call, t);
    assert_eq!(v["error"]["name"], "extension_exited", "{out}");
    let bound = Duration::from_secs(3);
    report(
        "sigkill-mid-call",
        "pending call fails extension_exited < 3 s",
        &ms(took),
        took < bound,
    );
    assert!(took < bound, "the pending call took {took:?} to fail");

    let s = d.f.wait_for("victim", PATIENCE, |s| {
        s["state"] == "ready" && s["restarts"] == 1
    });
    assert_eq!(s["last_exit"]["signal"], 9, "{s:#}");
    assert_eq!(s["calls"]["hold"]["errors"], 1, "{s:#}");
    assert_ne!(s["pid"].as_i64(), Some(i64::from(pid)));
    assert!(wait_gone(pid as u32, PATIENCE).is_empty());
    d.assert_others_untouched();
    d.disable_victim_and_expect_nothing_left();
}

#[test]
fn exit_during_the_handshake() {
    let mut d = Drill::new("exit-in-handshake");
    // Between two runs (a new run starts with an empty stderr tail), so the tail shows what
    // the last one said.
    let s = d.f.wait_for("victim", PATIENCE, |s| {
        s["restarts"].as_i64() >= Some(2)
            && s["last_exit"]["code"] == 4
            && s["stderr_tail"]
                .to_string()
                .contains("exiting without an answer")
    });
    let error = s["last_error"].as_str().unwrap_or("");
    assert!(
        error.contains("handshake") && error.contains("exit code 4"),
        "the status names the failed handshake: {s:#}"
    );
    assert!(
        s["stderr_tail"]
            .to_string()
            .contains("exiting without an answer"),
        "{s:#}"
    );
    // A caller is refused at once while it is not ready.
    let (v, took, code) = d.call("victim", "echo", "{}", 30_000);
    assert_eq!(code, 1, "{v:#}");
    assert!(v["error"]["message"].as_str().is_some(), "{v:#}");
    let bound = Duration::from_secs(3);
    report(
        "exit-in-handshake",
        "a call to it fails at once < 3 s",
        &ms(took),
        took < bound,
    );
    assert!(took < bound, "the call took {took:?}");
    d.assert_others_untouched();
    d.disable_victim_and_expect_nothing_left();
}

#[test]
fn never_answers_the_handshake() {
    let mut f = Fixture::new();
    f.install(&f.misbehave("steady", "ok"));
    f.install(&f.misbehave("victim", "no-handshake"));
    let t0 = Instant::now(); // before the victim can have been spawned
    f.start_daemon();
    let steady_pid = f.wait_state("steady", "ready", PATIENCE)["pid"]
        .as_i64()
        .unwrap();
    let mut d = Drill { f, steady_pid };
    let first = d.f.wait_for("victim", PATIENCE, |s| s["pid"].is_i64());
    assert_eq!(first["state"], "starting");
    let pid = first["pid"].as_i64().unwrap() as u32;
    let (v, _, code) = d.call("victim", "echo", "{}", 30_000);
    assert_eq!(code, 1, "a call while starting is refused: {v:#}");

    let s =
        d.f.wait_for("victim", Duration::from_secs(40), |s| s["restarts"] == 1);
    let took = t0.elapsed();
    assert!(
        s["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("no answer to `initialize` within 10s"),
        "{s:#}"
    );
    // The start timeout is 10 s from the spawn, which came after t0; seen by polling, so late.
    let ok = took >= Duration::from_secs(10) && took < Duration::from_secs(25);
    report(
        "no-handshake",
        "given up at the 10 s start timeout (>= 10 s, < 25 s)",
        &ms(took),
        ok,
    );
    assert!(ok, "the failure came {took:?} after the daemon started");
    assert!(
        wait_gone(pid, PATIENCE).is_empty(),
        "the silent child was not killed"
    );
    d.assert_others_untouched();
    d.disable_victim_and_expect_nothing_left();
}

#[test]
fn wrong_protocol_version() {
    let mut d = Drill::new("wrong-version");
    let t = Instant::now();
    let s = d.f.wait_state("victim", "incompatible", PATIENCE);
    assert!(
        s["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("extension_versions"),
        "the status says which versions it offered: {s:#}"
    );
    let left = wait_until_none(&d.f, "victim");
    assert!(
        left.is_empty(),
        "an incompatible extension still runs: {left:?}"
    );
    let (v, took, code) = d.call("victim", "echo", "{}", 30_000);
    assert_eq!(code, 1, "{v:#}");
    d.assert_others_untouched();
    // Never restarted: 1 s covers the first three backoff delays (100 + 200 + 400 ms).
    while t.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = d.f.status("victim");
    assert_eq!(
        (s["state"].as_str(), s["restarts"].as_i64()),
        (Some("incompatible"), Some(0)),
        "{s:#}"
    );
    let bound = Duration::from_secs(3);
    report(
        "wrong-version",
        "incompatible, not restarted; a call fails < 3 s",
        &ms(took),
        took < bound,
    );
    assert!(took < bound, "the call took {took:?}");
    d.disable_victim_and_expect_nothing_left();
}

#[test]
fn banner_and_garbage_on_stdout() {
    let mut d = Drill::new("banner");
    let pid = d.victim_ready();
    let (v, took_noise, _) = d.call("victim", "noise", "{}", 30_000);
    assert_eq!(v, "survived", "{v:#}{}", d.f.context());
    // A garbage line and a line over 16 MiB for an id nobody asked for, then the answer.
    let (v, took_garbage, _) = d.call("victim", "garbage", "{}", 60_000);
    assert_eq!(v, "survived", "{v:#}{}", d.f.context());
    let s = d.f.status("victim");
    assert_eq!(
        (s["pid"].as_i64(), s["restarts"].as_i64()),
        (Some(i64::from(pid)), Some(0)),
        "{s:#}"
    );
    assert_eq!(s["calls"]["noise"]["errors"], 0, "{s:#}");
    let (v, _, _) = d.call("victim", "echo", r#"{"n":1}"#, 30_000);
    assert_eq!(v["n"], 1);
    let bound = Duration::from_secs(10);
    let ok = took_noise < bound && took_garbage < bound;
    report(
        "banner-and-garbage",
        "answers after banner, garbage and a 16 MiB stray line < 10 s",
        &format!(
            "{} ms after garbage, {} ms after the stray line",
            took_noise.as_millis(),
            took_garbage.as_millis()
        ),
        ok,
    );
    assert!(ok);
    d.assert_others_untouched();
    d.disable_victim_and_expect_nothing_left();
}

#[test]
fn half_a_line_then_silence() {
    let mut d = Drill::new("ok");
    let pid = d.victim_ready();
    // Half an answer, then a silent stdout: the caller gets its own deadline, no sooner.
    let (v, took, _) = d.call("victim", "half", "{}", 1000);
    assert_eq!(v["error"]["name"], "deadline_exceeded", "{v:#}");
    let ok = took >= Duration::from_secs(1) && took < Duration::from_secs(5);
    let s = d.f.status("victim");
    assert_eq!(
        (s["state"].as_str(), s["pid"].as_i64()),
        (Some("ready"), Some(i64::from(pid))),
        "{s:#}"
    );
    assert_eq!(s["calls"]["half"]["errors"], 1, "{s:#}");
    // The operator's restart ends it; the new one serves.
    let run = d.f.conduit(&["ext", "restart", "victim"]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
    assert!(wait_gone(pid as u32, PATIENCE).is_empty());
    let pid = d.f.wait_for("victim", PATIENCE, |s| {
        s["state"] == "ready" && s["pid"].as_i64() != Some(i64::from(pid))
    })["pid"]
        .as_i64()
        .unwrap() as i32;

    // Half an answer, then exit: the truncated line is dropped and the call fails at once.
    let (v, took_exit, _) = d.call("victim", "half", r#"{"then":"exit"}"#, 60_000);
    assert_eq!(v["error"]["name"], "extension_exited", "{v:#}");
    let ok = ok && took_exit < Duration::from_secs(3);
    report(
        "half-a-line",
        "then silence: its deadline (1 s, < 5 s); then exit: extension_exited < 3 s",
        &format!("{} ms; {} ms", took.as_millis(), took_exit.as_millis()),
        ok,
    );
    assert!(
        ok,
        "half then silence took {took:?}, half then exit {took_exit:?}"
    );
    // Two restarts: the operator's, then the one after the exit (`restarts` counts every
    // new start after the first).
    let s = d.f.wait_for("victim", PATIENCE, |s| {
        s["state"] == "ready" && s["restarts"] == 2
    });
    assert_eq!(s["last_exit"]["code"], 0, "{s:#}");
    assert!(wait_gone(pid as u32, PATIENCE).is_empty());
    d.assert_others_untouched();
    d.disable_victim_and_expect_nothing_left();
}

#[test]
fn a_17_mib_line() {
    let mut d = Drill::new("ok");
    let pid = d.victim_ready();
    let before = memory_kib(&d.f, "VmRSS:");
    let (v, took, _) = d.call("victim", "big", r#"{"mib":17}"#, 60_000);
    assert_eq!(v["error"]["name"], "message_too_large", "{v:#}");
    let (v, _, _) = d.call("victim", "echo", r#"{"n":2}"#, 30_000);
    assert_eq!(v["n"], 2, "the session serves on after the oversized line");
    let s = d.f.status("victim");
    assert_eq!(
        (s["pid"].as_i64(), s["restarts"].as_i64()),
        (Some(i64::from(pid)), Some(0)),
        "{s:#}"
    );
    assert_eq!(s["calls"]["big"]["errors"], 1, "{s:#}");
    let peak = peak_rss_kib(&d.f);
    // The session's read buffer gives back what it grew to for the line.
    let after = memory_kib(&d.f, "VmRSS:");
    let ok = took < Duration::from_secs(10) && peak < 128 * 1024 && after < before + 8 * 1024;
    report(
        "line-of-17-mib",
        "caller gets message_too_large < 10 s; daemon RSS peak < 128 MiB, after < before + 8 MiB",
        &format!(
            "{} ms; RSS {} MiB before, peak {}, after {}",
            took.as_millis(),
            before / 1024,
            peak / 1024,
            after / 1024
        ),
        ok,
    );
    assert!(
        ok,
        "took {took:?}; RSS {before} KiB before, peak {peak}, after {after}"
    );
    d.assert_others_untouched();
    d.disable_victim_and_expect_nothing_left();
}

#[test]
fn a_callback_flood_past_64() {
    let mut d = Drill::new("ok");
    let pid = d.victim_ready();
    // 64 callbacks held open on the host (artifact chunks waiting for a chunk 0 never sent),
    // then 100 more: every one of those is refused `overloaded` (-32000) at once.
    let t = Instant::now();
    let (v, _, _) = d.call("victim", "pin-flood", r#"{"n":100}"#, 60_000);
    let took = t.elapsed();
    let codes = |k: &str| -> Vec<Value> { v[k].as_array().cloned().unwrap_or_default() };
    let all = |k: &str, code: Value| codes(k).iter().all(|c| *c == code);
    assert_eq!(codes("flood").len(), 100, "{v:#}{}", d.f.context());
    assert!(
        all("flood", Value::from(-32000)),
        "past 64, each is refused overloaded: {v:#}"
    );
    // The 64 held ones were all taken (none refused); cancelled, each is answered `cancelled`,
    // and the slots are free again.
    assert_eq!(codes("held").len(), 64, "{v:#}");
    assert!(all("held", Value::from(-32001)), "{v:#}");
    assert!(all("aborted", Value::Null), "{v:#}");
    assert_eq!(
        v["after"],
        Value::Null,
        "a callback after the flood is served: {v:#}"
    );

    // And a burst of 1000 callbacks sent without waiting: each is answered exactly once,
    // served or refused `overloaded`.
    let n = 1000;
    let (v, _, _) = d.call("victim", "flood", &format!(r#"{{"n":{n}}}"#), 30_000);
    assert_eq!(v, n, "{v:#}");
    let start = Instant::now();
    let (served, refused) = loop {
        let log = d.log("victim");
        let answers: Vec<&str> = log
            .lines()
            .filter_map(|l| l.strip_prefix("callback answer: "))
            .collect();
        if answers.len() >= n {
            assert!(
                answers.iter().all(|a| *a == "None" || *a == "-32000"),
                "answers other than a result or `overloaded`: {answers:?}"
            );
            let served = answers.iter().filter(|a| **a == "None").count();
            break (served, answers.len() - served);
        }
        assert!(
            start.elapsed() < PATIENCE,
            "{} of {n} callbacks answered",
            answers.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(served + refused, n, "each callback answered once");
    let (v, _, _) = d.call("victim", "echo", r#"{"n":3}"#, 30_000);
    assert_eq!(v["n"], 3);
    let s = d.f.status("victim");
    assert_eq!(
        (s["pid"].as_i64(), s["restarts"].as_i64()),
        (Some(i64::from(pid)), Some(0)),
        "{s:#}"
    );
    let ok = took < Duration::from_secs(10);
    report(
        "callback-flood",
        "64 held + 100 more: all 100 refused overloaded, the 64 served on, < 10 s",
        &format!(
            "{} ms; a burst of 1000: {served} served, {refused} overloaded",
            took.as_millis()
        ),
        ok,
    );
    assert!(ok, "took {took:?}");
    d.assert_others_untouched();
    d.disable_victim_and_expect_nothing_left();
    let left: Vec<_> = std::fs::read_dir(d.f.state().join("tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "aborted streams left files: {left:?}");
}

#[test]
fn an_ignored_cancel() {
    let mut d = Drill::new("ok");
    let pid = d.victim_ready();
    let (v, took, _) = d.call("victim", "ignore-cancel", r#"{"late_ms":300}"#, 1000);
    assert_eq!(v["error"]["name"], "deadline_exceeded", "{v:#}");
    // The host said `$/cancel`; the extension answered anyway; the late answer hurt nothing.
    d.wait_log("victim", "ignoring $/cancel for");
    d.wait_log("victim", "sent the late answer");
    let (v, _, _) = d.call("victim", "echo", r#"{"n":4}"#, 30_000);
    assert_eq!(v["n"], 4);
    let s = d.f.status("victim");
    assert_eq!(
        (s["pid"].as_i64(), s["restarts"].as_i64()),
        (Some(i64::from(pid)), Some(0)),
        "{s:#}"
    );
    assert_eq!(s["calls"]["ignore-cancel"]["errors"], 1, "{s:#}");
    let ok = took >= Duration::from_secs(1) && took < Duration::from_secs(5);
    report(
        "ignored-cancel",
        "its caller gets deadline_exceeded at 1 s (< 5 s)",
        &ms(took),
        ok,
    );
    assert!(ok, "took {took:?}");
    d.assert_others_untouched();
    d.disable_victim_and_expect_nothing_left();
}

#[test]
fn sigterm_proof_on_stop() {
    let mut d = Drill::new("ignore-shutdown");
    let pid = d.victim_ready();
    let t = Instant::now();
    let run = d.f.conduit(&["ext", "disable", "victim"]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
    let left = wait_gone(pid as u32, PATIENCE);
    let took = t.elapsed();
    assert!(left.is_empty(), "still running: {left:?}");
    d.f.wait_state("victim", "disabled", PATIENCE);
    // A disabled package shows no run any more; the daemon's log says how it was stopped.
    let log = std::fs::read_to_string(d.f.daemon_log()).unwrap();
    assert!(
        log.contains("did not exit after shutdown; sending SIGTERM")
            && log.contains("did not exit after SIGTERM; sending SIGKILL"),
        "the daemon's log names both escalations{}",
        d.f.context()
    );
    // shutdown → 5 s for an exit → SIGTERM (ignored) → 2 s → SIGKILL: never before 7 s.
    let ok = took >= Duration::from_millis(6900) && took < Duration::from_secs(20);
    report(
        "sigterm-proof-stop",
        "SIGKILLed after shutdown + SIGTERM graces (>= 7 s, < 20 s)",
        &ms(took),
        ok,
    );
    assert!(ok, "stopped after {took:?}");
    assert!(ext_processes(&d.f, "victim").is_empty());
    d.assert_others_untouched();
}

#[test]
fn a_crash_loop_follows_the_backoff_schedule() {
    let mut d = Drill::new("crash-loop");
    let spawns = d.f.state().join("data/victim/spawns");
    let start = Instant::now();
    let times: Vec<(f64, f64)> = loop {
        let text = std::fs::read_to_string(&spawns).unwrap_or_default();
        let times: Vec<(f64, f64)> = text
            .lines()
            .filter_map(|l| {
                let (a, b) = l.split_once(' ')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect();
        if times.len() >= 6 {
            break times;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "only {} spawns: {text}{}",
            times.len(),
            d.f.context()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let s = d.f.wait_state("victim", "crash-looping", PATIENCE);
    assert_eq!(s["last_exit"]["code"], 3, "{s:#}");
    d.disable_victim_and_expect_nothing_left();
    // The n-th failure waits 100 ms × 2^(n−1) ± 20% after the exit was seen, so the next spawn
    // is at least 0.8 × that after the exit (strict); the upper bound allows a busy machine.
    let mut gaps = Vec::new();
    let mut ok = true;
    for k in 0..5 {
        let delay = 0.1 * f64::from(1u32 << k);
        let gap = times[k + 1].0 - times[k].1;
        gaps.push(format!("{:.0}", gap * 1000.0));
        ok &= gap >= 0.8 * delay && gap <= 1.2 * delay + 2.0;
    }
    report(
        "crash-loop",
        "spawn gaps >= 0.8 × 100,200,400,800,1600 ms (<= 1.2× + 2 s)",
        &format!("gaps {} ms", gaps.join(",")),
        ok,
    );
    assert!(ok, "gaps after each exit (ms): {gaps:?}");
    d.assert_others_untouched();
}

#[test]
fn a_hundred_mib_on_stderr() {
    let mut d = Drill::new("ok");
    let pid = d.victim_ready();
    let (v, took, _) = d.call("victim", "spew", r#"{"mib":100}"#, 120_000);
    assert_eq!(v, 100, "{v:#}");
    let s = d.f.wait_for("victim", PATIENCE, |s| {
        s["stderr_tail"].to_string().contains("spew done")
    });
    assert_eq!(
        (s["pid"].as_i64(), s["restarts"].as_i64()),
        (Some(i64::from(pid)), Some(0)),
        "{s:#}"
    );
    let logs = d.f.state().join("logs");
    let size = |p: PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let (cur, prev) = (
        size(logs.join("victim.log")),
        size(logs.join("victim.log.1")),
    );
    let peak = peak_rss_kib(&d.f);
    let ok = cur <= 1 << 20 && prev <= 1 << 20 && peak < 128 * 1024;
    report(
        "stderr-100-mib",
        "log <= 1 MiB + 1 MiB rotated; daemon peak RSS < 128 MiB",
        &format!(
            "{cur} + {prev} bytes; peak RSS {} MiB; written in {} ms",
            peak / 1024,
            took.as_millis()
        ),
        ok,
    );
    assert!(ok, "log {cur} + {prev} bytes, peak {peak} KiB");
    let (v, _, _) = d.call("victim", "echo", r#"{"n":5}"#, 30_000);
    assert_eq!(v["n"], 5);
    let logs = d.f.conduit(&["ext", "logs", "victim", "-n", "3"]);
    assert_eq!(logs.stdout().lines().count(), 3, "{}", logs.context());
    assert!(logs.stdout().contains("spew done"), "{}", logs.context());
    d.assert_others_untouched();
    d.disable_victim_and_expect_nothing_left();
}

fn event_ids(f: &Fixture) -> Vec<(i64, String)> {
    f.all_events()
        .iter()
        .map(|e| {
            (
                e["id"].as_i64().unwrap(),
                e["delivery_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_daemon_sigkilled_with_extensions_running() {
    let mut f = Fixture::new();
    f.install(&f.misbehave("steady", "ok"));
    f.install(&f.misbehave("victim", "ok"));
    f.install(&f.core_ext("worker", "ok"));
    f.start_daemon();
    let names = ["steady", "victim", "worker"];
    let old: Vec<u32> = names
        .iter()
        .map(|n| f.wait_state(n, "ready", PATIENCE)["pid"].as_u64().unwrap() as u32)
        .collect();
    for i in 0..20 {
        f.push(
            "drill",
            &format!("d-{i}"),
            "job.run",
            &format!(r#"{{"group":"g{}"}}"#, i % 3),
        );
    }
    let before = event_ids(&f);
    assert_eq!(before.len(), 20);
    let d = Drill { f, steady_pid: 0 };
    let call = d.spawn_call("victim", "hold", "{}", 60_000);
    d.wait_log("victim", "holding call");
    let mut f = d.f;

    let spawner = spawner_of(f.daemon_pid());
    let t = Instant::now();
    kill(f.daemon_pid(), Signal::SIGKILL);
    let _ = f.daemon.take().unwrap().wait();
    let (_, took_caller, out) = finish(call, t);
    assert!(
        out.starts_with("exit exit status: 1") && out.contains("the daemon closed the connection"),
        "the cut call must fail, saying the daemon closed it: {out}"
    );
    // Each extension dies with the daemon (parent-death signal).
    for (n, pid) in names.iter().zip(&old) {
        assert!(
            wait_gone(*pid, PATIENCE).is_empty(),
            "`{n}` outlived the killed daemon"
        );
    }
    let took_gone = t.elapsed();
    // And so does the spawner (Linux), which started them.
    if let Some(pid) = spawner {
        assert!(
            wait_gone(pid as u32, PATIENCE).is_empty(),
            "the spawner outlived the killed daemon"
        );
    }

    f.start_daemon();
    let new: Vec<u32> = names
        .iter()
        .map(|n| f.wait_state(n, "ready", PATIENCE)["pid"].as_u64().unwrap() as u32)
        .collect();
    for (n, pid) in names.iter().zip(&new) {
        assert_eq!(
            ext_processes(&f, n),
            vec![*pid],
            "`{n}`: only its new process runs"
        );
    }
    // Every acknowledged event is there, with its id; and work resumes: all get routed.
    let after = event_ids(&f);
    assert_eq!(after, before, "acknowledged events changed across the kill");
    f.push("drill", "after", "job.run", r#"{"group":"g9"}"#);
    let start = Instant::now();
    while !f
        .all_events()
        .iter()
        .all(|e| e.get("routed_at_ms").is_some_and(Value::is_i64))
    {
        assert!(
            start.elapsed() < PATIENCE,
            "events not routed after the restart{}",
            f.context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ok = took_caller < Duration::from_secs(3) && took_gone < Duration::from_secs(5);
    report(
        "daemon-sigkill-running",
        "caller errors < 3 s; extensions gone < 5 s; restart: 20/20 events kept, no orphans",
        &format!(
            "caller {} ms; gone {} ms",
            took_caller.as_millis(),
            took_gone.as_millis()
        ),
        ok,
    );
    assert!(ok, "caller {took_caller:?}, extensions gone {took_gone:?}");
}

#[test]
fn the_daemon_sigkilled_during_an_artifact_upload() {
    use sha2::Digest;
    let mut f = Fixture::new();
    f.install(&f.misbehave("steady", "ok"));
    f.install(&f.core_ext("worker", "ok"));
    f.start_daemon();
    f.wait_state("steady", "ready", PATIENCE);
    f.wait_state("worker", "ready", PATIENCE);
    let d = Drill { f, steady_pid: 0 };
    let (kept, _, _) = d.call(
        "worker",
        "make-artifact",
        r#"{"size":300000,"chunk":65536}"#,
        60_000,
    );
    let kept_id = kept["artifact_id"]
        .as_str()
        .expect("a stored artifact")
        .to_owned();
    let store = d.f.state().join("artifacts/sha256");
    let stored = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&store)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        stored(),
        vec![kept_id.trim_start_matches("sha256:").to_owned()]
    );

    // A big upload on the bulk pipe, killed once its partial file has grown.
    let call = d.spawn_call(
        "worker",
        "make-artifact",
        r#"{"size":268435456,"chunk":65536,"bulk":true}"#,
        120_000,
    );
    let tmp = d.f.state().join("tmp");
    let start = Instant::now();
    let part = loop {
        let part = std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .find(|e| e.metadata().is_ok_and(|m| m.len() > 1 << 20));
        if let Some(p) = part {
            break p.path();
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the upload never started{}",
            d.f.context()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut f = d.f;
    kill(f.daemon_pid(), Signal::SIGKILL);
    let _ = f.daemon.take().unwrap().wait();
    let _ = call.wait_with_output();
    assert_eq!(stored().len(), 1, "a half-written upload reached the store");

    assert!(
        part.exists(),
        "the killed daemon's partial file is what the restart must remove"
    );
    let t = Instant::now();
    f.start_daemon();
    let left = loop {
        let left: Vec<_> = std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        if left.is_empty() || t.elapsed() > PATIENCE {
            break left;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = t.elapsed();
    assert!(
        left.is_empty(),
        "the restart kept partial uploads {left:?}{}",
        f.context()
    );
    assert_eq!(
        stored(),
        vec![kept_id.trim_start_matches("sha256:").to_owned()]
    );
    let out = f.dir.path().join("kept.bin");
    let get = f.conduit(&["artifacts", "get", &kept_id, "-o", out.to_str().unwrap()]);
    assert_eq!(get.code(), Some(0), "{}", get.context());
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes))),
        kept_id
    );
    // Work resumes: a new upload is stored.
    f.wait_state("worker", "ready", PATIENCE);
    let d = Drill { f, steady_pid: 0 };
    let (again, _, _) = d.call(
        "worker",
        "make-artifact",
        r#"{"size":100000,"chunk":65536,"bulk":true}"#,
        60_000,
    );
    assert!(again["artifact_id"].is_string(), "{again:#}");
    assert_eq!(again["bulk"], true, "the new run's bulk pipe: {again:#}");
    assert_eq!(stored().len(), 2);
    let ok = took < Duration::from_secs(10);
    report(
        "daemon-sigkill-artifact",
        "restart removes the partial file (< 10 s), keeps the stored artifact",
        &format!(
            "partial gone {} ms after restart; 1 stored kept",
            took.as_millis()
        ),
        ok,
    );
    assert!(ok);
}
