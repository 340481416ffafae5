//! The command line: the clap tree, and the one place errors become exit codes.
//!
//! One module per subcommand, each with its clap `Args` and its `run`. Adding a subcommand is
//! a variant here and a module beside this one: `conduit ext <sub>` goes in [`ExtCommand`], a
//! new group (`conduit daemon run`) in [`Command`].
//!
//! Exit codes every subcommand keeps: 0 success, 1 the command ran and found a failure (a
//! rule failed, a package is unhealthy), 2 a usage error or unusable input (clap's own code for
//! bad arguments; also an unknown package), 3 the command needs a running daemon and none
//! runs. A closed stdout (`conduit … | head`) is not an error.

mod common;
mod core_cmds;
mod daemon_run;
mod ext_check;
mod ext_logs;
mod ext_manage;
mod ext_set;
mod ext_status;
mod metrics;
mod service;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// conduit runs extension packages as child processes and speaks JSON-RPC 2.0 to them over
/// their stdin and stdout.
#[derive(Debug, Parser)]
#[command(
    name = "conduit",
    version,
    propagate_version = true,
    after_help = "\
Quick start:
  conduit ext install ./my-package      install (a folder or a .tar.gz)
  conduit daemon run                    run every enabled package (foreground)
  conduit ext status                    what runs, with pids, restarts and call latencies
  conduit ext check ./my-package        check a package against the protocol's rules

Exit codes: 0 success; 1 the command found a failure; 2 usage error or unusable input;
3 the command needs a running daemon and none runs. `conduit <command> --help` has more."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    state: common::StateArgs,
    /// How log lines are written: `text` or `json` (one object a line). Default: the
    /// CONDUIT_LOG_FORMAT variable, else `text`.
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    log_format: Option<conduit_host::telemetry::LogFormat>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with extension packages: install, list, status, logs, check, …
    #[command(subcommand)]
    Ext(ExtCommand),
    /// Run the daemon.
    #[command(subcommand)]
    Daemon(DaemonCommand),
    /// Push and list events.
    #[command(subcommand)]
    Events(EventsCommand),
    /// List Work.
    #[command(subcommand)]
    Work(WorkCommand),
    /// Create timers (served by an extension's recurrence).
    #[command(subcommand)]
    Timers(TimersCommand),
    /// Create waits (served by an extension's dependency filter).
    #[command(subcommand)]
    Waits(WaitsCommand),
    /// Plan emissions (committed with an extension's emit.commit).
    #[command(subcommand)]
    Emissions(EmissionsCommand),
    /// Read stored artifacts.
    #[command(subcommand)]
    Artifacts(ArtifactsCommand),
    /// Run the daemon under systemd or launchd: install, uninstall, status.
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Print the running daemon's metrics (Prometheus text format).
    Metrics(metrics::Args),
}

#[derive(Debug, Subcommand)]
enum ServiceCommand {
    Install(service::InstallArgs),
    Uninstall(service::UninstallArgs),
    Status(service::StatusArgs),
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    Push(core_cmds::PushArgs),
    List(core_cmds::ListArgs),
}

#[derive(Debug, Subcommand)]
enum WorkCommand {
    List(core_cmds::ListArgs),
}

#[derive(Debug, Subcommand)]
enum TimersCommand {
    Add(core_cmds::TimerArgs),
}

#[derive(Debug, Subcommand)]
enum WaitsCommand {
    Add(core_cmds::WaitArgs),
}

#[derive(Debug, Subcommand)]
enum EmissionsCommand {
    Add(core_cmds::EmissionArgs),
}

#[derive(Debug, Subcommand)]
enum ArtifactsCommand {
    Get(core_cmds::ArtifactArgs),
}

#[derive(Debug, Subcommand)]
enum ExtCommand {
    Check(ext_check::Args),
    Install(ext_manage::InstallArgs),
    Remove(ext_manage::NameArgs),
    /// Enable an installed package (a running daemon starts it).
    Enable(ext_manage::NameArgs),
    /// Disable an installed package (a running daemon stops it).
    Disable(ext_manage::NameArgs),
    List(ext_status::ListArgs),
    Status(ext_status::StatusArgs),
    Restart(ext_status::RestartArgs),
    Logs(ext_logs::Args),
    Call(ext_status::CallArgs),
    Set(ext_set::Args),
}

#[derive(Debug, Subcommand)]
enum DaemonCommand {
    Run(daemon_run::Args),
}

impl Cli {
    /// The log filter a command uses when `CONDUIT_LOG` is unset: the daemon tells what it
    /// does; one-shot commands speak only of problems.
    pub(crate) fn default_log_filter(&self) -> &'static str {
        match self.command {
            Command::Daemon(_) => "info",
            _ => "warn",
        }
    }

    /// The log format: the flag, else CONDUIT_LOG_FORMAT, else text.
    pub(crate) fn log_format(&self) -> Result<conduit_host::telemetry::LogFormat, String> {
        match self.log_format {
            Some(f) => Ok(f),
            None => Ok(conduit_host::telemetry::LogFormat::from_env()?.unwrap_or_default()),
        }
    }

    /// The span export of `conduit daemon run` (none for other commands).
    pub(crate) fn otlp(&self) -> Result<Option<conduit_host::telemetry::otlp::Config>, String> {
        match &self.command {
            Command::Daemon(DaemonCommand::Run(a)) => {
                conduit_host::telemetry::otlp::config_from_env(a.otlp_endpoint.as_deref())
            }
            _ => Ok(None),
        }
    }
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
    let state = cli.state;
    match cli.command {
        Command::Ext(ExtCommand::Check(args)) => ext_check::run(args),
        Command::Ext(ExtCommand::Install(args)) => ext_manage::install(args, &state),
        Command::Ext(ExtCommand::Remove(args)) => ext_manage::remove(args, &state),
        Command::Ext(ExtCommand::Enable(args)) => ext_manage::set_enabled(args, true, &state),
        Command::Ext(ExtCommand::Disable(args)) => ext_manage::set_enabled(args, false, &state),
        Command::Ext(ExtCommand::List(args)) => ext_status::list(args, &state),
        Command::Ext(ExtCommand::Status(args)) => ext_status::status(args, &state),
        Command::Ext(ExtCommand::Restart(args)) => ext_status::restart(args, &state),
        Command::Ext(ExtCommand::Logs(args)) => ext_logs::run(args, &state),
        Command::Ext(ExtCommand::Call(args)) => ext_status::call(args, &state),
        Command::Ext(ExtCommand::Set(args)) => ext_set::run(args, &state),
        Command::Daemon(DaemonCommand::Run(args)) => daemon_run::run(args, &state),
        Command::Events(EventsCommand::Push(args)) => core_cmds::push(args, &state),
        Command::Events(EventsCommand::List(args)) => core_cmds::list_events(args, &state),
        Command::Work(WorkCommand::List(args)) => core_cmds::list_work(args, &state),
        Command::Timers(TimersCommand::Add(args)) => core_cmds::add_timer(args, &state),
        Command::Waits(WaitsCommand::Add(args)) => core_cmds::add_wait(args, &state),
        Command::Emissions(EmissionsCommand::Add(args)) => core_cmds::add_emission(args, &state),
        Command::Artifacts(ArtifactsCommand::Get(args)) => core_cmds::get_artifact(args, &state),
        Command::Service(ServiceCommand::Install(args)) => service::install(args, &state),
        Command::Service(ServiceCommand::Uninstall(args)) => service::uninstall(args, &state),
        Command::Service(ServiceCommand::Status(args)) => service::status(args, &state),
        Command::Metrics(args) => metrics::run(args, &state),
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
