//! `conduit timers|waits|emissions list` and `… show ID`: what was created, and how it went
//! (`GET /v1/<records>` and `GET /v1/<records>/{id}` of `api/records.rs`).
//!
//! Like `events list`, these ask the daemon when it runs and read `conduit.db` directly when it
//! does not.

use std::fmt::Write as _;
use std::process::ExitCode;

use conduit_supervisor::log::utc_timestamp;
use serde_json::{Value, json};

use super::common::{StateArgs, api_error, daemon, print_json, runtime};
use super::outcome::{CliError, print};

/// Which table.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Timers,
    Waits,
    Emissions,
}

impl Kind {
    fn plural(self) -> &'static str {
        match self {
            Kind::Timers => "timers",
            Kind::Waits => "waits",
            Kind::Emissions => "emissions",
        }
    }

    fn singular(self) -> &'static str {
        match self {
            Kind::Timers => "timer",
            Kind::Waits => "wait",
            Kind::Emissions => "emission",
        }
    }
}

/// List them, oldest first, in every state.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Exit codes: 0 listed (with or without a daemon); 1 the store or the daemon failed; 2 --limit not
1 to 200")]
pub(crate) struct ListArgs {
    /// Only those with a larger id (for paging: the previous page's last id).
    #[arg(long)]
    pub(crate) after: Option<i64>,
    /// How many, 1 to 200.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=200))]
    pub(crate) limit: u32,
    /// Print the page as the API answers it: {"timers" (or "waits", "emissions",
    /// "artifacts"): [...], "next_after"}.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Show one, with everything recorded about it.
#[derive(Debug, clap::Args)]
#[command(after_help = "Exit codes: 0 shown; 1 the store or the daemon failed; 2 no such id")]
pub(crate) struct ShowArgs {
    /// Its id, as `add` printed it.
    id: i64,
    /// Print it as JSON.
    #[arg(long)]
    json: bool,
}

fn read_store(
    state: &conduit_host::state_dir::StateDir,
    f: impl FnOnce(&conduit_store::ReadTx<'_>) -> Result<Value, conduit_store::StoreError>
    + Send
    + 'static,
    empty: Value,
) -> Result<Value, CliError> {
    let db = state.path().join("conduit.db");
    if !db.exists() {
        return Ok(empty);
    }
    // Read only: without a daemon, a list never migrates or creates anything.
    conduit_store::read_only(&db, f).map_err(CliError::failure)
}

fn fetch_list(kind: Kind, args: &ListArgs, state: &StateArgs) -> Result<Value, CliError> {
    let state = state.open_read_only()?;
    let rt = runtime()?;
    if let Some(client) = daemon(&rt, &state) {
        let mut path = format!("/v1/{}?limit={}", kind.plural(), args.limit);
        if let Some(a) = args.after {
            path.push_str(&format!("&after={a}"));
        }
        return rt.block_on(client.get(&path)).map_err(CliError::failure);
    }
    let (after, limit) = (args.after, args.limit);
    let key = kind.plural();
    read_store(
        &state,
        move |r| {
            let rows = match kind {
                Kind::Timers => serde_json::to_value(r.list_timers(after, limit)?),
                Kind::Waits => serde_json::to_value(r.list_waits(after, limit)?),
                Kind::Emissions => serde_json::to_value(r.list_emissions(after, limit)?),
            }
            .unwrap_or(Value::Null);
            let next = rows
                .as_array()
                .and_then(|a| a.last())
                .map(|v| v["id"].clone());
            Ok(json!({ key: rows, "next_after": next }))
        },
        json!({ key: [], "next_after": null }),
    )
}

fn fetch_one(kind: Kind, id: i64, state: &StateArgs) -> Result<Value, CliError> {
    let state = state.open_read_only()?;
    let rt = runtime()?;
    let missing = || {
        CliError::usage(anyhow::anyhow!(
            "no {} {id}; `conduit {} list` shows them",
            kind.singular(),
            kind.plural()
        ))
    };
    if let Some(client) = daemon(&rt, &state) {
        let (code, v) = rt
            .block_on(client.request(
                hyper::Method::GET,
                &format!("/v1/{}/{id}", kind.plural()),
                None,
            ))
            .map_err(CliError::failure)?;
        if code == hyper::StatusCode::NOT_FOUND {
            return Err(missing());
        }
        if !code.is_success() {
            return Err(api_error(code, &v));
        }
        return Ok(v);
    }
    let v = read_store(
        &state,
        move |r| {
            Ok(match kind {
                Kind::Timers => serde_json::to_value(r.timer(id)?),
                Kind::Waits => serde_json::to_value(r.wait(id)?),
                Kind::Emissions => serde_json::to_value(r.emission(id)?),
            }
            .unwrap_or(Value::Null))
        },
        Value::Null,
    )?;
    if v.is_null() { Err(missing()) } else { Ok(v) }
}

fn when(v: &Value) -> String {
    v.as_i64().map_or("-".to_owned(), utc_timestamp)
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(crate) fn list(kind: Kind, args: ListArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let v = fetch_list(kind, &args, state)?;
    if args.json {
        print_json(&v)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows = v[kind.plural()].as_array().cloned().unwrap_or_default();
    use super::table::{Align, render};
    let l = Align::Left;
    let (headers, align, cells): (&[&str], &[Align], Vec<Vec<String>>) = match kind {
        Kind::Timers => (
            &[
                "ID",
                "EXTENSION",
                "RECURRENCE",
                "SPEC",
                "NEXT",
                "LAST FIRED",
            ],
            &[Align::Right, l, l, l, l, l],
            rows.iter()
                .map(|t| {
                    let next = if t["deleted_at_ms"].is_i64() {
                        format!("deleted {}", when(&t["deleted_at_ms"]))
                    } else if t["next_at_ms"].is_null() {
                        "stopped".to_owned()
                    } else {
                        when(&t["next_at_ms"])
                    };
                    vec![
                        text(&t["id"]),
                        text(&t["extension"]),
                        text(&t["recurrence"]),
                        text(&t["spec"]),
                        next,
                        when(&t["last_fired_at_ms"]),
                    ]
                })
                .collect(),
        ),
        Kind::Waits => (
            &[
                "ID",
                "EXTENSION",
                "FILTER",
                "SUBJECT",
                "STATE",
                "SATISFIED BY",
            ],
            &[Align::Right, l, l, l, l, l],
            rows.iter()
                .map(|w| {
                    let by = match w["satisfied_by_event_id"].as_i64() {
                        Some(e) => format!("event {e} at {}", when(&w["satisfied_at_ms"])),
                        None if w["cancelled_at_ms"].is_i64() => {
                            format!("- (cancelled at {})", when(&w["cancelled_at_ms"]))
                        }
                        None => "-".to_owned(),
                    };
                    vec![
                        text(&w["id"]),
                        text(&w["extension"]),
                        text(&w["filter"]),
                        text(&w["subject"]),
                        text(&w["state"]),
                        by,
                    ]
                })
                .collect(),
        ),
        Kind::Emissions => (
            &["ID", "EXTENSION", "EMISSION", "STATE", "FINISHED", "ERROR"],
            &[Align::Right, l, l, l, l, l],
            rows.iter()
                .map(|e| {
                    vec![
                        text(&e["id"]),
                        text(&e["extension"]),
                        text(&e["emission"]),
                        text(&e["state"]),
                        when(&e["finished_at_ms"]),
                        e["error"].as_str().unwrap_or("-").to_owned(),
                    ]
                })
                .collect(),
        ),
    };
    let mut out = render(headers, align, &cells);
    if rows.is_empty() {
        out = format!(
            "no {}; `conduit {} add …` creates one\n",
            kind.plural(),
            kind.plural()
        );
    }
    print(&out)?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn show(kind: Kind, args: ShowArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let v = fetch_one(kind, args.id, state)?;
    if args.json {
        print_json(&v)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = format!("{} {}\n", kind.singular(), args.id);
    if let Some(map) = v.as_object() {
        for (k, val) in map {
            if k == "id" {
                continue;
            }
            if let Value::Array(items) = val
                && !items.is_empty()
            {
                let _ = writeln!(out, "  {k}");
                for i in items {
                    let _ = writeln!(out, "    {i}");
                }
                continue;
            }
            let shown = if k.ends_with("_ms") && val.is_i64() {
                format!("{} ({})", when(val), val)
            } else if val.is_array() {
                "[]".to_owned()
            } else {
                text(val)
            };
            let _ = writeln!(out, "  {k:<22} {shown}");
        }
    }
    print(&out)?;
    Ok(ExitCode::SUCCESS)
}
