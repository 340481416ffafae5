//! The command line: the clap tree, and the one place errors become exit codes.
//!
//! One module per subcommand, each with its clap `Args` and its `run`. Adding a subcommand is
//! a variant here and a module beside this one: `conduit ext <sub>` goes in [`ExtCommand`], a
//! new group (`conduit daemon run`) in [`Command`].
//!
//! Exit codes every subcommand keeps: 0 success, 1 the command ran and found a failure (a
//! rule failed, a package is unhealthy), 2 a usage error or unusable input (clap's own code for
//! bad arguments). A closed stdout (`conduit … | head`) is not an error.

mod ext_check;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// conduit runs extension packages as child processes and speaks JSON-RPC 2.0 to them over
/// their stdin and stdout.
#[derive(Debug, Parser)]
#[command(name = "conduit", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with extension packages.
    #[command(subcommand)]
    Ext(ExtCommand),
}

#[derive(Debug, Subcommand)]
enum ExtCommand {
    Check(ext_check::Args),
}

/// A failed command: the error to print and the exit code.
#[derive(Debug)]
pub(crate) struct CliError {
    pub(crate) code: u8,
    pub(crate) error: anyhow::Error,
}

impl CliError {
    /// Exit code 2: the input (arguments, a manifest) cannot be used.
    pub(crate) fn usage(error: impl Into<anyhow::Error>) -> Self {
        CliError {
            code: 2,
            error: error.into(),
        }
    }

    /// Exit code 1: the command could not do its work.
    pub(crate) fn failure(error: impl Into<anyhow::Error>) -> Self {
        CliError {
            code: 1,
            error: error.into(),
        }
    }
}

/// Run the parsed command line.
pub(crate) fn run(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Ext(ExtCommand::Check(args)) => ext_check::run(args),
    }
}

/// Write to stdout; a reader that went away (`| head`) is not an error.
pub(crate) fn print(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(CliError::failure(
            anyhow::Error::new(e).context("cannot write to stdout"),
        )),
        _ => Ok(()),
    }
}
