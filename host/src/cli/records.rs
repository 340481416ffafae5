//! `conduit events …`, `conduit work …`, `conduit timers add`, `conduit waits add`,
//! `conduit emissions add`, `conduit artifacts get`: the coordination core from the command line,
//! the client of the records' endpoints (`api/records.rs`); `records_lists.rs` lists and shows
//! timers, waits and emissions.
//!
//! Writes go through the running daemon (it owns the database's one writer); lists come from
//! the daemon when it runs and straight from the database when it does not.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::{Value, json};

use super::common::{StateArgs, api_error, daemon, need_daemon, print_json, runtime};
use super::outcome::{CliError, print};

/// POST and print the answer; an API error with a 4xx status is a usage error.
fn post(
    args_state: &StateArgs,
    path: &str,
    body: &Value,
    json_out: bool,
    human: impl Fn(&Value) -> String,
) -> Result<ExitCode, CliError> {
    let state = args_state.open_read_only()?;
    let rt = runtime()?;
    let client = need_daemon(&rt, &state)?;
    let (code, v) = rt
        .block_on(client.request(hyper::Method::POST, path, Some(body)))
        .map_err(CliError::failure)?;
    if !code.is_success() {
        return Err(api_error(code, &v));
    }
    let text = human(&v);
    if json_out {
        print_json(&v)?
    } else {
        print(&text)?
    }
    Ok(ExitCode::SUCCESS)
}

/// Push an event, as an extension's ingress would.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Answered only after the event is committed; pushing the same --source and --delivery-id again
is safe (the first event's id comes back, marked duplicate). The body is capped at 1 MiB, and the
payload at 64 levels of nested arrays and objects.

Exit codes: 0 accepted (or a duplicate); 2 invalid (fields, JSON, size); 3 no daemon is running")]
pub(crate) struct PushArgs {
    #[arg(long)]
    source: String,
    #[arg(long)]
    delivery_id: String,
    /// The event's kind, e.g. `note.posted` (the part before the first `.` picks the work kind).
    #[arg(long)]
    kind: String,
    /// The payload as JSON.
    #[arg(long, conflicts_with = "payload_file")]
    payload: Option<String>,
    /// Read the payload from a file (`-` for stdin).
    #[arg(long)]
    payload_file: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub(crate) fn push(args: PushArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let text = match (&args.payload, &args.payload_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) if f.as_os_str() == "-" => std::io::read_to_string(std::io::stdin())
            .context("cannot read stdin")
            .map_err(CliError::usage)?,
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read {}", f.display()))
            .map_err(CliError::usage)?,
        (None, None) => "{}".into(),
    };
    conduit_protocol::check_payload_depth(&text).map_err(CliError::usage)?;
    let payload: Value = serde_json::from_str(&text)
        .context("the payload is not JSON")
        .map_err(CliError::usage)?;
    let body = json!({ "source": args.source, "delivery_id": args.delivery_id, "kind": args.kind, "payload": payload });
    post(state, "/v1/events", &body, args.json, |v| {
        // Said on stderr, also with --json (where it is the answer's `warning` too).
        if let Some(w) = v["warning"].as_str() {
            eprintln!("warning: {w}");
        }
        if v["duplicate"] == true {
            format!("duplicate of event {}\n", v["event_id"])
        } else {
            format!("accepted event {}\n", v["event_id"])
        }
    })
}

/// List events or Work, oldest first.
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// Only those with a larger id (for paging: the previous page's last id).
    #[arg(long)]
    after: Option<i64>,
    /// How many, 1 to 200.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=200))]
    limit: u32,
    /// Events only: only those from this source.
    #[arg(long)]
    source: Option<String>,
    #[arg(long)]
    json: bool,
}

fn list(args: &ListArgs, what: &str, state: &StateArgs) -> Result<Value, CliError> {
    let state = state.open_read_only()?;
    let rt = runtime()?;
    if let Some(client) = daemon(&rt, &state) {
        let mut path = format!("/v1/{what}?limit={}", args.limit);
        if let Some(a) = args.after {
            path.push_str(&format!("&after={a}"));
        }
        if let Some(s) = &args.source {
            path.push_str(&format!("&source={}", url_escape(s)));
        }
        return rt.block_on(client.get(&path)).map_err(CliError::failure);
    }
    let db = state.path().join("conduit.db");
    if !db.exists() {
        return Ok(json!({ what: [] }));
    }
    // Read only: without a daemon, a list never migrates or creates anything.
    let (after, limit, source) = (args.after, args.limit, args.source.clone());
    let v = conduit_store::read_only(&db, |r| {
        Ok(if what == "events" {
            // Without a daemon nothing routes: what is not routed waits for one.
            let owners = conduit_host::daemon::routes::Owners::no_daemon();
            let events: Vec<Value> = r
                .list_events(after, source.as_deref(), limit)?
                .iter()
                .map(|e| owners.annotate(e))
                .collect();
            json!({ "events": events })
        } else {
            json!({ "work": r.list_work(after, limit)? })
        })
    })
    .map_err(CliError::failure)?;
    Ok(v)
}

fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub(crate) fn list_events(args: ListArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let v = list(&args, "events", state)?;
    if args.json {
        print_json(&v)?;
        return Ok(ExitCode::SUCCESS);
    }
    use super::table::{Align, render};
    let rows: Vec<Vec<String>> = v["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let payload: String = e["payload"].to_string().chars().take(40).collect();
            // In a Work, in none, or waiting and for whom (the daemon's `route`).
            let route =
                serde_json::from_value::<conduit_host::daemon::routes::Route>(e["route"].clone())
                    .map_or_else(
                        |_| {
                            e["work_id"]
                                .as_i64()
                                .map_or("-".into(), |w| format!("work {w}"))
                        },
                        |r| r.short(),
                    );
            vec![
                e["id"].as_i64().unwrap_or(0).to_string(),
                e["source"].as_str().unwrap_or("").to_owned(),
                e["delivery_id"].as_str().unwrap_or("").to_owned(),
                e["kind"].as_str().unwrap_or("").to_owned(),
                route,
                payload,
            ]
        })
        .collect();
    let left = Align::Left;
    print(&render(
        &["ID", "SOURCE", "DELIVERY", "KIND", "ROUTE", "PAYLOAD"],
        &[Align::Right, left, left, left, left, left],
        &rows,
    ))?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn list_work(args: ListArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let v = list(&args, "work", state)?;
    if args.json {
        print_json(&v)?;
        return Ok(ExitCode::SUCCESS);
    }
    use super::table::{Align, render};
    let rows: Vec<Vec<String>> = v["work"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            let ids: Vec<String> = w["event_ids"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|i| i.to_string())
                .collect();
            vec![
                w["id"].as_i64().unwrap_or(0).to_string(),
                w["kind"].as_str().unwrap_or("").to_owned(),
                w["key"].as_str().unwrap_or("").to_owned(),
                match w["closed_at_ms"].is_i64() {
                    true => format!("{} (closed)", w["state"].as_str().unwrap_or("")),
                    false => w["state"].as_str().unwrap_or("").to_owned(),
                },
                ids.join(","),
            ]
        })
        .collect();
    let left = Align::Left;
    print(&render(
        &["ID", "KIND", "KEY", "STATE", "EVENTS"],
        &[Align::Right, left, left, left, left],
        &rows,
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// Create a timer whose recurrence an extension serves (`recurrence.next` decides each next firing).
#[derive(Debug, clap::Args)]
pub(crate) struct TimerArgs {
    /// The recurrence, e.g. `digest`.
    recurrence: String,
    /// Its spec, e.g. `every 15m` or `30 7 * * *`.
    spec: String,
    /// The extension serving it (default: the one that declares it).
    #[arg(long)]
    extension: Option<String>,
    /// The first firing, in Unix milliseconds (default: now).
    #[arg(long)]
    first_at_ms: Option<i64>,
    #[arg(long)]
    json: bool,
}

pub(crate) fn add_timer(args: TimerArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let body = json!({ "recurrence": args.recurrence, "spec": args.spec, "extension": args.extension, "first_at_ms": args.first_at_ms });
    post(state, "/v1/timers", &body, args.json, |v| {
        format!("timer {}\n", v["timer_id"])
    })
}

/// Create a wait: satisfied by the first later event its dependency filter accepts.
#[derive(Debug, clap::Args)]
pub(crate) struct WaitArgs {
    /// The dependency filter, e.g. `mentions`.
    filter: String,
    /// What the wait is for, e.g. `ada`.
    subject: String,
    #[arg(long)]
    extension: Option<String>,
    #[arg(long)]
    work_id: Option<i64>,
    #[arg(long)]
    json: bool,
}

pub(crate) fn add_wait(args: WaitArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let body = json!({ "filter": args.filter, "subject": args.subject, "extension": args.extension, "work_id": args.work_id });
    post(state, "/v1/waits", &body, args.json, |v| {
        format!("wait {}\n", v["wait_id"])
    })
}

/// Plan an emission; the host loop commits it with the extension's `emit.commit`.
#[derive(Debug, clap::Args)]
pub(crate) struct EmissionArgs {
    /// The emission, e.g. `annotation`.
    emission: String,
    /// Its payload, as JSON.
    #[arg(default_value = "{}")]
    payload: String,
    #[arg(long)]
    extension: Option<String>,
    #[arg(long)]
    work_id: Option<i64>,
    #[arg(long)]
    json: bool,
}

pub(crate) fn add_emission(args: EmissionArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    conduit_protocol::check_payload_depth(&args.payload).map_err(CliError::usage)?;
    let payload: Value = serde_json::from_str(&args.payload)
        .context("the payload is not JSON")
        .map_err(CliError::usage)?;
    let body = json!({ "emission": args.emission, "payload": payload, "extension": args.extension, "work_id": args.work_id });
    post(state, "/v1/emissions", &body, args.json, |v| {
        format!(
            "emission {} (commit {})\n",
            v["emission_id"], v["commit_id"]
        )
    })
}

/// Write an artifact's content to stdout or a file.
#[derive(Debug, clap::Args)]
pub(crate) struct ArtifactArgs {
    /// `sha256:<hex>`, as `artifact.close` answered.
    id: String,
    /// Write here instead of stdout.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
}

pub(crate) fn get_artifact(args: ArtifactArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open_read_only()?;
    let Some(sha) = conduit_protocol::artifact_id::parse(&args.id) else {
        return Err(CliError::usage(anyhow::anyhow!(
            "an artifact id is `sha256:` and 64 hex digits, not `{}`",
            args.id
        )));
    };
    // Content is addressed by digest in the state directory, so it is read directly.
    let path = state.artifacts_dir().join("sha256").join(&sha);
    let mut file = std::fs::File::open(&path).map_err(|e| {
        // Gone: say whether retention removed it (the store keeps its row) or it never was.
        let db = conduit_host::retention::sweep::db_path(&state);
        let removed = db
            .exists()
            .then(|| conduit_store::read_only(&db, |r| r.artifact_by_sha256(&sha)).ok())
            .flatten()
            .flatten()
            .and_then(|a| a.removed_at_ms);
        match removed {
            Some(at) => CliError::usage(anyhow::anyhow!(
                "{}",
                conduit_host::retention::view::removed_message(&sha, at)
            )),
            None => CliError::usage(anyhow::anyhow!(
                "no artifact sha256:{sha} ({}: {e})",
                path.display()
            )),
        }
    })?;
    match &args.output {
        Some(out) => {
            let mut f = std::fs::File::create(out)
                .with_context(|| format!("cannot create {}", out.display()))
                .map_err(CliError::failure)?;
            std::io::copy(&mut file, &mut f)
                .context("cannot copy the artifact")
                .map_err(CliError::failure)?;
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            match std::io::copy(&mut file, &mut stdout).and_then(|_| stdout.flush()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    return Err(CliError::failure(e));
                }
                _ => {}
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
