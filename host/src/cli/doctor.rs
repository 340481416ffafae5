//! `conduit doctor`: every installation check (`conduit_host::doctor`), printed one line each,
//! or as JSON; the exit code says the worst.

use std::process::ExitCode;
use std::time::Duration;

use conduit_host::doctor::{self, Report, Status};

use super::common::{StateArgs, print_json, runtime};
use super::outcome::{CliError, print};

/// Check this installation; each check one line: ok, warn or fail, what was found, the fix.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The checks, in order: state-dir (ownership and modes), daemon (running and answering), store
(quick_check on a read-only connection, bounded by --store-timeout), disk (free space), wal (the
size of conduit.db-wal), service (the unit or plist runs this binary, not one in a build folder,
on this state directory), sandbox (the kernel's Landlock ABI), cgroups (the daemon's cgroup
delegated), packages (installed files as recorded; one `package NAME` line per changed package),
processes (stale pid ledgers, escaped processes), extensions (one `extension NAME` line per
extension crash-looping, refused, incompatible, unresponsive, over its limits, backing off or
degraded). Checks that need the daemon run only while it answers.

Read-only: doctor changes nothing (it never creates the state directory, writes the store,
removes a ledger or signals a process); each fix is a command for you to run.

  conduit doctor                 one line per check
  conduit doctor --json          {\"checks\": [{\"name\", \"status\", \"found\", \"fix\"}], \"status\"}

Exit codes: 0 every check ok; 1 a warning (and no failure); 2 a failure. (A usage error also
exits 2.)")]
pub(crate) struct Args {
    /// Print {"checks": [{"name", "status": "ok"|"warn"|"fail", "found", "fix"}], "status"};
    /// `fix` is null on an ok check.
    #[arg(long)]
    json: bool,
    /// How long the store's quick_check may run, in seconds, before it is interrupted (and
    /// reported as a warning).
    #[arg(long, value_name = "SECS", default_value_t = doctor::STORE_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    store_timeout: u64,
}

/// The exit code of a report: 0 ok, 1 warnings, 2 failures.
fn exit_code(status: Status) -> ExitCode {
    match status {
        Status::Ok => ExitCode::SUCCESS,
        Status::Warn => ExitCode::from(1),
        Status::Fail => ExitCode::from(2),
    }
}

pub(crate) fn run(args: Args, state: &StateArgs) -> Result<ExitCode, CliError> {
    let mut opts =
        doctor::Options::from_env(state.state_dir.as_deref()).map_err(CliError::usage)?;
    opts.store_timeout = Duration::from_secs(args.store_timeout);
    let report = runtime()?.block_on(doctor::run(&opts));
    if args.json {
        print_json(&report)?;
    } else {
        print(&text(&report))?;
    }
    Ok(exit_code(report.status))
}

/// One line per check: the status, the check's name, what was found and, when not ok, the
/// command that fixes it; then a count.
fn text(r: &Report) -> String {
    let width = r.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for c in &r.checks {
        out.push_str(&format!("{:<4}  {:<width$}  {}", c.status, c.name, c.found));
        if let Some(fix) = &c.fix {
            out.push_str(&format!(" — fix: {fix}"));
        }
        out.push('\n');
    }
    let count = |s: Status| r.checks.iter().filter(|c| c.status == s).count();
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    out.push_str(&format!(
        "{}: {} ok, {}, {}\n",
        r.status,
        count(Status::Ok),
        plural(count(Status::Warn), "warning", "warnings"),
        plural(count(Status::Fail), "failure", "failures"),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use conduit_host::doctor::Check;

    #[test]
    fn each_check_is_one_line_with_its_fix() {
        let r = Report::new(vec![
            Check::ok("store", "quick_check ok"),
            Check::fail("state-dir", "/s is mode 0755", "chmod 700 /s"),
        ]);
        assert_eq!(
            text(&r),
            "ok    store      quick_check ok\n\
             fail  state-dir  /s is mode 0755 — fix: chmod 700 /s\n\
             fail: 1 ok, 0 warnings, 1 failure\n"
        );
    }
}
