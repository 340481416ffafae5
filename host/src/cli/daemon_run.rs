//! `conduit daemon run`: run the daemon in the foreground until SIGTERM or SIGINT.
//!
//! Exit codes separate what a retry can cure from what it cannot, so that a service manager
//! restarts the daemon after the first (exit 1) and not after the second (exit 2).

use std::process::ExitCode;

use anyhow::Context;
use conduit_host::state_dir::StateDirError;
use conduit_store::StoreError;
use tokio_util::sync::CancellationToken;

use super::common::StateArgs;
use super::outcome::CliError;

/// Run the daemon in the foreground: supervise every enabled package and serve the management
/// API on `<state>/run/conduit.sock`. SIGTERM or SIGINT stops the extensions gracefully.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Logs go to stderr (CONDUIT_LOG sets the filter, default `info`; --log-format or
CONDUIT_LOG_FORMAT `text` or `json`).

Spans and metrics are exported over OTLP/HTTP (protobuf) when --otlp-endpoint or
OTEL_EXPORTER_OTLP_ENDPOINT names a collector (OTEL_TRACES_EXPORTER=none or
OTEL_METRICS_EXPORTER=none turns one off, OTEL_SDK_DISABLED=true both; metrics every
OTEL_METRIC_EXPORT_INTERVAL ms, default 60000; gRPC is not supported). Export never blocks the
daemon: a slow or absent collector costs dropped spans and snapshots, counted in
`GET /v1/health` and `conduit metrics`.

A full disk does not keep the daemon down: it starts, serves reads, refuses writes saying the
disk is full, and accepts them again by itself once space is freed.

CONDUIT_UNRESPONSIVE_AFTER (1 to 100, default 5): consecutive failed in-transaction calls and
probes, with no answer between, after which an extension is unresponsive and restarted.

CONDUIT_SPAWNER=off: the daemon forks every extension itself instead of through its spawner
(a second `conduit` process, `conduit __conduit-spawner`, that starts the extensions as the
daemon's children without copying the daemon's memory; Linux).

Exit codes:
  0  stopped by SIGTERM/SIGINT after stopping every extension
  1  could not run for a reason that may pass (a full disk or another I/O error while starting,
     the socket, the runtime): retrying helps, so a service manager should restart it
  2  could not run until someone changes something (an unusable state directory: no home, owned
     by another user, not a directory, permissions; another daemon holds its lock; a damaged
     store, or one from a newer conduit; an invalid setting): retrying does not help")]
pub(crate) struct Args {
    /// Export spans and metrics to this OTLP/HTTP collector (`http://host:4318`; `/v1/traces`
    /// and `/v1/metrics` are appended). Overrides OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(long, value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
}

pub(crate) fn run(_args: Args, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open().map_err(|e| classified(e.error))?;
    // Two workers; extensions are forked on the supervisor's own thread, which lives as long
    // as the daemon (their parent-death signal is tied to the thread that forked them).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("conduit-worker")
        .build()
        .context("cannot start the async runtime")
        .map_err(CliError::failure)?;
    let res = rt.block_on(async {
        start_spawner().await;
        conduit_host::daemon::run(state, CancellationToken::new()).await
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match res {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => Err(classified(e)),
    }
}

/// Start the process that forks the extensions (`conduit_supervisor::spawner`) while this one
/// is small; without it (turned off, or it cannot start) the daemon forks them itself.
async fn start_spawner() {
    #[cfg(target_os = "linux")]
    {
        use conduit_supervisor::spawner;
        let started = match std::env::current_exe() {
            Ok(exe) => spawner::start(&exe).await,
            Err(e) => Err(e),
        };
        match started {
            Ok(Some(pid)) => tracing::debug!(pid, "the spawner runs"),
            Ok(None) => tracing::info!(
                "{}=off: the daemon forks every extension itself",
                spawner::SPAWNER_ENV
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "cannot start the spawner; the daemon forks every extension itself"
            ),
        }
    }
}

/// Exit 2 when something in the error's chain is permanent, else 1.
fn classified(e: anyhow::Error) -> CliError {
    if is_permanent(&e) {
        CliError::usage(e)
    } else {
        CliError::failure(e)
    }
}

fn is_permanent(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<StateDirError>()
            .is_some_and(StateDirError::is_permanent)
            || cause
                .downcast_ref::<StoreError>()
                .is_some_and(StoreError::is_permanent)
            || cause
                .downcast_ref::<conduit_host::daemon::SettingError>()
                .is_some()
    })
}
