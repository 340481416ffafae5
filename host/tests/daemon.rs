//! The daemon end to end: the real `conduit` binary (`daemon run` and the CLI), real extension
//! processes, a temporary state directory.
//!
//! Misbehaving packages are staged from `host/supervisor/tests/fixtures/misbehave.py`, a
//! Python extension that misbehaves on command. On failure a test prints the daemon's log and
//! the state directory's listing.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::PATIENCE;
use support::fixture::{
    Fixture, bytes_read, group_members, kill, proc_status, spawner_of, stage_examples, wait_gone,
    wait_read_past, walk,
};

fn http_health_started_at(f: &Fixture) -> i64 {
    use std::io::{Read, Write};
    let mut s =
        std::os::unix::net::UnixStream::connect(f.state().join("run/conduit.sock")).unwrap();
    write!(
        s,
        "GET /v1/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    body["started_at_ms"].as_i64().unwrap()
}

#[test]
fn installed_examples_become_ready_and_serve_through_the_daemon() {
    let mut f = Fixture::new();
    for p in stage_examples(&f) {
        f.install(&p);
    }
    f.start_daemon();
    // Measured on the daemon's own clock, from its start to each extension's handshake, so the
    // CLI's polling does not count.
    let started = http_health_started_at(&f);
    for name in ["echo", "notes", "python-echo"] {
        let s = f.wait_state(name, "ready", PATIENCE);
        // How fast is a benchmark's question (docs/performance.md); a test on a busy machine
        // only checks the order of events and shows the figure.
        let took = s["ready_since_ms"].as_i64().unwrap() - started;
        assert!(took >= 0, "`{name}` was ready before the daemon started");
        eprintln!("`{name}` was ready {took} ms after the daemon started");
        // The current run's cold start, in `ext status --json`.
        let (spawn, handshake) = (s["spawn_to_ready_ms"].as_u64(), s["handshake_ms"].as_u64());
        assert!(
            spawn.is_some() && handshake.is_some() && handshake <= spawn,
            "spawn_to_ready_ms {spawn:?}, handshake_ms {handshake:?}: {s:#}"
        );
        eprintln!("`{name}`: spawn to ready {spawn:?} ms, handshake {handshake:?} ms");
    }
    let list = f.conduit(&["ext", "list", "--json"]);
    let v: Value = serde_json::from_slice(&list.out.stdout).unwrap();
    assert_eq!(v["daemon_running"], true);
    for e in v["extensions"].as_array().unwrap() {
        for key in ["name", "version", "state", "pid", "restarts", "last_exit"] {
            assert!(e.get(key).is_some(), "`{key}` missing from {e:#}");
        }
    }
    // A call through the daemon reaches the extension, and its latency shows in the status.
    let run = f.conduit(&["ext", "call", "echo", "echo", r#"{"text":"hi"}"#]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
    assert_eq!(
        serde_json::from_slice::<Value>(&run.out.stdout).unwrap()["text"],
        "hi"
    );
    assert_eq!(f.status("echo")["calls"]["echo"]["count"], 1);
    // Params at the payload depth limit reach the extension and come back as it answered them;
    // one level deeper is refused before any call.
    let socket = f.state().join("run/conduit.sock");
    let nested = |n: usize| {
        format!(
            r#"{{"method":"echo","params":{{"text":"deep","n":{}{}}}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    let (code, v) =
        support::http::request_text(&socket, "POST", "/v1/extensions/echo/call", &nested(63));
    assert_eq!(code, 200, "{v:#}");
    assert_eq!(v["result"]["text"], "deep", "{v:#}");
    assert!(
        v["result"]["n"].is_array() && v["took_us"].is_u64(),
        "{v:#}"
    );
    let (code, v) =
        support::http::request_text(&socket, "POST", "/v1/extensions/echo/call", &nested(64));
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (400, Some("too_deep")),
        "{v:#}"
    );
    // Params sent across lines (whitespace is JSON's) reach the extension as one frame.
    let (code, v) = support::http::request_text(
        &socket,
        "POST",
        "/v1/extensions/echo/call",
        "{\"method\": \"echo\",\r\n \"params\": {\n  \"text\": \"two\\nlines\",\n  \"n\": [1,\n 2]\n}}",
    );
    assert_eq!(code, 200, "{v:#}");
    assert_eq!(v["result"]["text"], "two\nlines", "{v:#}");
    assert_eq!(v["result"]["n"], serde_json::json!([1, 2]), "{v:#}");
    assert_eq!(f.status("echo")["calls"]["echo"]["count"], 3);
    assert_eq!(
        f.stop_daemon(),
        Some(0),
        "SIGTERM stops the daemon with exit code 0{}",
        f.context()
    );
    // Every extension got its `shutdown` and exited cleanly.
    let v: Value =
        serde_json::from_slice(&f.conduit(&["ext", "list", "--json"]).out.stdout).unwrap();
    assert_eq!(v["daemon_running"], false);
}

#[test]
fn sigkill_fails_the_pending_call_at_once_and_restarts_follow_the_backoff() {
    let mut f = Fixture::new();
    let pkgs = stage_examples(&f);
    f.install(&pkgs[0]); // echo
    f.start_daemon();
    let s = f.wait_state("echo", "ready", PATIENCE);
    let pid = s["pid"].as_i64().unwrap() as i32;
    let before = bytes_read(pid);

    // A call held open by the extension…
    let call = f
        .command(&[
            "ext",
            "call",
            "echo",
            "check.sleep",
            r#"{"ms":30000}"#,
            "--timeout-ms",
            "60000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_read_past(pid, before, "the held call");
    let t = Instant::now();
    kill(pid, nix::sys::signal::Signal::SIGKILL);
    // …fails at once with extension_exited.
    let out = call.wait_with_output().unwrap();
    let took = t.elapsed();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        v["error"]["name"],
        "extension_exited",
        "{v:#} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "At once" means without waiting for the extension's 30 s or the call's 60 s; the
    // margin is for a busy machine, where starting the CLI alone can take a second.
    assert!(
        took < Duration::from_secs(10),
        "the pending call took {took:?} to fail"
    );
    assert_eq!(out.status.code(), Some(1));

    // backing-off, then ready again, the restart counted.
    let backing = f.wait_for("echo", PATIENCE, |s| {
        s["state"] == "backing-off" || s["restarts"] == 1
    });
    let s = f.wait_state("echo", "ready", PATIENCE);
    assert_eq!(s["restarts"], 1);
    assert_eq!(s["last_exit"]["signal"], 9);
    if backing["state"] == "backing-off" {
        // The delay the policy chose, not a difference of two clocks read at different times
        // (on a busy machine the supervisor may see the exit late).
        let delay = backing["backoff_ms"].as_i64().unwrap();
        assert!(
            (80..=120).contains(&delay),
            "first delay {delay} ms, policy says 100 ms ± 20%"
        );
    }

    // Successive crashes: each delay doubles (100, 200, 400 ms, ± 20% jitter).
    let mut delays = Vec::new();
    for round in 2..=4 {
        let pid = f.wait_state("echo", "ready", PATIENCE)["pid"]
            .as_i64()
            .unwrap() as i32;
        kill(pid, nix::sys::signal::Signal::SIGKILL);
        let s = f.wait_for("echo", PATIENCE, |s| {
            // `restarts` counts the starts after the first: while backing off from the
            // round-th crash, round - 1 restarts have happened.
            s["restarts"] == round - 1 && s["backoff_ms"].is_i64()
        });
        delays.push(s["backoff_ms"].as_i64().unwrap());
    }
    for (got, want) in delays.iter().zip([200i64, 400, 800]) {
        assert!(
            (want * 8 / 10..=want * 12 / 10).contains(got),
            "delays {delays:?}, policy says 200, 400, 800 ms ± 20%"
        );
    }
}

#[test]
fn a_package_that_always_exits_becomes_crash_looping_and_a_version_mismatch_incompatible() {
    let mut f = Fixture::new();
    f.install(&f.misbehave("crasher", "exit-at-start"));
    f.install(&support::python_package("wrong-version"));
    f.start_daemon();
    let s = f.wait_state("crasher", "crash-looping", PATIENCE);
    assert!(
        s["restarts"].as_u64().unwrap() >= 4,
        "five failures, four restarts"
    );
    assert_eq!(s["last_exit"]["code"], 3);
    let tail = s["stderr_tail"].as_array().unwrap();
    assert!(
        tail.iter()
            .any(|l| l.as_str().unwrap().contains("configuration is missing")),
        "{s:#}"
    );
    let human = f.conduit(&["ext", "status", "crasher"]);
    assert_eq!(
        human.code(),
        Some(1),
        "an unhealthy package exits 1{}",
        human.context()
    );
    assert!(
        human.stdout().contains("crash-looping")
            && human.stdout().contains("configuration is missing")
    );

    let s = f.wait_state("wrong-version", "incompatible", PATIENCE);
    std::thread::sleep(Duration::from_millis(500));
    let s2 = f.status("wrong-version");
    assert_eq!(
        (s2["state"].as_str(), s2["restarts"].as_u64()),
        (Some("incompatible"), Some(0)),
        "{s:#}"
    );
    assert!(
        s2["last_error"]
            .as_str()
            .unwrap()
            .contains("extension_versions"),
        "{s2:#}"
    );
}

#[test]
fn stopping_leaves_no_process_of_the_group_and_a_killed_daemon_leaves_no_extension_running() {
    let mut f = Fixture::new();
    f.install(&f.misbehave("spawner", "grandchildren"));
    f.install(&f.misbehave("other", "ok"));
    f.start_daemon();
    let pgid = f.wait_state("spawner", "ready", PATIENCE)["pid"]
        .as_u64()
        .unwrap() as u32;
    assert!(
        group_members(pgid).len() >= 3,
        "the extension and its two grandchildren"
    );
    let run = f.conduit(&["ext", "disable", "spawner"]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
    assert_eq!(
        wait_gone(pgid, PATIENCE),
        Vec::<u32>::new(),
        "after a stop, nothing of the group runs"
    );
    f.wait_state("spawner", "disabled", PATIENCE);

    // SIGKILL the daemon: its extensions die with it (parent-death signal)…
    f.conduit(&["ext", "enable", "spawner"]);
    let pgid = f.wait_state("spawner", "ready", PATIENCE)["pid"]
        .as_u64()
        .unwrap() as u32;
    let other = f.wait_state("other", "ready", PATIENCE)["pid"]
        .as_u64()
        .unwrap() as u32;
    kill(f.daemon_pid(), nix::sys::signal::Signal::SIGKILL);
    let _ = f.daemon.take().unwrap().wait();
    assert_eq!(
        wait_gone(other, PATIENCE),
        Vec::<u32>::new(),
        "an extension outlived the killed daemon"
    );
    let left = group_members(pgid);
    assert!(
        !left.contains(&pgid),
        "the extension itself outlived the killed daemon"
    );
    // …and what its extensions started themselves is swept when the daemon starts again.
    f.start_daemon();
    assert_eq!(
        wait_gone(pgid, PATIENCE),
        Vec::<u32>::new(),
        "grandchildren of the killed daemon's extension still run{}",
        f.context()
    );
    f.wait_state("spawner", "ready", PATIENCE);
}

#[test]
fn a_package_changed_after_install_is_refused_and_named_in_the_status() {
    let mut f = Fixture::new();
    f.install(&f.misbehave("tampered", "ok"));
    std::fs::write(
        f.state().join("packages/tampered/misbehave.py"),
        "print('not what was installed')\n",
    )
    .unwrap();
    f.start_daemon();
    let s = f.wait_state("tampered", "refused", PATIENCE);
    let err = s["last_error"].as_str().unwrap();
    assert!(
        err.contains("misbehave.py") && err.contains("reinstall"),
        "{err}"
    );
    // Reinstalling fixes it, and the running daemon picks it up.
    f.install(&f.dir.path().join("src/tampered"));
    f.wait_state("tampered", "ready", PATIENCE);
}

#[test]
fn refused_installs_say_why_and_change_nothing() {
    let f = Fixture::new();
    f.install(&f.misbehave("fine", "ok"));
    let before = walk(&f.state());
    let bad = f.misbehave("bad", "ok");
    std::fs::write(
        bad.join("conduit-extension.toml"),
        "name = \"Bad Name\"\nversion = \"1\"\nprotocol = 1\ncommand = [\"x\"]\n",
    )
    .unwrap();
    let run = f.conduit(&["ext", "install", bad.to_str().unwrap()]);
    assert_eq!(run.code(), Some(2), "{}", run.context());
    assert!(
        run.stderr().contains("name"),
        "the error names the field{}",
        run.context()
    );

    // An archive whose entry climbs out with `..`.
    let archive = f.dir.path().join("evil.tar.gz");
    let gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&archive).unwrap(),
        flate2::Compression::fast(),
    );
    let mut tar = tar::Builder::new(gz);
    let manifest = std::fs::read(f.dir.path().join("src/fine/conduit-extension.toml")).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_size(manifest.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    tar.append_data(&mut h, "conduit-extension.toml", &manifest[..])
        .unwrap();
    let evil = b"escaped";
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..12].copy_from_slice(b"../../escape");
    h.set_size(evil.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    tar.append(&h, &evil[..]).unwrap();
    tar.into_inner().unwrap().finish().unwrap();
    let run = f.conduit(&["ext", "install", archive.to_str().unwrap()]);
    assert_eq!(run.code(), Some(2), "{}", run.context());
    assert!(run.stderr().contains(".."), "{}", run.context());

    assert_eq!(
        walk(&f.state()),
        before,
        "a refused install changed the state directory"
    );
}

#[test]
fn the_management_socket_refuses_other_users() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: connecting as another uid needs root to switch users");
        return;
    }
    let mut f = Fixture::new();
    f.start_daemon();
    let socket = f.state().join("run/conduit.sock");
    // A client as `nobody`: a raw HTTP request over the socket, the answer's status line.
    let probe = |sock: &Path| -> String {
        use std::os::unix::process::CommandExt;
        let script = format!(
            "import socket\ns=socket.socket(socket.AF_UNIX)\ntry:\n  s.connect({:?})\nexcept OSError as e:\n  print('connect:', e.errno); raise SystemExit\ns.sendall(b'GET /v1/health HTTP/1.1\\r\\nhost: x\\r\\nconnection: close\\r\\n\\r\\n')\nprint(s.recv(200).split(b'\\r\\n')[0].decode())",
            sock.to_str().unwrap()
        );
        let out = Command::new("python3")
            .arg("-c")
            .arg(script)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    // The folder is 0700: another user cannot even reach the socket.
    assert_eq!(probe(&socket), "connect: 13", "EACCES expected");
    // With the folder and socket opened up, the peer-uid check still refuses the connection.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(f.state(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        f.state().join("run"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(probe(&socket), "HTTP/1.1 403 Forbidden");
    // The owner is served.
    let run = f.conduit(&["ext", "list", "--json"]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
}

/// What every extension starts with, however it was forked: the daemon as its parent, a
/// process group of its own, no signal blocked and none ignored but what the Rust runtime of
/// the echo example ignores itself (SIGPIPE, bit 13), and no descriptor of the daemon's.
#[track_caller]
fn assert_clean_start(f: &Fixture, pid: i32) {
    let context = || format!("pid {pid}{}", f.context());
    assert_eq!(
        proc_status(pid, "PPid"),
        f.daemon_pid().to_string(),
        "{}",
        context()
    );
    assert_eq!(proc_status(pid, "NSpgid"), pid.to_string(), "{}", context());
    assert_eq!(
        proc_status(pid, "SigBlk"),
        "0000000000000000",
        "{}",
        context()
    );
    assert_eq!(
        proc_status(pid, "SigIgn"),
        "0000000000001000",
        "{}",
        context()
    );
    // Nothing the daemon holds open: its lock, its store, the logs.
    let state = f.state().canonicalize().unwrap();
    let held: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|target| target.starts_with(&state))
        .collect();
    assert!(held.is_empty(), "{held:?}{}", context());
}

#[test]
fn extensions_are_forked_by_the_spawner_as_the_daemons_children_and_start_clean_either_way() {
    use nix::sys::signal::Signal;
    for spawner in [true, false] {
        let mut f = Fixture::new();
        let Some(echo) = support::stage_rust_example("echo", &f.dir.path().join("staged")) else {
            return;
        };
        f.install(&echo);
        let off = [("CONDUIT_SPAWNER", std::ffi::OsStr::new("off"))];
        let env: &[(&str, &std::ffi::OsStr)] = if spawner { &[] } else { &off };
        // As from a shell's background job: what the daemon ignores, its extensions must not.
        f.start_daemon_ignoring(env, &[Signal::SIGINT, Signal::SIGQUIT]);
        let pid = f.wait_state("echo", "ready", PATIENCE)["pid"]
            .as_i64()
            .unwrap() as i32;
        let helper = spawner_of(f.daemon_pid());
        assert_eq!(
            helper.is_some(),
            spawner,
            "spawner {helper:?}{}",
            f.context()
        );
        assert_clean_start(&f, pid);

        // A crash, and the start after it: the same.
        kill(pid, Signal::SIGKILL);
        let s = f.wait_for("echo", PATIENCE, |s| {
            s["restarts"] == 1 && s["state"] == "ready"
        });
        let pid = s["pid"].as_i64().unwrap() as i32;
        assert_clean_start(&f, pid);
        assert_eq!(s["recent_exits"][0]["cause"], "signalled", "{s:#}");

        if let Some(helper) = helper {
            // The spawner gone: the next start is forked by the daemon, and nothing fails.
            kill(helper, Signal::SIGKILL);
            f.wait_until("the spawner to be gone", || {
                spawner_of(f.daemon_pid()).is_none().then_some(())
            });
            kill(pid, Signal::SIGKILL);
            let s = f.wait_for("echo", PATIENCE, |s| {
                s["restarts"] == 2 && s["state"] == "ready"
            });
            assert_clean_start(&f, s["pid"].as_i64().unwrap() as i32);
            let log = std::fs::read_to_string(f.daemon_log()).unwrap();
            assert!(
                log.contains("the spawner did not answer"),
                "{}",
                f.context()
            );
        }
        assert_eq!(f.stop_daemon(), Some(0), "{}", f.context());
    }
}

#[test]
fn the_spawner_run_by_hand_says_what_it_is_and_exits_1() {
    // Without the daemon's socket as descriptor 3 (a command's descriptors past stderr are
    // closed here), it explains itself instead of aborting or waiting.
    let out = Command::new(env!("CARGO_BIN_EXE_conduit"))
        .arg("__conduit-spawner")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("descriptor 3 is not usable") && err.contains("not by hand"),
        "{err}"
    );
}

/// 64 clients pushing at once: store work waits for a connection on the async side, so the
/// burst takes a blocking thread per store connection (one writer, four readers), not one per
/// caller that the runtime would then keep (it wakes its idle threads in turn, so under steady
/// load none ever ends).
#[test]
fn a_burst_of_pushes_takes_a_thread_per_store_connection_not_per_caller() {
    let mut f = Fixture::new();
    f.start_daemon();
    let pid = f.daemon_pid();
    let sock = f.state().join("run/conduit.sock");
    let threads = || -> usize { proc_status(pid, "Threads").parse().unwrap_or(0) };
    // One push first, so the blocking pool has its first thread.
    let push = |sock: &Path, d: String| {
        let body =
            serde_json::json!({"source": "burst", "delivery_id": d, "kind": "b", "payload": {}});
        support::http::request(sock, "POST", "/v1/events", Some(&body))
    };
    assert_eq!(push(&sock, "first".into()).0, 201);
    let before = threads();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pushers: Vec<_> = (0..64)
        .map(|c| {
            let (sock, stop) = (sock.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 40 {
                    let (code, v) = push(&sock, format!("c{c}-{i}"));
                    assert_eq!(code, 201, "{v}");
                    i += 1;
                }
            })
        })
        .collect();
    let mut peak = before;
    while pushers.iter().any(|p| !p.is_finished()) {
        peak = peak.max(threads());
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for p in pushers {
        p.join().unwrap();
    }
    // One writer and four readers, and a few for the daemon's other blocking work.
    assert!(
        peak <= before + 8,
        "{before} threads before the burst, {peak} during it{}",
        f.context()
    );
}
