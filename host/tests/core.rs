//! The coordination core end to end: the real daemon, the `notes` example and a Python test
//! extension that misbehaves on command (`fixtures/core_ext.py`), driven through the CLI.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::PATIENCE;
use support::fixture::{Fixture, kill, stage_examples};

fn routed(f: &Fixture, event_id: i64) -> Option<Value> {
    f.all_events()
        .into_iter()
        .find(|e| e["id"] == event_id && e.get("routed_at_ms").is_some())
}

/// A raw HTTP POST over the socket: the status code and the body.
fn http_post(f: &Fixture, path: &str, body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s =
        std::os::unix::net::UnixStream::connect(f.state().join("run/conduit.sock")).unwrap();
    write!(s, "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len()).unwrap();
    let _ = s.write_all(body);
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned())
}

/// A push body of exactly `len` bytes.
fn push_body(delivery: &str, len: usize) -> Vec<u8> {
    let head = format!(r#"{{"source":"s","delivery_id":"{delivery}","kind":"k","payload":""#);
    let tail = r#""}"#;
    let mut b = head.into_bytes();
    b.resize(len - tail.len(), b'a');
    b.extend_from_slice(tail.as_bytes());
    b
}

fn http_get(f: &Fixture, path: &str) -> Value {
    support::http::get(&f.state().join("run/conduit.sock"), path)
}

#[test]
fn each_in_transaction_call_happens_at_its_call_site_and_its_answer_is_applied() {
    let mut f = Fixture::new();
    for p in stage_examples(&f) {
        f.install(&p);
    }
    f.start_daemon();
    f.wait_state("notes", "ready", PATIENCE);

    // work_kind.trigger: notes group by thread.
    let a = f.push(
        "notes-inbox",
        "n1",
        "note.posted",
        r#"{"thread":"t-1","author":"ada","text":"first"}"#,
    );
    let b = f.push(
        "notes-inbox",
        "n2",
        "note.posted",
        r#"{"thread":"t-1","author":"bob","text":"second"}"#,
    );
    let c = f.push(
        "notes-inbox",
        "n3",
        "note.posted",
        r#"{"thread":"t-2","author":"cy","text":"third"}"#,
    );
    let dup = f.push("notes-inbox", "n1", "note.posted", r#"{"thread":"t-9"}"#);
    assert_eq!(dup["duplicate"], true);
    assert_eq!(dup["event_id"], a["event_id"]);
    let ids: Vec<i64> = [&a, &b, &c]
        .iter()
        .map(|v| v["event_id"].as_i64().unwrap())
        .collect();
    for id in &ids {
        f.wait_until("routing", || routed(&f, *id));
    }
    let work = f.json(&["work", "list", "--json"]);
    let keys: Vec<(String, Vec<i64>)> = work["work"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["key"].as_str().unwrap().to_owned(),
                w["event_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i.as_i64().unwrap())
                    .collect(),
            )
        })
        .collect();
    assert!(
        keys.contains(&("thread:t-1".into(), vec![ids[0], ids[1]])),
        "{keys:?}"
    );
    assert!(
        keys.contains(&("thread:t-2".into(), vec![ids[2]])),
        "{keys:?}"
    );

    // recurrence.next: a digest timer is rescheduled 15 minutes after it fired.
    let t = f.json(&["timers", "add", "digest", "every 15m", "--json"]);
    let timer = f.wait_until("the timer to fire", || {
        let t = http_get(&f, &format!("/v1/timers/{}", t["timer_id"]));
        t["last_fired_at_ms"].is_i64().then_some(t)
    });
    let (fired, next) = (
        timer["last_fired_at_ms"].as_i64().unwrap(),
        timer["next_at_ms"].as_i64().unwrap(),
    );
    assert_eq!(next - fired, 15 * 60 * 1000, "{timer:#}");

    // dependency.filter: a wait for @dora is satisfied by the first later event mentioning her.
    let w = f.json(&["waits", "add", "mentions", "dora", "--json"]);
    f.push(
        "notes-inbox",
        "n4",
        "note.posted",
        r#"{"thread":"t-3","text":"nothing here"}"#,
    );
    let hit = f.push(
        "notes-inbox",
        "n5",
        "note.posted",
        r#"{"thread":"t-3","text":"thanks @Dora!"}"#,
    );
    let wait = f.wait_until("the wait to be satisfied", || {
        let w = http_get(&f, &format!("/v1/waits/{}", w["wait_id"]));
        (w["state"] == "satisfied").then_some(w)
    });
    assert_eq!(wait["satisfied_by_event_id"], hit["event_id"]);

    // emit.commit: the annotation record is written with the emission.
    let em = f.json(&[
        "emissions",
        "add",
        "annotation",
        r#"{"text":"a short note about the plan"}"#,
        "--json",
    ]);
    let committed = f.wait_until("the emission to commit", || {
        let e = http_get(&f, &format!("/v1/emissions/{}", em["emission_id"]));
        (e["state"] == "committed").then_some(e)
    });
    let rec = &committed["records"][0];
    assert_eq!(rec["kind"], "annotation");
    assert_eq!(rec["body"]["commit_id"], em["commit_id"]);

    // Every call shows in the status with counts and percentiles.
    let s = f.status("notes");
    for m in [
        "work_kind.trigger",
        "recurrence.next",
        "dependency.filter",
        "emit.commit",
    ] {
        assert!(
            s["calls"][m]["count"].as_u64().unwrap() >= 1,
            "{m} missing from {s:#}"
        );
    }
    let health = http_get(&f, "/v1/health");
    assert_eq!(health["host_loop"]["fallbacks"], 0);
    assert_eq!(health["store"]["panics"], 0, "{health:#}");
}

#[test]
fn a_hung_call_returns_within_bounds_applies_its_fallback_and_frees_the_writer() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("hung", "hang"));
    f.start_daemon();
    f.wait_state("hung", "ready", PATIENCE);
    let t0 = Instant::now();
    let ev = f.push("feed", "h1", "job.run", r#"{"group":"g"}"#);
    let id = ev["event_id"].as_i64().unwrap();
    let e = f.wait_until("the fallback routing", || routed(&f, id));
    let took = t0.elapsed();
    // The deadline is the feature: never before it; and soon after it, not whenever the
    // extension might answer (never). The upper margin is for a busy machine.
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(10),
        "routing took {took:?}"
    );
    // The fallback: a Work of its own, keyed by the event.
    let work = http_get(&f, &format!("/v1/work/{}", e["work_id"]));
    assert_eq!(work["key"], format!("event:{id}"));
    // The writer is free again: a push right after commits at once.
    let t = Instant::now();
    f.push("elsewhere", "w1", "other.kind", "{}");
    // A writer still held by the hung call would never commit the push (the extension never
    // answers); 10 s tells that apart from a busy machine.
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "a push after the hung call took {:?}",
        t.elapsed()
    );
    let h = http_get(&f, "/v1/health");
    assert!(h["host_loop"]["fallbacks"].as_u64().unwrap() >= 1, "{h:#}");
    assert!(
        f.status("hung")["calls"]["work_kind.trigger"]["errors"]
            .as_u64()
            .unwrap()
            >= 1
    );
}

#[test]
fn during_an_in_transaction_call_reads_are_served_and_writes_refused_without_deadlock() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("reent", "reentrant"));
    f.start_daemon();
    f.wait_state("reent", "ready", PATIENCE);
    let ev = f.push("feed", "r1", "job.run", "{}");
    let e = f.wait_until("routing", || routed(&f, ev["event_id"].as_i64().unwrap()));
    let work = http_get(&f, &format!("/v1/work/{}", e["work_id"]));
    // The trigger recorded what its callbacks got in the group key.
    assert_eq!(
        work["key"], "read:ok/write:-32006",
        "read served, write refused with reentrant_write"
    );
    assert!(
        f.all_events()
            .iter()
            .all(|e| e["delivery_id"] != "during-trigger"),
        "the refused write wrote nothing"
    );
}

#[test]
fn callbacks_refuse_positional_params_with_invalid_params() {
    // docs/protocol.md §3.1: params are an object for every method of the protocol; serde
    // would read a struct from an array, so the host must refuse one itself.
    let mut f = Fixture::new();
    f.install(&f.core_ext("posit", "positional"));
    f.start_daemon();
    f.wait_state("posit", "ready", PATIENCE);
    let ev = f.push("feed", "p1", "job.run", "{}");
    let e = f.wait_until("routing", || routed(&f, ev["event_id"].as_i64().unwrap()));
    let work = http_get(&f, &format!("/v1/work/{}", e["work_id"]));
    assert_eq!(
        work["key"], "event:-32602/events:-32602/open:-32602/object:ok",
        "arrays refused with invalid_params; the same call with an object served"
    );
}

#[test]
fn each_host_request_carries_its_remaining_time_in_meta() {
    // docs/protocol.md §11: `_meta.remaining_ms` first in the params, at most the deadline.
    let mut f = Fixture::new();
    f.install(&f.core_ext("meta", "meta"));
    f.start_daemon();
    f.wait_state("meta", "ready", PATIENCE);
    let ev = f.push("feed", "m1", "job.run", "{}");
    let e = f.wait_until("routing", || routed(&f, ev["event_id"].as_i64().unwrap()));
    let work = http_get(&f, &format!("/v1/work/{}", e["work_id"]));
    let key = work["key"].as_str().unwrap();
    let meta: Value = serde_json::from_str(key.strip_prefix("meta:").unwrap()).unwrap();
    let ms = meta["remaining_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("no remaining_ms in {key}"));
    assert!(
        ms > 0 && ms <= 250,
        "the in-transaction deadline is 250 ms: {key}"
    );
}

#[test]
fn minus_32000_without_a_limit_is_a_server_error_not_an_overload() {
    // docs/protocol.md §12: conduit's `overloaded` always carries data.limit; a -32000
    // without it (PyPI `json-rpc` answers every handler exception so) is a generic server
    // error: the host takes the fallback once, names it a server error, and never re-sends
    // the call as a retry of an overload (only the degraded probe of §6 calls again, at its
    // own pace, as after any error answer).
    let mut f = Fixture::new();
    f.install(&f.core_ext("srverr", "server-error"));
    f.start_daemon();
    f.wait_state("srverr", "ready", PATIENCE);
    let ev = f.push("feed", "s1", "job.run", "{}");
    let id = ev["event_id"].as_i64().unwrap();
    let e = f.wait_until("the fallback routing", || routed(&f, id));
    let work = http_get(&f, &format!("/v1/work/{}", e["work_id"]));
    assert_eq!(work["key"], format!("event:{id}"), "the fallback applied");
    let s = f.wait_for("srverr", PATIENCE, |s| s["health"]["reason"].is_string());
    let reason = s["health"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("-32000 without data.limit is not `overloaded`, and not retryable"),
        "{s:#}"
    );
    assert!(!reason.contains("the extension is busy"), "{s:#}");
    // The pass made the call once: no immediate re-send of the same batch.
    let triggers = std::fs::read_to_string(f.state().join("data/srverr/triggers")).unwrap();
    let first: Vec<&str> = triggers.lines().collect();
    assert_eq!(first[0], format!("[{id}]"), "{triggers}");
    let calls = s["calls"]["work_kind.trigger"]["calls"].as_u64();
    assert!(
        first.len() <= 2,
        "one call, and at most the first probe (1 s later) by now: {triggers} {calls:?}"
    );
}

#[test]
fn a_push_cut_by_an_extension_crash_is_accepted_exactly_once_after_the_retry() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("crashy", "push-crash"));
    f.start_daemon();
    // It pushes x1, dies before the answer, is restarted, and pushes x1 again.
    let s = f.wait_for("crashy", PATIENCE, |s| {
        s["stderr_tail"].as_array().is_some_and(|t| {
            t.iter()
                .any(|l| l.as_str().unwrap_or("").contains("retry of x1"))
        })
    });
    assert!(s["restarts"].as_u64().unwrap() >= 1, "{s:#}");
    let x1: Vec<Value> = f
        .all_events()
        .into_iter()
        .filter(|e| e["delivery_id"] == "x1")
        .collect();
    assert_eq!(x1.len(), 1, "{x1:#?}");
}

#[test]
fn a_daemon_killed_under_a_stream_of_pushes_keeps_every_acknowledged_event() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("sink", "ok"));
    f.start_daemon();
    f.wait_state("sink", "ready", PATIENCE);
    let mut acked = Vec::new();
    let daemon = f.daemon_pid();
    let mut killed = false;
    for i in 0..400 {
        let run = f.conduit(&[
            "events",
            "push",
            "--source",
            "feed",
            "--delivery-id",
            &format!("s{i}"),
            "--kind",
            "job.run",
            "--payload",
            &format!(r#"{{"group":"g{}"}}"#, i % 7),
            "--json",
        ]);
        if run.code() == Some(0) {
            acked.push(format!("s{i}"));
        }
        if i == 150 {
            kill(daemon, nix::sys::signal::Signal::SIGKILL);
            killed = true;
        }
        if killed && run.code() != Some(0) {
            break;
        }
    }
    let _ = f.daemon.take().unwrap().wait();
    assert!(acked.len() >= 150, "{} acknowledged", acked.len());
    f.start_daemon();
    let have: std::collections::HashSet<String> = f
        .all_events()
        .into_iter()
        .map(|e| e["delivery_id"].as_str().unwrap().to_owned())
        .collect();
    for d in &acked {
        assert!(
            have.contains(d),
            "acknowledged event {d} is missing after the crash{}",
            f.context()
        );
    }
    // Work resumes: everything gets routed, and new pushes are accepted and routed.
    let ev = f.push("feed", "after-restart", "job.run", r#"{"group":"g0"}"#);
    f.wait_until("routing after the restart", || {
        routed(&f, ev["event_id"].as_i64().unwrap())
    });
    assert!(
        f.all_events()
            .iter()
            .all(|e| e.get("routed_at_ms").is_some()),
        "an event was left unrouted"
    );
}

#[test]
fn a_16_mib_artifact_arrives_intact_and_a_wrong_digest_keeps_nothing() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("art", "ok"));
    f.start_daemon();
    f.wait_state("art", "ready", PATIENCE);
    let size = 16 * 1024 * 1024;
    let run = f.conduit(&[
        "ext",
        "call",
        "art",
        "make-artifact",
        &format!(r#"{{"size":{size},"chunk":65536}}"#),
        "--timeout-ms",
        "120000",
    ]);
    assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
    let stored: Value = serde_json::from_slice(&run.out.stdout).unwrap();
    assert_eq!(stored["size"], size);
    let id = stored["artifact_id"].as_str().unwrap();
    let out = f.dir.path().join("got.bin");
    let get = f.conduit(&["artifacts", "get", id, "-o", out.to_str().unwrap()]);
    assert_eq!(get.code(), Some(0), "{}", get.context());
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len(), size as usize);
    use sha2::Digest;
    assert_eq!(
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes))),
        id
    );

    let artifacts_before = stored_count(&f);
    let run = f.conduit(&[
        "ext",
        "call",
        "art",
        "make-artifact",
        r#"{"size":300000,"chunk":65536,"digest":"wrong"}"#,
    ]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
    let v: Value = serde_json::from_slice(&run.out.stdout).unwrap();
    assert_eq!(v["error"]["code"], -32009, "artifact_invalid: {v:#}");
    assert_eq!(stored_count(&f), artifacts_before);
    let leftovers = tmp_leftovers(&f);
    assert!(leftovers.is_empty(), "partial files left: {leftovers:?}");
}

/// `ext call NAME make-artifact PARAMS` on the Python core extension, answered as JSON.
fn make_artifact(f: &Fixture, ext: &str, params: &str) -> Value {
    let run = f.conduit(&[
        "ext",
        "call",
        ext,
        "make-artifact",
        params,
        "--timeout-ms",
        "120000",
    ]);
    assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
    serde_json::from_slice(&run.out.stdout).unwrap()
}

/// The content stored as the answer `v` to a close says (`artifact_id`, `size`, `sha256`), read
/// back with `conduit artifacts get`: it must have that size and that digest, and be stored
/// under it. `what` names the case in a failure.
fn stored_as_answered(f: &Fixture, v: &Value, what: &str) -> Vec<u8> {
    let id = v["artifact_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no artifact_id in {v:#}"));
    let out = f.dir.path().join("stored.bin");
    let get = f.conduit(&["artifacts", "get", id, "-o", out.to_str().unwrap()]);
    assert_eq!(get.code(), Some(0), "{}", get.context());
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len() as u64, v["size"].as_u64().unwrap(), "{what}");
    use sha2::Digest;
    let digest = hex::encode(sha2::Sha256::digest(&bytes));
    assert_eq!(
        v["sha256"], digest,
        "{what}: the answer holds the host's digest"
    );
    assert_eq!(id, format!("sha256:{digest}"), "{what}: stored under it");
    bytes
}

fn stored_count(f: &Fixture) -> usize {
    std::fs::read_dir(f.state().join("artifacts/sha256")).map_or(0, |d| d.count())
}

fn tmp_leftovers(f: &Fixture) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(f.state().join("tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect()
}

#[test]
fn artifacts_closed_without_a_digest_are_stored_under_the_hosts_and_a_wrong_one_keeps_nothing() {
    // docs/protocol.md §8, written from the spec in Python: the close may leave `sha256` out,
    // and the answer's `sha256` is the digest of what the host received and stored.
    let mut f = Fixture::new();
    f.install(&f.core_ext("art", "ok"));
    f.start_daemon();
    f.wait_state("art", "ready", PATIENCE);
    for (params, bulk) in [
        (r#"{"size":700001,"chunk":65536,"digest":"none"}"#, false),
        (
            r#"{"size":700002,"chunk":100000,"bulk":true,"digest":"none"}"#,
            true,
        ),
    ] {
        let v = make_artifact(&f, "art", params);
        assert_eq!(
            v["bulk"].as_bool().unwrap_or(false),
            bulk,
            "{params}: {v:#}"
        );
        assert_eq!(v["sent_sha256"], false, "{params}: {v:#}");
        stored_as_answered(&f, &v, params);
    }
    assert_eq!(stored_count(&f), 2);
    // A wrong digest on the pipe is refused as on chunks, keeping nothing.
    let v = make_artifact(
        &f,
        "art",
        r#"{"size":300000,"chunk":65536,"bulk":true,"digest":"wrong"}"#,
    );
    assert_eq!(v["error"]["code"], -32009, "artifact_invalid: {v:#}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("does not match its close"), "{msg}");
    assert_eq!(stored_count(&f), 2);
    f.wait_until("no partial artifact files", || {
        tmp_leftovers(&f).is_empty().then_some(())
    });
}

#[test]
fn artifacts_on_the_bulk_pipe_arrive_intact_and_a_broken_pipe_keeps_nothing() {
    // Written from docs/protocol.md §8.1 in Python: the framing is the protocol, not the SDK's.
    let mut f = Fixture::new();
    f.install(&f.core_ext("art", "ok"));
    f.install(&f.core_ext("art2", "ok"));
    f.start_daemon();
    f.wait_state("art", "ready", PATIENCE);
    f.wait_state("art2", "ready", PATIENCE);

    // 3 MiB + 1 in frames of 100,000 bytes, and one frame at the 1 MiB limit.
    for (size, chunk) in [(3 * 1024 * 1024 + 1, 100_000), (1024 * 1024, 1024 * 1024)] {
        let v = make_artifact(
            &f,
            "art",
            &format!(r#"{{"size":{size},"chunk":{chunk},"bulk":true}}"#),
        );
        assert_eq!(v["bulk"], true, "the bulk pipe was not granted: {v:#}");
        assert_eq!(v["size"], size, "{v:#}");
        let id = v["artifact_id"].as_str().unwrap();
        let out = f.dir.path().join("got.bin");
        let get = f.conduit(&["artifacts", "get", id, "-o", out.to_str().unwrap()]);
        assert_eq!(get.code(), Some(0), "{}", get.context());
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(bytes.len(), size);
        use sha2::Digest;
        assert_eq!(
            format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes))),
            id
        );
    }
    let before = stored_count(&f);

    // A frame header claiming 0 bytes: the stream is refused, naming the frame, and nothing
    // is kept; the pipe is done for this run, so the next stream goes as JSON chunks.
    let v = make_artifact(
        &f,
        "art",
        r#"{"size":300000,"chunk":65536,"bulk":true,"bulk_fault":"garbage"}"#,
    );
    assert_eq!(v["error"]["code"], -32009, "artifact_invalid: {v:#}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("claims 0 bytes"), "{msg}");
    let v = make_artifact(&f, "art", r#"{"size":300000,"chunk":65536,"bulk":true}"#);
    assert!(v["artifact_id"].is_string(), "{v:#}");
    assert_eq!(
        v.get("bulk"),
        None,
        "a broken pipe was granted again: {v:#}"
    );

    // On a sound pipe (art2): a frame of a tag never granted is dropped and the stream it
    // preceded is stored whole; a chunk for a stream granted the pipe is refused, keeping nothing.
    let v = make_artifact(
        &f,
        "art2",
        r#"{"size":200000,"chunk":65536,"bulk":true,"bulk_fault":"stray"}"#,
    );
    assert_eq!(v["bulk"], true, "{v:#}");
    assert_eq!(v["size"], 200000, "{v:#}");
    let v = make_artifact(
        &f,
        "art2",
        r#"{"size":1000,"chunk":1000,"bulk":true,"bulk_fault":"chunk"}"#,
    );
    assert_eq!(v["error"]["code"], -32009, "artifact_invalid: {v:#}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("takes no `artifact.chunk`"), "{msg}");

    // One byte short, and the pipe closed: the close is refused at once, not after a timeout.
    let t0 = Instant::now();
    let v = make_artifact(
        &f,
        "art2",
        r#"{"size":300000,"chunk":65536,"bulk":true,"bulk_fault":"short"}"#,
    );
    assert_eq!(v["error"]["code"], -32009, "artifact_invalid: {v:#}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("ended after 299999 of the 300000 bytes"),
        "{msg}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(25),
        "the close waited for bytes from a closed pipe"
    );
    // The garbage, chunk and short streams kept nothing; the JSON and stray ones were stored.
    assert_eq!(stored_count(&f), before + 2);
    f.wait_until("no partial artifact files", || {
        tmp_leftovers(&f).is_empty().then_some(())
    });
    assert_eq!(f.status("art")["state"], "ready");
}

#[test]
fn a_bulk_close_missing_bytes_on_an_open_pipe_is_refused_after_thirty_seconds_of_silence() {
    // The bound is the feature (docs/protocol.md §8.1, step 4): not sooner, and not forever.
    let mut f = Fixture::new();
    f.install(&f.core_ext("art", "ok"));
    f.start_daemon();
    f.wait_state("art", "ready", PATIENCE);
    let t0 = Instant::now();
    let v = make_artifact(
        &f,
        "art",
        r#"{"size":300000,"chunk":65536,"bulk":true,"bulk_fault":"stall"}"#,
    );
    let waited = t0.elapsed();
    assert_eq!(v["error"]["code"], -32009, "artifact_invalid: {v:#}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("no byte came on the bulk pipe for 30s")
            && msg.contains("299999 of the 300000 bytes"),
        "{msg}"
    );
    assert!(
        waited >= Duration::from_secs(30),
        "refused after {waited:?}, before 30 s of silence"
    );
    assert!(
        waited < Duration::from_secs(30) + PATIENCE,
        "refused only after {waited:?}"
    );
    // Nothing was kept, and the pipe still serves: the next stream takes it.
    assert_eq!(stored_count(&f), 0);
    let v = make_artifact(&f, "art", r#"{"size":1000,"chunk":1000,"bulk":true}"#);
    assert_eq!(v["bulk"], true, "{v:#}");
    assert_eq!(stored_count(&f), 1);
    f.wait_until("no partial artifact files", || {
        tmp_leftovers(&f).is_empty().then_some(())
    });
}

#[test]
fn the_rust_sdk_exports_into_the_store_under_the_hosts_digest_which_it_returns() {
    let mut f = Fixture::new();
    for p in stage_examples(&f) {
        f.install(&p);
    }
    f.start_daemon();
    f.wait_state("notes", "ready", PATIENCE);
    // Three notes of about 900 KiB each: the export is several 256 KiB frames.
    for i in 0..3 {
        let (code, body) = http_post(&f, "/v1/events", &push_body(&format!("big-{i}"), 900_000));
        assert_eq!(code, 201, "{body}");
    }
    // By default the SDK sends no digest (docs/protocol.md §8): on the bulk pipe and as JSON
    // chunks the host's own is what the SDK returns; verifying end to end, the SDK's is checked.
    for (params, transport) in [
        ("{}", "bulk-pipe"),
        (r#"{"json_chunks":true}"#, "json-chunks"),
        (r#"{"verify":true}"#, "bulk-pipe"),
    ] {
        let run = f.conduit(&[
            "ext",
            "call",
            "notes",
            "export",
            params,
            "--timeout-ms",
            "60000",
        ]);
        assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
        let v: Value = serde_json::from_slice(&run.out.stdout).unwrap();
        assert_eq!(v["transport"], transport, "{params}: {v:#}");
        assert_eq!(v["notes"], 3, "{v:#}");
        let bytes = stored_as_answered(&f, &v, params);
        let lines: Vec<Value> = String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let deliveries: Vec<&str> = lines
            .iter()
            .map(|e| e["delivery_id"].as_str().unwrap())
            .collect();
        assert_eq!(deliveries, ["big-0", "big-1", "big-2"]);
    }
    assert_eq!(stored_count(&f), 1, "the same content, stored once");
    assert!(tmp_leftovers(&f).is_empty());
}

#[test]
fn pushes_are_validated_and_capped_and_lists_are_paged_1_to_200() {
    let mut f = Fixture::new();
    f.start_daemon();
    // The body cap at its edge: exactly 1 MiB is accepted, one byte more is refused.
    let (code, body) = http_post(&f, "/v1/events", &push_body("at-limit", 1024 * 1024));
    assert_eq!(code, 201, "{body}");
    let (code, body) = http_post(&f, "/v1/events", &push_body("over-limit", 1024 * 1024 + 1));
    assert_eq!(code, 413, "{body}");
    assert!(body.contains("1048576"), "{body}");
    // The CLI says so too, with exit code 2.
    let file = f.dir.path().join("big.json");
    std::fs::write(&file, format!(r#"{{"x":"{}"}}"#, "a".repeat(1024 * 1024))).unwrap();
    let run = f.conduit(&[
        "events",
        "push",
        "--source",
        "s",
        "--delivery-id",
        "big",
        "--kind",
        "k",
        "--payload-file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), Some(2), "{}", run.context());
    assert!(run.stderr().contains("1048576"), "{}", run.context());
    let run = f.conduit(&[
        "events",
        "push",
        "--source",
        "",
        "--delivery-id",
        "d",
        "--kind",
        "k",
    ]);
    assert_eq!(run.code(), Some(2), "{}", run.context());
    for limit in ["0", "201"] {
        let run = f.conduit(&["events", "list", "--limit", limit]);
        assert_eq!(run.code(), Some(2), "{}", run.context());
    }
    assert_eq!(
        http_get(&f, "/v1/events?limit=201")["error"]["code"],
        "invalid"
    );
    assert!(http_get(&f, "/v1/events?limit=200")["events"].is_array());
    assert!(http_get(&f, "/v1/work?limit=1")["work"].is_array());
}

#[test]
fn ingress_sources_are_polled_and_their_events_accepted_once() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("poller", "ok"));
    f.start_daemon();
    f.wait_state("poller", "ready", PATIENCE);
    let inbox = f.state().join("data/poller/inbox.jsonl");
    std::fs::write(&inbox, "{\"delivery_id\":\"p1\",\"kind\":\"job.run\",\"payload\":{\"group\":\"a\"}}\n{\"delivery_id\":\"p2\",\"kind\":\"job.run\",\"payload\":{\"group\":\"a\"}}\n").unwrap();
    let polled = f.wait_until("the polled events", || {
        let evs: Vec<Value> = f
            .all_events()
            .into_iter()
            .filter(|e| e["source"] == "feed")
            .collect();
        (evs.len() == 2).then_some(evs)
    });
    assert_eq!(polled[0]["delivery_id"], "p1");
    // The cursor moved: the same lines are not accepted again, a new one is.
    let mut text = std::fs::read_to_string(&inbox).unwrap();
    text.push_str("{\"delivery_id\":\"p3\",\"kind\":\"job.run\",\"payload\":{}}\n");
    std::fs::write(&inbox, text).unwrap();
    f.wait_until("the third event", || {
        let n = f
            .all_events()
            .iter()
            .filter(|e| e["source"] == "feed")
            .count();
        (n == 3).then_some(())
    });
    // Two more polls after the third event (each returns what lies past the cursor) must
    // add nothing: wait for the poll count to grow by two rather than for a fixed time.
    let polls = |f: &Fixture| {
        f.status("poller")["calls"]["ingress.poll"]["count"]
            .as_u64()
            .unwrap_or(0)
    };
    let seen = polls(&f);
    f.wait_until("two more polls", || (polls(&f) >= seen + 2).then_some(()));
    assert_eq!(
        f.all_events()
            .iter()
            .filter(|e| e["source"] == "feed")
            .count(),
        3
    );
    assert!(
        f.status("poller")["calls"]["ingress.poll"]["count"]
            .as_u64()
            .unwrap()
            >= 2
    );
}

#[test]
fn events_pushed_while_their_extension_first_starts_wait_for_it() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("slow", "slow-start"));
    f.start_daemon();
    // Pushed while `slow` is still starting (it reads nothing for a second).
    let a = f.push("feed", "early-1", "job.run", r#"{"group":"early"}"#);
    let b = f.push("feed", "early-2", "job.run", r#"{"group":"early"}"#);
    assert_eq!(f.status("slow")["state"], "starting");
    let e = f.wait_until("routing", || routed(&f, b["event_id"].as_i64().unwrap()));
    let work = http_get(&f, &format!("/v1/work/{}", e["work_id"]));
    assert_eq!(
        work["key"], "early",
        "the trigger grouped them, not the fallback: {work:#}"
    );
    assert_eq!(
        work["event_ids"],
        serde_json::json!([a["event_id"], b["event_id"]])
    );
}

#[test]
fn a_malformed_answer_gets_the_fallback_and_counts_as_an_error() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("bad", "malformed"));
    f.start_daemon();
    f.wait_state("bad", "ready", PATIENCE);
    let ev = f.push("feed", "m1", "job.run", "{}");
    let id = ev["event_id"].as_i64().unwrap();
    let e = f.wait_until("routing", || routed(&f, id));
    assert_eq!(
        http_get(&f, &format!("/v1/work/{}", e["work_id"]))["key"],
        format!("event:{id}")
    );
    let s = f.status("bad");
    assert_eq!(s["calls"]["work_kind.trigger"]["errors"], 1, "{s:#}");
}

#[test]
fn sighup_applies_the_registry_and_keeps_the_daemon_running() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("one", "ok"));
    f.start_daemon();
    f.wait_state("one", "ready", PATIENCE);
    kill(f.daemon_pid(), nix::sys::signal::Signal::SIGHUP);
    f.wait_until("the reload to be logged", || {
        std::fs::read_to_string(f.daemon_log())
            .ok()
            .filter(|l| l.contains("SIGHUP: package registry applied"))
    });
    assert!(
        f.daemon.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the daemon exited on SIGHUP"
    );
    assert_eq!(f.status("one")["state"], "ready");
}

#[test]
fn an_extension_may_have_16_artifact_streams_open_and_no_more() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("streams", "ok"));
    f.start_daemon();
    f.wait_state("streams", "ready", PATIENCE);
    let run = f.conduit(&["ext", "call", "streams", "open-streams", r#"{"n":17}"#]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
    let got: Vec<String> = serde_json::from_slice(&run.out.stdout).unwrap();
    assert_eq!(&got[..16], &vec!["ok".to_owned(); 16][..], "{got:?}");
    assert_eq!(
        got[16], "-32009",
        "the 17th is refused artifact_invalid: {got:?}"
    );
    // Streams of a session that ends are dropped with their files.
    let pid = f.status("streams")["pid"].as_i64().unwrap() as i32;
    kill(pid, nix::sys::signal::Signal::SIGKILL);
    f.wait_for("streams", PATIENCE, |s| {
        s["restarts"] == 1 && s["state"] == "ready"
    });
    f.wait_until("the streams' files to go", || {
        let left = std::fs::read_dir(f.state().join("tmp")).unwrap().count();
        (left == 0).then_some(())
    });
}
