//! The extension pages of `conduit web`: the extensions table (the overview's, with
//! restart/enable/disable), one extension (status, limits, health, calls, latency histograms,
//! recent exits, log tail), and the actions, POSTs (the guard has checked their CSRF token
//! before they reach here) that go back to the page they came from.
//!
//! A page's links carry its sort, filter and offset, so it works the same with JavaScript off.

use std::sync::Arc;

use axum::extract::{Form, Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;

use super::html::{Page, action, histogram, spark, state_class, when};
use super::shared::{PAGE, PageError, PageResult, Web, api, get, page};
use crate::daemon::handle::ExtensionView;
use crate::daemon::overview::{Overview, SortKey};
use crate::views::fmt;

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

/// An extension's buttons: Restart and Disable while it is enabled, Enable while it is not
/// (the daemon refuses to restart a disabled package).
fn buttons(name: &str, enabled: bool, csrf: &str, back: &str) -> Markup {
    let to = |verb: &str| format!("/extensions/{}/{verb}", fmt::percent(name));
    html! {
        @if enabled {
            (action(&to("restart"), "Restart", csrf, back, "restart"))
            (action(&to("disable"), "Disable", csrf, back, "disable"))
        } @else {
            (action(&to("enable"), "Enable", csrf, back, "enable"))
        }
    }
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
                        td.actions { (buttons(&r.name, r.enabled, &w.secrets.csrf, &back)) }
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
        div.actions { (buttons(&s.name, v.enabled, &w.secrets.csrf, &back)) }
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
