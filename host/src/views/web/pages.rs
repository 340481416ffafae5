//! The pages of `conduit web`, each a few requests to the management API and one render:
//! extensions (the overview's table, with restart/enable/disable), one extension (status,
//! limits, health, calls, latency histograms, recent exits, log tail), Work (by state and kind,
//! newest first), one Work with its events, timers, waits, emissions, artifacts, and the
//! doctor (`crate::doctor`, the checks of `conduit doctor`, run on each load).
//!
//! Every list is a page the daemon reads from indexes; a page's links carry its filters and
//! the next page's cursor, so it works the same with JavaScript off. The actions are POSTs
//! (the guard has checked their CSRF token before they reach here) that go back to the page
//! they came from.

use std::sync::Arc;

use axum::extract::{Form, Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;

use super::Web;
use super::html::{self, Page, action, histogram, json_block, spark, state_class, when};
use crate::daemon::handle::ExtensionView;
use crate::daemon::overview::{Overview, SortKey};
use crate::views::fmt;

/// How many rows a list page shows.
const PAGE: u32 = 50;

/// A page that could not be made: the daemon's error, shown as a page.
#[derive(Debug)]
pub(super) struct PageError {
    status: StatusCode,
    message: String,
}

impl PageError {
    /// The daemon could not be asked, or its answer could not be read: 502.
    fn gateway(e: impl std::fmt::Display) -> PageError {
        PageError {
            status: StatusCode::BAD_GATEWAY,
            message: e.to_string(),
        }
    }
}

impl From<anyhow::Error> for PageError {
    fn from(e: anyhow::Error) -> Self {
        PageError::gateway(format!("{e:#}"))
    }
}

/// One request to the daemon; its JSON answer, or its refusal as this page's: 404 for its
/// 404, 400 for its other 4xx, 502 for anything else.
async fn api(w: &Web, method: hyper::Method, path: &str) -> Result<Value, PageError> {
    let (status, v) = w.client.request(method, path, None).await?;
    if status.is_success() {
        return Ok(v);
    }
    let message = v["error"]["message"]
        .as_str()
        .map_or_else(|| format!("the daemon answered {status}"), str::to_owned);
    let status = match status.as_u16() {
        404 => StatusCode::NOT_FOUND,
        400..=499 => StatusCode::BAD_REQUEST,
        _ => StatusCode::BAD_GATEWAY,
    };
    Err(PageError { status, message })
}

async fn get(w: &Web, path: &str) -> Result<Value, PageError> {
    api(w, hyper::Method::GET, path).await
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let title = match self.status {
            StatusCode::NOT_FOUND => "Not found",
            StatusCode::BAD_REQUEST => "Not a valid request",
            _ => "The daemon did not answer",
        };
        let body = html::notice(
            title,
            &[
                &self.message,
                "Check that the daemon runs (`conduit ext status`), then reload this page.",
            ],
        );
        (self.status, Html(body.into_string())).into_response()
    }
}

type PageResult = Result<Response, PageError>;

fn page(p: Page<'_>, body: Markup) -> PageResult {
    Ok(Html(html::layout(&p, body).into_string()).into_response())
}

/// `/` is the extensions page.
pub(super) async fn home() -> Redirect {
    Redirect::to("/extensions")
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct TableQuery {
    sort: Option<String>,
    order: Option<String>,
    filter: Option<String>,
    offset: Option<usize>,
}

fn table_link(q: &TableQuery, sort: SortKey, desc: bool, offset: usize) -> String {
    let mut pairs = vec![
        ("sort", sort.as_str().to_owned()),
        ("order", if desc { "desc" } else { "asc" }.to_owned()),
    ];
    if let Some(f) = q.filter.as_ref().filter(|f| !f.is_empty()) {
        pairs.push(("filter", f.clone()));
    }
    if offset > 0 {
        pairs.push(("offset", offset.to_string()));
    }
    format!("/extensions?{}", fmt::query(&pairs))
}

/// The path and query of this request, for a form to come back to.
fn here(path: &str, query: Option<&str>) -> String {
    match query {
        Some(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path.to_owned(),
    }
}

pub(super) async fn extensions(
    State(w): State<Arc<Web>>,
    Query(q): Query<TableQuery>,
    uri: axum::http::Uri,
) -> PageResult {
    let sort = q
        .sort
        .as_deref()
        .and_then(SortKey::parse)
        .unwrap_or_default();
    let desc = q.order.as_deref() == Some("desc");
    let offset = q.offset.unwrap_or(0);
    let mut pairs = vec![
        ("sort", sort.as_str().to_owned()),
        ("order", if desc { "desc" } else { "asc" }.to_owned()),
        ("offset", offset.to_string()),
        ("limit", PAGE.to_string()),
    ];
    if let Some(f) = q.filter.as_ref().filter(|f| !f.is_empty()) {
        pairs.push(("filter", f.clone()));
    }
    let v = w
        .client
        .get(&format!("/v1/overview?{}", fmt::query(&pairs)))
        .await?;
    let o: Overview = serde_json::from_value(v).map_err(anyhow::Error::new)?;
    let back = here(uri.path(), uri.query());
    let now = o.at_ms;
    let t = &o.extensions;
    let s = &o.store;
    let mut work = std::collections::BTreeMap::<&str, u64>::new();
    for c in &s.work {
        *work.entry(c.state.as_str()).or_default() += c.n;
    }
    let header = |key: SortKey, label: &str| -> Markup {
        let (mark, next_desc) = if sort == key {
            (if desc { " ▼" } else { " ▲" }, !desc)
        } else {
            ("", !matches!(key, SortKey::Name | SortKey::State))
        };
        html! { th { a href=(table_link(&q, key, next_desc, 0)) { (label) (mark) } } }
    };
    let body = html! {
        h1 { "Extensions" }
        section.figures #figures data-live {
            span { (fmt::count(t.installed as u64)) " installed" }
            @for (state, n) in &t.by_state {
                span class=(state_class(state)) { (state) " " (n) }
            }
            @if t.degraded > 0 { span.warn { "degraded " (t.degraded) } }
            span { "events accepted " (fmt::count(s.latest_event_id.max(0) as u64)) }
            span class=[(s.unrouted > 0).then_some("warn")] {
                "unrouted " @if s.unrouted_capped { "≥" } (fmt::count(s.unrouted))
            }
            span { "work open " (fmt::count(work.get("open").copied().unwrap_or(0)))
                " · ready " (fmt::count(work.get("ready").copied().unwrap_or(0)))
                " · done " (fmt::count(work.get("done").copied().unwrap_or(0))) }
            span { "host loop " (fmt::latency_us(o.daemon.host_loop["last_pass_us"].as_u64().unwrap_or(0))) "/pass" }
            span.quiet { "daemon " (o.daemon.version) " pid " (o.daemon.pid) " up " (fmt::duration_ms(now - o.daemon.started_at_ms)) }
        }
        form.filter method="get" action="/extensions" {
            input type="search" name="filter" value=(q.filter.clone().unwrap_or_default())
                placeholder="filter by name, state or health" aria-label="filter";
            input type="hidden" name="sort" value=(sort.as_str());
            input type="hidden" name="order" value=(if desc { "desc" } else { "asc" });
            button type="submit" { "Filter" }
            @if q.filter.as_ref().is_some_and(|f| !f.is_empty()) {
                a href=(table_link(&TableQuery::default(), sort, desc, 0)) { "clear" }
            }
            span.quiet { (fmt::count(t.matched as u64)) " shown of " (fmt::count(t.installed as u64)) }
        }
        table.grid #extensions data-live {
            thead { tr {
                (header(SortKey::Name, "Name"))
                (header(SortKey::State, "State"))
                (header(SortKey::Health, "Health"))
                th { "PID" }
                (header(SortKey::Restarts, "Restarts"))
                (header(SortKey::Uptime, "Uptime"))
                (header(SortKey::InFlight, "In flight"))
                (header(SortKey::Rate, "Calls/min"))
                th { "Last 5 min" }
                (header(SortKey::P50, "p50"))
                (header(SortKey::P99, "p99"))
                (header(SortKey::Memory, "Memory"))
                (header(SortKey::Cpu, "CPU"))
                th { "Last exit" }
                th { "" }
            } }
            tbody {
                @for r in &t.rows {
                    @let g = &r.glance;
                    tr {
                        td { a href={"/extensions/" (fmt::percent(&r.name))} { (r.name) } }
                        td class=(state_class(g.state.as_str())) { (g.state.as_str()) }
                        td class=(state_class(r.health.map_or("", |h| h.as_str()))) { (r.health.map_or("-", |h| h.as_str())) }
                        td.num { (g.pid.map_or("-".to_owned(), |p| p.to_string())) }
                        td.num { (g.restarts) }
                        td.num { @let up = r.uptime_ms(now); @if up > 0 { (fmt::duration_ms(up)) } @else { "-" } }
                        td.num { (g.in_flight) }
                        td.num { (fmt::count(r.calls_last_min)) }
                        td { (spark(&g.calls.recent, 90, 16)) }
                        td.num { (fmt::latency_us(g.calls.p50_us)) }
                        td.num { (fmt::latency_us(g.calls.p99_us)) }
                        td.num { @match (g.rss_bytes, g.memory_limit) {
                            (Some(u), Some(l)) => { (fmt::bytes(u)) " / " (fmt::bytes(l)) }
                            (Some(u), None) => { (fmt::bytes(u)) }
                            _ => "-",
                        } }
                        td.num { @match (g.cpu, g.cpu_limit) {
                            (Some(u), Some(l)) => { (fmt::cpu(u)) " / " (fmt::cpu(l)) }
                            (Some(u), None) => { (fmt::cpu(u)) }
                            _ => "-",
                        } }
                        td { @if let Some(e) = &g.last_exit {
                            span title=(e.summary) { (e.brief()) } " " span.quiet { (fmt::ago(e.at_ms, now)) }
                        } }
                        td.actions {
                            (action(&format!("/extensions/{}/restart", fmt::percent(&r.name)), "Restart", &w.secrets.csrf, &back, "restart"))
                            @if r.enabled {
                                (action(&format!("/extensions/{}/disable", fmt::percent(&r.name)), "Disable", &w.secrets.csrf, &back, "disable"))
                            } @else {
                                (action(&format!("/extensions/{}/enable", fmt::percent(&r.name)), "Enable", &w.secrets.csrf, &back, "enable"))
                            }
                        }
                    }
                }
                @if t.rows.is_empty() {
                    tr { td colspan="15" {
                        @if t.installed == 0 { "No extension is installed: " code { "conduit ext install PATH" } }
                        @else { "No extension matches the filter." }
                    } }
                }
            }
        }
        nav.pages {
            @if offset > 0 {
                a href=(table_link(&q, sort, desc, offset.saturating_sub(PAGE as usize))) { "← previous" }
            }
            @if offset + t.rows.len() < t.matched {
                a href=(table_link(&q, sort, desc, offset + PAGE as usize)) { "next →" }
            }
        }
    };
    page(
        Page {
            title: "Extensions".to_owned(),
            section: "/extensions",
            live: true,
        },
        body,
    )
}

#[derive(Debug, Deserialize)]
pub(super) struct ActForm {
    back: Option<String>,
}

/// POST `/extensions/{name}/{restart|enable|disable}`: the API's action, then back.
pub(super) async fn act(
    State(w): State<Arc<Web>>,
    UrlPath((name, verb)): UrlPath<(String, String)>,
    Form(f): Form<ActForm>,
) -> PageResult {
    if !matches!(verb.as_str(), "restart" | "enable" | "disable") {
        return Err(PageError {
            status: StatusCode::NOT_FOUND,
            message: format!("no action {verb:?}: restart, enable or disable"),
        });
    }
    api(
        &w,
        hyper::Method::POST,
        &format!("/v1/extensions/{}/{verb}", fmt::percent(&name)),
    )
    .await?;
    let back = super::guard::local_path(f.back.as_deref().unwrap_or("/extensions")).to_owned();
    Ok(Redirect::to(&back).into_response())
}

pub(super) async fn extension(
    State(w): State<Arc<Web>>,
    UrlPath(name): UrlPath<String>,
    uri: axum::http::Uri,
) -> PageResult {
    let n = fmt::percent(&name);
    let (p1, p2, p3) = (
        format!("/v1/extensions/{n}"),
        format!("/v1/extensions/{n}/latency"),
        format!("/v1/extensions/{n}/logs?lines=60"),
    );
    let (view, latency, logs) = futures::join!(get(&w, &p1), get(&w, &p2), get(&w, &p3));
    let v: ExtensionView = serde_json::from_value(view?).map_err(PageError::gateway)?;
    let latency = latency?;
    let logs = logs.unwrap_or(Value::Null);
    let now = conduit_supervisor::now_ms();
    let s = &v.status;
    let back = here(uri.path(), uri.query());
    let bounds: Vec<u64> = latency["bounds_us"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let methods = latency["methods"].as_object().cloned().unwrap_or_default();
    let counts = |m: &Value| -> Vec<u64> {
        m["counts"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
    let mut all: Vec<u64> = vec![0; bounds.len() + 1];
    for m in methods.values() {
        for (i, c) in counts(m).iter().enumerate() {
            if let Some(slot) = all.get_mut(i) {
                *slot += c;
            }
        }
    }
    let log_lines = fmt::log_lines(&logs);
    let body = html! {
        h1 { (s.name) " " span.quiet { (s.version) } " — " span class=(state_class(s.state.as_str())) { (s.state.as_str()) }
            @if let Some(h) = &v.health { @if h.condition != crate::core::health::Condition::Healthy {
                ", " span class=(state_class(h.condition.as_str())) { (h.condition.as_str()) }
            } }
        }
        @if let Some(d) = &v.description { p.description { (d) } }
        div.actions {
            (action(&format!("/extensions/{n}/restart"), "Restart", &w.secrets.csrf, &back, "restart"))
            @if v.enabled {
                (action(&format!("/extensions/{n}/disable"), "Disable", &w.secrets.csrf, &back, "disable"))
            } @else {
                (action(&format!("/extensions/{n}/enable"), "Enable", &w.secrets.csrf, &back, "enable"))
            }
        }
        section #status data-live {
            table.facts {
                tr { th { "pid" } td { (s.pid.map_or("-".to_owned(), |p| p.to_string())) } }
                tr { th { "restarts" } td { (s.restarts) } }
                tr { th { "ready since" } td { (when(s.ready_since_ms, now)) } }
                @if let Some(t) = s.next_start_at_ms { tr { th { "next start" } td { "in " (fmt::duration_ms(t - now)) } } }
                tr { th { "last exit" } td { (s.last_exit.map_or("-".to_owned(), |e| e.to_string())) } }
                @if let Some(e) = &s.last_error { tr { th { "last error" } td.bad { (e) } } }
                @if let Some(ms) = s.spawn_to_ready_ms { tr { th { "cold start" } td { (ms) " ms (handshake " (s.handshake_ms.unwrap_or(0)) " ms)" } } }
                tr { th { "installed" } td { (when(Some(v.installed_at_ms as i64), now)) } }
                @if let Some(h) = &v.health {
                    tr { th { "health" } td class=(state_class(h.condition.as_str())) {
                        (h.condition.as_str())
                        @if let Some(t) = h.since_ms { " since " (fmt::ago(t, now)) }
                        @if let Some(r) = &h.reason { ": " (r) }
                        " (" (h.failures) " of " (h.unresponsive_after) " failures; " (h.unresponsive_restarts) " restarts for being unresponsive)"
                    } }
                }
            }
            @if let Some(r) = &s.resources {
                h2 { "Limits" }
                table.facts {
                    tr { th { "memory" } td { @if let Some(u) = &r.usage { (fmt::bytes(u.rss_bytes)) " of " } (fmt::bytes(r.limits.memory)) } }
                    tr { th { "CPU" } td { @if let Some(u) = &r.usage { (fmt::cpu(u.cpu)) " of " } (fmt::cpu(r.limits.cpu)) } }
                    tr { th { "tasks" } td { @if let Some(u) = &r.usage { (u.tasks) " of " } (r.limits.tasks) } }
                    tr { th { "open files" } td { (r.limits.open_files) " per process" } }
                    tr { th { "enforced by" } td { (r.mechanism) } }
                    tr { th { "stops over a limit" } td { (r.limit_stops) } }
                }
            }
            h2 { "Calls" }
            @if s.calls.is_empty() { p.quiet { "No calls since the daemon started it." } } @else {
                table.grid {
                    thead { tr { th { "method" } th { "count" } th { "errors" } th { "p50" } th { "p95" } th { "p99" } th { "max" } } }
                    tbody { @for (m, c) in &s.calls { tr {
                        td { code { (m) } } td.num { (fmt::count(c.count)) } td class={"num" @if c.errors > 0 { " bad" }} { (fmt::count(c.errors)) }
                        td.num { (fmt::latency_us(c.p50_us)) } td.num { (fmt::latency_us(c.p95_us)) }
                        td.num { (fmt::latency_us(c.p99_us)) } td.num { (fmt::latency_us(c.max_us)) }
                    } } }
                }
                h2 { "Latency" }
                figure { (histogram(&bounds, &all)) figcaption { "every method, since the daemon started it" } }
                @if methods.len() > 1 {
                    @for (m, h) in &methods {
                        figure { (histogram(&bounds, &counts(h))) figcaption { code { (m) } } }
                    }
                }
            }
            h2 { "Recent exits" }
            @if s.recent_exits.is_empty() { p.quiet { "None since the daemon started." } } @else {
                table.grid {
                    thead { tr { th { "when" } th { "pid" } th { "cause" } th { "what happened" } th { "calls in flight" } } }
                    tbody { @for e in &s.recent_exits { tr {
                        td { (when(Some(e.at_ms), now)) } td.num { (e.pid) } td { (e.cause.as_str()) } td { (e.summary) }
                        td { @for c in &e.in_flight { code { (c.method) } " (" (fmt::duration_ms(c.age_ms as i64)) ") " } }
                    } } }
                }
            }
            h2 { "Log" span.quiet { " (the last " (log_lines.len()) " lines; " code { "conduit ext logs " (s.name) } " for more)" } }
            pre.log { @for l in &log_lines { (l) "\n" } }
        }
    };
    page(
        Page {
            title: s.name.clone(),
            section: "/extensions",
            live: true,
        },
        body,
    )
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct WorkQuery {
    state: Option<String>,
    kind: Option<String>,
    before: Option<i64>,
}

fn work_link(state: Option<&str>, kind: Option<&str>, before: Option<i64>) -> String {
    let mut pairs = Vec::new();
    if let Some(s) = state.filter(|s| !s.is_empty()) {
        pairs.push(("state", s.to_owned()));
    }
    if let Some(k) = kind.filter(|k| !k.is_empty()) {
        pairs.push(("kind", k.to_owned()));
    }
    if let Some(b) = before {
        pairs.push(("before", b.to_string()));
    }
    if pairs.is_empty() {
        "/work".to_owned()
    } else {
        format!("/work?{}", fmt::query(&pairs))
    }
}

pub(super) async fn work(State(w): State<Arc<Web>>, Query(q): Query<WorkQuery>) -> PageResult {
    let state = q.state.as_deref().filter(|s| !s.is_empty());
    let kind = q.kind.as_deref().filter(|k| !k.is_empty());
    let mut pairs = vec![("limit", PAGE.to_string())];
    if let Some(s) = state {
        pairs.push(("state", s.to_owned()));
    }
    if let Some(k) = kind {
        pairs.push(("kind", k.to_owned()));
    }
    if let Some(b) = q.before {
        pairs.push(("before", b.to_string()));
    }
    let v = w
        .client
        .get(&format!("/v1/work/recent?{}", fmt::query(&pairs)))
        .await?;
    let now = conduit_supervisor::now_ms();
    let rows = v["work"].as_array().cloned().unwrap_or_default();
    let counts = v["counts"].as_array().cloned().unwrap_or_default();
    let mut by_state = std::collections::BTreeMap::<String, u64>::new();
    let mut kinds = std::collections::BTreeMap::<String, u64>::new();
    for c in &counts {
        let (k, s, n) = (
            c["kind"].as_str().unwrap_or(""),
            c["state"].as_str().unwrap_or(""),
            c["n"].as_u64().unwrap_or(0),
        );
        if kind.is_none_or(|want| want == k) {
            *by_state.entry(s.to_owned()).or_default() += n;
        }
        *kinds.entry(k.to_owned()).or_default() += n;
    }
    let total: u64 = by_state.values().sum();
    let body = html! {
        h1 { "Work" @if let Some(k) = kind { " of kind " code { (k) } } }
        nav.tabs {
            a href=(work_link(None, kind, None)) class=[state.is_none().then_some("here")] { "all " span.quiet { (fmt::count(total)) } }
            @for s in ["open", "ready", "done"] {
                a href=(work_link(Some(s), kind, None)) class=[(state == Some(s)).then_some("here")] {
                    (s) " " span.quiet { (fmt::count(by_state.get(s).copied().unwrap_or(0))) }
                }
            }
        }
        form.filter method="get" action="/work" {
            @if let Some(s) = state { input type="hidden" name="state" value=(s); }
            label { "kind "
                select name="kind" {
                    option value="" selected[kind.is_none()] { "every kind" }
                    @for (k, n) in &kinds {
                        option value=(k) selected[kind == Some(k.as_str())] { (k) " (" (fmt::count(*n)) ")" }
                    }
                }
            }
            button type="submit" { "Show" }
        }
        table.grid #work data-live {
            thead { tr { th { "id" } th { "kind" } th { "key" } th { "state" } th { "inputs" } th { "opened" } th { "updated" } } }
            tbody {
                @for r in &rows { tr {
                    td.num { a href={"/work/" (r["id"])} { (r["id"]) } }
                    td { (r["kind"].as_str().unwrap_or("")) }
                    td { (r["key"].as_str().unwrap_or("")) }
                    td class=(state_class(r["state"].as_str().unwrap_or(""))) { (r["state"].as_str().unwrap_or("")) }
                    td.num { (fmt::count(r["inputs"].as_u64().unwrap_or(0))) }
                    td { (when(r["created_at_ms"].as_i64(), now)) }
                    td { (when(r["updated_at_ms"].as_i64(), now)) }
                } }
                @if rows.is_empty() { tr { td colspan="7" { "No Work here." } } }
            }
        }
        nav.pages {
            @if q.before.is_some() { a href=(work_link(state, kind, None)) { "← newest" } }
            @if let Some(next) = v["next_before"].as_i64() { a href=(work_link(state, kind, Some(next))) { "older →" } }
        }
    };
    page(
        Page {
            title: "Work".to_owned(),
            section: "/work",
            live: q.before.is_none(),
        },
        body,
    )
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct AfterQuery {
    after: Option<i64>,
}

pub(super) async fn one_work(
    State(w): State<Arc<Web>>,
    UrlPath(id): UrlPath<i64>,
    Query(q): Query<AfterQuery>,
) -> PageResult {
    let mut path = format!("/v1/work/{id}/events?limit={PAGE}");
    if let Some(a) = q.after {
        path.push_str(&format!("&after={a}"));
    }
    let v = get(&w, &path).await?;
    let now = conduit_supervisor::now_ms();
    let wk = &v["work"];
    let events = v["events"].as_array().cloned().unwrap_or_default();
    let inputs = wk["inputs"].as_u64().unwrap_or(0);
    let body = html! {
        h1 { "Work " (id) " — " span class=(state_class(wk["state"].as_str().unwrap_or(""))) { (wk["state"].as_str().unwrap_or("")) } }
        table.facts {
            tr { th { "kind" } td { a href=(work_link(None, wk["kind"].as_str(), None)) { (wk["kind"].as_str().unwrap_or("")) } } }
            tr { th { "key" } td { (wk["key"].as_str().unwrap_or("")) } }
            tr { th { "opened" } td { (when(wk["created_at_ms"].as_i64(), now)) } }
            tr { th { "updated" } td { (when(wk["updated_at_ms"].as_i64(), now)) } }
            tr { th { "inputs" } td { (fmt::count(inputs)) " events" } }
        }
        h2 { "Events" }
        table.grid #events {
            thead { tr { th { "id" } th { "source" } th { "delivery" } th { "kind" } th { "accepted" } th { "routed" } th { "payload" } } }
            tbody {
                @for e in &events { tr {
                    td.num { (e["id"]) }
                    td { (e["source"].as_str().unwrap_or("")) }
                    td { (e["delivery_id"].as_str().unwrap_or("")) }
                    td { (e["kind"].as_str().unwrap_or("")) }
                    td { (when(e["accepted_at_ms"].as_i64(), now)) }
                    td { (when(e["routed_at_ms"].as_i64(), now)) }
                    td { (json_block(&e["payload"], 4096)) }
                } }
                @if events.is_empty() { tr { td colspan="7" { "No events here." } } }
            }
        }
        nav.pages {
            @if q.after.is_some() { a href={"/work/" (id)} { "← first" } }
            @if events.len() == PAGE as usize {
                @if let Some(next) = v["next_after"].as_i64() { a href={"/work/" (id) "?after=" (next)} { "next →" } }
            }
        }
    };
    page(
        Page {
            title: format!("Work {id}"),
            section: "/work",
            live: false,
        },
        body,
    )
}

/// The columns of a record list: (title, field, how it is shown).
#[derive(Clone, Copy)]
enum Shown {
    Text,
    Time,
    State,
    Json,
    Bytes,
}

struct Records {
    title: &'static str,
    section: &'static str,
    api: &'static str,
    key: &'static str,
    /// Newest first, paged by `before` (artifacts), or oldest first, paged by `after`.
    newest_first: bool,
    columns: &'static [(&'static str, &'static str, Shown)],
    empty: &'static str,
}

const TIMERS: Records = Records {
    title: "Timers",
    section: "/timers",
    api: "/v1/timers",
    key: "timers",
    newest_first: false,
    columns: &[
        ("id", "id", Shown::Text),
        ("extension", "extension", Shown::Text),
        ("recurrence", "recurrence", Shown::Text),
        ("spec", "spec", Shown::Text),
        ("next", "next_at_ms", Shown::Time),
        ("last fired", "last_fired_at_ms", Shown::Time),
        ("created", "created_at_ms", Shown::Time),
    ],
    empty: "No timers. `conduit timers add RECURRENCE SPEC` makes one.",
};

const WAITS: Records = Records {
    title: "Waits",
    section: "/waits",
    api: "/v1/waits",
    key: "waits",
    newest_first: false,
    columns: &[
        ("id", "id", Shown::Text),
        ("extension", "extension", Shown::Text),
        ("filter", "filter", Shown::Text),
        ("subject", "subject", Shown::Text),
        ("work", "work_id", Shown::Text),
        ("state", "state", Shown::State),
        ("satisfied by event", "satisfied_by_event_id", Shown::Text),
        ("created", "created_at_ms", Shown::Time),
    ],
    empty: "No waits. `conduit waits add FILTER SUBJECT` makes one.",
};

const EMISSIONS: Records = Records {
    title: "Emissions",
    section: "/emissions",
    api: "/v1/emissions",
    key: "emissions",
    newest_first: false,
    columns: &[
        ("id", "id", Shown::Text),
        ("extension", "extension", Shown::Text),
        ("emission", "emission", Shown::Text),
        ("state", "state", Shown::State),
        ("commit", "commit_id", Shown::Text),
        ("error", "error", Shown::Text),
        ("payload", "payload", Shown::Json),
        ("planned", "planned_at_ms", Shown::Time),
        ("finished", "finished_at_ms", Shown::Time),
    ],
    empty: "No emissions. `conduit emissions add EMISSION PAYLOAD` plans one.",
};

const ARTIFACTS: Records = Records {
    title: "Artifacts",
    section: "/artifacts",
    api: "/v1/artifacts",
    key: "artifacts",
    newest_first: true,
    columns: &[
        ("id", "id", Shown::Text),
        ("name", "name", Shown::Text),
        ("size", "size", Shown::Bytes),
        ("type", "media_type", Shown::Text),
        ("extension", "extension", Shown::Text),
        ("sha256", "sha256", Shown::Text),
        ("created", "created_at_ms", Shown::Time),
    ],
    empty: "No artifacts.",
};

#[derive(Debug, Default, Deserialize)]
pub(super) struct CursorQuery {
    after: Option<i64>,
    before: Option<i64>,
}

async fn records(w: &Web, r: &Records, q: &CursorQuery) -> PageResult {
    let (cursor_name, cursor) = if r.newest_first {
        ("before", q.before)
    } else {
        ("after", q.after)
    };
    let mut path = format!("{}?limit={PAGE}", r.api);
    if let Some(c) = cursor {
        path.push_str(&format!("&{cursor_name}={c}"));
    }
    let v = get(w, &path).await?;
    let now = conduit_supervisor::now_ms();
    let rows = v[r.key].as_array().cloned().unwrap_or_default();
    let next = if r.newest_first {
        v["next_before"].as_i64()
    } else {
        (rows.len() == PAGE as usize)
            .then(|| v["next_after"].as_i64())
            .flatten()
    };
    let cell = |row: &Value, field: &str, shown: Shown| -> Markup {
        let v = &row[field];
        match shown {
            Shown::Time => when(v.as_i64(), now),
            Shown::State => {
                let s = v.as_str().unwrap_or("");
                html! { span class=(state_class(s)) { (s) } }
            }
            Shown::Json => json_block(v, 2048),
            Shown::Bytes => html! { (v.as_u64().map_or("-".to_owned(), fmt::bytes)) },
            Shown::Text => match v {
                Value::Null => html! { span.quiet { "-" } },
                Value::String(s) => html! { (s) },
                other => html! { (other.to_string()) },
            },
        }
    };
    let body = html! {
        h1 { (r.title) }
        table.grid #records data-live {
            thead { tr { @for (title, _, _) in r.columns { th { (title) } } } }
            tbody {
                @for row in &rows { tr { @for (_, field, shown) in r.columns { td { (cell(row, field, *shown)) } } } }
                @if rows.is_empty() { tr { td colspan=(r.columns.len()) { (r.empty) } } }
            }
        }
        nav.pages {
            @if cursor.is_some() { a href=(r.section) { "← first page" } }
            @if let Some(n) = next { a href={(r.section) "?" (cursor_name) "=" (n)} { "next →" } }
        }
    };
    page(
        Page {
            title: r.title.to_owned(),
            section: r.section,
            live: cursor.is_none(),
        },
        body,
    )
}

pub(super) async fn timers(State(w): State<Arc<Web>>, Query(q): Query<CursorQuery>) -> PageResult {
    records(&w, &TIMERS, &q).await
}

pub(super) async fn waits(State(w): State<Arc<Web>>, Query(q): Query<CursorQuery>) -> PageResult {
    records(&w, &WAITS, &q).await
}

pub(super) async fn emissions(
    State(w): State<Arc<Web>>,
    Query(q): Query<CursorQuery>,
) -> PageResult {
    records(&w, &EMISSIONS, &q).await
}

pub(super) async fn artifacts(
    State(w): State<Arc<Web>>,
    Query(q): Query<CursorQuery>,
) -> PageResult {
    records(&w, &ARTIFACTS, &q).await
}

/// The doctor's checks, one row each with what was found and the command that fixes it.
pub(super) async fn doctor(State(w): State<Arc<Web>>) -> PageResult {
    let report = crate::doctor::run(&w.doctor).await;
    let class = |s: crate::doctor::Status| match s {
        crate::doctor::Status::Ok => "ok",
        crate::doctor::Status::Warn => "warn",
        crate::doctor::Status::Fail => "bad",
    };
    let body = html! {
        h1 { "Doctor " span class=(class(report.status)) { "— " (report.status.as_str()) } }
        p.quiet { "Every installation check of " code { "conduit doctor" } ", run now; it changes nothing." }
        table.grid #doctor {
            thead { tr { th { "check" } th { "status" } th { "found" } th { "fix" } } }
            tbody { @for c in &report.checks { tr {
                td { (c.name) }
                td class=(class(c.status)) { (c.status.as_str()) }
                td { (c.found) }
                td { @if let Some(f) = &c.fix { code { (f) } } }
            } } }
        }
    };
    page(
        Page {
            title: "Doctor".to_owned(),
            section: "/doctor",
            live: false,
        },
        body,
    )
}
