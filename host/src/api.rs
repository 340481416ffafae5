//! The management API: JSON over HTTP/1.1 on a Unix socket in the state directory.
//!
//! ```text
//! GET  /v1/health                         daemon health and counts
//! GET  /v1/extensions                     every installed package with its status
//! GET  /v1/extensions/{name}              one, with per-method call counts and latencies
//! POST /v1/extensions/{name}/restart      restart it now
//! GET  /v1/extensions/{name}/logs?lines=N the last N lines of its stderr log (default 100)
//! POST /v1/extensions/{name}/call         {"method", "params", "timeout_ms"}: call it (diagnostics)
//! POST /v1/reload                         apply the package registry (the CLI sends this)
//! ```
//!
//! Access: the socket is 0600 inside a 0700 folder, and each connection's peer uid (read once
//! per connection with SO_PEERCRED) must be the daemon's own; any other is answered 403.
//! Errors are `{"error": {"code", "message"}}` with a fitting HTTP status.
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

use crate::daemon::Daemon;

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
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot make {} owner-only", path.display()))?;
    Ok(listener)
}

/// The router, without the transport (tests call it with `oneshot`).
pub fn router(daemon: Arc<Daemon>) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/extensions", get(list))
        .route("/v1/extensions/{name}", get(one))
        .route("/v1/extensions/{name}/restart", post(restart))
        .route("/v1/extensions/{name}/logs", get(logs))
        .route("/v1/extensions/{name}/call", post(call))
        .route("/v1/reload", post(reload))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such endpoint; see `conduit --help`",
            )
        })
        .with_state(daemon)
}

/// Serve until `shutdown` is cancelled.
pub async fn serve(
    listener: UnixListener,
    daemon: Arc<Daemon>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let own_uid = nix::unistd::geteuid().as_raw();
    let app = router(daemon).layer(axum::middleware::from_fn(
        move |req: Request, next: Next| check_peer(own_uid, req, next),
    ));
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<PeerCred>(),
    )
    .with_graceful_shutdown(shutdown.cancelled_owned())
    .await
}

async fn check_peer(own_uid: u32, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<PeerCred>>().map(|c| c.0);
    match peer.and_then(|p| p.uid) {
        Some(uid) if uid == own_uid => next.run(req).await,
        other => {
            tracing::warn!(peer = ?peer, "refused a management connection from another user");
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
            format!("{e:#}"),
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
    }))
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
