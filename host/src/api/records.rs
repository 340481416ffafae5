//! The records' endpoints: events (push and list), Work, timers, waits and emissions (artifacts
//! are `artifacts.rs`'s). The rules (who owns a name, what a wait may see, when the host loop is nudged)
//! are the core's operations (`core::ops`); a handler parses the request, calls one, and shapes
//! the answer.
//!
//! Every handler but the two of `/v1/events` has only the core (`State<Arc<Core>>`): those two
//! also read the registry (a push's warning names a disabled package; a listed event says which
//! extension owns it), which the daemon holds.

use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use conduit_protocol::CheckedPayload;
use conduit_store::StoreError;
use serde::Deserialize;
use serde_json::json;

use super::error::{ApiError, ApiResult, Body, EVENTS_PATH, bad_request, body_limit};
use crate::core::{Core, Incoming};
use crate::daemon::handle::Daemon;
use conduit_protocol::Capability;

/// The routes of the records' endpoints; all but `/v1/events` are served from `core` alone.
pub(super) fn routes(core: Arc<Core>) -> Router<Arc<Daemon>> {
    let from_core = Router::new()
        .route("/v1/work", get(list_work))
        .route("/v1/work/{id}", get(one_work))
        .route("/v1/timers", post(create_timer).get(list_timers))
        .route("/v1/timers/{id}", get(one_timer))
        .route("/v1/waits", post(create_wait).get(list_waits))
        .route("/v1/waits/{id}", get(one_wait))
        .route("/v1/emissions", post(create_emission).get(list_emissions))
        .route("/v1/emissions/{id}", get(one_emission))
        .with_state(core);
    Router::new()
        .route(
            EVENTS_PATH,
            post(push_event)
                .get(list_events)
                .layer(axum::extract::DefaultBodyLimit::max(body_limit(
                    EVENTS_PATH,
                ))),
        )
        .merge(from_core)
}

/// A payload as it came, raw: its depth is checked before it is parsed, so a payload of any
/// depth gets the answer that names the limit.
type RawPayload = Option<Box<serde_json::value::RawValue>>;

/// Check a raw payload against `MAX_PAYLOAD_DEPTH` (400 `too_deep` past it), keeping its text;
/// absent is `null`.
fn checked(raw: RawPayload) -> Result<CheckedPayload, ApiError> {
    match raw {
        None => Ok(CheckedPayload::null()),
        Some(raw) => CheckedPayload::check(raw)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "too_deep", e.to_string())),
    }
}

/// Check a raw payload as [`checked`] does, then parse it (an emission's payload is a value).
fn payload(raw: RawPayload) -> Result<serde_json::Value, ApiError> {
    let text = checked(raw)?;
    serde_json::from_str(text.as_str())
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

/// `POST /v1/events`: the payload goes from the body to the row as text (checked for depth
/// once, never parsed into a value), through the group commit; answered after its commit.
async fn push_event(State(d): State<Arc<Daemon>>, Body(b): Body<PushBody>) -> ApiResult {
    conduit_protocol::check_event_fields(&b.source, &b.delivery_id, &b.kind)
        .map_err(|e| bad_request(e.to_string()))?;
    let event = Incoming {
        payload: checked(b.payload)?,
        delivery_id: b.delivery_id,
        kind: b.kind,
    };
    let kind = event.kind.clone();
    let accepted = d.core().accept_event(b.source, event).await?;
    let status = if accepted.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let mut answer = json!({ "event_id": accepted.event_id, "duplicate": accepted.duplicate });
    // After the accept, and apart from it: a kind no running extension declares is accepted
    // (it is the caller's record) and said to be going nowhere.
    if let Some(w) = push_warning(&d, &kind)? {
        answer["warning"] = json!(w);
    }
    Ok((status, Json(answer)).into_response())
}

/// The warning for a push of `kind` that no running extension declares; the registry is read
/// only then (to name a disabled package that declares it), so a routed push costs nothing.
fn push_warning(d: &Daemon, kind: &str) -> Result<Option<String>, ApiError> {
    let running = d.core().extensions();
    let declared = running.iter().any(|(_, caps)| {
        crate::core::host_loop::work_kind_of(kind, |k| caps.work_kinds.iter().any(|w| w.name == k))
            .is_some()
    });
    if declared {
        return Ok(None);
    }
    Ok(crate::daemon::routes::warning(kind, &d.extensions()?))
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
        .await?;
    let next = events.last().map(|e| e.event.id);
    // Each with where it stands: in a Work, in none, or waiting and for whom.
    let owners = crate::daemon::routes::Owners::from_views(&d.extensions()?);
    let events: Vec<serde_json::Value> = events.iter().map(|e| owners.annotate(e)).collect();
    Ok(Json(json!({ "events": events, "next_after": next })).into_response())
}

async fn list_work(State(core): State<Arc<Core>>, Query(q): Query<PageQuery>) -> ApiResult {
    let limit = q.limit()?;
    let work = core.read(move |r| r.list_work(q.after, limit)).await?;
    let next = work.last().map(|w| w.id);
    Ok(Json(json!({ "work": work, "next_after": next })).into_response())
}

async fn list_timers(State(core): State<Arc<Core>>, Query(q): Query<PageQuery>) -> ApiResult {
    let limit = q.limit()?;
    let rows = core.read(move |r| r.list_timers(q.after, limit)).await?;
    let next = rows.last().map(|t| t.id);
    Ok(Json(json!({ "timers": rows, "next_after": next })).into_response())
}

async fn list_waits(State(core): State<Arc<Core>>, Query(q): Query<PageQuery>) -> ApiResult {
    let limit = q.limit()?;
    let rows = core.read(move |r| r.list_waits(q.after, limit)).await?;
    let next = rows.last().map(|w| w.id);
    Ok(Json(json!({ "waits": rows, "next_after": next })).into_response())
}

async fn list_emissions(State(core): State<Arc<Core>>, Query(q): Query<PageQuery>) -> ApiResult {
    let limit = q.limit()?;
    let rows = core.read(move |r| r.list_emissions(q.after, limit)).await?;
    let next = rows.last().map(|e| e.id);
    Ok(Json(json!({ "emissions": rows, "next_after": next })).into_response())
}

/// `GET /v1/<records>/{id}`: the record `read` finds, or 404 `no <what> <id>`.
async fn one_record<T: serde::Serialize + Send + 'static>(
    core: &Arc<Core>,
    what: &str,
    id: i64,
    read: impl FnOnce(&conduit_store::ReadTx<'_>, i64) -> Result<Option<T>, StoreError> + Send + 'static,
) -> ApiResult {
    match core.read(move |r| read(r, id)).await? {
        Some(rec) => Ok(Json(rec).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no {what} {id}"),
        )),
    }
}

async fn one_work(State(core): State<Arc<Core>>, UrlPath(id): UrlPath<i64>) -> ApiResult {
    one_record(&core, "work", id, |r, id| r.work(id)).await
}

async fn one_timer(State(core): State<Arc<Core>>, UrlPath(id): UrlPath<i64>) -> ApiResult {
    one_record(&core, "timer", id, |r, id| r.timer(id)).await
}

async fn one_wait(State(core): State<Arc<Core>>, UrlPath(id): UrlPath<i64>) -> ApiResult {
    one_record(&core, "wait", id, |r, id| r.wait(id)).await
}

async fn one_emission(State(core): State<Arc<Core>>, UrlPath(id): UrlPath<i64>) -> ApiResult {
    one_record(&core, "emission", id, |r, id| r.emission(id)).await
}

#[derive(Deserialize)]
struct TimerBody {
    recurrence: String,
    spec: String,
    extension: Option<String>,
    first_at_ms: Option<i64>,
}

async fn create_timer(State(core): State<Arc<Core>>, Body(b): Body<TimerBody>) -> ApiResult {
    let ext = core.owner(
        b.extension.as_deref(),
        Capability::Recurrences,
        &b.recurrence,
    )?;
    let id = core
        .create_timer(ext, b.recurrence, b.spec, b.first_at_ms)
        .await?;
    Ok((StatusCode::CREATED, Json(json!({ "timer_id": id }))).into_response())
}

#[derive(Deserialize)]
struct WaitBody {
    filter: String,
    subject: String,
    extension: Option<String>,
    work_id: Option<i64>,
}

async fn create_wait(State(core): State<Arc<Core>>, Body(b): Body<WaitBody>) -> ApiResult {
    let ext = core.owner(
        b.extension.as_deref(),
        Capability::DependencyFilters,
        &b.filter,
    )?;
    let id = core
        .create_wait(ext, b.filter, b.subject, b.work_id)
        .await?;
    Ok((StatusCode::CREATED, Json(json!({ "wait_id": id }))).into_response())
}

#[derive(Deserialize)]
struct EmissionBody {
    emission: String,
    #[serde(default)]
    payload: RawPayload,
    extension: Option<String>,
    work_id: Option<i64>,
}

async fn create_emission(State(core): State<Arc<Core>>, Body(b): Body<EmissionBody>) -> ApiResult {
    let payload = payload(b.payload)?;
    let ext = core.owner(b.extension.as_deref(), Capability::Emissions, &b.emission)?;
    let planned = core
        .plan_emission(ext, b.emission, b.work_id, payload)
        .await?;
    Ok((StatusCode::CREATED, Json(planned)).into_response())
}
