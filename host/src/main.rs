//! The `conduit` binary: parse the command line, install logging, run the subcommand, exit.
//!
//! Invariant: this is the only place that exits the process; every exit code comes from
//! `cli::CliError` or a subcommand's own documented outcome.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Usage errors exit 2 (clap's convention, which `cli` keeps for its own usage errors);
    // `--help` and `--version` exit 0.
    let args = cli::Cli::parse();
    install_logging(args.default_log_filter());
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", conduit_host::error_chain::chain(&e.error));
            ExitCode::from(e.code)
        }
    }
}

/// Logs go to stderr, at the command's default level unless `CONDUIT_LOG` (an `EnvFilter` directive such as
/// `debug` or `conduit_rpc=trace`) says otherwise.
fn install_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CONDUIT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal, and never with NO_COLOR (no-color.org).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false);
    // Under systemd, stderr is the journal (it sets JOURNAL_STREAM), which stamps every line
    // itself: a second timestamp would only crowd `journalctl`.
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        fmt.without_time().init();
    } else {
        fmt.init();
    }
}
