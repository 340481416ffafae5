//! The supervisor against real processes: a Python test extension that misbehaves on command
//! (`fixtures/misbehave.py`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use conduit_protocol::ErrorCode;
use conduit_supervisor::tree::group_alive;
use conduit_supervisor::{
    ExitCause, ExtensionSpec, Requester, State, StopRequest, Supervisor, no_callbacks,
};
use serde_json::{Value, json};

mod common;
use common::fixture_spec;

struct Env {
    sup: Supervisor,
    dir: tempfile::TempDir,
}

fn env() -> Env {
    Env {
        sup: Supervisor::new(no_callbacks()),
        dir: tempfile::tempdir().unwrap(),
    }
}

fn spec(env: &Env, name: &str, mode: &str) -> ExtensionSpec {
    fixture_spec(env.dir.path(), name, "misbehave.py", mode)
}

const READY: Duration = common::PATIENCE;

/// How many bytes process `pid` has read so far (`rchar` of `/proc/PID/io`).
fn bytes_read(pid: i32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Polls until `pid` has read more than `before` bytes: a request has reached it.
async fn wait_read_past(pid: i32, before: u64) {
    let start = Instant::now();
    while bytes_read(pid) <= before {
        assert!(
            start.elapsed() < READY,
            "process {pid} never read the request"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_extension_becomes_ready_answers_and_stops_cleanly() {
    let env = env();
    let ext = env.sup.start(spec(&env, "ok", "ok")).await;
    assert_eq!(
        ext.wait_for(READY, |s| s == State::Ready).await,
        Ok(State::Ready)
    );
    let v: Value = common::call(
        &ext,
        "echo",
        json!({ "text": "hi" }),
        Some(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    assert_eq!(v, json!({ "text": "hi" }));
    let st = ext.status();
    assert_eq!(
        (st.state, st.restarts, st.protocol_version),
        (State::Ready, 0, Some(1))
    );
    assert!(st.pid.is_some());
    assert_eq!(st.calls["echo"].count, 1);
    // What the host loop reads every pass agrees with the status, without copying it.
    let run = ext.run_brief();
    assert_eq!(
        (run.state, run.pid, run.restarts, run.handshaken),
        (st.state, st.pid, st.restarts, true)
    );
    let caps = ext
        .capabilities()
        .expect("shared once the handshake is accepted");
    assert_eq!(Some(&*caps), st.capabilities.as_deref());
    assert!(
        std::sync::Arc::ptr_eq(&caps, st.capabilities.as_ref().unwrap()),
        "one copy, shared"
    );
    assert!(caps.methods.iter().any(|m| m == "echo"), "{caps:?}");
    // Its stderr is copied as it comes, and reaches the tail once it is in the log file.
    common::until("the start line to reach the stderr tail", || {
        ext.status()
            .stderr_tail
            .iter()
            .any(|l| l.contains("starting in mode ok"))
    })
    .await;
    env.sup.stop("ok").await;
    let st = ext.status();
    assert_eq!(st.state, State::Stopped);
    assert_eq!(
        st.last_exit.map(|e| e.code),
        Some(Some(0)),
        "shutdown leads to a clean exit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_fails_pending_calls_at_once_then_it_backs_off_and_comes_back() {
    let env = env();
    let ext = env.sup.start(spec(&env, "victim", "ok")).await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    let pid: i32 = common::call(&ext, "pid", json!({}), Some(Duration::from_secs(5)))
        .await
        .unwrap();
    let before = bytes_read(pid);
    let pending = {
        let ext = ext.clone();
        tokio::spawn(async move {
            common::call::<Value>(&ext, "hold", json!({}), Some(Duration::from_secs(30))).await
        })
    };
    // Wait until the extension has read the `hold` request, not for a fixed time.
    wait_read_past(pid, before).await;
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let err = pending.await.unwrap().unwrap_err();
    assert!(err.is(ErrorCode::ExtensionExited), "{err}");
    // At once: not after the call's 30 s deadline (the margin is for a busy machine).
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the pending call waited {:?}",
        t.elapsed()
    );
    let st = ext.wait_for(READY, |s| s == State::BackingOff).await;
    assert!(st.is_ok() || ext.state() == State::Ready, "{st:?}");
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    let st = ext.status();
    assert_eq!(st.restarts, 1);
    assert_eq!(st.last_exit.and_then(|e| e.signal), Some(9));
    let v: Value = common::call(&ext, "echo", json!(7), Some(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(v, json!(7));
    env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_that_exits_at_start_every_time_becomes_crash_looping_with_its_stderr() {
    let env = env();
    let ext = env.sup.start(spec(&env, "broken", "exit-at-start")).await;
    ext.wait_for(READY, |s| s == State::CrashLooping)
        .await
        .unwrap();
    let st = ext.status();
    // The fifth failure is the fourth restart's: `restarts` counts starts after the first.
    assert!(st.restarts >= 4, "{}", st.restarts);
    assert_eq!(st.last_exit.and_then(|e| e.code), Some(3));
    assert!(
        st.stderr_tail
            .iter()
            .any(|l| l.contains("configuration is missing")),
        "{:?}",
        st.stderr_tail
    );
    assert!(st.last_error.unwrap().contains("exit code 3"));
    // Calls fail at once while it is not running.
    let err = common::call::<Value>(&ext, "echo", json!(1), None)
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::ExtensionExited), "{err}");
    env.sup.shutdown().await;
    assert_eq!(ext.state(), State::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_mismatch_is_incompatible_and_never_restarted() {
    let env = env();
    let ext = env.sup.start(spec(&env, "future", "wrong-version")).await;
    ext.wait_for(READY, |s| s == State::Incompatible)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = ext.status();
    assert_eq!((st.state, st.restarts), (State::Incompatible, 0));
    assert!(
        st.last_error.unwrap().contains("extension_versions"),
        "data names both sides' versions"
    );
    env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_an_extension_leaves_no_process_of_its_group() {
    let env = env();
    let ext = env.sup.start(spec(&env, "parent", "grandchildren")).await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    let pgid = ext.status().pid.unwrap();
    assert!(group_alive(pgid));
    env.sup.stop("parent").await;
    assert!(
        !group_alive(pgid),
        "a grandchild of the stopped extension is still alive"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_that_ignores_shutdown_and_sigterm_is_killed_within_bounds() {
    let env = env();
    let ext = env
        .sup
        .start(spec(&env, "stubborn", "ignore-shutdown"))
        .await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    let pgid = ext.status().pid.unwrap();
    let t = Instant::now();
    env.sup.stop("stubborn").await;
    // The stop is bounded by grace (2 s) + SIGTERM wait (2 s); the rest is margin for a busy
    // machine. An unbounded stop would wait here forever.
    assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
    assert!(!group_alive(pgid));
    assert_eq!(ext.status().last_exit.and_then(|e| e.signal), Some(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_mib_of_stderr_stays_within_the_log_cap_and_the_extension_works() {
    let env = env();
    let ext = env.sup.start(spec(&env, "noisy", "stderr-flood")).await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    let v: Value = common::call(
        &ext,
        "echo",
        json!("still here"),
        Some(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    assert_eq!(v, json!("still here"));
    // The log is rotated (renamed, then opened afresh) as it passes its cap: between the two it
    // does not exist for a moment, so wait for it rather than read it once.
    let log = env.dir.path().join("noisy.log");
    let start = Instant::now();
    let size = loop {
        match std::fs::metadata(&log) {
            Ok(m) => break m.len(),
            Err(e) if start.elapsed() > Duration::from_secs(10) => panic!("{}: {e}", log.display()),
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    };
    assert!(size <= 1024 * 1024, "{size}");
    let rotated = std::fs::metadata(env.dir.path().join("noisy.log.1")).map_or(0, |m| m.len());
    assert!(rotated <= 1024 * 1024, "{rotated}");
    env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_stdout_while_alive_is_a_crash_and_the_process_is_killed() {
    let env = env();
    let ext = env.sup.start(spec(&env, "mute", "close-stdout")).await;
    let pgid = {
        // It is ready for an instant, then its stdout closes.
        ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
        ext.status().pid.unwrap()
    };
    ext.wait_for(READY, |s| {
        matches!(s, State::BackingOff | State::CrashLooping)
    })
    .await
    .unwrap();
    assert!(!group_alive(pgid), "the silent process was left running");
    // It is restarted (counted when the new child starts, not at the failure).
    ext.wait_for(Duration::from_secs(10), |s| {
        s == State::Starting || s == State::Ready
    })
    .await
    .unwrap();
    assert!(ext.status().restarts >= 1);
    env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_to_the_handshake_is_a_failure_after_the_start_timeout() {
    let env = env();
    let mut s = spec(&env, "silent", "no-handshake");
    s.start_timeout = Duration::from_millis(300);
    let ext = env.sup.start(s).await;
    ext.wait_for(READY, |s| {
        matches!(s, State::BackingOff | State::CrashLooping)
    })
    .await
    .unwrap();
    assert!(
        ext.status()
            .last_error
            .unwrap()
            .contains("no answer to `initialize`")
    );
    env.sup.shutdown().await;
}

/// Give `s` a preflight that refuses with `why` until the flag it returns is set.
fn refuse_until_allowed(
    s: &mut ExtensionSpec,
    why: &'static str,
) -> Arc<std::sync::atomic::AtomicBool> {
    let allowed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let a = allowed.clone();
    s.preflight = Some(Arc::new(move || {
        if a.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err(why.into())
        }
    }));
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_preflight_is_refused_with_its_reason_until_restarted() {
    let env = env();
    let mut s = spec(&env, "tampered", "ok");
    let allowed = refuse_until_allowed(&mut s, "main.py changed after install");
    let ext = env.sup.start(s).await;
    ext.wait_for(READY, |s| s == State::Refused).await.unwrap();
    assert_eq!(
        ext.status().last_error.as_deref(),
        Some("main.py changed after install")
    );
    // Since when it has been refused is kept; an operator's restart clears it.
    assert!(ext.status().failing_since_ms.is_some());
    allowed.store(true, std::sync::atomic::Ordering::SeqCst);
    ext.restart(StopRequest::operator_restart());
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    assert_eq!(ext.status().failing_since_ms, None);
    env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_when_it_fails_is_kept_across_restarts_until_a_run_is_stable() {
    let looping = env();
    let mut s = spec(&looping, "wobbly", "exit-at-start");
    s.policy = conduit_supervisor::backoff::RestartPolicy {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(40),
        stable_after: Duration::from_millis(300),
        ..Default::default()
    };
    let ext = looping.sup.start(s).await;
    let deadline = Instant::now() + READY;
    // Several failures in a row: the first one's time stays.
    let first = loop {
        let st = ext.status();
        if let Some(at) = st.failing_since_ms {
            break at;
        }
        assert!(Instant::now() < deadline, "{st:#?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    loop {
        let st = ext.status();
        assert_eq!(st.failing_since_ms, Some(first), "{st:#?}");
        if st.restarts >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "{st:#?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    looping.sup.shutdown().await;

    // A host's restart keeps it; a run ready for the stable period clears it.
    let env = env();
    let mut s = spec(&env, "steady", "ok");
    s.policy.stable_after = Duration::from_millis(300);
    let allowed = refuse_until_allowed(&mut s, "not yet");
    let ext = env.sup.start(s).await;
    ext.wait_for(READY, |s| s == State::Refused).await.unwrap();
    let since = ext.status().failing_since_ms;
    assert!(since.is_some());
    allowed.store(true, std::sync::atomic::Ordering::SeqCst);
    ext.restart(StopRequest::unresponsive("test"));
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    assert_eq!(
        ext.status().failing_since_ms,
        since,
        "kept across the host's restart"
    );
    let deadline = Instant::now() + READY;
    while ext.status().failing_since_ms.is_some() {
        assert!(
            Instant::now() < deadline,
            "never cleared: {:#?}",
            ext.status()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(ext.state(), State::Ready);
    env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_by_the_host_reads_unlike_an_operators_in_recent_exits() {
    let env = env();
    let ext = env.sup.start(spec(&env, "twice", "ok")).await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    ext.restart(StopRequest::operator_restart());
    let exits = |n: usize| {
        let ext = ext.clone();
        async move {
            let deadline = std::time::Instant::now() + READY;
            loop {
                let st = ext.status();
                if st.recent_exits.len() >= n && st.state == State::Ready {
                    return st.recent_exits;
                }
                assert!(std::time::Instant::now() < deadline, "{st:#?}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let by_operator = exits(1).await[0].clone();
    assert_eq!(by_operator.cause, ExitCause::StoppedByHost);
    assert_eq!(by_operator.requested_by, Some(Requester::Operator));
    assert!(by_operator.restart);
    assert!(
        by_operator
            .summary
            .starts_with("restarted at an operator's request ("),
        "{}",
        by_operator.summary
    );
    ext.restart(StopRequest::unresponsive(
        "2 consecutive in-transaction calls or probes failed; last: no answer within 250ms",
    ));
    let by_host = exits(2).await[0].clone();
    assert_eq!(by_host.cause, ExitCause::StoppedByHost);
    assert_eq!(by_host.requested_by, Some(Requester::Host));
    assert!(
        by_host.summary.starts_with(
            "restarted by the host: unresponsive (2 consecutive in-transaction calls or probes failed; last: no answer within 250ms) ("
        ),
        "{}",
        by_host.summary
    );
    assert_ne!(by_host.summary, by_operator.summary);
    env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_backs_off_with_a_clear_error() {
    let env = env();
    let mut s = spec(&env, "ghost", "ok");
    s.command.program = "/nonexistent/conduit-ghost".into();
    let ext = env.sup.start(s).await;
    ext.wait_for(READY, |s| {
        matches!(s, State::BackingOff | State::CrashLooping)
    })
    .await
    .unwrap();
    let err = ext.status().last_error.unwrap();
    assert!(
        err.contains("cannot start `/nonexistent/conduit-ghost`"),
        "{err}"
    );
    env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_sees_only_the_environment_descriptors_and_folder_it_is_given() {
    // A descriptor of ours without close-on-exec, as a service manager might pass one down.
    let leaked = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDONLY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    // The test process's own environment (CARGO_*, RUST_*, …) must not reach the extension.
    let env = env();
    let ext = env.sup.start(spec(&env, "isolated", "ok")).await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    let vars: std::collections::BTreeMap<String, String> =
        common::call(&ext, "env", json!({}), Some(Duration::from_secs(5)))
            .await
            .unwrap();
    for k in vars.keys() {
        let allowed = conduit_supervisor::process::ENV_ALLOW_LIST.contains(&k.as_str())
            || k == "CONDUIT_EXTENSION";
        assert!(allowed, "the extension sees `{k}`: {vars:?}");
    }
    assert_eq!(
        vars.get("CONDUIT_EXTENSION").map(String::as_str),
        Some("isolated")
    );
    let fds: Vec<i32> = common::call(&ext, "fds", json!({}), Some(Duration::from_secs(5)))
        .await
        .unwrap();
    // 0, 1, 2 and the one `listdir` itself opened.
    assert!(
        fds.len() <= 4 && fds[..3] == [0, 1, 2],
        "open descriptors: {fds:?} (ours leaked: {leaked:?})"
    );
    let cwd: String = common::call(&ext, "cwd", json!({}), Some(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(
        std::path::Path::new(&cwd),
        common::fixtures().canonicalize().unwrap()
    );
    env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_handshake_that_never_comes_is_not_kept_waiting() {
    let env = env();
    let mut s = spec(&env, "mute-start", "no-handshake");
    s.start_timeout = Duration::from_secs(30);
    let ext = env.sup.start(s).await;
    ext.wait_for(READY, |_| ext.status().pid.is_some())
        .await
        .ok();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    env.sup.stop("mute-start").await;
    // Not the 30 s start timeout; the margin is for a busy machine.
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the stop waited {:?}",
        t.elapsed()
    );
    assert_eq!(ext.state(), State::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_is_listed_as_starting_while_the_old_one_stops() {
    let env = env();
    let ext = env.sup.start(spec(&env, "swap", "ignore-shutdown")).await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    // The old one ignores shutdown and SIGTERM: its stop takes seconds. Meanwhile the new one
    // is already listed, starting — never a gap in which the extension is unknown.
    let new = env.sup.start(spec(&env, "swap", "ok")).await;
    let listed = env.sup.get("swap").expect("listed at once");
    assert_eq!(listed.state(), State::Starting);
    new.wait_for(READY, |s| s == State::Ready).await.unwrap();
    assert_eq!(ext.state(), State::Stopped);
    env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_an_oversized_line_and_a_callback_flood_leave_the_extension_serving() {
    let env = env();
    let ext = env.sup.start(spec(&env, "rowdy", "ok")).await;
    ext.wait_for(READY, |s| s == State::Ready).await.unwrap();
    // Garbage, then a line over 16 MiB, then the answer: the host discards the first two and
    // still reads the third.
    let v: Value = common::call(&ext, "garbage", json!({}), Some(Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(v, json!("survived"));
    // 200 callbacks at once to a host that serves none of them (every one is answered, at
    // most 64 in flight: the rest `overloaded`, or `method_not_found`).
    let n: u64 = common::call(
        &ext,
        "flood",
        json!({ "n": 200 }),
        Some(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    assert_eq!(n, 200);
    let start = Instant::now();
    let answered = loop {
        let tail = ext.status().stderr_tail;
        let count = tail
            .iter()
            .filter(|l| l.starts_with("callback answer"))
            .count();
        if count >= 20 || start.elapsed() > Duration::from_secs(10) {
            break tail;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        answered.iter().any(|l| l.starts_with("callback answer")),
        "{answered:?}"
    );
    let v: Value = common::call(&ext, "echo", json!("still"), Some(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(v, json!("still"));
    let st = ext.status();
    assert_eq!(
        (st.state, st.restarts),
        (State::Ready, 0),
        "the session survived all of it"
    );
    env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_of_many_starting_extensions_run_at_most_one_per_cpu_at_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let env = env();
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut exts = Vec::new();
    // Three times as many as may run at once, each check slow enough to overlap the others.
    for i in 0..3 * cpus {
        let mut s = spec(&env, &format!("many-{i}"), "ok");
        let (running, most) = (running.clone(), most.clone());
        s.preflight = Some(Arc::new(move || {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(100));
            running.fetch_sub(1, Ordering::SeqCst);
            Err("refused by the test".into())
        }));
        exts.push(env.sup.start(s).await);
    }
    for ext in &exts {
        ext.wait_for(READY, |s| s == State::Refused).await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        (1..=cpus).contains(&most),
        "{most} preflights ran at once on {cpus} CPUs"
    );
    env.sup.shutdown().await;
}
