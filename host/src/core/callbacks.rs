//! The host's side of extension callbacks: reading state, planning emissions, pushing events,
//! streaming artifacts.
//!
//! One [`CallbackHandler`] serves one extension for the daemon's whole life (across its
//! restarts). Reads go to the store's reader connections; writes go through the writer and
//! are refused with `reentrant_write` while an in-transaction call to the same extension is
//! pending — that call holds the writer, so waiting for it could never end. A push is answered
//! only after its transaction commits.

use std::sync::{Arc, Weak};

use conduit_protocol::calls::{
    ArtifactAbort, ArtifactChunk, ArtifactClose, ArtifactOpen, ArtifactStored, EmitResult, Empty,
    EventRef, EventsPage, EventsQuery, NewEvent, PushResult, WorkRef,
};
use conduit_protocol::methods::ext;
use conduit_protocol::{ErrorCode, RpcError};
use conduit_rpc::{BoxFuture, Handler, HandlerResult, Request, to_raw};
use conduit_supervisor::now_ms;
use serde_json::value::RawValue;

use super::fault::store_fault;
use super::ops::Declared;
use super::shared::Core;

/// A callback's params: an object (absent reads as `{}`), refused with `invalid_params`
/// otherwise (docs/protocol.md §3.1), by the protocol's one params parser.
fn params<T: serde::de::DeserializeOwned>(req: &Request) -> Result<T, RpcError> {
    conduit_protocol::parse_params(&req.method, req.params.as_deref().map(RawValue::get))
}

/// Serves one extension's callbacks.
#[derive(Debug)]
pub struct CallbackHandler {
    core: Weak<Core>,
    ext: String,
}

impl CallbackHandler {
    pub fn new(core: Weak<Core>, ext: &str) -> Self {
        CallbackHandler {
            core,
            ext: ext.to_owned(),
        }
    }
}

impl Handler for CallbackHandler {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        let core = self.core.upgrade();
        let ext = self.ext.clone();
        // A callback made while an in-transaction call to this extension is pending; looked up
        // only when the span can be recorded (a static level check).
        let in_transaction = tracing::level_enabled!(tracing::Level::DEBUG)
            && core.as_ref().is_some_and(|c| c.in_transaction(&ext));
        // The span of a callback (extension to host); `debug`, free unless exported.
        let span = tracing::debug_span!(
            "extension.callback",
            extension = %self.ext,
            method = %req.method,
            request_id = %req.id,
            direction = "extension_to_host",
            in_transaction,
            duration_us = tracing::field::Empty,
            outcome = tracing::field::Empty,
            error_code = tracing::field::Empty,
        );
        let t = std::time::Instant::now();
        let inner = async move {
            let Some(core) = core else {
                return Err(RpcError::new(
                    ErrorCode::ShuttingDown,
                    "the daemon is shutting down",
                ));
            };
            if ext::WRITES.contains(&req.method.as_str()) && core.in_transaction(&ext) {
                return Err(RpcError::new(
                    ErrorCode::ReentrantWrite,
                    format!(
                        "`{}` needs the host's writer, which is held for an in-transaction call to this extension; \
                         make writes outside in-transaction handlers",
                        req.method
                    ),
                ));
            }
            serve(core, &ext, req).await
        };
        Box::pin(tracing::Instrument::instrument(
            async move {
                let res = inner.await;
                let span = tracing::Span::current();
                if !span.is_disabled() {
                    span.record("duration_us", t.elapsed().as_micros() as u64);
                    match &res {
                        Ok(_) => span.record("outcome", "ok"),
                        Err(e) => span.record("outcome", "error").record("error_code", e.code),
                    };
                }
                res
            },
            span,
        ))
    }
}

async fn serve(core: Arc<Core>, ext: &str, req: Request) -> HandlerResult {
    match req.method.as_str() {
        ext::STATE_EVENT => {
            let p: EventRef = params(&req)?;
            let rec = core
                .read(move |r| r.event(p.event_id))
                .await
                .map_err(store_fault)?;
            match rec {
                Some(rec) => to_raw(&rec.event),
                None => Err(RpcError::new(
                    ErrorCode::NotFound,
                    format!("no event {}", p.event_id),
                )),
            }
        }
        ext::STATE_EVENTS => {
            let q: EventsQuery = params(&req)?;
            let limit = conduit_protocol::page_limit(q.limit)?;
            let recs = core
                .read(move |r| r.list_events(q.after_id, q.source.as_deref(), limit))
                .await
                .map_err(store_fault)?;
            to_raw(&EventsPage {
                events: recs.into_iter().map(|r| r.event).collect(),
            })
        }
        ext::STATE_WORK => {
            let p: WorkRef = params(&req)?;
            let w = core
                .read(move |r| r.work(p.work_id))
                .await
                .map_err(store_fault)?;
            match w {
                Some(w) => to_raw(&conduit_protocol::calls::Work::from(w)),
                None => Err(RpcError::new(
                    ErrorCode::NotFound,
                    format!("no work {}", p.work_id),
                )),
            }
        }
        ext::OPERATION_EMIT => {
            let raw: RawEmit = params(&req)?;
            let payload = payload(&raw.payload)?;
            declared(&core, ext, Declared::Emission, &raw.emission)?;
            let planned = core
                .plan_emission(ext.to_owned(), raw.emission, raw.work_id, payload)
                .await
                .map_err(store_fault)?;
            to_raw(&EmitResult::from(planned))
        }
        ext::INGRESS_PUSH => {
            let raw: RawPush = params(&req)?;
            let payload = payload(&raw.payload)?;
            declared(&core, ext, Declared::Ingress, &raw.source)?;
            conduit_protocol::check_event_fields(&raw.source, &raw.delivery_id, &raw.kind)?;
            let event = NewEvent {
                delivery_id: raw.delivery_id,
                kind: raw.kind,
                payload,
            };
            let accepted = core
                .accept_event(raw.source, event)
                .await
                .map_err(store_fault)?;
            to_raw(&PushResult::from(accepted))
        }
        ext::ARTIFACT_OPEN => {
            let p: ArtifactOpen = params(&req)?;
            let opened = core.artifacts_arc().open(ext, p, &req.peer)?;
            to_raw(&opened)
        }
        ext::ARTIFACT_CHUNK => {
            let p: ArtifactChunk = params(&req)?;
            to_raw(&core.artifacts.chunk(ext, p).await?)
        }
        ext::ARTIFACT_CLOSE => {
            let p: ArtifactClose = params(&req)?;
            let done = core.artifacts.close(ext, p).await?;
            let (sha, size) = (done.sha256.clone(), done.size);
            // The creator is the extension that stored it first. The content is checked inside
            // the recording transaction: the retention sweep deletes files only inside its own.
            let path = core.artifacts.content_path(&sha);
            core.write(move |tx| {
                tx.record_stored_artifact(
                    &done.sha256,
                    done.size,
                    &done.name,
                    done.media_type.as_deref(),
                    &done.ext,
                    now_ms(),
                    || path.exists(),
                )
            })
            .await
            .map_err(|e| match e {
                e @ conduit_store::StoreError::ContentMissing { .. } => {
                    RpcError::new(ErrorCode::ArtifactInvalid, e.to_string())
                }
                e => store_fault(e),
            })?;
            to_raw(&ArtifactStored::new(sha, size))
        }
        ext::ARTIFACT_ABORT => {
            let p: ArtifactAbort = params(&req)?;
            core.artifacts.abort(ext, &p.stream_id).await?;
            to_raw(&Empty {})
        }
        other => Err(RpcError::method_not_found(other)),
    }
}

/// `ingress.push` params (`PushParams`) with the payload left raw, so its depth is checked
/// before it is parsed.
#[derive(serde::Deserialize)]
struct RawPush {
    source: String,
    delivery_id: String,
    kind: String,
    payload: Box<RawValue>,
}

/// `operation.emit` params (`EmitParams`) with the payload left raw.
#[derive(serde::Deserialize)]
struct RawEmit {
    emission: String,
    #[serde(default)]
    work_id: Option<i64>,
    payload: Box<RawValue>,
}

/// Check a payload against `MAX_PAYLOAD_DEPTH` (`invalid_params` naming the limit), then parse it.
fn payload(raw: &RawValue) -> Result<serde_json::Value, RpcError> {
    conduit_protocol::check_payload_depth(raw.get())?;
    serde_json::from_str(raw.get()).map_err(|e| {
        RpcError::new(
            ErrorCode::InvalidParams,
            format!("the payload does not parse: {e}"),
        )
    })
}

/// Refuse a name the extension did not declare in its handshake.
fn declared(core: &Core, ext: &str, kind: Declared, name: &str) -> Result<(), RpcError> {
    if core.declares(ext, kind, name) {
        Ok(())
    } else {
        let what = kind.field();
        Err(RpcError::new(
            ErrorCode::InvalidParams,
            format!(
                "`{name}` is not among the {what} this extension declared in its handshake; declare it in capabilities.{what}"
            ),
        ))
    }
}

/// The rules a polled event follows: those of `conduit_protocol::check_event_fields`, and the payload depth
/// limit (the poll's result was parsed already, so the payload is measured as re-serialised).
pub fn check_polled_event(
    source: &str,
    e: &conduit_protocol::calls::NewEvent,
) -> Result<(), RpcError> {
    conduit_protocol::check_event_fields(source, &e.delivery_id, &e.kind)?;
    Ok(conduit_protocol::check_payload_depth(
        &e.payload.to_string(),
    )?)
}
