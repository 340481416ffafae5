//! The artifacts' endpoints and retention's: a page of artifacts, one with its size, creator
//! and references, its content, and a sweep on demand. What an artifact looks like is
//! `retention::view`'s; what a sweep does is `retention::sweep`'s; these only shape answers.

use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::error::{ApiError, ApiResult, bad_request};
use crate::daemon::handle::Daemon;
use crate::retention::{SweepError, view};

/// The routes of the artifacts' and retention's endpoints.
pub(super) fn routes() -> Router<Arc<Daemon>> {
    Router::new()
        .route("/v1/artifacts", get(list))
        .route("/v1/artifacts/{id}", get(one))
        .route("/v1/artifacts/{id}/content", get(content))
        .route("/v1/gc", post(gc))
}

/// The digest an id names, or 400 saying what an id is.
fn digest(id: &str) -> Result<String, ApiError> {
    conduit_protocol::artifact_id::parse(id).ok_or_else(|| {
        bad_request(format!(
            "`{id}` is not an artifact id; an artifact id is `sha256:` and 64 hex digits"
        ))
    })
}

fn not_found(sha: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no artifact sha256:{sha}; `conduit artifacts list` shows them"),
    )
}

#[derive(Deserialize)]
struct ListQuery {
    after: Option<i64>,
    before: Option<i64>,
    limit: Option<u32>,
}

/// With `after`, oldest first as the other lists page; otherwise newest first (`before`), the
/// order the web view reads.
async fn list(State(d): State<Arc<Daemon>>, Query(q): Query<ListQuery>) -> ApiResult {
    let limit = conduit_protocol::page_limit(q.limit).map_err(|e| bad_request(e.to_string()))?;
    let order = match (q.after, q.before) {
        (Some(_), Some(_)) => {
            return Err(bad_request(
                "give `after` (oldest first) or `before` (newest first), not both",
            ));
        }
        (Some(a), None) => view::Order::After(Some(a)),
        (None, b) => view::Order::Before(b),
    };
    let page = d.core().read(move |r| view::page(r, order, limit)).await?;
    Ok(Json(page).into_response())
}

async fn one(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<String>) -> ApiResult {
    let sha = digest(&id)?;
    let key = sha.clone();
    match d.core().read(move |r| view::one(r, &key)).await? {
        Some(v) => Ok(Json(v).into_response()),
        None => Err(not_found(&sha)),
    }
}

async fn content(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<String>) -> ApiResult {
    let sha = digest(&id)?;
    let key = sha.clone();
    let Some(meta) = d.core().read(move |r| r.artifact_by_sha256(&key)).await? else {
        return Err(not_found(&sha));
    };
    if let Some(at) = meta.removed_at_ms {
        return Err(ApiError::new(
            StatusCode::GONE,
            "removed",
            view::removed_message(&sha, at),
        ));
    }
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

#[derive(Deserialize)]
struct GcQuery {
    #[serde(default)]
    dry_run: bool,
}

async fn gc(State(d): State<Arc<Daemon>>, Query(q): Query<GcQuery>) -> ApiResult {
    match d.sweeper().sweep_now(q.dry_run).await {
        Ok(report) => Ok(Json(report).into_response()),
        Err(SweepError::Settings(e)) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_settings",
            e.to_string(),
        )),
        Err(SweepError::Store(e)) => Err(e.into()),
        Err(e @ SweepError::Panicked(_)) => Err(anyhow::Error::new(e).into()),
    }
}
