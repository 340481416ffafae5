//! `--wait[=TIMEOUT]`: after a command asked the daemon to (re)start a package, wait until it
//! is `ready`, or say why it is not.
//!
//! Ready means the state `ready` reached by a run that began after the request (so the old
//! run's `ready` does not count), or, for an on-demand package, `idle` (it starts when first
//! needed). Some states end the wait at once, because waiting longer cannot help: `refused`,
//! `incompatible`, `crash-looping` (the fifth failure in a row), `disabled`, `stopped`, and a
//! new version started beside a running one that did not become ready (the old one serves
//! on). `starting` and `backing-off` (a first crash may be cured by the restart) wait until the
//! timeout.

use std::time::{Duration, Instant};

use conduit_host::client::Client;
use conduit_host::daemon::ExtensionView;
use conduit_supervisor::{StartMode, State, now_ms};

use super::outcome::CliError;

/// The wait when `--wait` is given without a value, and the one install and upgrade use by
/// default.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// The longest wait `--wait=TIMEOUT` accepts.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(3600);

/// How often the status is read while waiting.
const POLL: Duration = Duration::from_millis(100);

/// After a restart, the old run's state can still show for a moment; a state that ends the wait
/// counts only once the new run was seen, or after this long.
const RESTART_GRACE: Duration = Duration::from_secs(2);

/// `--wait[=TIMEOUT]` and `--no-wait`.
#[derive(Clone, Debug, Default, clap::Args)]
pub(crate) struct WaitArgs {
    /// Wait until the package is ready, at most TIMEOUT (`30s`, `500ms`, `2m`; a bare number is
    /// seconds; default 30s). Exit 1 with its state, last error and stderr tail if it is not.
    #[arg(
        long,
        value_name = "TIMEOUT",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "30s",
        value_parser = parse_timeout
    )]
    pub(crate) wait: Option<Duration>,
    /// Do not wait for the package to be ready (only for commands that wait by default).
    #[arg(long, conflicts_with = "wait")]
    pub(crate) no_wait: bool,
}

/// `30s`, `500ms`, `2m`, `1h` or a bare number of seconds, from 1 ms to an hour.
pub(crate) fn parse_timeout(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a timeout; write it like 30s, 500ms or 2m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("`{s}` has an unknown unit; use ms, s, m or h")),
    };
    let d = Duration::from_secs_f64(secs);
    if d < Duration::from_millis(1) || d > MAX_WAIT {
        return Err(format!("`{s}` is out of range: 1ms to 1h"));
    }
    Ok(d)
}

/// What the wait found when the package did not become ready.
#[derive(Debug)]
pub(crate) struct NotReady {
    pub(crate) view: Option<ExtensionView>,
    pub(crate) timed_out: bool,
    pub(crate) waited: Duration,
}

impl NotReady {
    /// Several lines for people: the state, the last error, the stderr tail, what to do.
    pub(crate) fn describe(&self, name: &str) -> String {
        let Some(v) = &self.view else {
            return format!("`{name}` is not known to the running daemon");
        };
        let s = &v.status;
        let mut out = if self.timed_out {
            format!(
                "`{name}` {} did not become ready within {}: it is {}",
                s.version,
                human(self.waited),
                s.state
            )
        } else {
            format!("`{name}` {} is {}, not ready", s.version, s.state)
        };
        if let Some(e) = &s.last_exit {
            out.push_str(&format!("\n  last exit   {e}"));
        }
        if let Some(e) = &s.last_error {
            out.push_str(&format!("\n  last error  {e}"));
        }
        let tail = &s.stderr_tail[s.stderr_tail.len().saturating_sub(10)..];
        if !tail.is_empty() {
            out.push_str("\n  stderr (last lines):");
            for l in tail {
                out.push_str(&format!("\n    {l}"));
            }
        }
        out.push_str(&format!(
            "\n  more: `conduit ext status {name}`, `conduit ext logs {name}`"
        ));
        out
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        match &self.view {
            Some(v) => serde_json::json!({
                "ready": false,
                "state": v.status.state,
                "timed_out": self.timed_out,
                "last_exit": v.status.last_exit,
                "last_error": v.status.last_error,
                "stderr_tail": v.status.stderr_tail,
            }),
            None => {
                serde_json::json!({ "ready": false, "state": null, "timed_out": self.timed_out })
            }
        }
    }
}

/// `human(Duration)`: `30 s`, `1.5 s`, `250 ms`.
pub(crate) fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// How the run being waited for is told from an earlier one.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Since {
    /// A fresh start (install, upgrade, enable): the daemon made a new supervisor entry, so
    /// every state seen is the new run's; `ready` must be reached at or after this time.
    Started { at_ms: i64 },
    /// A restart of a running entry: `ready` must be reached at or after `at_ms`, and a state
    /// that ends the wait counts once the pid changed or after [`RESTART_GRACE`].
    Restarted { at_ms: i64, old_pid: Option<u32> },
    /// Nothing was asked (already enabled): its current `ready` counts.
    Now,
}

impl Since {
    pub(crate) fn started_now() -> Since {
        Since::Started { at_ms: now_ms() }
    }
}

/// Poll `GET /v1/extensions/{name}` until it is ready, a state that ends the wait, or `timeout`.
pub(crate) fn wait_ready(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    name: &str,
    since: Since,
    timeout: Duration,
) -> Result<Result<ExtensionView, NotReady>, CliError> {
    let start = Instant::now();
    let mut saw_new_run = false;
    loop {
        let v = rt
            .block_on(client.get(&format!("/v1/extensions/{name}")))
            .map_err(CliError::failure)?;
        let view: ExtensionView = serde_json::from_value(v).map_err(|e| {
            CliError::failure(anyhow::anyhow!(
                "the daemon's answer has an unexpected shape: {e}"
            ))
        })?;
        let s = &view.status;
        let (ready_after, fresh) = match since {
            Since::Started { at_ms } => (Some(at_ms), true),
            Since::Restarted { at_ms, old_pid } => {
                saw_new_run |= s.pid.is_some() && s.pid != old_pid
                    || matches!(s.state, State::Starting | State::Stopping);
                (Some(at_ms), saw_new_run || start.elapsed() >= RESTART_GRACE)
            }
            Since::Now => (None, true),
        };
        let starting_beside = view.overlap.as_ref().is_some_and(|o| o.phase == "starting");
        if let Some(o) = view
            .overlap
            .as_ref()
            .filter(|o| o.phase == "failed" && fresh)
        {
            // The new version did not become ready beside the old one, which serves on.
            let mut failed = view.clone();
            failed.status = o.status.clone();
            failed.overlap = None;
            return Ok(Err(NotReady {
                view: Some(failed),
                timed_out: false,
                waited: start.elapsed(),
            }));
        }
        let ready = s.state == State::Ready
            && ready_after.is_none_or(|t| s.ready_since_ms.is_some_and(|r| r >= t));
        // On demand: idle is where it waits to be needed.
        let idle = s.state == State::Idle && s.start == StartMode::OnDemand && !starting_beside;
        if ready || idle {
            return Ok(Ok(view));
        }
        let ends = matches!(
            s.state,
            State::Refused
                | State::Incompatible
                | State::CrashLooping
                | State::Disabled
                | State::Stopped
        );
        if ends && fresh {
            return Ok(Err(NotReady {
                view: Some(view),
                timed_out: false,
                waited: start.elapsed(),
            }));
        }
        if start.elapsed() >= timeout {
            return Ok(Err(NotReady {
                view: Some(view),
                timed_out: true,
                waited: timeout,
            }));
        }
        std::thread::sleep(POLL.min(timeout.saturating_sub(start.elapsed())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_with_units_and_refuse_what_is_out_of_range() {
        assert_eq!(parse_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_timeout("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_timeout("3601s").is_err());
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("soon").is_err());
        assert!(parse_timeout("5d").is_err());
    }
}
