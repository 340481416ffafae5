//! The daemon's own endpoints: health, metrics, the installed extensions (one, restart, logs,
//! a diagnostic call) and reload. What they answer comes from the daemon handle; these only
//! shape it.

use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::error::{ApiError, ApiResult};
use crate::daemon::handle::Daemon;

/// The routes of the daemon's own endpoints.
pub(super) fn routes() -> Router<Arc<Daemon>> {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/metrics", get(metrics))
        .route("/v1/extensions", get(list))
        .route("/v1/extensions/{name}", get(one))
        .route("/v1/extensions/{name}/restart", post(restart))
        .route("/v1/extensions/{name}/logs", get(logs))
        .route("/v1/extensions/{name}/call", post(call))
        .route("/v1/extensions/{name}/calls", get(calls))
        .route("/v1/reload", post(reload))
}

/// `status` is `ok`, or `degraded` while any extension is in trouble; `extensions` counts
/// them by trouble and lists each with since when (`daemon::trouble`).
async fn health(State(d): State<Arc<Daemon>>) -> ApiResult {
    let summary = crate::daemon::trouble::summarize(&d.extensions()?);
    Ok(Json(json!({
        "status": summary.status(),
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "started_at_ms": d.started_at_ms(),
        "state_dir": d.state_dir().path(),
        "extensions": summary,
        "host_loop": d.core().stats.snapshot(),
        "store": { "panics": d.core().store_panics() },
        "telemetry": crate::telemetry::otlp::STATS.snapshot(),
        "service": crate::service::under::current(),
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
struct CallsQuery {
    after: Option<u64>,
    limit: Option<usize>,
}

/// The most journal entries one answer holds.
const MAX_CALLS_PAGE: usize = 1024;

/// The last calls of a journaled extension (a development install), oldest first, after a
/// sequence number: `{"name", "journaled", "calls": [{seq, at_ms, method, took_us, outcome,
/// error_code?, error?}], "missed", "next"}`. Not journaled, or not running: no calls.
async fn calls(
    State(d): State<Arc<Daemon>>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<CallsQuery>,
) -> ApiResult {
    if d.extension(&name)?.is_none() {
        return Err(ApiError::not_installed(&name));
    }
    let limit = q.limit.unwrap_or(MAX_CALLS_PAGE);
    if !(1..=MAX_CALLS_PAGE).contains(&limit) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!("limit must be 1 to {MAX_CALLS_PAGE}, not {limit}"),
        ));
    }
    let after = q.after.unwrap_or(0);
    let (journaled, page) = match d.supervisor().get(&name) {
        Some(ext) => (
            ext.journal().is_enabled(),
            ext.journal().after(after, limit),
        ),
        None => (
            false,
            conduit_supervisor::journal::JournalPage {
                next: after,
                ..Default::default()
            },
        ),
    };
    Ok(Json(json!({ "name": name, "journaled": journaled, "calls": page.calls, "missed": page.missed, "next": page.next })).into_response())
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
