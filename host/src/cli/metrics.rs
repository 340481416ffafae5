//! `conduit metrics`: print the running daemon's `GET /v1/metrics` (Prometheus text format).

use std::process::ExitCode;

use super::common::{StateArgs, need_daemon, runtime};
use super::outcome::{CliError, print};

/// Print the daemon's metrics in the Prometheus text exposition format (the same text
/// `GET /v1/metrics` serves; docs/operations.md lists every family).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 printed; 1 the daemon did not answer; 3 no daemon is running"
)]
pub(crate) struct Args {}

pub(crate) fn run(_args: Args, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open_read_only()?;
    let rt = runtime()?;
    let client = need_daemon(&rt, &state)?;
    let text = rt
        .block_on(client.get_text("/v1/metrics"))
        .map_err(CliError::failure)?;
    print(&text)?;
    Ok(ExitCode::SUCCESS)
}
