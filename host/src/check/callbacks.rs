//! The host side of callbacks during a check: small, believable answers with no store behind them.
//!
//! A package may call back while the checker's requests are pending (a trigger that reads an
//! event, an ingress source that pushes). The checker answers the way the daemon would for an
//! empty state plus the synthetic events it sent ([`synthetic_events`]): reads find those
//! events, writes are acknowledged without being kept, artifacts are verified (size and
//! sha256) and then dropped. It counts what it was asked, for the report.
//!
//! Invariant: nothing here blocks or grows without bound — at most [`MAX_STREAMS`] artifact
//! streams are open at once, and their content is hashed as it arrives, never kept.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use base64::Engine;
use conduit_protocol::calls::{
    ArtifactAbort, ArtifactChunk, ArtifactClose, ArtifactOpen, ArtifactOpened, ArtifactStored,
    ChunkAck, EmitParams, EmitResult, Empty, Event, EventRef, EventsPage, EventsQuery, PushParams,
    PushResult, WorkRef,
};
use conduit_protocol::methods::ext;
use conduit_protocol::{Capabilities, ErrorCode, RpcError};
use conduit_rpc::{BoxFuture, Handler, HandlerResult, Request, to_raw};
use sha2::{Digest, Sha256};

/// A callback's params, by the protocol's one parser (objects only, docs/protocol.md §3.1), as
/// the daemon reads them.
fn params<T: serde::de::DeserializeOwned>(req: &Request) -> Result<T, RpcError> {
    conduit_protocol::parse_params(
        &req.method,
        req.params.as_deref().map(serde_json::value::RawValue::get),
    )
}

/// Artifact streams a package may keep open at once during a check.
pub(crate) const MAX_STREAMS: usize = 16;

/// The events the checker sends in its in-transaction calls; `state.event` finds them.
pub(crate) fn synthetic_events(source: &str, now_ms: i64) -> Vec<Event> {
    (0..3)
        .map(|i| Event {
            id: 101 + i,
            source: source.to_owned(),
            delivery_id: format!("conduit-check-{}", 101 + i),
            kind: "check.input".into(),
            payload: serde_json::json!({
                "text": format!("conduit check input {}", i + 1),
                "thread": "t-1",
            }),
            accepted_at_ms: now_ms - 1000 + i,
        })
        .collect()
}

#[derive(Debug, Default)]
struct Stream {
    name: String,
    next_seq: u64,
    received: u64,
    hash: Sha256,
}

/// What the checker's stand-in host has seen and handed out: the handshake's capabilities,
/// accepted deliveries, open artifact streams, ids, and the callbacks made.
#[derive(Debug, Default)]
struct Recorded {
    /// Capabilities from the handshake, once known: emissions and ingress sources the package
    /// may name in callbacks.
    caps: Option<Capabilities>,
    deliveries: HashMap<(String, String), i64>,
    streams: HashMap<String, Stream>,
    next_id: i64,
    calls: BTreeMap<String, usize>,
}

/// The callback handler; clones share state.
#[derive(Clone, Debug)]
pub(crate) struct CheckHost {
    events: Arc<Vec<Event>>,
    state: Arc<Mutex<Recorded>>,
}

impl CheckHost {
    pub(crate) fn new(events: Vec<Event>) -> Self {
        CheckHost {
            events: Arc::new(events),
            state: Arc::new(Mutex::new(Recorded {
                next_id: 1000,
                ..Recorded::default()
            })),
        }
    }

    /// Tell the handler what the package declared (after the handshake).
    pub(crate) fn set_capabilities(&self, caps: &Capabilities) {
        self.state.lock().unwrap().caps = Some(caps.clone());
    }

    /// How many callbacks of each method the package made.
    pub(crate) fn calls(&self) -> BTreeMap<String, usize> {
        self.state.lock().unwrap().calls.clone()
    }

    fn serve(&self, req: &Request) -> HandlerResult {
        let mut st = self.state.lock().unwrap();
        *st.calls.entry(req.method.clone()).or_default() += 1;
        match req.method.as_str() {
            ext::STATE_EVENT => {
                let r: EventRef = params(req)?;
                match self.events.iter().find(|e| e.id == r.event_id) {
                    Some(e) => to_raw(e),
                    None => Err(RpcError::new(
                        ErrorCode::NotFound,
                        format!("no event {}", r.event_id),
                    )),
                }
            }
            ext::STATE_EVENTS => {
                let q: EventsQuery = params(req)?;
                let limit = conduit_protocol::page_limit(q.limit)?;
                let events = self
                    .events
                    .iter()
                    .filter(|e| q.after_id.is_none_or(|a| e.id > a))
                    .filter(|e| q.source.as_ref().is_none_or(|s| &e.source == s))
                    .take(limit as usize)
                    .cloned()
                    .collect();
                to_raw(&EventsPage { events })
            }
            ext::STATE_WORK => {
                let r: WorkRef = params(req)?;
                Err(RpcError::new(
                    ErrorCode::NotFound,
                    format!("no Work {} (the checker keeps no Work)", r.work_id),
                ))
            }
            ext::OPERATION_EMIT => {
                let p: EmitParams = params(req)?;
                declared(&st, &req.method, "emission", &p.emission, |c| &c.emissions)?;
                st.next_id += 1;
                let id = st.next_id;
                to_raw(&EmitResult {
                    emission_id: id,
                    commit_id: format!("conduit-check-emit-{id}"),
                })
            }
            ext::INGRESS_PUSH => {
                let p: PushParams = params(req)?;
                declared(&st, &req.method, "ingress source", &p.source, |c| {
                    &c.ingress
                })?;
                conduit_protocol::check_event_fields(&p.source, &p.delivery_id, &p.kind)?;
                conduit_protocol::check_payload_depth(&p.payload.to_string())?;
                let key = (p.source, p.delivery_id);
                if let Some(&event_id) = st.deliveries.get(&key) {
                    return to_raw(&PushResult {
                        event_id,
                        duplicate: true,
                    });
                }
                st.next_id += 1;
                let event_id = st.next_id;
                if st.deliveries.len() < 10_000 {
                    st.deliveries.insert(key, event_id);
                }
                to_raw(&PushResult {
                    event_id,
                    duplicate: false,
                })
            }
            ext::ARTIFACT_OPEN => {
                let p: ArtifactOpen = params(req)?;
                if st.streams.len() >= MAX_STREAMS {
                    return Err(RpcError::new(
                        ErrorCode::ArtifactInvalid,
                        format!("{MAX_STREAMS} artifact streams are already open; close one first"),
                    ));
                }
                st.next_id += 1;
                let stream_id = format!("check-{}", st.next_id);
                st.streams.insert(
                    stream_id.clone(),
                    Stream {
                        name: p.name,
                        ..Stream::default()
                    },
                );
                to_raw(&ArtifactOpened {
                    stream_id,
                    max_chunk_bytes: conduit_protocol::MAX_ARTIFACT_CHUNK_BYTES,
                    window: conduit_protocol::ARTIFACT_WINDOW,
                    bulk_tag: None,
                })
            }
            ext::ARTIFACT_CHUNK => {
                let p: ArtifactChunk = params(req)?;
                let res = chunk(&mut st, &p);
                if res.is_err() {
                    st.streams.remove(&p.stream_id);
                }
                res
            }
            ext::ARTIFACT_CLOSE => {
                let p: ArtifactClose = params(req)?;
                let s = st
                    .streams
                    .remove(&p.stream_id)
                    .ok_or_else(|| unknown_stream(&p.stream_id))?;
                let digest = hex::encode(s.hash.finalize());
                if s.received != p.size || digest != p.sha256 {
                    return Err(RpcError::new(
                        ErrorCode::ArtifactInvalid,
                        format!(
                            "artifact `{}`: received {} bytes with sha256 {digest}, close claimed {} bytes with sha256 {}",
                            s.name, s.received, p.size, p.sha256
                        ),
                    ));
                }
                to_raw(&ArtifactStored {
                    artifact_id: format!("sha256:{digest}"),
                    size: s.received,
                })
            }
            ext::ARTIFACT_ABORT => {
                let p: ArtifactAbort = params(req)?;
                st.streams
                    .remove(&p.stream_id)
                    .ok_or_else(|| unknown_stream(&p.stream_id))?;
                to_raw(&Empty {})
            }
            other => Err(RpcError::method_not_found(other)),
        }
    }
}

fn chunk(st: &mut Recorded, p: &ArtifactChunk) -> HandlerResult {
    let s = st
        .streams
        .get_mut(&p.stream_id)
        .ok_or_else(|| unknown_stream(&p.stream_id))?;
    if p.seq != s.next_seq {
        return Err(RpcError::new(
            ErrorCode::ArtifactInvalid,
            format!(
                "chunk {} arrived where chunk {} was expected",
                p.seq, s.next_seq
            ),
        ));
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(&p.data)
        .map_err(|e| {
            RpcError::new(
                ErrorCode::ArtifactInvalid,
                format!("chunk {} is not base64: {e}", p.seq),
            )
        })?;
    if data.len() > conduit_protocol::MAX_ARTIFACT_CHUNK_BYTES {
        return Err(RpcError::new(
            ErrorCode::ArtifactInvalid,
            format!(
                "chunk {} is {} bytes, over the {}-byte chunk limit",
                p.seq,
                data.len(),
                conduit_protocol::MAX_ARTIFACT_CHUNK_BYTES
            ),
        ));
    }
    s.hash.update(&data);
    s.received += data.len() as u64;
    s.next_seq += 1;
    to_raw(&ChunkAck {
        received: s.received,
    })
}

fn unknown_stream(id: &str) -> RpcError {
    RpcError::new(
        ErrorCode::ArtifactInvalid,
        format!("no open artifact stream `{id}`"),
    )
}

fn declared(
    st: &Recorded,
    method: &str,
    what: &str,
    name: &str,
    list: impl Fn(&Capabilities) -> &Vec<String>,
) -> Result<(), RpcError> {
    let ok = st
        .caps
        .as_ref()
        .is_some_and(|c| list(c).iter().any(|n| n == name));
    if ok {
        Ok(())
    } else {
        Err(RpcError::invalid_params(
            method,
            format!("{what} `{name}` was not declared in the handshake's capabilities"),
        ))
    }
}

impl Handler for CheckHost {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        let res = self.serve(&req);
        Box::pin(async move { res })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(
        host: &CheckHost,
        method: &str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, RpcError> {
        // A request needs a peer; a session over an in-memory pipe provides one.
        let (a, _b) = tokio::io::duplex(1024);
        let (r, w) = tokio::io::split(a);
        let session = conduit_rpc::Session::new(r, w, conduit_rpc::NoRequests, Default::default());
        let req = Request {
            id: conduit_protocol::RequestId::num(1),
            method: method.into(),
            params: Some(serde_json::value::to_raw_value(&params).unwrap()),
            cancel: Default::default(),
            peer: session.peer(),
        };
        host.serve(&req)
            .map(|raw| serde_json::from_str(raw.get()).unwrap())
    }

    #[tokio::test]
    async fn reads_find_the_synthetic_events() {
        let host = CheckHost::new(synthetic_events("mail", 10_000));
        let e = call(&host, ext::STATE_EVENT, json!({"event_id": 102})).unwrap();
        assert_eq!(e["delivery_id"], "conduit-check-102");
        let err = call(&host, ext::STATE_EVENT, json!({"event_id": 7})).unwrap_err();
        assert!(err.is(ErrorCode::NotFound));
        let page = call(
            &host,
            ext::STATE_EVENTS,
            json!({"after_id": 101, "limit": 1}),
        )
        .unwrap();
        assert_eq!(page["events"].as_array().unwrap().len(), 1);
        assert_eq!(page["events"][0]["id"], 102);
        let err = call(&host, ext::STATE_EVENTS, json!({"limit": 0})).unwrap_err();
        assert!(err.is(ErrorCode::InvalidParams));
        assert_eq!(host.calls()[ext::STATE_EVENT], 2);
    }

    #[tokio::test]
    async fn writes_need_declared_names_and_pushes_deduplicate() {
        let host = CheckHost::new(vec![]);
        host.set_capabilities(&Capabilities {
            ingress: vec!["mail".into()],
            ..Capabilities::default()
        });
        let push = json!({"source": "mail", "delivery_id": "d-1", "kind": "k", "payload": {}});
        let first = call(&host, ext::INGRESS_PUSH, push.clone()).unwrap();
        let again = call(&host, ext::INGRESS_PUSH, push).unwrap();
        assert_eq!(first["event_id"], again["event_id"]);
        assert_eq!(
            (first["duplicate"].as_bool(), again["duplicate"].as_bool()),
            (Some(false), Some(true))
        );
        let err = call(
            &host,
            ext::OPERATION_EMIT,
            json!({"emission": "x", "payload": {}}),
        )
        .unwrap_err();
        assert!(err.is(ErrorCode::InvalidParams), "{err}");
    }

    #[tokio::test]
    async fn artifacts_are_verified() {
        let host = CheckHost::new(vec![]);
        let open = call(&host, ext::ARTIFACT_OPEN, json!({"name": "run.log"})).unwrap();
        let sid = open["stream_id"].as_str().unwrap().to_owned();
        call(
            &host,
            ext::ARTIFACT_CHUNK,
            json!({"stream_id": sid, "seq": 0, "data": "bGluZSBvbmUK"}),
        )
        .unwrap();
        let err = call(
            &host,
            ext::ARTIFACT_CHUNK,
            json!({"stream_id": sid, "seq": 5, "data": ""}),
        )
        .unwrap_err();
        assert!(err.is(ErrorCode::ArtifactInvalid));
        // The failed chunk ended the stream.
        let err = call(
            &host,
            ext::ARTIFACT_CLOSE,
            json!({"stream_id": sid, "size": 9, "sha256": "x"}),
        )
        .unwrap_err();
        assert!(err.message.contains("no open artifact stream"), "{err}");

        let sid = call(&host, ext::ARTIFACT_OPEN, json!({"name": "a"})).unwrap()["stream_id"]
            .as_str()
            .unwrap()
            .to_owned();
        call(
            &host,
            ext::ARTIFACT_CHUNK,
            json!({"stream_id": sid, "seq": 0, "data": "bGluZSBvbmUK"}),
        )
        .unwrap();
        let digest = hex::encode(Sha256::digest(b"line one\n"));
        let stored = call(
            &host,
            ext::ARTIFACT_CLOSE,
            json!({"stream_id": sid, "size": 9, "sha256": digest}),
        )
        .unwrap();
        assert_eq!(stored["artifact_id"], format!("sha256:{digest}"));
    }
}
