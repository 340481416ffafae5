//! `conduit ext check PATH [--json] [--timeout-ms N]`: run a package through the protocol's
//! rules and print one line per rule.
//!
//! The checking is `conduit_host::check`; this module only parses, renders and picks the exit
//! code (0 every rule passed or was skipped, 1 a rule failed, 2 the path or manifest cannot be
//! used).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use conduit_host::check::{self, CheckOptions, Report, Status};

use super::outcome::{CliError, print};

/// How many lines of each instance's stderr the text report shows.
const STDERR_LINES: usize = 20;

const AFTER_HELP: &str = "\
Rules (ids are stable; --json uses them):
  handshake, version, capabilities-match-manifest, declared-methods-answer, unknown-method,
  malformed-line, not-json, batch, request-ids, repeated-members, method-with-result,
  unknown-members, refusal-order, oversized-line, cancellation, duplicate-id, overload,
  not-initialized, shutdown, shutting-down, stdin-eof, stdout-only-protocol
  (cancellation, duplicate-id and overload need `check.sleep` in capabilities.methods; without
  it they are skipped, and a skip is not a failure). Each rule names the section of
  docs/protocol.md it enforces (`section` in --json).

Output: one line per rule, `PASS <rule>`, `FAIL <rule>: <what is wrong> — <what to fix>` or
`SKIP <rule>: <why>`, then a summary; on a failure, the end of the package's stderr.

Exit codes:
  0  every rule passed (or was skipped)
  1  at least one rule failed
  2  usage error, or the package's manifest cannot be read or is invalid";

/// Run a package, in any language, through the protocol's rules: the handshake, version
/// negotiation, declared methods, cancellation, the 65th request, garbage and oversized
/// lines, clean shutdown, and nothing but protocol on stdout.
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub(crate) struct Args {
    /// The package folder (the one holding conduit-extension.toml).
    path: PathBuf,
    /// Print the report as JSON: {"package", "passed", "rules": [{"id", "status", "detail", "fix", "section"}], "stderr", "elapsed_ms"}.
    #[arg(long)]
    json: bool,
    /// How long to wait, in milliseconds, for each answer that may take work (the handshake,
    /// each declared method). Answers the protocol wants at once have shorter, fixed waits.
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    timeout_ms: u64,
}

pub(crate) fn run(args: Args) -> Result<ExitCode, CliError> {
    if args.path.is_file() {
        return Err(CliError::usage(anyhow::anyhow!(
            "{} is a file; pass the package folder (the one holding conduit-extension.toml)",
            args.path.display()
        )));
    }
    let opts = CheckOptions {
        timeout: Duration::from_millis(args.timeout_ms),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .map_err(CliError::failure)?;
    let report = rt
        .block_on(check::check_package(&args.path, &opts))
        // The manifest error's message already includes its cause; as an anyhow chain it
        // would print it twice.
        .map_err(|e| CliError::usage(anyhow::anyhow!("{e}")))?;
    // Every instance was killed and reaped; what is left are tasks reading closed pipes.
    rt.shutdown_background();

    if args.json {
        let mut text = serde_json::to_string_pretty(&report)
            .context("cannot serialize the report")
            .map_err(CliError::failure)?;
        text.push('\n');
        print(&text)?;
    } else {
        print(&render(&report))?;
    }
    Ok(if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The text report.
fn render(report: &Report) -> String {
    let p = &report.package;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "conduit ext check: {} {} ({})",
        p.name,
        p.version,
        p.path.display()
    );
    let l = &report.run_under.limits;
    use conduit_supervisor::limits::LimitKey;
    let _ = writeln!(
        out,
        "runs under: limits memory {}, cpu {}, tasks {}, open files {}; sandbox {}",
        l.show(LimitKey::Memory),
        l.show(LimitKey::Cpu),
        l.tasks,
        l.open_files,
        report.run_under.sandbox.as_deref().unwrap_or("not started")
    );
    for n in &report.run_under.notes {
        let _ = writeln!(out, "  note: {n}");
    }
    for r in &report.rules {
        let _ = match (r.status, &r.fix) {
            (Status::Pass, _) => writeln!(out, "PASS {}", r.id),
            (Status::Fail, Some(fix)) => writeln!(
                out,
                "FAIL {}: {} — {} [docs/protocol.md {}]",
                r.id, r.detail, fix, r.section
            ),
            (Status::Fail, None) => writeln!(out, "FAIL {}: {}", r.id, r.detail),
            (Status::Skip, _) => writeln!(out, "SKIP {}: {}", r.id, r.detail),
        };
        for note in &r.notes {
            let _ = writeln!(out, "  note: {note}");
        }
    }
    let (failed, passed, skipped) = (
        report.count(Status::Fail),
        report.count(Status::Pass),
        report.count(Status::Skip),
    );
    let total = report.rules.len();
    let secs = report.elapsed_ms as f64 / 1000.0;
    if failed == 0 {
        let skips = if skipped > 0 {
            format!(" ({skipped} skipped)")
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{} {}: every rule passed{skips}, in {secs:.1} s",
            p.name, p.version
        );
    } else {
        let _ = writeln!(
            out,
            "{} {}: {failed} of {total} rules failed ({passed} passed, {skipped} skipped), in {secs:.1} s",
            p.name, p.version
        );
        for (instance, text) in &report.stderr {
            let lines: Vec<&str> = text.lines().collect();
            let shown = &lines[lines.len().saturating_sub(STDERR_LINES)..];
            let _ = writeln!(
                out,
                "\nstderr of the package ({instance} instance, last {} of {} lines):",
                shown.len(),
                lines.len()
            );
            for line in shown {
                let _ = writeln!(out, "  | {line}");
            }
        }
    }
    out
}
