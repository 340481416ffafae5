//! The management API: JSON over HTTP/1.1 on a Unix socket in the state directory.
//!
//! ```text
//! GET  /v1/health                         daemon health and counts (with span-export drops)
//! GET  /v1/metrics                        Prometheus text format (docs/operations.md, "Metrics")
//! GET  /v1/extensions                     every installed package with its status
//! GET  /v1/extensions/{name}              one, with per-method call counts and latencies
//! POST /v1/extensions/{name}/restart      restart it now
//! GET  /v1/extensions/{name}/logs?lines=N the last N lines of its stderr log (default 100)
//! POST /v1/extensions/{name}/call         {"method", "params", "timeout_ms"}: call it (diagnostics)
//! GET  /v1/extensions/{name}/calls?after=&limit=
//!                                         its last calls (method, latency, outcome) after a
//!                                         sequence number; kept for dev installs only
//! POST /v1/reload                         apply the package registry (the CLI sends this)
//! POST /v1/events                         push an event {source, delivery_id, kind, payload}
//!                                         (body ≤ 1 MiB, payload ≤ 64 levels deep); answered
//!                                         after it commits
//! GET  /v1/events?after=&limit=&source=   events, oldest first, pages of 1–200 (default 50)
//! GET  /v1/work?after=&limit=             Work, oldest first, same paging; /v1/work/{id}
//! POST /v1/timers                         {recurrence, spec, extension?, first_at_ms?}
//! POST /v1/waits                          {filter, subject, extension?, work_id?}
//! POST /v1/emissions                      {emission, payload, extension?, work_id?}
//! GET  /v1/timers/{id}, /v1/waits/{id}, /v1/emissions/{id}
//! GET  /v1/timers?after=&limit=           timers, waits, emissions (without records): oldest
//!      /v1/waits, /v1/emissions           first, in any state, the same paging as events
//! GET  /v1/artifacts?after=&limit=        artifacts, oldest first, kept or removed, same paging
//! GET  /v1/artifacts?before=&limit=       the same newest first (the web view's order)
//! GET  /v1/artifacts/{id}                 one (id: `sha256:<hex>`): size, creator, state,
//!                                         whether a live record needs it, its references
//! GET  /v1/artifacts/{id}/content         the content (410 `removed` once retention removed it)
//! POST /v1/gc?dry_run=                    a retention sweep now; answers its report
//! POST /v1/timers/{id}/delete             end by hand, kept: a timer deleted, a wait
//! POST /v1/waits/{id}/cancel              cancelled, a Work closed ({"reason"?}); answered
//! POST /v1/work/{id}/close                {"<record>": …, "changed"} (`manual.rs`)
//!
//! For the operator views (`views.rs`):
//! GET  /v1/overview?sort=&order=&filter=&offset=&limit=&detail=
//!                                         daemon figures, counts, one page of the extensions
//!                                         table, one extension's detail: `conduit top`'s one
//!                                         request per refresh
//! POST /v1/extensions/{name}/enable       set the registry's flag and apply it (also disable)
//! GET  /v1/extensions/{name}/latency      per-method latency counts between fixed bounds
//! GET  /v1/work/recent?state=&kind=&before=&limit=
//!                                         Work newest first, from indexes, with counts
//! GET  /v1/work/{id}/events?after=&limit= one Work and a page of its events
//! ```
//!
//! Access: the socket is 0600 inside a 0700 folder, and each connection's peer uid (read once
//! per connection with SO_PEERCRED) must be the daemon's own; any other is answered 403.
//! Errors are `{"error": {"code", "message"}}` with a fitting HTTP status, every one of them:
//! the handlers' own, and the framework's rejections (an unknown method, a body too large, the
//! wrong content type, a bad query string or path) rewritten by `envelope`.
//!
//! Limits ([`Limits`]): a connection that has not sent a whole request head within the
//! header-read timeout is closed, and at most `max_connections` are open at once: past that, the
//! oldest connection that has not sent a request yet is closed to make room for the new one (if
//! every one is in a request, the new one waits for a slot).
//!
//! The module's parts: `server.rs` the transport (the socket, the accept loop, the connection
//! cap, the header timeout, the peer check), `error.rs` the error answers (`ApiError`, the
//! store's and the core's errors as answers, the envelope of the framework's rejections),
//! `extensions.rs` the daemon's own endpoints (health, metrics, extensions, reload),
//! `records.rs` the events, Work, timers, waits and emissions, whose rules are the
//! core's operations (`core::ops`): each handler parses, calls one, and shapes the answer,
//! `artifacts.rs` the artifacts (a page either way, one with its references, its content) and
//! the retention sweep on demand, `manual.rs` what an operator ends by hand (`core::manual`),
//! and `views.rs` what the operator views read (the overview, pages from indexes) and do.
//!
//! Of the daemon, only this module knows HTTP (its clients — `client.rs`, the views — speak it too).

mod artifacts;
mod error;
mod extensions;
mod manual;
mod records;
mod server;
mod views;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use crate::daemon::handle::Daemon;

pub use error::{ApiError, MAX_BODY, MAX_PUSH_BODY};
pub use manual::MAX_CLOSE_REASON;
pub use server::{HEADER_TIMEOUT_ENV, Limits, MAX_CONNECTIONS_ENV, PeerCred, bind};

/// The router, without the transport and without the layers [`serve_with`] adds (the peer
/// check, the error envelope for the framework's rejections).
pub fn router(daemon: Arc<Daemon>) -> Router {
    Router::new()
        .merge(extensions::routes())
        .merge(records::routes(daemon.core().clone()))
        .merge(artifacts::routes())
        .merge(views::routes())
        .merge(manual::routes())
        .fallback(|req: Request| async move {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "no endpoint {} {}; docs/operations.md §7 lists them",
                    req.method(),
                    req.uri().path()
                ),
            )
        })
        .with_state(daemon)
}

/// Serve until `shutdown` is cancelled, with the default [`Limits`].
pub async fn serve(
    listener: UnixListener,
    daemon: Arc<Daemon>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_with(listener, daemon, shutdown, Limits::default()).await
}

/// Serve until `shutdown` is cancelled: one task per connection, at most
/// `limits.max_connections` at once (the oldest that sent no request makes room for a new one),
/// each closed if a request head takes longer than `limits.header_read_timeout`. Once `shutdown` is cancelled, open connections finish the
/// request they are in; every connection task is owned here and ends with this future.
pub async fn serve_with(
    listener: UnixListener,
    daemon: Arc<Daemon>,
    shutdown: CancellationToken,
    limits: Limits,
) -> std::io::Result<()> {
    server::serve_router(listener, router(daemon), shutdown, limits).await
}
