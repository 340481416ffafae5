//! The Work pages of `conduit web`: Work newest first by state and kind (with the counts the
//! store keeps), and one Work with a page of its events. Every list is a page the daemon reads
//! from indexes; the links carry the filters and the next page's cursor.

use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use maud::html;
use serde::Deserialize;

use super::html::{Page, json_block, state_class, when};
use super::shared::{PAGE, PageResult, Web, get, page};
use crate::views::fmt;

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
