//! `conduit daemon run`: run the daemon in the foreground until SIGTERM or SIGINT.

use std::process::ExitCode;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::CliError;
use super::common::StateArgs;

/// Run the daemon in the foreground: supervise every enabled package and serve the management
/// API on <state>/run/conduit.sock. SIGTERM or SIGINT stops the extensions gracefully.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Logs go to stderr (CONDUIT_LOG sets the filter, default `info`).

CONDUIT_UNRESPONSIVE_AFTER (1 to 100, default 5): consecutive failed in-transaction calls and
probes, with no answer between, after which an extension is unresponsive and restarted.

Exit codes: 0 stopped by SIGTERM/SIGINT after stopping every extension; 1 could not run (the
socket, the runtime); 2 the state directory is unusable, another daemon holds its lock, or a setting is invalid")]
pub(crate) struct Args {}

pub(crate) fn run(_args: Args, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open()?;
    // A multi-thread runtime whose workers live as long as the daemon: children are spawned
    // from them, and their parent-death signal is tied to the spawning thread.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("conduit-worker")
        .build()
        .context("cannot start the async runtime")
        .map_err(CliError::failure)?;
    let res = rt.block_on(conduit_host::daemon::run(state, CancellationToken::new()));
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match res {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e)
            if e.downcast_ref::<conduit_host::state_dir::StateDirError>()
                .is_some()
                || e.downcast_ref::<conduit_host::daemon::SettingError>()
                    .is_some() =>
        {
            Err(CliError::usage(e))
        }
        Err(e) => Err(CliError::failure(e)),
    }
}
