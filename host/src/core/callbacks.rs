//! The host's side of extension callbacks: reading state, planning emissions, pushing events,
//! streaming artifacts.
//!
//! One [`CallbackHandler`] serves one extension for the daemon's whole life (across its
//! restarts): its span, then the one dispatcher (`dispatch.rs`), which applies the protocol's
//! rules and calls this file's [`HostCallbacks`] implementation. Reads go to the store's reader
//! connections; writes go through the writer (refused by the dispatcher with `reentrant_write`
//! while an in-transaction call to the same extension is pending — that call holds the writer,
//! so waiting for it could never end). A push is answered only after its transaction commits.

use std::sync::{Arc, Weak};

use conduit_protocol::calls::{
    ArtifactAbort, ArtifactChunk, ArtifactClose, ArtifactOpen, ArtifactStored, EmitParams,
    EmitResult, Empty, EventRef, EventsPage, EventsQuery, PushParams, PushResult, WorkRef,
};
use conduit_protocol::methods::{
    ArtifactAbort as Abort, ArtifactChunk as Chunk, ArtifactClose as Close, ArtifactOpen as Open,
    IngressPush, OperationEmit, StateEvent, StateEvents, StateWork,
};
use conduit_protocol::{Capability, CheckedPayload, ErrorCode, RpcError};
use conduit_rpc::{BoxFuture, Handler, HandlerResult, Peer, Request};
use conduit_supervisor::now_ms;

use super::dispatch::{HostCallbacks, Reply, dispatch};
use super::fault::store_fault;
use super::group_commit::Incoming;
use super::shared::Core;

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
            dispatch(&Daemon { core, ext }, &req).await
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

/// The daemon's answers to one extension's callbacks: reads from the store's readers, writes
/// through its writer, artifacts through the core's receiver.
struct Daemon {
    core: Arc<Core>,
    ext: String,
}

impl HostCallbacks for Daemon {
    fn in_transaction(&self) -> bool {
        self.core.in_transaction(&self.ext)
    }

    fn declares(&self, capability: Capability, name: &str) -> bool {
        self.core.declares(&self.ext, capability, name)
    }

    async fn state_event(&self, p: EventRef) -> Reply<StateEvent> {
        let rec = self
            .core
            .read(move |r| r.event(p.event_id))
            .await
            .map_err(store_fault)?;
        match rec {
            Some(rec) => Ok(rec.event),
            None => Err(RpcError::new(
                ErrorCode::NotFound,
                format!("no event {}", p.event_id),
            )),
        }
    }

    async fn state_events(&self, q: EventsQuery) -> Reply<StateEvents> {
        let limit = conduit_protocol::page_limit(q.limit)?;
        let recs = self
            .core
            .read(move |r| r.list_events(q.after_id, q.source.as_deref(), limit))
            .await
            .map_err(store_fault)?;
        Ok(EventsPage::new(recs.into_iter().map(|r| r.event).collect()))
    }

    async fn state_work(&self, p: WorkRef) -> Reply<StateWork> {
        let w = self
            .core
            .read(move |r| r.work(p.work_id))
            .await
            .map_err(store_fault)?;
        match w {
            Some(w) => Ok(conduit_protocol::calls::Work::from(w)),
            None => Err(RpcError::new(
                ErrorCode::NotFound,
                format!("no work {}", p.work_id),
            )),
        }
    }

    async fn operation_emit(&self, p: EmitParams) -> Reply<OperationEmit> {
        let planned = self
            .core
            .plan_emission(self.ext.clone(), p.emission, p.work_id, p.payload)
            .await
            .map_err(store_fault)?;
        Ok(EmitResult::from(planned))
    }

    async fn ingress_push(&self, p: PushParams) -> Reply<IngressPush> {
        let event = Incoming {
            payload: CheckedPayload::from_value(&p.payload)?,
            delivery_id: p.delivery_id,
            kind: p.kind,
        };
        let accepted = self
            .core
            .accept_event(p.source, event)
            .await
            .map_err(store_fault)?;
        Ok(PushResult::from(accepted))
    }

    async fn artifact_open(&self, p: ArtifactOpen, peer: &Peer) -> Reply<Open> {
        self.core.artifacts_arc().open(&self.ext, p, peer)
    }

    async fn artifact_chunk(&self, p: ArtifactChunk) -> Reply<Chunk> {
        self.core.artifacts.chunk(&self.ext, p).await
    }

    async fn artifact_close(&self, p: ArtifactClose) -> Reply<Close> {
        let done = self.core.artifacts.close(&self.ext, p).await?;
        let (sha, size) = (done.sha256.clone(), done.size);
        // The creator is the extension that stored it first. The content is checked inside
        // the recording transaction: the retention sweep sets files aside only inside its own.
        let path = self.core.artifacts.content_path(&sha);
        self.core
            .write(move |tx| {
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
        Ok(ArtifactStored::new(sha, size))
    }

    async fn artifact_abort(&self, p: ArtifactAbort) -> Reply<Abort> {
        self.core.artifacts.abort(&self.ext, &p.stream_id).await?;
        Ok(Empty {})
    }
}

/// The rules a polled event follows: those of `conduit_protocol::check_event_fields`, and the
/// payload depth limit (the poll's answer was parsed already, so the payload is serialised
/// once, checked, and stored as that text).
pub fn check_polled_event(
    source: &str,
    e: conduit_protocol::calls::NewEvent,
) -> Result<Incoming, RpcError> {
    conduit_protocol::check_event_fields(source, &e.delivery_id, &e.kind)?;
    Ok(Incoming {
        payload: CheckedPayload::from_value(&e.payload)?,
        delivery_id: e.delivery_id,
        kind: e.kind,
    })
}
