//! `conduit web`: the local web view (`conduit_host::views::web`).

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use conduit_host::views::web;

use super::common::{StateArgs, view_client};
use super::outcome::CliError;

/// A local web view of the daemon, on 127.0.0.1 (prints the URL to open).
///
/// Extensions (with restart, enable and disable),
/// one extension (status, limits, recent exits, latency histogram, log tail), Work and its
/// events, timers, waits, emissions, artifacts, and the doctor's checks.
///
/// It serves on 127.0.0.1 only and passes every request to the daemon's owner-only socket,
/// so the daemon itself opens no network port. The first line it prints is the URL to open;
/// the token in it lets one browser in (kept in a session cookie), and a page refuses a
/// request without it, from another host name, or a form without its check token.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  conduit web                  a free port; the first line printed is the URL to open
  conduit web --port 8377      a port of your choice (127.0.0.1 only)
  ssh -L 8377:127.0.0.1:8377 host 'conduit web --port 8377'
                               from another machine, through ssh

It serves until SIGTERM or Ctrl-C. Every address is http://127.0.0.1:PORT/ (or localhost);
another host name gets 421, a request without the token or its cookie 401.

Exit codes: 0 stopped by SIGTERM or Ctrl-C; 1 the port could not be bound or serving failed;
2 bad arguments; 3 no daemon runs.")]
pub(crate) struct Args {
    /// The port on 127.0.0.1 (default: one the system picks).
    #[arg(long, default_value_t = 0, value_name = "PORT")]
    port: u16,
}

pub(crate) fn run(args: Args, state: &StateArgs) -> Result<ExitCode, CliError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .map_err(CliError::failure)?;
    let (dir, client) = view_client(&rt, state)?;
    let mut doctor = conduit_host::doctor::Options::from_env(state.state_dir.as_deref())
        .map_err(|e| CliError::usage(anyhow::Error::new(e)))?;
    // A page should not wait long: the store's check is cut at 5 s (the command's is 10 s).
    doctor.store_timeout = doctor.store_timeout.min(std::time::Duration::from_secs(5));
    rt.block_on(async move {
        let bound = web::bind(client, &web::Options { port: args.port, doctor })
            .await
            .map_err(CliError::failure)?;
        // The first line is the URL, for people and for scripts that read it.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", bound.url());
        let _ = out.flush();
        drop(out);
        note!(
            "conduit web: serving the daemon of {} on http://127.0.0.1:{}/ (open the URL above; Ctrl-C stops it)",
            dir.display(),
            bound.port()
        );
        bound
            .serve(async {
                use tokio::signal::unix::{SignalKind, signal};
                let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
                let mut int = signal(SignalKind::interrupt()).expect("a SIGINT handler");
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            })
            .await
            .map_err(CliError::failure)?;
        Ok(ExitCode::SUCCESS)
    })
}
