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
//! GET  /v1/artifacts/{id}                 the content (id: `sha256:<hex>`)
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
//! Only this module knows HTTP.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use crate::daemon::handle::Daemon;

/// Who is on the other end of a connection.
#[derive(Clone, Copy, Debug)]
pub struct PeerCred {
    pub uid: Option<u32>,
    pub pid: Option<i32>,
}

impl Connected<IncomingStream<'_, UnixListener>> for PeerCred {
    fn connect_info(stream: IncomingStream<'_, UnixListener>) -> Self {
        let cred = stream.io().peer_cred().ok();
        PeerCred {
            uid: cred.map(|c| c.uid()),
            pid: cred.and_then(|c| c.pid()),
        }
    }
}

/// The largest body `POST /v1/events` accepts.
pub const MAX_PUSH_BODY: usize = 1024 * 1024;

/// The largest body of every other endpoint (axum's default, named here so the error can say it).
pub const MAX_BODY: usize = 2 * 1024 * 1024;

/// The variable that sets the header-read timeout, in milliseconds.
pub const HEADER_TIMEOUT_ENV: &str = "CONDUIT_API_HEADER_TIMEOUT_MS";
/// The variable that sets the connection cap.
pub const MAX_CONNECTIONS_ENV: &str = "CONDUIT_API_MAX_CONNECTIONS";

/// How long a connection may take to send a request's head, and how many are served at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub header_read_timeout: std::time::Duration,
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: std::time::Duration::from_secs(10),
            max_connections: 256,
        }
    }
}

impl Limits {
    /// The limits from [`HEADER_TIMEOUT_ENV`] (100 to 600,000 ms, default 10,000) and
    /// [`MAX_CONNECTIONS_ENV`] (1 to 65,536, default 256); a value out of range or not a number
    /// is an error naming the variable.
    pub fn from_env() -> Result<Limits, String> {
        Limits::parse(
            std::env::var(HEADER_TIMEOUT_ENV).ok().as_deref(),
            std::env::var(MAX_CONNECTIONS_ENV).ok().as_deref(),
        )
    }

    /// [`Limits::from_env`] on given values (`None` or empty: the default).
    pub fn parse(timeout_ms: Option<&str>, max: Option<&str>) -> Result<Limits, String> {
        fn num(var: &str, v: Option<&str>, lo: u64, hi: u64) -> Result<Option<u64>, String> {
            match v.map(str::trim).filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                    _ => Err(format!(
                        "{var} must be a whole number from {lo} to {hi}, not `{v}`; unset it for the default"
                    )),
                },
            }
        }
        let mut l = Limits::default();
        if let Some(ms) = num(HEADER_TIMEOUT_ENV, timeout_ms, 100, 600_000)? {
            l.header_read_timeout = std::time::Duration::from_millis(ms);
        }
        if let Some(n) = num(MAX_CONNECTIONS_ENV, max, 1, 65_536)? {
            l.max_connections = n as usize;
        }
        Ok(l)
    }
}

/// The longest a Unix socket's path may be, in bytes (Linux and macOS keep it in a fixed
/// 108- or 104-byte field, with a terminating zero).
const MAX_SOCKET_PATH: usize = if cfg!(target_os = "macos") { 103 } else { 107 };

/// Bind the socket: remove a stale one, bind, and make it owner-only.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} owner-only", dir.display()))?;
    }
    // The state lock is already held, so a socket file here is a leftover of a daemon that
    // did not exit cleanly, not a live one.
    match std::fs::remove_file(path) {
        Ok(()) => tracing::debug!(path = %path.display(), "removed a stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot remove the stale socket {}", path.display()));
        }
    }
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        anyhow::bail!(
            "cannot listen on {}: a Unix socket's path may be at most {MAX_SOCKET_PATH} bytes long, and this one is {len}; use a state directory with a shorter path (--state-dir or CONDUIT_STATE_DIR)",
            path.display()
        );
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot make {} owner-only", path.display()))?;
    Ok(listener)
}

/// The router, without the transport and without the layers [`serve_with`] adds (the peer
/// check, the error envelope for the framework's rejections).
pub fn router(daemon: Arc<Daemon>) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/metrics", get(metrics))
        .route("/v1/extensions", get(list))
        .route("/v1/extensions/{name}", get(one))
        .route("/v1/extensions/{name}/restart", post(restart))
        .route("/v1/extensions/{name}/logs", get(logs))
        .route("/v1/extensions/{name}/call", post(call))
        .route("/v1/reload", post(reload))
        .route(
            "/v1/events",
            post(push_event)
                .get(list_events)
                .layer(axum::extract::DefaultBodyLimit::max(MAX_PUSH_BODY)),
        )
        .route("/v1/work", get(list_work))
        .route("/v1/work/{id}", get(one_work))
        .route("/v1/timers", post(create_timer).get(list_timers))
        .route("/v1/timers/{id}", get(one_timer))
        .route("/v1/waits", post(create_wait).get(list_waits))
        .route("/v1/waits/{id}", get(one_wait))
        .route("/v1/emissions", post(create_emission).get(list_emissions))
        .route("/v1/emissions/{id}", get(one_emission))
        .route("/v1/artifacts/{id}", get(get_artifact))
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

/// Rewrites an error answer that is not already the JSON envelope (the framework's rejections:
/// 405 with an empty body, 413, 415, 422 and bad query strings or paths as plain text) into
/// `{"error": {"code", "message"}}`, keeping its status and headers (`allow` on a 405). Applied
/// to what the whole router answered, so it sees what the method router adds.
async fn envelope(method: axum::http::Method, path: String, res: Response) -> Response {
    let status = res.status();
    let is_json = res
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    // Rejection texts are a line or two; more is cut.
    let text = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_owned(),
        Err(_) => String::new(),
    };
    let allow = parts
        .headers
        .get(axum::http::header::ALLOW)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (code, message) = match status {
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            match allow {
                Some(a) => format!("{path} does not take {method}; it takes {a}"),
                None => format!("{path} does not take {method}"),
            },
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            "too_large",
            format!(
                "the body is over the limit ({MAX_PUSH_BODY} bytes for /v1/events, {MAX_BODY} for the others)"
            ),
        ),
        StatusCode::NOT_FOUND => ("not_found", or(text, "not found")),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "invalid",
            or(
                text,
                "send the body as JSON with `content-type: application/json`",
            ),
        ),
        s if s.is_server_error() => ("internal", or(text, "the daemon failed")),
        _ => ("invalid", or(text, "the request is not valid")),
    };
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    parts.headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    let body = json!({ "error": { "code": code, "message": message } }).to_string();
    Response::from_parts(parts, axum::body::Body::from(body))
}

fn or(text: String, default: &str) -> String {
    if text.is_empty() {
        default.to_owned()
    } else {
        text
    }
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
    let own_uid = nix::unistd::geteuid().as_raw();
    let app = router(daemon).layer(axum::middleware::from_fn(
        move |req: Request, next: Next| check_peer(own_uid, req, next),
    ));
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    // Connections that have not sent a request yet, oldest first: the ones closed to make room.
    let waiting: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, CancellationToken>>> =
        Arc::default();
    let mut conns = tokio::task::JoinSet::new();
    let mut next_id = 0u64;
    let mut at_cap_logged = false;
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of descriptors, most often: wait a little rather than spin.
                    tracing::warn!(error = %e, "cannot accept a management connection");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        while conns.try_join_next().is_some() {}
        // At the cap, the oldest connection that has not sent a request makes room, so a flood
        // of stalled connections cannot keep a working client out; if every one is in a
        // request, the new one waits for a slot.
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => {
                at_cap_logged = false;
                p
            }
            Err(_) => {
                let evicted = {
                    let mut w = waiting.lock().unwrap_or_else(|p| p.into_inner());
                    w.pop_first().map(|(_, cancel)| cancel.cancel()).is_some()
                };
                if !at_cap_logged {
                    tracing::warn!(
                        max = limits.max_connections,
                        evicted,
                        "the management API is at its connection cap; the oldest connection that sent no request is closed to make room"
                    );
                    at_cap_logged = true;
                }
                tokio::select! {
                    p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                    () = shutdown.cancelled() => break,
                }
            }
        };
        let cred = stream.peer_cred().ok();
        let peer = PeerCred {
            uid: cred.map(|c| c.uid()),
            pid: cred.and_then(|c| c.pid()),
        };
        let id = next_id;
        next_id += 1;
        let evict = CancellationToken::new();
        waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, evict.clone());
        let svc = WithPeer {
            app: app.clone(),
            peer,
            first_request: Arc::new(FirstRequest {
                id,
                waiting: waiting.clone(),
            }),
        };
        let stop = shutdown.clone();
        let waiting = waiting.clone();
        conns.spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "a management connection ended with an error");
                    }
                }
                () = evict.cancelled() => {}
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
    }
    // The daemon bounds this wait (and aborts this future, which aborts the connections).
    while conns.join_next().await.is_some() {}
    Ok(())
}

/// The router for one connection, with the peer's credentials in every request.
#[derive(Clone)]
struct WithPeer {
    app: Router,
    peer: PeerCred,
    first_request: Arc<FirstRequest>,
}

/// Takes a connection off the list of those that may be closed to make room, at its first
/// request (its head was read: it is a working client).
struct FirstRequest {
    id: u64,
    waiting: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, CancellationToken>>>,
}

impl FirstRequest {
    fn seen(&self) {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for WithPeer {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response, std::convert::Infallible>> + Send>,
    >;

    fn call(&self, mut req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        self.first_request.seen();
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let mut app = self.app.clone();
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        // A router is always ready (`poll_ready` answers at once), so `call` may come first.
        Box::pin(async move {
            let res = tower_service::Service::call(&mut app, req.map(axum::body::Body::new)).await;
            match res {
                Ok(res) => Ok(envelope(method, path, res).await),
                Err(never) => match never {},
            }
        })
    }
}

async fn check_peer(own_uid: u32, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<PeerCred>>().map(|c| c.0);
    match peer.and_then(|p| p.uid) {
        Some(uid) if uid == own_uid => next.run(req).await,
        other => {
            tracing::warn!(
                uid = other,
                pid = peer.and_then(|p| p.pid),
                "refused a management connection from another user"
            );
            let who = other.map_or("an unknown user".to_owned(), |u| format!("uid {u}"));
            ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("the management socket serves only uid {own_uid}, not {who}"),
            )
            .into_response()
        }
    }
}

/// An API error: an HTTP status and `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn not_installed(name: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no package named `{name}` is installed; `conduit ext list` shows the installed ones"
            ),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({ "error": { "code": self.code, "message": self.message } })),
        )
            .into_response()
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            crate::error_chain::chain(&e),
        )
    }
}

type ApiResult = Result<Response, ApiError>;

async fn health(State(d): State<Arc<Daemon>>) -> ApiResult {
    let exts = d.extensions()?;
    let ready = exts
        .iter()
        .filter(|e| e.status.state == conduit_supervisor::State::Ready)
        .count();
    Ok(Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "started_at_ms": d.started_at_ms(),
        "state_dir": d.state_dir().path(),
        "extensions": { "installed": exts.len(), "ready": ready },
        "host_loop": d.core().stats.snapshot(),
        "telemetry": crate::telemetry::otlp::STATS.snapshot(),
    }))
    .into_response())
}

async fn metrics(State(d): State<Arc<Daemon>>) -> ApiResult {
    // Gathering reads the store: off the runtime's threads.
    let snap = tokio::task::spawn_blocking(move || crate::telemetry::metrics::gather(&d))
        .await
        .map_err(|e| anyhow::anyhow!("gathering the metrics panicked: {e}"))??;
    let text = crate::telemetry::metrics::prometheus(&snap);
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            crate::telemetry::metrics::CONTENT_TYPE,
        )],
        text,
    )
        .into_response())
}

async fn list(State(d): State<Arc<Daemon>>) -> ApiResult {
    Ok(Json(json!({ "extensions": d.extensions()? })).into_response())
}

async fn one(State(d): State<Arc<Daemon>>, UrlPath(name): UrlPath<String>) -> ApiResult {
    match d.extension(&name)? {
        Some(v) => Ok(Json(v).into_response()),
        None => Err(ApiError::not_installed(&name)),
    }
}

async fn restart(State(d): State<Arc<Daemon>>, UrlPath(name): UrlPath<String>) -> ApiResult {
    match d.extension(&name)? {
        None => Err(ApiError::not_installed(&name)),
        Some(v) if !v.enabled => Err(ApiError::new(
            StatusCode::CONFLICT,
            "disabled",
            format!("`{name}` is disabled; enable it with `conduit ext enable {name}`"),
        )),
        Some(_) if d.restart(&name) => {
            Ok((StatusCode::ACCEPTED, Json(json!({ "restarting": name }))).into_response())
        }
        Some(_) => {
            // Enabled but not supervised yet (a reload is pending): apply the registry.
            d.reload().await?;
            Ok((StatusCode::ACCEPTED, Json(json!({ "restarting": name }))).into_response())
        }
    }
}

#[derive(Deserialize)]
struct LogsQuery {
    lines: Option<usize>,
}

async fn logs(
    State(d): State<Arc<Daemon>>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<LogsQuery>,
) -> ApiResult {
    if d.extension(&name)?.is_none() {
        return Err(ApiError::not_installed(&name));
    }
    let n = q.lines.unwrap_or(100).clamp(1, 10_000);
    let log =
        conduit_supervisor::log::LogFile::new(d.state_dir().logs_dir().join(format!("{name}.log")));
    let lines = log
        .last_lines(n)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", log.path().display()))?;
    Ok(Json(json!({ "name": name, "lines": lines })).into_response())
}

#[derive(Deserialize)]
struct CallBody {
    method: String,
    #[serde(default)]
    params: Option<serde_json::Value>,
    /// 1 ms to 10 min; 30 s when left out.
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// Call a method of a running extension and answer with its result or its error, as is.
async fn call(
    State(d): State<Arc<Daemon>>,
    UrlPath(name): UrlPath<String>,
    Json(body): Json<CallBody>,
) -> ApiResult {
    let Some(ext) = d.supervisor().get(&name) else {
        return match d.extension(&name)? {
            Some(_) => Err(ApiError::new(
                StatusCode::CONFLICT,
                "not_running",
                format!(
                    "`{name}` is not running here (disabled?); see `conduit ext status {name}`"
                ),
            )),
            None => Err(ApiError::not_installed(&name)),
        };
    };
    let timeout =
        std::time::Duration::from_millis(body.timeout_ms.unwrap_or(30_000).clamp(1, 600_000));
    let params =
        serde_json::value::to_raw_value(&body.params.unwrap_or(serde_json::Value::Null))
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_params", e.to_string()))?;
    let t = std::time::Instant::now();
    let res = ext.call_raw(&body.method, &params, Some(timeout)).await;
    let took_us = t.elapsed().as_micros() as u64;
    Ok(match res {
        Ok(raw) => {
            let result: serde_json::Value =
                serde_json::from_str(raw.get()).unwrap_or(serde_json::Value::Null);
            Json(json!({ "result": result, "took_us": took_us })).into_response()
        }
        Err(e) => {
            let code = e.code();
            let name = conduit_protocol::ErrorCode::from_number(code).map_or("error", |c| c.name());
            (StatusCode::OK, Json(json!({ "error": { "code": code, "name": name, "message": e.to_string() }, "took_us": took_us }))).into_response()
        }
    })
}

async fn reload(State(d): State<Arc<Daemon>>) -> ApiResult {
    Ok(Json(d.reload().await?).into_response())
}

// ---- events, work, timers, waits, emissions, artifacts --------------------------------------

use conduit_store::StoreError;

fn store_err(e: StoreError) -> ApiError {
    if e.is_disk_full() {
        return ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "disk_full",
            crate::core::disk_full_message(&e),
        );
    }
    match e {
        StoreError::InvalidLimit { .. } | StoreError::Invalid { .. } => {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid", e.to_string())
        }
        StoreError::NotFound { .. } => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", e.to_string())
        }
        other => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "store",
            other.to_string(),
        ),
    }
}

fn bad_request(msg: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid", msg)
}

/// `Json<T>` whose rejection (bad JSON, missing field, body too large) is our error shape.
struct Body<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(rej) => {
                let status = rej.status();
                let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    "too_large"
                } else {
                    "invalid"
                };
                let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    format!("the body is over the {MAX_PUSH_BODY}-byte limit")
                } else {
                    rej.body_text()
                };
                Err(ApiError::new(status, code, msg))
            }
        }
    }
}

/// A payload as it came, raw: its depth is checked before it is parsed, so a payload of any
/// depth gets the answer that names the limit.
type RawPayload = Option<Box<serde_json::value::RawValue>>;

/// Check a raw payload against `MAX_PAYLOAD_DEPTH`, then parse it; absent is `null`.
fn payload(raw: RawPayload) -> Result<serde_json::Value, ApiError> {
    let Some(raw) = raw else {
        return Ok(serde_json::Value::Null);
    };
    conduit_protocol::check_payload_depth(raw.get())
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "too_deep", e.to_string()))?;
    serde_json::from_str(raw.get())
        .map_err(|e| bad_request(format!("the payload does not parse: {e}")))
}

#[derive(Deserialize)]
struct PushBody {
    source: String,
    delivery_id: String,
    kind: String,
    #[serde(default)]
    payload: RawPayload,
}

async fn push_event(State(d): State<Arc<Daemon>>, Body(b): Body<PushBody>) -> ApiResult {
    conduit_protocol::check_event_fields(&b.source, &b.delivery_id, &b.kind)
        .map_err(|e| bad_request(e.to_string()))?;
    let payload = payload(b.payload)?;
    let core = d.core().clone();
    let accepted = core
        .write(move |tx| {
            tx.accept_event(
                &b.source,
                &b.delivery_id,
                &b.kind,
                &payload,
                crate::core::now_ms(),
            )
        })
        .await
        .map_err(store_err)?;
    if !accepted.duplicate {
        core.nudge();
    }
    let status = if accepted.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        Json(json!({ "event_id": accepted.event_id, "duplicate": accepted.duplicate })),
    )
        .into_response())
}

#[derive(Deserialize)]
struct PageQuery {
    after: Option<i64>,
    limit: Option<u32>,
    source: Option<String>,
}

impl PageQuery {
    fn limit(&self) -> Result<u32, ApiError> {
        conduit_protocol::page_limit(self.limit).map_err(|e| bad_request(e.to_string()))
    }
}

async fn list_events(State(d): State<Arc<Daemon>>, Query(q): Query<PageQuery>) -> ApiResult {
    let limit = q.limit()?;
    let events = d
        .core()
        .read(move |r| r.list_events(q.after, q.source.as_deref(), limit))
        .await
        .map_err(store_err)?;
    let next = events.last().map(|e| e.event.id);
    Ok(Json(json!({ "events": events, "next_after": next })).into_response())
}

async fn list_work(State(d): State<Arc<Daemon>>, Query(q): Query<PageQuery>) -> ApiResult {
    let limit = q.limit()?;
    let work = d
        .core()
        .read(move |r| r.list_work(q.after, limit))
        .await
        .map_err(store_err)?;
    let next = work.last().map(|w| w.id);
    Ok(Json(json!({ "work": work, "next_after": next })).into_response())
}

async fn list_timers(State(d): State<Arc<Daemon>>, Query(q): Query<PageQuery>) -> ApiResult {
    let limit = q.limit()?;
    let rows = d
        .core()
        .read(move |r| r.list_timers(q.after, limit))
        .await
        .map_err(store_err)?;
    let next = rows.last().map(|t| t.id);
    Ok(Json(json!({ "timers": rows, "next_after": next })).into_response())
}

async fn list_waits(State(d): State<Arc<Daemon>>, Query(q): Query<PageQuery>) -> ApiResult {
    let limit = q.limit()?;
    let rows = d
        .core()
        .read(move |r| r.list_waits(q.after, limit))
        .await
        .map_err(store_err)?;
    let next = rows.last().map(|w| w.id);
    Ok(Json(json!({ "waits": rows, "next_after": next })).into_response())
}

async fn list_emissions(State(d): State<Arc<Daemon>>, Query(q): Query<PageQuery>) -> ApiResult {
    let limit = q.limit()?;
    let rows = d
        .core()
        .read(move |r| r.list_emissions(q.after, limit))
        .await
        .map_err(store_err)?;
    let next = rows.last().map(|e| e.id);
    Ok(Json(json!({ "emissions": rows, "next_after": next })).into_response())
}

async fn one_work(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<i64>) -> ApiResult {
    let w = d
        .core()
        .read(move |r| r.work(id))
        .await
        .map_err(store_err)?;
    w.map(|w| Json(w).into_response())
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no work {id}")))
}

/// The running extension that declared `name` in the capability list `pick`, unless the
/// caller named one.
fn owner(
    d: &Daemon,
    named: Option<String>,
    what: &str,
    name: &str,
    pick: impl Fn(&conduit_protocol::Capabilities) -> bool,
) -> Result<String, ApiError> {
    if let Some(ext) = named {
        let caps = d
            .core()
            .capabilities(&ext)
            .ok_or_else(|| bad_request(format!("extension `{ext}` is not running here")))?;
        return if pick(&caps) {
            Ok(ext)
        } else {
            Err(bad_request(format!(
                "extension `{ext}` does not declare the {what} `{name}`"
            )))
        };
    }
    d.core()
        .extensions()
        .into_iter()
        .find(|(_, c)| pick(c))
        .map(|(e, _)| e.name().to_owned())
        .ok_or_else(|| bad_request(format!("no running extension declares the {what} `{name}`; `conduit ext status` shows what each declares")))
}

#[derive(Deserialize)]
struct TimerBody {
    recurrence: String,
    spec: String,
    extension: Option<String>,
    first_at_ms: Option<i64>,
}

async fn create_timer(State(d): State<Arc<Daemon>>, Body(b): Body<TimerBody>) -> ApiResult {
    let rec = b.recurrence.clone();
    let ext = owner(&d, b.extension, "recurrence", &rec, |c| {
        c.recurrences.contains(&rec)
    })?;
    let now = crate::core::now_ms();
    let first = b.first_at_ms.unwrap_or(now);
    let core = d.core().clone();
    let id = core
        .write(move |tx| tx.create_timer(&ext, &b.recurrence, &b.spec, first, now))
        .await
        .map_err(store_err)?;
    core.nudge();
    Ok((StatusCode::CREATED, Json(json!({ "timer_id": id }))).into_response())
}

async fn one_timer(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<i64>) -> ApiResult {
    let t = d
        .core()
        .read(move |r| r.timer(id))
        .await
        .map_err(store_err)?;
    t.map(|t| Json(t).into_response())
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no timer {id}")))
}

#[derive(Deserialize)]
struct WaitBody {
    filter: String,
    subject: String,
    extension: Option<String>,
    work_id: Option<i64>,
}

async fn create_wait(State(d): State<Arc<Daemon>>, Body(b): Body<WaitBody>) -> ApiResult {
    let filter = b.filter.clone();
    let ext = owner(&d, b.extension, "dependency filter", &filter, |c| {
        c.dependency_filters.contains(&filter)
    })?;
    let core = d.core().clone();
    let id = core
        .write(move |tx| {
            // Only events after the wait was made can satisfy it.
            let after = tx.latest_event_id()?.unwrap_or(0);
            tx.create_wait(
                &ext,
                &b.filter,
                &b.subject,
                b.work_id,
                after,
                crate::core::now_ms(),
            )
        })
        .await
        .map_err(store_err)?;
    Ok((StatusCode::CREATED, Json(json!({ "wait_id": id }))).into_response())
}

async fn one_wait(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<i64>) -> ApiResult {
    let w = d
        .core()
        .read(move |r| r.wait(id))
        .await
        .map_err(store_err)?;
    w.map(|w| Json(w).into_response())
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no wait {id}")))
}

#[derive(Deserialize)]
struct EmissionBody {
    emission: String,
    #[serde(default)]
    payload: RawPayload,
    extension: Option<String>,
    work_id: Option<i64>,
}

async fn create_emission(State(d): State<Arc<Daemon>>, Body(b): Body<EmissionBody>) -> ApiResult {
    let em = b.emission.clone();
    let payload = payload(b.payload)?;
    let ext = owner(&d, b.extension, "emission", &em, |c| {
        c.emissions.contains(&em)
    })?;
    let core = d.core().clone();
    let planned = core
        .write(move |tx| {
            tx.plan_emission(
                &ext,
                &b.emission,
                b.work_id,
                &payload,
                crate::core::now_ms(),
            )
        })
        .await
        .map_err(store_err)?;
    core.nudge();
    Ok((StatusCode::CREATED, Json(planned)).into_response())
}

async fn one_emission(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<i64>) -> ApiResult {
    let e = d
        .core()
        .read(move |r| r.emission(id))
        .await
        .map_err(store_err)?;
    e.map(|e| Json(e).into_response()).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no emission {id}"),
        )
    })
}

async fn get_artifact(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<String>) -> ApiResult {
    let sha = id
        .strip_prefix("sha256:")
        .unwrap_or(&id)
        .to_ascii_lowercase();
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad_request("an artifact id is `sha256:` and 64 hex digits"));
    }
    let sha2 = sha.clone();
    let meta = d
        .core()
        .read(move |r| r.artifact_by_sha256(&sha2))
        .await
        .map_err(store_err)?;
    let Some(meta) = meta else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no artifact sha256:{sha}"),
        ));
    };
    let path = d.core().artifacts.content_path(&sha);
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                meta.media_type
                    .unwrap_or_else(|| "application/octet-stream".into()),
            ),
            (axum::http::header::CONTENT_LENGTH, meta.size.to_string()),
        ],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_take_their_range_and_refuse_a_value_past_it_naming_the_variable() {
        assert_eq!(Limits::parse(None, None), Ok(Limits::default()));
        assert_eq!(Limits::parse(Some(""), Some(" ")), Ok(Limits::default()));
        let edges = Limits::parse(Some("100"), Some("1")).unwrap();
        assert_eq!(
            edges.header_read_timeout,
            std::time::Duration::from_millis(100)
        );
        assert_eq!(edges.max_connections, 1);
        let top = Limits::parse(Some("600000"), Some("65536")).unwrap();
        assert_eq!(top.header_read_timeout, std::time::Duration::from_secs(600));
        assert_eq!(top.max_connections, 65_536);
        for (t, m, var) in [
            (Some("99"), None, HEADER_TIMEOUT_ENV),
            (Some("600001"), None, HEADER_TIMEOUT_ENV),
            (Some("10s"), None, HEADER_TIMEOUT_ENV),
            (None, Some("0"), MAX_CONNECTIONS_ENV),
            (None, Some("65537"), MAX_CONNECTIONS_ENV),
        ] {
            let e = Limits::parse(t, m).unwrap_err();
            assert!(e.starts_with(var), "{e}");
        }
    }
}
