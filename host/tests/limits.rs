//! The limits on what the daemon accepts, each at its edge, and a full disk: the real daemon,
//! the `notes` example and small Python test extensions, driven through the CLI and the socket.

mod support;

use std::time::{Duration, Instant};

use conduit_protocol::MAX_PAYLOAD_DEPTH;
use conduit_protocol::depth::nested;
use serde_json::{Value, json};
use support::fixture::Fixture;
use support::{stage_rust_example, workspace_root};

fn wait_until<T>(what: &str, timeout: Duration, f: impl Fn() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One HTTP request over the daemon's socket: the status code and the body as JSON.
fn http(f: &Fixture, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut s =
        std::os::unix::net::UnixStream::connect(f.state().join("run/conduit.sock")).unwrap();
    let body = body.unwrap_or("");
    write!(s, "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

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
    let (code, v) = http(
        &f,
        "POST",
        "/v1/events",
        Some(&push_body("at", "x.y", &nested(MAX_PAYLOAD_DEPTH, "0"))),
    );
    assert_eq!(code, 201, "{v}{}", f.context());
    // One past the limit, the depth of the original finding, and far past serde's own limit.
    for depth in [MAX_PAYLOAD_DEPTH + 1, 125, 10_000] {
        let (code, v) = http(
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
    let (code, v) = http(
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

#[test]
fn ingress_push_refuses_a_payload_past_the_depth_limit_with_invalid_params() {
    let mut f = Fixture::new();
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
    f.install(&pkg);
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
                        let (code, v) = http(
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
    let events = wait_until("every note routed", Duration::from_secs(20), || {
        let evs = f.all_events();
        evs.iter()
            .all(|e| e.get("routed_at_ms").is_some())
            .then_some(evs)
    });
    assert_eq!(events.len(), 40, "only accepted notes are stored");
    for (id, thread) in &accepted {
        let e = events.iter().find(|e| e["id"] == *id).unwrap();
        let (_, w) = http(&f, "GET", &format!("/v1/work/{}", e["work_id"]), None);
        assert_eq!(
            w["key"],
            format!("thread:{thread}"),
            "event {id} lost its thread grouping: {w:#}{}",
            f.context()
        );
    }
    let (_, health) = http(&f, "GET", "/v1/health", None);
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
    let got = wait_until("the polled events", Duration::from_secs(20), || {
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
