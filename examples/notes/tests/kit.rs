//! `notes` tested with the kit (`conduit-extension-testing`): its handlers run on the SDK's
//! own session behind a scripted host, as the daemon would call them, with no daemon.
//!
//! - a trigger with three notes grouped as `src/trigger.rs` documents;
//! - `export` when `state.events` is answered `not_found`: the handler's error, and its stream
//!   aborted;
//! - `export` past its deadline: the kit reports `deadline_exceeded`, the handler is cancelled
//!   (its stream aborted, nothing stored);
//! - `export`'s artifact received whole, on the bulk pipe, with its digest.
//!
//! Run with `cargo test -p conduit-example-notes --test kit`.

use std::time::{Duration, Instant};

use conduit_example_notes::{export::Exported, extension};
use conduit_extension::prelude::*;
use conduit_extension_testing::{KitError, ScriptedHost, Transport};
use serde_json::{Value, json};
use sha2::Digest as _;

fn note(id: i64, kind: &str, payload: Value) -> Value {
    json!({"id": id, "source": "notes-inbox", "delivery_id": format!("n-{id}"), "kind": kind,
           "payload": payload, "accepted_at_ms": 1_764_579_600_000i64 + id})
}

#[tokio::test]
async fn a_trigger_groups_three_notes_by_thread() {
    let host = ScriptedHost::builder()
        .manifest(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/conduit-extension.toml"
        ))
        .start(extension())
        .await
        .unwrap();
    let inputs = [
        note(1, "note.edited", json!({"thread": "t-42", "text": "typo"})),
        note(2, "note.posted", json!({"text": "no thread"})),
        note(
            3,
            "note.posted",
            json!({"thread": "t-42", "text": "hi @ada"}),
        ),
    ];
    let r: Value = host
        .call(
            "work_kind.trigger",
            &json!({"kind": "note", "inputs": inputs}),
        )
        .await
        .unwrap();
    assert_eq!(
        r,
        json!({"groups": [
            {"key": "thread:t-42", "event_ids": [1, 3], "start": true},
            {"key": "event:2", "event_ids": [2], "start": true},
        ]})
    );
    // Edits alone only queue on their thread.
    let r: Value = host
        .call(
            "work_kind.trigger",
            &json!({"kind": "note", "inputs": [note(4, "note.edited", json!({"thread": "t-7"}))]}),
        )
        .await
        .unwrap();
    assert_eq!(r["groups"][0]["start"], json!(false));
    host.finish().await.unwrap();
}

#[tokio::test]
async fn an_export_whose_events_are_not_found_fails_with_not_found() {
    let host = ScriptedHost::builder()
        .answer_error(
            "state.events",
            RpcError::new(ErrorCode::NotFound, "no such source"),
        )
        .start(extension())
        .await
        .unwrap();
    let e = host
        .call::<_, Exported>("export", &json!({}))
        .await
        .unwrap_err();
    assert!(e.is(ErrorCode::NotFound), "{e}");
    assert!(e.to_string().contains("no such source"), "{e}");
    assert_eq!(host.callbacks_of("state.events").len(), 1);
    assert!(host.artifacts().is_empty(), "nothing stored");
    wait_for_abort(&host, "notes.jsonl").await;
    host.finish().await.unwrap();
}

#[tokio::test]
async fn an_export_past_its_deadline_is_cancelled() {
    let host = ScriptedHost::builder()
        .answer("state.events", json!({"events": []}))
        .delay("state.events", Duration::from_millis(600))
        .start(extension())
        .await
        .unwrap();
    let e = host
        .call_within::<_, Exported>("export", &json!({}), Some(Duration::from_millis(100)))
        .await
        .unwrap_err();
    assert!(matches!(e, KitError::DeadlineExceeded { .. }), "{e}");
    // The handler saw the cancellation: its stream was aborted and nothing was stored.
    wait_for_abort(&host, "notes.jsonl").await;
    assert!(host.artifacts().is_empty());
    host.finish().await.unwrap();
}

#[tokio::test]
async fn an_export_arrives_whole_on_the_bulk_pipe_with_its_digest() {
    let events = [
        note(1, "note.posted", json!({"thread": "t-1", "text": "a"})),
        note(2, "note.posted", json!({"thread": "t-2", "text": "b"})),
        note(3, "note.edited", json!({"thread": "t-1", "text": "c"})),
    ];
    let page = json!({ "events": events });
    let host = ScriptedHost::builder()
        .bulk_pipe()
        .answer_with("state.events", move |p| {
            // One page, then an empty one after the last id.
            Ok(if p["after_id"].is_null() {
                page.clone()
            } else {
                json!({"events": []})
            })
        })
        .start(extension())
        .await
        .unwrap();
    let r: Exported = host
        .call("export", &json!({"thread": "t-1"}))
        .await
        .unwrap();
    let mut want = Vec::new();
    for e in [&events[0], &events[2]] {
        // Each line is the event as the protocol's `Event` writes it.
        let e: Event = serde_json::from_value(e.clone()).unwrap();
        want.extend_from_slice(serde_json::to_string(&e).unwrap().as_bytes());
        want.push(b'\n');
    }
    let a = &host.artifacts()[0];
    assert_eq!(
        (a.name.as_str(), a.transport),
        ("notes.jsonl", Transport::BulkPipe)
    );
    assert_eq!(
        String::from_utf8_lossy(&a.bytes),
        String::from_utf8_lossy(&want)
    );
    let digest = hex::encode(sha2::Sha256::digest(&want));
    assert_eq!(
        (r.notes, r.size, r.sha256.as_str()),
        (2, want.len() as u64, digest.as_str())
    );
    assert_eq!(r.transport, "bulk-pipe");
    host.finish().await.unwrap();
}

async fn wait_for_abort(host: &ScriptedHost, name: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    while !host.aborted_artifacts().iter().any(|a| a == name) {
        assert!(
            Instant::now() < until,
            "the stream `{name}` was never aborted"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
