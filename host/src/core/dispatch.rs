//! The host's side of callbacks, once: [`HostCallbacks`], what a host answers for each callback
//! of the method table, and [`dispatch`], the one dispatcher in front of it.
//!
//! `dispatch` reads a request through the table (`conduit_protocol::methods::Callback`: the
//! method, its params by the protocol's one reader, a payload measured before it is parsed),
//! applies the rules every host applies — a writing callback refused with `reentrant_write`
//! during an in-transaction call to the same extension (§7.6), a name the extension did not
//! declare refused with `invalid_params` (§7.4, §7.5), an event's fields (§7.5) — and calls the
//! one method of the trait that serves the callback. The daemon (`callbacks.rs`, over the store)
//! and `conduit ext check` (`check/callbacks.rs`, a stand-in with no store) both implement the
//! trait, so their refusals and the texts of them cannot differ, and a test can fake a host by
//! implementing it.
//!
//! Invariant: this is the one place in the host where a callback method is matched. A callback
//! added to the table fails to compile here until it has an arm, and in every implementor until
//! it is served (the trait's methods have no defaults).

use std::future::Future;

use conduit_protocol::calls::{
    ArtifactAbort, ArtifactChunk, ArtifactClose, ArtifactOpen, EmitParams, EventRef, EventsQuery,
    PushParams, WorkRef,
};
use conduit_protocol::methods::{self, Callback, Direction, Method};
use conduit_protocol::{Capability, ErrorCode, RpcError};
use conduit_rpc::{HandlerResult, Peer, Request, to_raw};
use serde_json::value::RawValue;

/// What a host answers a callback `M` with.
pub type Reply<M> = Result<<M as Method>::Result, RpcError>;

/// What a host must answer for each callback of the method table, with the facts [`dispatch`]
/// needs to apply the protocol's rules first. One method per callback, typed by the table's row
/// (its params in, its result out); none has a default.
pub trait HostCallbacks: Sync {
    /// Whether an in-transaction call to this extension is pending now (its writing callbacks
    /// are then refused).
    fn in_transaction(&self) -> bool;

    /// Whether the extension declared `name` in the list `capability` in its handshake.
    fn declares(&self, capability: Capability, name: &str) -> bool;

    /// `state.event`: the event, or `not_found`.
    fn state_event(&self, p: EventRef) -> impl Future<Output = Reply<methods::StateEvent>> + Send;

    /// `state.events`: a page of events (the page size by `conduit_protocol::page_limit`).
    fn state_events(
        &self,
        p: EventsQuery,
    ) -> impl Future<Output = Reply<methods::StateEvents>> + Send;

    /// `state.work`: the Work, or `not_found`.
    fn state_work(&self, p: WorkRef) -> impl Future<Output = Reply<methods::StateWork>> + Send;

    /// `operation.emit`, for a declared emission with a payload within the depth limit.
    fn operation_emit(
        &self,
        p: EmitParams,
    ) -> impl Future<Output = Reply<methods::OperationEmit>> + Send;

    /// `ingress.push`, for a declared source, with fields and payload within their limits.
    fn ingress_push(
        &self,
        p: PushParams,
    ) -> impl Future<Output = Reply<methods::IngressPush>> + Send;

    /// `artifact.open`; `peer` is the session the stream belongs to (its bulk pipe).
    fn artifact_open(
        &self,
        p: ArtifactOpen,
        peer: &Peer,
    ) -> impl Future<Output = Reply<methods::ArtifactOpen>> + Send;

    /// `artifact.chunk`.
    fn artifact_chunk(
        &self,
        p: ArtifactChunk,
    ) -> impl Future<Output = Reply<methods::ArtifactChunk>> + Send;

    /// `artifact.close`: size and digest checked, the artifact stored.
    fn artifact_close(
        &self,
        p: ArtifactClose,
    ) -> impl Future<Output = Reply<methods::ArtifactClose>> + Send;

    /// `artifact.abort`.
    fn artifact_abort(
        &self,
        p: ArtifactAbort,
    ) -> impl Future<Output = Reply<methods::ArtifactAbort>> + Send;
}

/// Answer the callback `req` from `host`: the method found in the table (`method_not_found`
/// otherwise), a write refused during an in-transaction call, the params read, the declared
/// name checked, then the one method of [`HostCallbacks`] that serves it.
pub async fn dispatch<H: HostCallbacks>(host: &H, req: &Request) -> HandlerResult {
    let method = req.method.as_str();
    let info = methods::find(method)
        .filter(|m| m.direction == Direction::ExtensionToHost)
        .ok_or_else(|| RpcError::method_not_found(method))?;
    // Before the params are read: nothing about them can make a refused write go through.
    if info.writes && host.in_transaction() {
        return Err(RpcError::new(
            ErrorCode::ReentrantWrite,
            format!(
                "`{method}` needs the host's writer, which is held for an in-transaction call to this extension; \
                 make writes outside in-transaction handlers"
            ),
        ));
    }
    let params = req.params.as_deref().map(RawValue::get);
    let call =
        Callback::parse(method, params).ok_or_else(|| RpcError::method_not_found(method))??;
    if let Some((capability, name)) = call.declared_name()
        && !host.declares(capability, name)
    {
        return Err(capability.not_declared(method, name));
    }
    match call {
        Callback::StateEvent(p) => to_raw(&host.state_event(p).await?),
        Callback::StateEvents(p) => to_raw(&host.state_events(p).await?),
        Callback::StateWork(p) => to_raw(&host.state_work(p).await?),
        Callback::OperationEmit(p) => to_raw(&host.operation_emit(p).await?),
        Callback::IngressPush(p) => {
            conduit_protocol::check_event_fields(&p.source, &p.delivery_id, &p.kind)?;
            to_raw(&host.ingress_push(p).await?)
        }
        Callback::ArtifactOpen(p) => to_raw(&host.artifact_open(p, &req.peer).await?),
        Callback::ArtifactChunk(p) => to_raw(&host.artifact_chunk(p).await?),
        Callback::ArtifactClose(p) => to_raw(&host.artifact_close(p).await?),
        Callback::ArtifactAbort(p) => to_raw(&host.artifact_abort(p).await?),
    }
}
