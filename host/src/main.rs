//! The `conduit` binary: parse the command line, install logging, run the subcommand, exit.
//!
//! Invariant: this is the only place that exits the process; every exit code comes from
//! `cli::CliError` or a subcommand's own documented outcome.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // The daemon's spawner is this binary run again (`conduit_supervisor::spawner`): nothing
    // else of the CLI runs in it.
    #[cfg(target_os = "linux")]
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == conduit_supervisor::spawner::SPAWNER_ARG)
    {
        return conduit_supervisor::spawner::serve();
    }
    // Shell completion: with `COMPLETE=<shell>` set, the shell's registration script or the
    // completions of the words given, then exit (clap_complete's engine; `conduit completions`
    // prints the same registration).
    clap_complete::CompleteEnv::with_factory(<cli::Cli as clap::CommandFactory>::command)
        .complete();
    // Usage errors exit 2 (clap's convention, which `cli` keeps for its own usage errors);
    // `--help` and `--version` exit 0.
    let args = cli::Cli::parse();
    let telemetry = args.log_format().and_then(|f| Ok((f, args.otlp()?)));
    let (format, export) = match telemetry {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // Logs go to stderr, at the command's default level unless `CONDUIT_LOG` (an `EnvFilter`
    // directive such as `debug` or `conduit_rpc=trace`) says otherwise. Dropping the guard
    // sends what the span export still holds, for at most two seconds.
    let guard = conduit_host::telemetry::install(format, args.default_log_filter(), export);
    let code = match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", conduit_host::error_chain::chain(&e.error));
            ExitCode::from(e.code)
        }
    };
    drop(guard);
    code
}
