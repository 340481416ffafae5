//! `conduit top`: the live terminal view (`conduit_host::views::top`).

use std::process::ExitCode;
use std::time::Duration;

use conduit_host::views::top::{self, TopError};

use super::common::{StateArgs, runtime, view_client};
use super::outcome::CliError;

/// The shortest and longest refresh interval.
const INTERVAL_RANGE: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_secs(3600));

/// A live terminal view of the daemon: extensions, exits, events, Work.
///
/// Every extension with its state, health, pid, restarts, uptime, calls in flight, call rate
/// and latency, memory and CPU against their limits; the selected one's recent exits and
/// stderr; events per second, the unrouted backlog, Work by state and the host loop's pass
/// time.
///
/// It reads the daemon's management API only (one `GET /v1/overview` per refresh), so it
/// needs a running daemon, and shows what the daemon answers. Keys: ↑↓ select, / filter as
/// you type, s sort, o reverse, r restart, e enable, d disable (each asks first), l follow the
/// log, ? help, q quit.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  conduit top                      refresh every 2 s
  conduit top --interval 500ms     faster (200ms to 1h; a number alone is seconds)
  conduit top --once               draw one frame and exit (for scripts and tests)

It needs a terminal: with standard output (or, without --once, standard input) not a
terminal it exits 2 and says what to use instead (`conduit ext status --json`).

Exit codes: 0 quit (q, Esc, Ctrl-C, SIGTERM) or one frame drawn; 1 the daemon's answer could
not be read, or the terminal failed; 2 not a terminal, or a bad --interval; 3 no daemon runs.")]
pub(crate) struct Args {
    /// How often to refresh: `2s`, `500ms`, `1m`, or seconds as a number.
    #[arg(long, default_value = "2s", value_parser = parse_interval, value_name = "DURATION")]
    interval: Duration,
    /// Draw one frame to the terminal and exit 0.
    #[arg(long)]
    once: bool,
}

/// `2s`, `500ms`, `1m`, `1.5` (seconds), within [`INTERVAL_RANGE`].
fn parse_interval(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration: write 2s, 500ms or 1m"))?;
    let secs = match unit {
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("{s:?}: the unit is ms, s or m")),
    };
    let (lo, hi) = INTERVAL_RANGE;
    if !secs.is_finite() || secs < lo.as_secs_f64() || secs > hi.as_secs_f64() {
        return Err(format!("the interval must be 200ms to 1h, not {s}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

pub(crate) fn run(args: Args, state: &StateArgs) -> Result<ExitCode, CliError> {
    // Before anything else, so a script gets the clear refusal whether or not a daemon runs.
    top::check_terminal(args.once).map_err(|e| CliError::usage(anyhow::Error::new(e)))?;
    let rt = runtime()?;
    let (dir, client) = view_client(&rt, state)?;
    let opts = top::Options {
        interval: args.interval,
        once: args.once,
        state_dir: dir.display().to_string(),
    };
    match rt.block_on(top::run(client, opts)) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e @ TopError::NotATerminal(_)) => Err(CliError::usage(anyhow::Error::new(e))),
        Err(TopError::Failed(e)) => Err(CliError::failure(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_parse_within_their_range() {
        assert_eq!(parse_interval("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_interval("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_interval("200ms"), Ok(Duration::from_millis(200)));
        assert!(parse_interval("199ms").is_err());
        assert_eq!(parse_interval("60m"), Ok(Duration::from_secs(3600)));
        assert!(parse_interval("61m").is_err());
        assert!(parse_interval("fast").is_err());
        assert!(parse_interval("2h").is_err());
    }
}
