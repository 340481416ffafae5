//! What an operator ends by hand: `POST /v1/timers/{id}/delete`, `POST /v1/waits/{id}/cancel`
//! and `POST /v1/work/{id}/close` (body `{"reason"?}`, or none). Each answers the record as it
//! is now and whether this request changed it:
//!
//! ```text
//! 200 {"timer": {…, "deleted_at_ms"}, "changed": true}      ended now
//! 200 {"timer": {…}, "changed": false}                      ended by hand before
//! 409 {"error": {"code": "conflict", …}}                    its state forbids it (a satisfied
//!                                                           wait, a Work the host finished)
//! 404 {"error": {"code": "not_found", …}}
//! ```
//!
//! The rule of each is the store's (`delete_timer`, `cancel_wait`, `close_work`), reached
//! through `core::manual`; these only shape the answer.

use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use conduit_store::Ended;
use serde_json::json;

use super::error::{ApiError, ApiResult, bad_request};
use crate::daemon::handle::Daemon;

/// The routes of what an operator ends by hand.
pub(super) fn routes() -> Router<Arc<Daemon>> {
    Router::new()
        .route("/v1/timers/{id}/delete", post(delete_timer))
        .route("/v1/waits/{id}/cancel", post(cancel_wait))
        .route("/v1/work/{id}/close", post(close_work))
}

/// The answer for `outcome` of the record `what` `id`, under the key `what`.
fn answer<T: serde::Serialize>(
    what: &'static str,
    id: i64,
    outcome: Option<Ended<T>>,
    refused: impl FnOnce(&T) -> String,
) -> ApiResult {
    match outcome {
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no {what} {id}"),
        )),
        Some(Ended::Refused(r)) => {
            Err(ApiError::new(StatusCode::CONFLICT, "conflict", refused(&r)))
        }
        Some(Ended::Now(r)) => Ok(Json(json!({ what: r, "changed": true })).into_response()),
        Some(Ended::Already(r)) => Ok(Json(json!({ what: r, "changed": false })).into_response()),
    }
}

async fn delete_timer(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<i64>) -> ApiResult {
    let outcome = d.core().delete_timer(id).await?;
    // The store never refuses a timer: any can be deleted.
    answer("timer", id, outcome, |_| {
        format!("timer {id} cannot be deleted")
    })
}

async fn cancel_wait(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<i64>) -> ApiResult {
    let outcome = d.core().cancel_wait(id).await?;
    answer("wait", id, outcome, |w| {
        format!(
            "wait {id} is {}{}: only an active wait can be cancelled",
            w.state,
            w.satisfied_by_event_id
                .map(|e| format!(" (by event {e})"))
                .unwrap_or_default()
        )
    })
}

/// `{"reason": "…"}`, or no body at all.
#[derive(serde::Deserialize)]
struct CloseBody {
    #[serde(default)]
    reason: Option<String>,
}

/// How long a reason may be, in bytes.
pub const MAX_CLOSE_REASON: usize = 1024;

async fn close_work(
    State(d): State<Arc<Daemon>>,
    UrlPath(id): UrlPath<i64>,
    body: axum::body::Bytes,
) -> ApiResult {
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        serde_json::from_slice::<CloseBody>(&body)
            .map_err(|e| bad_request(format!("the body is not {{\"reason\"?}}: {e}")))?
            .reason
    };
    if let Some(r) = &reason
        && r.len() > MAX_CLOSE_REASON
    {
        return Err(bad_request(format!(
            "the reason is {} bytes; at most {MAX_CLOSE_REASON}",
            r.len()
        )));
    }
    let outcome = d.core().close_work(id, reason).await?;
    answer("work", id, outcome, |w| {
        format!(
            "work {id} is {} already: only an open or ready Work can be closed",
            w.state
        )
    })
}
