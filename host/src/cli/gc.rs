//! `conduit gc [--dry-run] [--json]`: a retention sweep now. Through the running daemon when
//! one runs (`POST /v1/gc`, one sweep at a time with its own); otherwise on the state directory
//! itself, holding the daemon's lock so that no daemon starts meanwhile.

use std::process::ExitCode;

use anyhow::Context;
use conduit_host::packages::settings;
use conduit_host::retention::{self, SweepReport};
use conduit_store::RemovalReason;
use conduit_supervisor::limits::format_bytes;
use conduit_supervisor::log::utc_timestamp;

use super::common::{StateArgs, api_error, daemon, print_json, runtime};
use super::outcome::{CliError, print};

/// Remove what retention allows now: artifact content past its age or over its budget that no
/// live record needs, content files no record keeps, logs of earlier runs; then checkpoint the
/// database's WAL.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The daemon does the same every `retention.interval` (10 minutes by default); `conduit config
show` lists the settings. With no daemon running, gc works on the state directory directly and
holds its lock meanwhile (a daemon started then waits for it to finish: it refuses to start).

Exit codes: 0 swept (or, with --dry-run, listed); 1 the sweep failed, or a daemon holds the
state directory without answering; 2 the settings file holds a bad value")]
pub(crate) struct Args {
    /// Remove nothing: list what a sweep would remove now.
    #[arg(long)]
    dry_run: bool,
    /// Print the sweep's whole report as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open_existing()?;
    let rt = runtime()?;
    let report: SweepReport = if let Some(client) = daemon(&rt, &state) {
        let path = format!("/v1/gc?dry_run={}", args.dry_run);
        let (code, v) = rt
            .block_on(client.request(hyper::Method::POST, &path, None))
            .map_err(CliError::failure)?;
        if !code.is_success() {
            return Err(api_error(code, &v));
        }
        serde_json::from_value(v)
            .context("the daemon's sweep report does not read")
            .map_err(CliError::failure)?
    } else {
        direct(&state, args.dry_run)?
    };
    if args.json {
        print_json(&report)?;
    } else {
        print(&render(&report))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A sweep with no daemon: under the state directory's lock, on the store itself.
fn direct(
    state: &conduit_host::state_dir::StateDir,
    dry_run: bool,
) -> Result<SweepReport, CliError> {
    let retention = settings::retention(state)
        .map_err(CliError::usage)?
        .resolved();
    let _lock = state
        .lock_exclusive()
        .context("a daemon holds the state directory but does not answer on its socket; wait for it to finish starting, or stop it")
        .map_err(CliError::failure)?;
    let store = conduit_store::Store::open(retention::sweep::db_path(state))
        .context("cannot open the store")
        .map_err(CliError::failure)?;
    retention::sweep(
        state,
        &store,
        &retention,
        conduit_supervisor::now_ms(),
        dry_run,
        retention::sweep::Orphans::All,
        &|| false,
    )
    .context("the retention sweep failed")
    .map_err(CliError::failure)
}

fn reason(r: RemovalReason) -> &'static str {
    match r {
        RemovalReason::Age => "past max_age",
        RemovalReason::Budget => "over max_bytes",
    }
}

fn bytes(n: u64) -> String {
    format_bytes(n)
}

/// `2 artifact contents`, `1 log file`.
fn count(n: u64, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// The report for people.
pub(crate) fn render(r: &SweepReport) -> String {
    let mut out = String::new();
    let verb = if r.dry_run { "would remove" } else { "removed" };
    let a = &r.artifacts;
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!(
        "{verb} {} ({})",
        count(a.removed_count, "artifact content"),
        bytes(a.removed_bytes)
    ));
    let items = a.removed.iter().map(|x| {
        let when = format!("last touched {}", utc_timestamp(x.touched_at_ms));
        (x.artifact_id.clone(), x.size, when, x.reason)
    });
    listed(&mut line, items, a.removed_count);
    if a.kept_live > 0 {
        line(format!(
            "kept {} a live record needs",
            count(a.kept_live, "artifact")
        ));
    }
    if a.unrecorded_count > 0 {
        line(format!(
            "{verb} {} no record keeps ({})",
            count(a.unrecorded_count, "content file"),
            bytes(a.unrecorded_bytes)
        ));
    }
    if r.logs.swept {
        let l = &r.logs;
        line(format!(
            "{verb} {} of earlier runs ({})",
            count(l.removed_count, "log file"),
            bytes(l.removed_bytes)
        ));
        let items = l.removed.iter().map(|x| {
            let when = format!("modified {}", utc_timestamp(x.modified_at_ms));
            (format!("logs/{}", x.file), x.size, when, x.reason)
        });
        listed(&mut line, items, l.removed_count);
    }
    if r.wal.checkpointed {
        let how = if r.wal.truncated {
            "truncated"
        } else {
            "checkpointed (passive: the store was busy)"
        };
        line(format!(
            "WAL {how}: {} → {}",
            bytes(r.wal.bytes_before),
            bytes(r.wal.bytes_after)
        ));
    }
    line(format!(
        "kept: {} ({}{}), logs/ {}{}",
        count(a.retained, "artifact content"),
        bytes(a.retained_bytes),
        over(
            a.over_budget_bytes,
            "needed by live records or within the grace period"
        ),
        bytes(r.logs.retained_bytes),
        over(
            r.logs.over_budget_bytes,
            "current logs of installed packages and files not conduit's stay"
        ),
    ));
    let s = &r.sizes;
    line(format!(
        "on disk: database {}, WAL {}, artifacts {}, logs {}",
        bytes(s.database_bytes),
        bytes(s.wal_bytes),
        bytes(s.artifacts_bytes),
        bytes(s.logs_bytes)
    ));
    line(format!(
        "took {:.1} ms; {}, the longest {:.2} ms",
        r.took_us as f64 / 1e3,
        count(r.transactions, "transaction"),
        r.longest_transaction_us as f64 / 1e3
    ));
    for e in &r.errors {
        line(format!("warning: {e}"));
    }
    out
}

/// One line per removed item (what, size, when, why), and how many the report left out.
fn listed(
    line: &mut impl FnMut(String),
    items: impl Iterator<Item = (String, u64, String, RemovalReason)>,
    total: u64,
) {
    let mut shown = 0;
    for (what, size, when, why) in items {
        line(format!(
            "  {what}  {:>10}  {when}  {}",
            bytes(size),
            reason(why)
        ));
        shown += 1;
    }
    if shown > 0 && shown < total {
        line(format!("  … and {} more", total - shown));
    }
}

fn over(n: u64, why: &str) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(", {} over its budget: {why}", bytes(n))
    }
}
