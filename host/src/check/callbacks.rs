//! The host side of callbacks during a check: small, believable answers with no store behind them.
//!
//! A package may call back while the checker's requests are pending (a trigger that reads an
//! event, an ingress source that pushes). The checker answers through the daemon's own
//! dispatcher (`core::dispatch`: the same refusals, in the same words) the way the daemon would
//! for an empty state plus the synthetic events it sent ([`synthetic_events`]): reads find those
//! events, writes are acknowledged without being kept. Artifacts go through the daemon's own
//! receiver (`core::artifacts`: the same limits, checks, errors and bulk pipe) into the
//! check's scratch folder, and each is deleted once verified. It counts what it was asked, and
//! says what became of each artifact, for the report.
//!
//! Invariant: nothing here blocks or grows without bound — the receiver holds at most
//! `MAX_OPEN_STREAMS` streams per instance, a verified artifact is deleted at once, and the
//! report keeps at most [`MAX_ARTIFACT_NOTES`] lines of artifacts.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use conduit_protocol::calls::{
    ArtifactAbort, ArtifactChunk, ArtifactClose, ArtifactOpen, ArtifactStored, EmitParams,
    EmitResult, Empty, Event, EventRef, EventsPage, EventsQuery, PushParams, PushResult, WorkRef,
};
use conduit_protocol::methods::{
    ArtifactAbort as Abort, ArtifactChunk as Chunk, ArtifactClose as Close, ArtifactOpen as Open,
    IngressPush, OperationEmit, StateEvent, StateEvents, StateWork,
};
use conduit_protocol::{Capabilities, Capability, ErrorCode, RpcError};
use conduit_rpc::{BoxFuture, Handler, HandlerResult, Peer, Request};

use crate::core::artifacts::Artifacts;
use crate::core::dispatch::{HostCallbacks, Reply, dispatch};

/// Lines the report keeps on the artifacts a package made (the rest are counted).
pub(crate) const MAX_ARTIFACT_NOTES: usize = 8;

/// The events the checker sends in its in-transaction calls; `state.event` finds them.
pub(crate) fn synthetic_events(source: &str, now_ms: i64) -> Vec<Event> {
    (0..3)
        .map(|i| {
            Event::new(
                101 + i,
                source,
                format!("conduit-check-{}", 101 + i),
                "check.input",
                serde_json::json!({
                    "text": format!("conduit check input {}", i + 1),
                    "thread": "t-1",
                }),
                now_ms - 1000 + i,
            )
        })
        .collect()
}

/// What the checker's stand-in host has seen and handed out: the handshake's capabilities,
/// accepted deliveries, ids, the callbacks made, and what became of each artifact.
#[derive(Debug, Default)]
struct Recorded {
    /// Capabilities from the handshake, once known: emissions and ingress sources the package
    /// may name in callbacks.
    caps: Option<Capabilities>,
    deliveries: HashMap<(String, String), i64>,
    next_id: i64,
    calls: BTreeMap<String, usize>,
    /// Stream id → (name, whether it was granted the bulk pipe), while open.
    streams: HashMap<String, (String, bool)>,
    /// One line per artifact closed or refused, the first [`MAX_ARTIFACT_NOTES`] of them.
    artifacts: Vec<String>,
    /// Artifacts past those lines.
    more_artifacts: usize,
    /// Why each refused artifact was refused (`artifact_invalid`), the first
    /// [`MAX_ARTIFACT_NOTES`] of them: the package broke docs/protocol.md §8.
    refusals: Vec<String>,
}

/// The callback handler; clones share state.
#[derive(Clone, Debug)]
pub(crate) struct CheckHost {
    events: Arc<Vec<Event>>,
    state: Arc<Mutex<Recorded>>,
    /// The daemon's artifact receiver, storing under the check's scratch folder.
    artifacts: Arc<Artifacts>,
    /// The instance whose requests this clone serves: each has its own streams and bulk pipe.
    instance: &'static str,
}

impl CheckHost {
    /// A stand-in host whose reads find `events` and whose artifacts go under `scratch`.
    pub(crate) fn new(events: Vec<Event>, scratch: &Path) -> Self {
        CheckHost {
            events: Arc::new(events),
            state: Arc::new(Mutex::new(Recorded {
                next_id: 1000,
                ..Recorded::default()
            })),
            artifacts: Arc::new(Artifacts::new(
                scratch.join("artifacts"),
                scratch.join("artifacts-tmp"),
            )),
            instance: "main",
        }
    }

    /// The handler for the instance `label` (sharing everything but its artifact streams).
    pub(crate) fn for_instance(&self, label: &'static str) -> CheckHost {
        CheckHost {
            instance: label,
            ..self.clone()
        }
    }

    /// Where the instance's bulk pipe goes: the daemon's reader, into this host's receiver.
    pub(crate) fn bulk_sink(&self) -> conduit_supervisor::BulkSink {
        self.artifacts.bulk_sink(self.instance)
    }

    /// What became of the artifacts the package made, one line each (then a count of the rest).
    pub(crate) fn artifact_notes(&self) -> Vec<String> {
        let st = self.state.lock().unwrap();
        let mut out = st.artifacts.clone();
        if st.more_artifacts > 0 {
            out.push(format!("and {} more artifacts", st.more_artifacts));
        }
        out
    }

    fn note_artifact(&self, line: String) {
        let mut st = self.state.lock().unwrap();
        if st.artifacts.len() < MAX_ARTIFACT_NOTES {
            st.artifacts.push(line);
        } else {
            st.more_artifacts += 1;
        }
    }

    fn forget(&self, stream_id: &str) -> Option<(String, bool)> {
        self.state.lock().unwrap().streams.remove(stream_id)
    }

    /// An `artifact_invalid` ends the stream (docs/protocol.md §8); the report says why.
    fn refused(&self, stream_id: &str, e: &RpcError) {
        if !e.is(ErrorCode::ArtifactInvalid) {
            return;
        }
        let Some((label, _)) = self.forget(stream_id) else {
            return;
        };
        let line = format!("artifact `{label}` refused: {}", e.message);
        {
            let mut st = self.state.lock().unwrap();
            if st.refusals.len() < MAX_ARTIFACT_NOTES {
                st.refusals.push(line.clone());
            }
        }
        self.note_artifact(line);
    }

    /// Why each artifact the package made was refused, if any was (at most
    /// [`MAX_ARTIFACT_NOTES`] lines).
    pub(crate) fn artifact_refusals(&self) -> Vec<String> {
        self.state.lock().unwrap().refusals.clone()
    }

    /// Tell the handler what the package declared (after the handshake).
    pub(crate) fn set_capabilities(&self, caps: &Capabilities) {
        self.state.lock().unwrap().caps = Some(caps.clone());
    }

    /// How many callbacks of each method the package made.
    pub(crate) fn calls(&self) -> BTreeMap<String, usize> {
        self.state.lock().unwrap().calls.clone()
    }
}

/// The checker's answers: reads find the synthetic events, writes are acknowledged without
/// being kept, artifacts go through the daemon's receiver and are deleted once verified.
impl HostCallbacks for CheckHost {
    /// The checker holds no transaction: its in-transaction calls are made outside any.
    fn in_transaction(&self) -> bool {
        false
    }

    fn declares(&self, capability: Capability, name: &str) -> bool {
        let st = self.state.lock().unwrap();
        st.caps
            .as_ref()
            .is_some_and(|c| c.declares(capability, name))
    }

    async fn state_event(&self, r: EventRef) -> Reply<StateEvent> {
        match self.events.iter().find(|e| e.id == r.event_id) {
            Some(e) => Ok(e.clone()),
            None => Err(RpcError::new(
                ErrorCode::NotFound,
                format!("no event {}", r.event_id),
            )),
        }
    }

    async fn state_events(&self, q: EventsQuery) -> Reply<StateEvents> {
        let limit = conduit_protocol::page_limit(q.limit)?;
        let events = self
            .events
            .iter()
            .filter(|e| q.after_id.is_none_or(|a| e.id > a))
            .filter(|e| q.source.as_ref().is_none_or(|s| &e.source == s))
            .take(limit as usize)
            .cloned()
            .collect();
        Ok(EventsPage::new(events))
    }

    async fn state_work(&self, r: WorkRef) -> Reply<StateWork> {
        Err(RpcError::new(
            ErrorCode::NotFound,
            format!("no Work {} (the checker keeps no Work)", r.work_id),
        ))
    }

    async fn operation_emit(&self, _p: EmitParams) -> Reply<OperationEmit> {
        let mut st = self.state.lock().unwrap();
        st.next_id += 1;
        let id = st.next_id;
        Ok(EmitResult::new(id, format!("conduit-check-emit-{id}")))
    }

    async fn ingress_push(&self, p: PushParams) -> Reply<IngressPush> {
        let mut st = self.state.lock().unwrap();
        let key = (p.source, p.delivery_id);
        if let Some(&event_id) = st.deliveries.get(&key) {
            return Ok(PushResult::new(event_id, true));
        }
        st.next_id += 1;
        let event_id = st.next_id;
        if st.deliveries.len() < 10_000 {
            st.deliveries.insert(key, event_id);
        }
        Ok(PushResult::new(event_id, false))
    }

    async fn artifact_open(&self, p: ArtifactOpen, peer: &Peer) -> Reply<Open> {
        let label = p.name.clone();
        let opened = self.artifacts.open(self.instance, p, peer)?;
        self.state
            .lock()
            .unwrap()
            .streams
            .insert(opened.stream_id.clone(), (label, opened.bulk_tag.is_some()));
        Ok(opened)
    }

    async fn artifact_chunk(&self, p: ArtifactChunk) -> Reply<Chunk> {
        let id = p.stream_id.clone();
        let res = self.artifacts.chunk(self.instance, p).await;
        if let Err(e) = &res {
            self.refused(&id, e);
        }
        res
    }

    async fn artifact_close(&self, p: ArtifactClose) -> Reply<Close> {
        let id = p.stream_id.clone();
        let sent_digest = p.sha256.is_some();
        let done = match self.artifacts.close(self.instance, p).await {
            Ok(done) => done,
            Err(e) => {
                self.refused(&id, &e);
                return Err(e);
            }
        };
        let _ = std::fs::remove_file(self.artifacts.content_path(&done.sha256));
        let bulk = self.forget(&id).is_some_and(|(_, bulk)| bulk);
        let way = if bulk {
            "on the bulk pipe"
        } else {
            "as chunks"
        };
        let digest = if sent_digest {
            "size and the package's sha256 verified"
        } else {
            "size verified, sha256 computed by the host (the package sent none)"
        };
        self.note_artifact(format!(
            "artifact `{}`: {} bytes {way}, {digest}",
            done.name, done.size
        ));
        Ok(ArtifactStored::new(done.sha256, done.size))
    }

    async fn artifact_abort(&self, p: ArtifactAbort) -> Reply<Abort> {
        self.artifacts.abort(self.instance, &p.stream_id).await?;
        self.forget(&p.stream_id);
        Ok(Empty {})
    }
}

impl Handler for CheckHost {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        *self
            .state
            .lock()
            .unwrap()
            .calls
            .entry(req.method.clone())
            .or_default() += 1;
        let host = self.clone();
        Box::pin(async move { dispatch(&host, &req).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conduit_protocol::methods::ext;
    use serde_json::json;
    use sha2::{Digest, Sha256};

    /// A host and a session to call it from: a request needs a peer, and an artifact stream
    /// lives as long as its session.
    struct Rig {
        host: CheckHost,
        session: conduit_rpc::Session,
        _other_end: tokio::io::DuplexStream,
        _scratch: tempfile::TempDir,
    }

    impl Rig {
        fn new(events: Vec<Event>) -> Rig {
            let scratch = tempfile::tempdir().unwrap();
            let (a, b) = tokio::io::duplex(1024);
            let (r, w) = tokio::io::split(a);
            let session =
                conduit_rpc::Session::new(r, w, conduit_rpc::NoRequests, Default::default());
            Rig {
                host: CheckHost::new(events, scratch.path()),
                session,
                _other_end: b,
                _scratch: scratch,
            }
        }

        async fn call(
            &self,
            method: &str,
            params: serde_json::Value,
        ) -> Result<serde_json::Value, RpcError> {
            let req = Request::new(
                conduit_protocol::RequestId::num(1),
                method,
                Some(serde_json::value::to_raw_value(&params).unwrap()),
                self.session.peer(),
            );
            self.host
                .request(req)
                .await
                .map(|raw| serde_json::from_str(raw.get()).unwrap())
        }
    }

    #[tokio::test]
    async fn reads_find_the_synthetic_events() {
        let rig = Rig::new(synthetic_events("mail", 10_000));
        let e = rig
            .call(ext::STATE_EVENT, json!({"event_id": 102}))
            .await
            .unwrap();
        assert_eq!(e["delivery_id"], "conduit-check-102");
        let err = rig
            .call(ext::STATE_EVENT, json!({"event_id": 7}))
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::NotFound));
        let page = rig
            .call(ext::STATE_EVENTS, json!({"after_id": 101, "limit": 1}))
            .await
            .unwrap();
        assert_eq!(page["events"].as_array().unwrap().len(), 1);
        assert_eq!(page["events"][0]["id"], 102);
        let err = rig
            .call(ext::STATE_EVENTS, json!({"limit": 0}))
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::InvalidParams));
        assert_eq!(rig.host.calls()[ext::STATE_EVENT], 2);
    }

    #[tokio::test]
    async fn writes_need_declared_names_and_pushes_deduplicate() {
        let rig = Rig::new(vec![]);
        let mut caps = Capabilities::default();
        caps.ingress = vec!["mail".into()];
        rig.host.set_capabilities(&caps);
        let push = json!({"source": "mail", "delivery_id": "d-1", "kind": "k", "payload": {}});
        let first = rig.call(ext::INGRESS_PUSH, push.clone()).await.unwrap();
        let again = rig.call(ext::INGRESS_PUSH, push).await.unwrap();
        assert_eq!(first["event_id"], again["event_id"]);
        assert_eq!(
            (first["duplicate"].as_bool(), again["duplicate"].as_bool()),
            (Some(false), Some(true))
        );
        let err = rig
            .call(ext::OPERATION_EMIT, json!({"emission": "x", "payload": {}}))
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::InvalidParams), "{err}");
    }

    #[tokio::test]
    async fn artifacts_are_verified_by_the_daemons_receiver_and_none_is_kept() {
        let rig = Rig::new(vec![]);
        let open = rig
            .call(ext::ARTIFACT_OPEN, json!({"name": "run.log"}))
            .await
            .unwrap();
        let sid = open["stream_id"].as_str().unwrap().to_owned();
        assert_eq!(
            open.get("bulk_tag"),
            None,
            "no pipe was given to this instance"
        );
        rig.call(
            ext::ARTIFACT_CHUNK,
            json!({"stream_id": sid, "seq": 0, "data": "bGluZSBvbmUK"}),
        )
        .await
        .unwrap();
        let err = rig
            .call(
                ext::ARTIFACT_CHUNK,
                // A repeated chunk: refused at once (a gap inside the window waits for the
                // chunks before it, as the daemon does).
                json!({"stream_id": sid, "seq": 0, "data": ""}),
            )
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::ArtifactInvalid), "{err}");
        // The failed chunk ended the stream.
        let err = rig
            .call(
                ext::ARTIFACT_CLOSE,
                json!({"stream_id": sid, "size": 9, "sha256": "x"}),
            )
            .await
            .unwrap_err();
        assert!(err.message.contains("no open artifact stream"), "{err}");

        let sid = rig
            .call(ext::ARTIFACT_OPEN, json!({"name": "a"}))
            .await
            .unwrap()["stream_id"]
            .as_str()
            .unwrap()
            .to_owned();
        rig.call(
            ext::ARTIFACT_CHUNK,
            json!({"stream_id": sid, "seq": 0, "data": "bGluZSBvbmUK"}),
        )
        .await
        .unwrap();
        let digest = hex::encode(Sha256::digest(b"line one\n"));
        let stored = rig
            .call(
                ext::ARTIFACT_CLOSE,
                json!({"stream_id": sid, "size": 9, "sha256": digest}),
            )
            .await
            .unwrap();
        assert_eq!(stored["artifact_id"], format!("sha256:{digest}"));
        assert!(
            !rig.host.artifacts.content_path(&digest).exists(),
            "a verified artifact is deleted"
        );
        let notes = rig.host.artifact_notes();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(
            notes[0].starts_with("artifact `run.log` refused: "),
            "{notes:?}"
        );
        assert_eq!(
            notes[1],
            "artifact `a`: 9 bytes as chunks, size and the package's sha256 verified"
        );
        assert_eq!(rig.host.calls()[ext::ARTIFACT_CHUNK], 3);
        assert_eq!(rig.host.artifact_refusals().len(), 1, "run.log's");

        // Without a digest at close: stored under the one the receiver computed, which the
        // answer carries (docs/protocol.md §8).
        let sid = rig
            .call(ext::ARTIFACT_OPEN, json!({"name": "b"}))
            .await
            .unwrap()["stream_id"]
            .as_str()
            .unwrap()
            .to_owned();
        rig.call(
            ext::ARTIFACT_CHUNK,
            json!({"stream_id": sid, "seq": 0, "data": "bGluZSBvbmUK"}),
        )
        .await
        .unwrap();
        let stored = rig
            .call(ext::ARTIFACT_CLOSE, json!({"stream_id": sid, "size": 9}))
            .await
            .unwrap();
        assert_eq!(stored["sha256"], digest.as_str());
        assert_eq!(stored["artifact_id"], format!("sha256:{digest}"));
        assert_eq!(
            rig.host.artifact_notes()[2],
            "artifact `b`: 9 bytes as chunks, size verified, sha256 computed by the host (the package sent none)"
        );
    }

    #[tokio::test]
    async fn the_streams_one_instance_may_hold_open_are_the_daemons_limit() {
        let rig = Rig::new(vec![]);
        let limit = crate::core::artifacts::MAX_OPEN_STREAMS;
        for i in 0..limit {
            rig.call(ext::ARTIFACT_OPEN, json!({"name": format!("s{i}")}))
                .await
                .unwrap();
        }
        let err = rig
            .call(ext::ARTIFACT_OPEN, json!({"name": "one-more"}))
            .await
            .unwrap_err();
        assert!(err.is(ErrorCode::ArtifactInvalid), "{err}");
        // Another instance's streams are its own.
        let other = rig.host.for_instance("overload");
        let req = Request::new(
            conduit_protocol::RequestId::num(2),
            ext::ARTIFACT_OPEN,
            Some(serde_json::value::to_raw_value(&json!({"name": "x"})).unwrap()),
            rig.session.peer(),
        );
        other.request(req).await.unwrap();
    }
}
