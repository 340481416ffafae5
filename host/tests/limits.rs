//! The limits on what the daemon accepts, each at its edge, and a full disk: the real daemon,
//! the `notes` example and small Python test extensions, driven through the CLI and the socket.

mod support;

use std::time::Duration;

use conduit_protocol::MAX_PAYLOAD_DEPTH;
use conduit_protocol::depth::nested;
use serde_json::{Value, json};
use support::fixture::Fixture;
use support::{http, stage_rust_example, workspace_root};

fn push_body(delivery: &str, kind: &str, payload: &str) -> String {
    format!(
        r#"{{"source":"notes-inbox","delivery_id":"{delivery}","kind":"{kind}","payload":{payload}}}"#
    )
}

/// A note of thread `thread` whose payload is exactly `depth` levels deep.
fn deep_note(thread: &str, depth: usize) -> String {
    format!(
        r#"{{"thread":"{thread}","text":"deep","deep":{}}}"#,
        nested(depth - 1, "0")
    )
}

#[test]
fn the_api_refuses_a_payload_past_the_depth_limit_naming_it() {
    let mut f = Fixture::new();
    f.start_daemon();
    let (code, v) = api(
        &f,
        "POST",
        "/v1/events",
        Some(&push_body("at", "x.y", &nested(MAX_PAYLOAD_DEPTH, "0"))),
    );
    assert_eq!(code, 201, "{v}{}", f.context());
    // One past the limit, the depth of the original finding, and far past serde's own limit.
    for depth in [MAX_PAYLOAD_DEPTH + 1, 125, 10_000] {
        let (code, v) = api(
            &f,
            "POST",
            "/v1/events",
            Some(&push_body(&format!("d{depth}"), "x.y", &nested(depth, "0"))),
        );
        assert_eq!(code, 400, "depth {depth}: {v}");
        assert_eq!(v["error"]["code"], "too_deep", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("{depth} levels")), "{msg}");
        assert!(msg.contains("64"), "{msg}");
    }
    // Emissions are wrapped the same way and refused the same way.
    let (code, v) = api(
        &f,
        "POST",
        "/v1/emissions",
        Some(&format!(
            r#"{{"emission":"annotation","payload":{}}}"#,
            nested(MAX_PAYLOAD_DEPTH + 1, "0")
        )),
    );
    assert_eq!(
        (code, &v["error"]["code"]),
        (400, &json!("too_deep")),
        "{v}"
    );
    // Nothing refused was stored.
    let kept: Vec<String> = f
        .all_events()
        .iter()
        .map(|e| e["delivery_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kept, ["at"]);

    // The CLI refuses before it sends, with exit 2 and the limit in the message.
    let run = f.conduit(&[
        "events",
        "push",
        "--source",
        "s",
        "--delivery-id",
        "cli-deep",
        "--kind",
        "k",
        "--payload",
        &nested(MAX_PAYLOAD_DEPTH + 1, "0"),
    ]);
    assert_eq!(run.code(), Some(2), "{}", run.context());
    assert!(
        run.stderr().contains("65 levels") && run.stderr().contains("64"),
        "{}",
        run.context()
    );
    f.push("s", "cli-at", "k", &nested(MAX_PAYLOAD_DEPTH, "0"));
}

/// The `deep-push` test package (`fixtures/deep_push.py`), staged under the fixture.
fn deep_push_package(f: &Fixture) -> std::path::PathBuf {
    let pkg = f.dir.path().join("src/deep-push");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::copy(
        workspace_root().join("host/tests/fixtures/deep_push.py"),
        pkg.join("deep_push.py"),
    )
    .unwrap();
    std::fs::write(
        pkg.join("conduit-extension.toml"),
        "name = \"deep-push\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"python3\", \"deep_push.py\"]\n\n[capabilities]\ningress = [\"feed\"]\nmethods = [\"push-deep\"]\n",
    )
    .unwrap();
    pkg
}

#[test]
fn ingress_push_refuses_a_payload_past_the_depth_limit_with_invalid_params() {
    let mut f = Fixture::new();
    f.install(&deep_push_package(&f));
    f.start_daemon();
    f.wait_state("deep-push", "ready", Duration::from_secs(10));
    let push = |depth: usize| -> Value {
        let run = f.conduit(&[
            "ext",
            "call",
            "deep-push",
            "push-deep",
            &format!(r#"{{"depth":{depth},"delivery_id":"p{depth}"}}"#),
        ]);
        assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
        serde_json::from_slice(&run.out.stdout).unwrap()
    };
    let at = push(MAX_PAYLOAD_DEPTH);
    assert_eq!(at["result"]["duplicate"], false, "{at}");
    for depth in [MAX_PAYLOAD_DEPTH + 1, 100, 10_000] {
        let v = push(depth);
        assert_eq!(v["error"]["code"], -32602, "depth {depth}: {v}");
        assert_eq!(
            v["error"]["data"],
            json!({ "limit": MAX_PAYLOAD_DEPTH, "depth": depth }),
            "{v}"
        );
        assert!(
            v["error"]["message"].as_str().unwrap().contains("64"),
            "{v}"
        );
    }
    let kept: Vec<String> = f
        .all_events()
        .iter()
        .map(|e| e["delivery_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kept, [format!("p{MAX_PAYLOAD_DEPTH}")]);
}

/// The finding: one deep event in a burst made the whole trigger batch fall back. With the limit
/// at acceptance, an event at the limit is grouped like the others, and nothing deeper gets in.
#[test]
fn a_burst_with_an_event_at_the_depth_limit_is_grouped_by_the_extension() {
    let mut f = Fixture::new();
    let pkg = stage_rust_example("notes", &f.dir.path().join("staged")).expect("notes");
    f.install(&pkg);
    f.start_daemon();
    f.wait_state("notes", "ready", Duration::from_secs(10));

    // 40 notes of 5 threads, pushed by 8 clients at once; one note is at the limit, and two
    // deeper ones (one past it, and the depth of the original finding) are refused.
    let mut bodies: Vec<(String, String, Option<String>)> = (0..40)
        .map(|i| {
            let thread = format!("t-{}", i % 5);
            let payload = if i == 17 {
                deep_note(&thread, MAX_PAYLOAD_DEPTH)
            } else {
                format!(r#"{{"thread":"{thread}","text":"note {i}"}}"#)
            };
            (format!("n{i}"), payload, Some(thread))
        })
        .collect();
    bodies.insert(
        9,
        ("over".into(), deep_note("t-1", MAX_PAYLOAD_DEPTH + 1), None),
    );
    bodies.insert(25, ("finding".into(), deep_note("t-2", 125), None));
    let bodies = std::sync::Arc::new(bodies);
    let answers: Vec<(String, u16, Value, Option<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|c| {
                let (f, bodies) = (&f, bodies.clone());
                s.spawn(move || {
                    let mut out = Vec::new();
                    for (d, payload, thread) in bodies.iter().skip(c).step_by(8) {
                        let (code, v) = api(
                            f,
                            "POST",
                            "/v1/events",
                            Some(&push_body(d, "note.posted", payload)),
                        );
                        out.push((d.clone(), code, v, thread.clone()));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut accepted = Vec::new();
    for (d, code, v, thread) in answers {
        match thread {
            Some(thread) => {
                assert_eq!(code, 201, "{d}: {v}{}", f.context());
                accepted.push((v["event_id"].as_i64().unwrap(), thread));
            }
            None => {
                assert_eq!(code, 400, "{d} must be refused: {v}{}", f.context());
                assert_eq!(v["error"]["code"], "too_deep");
            }
        }
    }
    assert_eq!(accepted.len(), 40);
    let events = f.wait_until("every note routed", || {
        let evs = f.all_events();
        evs.iter()
            .all(|e| e.get("routed_at_ms").is_some())
            .then_some(evs)
    });
    assert_eq!(events.len(), 40, "only accepted notes are stored");
    for (id, thread) in &accepted {
        let e = events.iter().find(|e| e["id"] == *id).unwrap();
        let (_, w) = api(&f, "GET", &format!("/v1/work/{}", e["work_id"]), None);
        assert_eq!(
            w["key"],
            format!("thread:{thread}"),
            "event {id} lost its thread grouping: {w:#}{}",
            f.context()
        );
    }
    let (_, health) = api(&f, "GET", "/v1/health", None);
    assert_eq!(health["host_loop"]["fallbacks"], 0, "{health:#}");
    let s = f.status("notes");
    assert_eq!(s["calls"]["work_kind.trigger"]["errors"], 0, "{s:#}");
}

#[test]
fn a_polled_event_past_the_depth_limit_is_skipped_and_the_others_accepted() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("poller", "ok"));
    f.start_daemon();
    f.wait_state("poller", "ready", Duration::from_secs(10));
    let line = |d: &str, payload: &str| {
        format!(r#"{{"delivery_id":"{d}","kind":"job.run","payload":{payload}}}"#) + "\n"
    };
    let inbox = [
        line("p-plain", r#"{"group":"a"}"#),
        line("p-over", &nested(MAX_PAYLOAD_DEPTH + 1, "0")),
        line("p-at", &nested(MAX_PAYLOAD_DEPTH, "0")),
    ]
    .concat();
    std::fs::write(f.state().join("data/poller/inbox.jsonl"), inbox).unwrap();
    let got = f.wait_until("the polled events", || {
        let evs: Vec<String> = f
            .all_events()
            .iter()
            .map(|e| e["delivery_id"].as_str().unwrap().to_owned())
            .collect();
        (evs.len() >= 2).then_some(evs)
    });
    assert_eq!(got, ["p-plain", "p-at"], "{}", f.context());
    let log = std::fs::read_to_string(f.daemon_log()).unwrap();
    assert!(
        log.contains("skipped a polled event") && log.contains("65 levels"),
        "{log}"
    );
}

// ---- a full disk --------------------------------------------------------------------------

/// Start the daemon with `env` added, waiting for its socket like `Fixture::start_daemon`.
fn daemon_log(f: &Fixture) -> String {
    std::fs::read_to_string(f.daemon_log()).unwrap_or_default()
}

fn big_payload() -> String {
    format!(r#"{{"text":"{}"}}"#, "x".repeat(64 * 1024))
}

/// The store's test knob makes SQLite answer `SQLITE_FULL` exactly as on a full disk; this runs
/// everywhere. The real thing (a full file system, and freeing it) is the test below.
#[test]
fn a_store_that_cannot_grow_refuses_writes_saying_the_disk_is_full_and_serves_reads() {
    let mut f = Fixture::new();
    f.install(&deep_push_package(&f));
    f.start_daemon();
    f.push("s", "before", "k", r#"{"n":1}"#);
    assert_eq!(f.stop_daemon(), Some(0));
    f.start_daemon_with(&[(conduit_store::TEST_MAX_PAGE_COUNT_ENV, "1".as_ref())]);
    f.wait_state("deep-push", "ready", Duration::from_secs(10));
    let (code, v) = api(
        &f,
        "POST",
        "/v1/events",
        Some(&push_body("full", "k", &big_payload())),
    );
    assert_eq!(code, 507, "{v}{}", f.context());
    assert_eq!(v["error"]["code"], "disk_full", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("disk holding the state directory is full")
            && msg.contains("database or disk is full"),
        "{msg}"
    );
    // Reads are served, and the CLI says the same with exit 1 (a retry may succeed).
    let kept: Vec<Value> = f.all_events();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let run = f.conduit(&[
        "events",
        "push",
        "--source",
        "s",
        "--delivery-id",
        "cli",
        "--kind",
        "k",
        "--payload",
        &big_payload(),
    ]);
    assert_eq!(run.code(), Some(1), "{}", run.context());
    assert!(
        run.stderr()
            .contains("disk holding the state directory is full"),
        "{}",
        run.context()
    );
    // A write callback gets the retryable `storage_full`.
    let run = f.conduit(&[
        "ext",
        "call",
        "deep-push",
        "push-deep",
        r#"{"depth":1,"delivery_id":"cb","pad":65536}"#,
    ]);
    assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
    let v: Value = serde_json::from_slice(&run.out.stdout).unwrap();
    assert_eq!(v["error"]["code"], -32011, "storage_full: {v}");
    let log = daemon_log(&f);
    assert!(
        log.contains("disk holding the state directory is full")
            && log.contains("database or disk is full"),
        "{log}"
    );
    assert_eq!(f.stop_daemon(), Some(0));
}

#[test]
fn daemon_run_help_documents_which_exit_codes_a_retry_can_cure() {
    let f = Fixture::new();
    let run = f.conduit(&["daemon", "run", "--help"]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
    let help = run.stdout();
    assert!(
        help.contains("1  could not run for a reason that may pass")
            && help.contains("2  could not run until someone changes something")
            && help.contains("full disk"),
        "{help}"
    );
}

#[test]
fn daemon_run_exits_2_for_a_store_that_is_not_a_database_and_prints_the_cause_once() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.state()).unwrap();
    std::fs::write(f.state().join("conduit.db"), vec![b'x'; 8192]).unwrap();
    let run = f.conduit(&["daemon", "run"]);
    assert_eq!(run.code(), Some(2), "{}", run.context());
    let err = run.stderr();
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or("");
    assert_eq!(
        line.matches("not a database").count(),
        1,
        "the cause once: {}",
        run.context()
    );
    // The failed start left no lock behind: the lock file holds no pid, and a fixed state
    // starts.
    assert_eq!(
        std::fs::read_to_string(f.state().join("daemon.lock")).unwrap(),
        ""
    );
    std::fs::remove_file(f.state().join("conduit.db")).unwrap();
    let mut f = f;
    f.start_daemon();
    assert_eq!(f.stop_daemon(), Some(0));
}

const FULL_DISK_ENV: &str = "CONDUIT_TEST_FULL_DISK_SCENARIO";

/// A real full file system: a small tmpfs mounted on the state directory inside a private mount
/// namespace (`unshare --mount`), so the host's own mounts are never touched. Needs root (or
/// CAP_SYS_ADMIN); skips, saying so, without it.
#[test]
fn on_a_full_disk_the_daemon_starts_serves_reads_refuses_writes_and_recovers() {
    if std::env::var_os(FULL_DISK_ENV).is_some() {
        return full_disk_scenario();
    }
    let probe = std::process::Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "mount",
            "-t",
            "tmpfs",
            "tmpfs",
            "/mnt",
        ])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!(
                "skipped: cannot mount a tmpfs in a private mount namespace (needs root): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("skipped: `unshare` cannot run here: {e}");
            return;
        }
    }
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "on_a_full_disk_the_daemon_starts_serves_reads_refuses_writes_and_recovers",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FULL_DISK_ENV, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("FULL DISK SCENARIO DONE"),
        "{text}"
    );
}

/// Fill the file system holding `path`'s folder until it refuses another byte.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 64 * 1024];
    loop {
        match file.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = file.sync_all();
}

/// Run inside the private mount namespace.
fn full_disk_scenario() {
    let mut f = Fixture::new();
    let state = f.state();
    std::fs::create_dir_all(&state).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs"])
        .arg(&state)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a tmpfs on {}", state.display());
    // Unmounted (lazily, while the daemon may still hold files) before the fixture goes.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let filler = state.join("filler");

    // A first start on a full disk cannot create the store: exit 1 (a retry helps), and no
    // lock is left behind.
    fill(&filler);
    let run = f.conduit(&["daemon", "run"]);
    assert_eq!(run.code(), Some(1), "{}", run.context());
    assert!(
        run.stderr().contains("database or disk is full"),
        "{}",
        run.context()
    );
    std::fs::remove_file(&filler).unwrap();
    f.install(&f.core_ext("art", "ok"));
    f.start_daemon();
    f.push("s", "before", "k", r#"{"n":1}"#);
    assert_eq!(f.stop_daemon(), Some(0));

    // Full again: the daemon starts, serves reads, and refuses writes saying why.
    fill(&filler);
    f.start_daemon();
    let _unmount = Unmount(state.clone());
    let kept: Vec<String> = f
        .all_events()
        .iter()
        .map(|e| e["delivery_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kept, ["before"], "{}", f.context());
    let (code, v) = api(
        &f,
        "POST",
        "/v1/events",
        Some(&push_body("full", "k", &big_payload())),
    );
    assert_eq!(code, 507, "{v}{}", f.context());
    assert_eq!(v["error"]["code"], "disk_full", "{v}");
    let log = daemon_log(&f);
    assert!(
        log.contains("disk holding the state directory is full"),
        "{log}"
    );
    // An extension starts too, and an artifact it streams is refused as storage_full.
    f.wait_state("art", "ready", Duration::from_secs(20));
    let run = f.conduit(&[
        "ext",
        "call",
        "art",
        "make-artifact",
        r#"{"size":1000000,"chunk":65536}"#,
    ]);
    assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
    let v: Value = serde_json::from_slice(&run.out.stdout).unwrap();
    assert_eq!(v["error"]["code"], -32011, "storage_full: {v}");

    // Space freed: the same write is accepted, with no restart.
    std::fs::remove_file(&filler).unwrap();
    let (code, v) = api(
        &f,
        "POST",
        "/v1/events",
        Some(&push_body("full", "k", &big_payload())),
    );
    assert_eq!(code, 201, "{v}{}", f.context());
    f.wait_until("the recovery in the log", || {
        daemon_log(&f)
            .contains("writes succeed again")
            .then_some(())
    });
    assert_eq!(f.stop_daemon(), Some(0), "{}", f.context());
    // Without a daemon, lists read the store directly, also on a full disk.
    fill(&filler);
    let list = f.json(&["events", "list", "--json"]);
    assert_eq!(list["events"].as_array().unwrap().len(), 2, "{list:#}");
    println!("FULL DISK SCENARIO DONE");
}

/// One request over the daemon's socket, the body sent as text; the status and the JSON body.
fn api(f: &Fixture, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    http::request_text(
        &f.state().join("run/conduit.sock"),
        method,
        path,
        body.unwrap_or(""),
    )
}
