//! The record lists of `conduit web` (timers, waits, emissions, artifacts: one table each,
//! described by a [`Records`]) and the doctor page (`crate::doctor`, the checks of
//! `conduit doctor`, run on each load).

use std::sync::Arc;

use axum::extract::{Query, State};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;

use super::html::{Page, json_block, state_class, when};
use super::shared::{PAGE, PageResult, Web, get, page};
use crate::views::fmt;

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
