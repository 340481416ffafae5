//! The SDK end to end: an [`Extension`] served over `tokio::io::duplex`, with a host-side
//! `conduit_rpc::Session` playing the host (a fake that serves every callback and checks every
//! artifact stream it receives).
//!
//! Invariant: every wait in these tests is bounded, so a regression fails a test instead of
//! hanging the suite.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use conduit_extension::prelude::*;
use conduit_extension::{ExitReason, protocol};
use conduit_rpc::{
    BoxFuture, CallError, CallOptions, CloseReason, Handler, HandlerResult, Peer, Request, Session,
    SessionConfig, to_raw,
};
use protocol::handshake::{InitializeResult, VersionMismatchData, WorkKind};
use protocol::methods;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const T: Duration = Duration::from_secs(10);

// ---- the fake host ------------------------------------------------------------------------

#[derive(Default)]
struct Stream {
    next_seq: u64,
    data: Vec<u8>,
}

#[derive(Default)]
struct HostState {
    next_stream: u64,
    streams: HashMap<String, Stream>,
    stored: Vec<(String, Vec<u8>)>,
    aborted: Vec<String>,
    in_flight: usize,
    max_in_flight: usize,
    chunk_sizes: Vec<usize>,
    problems: Vec<String>,
    emits: Vec<EmitParams>,
    pushes: Vec<PushParams>,
    /// The `sha256` of each `artifact.close`, as sent.
    closes: Vec<Option<String>>,
}

/// Serves every callback of `docs/protocol.md` §7 and checks artifact streams the way the real
/// host does: seq order, chunk size, window, size and any digest at close, answering the digest
/// it computed.
struct FakeHost {
    events: Vec<Event>,
    max_chunk_bytes: usize,
    window: usize,
    /// Says `sha256_optional` in the open's answer and `sha256` in the close's, as a current
    /// host does; `false` plays an older host, which requires the digest and answers without it.
    current: bool,
    /// How long each chunk ack is held, so that a pipelining sender fills its window.
    ack_delay: Duration,
    state: Mutex<HostState>,
}

impl FakeHost {
    fn new() -> Self {
        FakeHost::with_artifacts(
            protocol::MAX_ARTIFACT_CHUNK_BYTES,
            protocol::ARTIFACT_WINDOW,
        )
    }

    fn with_artifacts(max_chunk_bytes: usize, window: usize) -> Self {
        let events = (1..=3)
            .map(|id| {
                Event::new(
                    id,
                    "api",
                    format!("d-{id}"),
                    "ping",
                    json!({ "n": id }),
                    1_764_579_600_000 + id,
                )
            })
            .collect();
        FakeHost {
            events,
            max_chunk_bytes,
            window,
            current: true,
            ack_delay: Duration::from_millis(2),
            state: Mutex::new(HostState::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HostState> {
        self.state.lock().unwrap()
    }

    fn invalid(msg: String) -> RpcError {
        RpcError::new(ErrorCode::ArtifactInvalid, msg)
    }

    /// Everything that must happen in arrival order runs here, on the session's reader task.
    fn serve_now(&self, req: &Request) -> Result<Now, RpcError> {
        let m = req.method.as_str();
        let answer = match m {
            methods::ext::STATE_EVENT => {
                let r: EventRef = req.params()?;
                match self.events.iter().find(|e| e.id == r.event_id) {
                    Some(e) => to_raw(e),
                    None => Err(RpcError::new(
                        ErrorCode::NotFound,
                        format!("no event {}", r.event_id),
                    )),
                }
            }
            methods::ext::STATE_EVENTS => {
                let q: EventsQuery = req.params()?;
                let events = self
                    .events
                    .iter()
                    .filter(|e| q.after_id.is_none_or(|a| e.id > a))
                    .take(q.limit.unwrap_or(50) as usize)
                    .cloned()
                    .collect();
                to_raw(&EventsPage::new(events))
            }
            methods::ext::STATE_WORK => {
                let r: WorkRef = req.params()?;
                to_raw(&Work::new(
                    r.work_id,
                    "note",
                    "thread:t-1",
                    "ready",
                    vec![1, 2],
                ))
            }
            methods::ext::OPERATION_EMIT => {
                let p: EmitParams = req.params()?;
                self.state().emits.push(p);
                to_raw(&EmitResult::new(17, "emit-17"))
            }
            methods::ext::INGRESS_PUSH => {
                let p: PushParams = req.params()?;
                self.state().pushes.push(p);
                to_raw(&PushResult::new(45, false))
            }
            methods::ext::ARTIFACT_OPEN => {
                let _: ArtifactOpen = req.params()?;
                let mut st = self.state();
                st.next_stream += 1;
                let id = format!("s-{}", st.next_stream);
                st.streams.insert(id.clone(), Stream::default());
                to_raw(
                    &ArtifactOpened::new(id, self.max_chunk_bytes, self.window)
                        .with_sha256_optional(self.current),
                )
            }
            methods::ext::ARTIFACT_CHUNK => {
                let p: ArtifactChunk = req.params()?;
                let mut st = self.state();
                let st = &mut *st;
                let Some(s) = st.streams.get_mut(&p.stream_id) else {
                    return Err(Self::invalid(format!("unknown stream {}", p.stream_id)));
                };
                if p.seq != s.next_seq {
                    st.problems
                        .push(format!("seq {} arrived, {} expected", p.seq, s.next_seq));
                    return Err(Self::invalid("out of order".into()));
                }
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(&p.data)
                    .map_err(|e| Self::invalid(e.to_string()))?;
                if bytes.len() > self.max_chunk_bytes {
                    st.problems.push(format!(
                        "chunk of {} bytes over {}",
                        bytes.len(),
                        self.max_chunk_bytes
                    ));
                }
                s.next_seq += 1;
                s.data.extend_from_slice(&bytes);
                st.chunk_sizes.push(bytes.len());
                st.in_flight += 1;
                st.max_in_flight = st.max_in_flight.max(st.in_flight);
                if st.in_flight > self.window {
                    st.problems
                        .push(format!("{} chunks unanswered at once", st.in_flight));
                }
                return Ok(Now::Ack(s.data.len() as u64));
            }
            methods::ext::ARTIFACT_CLOSE => {
                let p: ArtifactClose = req.params()?;
                let mut st = self.state();
                let Some(s) = st.streams.remove(&p.stream_id) else {
                    return Err(Self::invalid(format!("unknown stream {}", p.stream_id)));
                };
                st.closes.push(p.sha256.clone());
                let digest = hex::encode(Sha256::digest(&s.data));
                if p.sha256.is_none() && !self.current {
                    return Err(RpcError::new(
                        ErrorCode::InvalidParams,
                        "missing field `sha256`",
                    ));
                }
                if p.size != s.data.len() as u64 || p.sha256.as_ref().is_some_and(|c| *c != digest)
                {
                    return Err(Self::invalid(format!(
                        "received {} bytes ({digest}), close claimed {} ({:?})",
                        s.data.len(),
                        p.size,
                        p.sha256
                    )));
                }
                st.stored.push((digest.clone(), s.data));
                let mut stored = ArtifactStored::new(digest, p.size);
                if !self.current {
                    stored.sha256.clear(); // an older host's answer has no `sha256`
                }
                to_raw(&stored)
            }
            methods::ext::ARTIFACT_ABORT => {
                let p: ArtifactAbort = req.params()?;
                let mut st = self.state();
                st.streams.remove(&p.stream_id);
                st.aborted.push(p.stream_id);
                to_raw(&Empty {})
            }
            other => Err(RpcError::method_not_found(other)),
        };
        answer.map(Now::Answer)
    }
}

/// What the fake host does with a request once it has been checked.
enum Now {
    Answer(Box<serde_json::value::RawValue>),
    /// An accepted chunk, with the bytes received so far; acked after `ack_delay`.
    Ack(u64),
}

#[derive(Clone)]
struct HostHandler(Arc<FakeHost>);

impl Handler for HostHandler {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        match self.0.serve_now(&req) {
            Ok(Now::Answer(raw)) => Box::pin(std::future::ready(Ok(raw))),
            Err(e) => Box::pin(std::future::ready(Err(e))),
            // An accepted chunk: hold the ack a little, so the sender's window fills.
            Ok(Now::Ack(received)) => {
                let host = self.0.clone();
                Box::pin(async move {
                    tokio::time::sleep(host.ack_delay).await;
                    host.state().in_flight -= 1;
                    to_raw(&ChunkAck::new(received))
                })
            }
        }
    }
}

// ---- the extension under test -------------------------------------------------------------

#[derive(Serialize, Deserialize)]
struct Doubled {
    n: u32,
}

#[derive(Deserialize)]
struct Upload {
    bytes: usize,
    /// Write in pieces of this many bytes (odd sizes exercise the chunk buffer).
    piece: usize,
    #[serde(default)]
    chunk: Option<usize>,
    /// Return an error after writing this many bytes, dropping the writer unfinished.
    #[serde(default)]
    fail_after: Option<usize>,
    /// Verify end to end (`Host::with_verified_artifacts`).
    #[serde(default)]
    verify: bool,
    /// Finish with this digest as known (`finish_with_sha256`).
    #[serde(default)]
    sha256: Option<String>,
}

fn content(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

fn extension() -> Extension {
    Extension::new("test", "1.2.3")
        .work_kind("note", |_cx: Ctx, p: TriggerParams| async move {
            let groups = p
                .inputs
                .iter()
                .map(|e| {
                    let mut g = TriggerGroup::new(format!("k:{}", e.id), vec![e.id]);
                    g.start = e.kind == "note.posted";
                    g
                })
                .collect();
            Ok(TriggerResult::new(groups))
        })
        .declare_work_kind("plain")
        .recurrence("minutely", |_cx, p: RecurrenceParams| async move {
            Ok(RecurrenceResult::at(p.fired_at_ms + 60_000))
        })
        .dependency_filter("subject-is-yes", |_cx, p: FilterParams| async move {
            Ok(FilterResult::new(p.subject == "yes"))
        })
        .emission("annotation", |_cx, p: CommitParams| async move {
            Ok(CommitResult::new(vec![Record::new(
                "annotation",
                json!({ "commit_id": p.commit_id, "work_id": p.work_id }),
            )]))
        })
        .ingress("inbox", |_cx, p: IngressPollParams| async move {
            let start: u32 = p.cursor.as_deref().unwrap_or("0").parse().unwrap_or(0);
            let events = (start..start + p.limit.min(2))
                .map(|i| NewEvent::new(format!("in-{i}"), "note.posted", json!({})))
                .collect::<Vec<_>>();
            let cursor = (start + events.len() as u32).to_string();
            Ok(IngressPollResult::new(events).with_cursor(cursor))
        })
        .push_only_ingress("pushed")
        .method("echo", |_cx, p: Value| async move {
            if p["boom"].as_bool() == Some(true) {
                panic!("boom requested");
            }
            Ok(p)
        })
        .method("remaining", |cx: Ctx, p: Value| async move {
            Ok(json!({
                "params": p,
                "remaining_ms": cx.remaining().map(|d| d.as_millis() as u64),
                "has_deadline": cx.deadline().is_some(),
            }))
        })
        .method("double", |_cx, p: Doubled| async move {
            Ok(Doubled { n: p.n * 2 })
        })
        .method("lookup", |cx: Ctx, p: EventRef| async move {
            Ok(cx.host().event(p.event_id).await?)
        })
        .method("callbacks", |cx: Ctx, _p: Value| async move {
            let host = cx.host().with_deadline(T);
            let page = host
                .events(EventsQuery::new().with_after_id(1).with_limit(1))
                .await?;
            let work = host.work(5).await?;
            let emitted = host
                .emit(EmitParams::new("annotation", json!({ "x": 1 })).with_work_id(work.id))
                .await?;
            let pushed = host
                .push(PushParams::new("pushed", "p-1", "note.posted", json!({})))
                .await?;
            Ok(json!({
                "first_after_1": page.events[0].id,
                "work_key": work.key,
                "commit_id": emitted.commit_id,
                "event_id": pushed.event_id,
            }))
        })
        .method("upload", |cx: Ctx, p: Upload| async move {
            let open = ArtifactOpen::new("run.log")
                .with_media_type("application/octet-stream")
                .with_size(p.bytes as u64);
            let host = if p.verify {
                cx.host().with_verified_artifacts()
            } else {
                cx.host().clone()
            };
            let mut w = host.artifact(open).await?;
            if let Some(n) = p.chunk {
                w.set_chunk_bytes(n);
            }
            let data = content(p.bytes);
            let mut written = 0;
            for piece in data.chunks(p.piece.max(1)) {
                if p.fail_after.is_some_and(|n| written >= n) {
                    return Err(RpcError::internal("failed on purpose"));
                }
                w.write(piece).await?;
                written += piece.len();
            }
            let hashing = w.is_hashing();
            let stored = match &p.sha256 {
                Some(known) => w.finish_with_sha256(known).await?,
                None => w.finish().await?,
            };
            Ok(json!({ "stored": stored, "hashing": hashing }))
        })
        .method("hang", |_cx, _p: Value| async move {
            // Ignores the shutdown token on purpose: shutdown must cancel it after its grace.
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(json!({}))
        })
        .method("slow", |_cx, p: SleepParams| async move {
            tokio::time::sleep(Duration::from_millis(p.ms)).await;
            Ok(json!({ "done": true }))
        })
}

// ---- harness ------------------------------------------------------------------------------

struct Harness {
    host: Session,
    fake: Arc<FakeHost>,
    served: JoinHandle<ExitReason>,
}

impl Harness {
    fn start(ext: Extension, fake: FakeHost) -> Self {
        let (a, b) = tokio::io::duplex(256 * 1024);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        // The extension's future must be Send: spawning it proves it.
        let served = tokio::spawn(ext.serve(br, bw));
        let fake = Arc::new(fake);
        let config = SessionConfig {
            // Enough to reach the extension's own limit of 64 in the overload test.
            max_outgoing: 256,
            ..SessionConfig::named("test-extension")
        };
        let host = Session::new(ar, aw, HostHandler(fake.clone()), config);
        Harness { host, fake, served }
    }

    async fn ready(ext: Extension, fake: FakeHost) -> (Self, InitializeResult) {
        let h = Harness::start(ext, fake);
        let res = h
            .peer()
            .call(
                methods::host::INITIALIZE,
                &InitializeParams::current("test"),
                Some(T),
            )
            .await
            .expect("initialize");
        (h, res)
    }

    fn peer(&self) -> Peer {
        self.host.peer()
    }

    async fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.peer()
            .call(method, &params, Some(T))
            .await
            .map_err(rpc)
    }

    async fn served(self) -> ExitReason {
        tokio::time::timeout(T, self.served)
            .await
            .expect("serve() returned in time")
            .expect("serve() did not panic")
    }
}

fn rpc(e: CallError) -> RpcError {
    match e {
        CallError::Rpc { error, .. } => error,
        other => panic!("expected an error answer, got {other}"),
    }
}

fn event(id: i64, kind: &str) -> Value {
    json!({ "id": id, "source": "api", "delivery_id": format!("d-{id}"), "kind": kind,
            "payload": { "text": "hello" }, "accepted_at_ms": 1 })
}

// ---- handshake ------------------------------------------------------------------------------

#[tokio::test]
async fn handshake_answers_the_version_the_name_and_every_capability() {
    let (h, res) = Harness::ready(extension(), FakeHost::new()).await;
    assert_eq!(res.protocol_version, protocol::PROTOCOL_VERSION);
    assert_eq!(
        (res.extension.name.as_str(), res.extension.version.as_str()),
        ("test", "1.2.3")
    );
    let caps = res.capabilities;
    assert_eq!(
        caps.work_kinds,
        [WorkKind::new("note", true), WorkKind::new("plain", false),]
    );
    assert_eq!(caps.recurrences, ["minutely"]);
    assert_eq!(caps.dependency_filters, ["subject-is-yes"]);
    assert_eq!(caps.emissions, ["annotation"]);
    assert_eq!(caps.ingress, ["inbox", "pushed"]);
    assert_eq!(
        caps.methods,
        [
            "echo",
            "remaining",
            "double",
            "lookup",
            "callbacks",
            "upload",
            "hang",
            "slow",
            "check.sleep"
        ]
    );
    assert_eq!(caps, extension().capabilities());
    drop(h);
}

#[tokio::test]
async fn a_minimal_extension_still_declares_and_serves_check_sleep() {
    let (h, res) = Harness::ready(Extension::new("bare", "0.0.1"), FakeHost::new()).await;
    assert_eq!(res.capabilities.methods, ["check.sleep"]);
    let v = h
        .call(methods::host::CHECK_SLEEP, json!({ "ms": 5 }))
        .await
        .unwrap();
    // The time actually held: at least what was asked.
    assert!(v["slept_ms"].as_u64().unwrap() >= 5, "{v}");
}

#[tokio::test]
async fn version_mismatch_names_both_sides_and_leaves_the_session_uninitialized() {
    let h = Harness::start(extension().protocol_versions(&[2]), FakeHost::new());
    let err = h
        .call(
            methods::host::INITIALIZE,
            serde_json::to_value(InitializeParams::current("test")).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::VersionMismatch), "{err}");
    let data: VersionMismatchData = serde_json::from_str(err.data.unwrap().get()).unwrap();
    assert_eq!(data, VersionMismatchData::new(vec![1], vec![2]));
    let err = h.call("echo", json!({ "text": "hi" })).await.unwrap_err();
    assert!(err.is(ErrorCode::NotInitialized), "{err}");
}

#[tokio::test]
async fn requests_before_initialize_are_refused_and_a_second_initialize_is_invalid() {
    let h = Harness::start(extension(), FakeHost::new());
    for method in ["echo", methods::host::CHECK_SLEEP, methods::host::SHUTDOWN] {
        let err = h.call(method, json!({ "ms": 1 })).await.unwrap_err();
        assert!(err.is(ErrorCode::NotInitialized), "{method}: {err}");
    }
    let init = serde_json::to_value(InitializeParams::current("test")).unwrap();
    h.call(methods::host::INITIALIZE, init.clone())
        .await
        .unwrap();
    let err = h.call(methods::host::INITIALIZE, init).await.unwrap_err();
    assert!(err.is(ErrorCode::InvalidRequest), "{err}");
    // A second one with bad params is still `invalid_request`: the phase is checked first.
    let err = h
        .call(methods::host::INITIALIZE, json!({}))
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InvalidRequest), "{err}");
    // Still serving after the refusals.
    assert_eq!(
        h.call("echo", json!({ "text": "hi" })).await.unwrap(),
        json!({ "text": "hi" })
    );
}

#[tokio::test]
async fn initialize_with_unreadable_params_is_invalid_params() {
    let h = Harness::start(extension(), FakeHost::new());
    let err = h
        .call(
            methods::host::INITIALIZE,
            json!({ "protocol_versions": "one" }),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::InvalidParams), "{err}");
    assert!(err.message.contains("initialize"), "{err}");
}

// ---- dispatch -------------------------------------------------------------------------------

#[tokio::test]
async fn each_handler_kind_is_dispatched_by_the_name_in_its_params() {
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;

    let v = h
        .call(
            methods::host::WORK_KIND_TRIGGER,
            json!({ "kind": "note", "inputs": [event(41, "note.posted"), event(42, "note.edited")] }),
        )
        .await
        .unwrap();
    assert_eq!(
        v,
        json!({ "groups": [
            { "key": "k:41", "event_ids": [41], "start": true },
            { "key": "k:42", "event_ids": [42], "start": false },
        ]})
    );

    let v = h
        .call(
            methods::host::RECURRENCE_NEXT,
            json!({ "recurrence": "minutely", "timer_id": 3, "spec": "x", "fired_at_ms": 1000 }),
        )
        .await
        .unwrap();
    assert_eq!(v, json!({ "next_at_ms": 61_000 }));

    for (subject, satisfied) in [("yes", true), ("no", false)] {
        let v = h
            .call(
                methods::host::DEPENDENCY_FILTER,
                json!({ "filter": "subject-is-yes", "wait_id": 9, "subject": subject,
                        "event": event(43, "note.posted") }),
            )
            .await
            .unwrap();
        assert_eq!(v, json!({ "satisfied": satisfied }));
    }

    let v = h
        .call(
            methods::host::EMIT_COMMIT,
            json!({ "emission": "annotation", "commit_id": "emit-17", "work_id": 5, "payload": {} }),
        )
        .await
        .unwrap();
    assert_eq!(
        v,
        json!({ "records": [{ "kind": "annotation", "body": { "commit_id": "emit-17", "work_id": 5 } }] })
    );

    let v = h
        .call(
            methods::host::INGRESS_POLL,
            json!({ "source": "inbox", "cursor": "4", "limit": 10 }),
        )
        .await
        .unwrap();
    assert_eq!(v["cursor"], "6");
    assert_eq!(v["events"][1]["delivery_id"], "in-5");

    let v = h
        .call(
            methods::host::INGRESS_POLL,
            json!({ "source": "pushed", "limit": 10 }),
        )
        .await
        .unwrap();
    assert_eq!(v, json!({ "events": [] }), "a push-only source polls empty");

    let v = h.call("double", json!({ "n": 21 })).await.unwrap();
    assert_eq!(v, json!({ "n": 42 }));
}

#[tokio::test]
async fn the_requests_meta_is_stripped_and_its_remaining_time_is_the_handlers_deadline() {
    // docs/protocol.md §11: the host writes `_meta.remaining_ms` first in the params.
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    let v = h
        .call(
            "remaining",
            json!({ "_meta": { "remaining_ms": 250 }, "text": "hi" }),
        )
        .await
        .unwrap();
    assert_eq!(
        v["params"],
        json!({ "text": "hi" }),
        "the handler never sees _meta"
    );
    assert_eq!(v["has_deadline"], true);
    let left = v["remaining_ms"].as_u64().unwrap();
    assert!(left <= 250 && left > 0, "{v}");
    // The host's own spelling, byte for byte: the deadline carried as the supervisor carries it.
    let opts = CallOptions::within(Some(Duration::from_secs(30))).carrying_deadline();
    let raw = h
        .peer()
        .request("remaining", &protocol::Typed(&json!({ "text": "x" })), opts)
        .await
        .unwrap();
    let v: Value = serde_json::from_str(raw.get()).unwrap();
    assert_eq!(v["params"], json!({ "text": "x" }));
    assert!(v["remaining_ms"].as_u64().unwrap() > 29_000, "{v}");
    // Typed handlers ignore it too; a request without it has no deadline.
    let v = h
        .call(
            methods::host::RECURRENCE_NEXT,
            json!({ "_meta": { "remaining_ms": 250 }, "recurrence": "minutely", "timer_id": 3,
                    "spec": "x", "fired_at_ms": 1000 }),
        )
        .await
        .unwrap();
    assert_eq!(v, json!({ "next_at_ms": 61_000 }));
    let v = h
        .call("remaining", json!({ "text": "no meta" }))
        .await
        .unwrap();
    assert_eq!(v["has_deadline"], false);
    assert_eq!(v["remaining_ms"], Value::Null);
    assert_eq!(v["params"], json!({ "text": "no meta" }));
}

#[tokio::test]
async fn wrong_params_and_undeclared_names_are_invalid_params_naming_the_method() {
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    let cases = [
        (
            methods::host::WORK_KIND_TRIGGER,
            json!({ "kind": "note" }),
            "inputs",
        ),
        (
            methods::host::WORK_KIND_TRIGGER,
            json!({ "kind": "plain", "inputs": [] }),
            "`plain`",
        ),
        (
            methods::host::WORK_KIND_TRIGGER,
            json!(["note", []]),
            "object",
        ),
        (
            methods::host::RECURRENCE_NEXT,
            json!({ "recurrence": "hourly", "timer_id": 1, "spec": "", "fired_at_ms": 0 }),
            "`hourly`",
        ),
        (
            methods::host::DEPENDENCY_FILTER,
            json!({ "filter": "nope", "wait_id": 1, "subject": "", "event": event(1, "x") }),
            "`nope`",
        ),
        (
            methods::host::EMIT_COMMIT,
            json!({ "emission": "other", "commit_id": "c", "payload": null }),
            "`other`",
        ),
        (
            methods::host::INGRESS_POLL,
            json!({ "source": "mail", "limit": 1 }),
            "`mail`",
        ),
        (methods::host::CHECK_SLEEP, json!({ "ms": "soon" }), "ms"),
        ("double", json!({ "n": "twenty-one" }), "n"),
        ("double", json!({}), "n"),
    ];
    for (method, params, mention) in cases {
        let err = h.call(method, params.clone()).await.unwrap_err();
        assert!(err.is(ErrorCode::InvalidParams), "{method} {params}: {err}");
        assert!(
            err.message.contains(&format!("`{method}`")) && err.message.contains(mention),
            "{method} {params}: the message should name the method and {mention}: {err}"
        );
    }
    let err = h.call("nonesuch", json!({})).await.unwrap_err();
    assert!(err.is(ErrorCode::MethodNotFound), "{err}");
}

#[tokio::test]
async fn a_handler_can_call_the_host_back_while_its_request_is_pending() {
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    let v = h.call("lookup", json!({ "event_id": 2 })).await.unwrap();
    assert_eq!(v["delivery_id"], "d-2");

    // The host's own error passes through `?` unchanged.
    let err = h
        .call("lookup", json!({ "event_id": 99 }))
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::NotFound), "{err}");

    let v = h.call("callbacks", json!({})).await.unwrap();
    assert_eq!(
        v,
        json!({ "first_after_1": 2, "work_key": "thread:t-1", "commit_id": "emit-17", "event_id": 45 })
    );
    let st = h.fake.state();
    assert_eq!(st.emits[0].work_id, Some(5));
    assert_eq!(st.pushes[0].delivery_id, "p-1");
}

#[tokio::test]
async fn a_panicking_handler_is_answered_internal_error_and_frees_its_slot() {
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    for _ in 0..3 {
        let err = h.call("echo", json!({ "boom": true })).await.unwrap_err();
        assert!(err.is(ErrorCode::InternalError), "{err}");
        assert!(err.message.contains("boom requested"), "{err}");
    }
    assert_eq!(h.call("echo", json!(1)).await.unwrap(), json!(1));
}

// ---- cancellation and overload --------------------------------------------------------------

#[tokio::test]
async fn check_sleep_holds_until_its_time_or_until_cancel() {
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    let t0 = Instant::now();
    let v = h
        .call(methods::host::CHECK_SLEEP, json!({ "ms": 50 }))
        .await
        .unwrap();
    let held = v["slept_ms"].as_u64().unwrap();
    // At least its time; the upper margin is for a busy machine.
    assert!((50..5000).contains(&held), "{v}");
    assert!(t0.elapsed() >= Duration::from_millis(50));

    let cancel = CancellationToken::new();
    let peer = h.peer();
    let params = serde_json::value::to_raw_value(&json!({ "ms": 60_000 })).unwrap();
    let c = cancel.clone();
    let call = tokio::spawn(async move {
        peer.request(
            methods::host::CHECK_SLEEP,
            &params,
            CallOptions::within(Some(T)).cancelled_by(&c),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t0 = Instant::now();
    cancel.cancel();
    let err = rpc(call.await.unwrap().unwrap_err());
    assert!(err.is(ErrorCode::Cancelled), "{err}");
    // Not the 60 s sleep; the margin is for a busy machine.
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "cancel took {:?}",
        t0.elapsed()
    );
}

#[tokio::test]
async fn the_65th_concurrent_request_is_refused_overloaded() {
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    let held: Vec<_> = (0..64)
        .map(|_| {
            let peer = h.peer();
            // A sleep that arrives while a probe below is being served is itself refused:
            // send it again until all 64 are held.
            tokio::spawn(async move {
                loop {
                    let res = peer
                        .call::<_, Value>(
                            methods::host::CHECK_SLEEP,
                            &json!({ "ms": 60_000 }),
                            None,
                        )
                        .await;
                    match res {
                        Err(CallError::Rpc { error, .. }) if error.is(ErrorCode::Overloaded) => {
                            tokio::time::sleep(Duration::from_millis(1)).await
                        }
                        other => return other,
                    }
                }
            })
        })
        .collect();
    // Wait until the extension holds all 64 (its session counts them).
    let t0 = Instant::now();
    loop {
        let err = h.call(methods::host::CHECK_SLEEP, json!({ "ms": 0 })).await;
        match err {
            Err(e) if e.is(ErrorCode::Overloaded) => break,
            _ if t0.elapsed() > T => panic!("never overloaded"),
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    let err = h.call("echo", json!({})).await.unwrap_err();
    assert!(err.is(ErrorCode::Overloaded), "{err}");
    assert_eq!(err.data.unwrap().get(), r#"{"limit":64}"#);
    for t in held {
        t.abort();
    }
}

// ---- artifacts ------------------------------------------------------------------------------

/// Upload `len` bytes with `params`; the writer's answer must hold the host's digest of them.
async fn upload(fake: FakeHost, params: Value, len: usize) -> (Harness, Value) {
    let (h, _) = Harness::ready(extension(), fake).await;
    let v = h.call("upload", params).await.unwrap();
    let digest = hex::encode(Sha256::digest(content(len)));
    assert_eq!(
        v["stored"],
        json!({ "artifact_id": format!("sha256:{digest}"), "size": len, "sha256": digest })
    );
    (h, v)
}

#[tokio::test]
async fn an_artifact_is_pipelined_within_the_hosts_window_and_chunk_size() {
    // A host stricter than the defaults: 10,000-byte chunks, 3 in flight.
    let len = 200_003;
    let (h, _) = upload(
        FakeHost::with_artifacts(10_000, 3),
        json!({ "bytes": len, "piece": 7_777 }),
        len,
    )
    .await;
    let st = h.fake.state();
    assert!(st.problems.is_empty(), "{:?}", st.problems);
    assert_eq!(st.chunk_sizes.len(), 21);
    assert!(st.chunk_sizes[..20].iter().all(|&n| n == 10_000));
    assert_eq!(st.chunk_sizes[20], 3);
    assert_eq!(
        st.max_in_flight, 3,
        "the window is used fully, never exceeded"
    );
    assert_eq!(st.stored.len(), 1);
    assert!(st.streams.is_empty() && st.aborted.is_empty());
}

#[tokio::test]
async fn an_artifact_uses_64_kib_chunks_and_the_default_window_by_default() {
    let len = (1 << 20) + 5;
    let (h, _) = upload(
        FakeHost::new(),
        json!({ "bytes": len, "piece": 100_000 }),
        len,
    )
    .await;
    let st = h.fake.state();
    assert!(st.problems.is_empty(), "{:?}", st.problems);
    assert_eq!(st.chunk_sizes.len(), 17);
    assert!(st.chunk_sizes[..16].iter().all(|&n| n == 65_536));
    assert_eq!(st.max_in_flight, protocol::ARTIFACT_WINDOW);
}

#[tokio::test]
async fn an_artifact_chunk_size_is_clamped_to_the_hosts_maximum() {
    let len = 50_000;
    let (h, _) = upload(
        FakeHost::with_artifacts(16_384, 8),
        json!({ "bytes": len, "piece": 50_000, "chunk": 1_000_000 }),
        len,
    )
    .await;
    let st = h.fake.state();
    assert!(st.problems.is_empty(), "{:?}", st.problems);
    assert!(st.chunk_sizes.iter().all(|&n| n <= 16_384));
}

#[tokio::test]
async fn an_empty_artifact_is_an_open_and_a_close() {
    let (h, v) = upload(FakeHost::new(), json!({ "bytes": 0, "piece": 1 }), 0).await;
    assert_eq!(
        v["stored"]["artifact_id"],
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert!(h.fake.state().chunk_sizes.is_empty());
}

#[tokio::test]
async fn by_default_no_digest_is_hashed_or_sent_and_the_answer_holds_the_hosts() {
    // docs/protocol.md §8: the receiver computes the digest; the SDK does not hash by default.
    let len = 300_001;
    let (h, v) = upload(
        FakeHost::new(),
        json!({ "bytes": len, "piece": 65_536 }),
        len,
    )
    .await;
    assert_eq!(v["hashing"], false);
    let st = h.fake.state();
    assert_eq!(st.closes, [None], "the close carried a digest");
    assert_eq!(st.stored.len(), 1);
}

#[tokio::test]
async fn verified_artifacts_send_their_own_digest_for_the_host_to_check() {
    let len = 200_000;
    let (h, v) = upload(
        FakeHost::new(),
        json!({ "bytes": len, "piece": 30_000, "verify": true }),
        len,
    )
    .await;
    assert_eq!(v["hashing"], true);
    let digest = hex::encode(Sha256::digest(content(len)));
    assert_eq!(h.fake.state().closes, [Some(digest)]);
}

#[tokio::test]
async fn a_known_digest_is_sent_as_given_and_a_wrong_one_is_refused_keeping_nothing() {
    let len = 100_000;
    let digest = hex::encode(Sha256::digest(content(len)));
    let (h, v) = upload(
        FakeHost::new(),
        json!({ "bytes": len, "piece": 4_096, "sha256": digest }),
        len,
    )
    .await;
    assert_eq!(v["hashing"], false, "a known digest needs no hashing here");
    assert_eq!(h.fake.state().closes, [Some(digest)]);

    let wrong = hex::encode(Sha256::digest(b"other bytes"));
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    let err = h
        .call(
            "upload",
            json!({ "bytes": len, "piece": 4_096, "sha256": wrong }),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::ArtifactInvalid), "{err}");
    let st = h.fake.state();
    assert_eq!(st.closes, [Some(wrong)]);
    assert!(st.stored.is_empty() && st.streams.is_empty());
}

#[tokio::test]
async fn a_verifying_writer_refuses_a_known_digest_that_is_not_its_own_before_closing() {
    let wrong = hex::encode(Sha256::digest(b"other bytes"));
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    let err = h
        .call(
            "upload",
            json!({ "bytes": 5_000, "piece": 1_000, "verify": true, "sha256": wrong }),
        )
        .await
        .unwrap_err();
    assert!(
        err.message
            .contains(&format!("not the {wrong} given to finish")),
        "{err}"
    );
    let st = h.fake.state();
    assert!(st.closes.is_empty(), "closed anyway: {:?}", st.closes);
    assert_eq!(st.aborted.len(), 1);
    assert!(st.stored.is_empty());
}

#[tokio::test]
async fn an_older_host_that_requires_the_digest_gets_it_and_its_answer_is_completed() {
    // An older host says no `sha256_optional` and answers without `sha256`.
    let len = 70_000;
    let mut fake = FakeHost::new();
    fake.current = false;
    let (h, v) = upload(fake, json!({ "bytes": len, "piece": 10_000 }), len).await;
    assert_eq!(v["hashing"], true);
    let digest = hex::encode(Sha256::digest(content(len)));
    assert_eq!(h.fake.state().closes, [Some(digest)]);
}

#[tokio::test]
async fn an_unfinished_artifact_is_aborted_when_its_writer_is_dropped() {
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    let err = h
        .call(
            "upload",
            json!({ "bytes": 300_000, "piece": 70_000, "fail_after": 140_000 }),
        )
        .await
        .unwrap_err();
    assert!(err.message.contains("failed on purpose"), "{err}");
    let t0 = Instant::now();
    loop {
        {
            let st = h.fake.state();
            if st.aborted.len() == 1 {
                assert!(st.stored.is_empty() && st.streams.is_empty());
                break;
            }
        }
        assert!(t0.elapsed() < T, "the stream was never aborted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---- shutdown and EOF -----------------------------------------------------------------------

#[tokio::test]
async fn shutdown_refuses_new_requests_lets_running_ones_finish_then_closes() {
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    let peer = h.peer();
    let slow = tokio::spawn({
        let peer = peer.clone();
        async move {
            peer.call::<_, Value>("slow", &json!({ "ms": 300 }), Some(T))
                .await
        }
    });
    let probe = tokio::spawn({
        let peer = peer.clone();
        async move {
            peer.call::<_, Value>(
                methods::host::CHECK_SLEEP,
                &json!({ "ms": 60_000 }),
                Some(T),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let shutdown = tokio::spawn({
        let peer = peer.clone();
        async move {
            let t0 = Instant::now();
            let r = peer
                .call::<_, Value>(methods::host::SHUTDOWN, &json!({}), Some(T))
                .await;
            (r, t0.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let err = h.call("echo", json!({})).await.unwrap_err();
    assert!(err.is(ErrorCode::ShuttingDown), "{err}");

    // The probe stops at once; the real work finishes; then shutdown is answered.
    let err = rpc(probe.await.unwrap().unwrap_err());
    assert!(err.is(ErrorCode::Cancelled), "{err}");
    assert_eq!(slow.await.unwrap().unwrap(), json!({ "done": true }));
    let (res, took) = shutdown.await.unwrap();
    assert_eq!(res.unwrap(), json!({}));
    assert!(
        took >= Duration::from_millis(200),
        "answered before the work finished"
    );

    // The extension closes its end: the host sees EOF, and serve() says why it returned.
    let reason = tokio::time::timeout(T, h.host.wait()).await.unwrap();
    assert_eq!(reason, CloseReason::PeerClosed);
    let reason = Harness {
        host: h.host,
        fake: h.fake,
        served: h.served,
    }
    .served()
    .await;
    assert_eq!(reason, ExitReason::Shutdown);
    assert_eq!(reason.code(), 0);
}

#[tokio::test]
async fn shutdown_cancels_what_outlives_half_the_grace() {
    let h = Harness::start(extension(), FakeHost::new());
    let mut init = InitializeParams::current("test");
    init.deadlines.shutdown_grace_ms = 400;
    let _: Value = h
        .peer()
        .call(methods::host::INITIALIZE, &init, Some(T))
        .await
        .unwrap();
    let hang = tokio::spawn({
        let peer = h.peer();
        async move { peer.call::<_, Value>("hang", &json!({}), Some(T)).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let t0 = Instant::now();
    let v = h.call(methods::host::SHUTDOWN, json!({})).await.unwrap();
    assert_eq!(v, json!({}));
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(180) && took < Duration::from_secs(5),
        "shutdown took {took:?}"
    );
    let err = rpc(hang.await.unwrap().unwrap_err());
    assert!(err.is(ErrorCode::Cancelled), "{err}");
    assert_eq!(h.served().await, ExitReason::Shutdown);
}

#[tokio::test]
async fn eof_ends_serve_at_once_with_exit_code_0() {
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    // A request still running does not hold the exit.
    let peer = h.peer();
    let held = tokio::spawn(async move {
        peer.call::<_, Value>(methods::host::CHECK_SLEEP, &json!({ "ms": 60_000 }), None)
            .await
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let Harness { host, fake, served } = h;
    let t0 = Instant::now();
    host.close(Duration::from_millis(10)).await;
    let reason = Harness {
        host: Session::new(
            tokio::io::empty(),
            tokio::io::sink(),
            HostHandler(fake.clone()),
            SessionConfig::default(),
        ),
        fake,
        served,
    }
    .served()
    .await;
    assert_eq!(reason, ExitReason::HostClosed);
    assert_eq!(reason.code(), 0);
    // Not the 60 s sleep still running; the margin is for a busy machine.
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    assert!(held.await.unwrap().is_err());
}

#[tokio::test]
async fn eof_before_initialize_ends_serve_too() {
    let (a, b) = tokio::io::duplex(1024);
    let (br, bw) = tokio::io::split(b);
    let served = tokio::spawn(extension().serve(br, bw));
    drop(a);
    let reason = tokio::time::timeout(T, served).await.unwrap().unwrap();
    assert_eq!(reason, ExitReason::HostClosed);
}

#[tokio::test]
async fn requests_that_arrived_before_eof_are_still_answered() {
    // The whole input at once, then EOF: what `printf '...' | extension` does.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut a, b) = tokio::io::duplex(64 * 1024);
    let (br, bw) = tokio::io::split(b);
    let served = tokio::spawn(extension().serve(br, bw));
    let init = serde_json::to_string(&json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": InitializeParams::current("test") }))
    .unwrap();
    let input = format!(
        "{init}\n{}\n{}\n",
        r#"{"jsonrpc":"2.0","id":2,"method":"echo","params":{"text":"hi"}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"slow","params":{"ms":20}}"#,
    );
    a.write_all(input.as_bytes()).await.unwrap();
    a.shutdown().await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(T, a.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    let answers: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let by_id = |id: i64| {
        answers
            .iter()
            .find(|v| v["id"] == id)
            .unwrap_or_else(|| panic!("no answer to {id}: {out}"))
    };
    assert_eq!(answers.len(), 3, "{out}");
    assert_eq!(by_id(1)["result"]["protocol_version"], 1);
    assert_eq!(by_id(2)["result"], json!({ "text": "hi" }));
    assert_eq!(by_id(3)["result"], json!({ "done": true }));
    let reason = tokio::time::timeout(T, served).await.unwrap().unwrap();
    assert_eq!(reason, ExitReason::HostClosed);
}

#[tokio::test]
async fn a_piped_shutdown_is_answered_after_everything_before_and_after_it() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut a, b) = tokio::io::duplex(64 * 1024);
    let (br, bw) = tokio::io::split(b);
    let served = tokio::spawn(extension().serve(br, bw));
    let init = serde_json::to_string(&json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": InitializeParams::current("test") }))
    .unwrap();
    let input = format!(
        "{init}\n{}\n{}\n{}\n",
        r#"{"jsonrpc":"2.0","id":2,"method":"slow","params":{"ms":20}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"shutdown","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"echo","params":{"text":"late"}}"#,
    );
    a.write_all(input.as_bytes()).await.unwrap();
    a.shutdown().await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(T, a.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    let answers: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 4, "{out}");
    let last = answers.last().unwrap();
    assert_eq!(
        (last["id"].clone(), last["result"].clone()),
        (json!(3), json!({})),
        "{out}"
    );
    let late = answers.iter().find(|v| v["id"] == 4).unwrap();
    assert_eq!(late["error"]["code"], ErrorCode::ShuttingDown.number());
    let slow = answers.iter().find(|v| v["id"] == 2).unwrap();
    assert_eq!(slow["result"], json!({ "done": true }));
    let reason = tokio::time::timeout(T, served).await.unwrap().unwrap();
    assert_eq!(reason.code(), 0);
}

// ---- payload depth --------------------------------------------------------------------------

/// What the host accepts it sends wrapped in envelopes; the SDK reads every wrap of a payload at
/// the limit, and one past it (the host never sends that, but the margin is there).
#[tokio::test]
async fn payloads_at_the_depth_limit_and_one_past_it_are_read_in_every_wrap() {
    let (h, _) = Harness::ready(extension(), FakeHost::new()).await;
    for depth in [protocol::MAX_PAYLOAD_DEPTH, protocol::MAX_PAYLOAD_DEPTH + 1] {
        let payload: Value =
            serde_json::from_str(&protocol::depth::nested(depth - 1, r#"{"thread":"t"}"#)).unwrap();
        assert_eq!(
            protocol::json_depth(&payload.to_string()),
            depth,
            "the test's own payload"
        );
        let mut deep = event(41, "note.posted");
        deep["payload"] = payload.clone();
        let v = h
            .call(
                methods::host::WORK_KIND_TRIGGER,
                json!({ "kind": "note", "inputs": [event(40, "note.posted"), deep.clone()] }),
            )
            .await
            .unwrap_or_else(|e| panic!("trigger at depth {depth}: {e}"));
        assert_eq!(v["groups"].as_array().unwrap().len(), 2, "{v}");
        let v = h
            .call(
                methods::host::DEPENDENCY_FILTER,
                json!({ "filter": "subject-is-yes", "wait_id": 9, "subject": "yes", "event": deep }),
            )
            .await
            .unwrap_or_else(|e| panic!("filter at depth {depth}: {e}"));
        assert_eq!(v, json!({ "satisfied": true }));
        h.call(
            methods::host::EMIT_COMMIT,
            json!({ "emission": "annotation", "commit_id": "c", "payload": payload }),
        )
        .await
        .unwrap_or_else(|e| panic!("commit at depth {depth}: {e}"));
    }
}
