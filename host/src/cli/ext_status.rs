//! `conduit ext list`, `conduit ext status [NAME]` and `conduit ext restart NAME`.
//!
//! With a running daemon the answers come from it (live state, pids, call latencies); without
//! one they come from the registry, and every enabled package shows `stopped`.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context;
use conduit_host::core::health::Condition;
use conduit_host::daemon::{ExtensionView, trouble};
use conduit_host::packages;
use conduit_supervisor::{State, now_ms};

use super::common::{StateArgs, api_error, daemon, need_daemon, print_json, runtime};
use super::outcome::{CliError, print};

/// List installed packages and their state.
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// Print as JSON: {"daemon_running", "extensions": [{name, version, state, pid, restarts, last_exit, …}]}.
    #[arg(long)]
    json: bool,
}

/// Show one package's status in detail (or every package's, without NAME).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Exit codes: 0 every package shown is ready (and not degraded or unresponsive) or disabled; 1 one
is not (starting, backing-off, crash-looping, incompatible, refused, stopping, stopped, or ready
but degraded or unresponsive), or the registry or the daemon's answer cannot be read; 2 no such
package, or the state directory is unusable")]
pub(crate) struct StatusArgs {
    /// The package's name; all packages when left out.
    #[arg(add = super::common::package_names())]
    name: Option<String>,
    /// Print as JSON (one object for NAME, else {"daemon_running", "extensions": [...]}), with at
    /// least name, version, state, pid, restarts, last_exit, recent_exits (newest first: at_ms,
    /// pid, cause, reason, exit, summary, in_flight [{method, age_ms}]), descendants, and
    /// resources (limits, mechanism, sandbox, usage {rss_bytes, cpu, tasks, processes,
    /// throttled, throttles}, limit_stops, notes), and for a development install `dev`, the
    /// folder it runs from unchecked (`conduit ext dev`).
    #[arg(long)]
    json: bool,
}

/// Restart a running extension now (the daemon must be running).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Without --wait the command returns once the restart is asked for; with it, once the new run is
ready (or exits 1 with its state, last error and stderr tail).

Exit codes: 0 restarting (ready, with --wait); 1 it did not become ready; 2 no such package or it
is disabled; 3 no daemon is running")]
pub(crate) struct RestartArgs {
    /// The package's name.
    #[arg(add = super::common::package_names())]
    name: String,
    #[command(flatten)]
    wait: super::ext_wait::WaitArgs,
    /// Print the result as JSON: {"name", "restarting": true, "ready"?, "state"?, …}.
    #[arg(long)]
    json: bool,
}

fn views(state_args: &StateArgs) -> Result<(bool, Vec<ExtensionView>), CliError> {
    let state = state_args.open_read_only()?;
    let rt = runtime()?;
    match daemon(&rt, &state) {
        Some(client) => {
            let v = rt
                .block_on(client.get("/v1/extensions"))
                .map_err(CliError::failure)?;
            let list: Vec<ExtensionView> = serde_json::from_value(v["extensions"].clone())
                .context("the daemon's answer has an unexpected shape")
                .map_err(CliError::failure)?;
            Ok((true, list))
        }
        None => {
            let recs = packages::list(&state).map_err(CliError::failure)?;
            Ok((
                false,
                recs.iter()
                    .map(|r| ExtensionView::offline(r, false))
                    .collect(),
            ))
        }
    }
}

fn healthy(v: &ExtensionView) -> bool {
    let calls_flow = v
        .health
        .as_ref()
        .is_none_or(|h| h.condition == Condition::Healthy);
    matches!(v.status.state, State::Ready | State::Disabled) && calls_flow
}

/// `ready`, or `ready, degraded` / `ready, unresponsive` when its in-transaction calls wait.
fn state_text(v: &ExtensionView) -> String {
    match &v.health {
        Some(h) if h.condition != Condition::Healthy => {
            format!("{}, {}", v.status.state, h.condition.as_str())
        }
        _ => v.status.state.to_string(),
    }
}

fn table(list: &[ExtensionView]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|v| {
            let s = &v.status;
            vec![
                s.name.clone(),
                if v.dev.is_some() {
                    format!("{} (dev)", s.version)
                } else {
                    s.version.clone()
                },
                state_text(v),
                s.pid.map_or("-".to_owned(), |p| p.to_string()),
                s.restarts.to_string(),
                s.last_exit.map_or("-".to_owned(), |e| e.to_string()),
            ]
        })
        .collect();
    super::table::render(
        &["NAME", "VERSION", "STATE", "PID", "RESTARTS", "LAST EXIT"],
        &[
            super::table::Align::Left,
            super::table::Align::Left,
            super::table::Align::Left,
            super::table::Align::Right,
            super::table::Align::Right,
            super::table::Align::Left,
        ],
        &rows,
    )
}

pub(crate) fn list(args: ListArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let (running, list) = views(state)?;
    if args.json {
        print_json(&serde_json::json!({ "daemon_running": running, "extensions": list }))?;
        return Ok(ExitCode::SUCCESS);
    }
    if list.is_empty() {
        print("no packages installed; `conduit ext install PATH` installs one\n")?;
    } else {
        print(&table(&list))?;
    }
    if !running {
        note!("(no daemon is running; `conduit daemon run` starts it)");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn status(args: StatusArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let (running, list) = views(state)?;
    let shown: Vec<&ExtensionView> = match &args.name {
        Some(name) => match list.iter().find(|v| &v.status.name == name) {
            Some(v) => vec![v],
            None => {
                return Err(CliError::usage(anyhow::anyhow!(
                    "no package named `{name}` is installed; `conduit ext list` shows the installed ones"
                )));
            }
        },
        None => list.iter().collect(),
    };
    if args.json {
        match &args.name {
            Some(_) => print_json(shown[0])?,
            None => {
                print_json(&serde_json::json!({ "daemon_running": running, "extensions": shown }))?
            }
        }
    } else {
        let mut out = String::new();
        for (i, v) in shown.iter().enumerate() {
            // One block per package, a blank line between them.
            if i > 0 {
                out.push('\n');
            }
            detail(&mut out, v);
        }
        print(&out)?;
        if !running {
            note!("(no daemon is running; `conduit daemon run` starts it)");
        }
    }
    Ok(if shown.iter().all(|v| healthy(v)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn detail(out: &mut String, v: &ExtensionView) {
    let s = &v.status;
    let _ = writeln!(out, "{} {} — {}", s.name, s.version, state_text(v));
    if let Some(d) = &v.description {
        let _ = writeln!(out, "  {d}");
    }
    if let Some(src) = &v.dev {
        let _ = writeln!(
            out,
            "  dev install   from {} (`conduit ext dev`): runs from that folder; its files are not checked",
            src.display()
        );
    }
    if let Some(pid) = s.pid {
        let _ = writeln!(out, "  pid           {pid}");
    }
    let _ = writeln!(out, "  restarts      {}", s.restarts);
    if let Some(h) = v
        .health
        .as_ref()
        .filter(|h| h.condition != Condition::Healthy)
    {
        // Since the first failure of the spell (kept across the host's restarts of it), as a
        // time: a count of seconds would start again with every run.
        let since = h
            .since_ms
            .map_or("-".to_owned(), |t| trouble::since_text(t, now_ms()));
        let _ = writeln!(
            out,
            "  {:<13} since {since}: {}",
            h.condition.as_str(),
            h.reason.as_deref().unwrap_or("-")
        );
        let probe = match h.next_probe_at_ms {
            Some(at) => format!(
                "next probe in {:.1} s",
                (at - now_ms()).max(0) as f64 / 1000.0
            ),
            None => "probe under way".to_owned(),
        };
        let _ = writeln!(
            out,
            "  failures      {} of {} before a restart; {probe}",
            h.failures, h.unresponsive_after
        );
    }
    if let Some(h) = v.health.as_ref().filter(|h| h.unresponsive_restarts > 0) {
        let _ = writeln!(
            out,
            "  restarted     {} time(s) for being unresponsive",
            h.unresponsive_restarts
        );
    }
    if let Some(c) = &s.capabilities {
        let mut serves = Vec::new();
        let kinds: Vec<String> = c
            .work_kinds
            .iter()
            .map(|k| {
                if k.trigger {
                    format!("{} (trigger)", k.name)
                } else {
                    k.name.clone()
                }
            })
            .collect();
        for (what, names) in [
            ("work kinds", kinds),
            ("recurrences", c.recurrences.clone()),
            ("filters", c.dependency_filters.clone()),
            ("emissions", c.emissions.clone()),
            ("ingress", c.ingress.clone()),
            ("methods", c.methods.clone()),
        ] {
            if !names.is_empty() {
                serves.push(format!("{what} {}", names.join(", ")));
            }
        }
        if !serves.is_empty() {
            let _ = writeln!(out, "  serves        {}", serves.join("; "));
        }
    }
    if let Some(t) = trouble::trouble(v).filter(|t| {
        !matches!(
            t.trouble,
            trouble::Trouble::Degraded | trouble::Trouble::Unresponsive
        )
    }) && let Some(at) = t.since_ms
    {
        let _ = writeln!(
            out,
            "  {:<13} since {}",
            t.trouble.as_str(),
            trouble::since_text(at, now_ms())
        );
    }
    if let Some(e) = s.last_exit {
        let _ = writeln!(out, "  last exit     {e}");
    }
    if let Some(at) = s.next_start_at_ms {
        let wait = at - now_ms();
        let _ = writeln!(
            out,
            "  next start    in {:.1} s",
            wait.max(0) as f64 / 1000.0
        );
    }
    if let Some(e) = &s.last_error {
        let _ = writeln!(out, "  last error    {e}");
    }
    if !s.descendants.is_empty() {
        let pids: Vec<String> = s.descendants.iter().map(u32::to_string).collect();
        let _ = writeln!(out, "  descendants   {}", pids.join(" "));
    }
    if let Some(r) = &s.resources {
        super::ext_set::write_resources(out, r);
    }
    if !s.recent_exits.is_empty() {
        let _ = writeln!(out, "  recent exits  (newest first)");
        for r in &s.recent_exits {
            let ago = (now_ms() - r.at_ms).max(0) as f64 / 1000.0;
            let _ = writeln!(
                out,
                "    {:>9} ago  pid {:<7} {}",
                trouble::duration_text(ago),
                r.pid,
                r.summary
            );
            if !r.in_flight.is_empty() {
                let calls: Vec<String> = r
                    .in_flight
                    .iter()
                    .map(|c| {
                        format!(
                            "{} ({})",
                            c.method,
                            trouble::duration_text(c.age_ms as f64 / 1000.0)
                        )
                    })
                    .collect();
                let _ = writeln!(out, "                    in flight: {}", calls.join(", "));
            }
        }
    }
    if !s.calls.is_empty() {
        let _ = writeln!(
            out,
            "  calls         {:<22} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9}",
            "METHOD", "COUNT", "ERRORS", "P50", "P95", "P99", "MAX"
        );
        for (m, c) in &s.calls {
            let _ = writeln!(
                out,
                "                {:<22} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9}",
                m,
                c.count,
                c.errors,
                us(c.p50_us),
                us(c.p95_us),
                us(c.p99_us),
                us(c.max_us)
            );
        }
    }
    if !s.stderr_tail.is_empty() {
        let _ = writeln!(out, "  stderr (last {} lines):", s.stderr_tail.len());
        for l in &s.stderr_tail {
            let _ = writeln!(out, "    {l}");
        }
    }
}

fn us(v: u64) -> String {
    if v >= 10_000 {
        format!("{:.1} ms", v as f64 / 1000.0)
    } else {
        format!("{v} µs")
    }
}

pub(crate) fn restart(
    args: RestartArgs,
    state: &StateArgs,
    quiet: bool,
) -> Result<ExitCode, CliError> {
    use super::ext_wait::Since;
    if args.wait.no_wait {
        return Err(CliError::usage(anyhow::anyhow!(
            "`ext restart` does not wait unless --wait is given; leave out --no-wait"
        )));
    }
    let state = state.open_read_only()?;
    let rt = runtime()?;
    let client = need_daemon(&rt, &state)?;
    let before = rt
        .block_on(client.request(
            hyper::Method::GET,
            &format!("/v1/extensions/{}", args.name),
            None,
        ))
        .map_err(CliError::failure)?;
    if !before.0.is_success() {
        return Err(api_error(before.0, &before.1));
    }
    let since = Since::Restarted {
        at_ms: now_ms(),
        old_pid: before.1["pid"].as_u64().map(|p| p as u32),
    };
    let (code, body) = rt
        .block_on(client.request(
            hyper::Method::POST,
            &format!("/v1/extensions/{}/restart", args.name),
            None,
        ))
        .map_err(CliError::failure)?;
    if !code.is_success() {
        return Err(api_error(code, &body));
    }
    let mut out = serde_json::json!({ "name": args.name, "restarting": true });
    if !args.json {
        print(&format!("restarting {}\n", args.name))?;
    }
    super::ext_manage::finish_wait(
        &rt,
        &state,
        &args.name,
        since,
        args.wait.wait,
        args.json,
        quiet,
        &mut out,
    )
}

/// Call a method of a running extension and print its answer (for diagnostics).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Example: conduit ext call echo echo '{\"text\":\"hi\"}'

Prints the result as JSON. An error answer is printed as {\"error\": {code, name, message}} and
exits 1. Exit codes: 0 answered; 1 answered with an error (or timed out); 2 no such package or
bad PARAMS; 3 no daemon is running")]
pub(crate) struct CallArgs {
    /// The package's name.
    #[arg(add = super::common::package_names())]
    name: String,
    /// The method, e.g. `echo` or `check.sleep`.
    method: String,
    /// The params, as JSON (default: {}).
    params: Option<String>,
    /// How long to wait for the answer, in milliseconds.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    timeout_ms: u64,
    /// Print the whole answer, {"result", "took_us"} or {"error", "took_us"}, instead of the
    /// result alone.
    #[arg(long)]
    json: bool,
}

pub(crate) fn call(args: CallArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let params: serde_json::Value = match &args.params {
        Some(p) => serde_json::from_str(p)
            .with_context(|| format!("PARAMS is not JSON: {p}"))
            .map_err(CliError::usage)?,
        None => serde_json::json!({}),
    };
    let state = state.open_read_only()?;
    let rt = runtime()?;
    let client = need_daemon(&rt, &state)?;
    let body = serde_json::json!({ "method": args.method, "params": params, "timeout_ms": args.timeout_ms });
    let (code, v) = rt
        .block_on(client.request(
            hyper::Method::POST,
            &format!("/v1/extensions/{}/call", args.name),
            Some(&body),
        ))
        .map_err(CliError::failure)?;
    if !code.is_success() {
        return Err(api_error(code, &v));
    }
    if args.json {
        print_json(&v)?;
        return Ok(if v.get("error").is_some() {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    if v.get("error").is_some() {
        print_json(&serde_json::json!({ "error": v["error"] }))?;
        return Ok(ExitCode::from(1));
    }
    print_json(&v["result"])?;
    Ok(ExitCode::SUCCESS)
}
