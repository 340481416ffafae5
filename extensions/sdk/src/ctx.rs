//! What a handler gets besides its params: the request's cancellation, and the host to call back.
//!
//! [`Host`] is a typed face over the session's `Peer` for the callbacks of `docs/protocol.md` §7.
//! Callbacks may be made while the handler's own request is pending (the session keeps reading
//! and serving meanwhile), and from tasks the handler spawns after it has answered — which is
//! where writes belong when the handler is an in-transaction call, since the host refuses them
//! with `reentrant_write` during one.
//!
//! Invariant: a callback whose caller goes away (the handler was cancelled, the future dropped)
//! is cancelled on the host with `$/cancel`; nothing here waits on the host without either a
//! caller still interested or a deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use conduit_protocol::calls::{
    ArtifactOpen, ArtifactStored, EmitParams, EmitResult, Event, EventRef, EventsPage, EventsQuery,
    PushParams, PushResult, Work, WorkRef,
};
use conduit_protocol::handshake::InitializeParams;
use conduit_protocol::methods::{
    IngressPush, Method, OperationEmit, StateEvent, StateEvents, StateWork,
};
use conduit_rpc::Peer;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::artifact::ArtifactWriter;
use crate::error::HostError;

/// The context of one request: its cancellation, the host's handshake, and the host handle.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub(crate) host: Host,
    pub(crate) cancel: CancellationToken,
    pub(crate) shutdown: Arc<CancellationToken>,
    /// When the host stops waiting for the answer, from the request's `_meta.remaining_ms`
    /// (docs/protocol.md §11), measured from when the request was read.
    pub(crate) deadline: Option<Instant>,
}

impl Ctx {
    /// When the host will stop waiting for this request's answer (and apply its fallback, for
    /// an in-transaction call), if the request said so (`_meta.remaining_ms`, docs/protocol.md
    /// §11; conduit sends it on every request but `initialize` and `shutdown`). A handler that
    /// cannot finish in time can give up early: its answer would be thrown away.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The time left until [`Ctx::deadline`] (zero once it has passed), if the request said.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// The host, for callbacks.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Cancelled when the host cancels this request (`$/cancel`), when the session ends, or
    /// when a `shutdown` gives up waiting for it. The SDK answers `cancelled` and drops the
    /// handler's future by itself; watch this token in tasks the handler spawned, or to stop a
    /// long computation between steps.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Whether this request has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Cancelled when the host asks the extension to shut down. Running requests may still
    /// finish (within the shutdown grace); a handler that waits for something open-ended
    /// (a long poll) should stop waiting when this fires.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// What the host sent in `initialize`: its name and version, limits and deadlines.
    pub fn init(&self) -> &InitializeParams {
        &self.host.init
    }
}

/// The host, as seen from a handler: typed callbacks and artifact streams. Cheap to clone; a
/// clone may be moved into a spawned task to call the host after the handler has answered.
#[derive(Clone, Debug)]
pub struct Host {
    pub(crate) peer: Peer,
    pub(crate) init: Arc<InitializeParams>,
    /// The bulk pipe for artifact bytes, when the host offered one.
    pub(crate) bulk: Option<Arc<crate::bulk::BulkPipe>>,
    pub(crate) deadline: Option<Duration>,
    /// Hash every artifact's bytes here and send the digest at close (end to end).
    pub(crate) verify_artifacts: bool,
}

impl Host {
    /// The same host, with a deadline on every call made through the copy. Past it the call
    /// fails with `deadline_exceeded` and the host is sent `$/cancel`. Without one, a call
    /// waits as long as its caller does (the host sets no deadline on callbacks).
    pub fn with_deadline(&self, deadline: Duration) -> Host {
        Host {
            deadline: Some(deadline),
            ..self.clone()
        }
    }

    /// The same host, sending artifacts as `artifact.chunk` calls even where the host offers
    /// the bulk pipe (docs/protocol.md §8.1): for comparing the two, or for a host that should
    /// see every byte in its JSON log.
    pub fn with_json_chunks(&self) -> Host {
        Host {
            bulk: None,
            ..self.clone()
        }
    }

    /// The same host, verifying every artifact end to end: each stream's writer hashes the
    /// bytes as they are written and sends that SHA-256 at close, and the host refuses the
    /// stream (`artifact_invalid`, keeping nothing) unless the bytes it received have it. Without
    /// this the host alone hashes what it received and answers the digest (docs/protocol.md
    /// §8), which saves this process one SHA-256 pass over every byte (about 0.6 ms of CPU per
    /// MiB even with the CPU's SHA instructions).
    pub fn with_verified_artifacts(&self) -> Host {
        Host {
            verify_artifacts: true,
            ..self.clone()
        }
    }

    /// `state.event`: one event by id (`not_found` if there is none).
    pub async fn event(&self, event_id: i64) -> Result<Event, HostError> {
        self.call_method::<StateEvent>(&EventRef::new(event_id))
            .await
    }

    /// `state.events`: a page of events, oldest first.
    pub async fn events(&self, query: EventsQuery) -> Result<EventsPage, HostError> {
        self.call_method::<StateEvents>(&query).await
    }

    /// `state.work`: one Work by id (`not_found` if there is none).
    pub async fn work(&self, work_id: i64) -> Result<Work, HostError> {
        self.call_method::<StateWork>(&WorkRef::new(work_id)).await
    }

    /// `operation.emit`: plan an emission, committed later through `emit.commit`. Refused with
    /// `reentrant_write` during an in-transaction call to this extension.
    pub async fn emit(&self, params: EmitParams) -> Result<EmitResult, HostError> {
        self.call_method::<OperationEmit>(&params).await
    }

    /// `ingress.push`: push one event; answered once it is committed (a repeated delivery id is
    /// acknowledged with `duplicate: true`). Refused with `reentrant_write` during an
    /// in-transaction call to this extension.
    pub async fn push(&self, params: PushParams) -> Result<PushResult, HostError> {
        self.call_method::<IngressPush>(&params).await
    }

    /// `artifact.open`: start an artifact stream. Write to the returned writer, then
    /// [`finish`](ArtifactWriter::finish) it; dropped unfinished, it aborts the stream. The
    /// answer to `finish` holds the SHA-256 the host computed of what it stored.
    pub async fn artifact(&self, open: ArtifactOpen) -> Result<ArtifactWriter, HostError> {
        ArtifactWriter::open(
            &self.peer,
            self.bulk.clone(),
            self.deadline,
            self.verify_artifacts,
            open,
        )
        .await
    }

    /// Store `bytes` as one artifact: open (with `size` filled in), chunks, close; the answer
    /// holds the SHA-256 the host computed.
    pub async fn store_artifact(
        &self,
        mut open: ArtifactOpen,
        bytes: &[u8],
    ) -> Result<ArtifactStored, HostError> {
        open.size.get_or_insert(bytes.len() as u64);
        let mut w = self.artifact(open).await?;
        w.write(bytes).await?;
        w.finish().await
    }

    /// A callback of the method table, typed by its row.
    async fn call_method<M: Method>(&self, params: &M::Params) -> Result<M::Result, HostError> {
        Ok(self.peer.call(M::NAME, params, self.deadline).await?)
    }

    /// Any callback by name, for methods newer than this SDK.
    pub async fn call<P, R>(&self, method: &str, params: &P) -> Result<R, HostError>
    where
        P: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        Ok(self.peer.call(method, params, self.deadline).await?)
    }
}
