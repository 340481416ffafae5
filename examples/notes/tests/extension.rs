//! The `notes` extension as the host sees it: its manifest against its handshake, and each
//! method it declares called over a session, with payloads like the budget gate's (four notes
//! of about 1 KiB per trigger, an annotation of about 240 bytes per commit).
//!
//! Invariant: every wait is bounded by a deadline.

use std::time::Duration;

use conduit_example_notes::{extension, extension_with_inbox};
use conduit_extension::prelude::*;
use conduit_extension::protocol::handshake::{Capabilities, InitializeResult};
use conduit_extension::protocol::methods;
use conduit_rpc::{CallError, NoRequests, Peer, Session, SessionConfig};
use serde::Deserialize;
use serde_json::{Value, json};

const T: Option<Duration> = Some(Duration::from_secs(10));

#[derive(Deserialize)]
struct Manifest {
    name: String,
    version: String,
    protocol: u32,
    command: Vec<String>,
    capabilities: Capabilities,
}

#[test]
fn the_manifest_declares_what_the_extension_serves() {
    let m: Manifest = toml::from_str(include_str!("../conduit-extension.toml")).unwrap();
    let ext = extension();
    assert_eq!(m.name, ext.name());
    assert_eq!(m.version, ext.version());
    assert_eq!(m.protocol, conduit_extension::protocol::PROTOCOL_VERSION);
    assert_eq!(m.command, ["./conduit-notes"]);
    assert_eq!(m.capabilities, ext.capabilities());
}

async fn start(ext: Extension) -> (Session, Peer) {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    tokio::spawn(ext.serve(br, bw));
    let host = Session::new(ar, aw, NoRequests, SessionConfig::named("notes"));
    let peer = host.peer();
    let _: InitializeResult = peer
        .call(
            methods::host::INITIALIZE,
            &InitializeParams::current("test"),
            T,
        )
        .await
        .unwrap();
    (host, peer)
}

fn text(n: usize) -> String {
    let mut s = format!("Note {n}: ");
    while s.len() < 1024 {
        s.push_str("the nightly import ran long again, @grace please check the #db locks. ");
    }
    s
}

fn note(id: i64, thread: Option<&str>) -> Value {
    let mut payload = json!({ "author": "ada", "text": text(id as usize) });
    if let Some(t) = thread {
        payload["thread"] = json!(t);
    }
    json!({ "id": id, "source": "notes-inbox", "delivery_id": format!("n-{id}"),
            "kind": "note.posted", "payload": payload, "accepted_at_ms": 1_764_579_600_000i64 })
}

fn error(r: Result<Value, CallError>) -> RpcError {
    match r {
        Err(CallError::Rpc { error, .. }) => error,
        other => panic!("expected an error answer, got {other:?}"),
    }
}

#[tokio::test]
async fn the_four_in_transaction_calls_answer_realistic_payloads() {
    let (_host, peer) = start(extension()).await;

    let v: Value = peer
        .call(
            methods::host::WORK_KIND_TRIGGER,
            &json!({ "kind": "note", "inputs": [
                note(41, Some("t-42")), note(42, Some("t-7")), note(43, Some("t-42")), note(44, None),
            ]}),
            T,
        )
        .await
        .unwrap();
    assert_eq!(
        v,
        json!({ "groups": [
            { "key": "thread:t-42", "event_ids": [41, 43], "start": true },
            { "key": "thread:t-7", "event_ids": [42], "start": true },
            { "key": "event:44", "event_ids": [44], "start": true },
        ]})
    );

    let v: Value = peer
        .call(
            methods::host::RECURRENCE_NEXT,
            &json!({ "recurrence": "digest", "timer_id": 3, "spec": "every 15m",
                     "fired_at_ms": 1_764_579_600_000i64 }),
            T,
        )
        .await
        .unwrap();
    assert_eq!(v, json!({ "next_at_ms": 1_764_580_500_000i64 }));
    let err = error(
        peer.call(
            methods::host::RECURRENCE_NEXT,
            &json!({ "recurrence": "digest", "timer_id": 3, "spec": "fortnightly", "fired_at_ms": 0 }),
            T,
        )
        .await,
    );
    assert!(err.is(ErrorCode::InvalidParams), "{err}");
    assert!(err.message.contains("fortnightly"), "{err}");

    for (subject, satisfied) in [("grace", true), ("ada", false)] {
        let v: Value = peer
            .call(
                methods::host::DEPENDENCY_FILTER,
                &json!({ "filter": "mentions", "wait_id": 9, "subject": subject, "event": note(45, Some("t-42")) }),
                T,
            )
            .await
            .unwrap();
        assert_eq!(v, json!({ "satisfied": satisfied }), "{subject}");
    }

    let v: Value = peer
        .call(
            methods::host::EMIT_COMMIT,
            &json!({ "emission": "annotation", "commit_id": "emit-17", "work_id": 5,
                     "payload": { "thread": "t-42", "text": text(1) } }),
            T,
        )
        .await
        .unwrap();
    let records = v["records"].as_array().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["kind"], "annotation");
    let size = serde_json::to_string(&records[0]).unwrap().len();
    assert!((200..=300).contains(&size), "{size} bytes");
}

#[tokio::test]
async fn the_inbox_is_polled_from_the_file_and_echo_echoes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.jsonl");
    std::fs::write(
        &path,
        "{\"id\":\"n-1\",\"thread\":\"t-1\",\"text\":\"hi\"}\n{\"id\":\"n-2\",\"text\":\"yo\"}\n",
    )
    .unwrap();
    let (_host, peer) = start(extension_with_inbox(Some(path))).await;
    let v: Value = peer
        .call(
            methods::host::INGRESS_POLL,
            &json!({ "source": "notes-inbox", "limit": 1 }),
            T,
        )
        .await
        .unwrap();
    assert_eq!(v["events"][0]["delivery_id"], "n-1");
    assert_eq!(v["cursor"], "1");
    let v: Value = peer
        .call(
            methods::host::INGRESS_POLL,
            &json!({ "source": "notes-inbox", "cursor": "1", "limit": 10 }),
            T,
        )
        .await
        .unwrap();
    assert_eq!(v["events"][0]["delivery_id"], "n-2");
    assert_eq!(v["cursor"], "2");

    let v: Value = peer
        .call("echo", &json!({ "text": "hello" }), T)
        .await
        .unwrap();
    assert_eq!(v, json!({ "text": "hello" }));
}
