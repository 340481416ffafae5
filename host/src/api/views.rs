//! The endpoints the operator views read and act through (`conduit top`, `conduit web`): the
//! overview, enable and disable, an extension's latency histogram, recent Work by state and
//! kind, and one Work's events (the artifacts list, newest first with `before`, is
//! `artifacts.rs`'s). Every list is a page read from indexes
//! (`conduit_store::views`), so what a view costs does not grow with the history retained.

use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use conduit_store::{WorkFilter, WorkState};
use serde::Deserialize;
use serde_json::json;

use super::error::{ApiError, ApiResult, bad_request};
use crate::daemon::handle::Daemon;
use crate::daemon::overview::{self, SortKey, UNROUTED_CAP};

/// The routes of the views' endpoints.
pub(super) fn routes() -> Router<Arc<Daemon>> {
    Router::new()
        .route("/v1/overview", get(overview))
        .route("/v1/extensions/{name}/enable", post(enable))
        .route("/v1/extensions/{name}/disable", post(disable))
        .route("/v1/extensions/{name}/latency", get(latency))
        .route("/v1/work/recent", get(recent_work))
        .route("/v1/work/{id}/events", get(work_events))
}

/// `limit` as every list takes it: 1 to 200, 50 when absent.
fn limit(asked: Option<u32>) -> Result<u32, ApiError> {
    conduit_protocol::page_limit(asked).map_err(|e| bad_request(e.to_string()))
}

#[derive(Deserialize)]
struct OverviewQuery {
    sort: Option<String>,
    order: Option<String>,
    filter: Option<String>,
    offset: Option<usize>,
    limit: Option<u32>,
    detail: Option<String>,
}

impl OverviewQuery {
    fn parse(self) -> Result<overview::Query, ApiError> {
        let sort = match self.sort.as_deref() {
            None | Some("") => SortKey::default(),
            Some(s) => SortKey::parse(s).ok_or_else(|| {
                let names: Vec<&str> = SortKey::ALL.iter().map(|k| k.as_str()).collect();
                bad_request(format!(
                    "`sort` must be one of {}, not {s:?}",
                    names.join(", ")
                ))
            })?,
        };
        let desc = match self.order.as_deref() {
            None | Some("") | Some("asc") => false,
            Some("desc") => true,
            Some(o) => return Err(bad_request(format!("`order` is asc or desc, not {o:?}"))),
        };
        Ok(overview::Query {
            sort,
            desc,
            filter: self.filter.unwrap_or_default(),
            offset: self.offset.unwrap_or(0),
            limit: limit(self.limit)? as usize,
            detail: self.detail.filter(|d| !d.is_empty()),
        })
    }
}

async fn overview(State(d): State<Arc<Daemon>>, Query(q): Query<OverviewQuery>) -> ApiResult {
    let q = q.parse()?;
    // The registry may be read (after a change) and the store is: off the runtime's threads.
    let o = tokio::task::spawn_blocking(move || -> Result<_, ApiError> {
        let counts = d.core().store.read(|r| r.view_counts(UNROUTED_CAP))?;
        Ok(d.overview(&q, counts)?)
    })
    .await
    .map_err(|e| anyhow::anyhow!("the overview panicked: {e}"))??;
    Ok(Json(o).into_response())
}

/// Enable or disable a package (the registry's flag, as `conduit ext enable|disable`), then
/// apply the registry: the daemon starts or stops it.
async fn set_enabled(d: Arc<Daemon>, name: String, enabled: bool) -> ApiResult {
    let state = d.state_dir().clone();
    let n = name.clone();
    let changed =
        tokio::task::spawn_blocking(move || crate::packages::set_enabled(&state, &n, enabled))
            .await
            .map_err(|e| anyhow::anyhow!("changing the registry panicked: {e}"))?;
    let changed = match changed {
        Ok(c) => c,
        Err(crate::packages::PackageError::NotInstalled { .. }) => {
            return Err(ApiError::not_installed(&name));
        }
        Err(e) => return Err(anyhow::Error::new(e).into()),
    };
    let report = d.reload().await?;
    Ok(Json(json!({
        "name": name,
        "enabled": enabled,
        "changed": changed,
        "reload": report,
    }))
    .into_response())
}

async fn enable(State(d): State<Arc<Daemon>>, UrlPath(name): UrlPath<String>) -> ApiResult {
    set_enabled(d, name, true).await
}

async fn disable(State(d): State<Arc<Daemon>>, UrlPath(name): UrlPath<String>) -> ApiResult {
    set_enabled(d, name, false).await
}

/// Each method's latencies as counts between the metrics' bucket bounds (not cumulative), for
/// a histogram picture.
async fn latency(State(d): State<Arc<Daemon>>, UrlPath(name): UrlPath<String>) -> ApiResult {
    if d.extension(&name)?.is_none() {
        return Err(ApiError::not_installed(&name));
    }
    let bounds_us: Vec<u64> = crate::telemetry::metrics::LATENCY_BOUNDS_S
        .iter()
        .map(|s| (s * 1e6).round() as u64)
        .collect();
    let hists = d
        .supervisor()
        .get(&name)
        .map(|ext| ext.latency_histograms(&bounds_us))
        .unwrap_or_default();
    let methods: serde_json::Map<String, serde_json::Value> = hists
        .into_iter()
        .map(|(m, h)| {
            let mut counts = Vec::with_capacity(h.cumulative.len() + 1);
            let mut below = 0;
            for c in &h.cumulative {
                counts.push(c.saturating_sub(below));
                below = *c;
            }
            counts.push(h.count.saturating_sub(below));
            (
                m,
                json!({ "counts": counts, "count": h.count, "sum_us": h.sum_us }),
            )
        })
        .collect();
    Ok(Json(json!({ "name": name, "bounds_us": bounds_us, "methods": methods })).into_response())
}

#[derive(Deserialize)]
struct RecentQuery {
    state: Option<String>,
    kind: Option<String>,
    before: Option<i64>,
    limit: Option<u32>,
}

async fn recent_work(State(d): State<Arc<Daemon>>, Query(q): Query<RecentQuery>) -> ApiResult {
    let limit = limit(q.limit)?;
    let state = match q.state.as_deref() {
        None | Some("") => None,
        Some(s) => Some(
            WorkState::parse(s)
                .ok_or_else(|| bad_request(format!("`state` is open, ready or done, not {s:?}")))?,
        ),
    };
    let filter = WorkFilter {
        state,
        kind: q.kind.filter(|k| !k.is_empty()),
    };
    let (work, counts) = d
        .core()
        .read(move |r| {
            let page = r.work_page(&filter, q.before, limit)?;
            Ok((page, r.view_counts(1)?.work))
        })
        .await?;
    let next = (work.len() == limit as usize)
        .then(|| work.last().map(|w| w.id))
        .flatten();
    Ok(Json(json!({ "work": work, "next_before": next, "counts": counts })).into_response())
}

#[derive(Deserialize)]
struct AfterQuery {
    after: Option<i64>,
    limit: Option<u32>,
}

async fn work_events(
    State(d): State<Arc<Daemon>>,
    UrlPath(id): UrlPath<i64>,
    Query(q): Query<AfterQuery>,
) -> ApiResult {
    let limit = limit(q.limit)?;
    let (work, events) = d
        .core()
        .read(move |r| {
            let Some(work) = r.work_summary(id)? else {
                return Ok((None, Vec::new()));
            };
            Ok((Some(work), r.work_events(id, q.after, limit)?))
        })
        .await?;
    if work.is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no work {id}"),
        ));
    }
    let next = events.last().map(|e| e.event.id);
    Ok(Json(json!({ "work": work, "events": events, "next_after": next })).into_response())
}
