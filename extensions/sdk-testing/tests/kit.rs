//! The kit proves each thing it offers against a small extension on the real SDK: the
//! handshake's limits, typed results, protocol errors, the in-transaction deadline, callbacks
//! answered from a table and from a function and recorded, `$/cancel`, chunked artifacts, a
//! request left unanswered, reentrant writes and the manifest check.
//!
//! Invariant: every wait is bounded by the kit's deadlines and patience.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use conduit_extension::prelude::*;
use conduit_extension::protocol::handshake::{Deadlines, Limits};
use conduit_extension_testing::{KitError, ScriptedHost, Transport, rules};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::Digest as _;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Echo {
    text: String,
}

fn event(id: i64, thread: &str) -> Value {
    json!({"id": id, "source": "s", "delivery_id": format!("d-{id}"), "kind": "note.posted",
           "payload": {"thread": thread}, "accepted_at_ms": 0})
}

/// A protocol type from JSON (they are built with constructors that change as the protocol
/// grows; JSON is stable).
fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// Bytes 0, 1, 2, … of length `n`.
fn content(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

#[derive(Deserialize)]
struct Upload {
    bytes: usize,
}

fn sample(saw_cancel: Arc<AtomicBool>, saw_remaining: Arc<AtomicU64>) -> Extension {
    Extension::new("kit-sample", "0.2.0")
        .method("echo", |_cx: Ctx, p: Echo| async move { Ok(p) })
        .method("limits", |cx: Ctx, _p: Value| async move {
            Ok(json!({"chunk": cx.init().limits.max_artifact_chunk_bytes}))
        })
        // Reads an event through the host and answers its thread.
        .method("thread_of", |cx: Ctx, p: Value| async move {
            let e = cx.host().event(p["event_id"].as_i64().unwrap_or(0)).await?;
            Ok(json!({"thread": e.payload["thread"]}))
        })
        .method("upload", |cx: Ctx, p: Upload| async move {
            let host = cx.host().with_json_chunks();
            Ok(host
                .store_artifact(from_json(json!({"name": "blob.bin"})), &content(p.bytes))
                .await?)
        })
        .method("hang", |_cx: Ctx, _p: Value| async move {
            std::future::pending::<()>().await;
            Ok(json!({}))
        })
        // Waits for its cancellation, noting the deadline it was given.
        .work_kind("slow", move |cx: Ctx, _p: TriggerParams| {
            let (saw_cancel, saw_remaining) = (saw_cancel.clone(), saw_remaining.clone());
            async move {
                let ms = cx.remaining().map_or(u64::MAX, |d| d.as_millis() as u64);
                saw_remaining.store(ms, Ordering::SeqCst);
                cx.cancel_token().cancelled().await;
                saw_cancel.store(true, Ordering::SeqCst);
                Ok(from_json::<TriggerResult>(json!({"groups": []})))
            }
        })
        // Writes from inside a transaction: the host refuses it.
        .work_kind("writer", |cx: Ctx, p: TriggerParams| async move {
            let e = cx
                .host()
                .emit(from_json(json!({"emission": "x", "payload": {}})))
                .await;
            let code = e.err().map(|e| e.code()).unwrap_or(0);
            Ok(from_json::<TriggerResult>(json!({"groups": [
                {"key": format!("code:{code}"), "event_ids": [p.inputs[0].id]}
            ]})))
        })
}

fn ext() -> Extension {
    sample(Arc::default(), Arc::default())
}

#[tokio::test]
async fn the_handshake_carries_the_chosen_limits_and_artifacts_keep_them() {
    let limits: Limits = from_json(json!({"max_artifact_chunk_bytes": 1000, "artifact_window": 2}));
    let host = ScriptedHost::builder()
        .limits(limits)
        .start(ext())
        .await
        .unwrap();
    assert_eq!(host.handshake_result().extension.version, "0.2.0");
    let seen: Value = host.call("limits", &json!({})).await.unwrap();
    assert_eq!(seen, json!({"chunk": 1000}));
    let stored: ArtifactStored = host.call("upload", &json!({"bytes": 4500})).await.unwrap();
    assert_eq!(stored.size, 4500);
    let a = &host.artifacts()[0];
    assert_eq!((a.transport, a.chunks), (Transport::Chunks, 5));
    host.finish().await.unwrap();
}

#[tokio::test]
async fn a_call_gives_the_typed_result() {
    let host = ScriptedHost::start(ext()).await.unwrap();
    let r: Echo = host.call("echo", &json!({"text": "hi"})).await.unwrap();
    assert_eq!(r, Echo { text: "hi".into() });
    // A result that does not read as the type asked for names the rule.
    let bad: Result<TriggerResult, _> = host.call("echo", &json!({"text": "hi"})).await;
    assert_eq!(bad.unwrap_err().rule_id(), Some(rules::DECLARED_METHODS.id));
    host.finish().await.unwrap();
}

#[tokio::test]
async fn a_protocol_error_comes_back_as_answered() {
    let host = ScriptedHost::start(ext()).await.unwrap();
    let e = host
        .call::<_, Echo>("echo", &json!({"txt": 1}))
        .await
        .unwrap_err();
    assert!(e.is(ErrorCode::InvalidParams), "{e}");
    let e = host.call::<_, Value>("nope", &json!({})).await.unwrap_err();
    assert!(e.is(ErrorCode::MethodNotFound), "{e}");
    host.finish().await.unwrap();
}

#[tokio::test]
async fn a_late_in_transaction_answer_is_deadline_exceeded_and_the_handler_is_cancelled() {
    let (saw_cancel, saw_remaining) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let deadlines: Deadlines = from_json(json!({"in_transaction_ms": 100}));
    let host = ScriptedHost::builder()
        .deadlines(deadlines)
        .start(sample(saw_cancel.clone(), saw_remaining.clone()))
        .await
        .unwrap();
    let e = host
        .call::<_, TriggerResult>(
            "work_kind.trigger",
            &json!({"kind": "slow", "inputs": [event(1, "t")]}),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, KitError::DeadlineExceeded { .. }), "{e}");
    assert!(e.is(ErrorCode::DeadlineExceeded));
    let ms = saw_remaining.load(Ordering::SeqCst);
    assert!(
        ms <= 100 && ms > 0,
        "_meta.remaining_ms reached the handler: {ms}"
    );
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !saw_cancel.load(Ordering::SeqCst) && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        saw_cancel.load(Ordering::SeqCst),
        "the handler saw $/cancel"
    );
    host.finish().await.unwrap();
}

#[tokio::test]
async fn callbacks_are_answered_from_the_table_and_recorded() {
    let host = ScriptedHost::builder()
        .answer("state.event", event(7, "t-7"))
        .start(ext())
        .await
        .unwrap();
    let r: Value = host
        .call("thread_of", &json!({"event_id": 7}))
        .await
        .unwrap();
    assert_eq!(r, json!({"thread": "t-7"}));
    let calls = host.callbacks();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].method, "state.event");
    assert_eq!(calls[0].params, json!({"event_id": 7}));
    host.finish().await.unwrap();
}

#[tokio::test]
async fn callbacks_are_answered_by_a_function_or_an_error() {
    let host = ScriptedHost::builder()
        .answer_with("state.event", |p| {
            let id = p["event_id"].as_i64().unwrap();
            if id == 404 {
                return Err(RpcError::new(ErrorCode::NotFound, "no event 404"));
            }
            Ok(event(id, &format!("t-{id}")))
        })
        .start(ext())
        .await
        .unwrap();
    let r: Value = host
        .call("thread_of", &json!({"event_id": 3}))
        .await
        .unwrap();
    assert_eq!(r, json!({"thread": "t-3"}));
    let e = host
        .call::<_, Value>("thread_of", &json!({"event_id": 404}))
        .await
        .unwrap_err();
    assert!(
        e.is(ErrorCode::NotFound),
        "the handler passed not_found on: {e}"
    );
    assert_eq!(
        host.callbacks_of("state.event"),
        [json!({"event_id": 3}), json!({"event_id": 404})]
    );
    // A callback nobody scripted is refused, with what to script.
    let host2 = ScriptedHost::start(ext()).await.unwrap();
    let e = host2
        .call::<_, Value>("thread_of", &json!({"event_id": 1}))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("answer_with"), "{e}");
    host.finish().await.unwrap();
    host2.finish().await.unwrap();
}

#[tokio::test]
async fn cancel_sends_dollar_cancel_and_the_answer_is_cancelled() {
    let host = ScriptedHost::start(ext()).await.unwrap();
    let p = host.start_call("check.sleep", &json!({"ms": 60_000}));
    p.cancel();
    let e = p.wait::<Value>().await.unwrap_err();
    assert!(e.is(ErrorCode::Cancelled), "{e}");
    host.finish().await.unwrap();
}

#[tokio::test]
async fn a_chunked_artifact_arrives_whole_with_its_digest() {
    let host = ScriptedHost::start(ext()).await.unwrap();
    let want = content(200_000);
    let stored: ArtifactStored = host
        .call("upload", &json!({"bytes": want.len()}))
        .await
        .unwrap();
    let a = &host.artifacts()[0];
    assert_eq!(a.name, "blob.bin");
    assert_eq!(a.bytes, want);
    assert_eq!(a.transport, Transport::Chunks);
    assert_eq!(a.chunks, 4, "64 KiB chunks");
    assert_eq!(a.sha256, hex::encode(sha2::Sha256::digest(&want)));
    assert_eq!(stored.sha256, a.sha256);
    host.finish().await.unwrap();
}

#[tokio::test]
async fn a_request_left_unanswered_is_named_at_finish() {
    let host = ScriptedHost::builder()
        .patience(Duration::from_millis(200))
        .start(ext())
        .await
        .unwrap();
    let _pending = host.start_within("hang", &json!({}), None);
    let e = host.finish().await.unwrap_err();
    assert_eq!(e.rule_id(), Some(rules::DECLARED_METHODS.id), "{e}");
    assert!(e.to_string().contains("`hang`"), "{e}");
    assert!(e.to_string().contains("declared-methods-answer"), "{e}");
}

#[tokio::test]
async fn a_write_inside_a_transaction_is_refused_reentrant_write() {
    let host = ScriptedHost::builder()
        .answer(
            "operation.emit",
            json!({"emission_id": 1, "commit_id": "emit-1"}),
        )
        .start(ext())
        .await
        .unwrap();
    let r: TriggerResult = host
        .call(
            "work_kind.trigger",
            &json!({"kind": "writer", "inputs": [event(1, "t")]}),
        )
        .await
        .unwrap();
    assert_eq!(
        r.groups[0].key,
        format!("code:{}", ErrorCode::ReentrantWrite.number())
    );
    host.finish().await.unwrap();
}

#[tokio::test]
async fn the_manifest_must_state_what_the_handshake_says() {
    let dir = tempfile_dir();
    let path = dir.join("conduit-extension.toml");
    std::fs::write(
        &path,
        "name = \"kit-sample\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"x\"]\n",
    )
    .unwrap();
    let e = ScriptedHost::builder()
        .manifest(&path)
        .start(ext())
        .await
        .unwrap_err();
    assert_eq!(e.rule_id(), Some(rules::HANDSHAKE.id), "{e}");
    assert!(
        e.to_string().contains("0.1.0") && e.to_string().contains("0.2.0"),
        "{e}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kit-manifest-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
