//! `conduit timers delete ID`, `conduit waits cancel ID`, `conduit work close ID`: what an
//! operator ends by hand, through the daemon (`POST /v1/timers/{id}/delete`, …). The record is
//! kept with when it ended; `show`/`list` still find it.

use std::process::ExitCode;

use conduit_supervisor::log::utc_timestamp;
use serde_json::{Value, json};

use super::common::{StateArgs, api_error, need_daemon, print_json, runtime};
use super::outcome::{CliError, print};

/// Delete a timer: it never fires again, and is kept (marked deleted).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Deleting a deleted timer again changes nothing and says so. `conduit timers show ID` still
shows it, with `deleted_at_ms`.

Exit codes: 0 deleted (or already); 1 the daemon failed; 2 no such timer; 3 no daemon is running")]
pub(crate) struct DeleteTimerArgs {
    /// The timer's id.
    id: i64,
    /// Print {"timer": {…}, "changed"}.
    #[arg(long)]
    json: bool,
}

/// Cancel an active wait: its filter is asked no more, and it is kept (state `cancelled`).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
A satisfied wait cannot be cancelled (exit 2, saying by which event); cancelling a cancelled
one again changes nothing and says so.

Exit codes: 0 cancelled (or already); 1 the daemon failed; 2 no such wait, or it is satisfied;
3 no daemon is running")]
pub(crate) struct CancelWaitArgs {
    /// The wait's id.
    id: i64,
    /// Print {"wait": {…}, "changed"}.
    #[arg(long)]
    json: bool,
}

/// Close an open or ready Work: it takes no more inputs (its key opens a new Work), and is
/// kept, `done`, with when and why.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
A Work the host finished cannot be closed (exit 2); closing a closed one again changes nothing
and says so. The reason is at most 1 KiB.

Exit codes: 0 closed (or already); 1 the daemon failed; 2 no such Work, it is done, or the
reason is too long; 3 no daemon is running")]
pub(crate) struct CloseWorkArgs {
    /// The Work's id.
    id: i64,
    /// Why, kept with it (`close_reason`).
    #[arg(long)]
    reason: Option<String>,
    /// Print {"work": {…}, "changed"}.
    #[arg(long)]
    json: bool,
}

/// Which record, and what to call ending it.
struct End {
    record: &'static str,
    path: String,
    done: &'static str,
    at: &'static str,
}

fn end(
    what: End,
    body: Option<Value>,
    json_out: bool,
    state: &StateArgs,
) -> Result<ExitCode, CliError> {
    let state = state.open_read_only()?;
    let rt = runtime()?;
    let client = need_daemon(&rt, &state)?;
    let (code, v) = rt
        .block_on(client.request(hyper::Method::POST, &what.path, body.as_ref()))
        .map_err(CliError::failure)?;
    if !code.is_success() {
        return Err(api_error(code, &v));
    }
    if json_out {
        print_json(&v)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rec = &v[what.record];
    let when = rec[what.at].as_i64().map_or("-".to_owned(), utc_timestamp);
    let line = if v["changed"] == true {
        format!("{} {} {} at {when}\n", what.record, rec["id"], what.done)
    } else {
        format!(
            "{} {} was {} already, at {when}; nothing changed\n",
            what.record, rec["id"], what.done
        )
    };
    print(&line)?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn delete_timer(args: DeleteTimerArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let what = End {
        record: "timer",
        path: format!("/v1/timers/{}/delete", args.id),
        done: "deleted",
        at: "deleted_at_ms",
    };
    end(what, None, args.json, state)
}

pub(crate) fn cancel_wait(args: CancelWaitArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let what = End {
        record: "wait",
        path: format!("/v1/waits/{}/cancel", args.id),
        done: "cancelled",
        at: "cancelled_at_ms",
    };
    end(what, None, args.json, state)
}

pub(crate) fn close_work(args: CloseWorkArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let what = End {
        record: "work",
        path: format!("/v1/work/{}/close", args.id),
        done: "closed",
        at: "closed_at_ms",
    };
    let body = json!({ "reason": args.reason });
    end(what, Some(body), args.json, state)
}
