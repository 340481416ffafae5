//! The command line: the clap tree and the dispatch to each subcommand; `outcome.rs` is the one
//! place errors become exit codes.
//!
//! One module per subcommand, each with its clap `Args` and its `run`. Adding a subcommand is
//! a variant here and a module beside this one: `conduit ext <sub>` goes in [`ExtCommand`], a
//! new group (`conduit daemon run`) in [`Command`].
//!
//! Exit codes every subcommand keeps: 0 success, 1 the command ran and found a failure (a
//! rule failed, a package is unhealthy), 2 a usage error or unusable input (clap's own code for
//! bad arguments; also an unknown package), 3 the command needs a running daemon and none
//! runs. A closed stdout (`conduit … | head`) is not an error.

/// A note on stderr for people (`(no daemon is running …)`), left out under `-q`.
macro_rules! note {
    ($($t:tt)*) => {
        if !$crate::cli::common::quiet() {
            eprintln!($($t)*);
        }
    };
}

mod artifacts;
mod common;
mod config;
mod core_end;
mod daemon_run;
mod docs_gen;
mod doctor;
mod ext_check;
mod ext_dev;
mod ext_logs;
mod ext_manage;
mod ext_new;
mod ext_pending;
mod ext_set;
mod ext_status;
mod ext_wait;
mod gc;
mod metrics;
mod outcome;
mod records;
mod records_lists;
mod service;
mod table;
mod top;
mod web;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use outcome::CliError;

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
  conduit ext new NAME --lang python    a new package (rust, python or node) that passes the check
  conduit ext dev ./my-package          rebuild and restart it on every change (Ctrl-C ends)
  conduit doctor                        is this installation healthy? each check with its fix

Exit codes: 0 success; 1 the command found a failure; 2 usage error or unusable input;
3 the command needs a running daemon and none runs. `conduit <command> --help` has more.

Shell completions, package names included: `conduit completions bash|zsh|fish|elvish|powershell`
(see its --help).
NO_COLOR (set and not empty) turns colours off everywhere."
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
    /// More log lines on stderr: -v one level more than the command's default (`warn`, or
    /// `info` for the daemon), -vv two, -vvv everything. CONDUIT_LOG, when set, wins.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    verbose: u8,
    /// Only errors on stderr: no log lines below `error`, and no notes such as
    /// "(no daemon is running …)". Data on stdout is unchanged.
    #[arg(short, long, global = true)]
    quiet: bool,
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
    /// List and close Work.
    #[command(subcommand)]
    Work(WorkCommand),
    /// Create, list and delete timers (served by an extension's recurrence).
    #[command(subcommand)]
    Timers(TimersCommand),
    /// Create, list and cancel waits (served by an extension's dependency filter).
    #[command(subcommand)]
    Waits(WaitsCommand),
    /// Plan and list emissions (committed with an extension's emit.commit).
    #[command(subcommand)]
    Emissions(EmissionsCommand),
    /// List and read stored artifacts.
    #[command(subcommand)]
    Artifacts(ArtifactsCommand),
    /// Show and change the daemon's settings (retention).
    #[command(subcommand)]
    Config(config::Command),
    /// Remove what retention allows now (artifact content, logs of earlier runs), or list it.
    Gc(gc::Args),
    /// Run the daemon under systemd or launchd: install, uninstall, status.
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Print the running daemon's metrics (Prometheus text format).
    Metrics(metrics::Args),
    /// Check this installation: each check ok, warn or fail, with the command that fixes it.
    Doctor(doctor::Args),
    Top(top::Args),
    Web(web::Args),
    /// Print a shell completion script (subcommands, flags, installed package names).
    Completions(docs_gen::CompletionsArgs),
    /// Write man pages (one per command) into a folder (`make man` runs this).
    #[command(hide = true)]
    Man(docs_gen::ManArgs),
}

#[derive(Debug, Subcommand)]
enum ServiceCommand {
    Install(service::InstallArgs),
    Uninstall(service::UninstallArgs),
    Status(service::StatusArgs),
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    Push(records::PushArgs),
    List(records::ListArgs),
}

#[derive(Debug, Subcommand)]
enum WorkCommand {
    List(records::ListArgs),
    Close(core_end::CloseWorkArgs),
}

#[derive(Debug, Subcommand)]
enum TimersCommand {
    Add(records::TimerArgs),
    /// List timers, oldest first: when each fires next and last fired.
    List(records_lists::ListArgs),
    /// Show one timer.
    Show(records_lists::ShowArgs),
    Delete(core_end::DeleteTimerArgs),
}

#[derive(Debug, Subcommand)]
enum WaitsCommand {
    Add(records::WaitArgs),
    /// List waits, oldest first: active, or satisfied and by which event.
    List(records_lists::ListArgs),
    /// Show one wait.
    Show(records_lists::ShowArgs),
    Cancel(core_end::CancelWaitArgs),
}

#[derive(Debug, Subcommand)]
enum EmissionsCommand {
    Add(records::EmissionArgs),
    /// List emissions, oldest first: planned, committed or failed (with the error).
    List(records_lists::ListArgs),
    /// Show one emission with the records its commit wrote.
    Show(records_lists::ShowArgs),
}

#[derive(Debug, Subcommand)]
enum ArtifactsCommand {
    Get(records::ArtifactArgs),
    /// List artifacts, oldest first, whether their content is kept or was removed by retention.
    List(records_lists::ListArgs),
    Show(artifacts::ShowArgs),
}

#[derive(Debug, Subcommand)]
enum ExtCommand {
    Check(ext_check::Args),
    Install(ext_manage::InstallArgs),
    Remove(ext_manage::RemoveArgs),
    /// Enable an installed package (a running daemon starts it).
    Enable(ext_manage::EnableArgs),
    /// Disable an installed package (a running daemon stops it).
    Disable(ext_manage::DisableArgs),
    Rollback(ext_manage::RollbackArgs),
    List(ext_status::ListArgs),
    Status(ext_status::StatusArgs),
    Restart(ext_status::RestartArgs),
    Logs(ext_logs::Args),
    Call(ext_status::CallArgs),
    New(ext_new::Args),
    Set(ext_set::Args),
    Dev(ext_dev::Args),
}

#[derive(Debug, Subcommand)]
enum DaemonCommand {
    Run(daemon_run::Args),
}

impl Cli {
    /// The log filter a command uses when `CONDUIT_LOG` is unset: the daemon tells what it
    /// does; one-shot commands speak only of problems. `-q` lowers it to `error`, each `-v`
    /// raises it one level.
    pub(crate) fn default_log_filter(&self) -> &'static str {
        const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];
        if self.quiet {
            return "error";
        }
        let base = match self.command {
            Command::Daemon(_) => 2,
            _ => 1,
        };
        LEVELS[(base + usize::from(self.verbose)).min(LEVELS.len() - 1)]
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

/// Run the parsed command line.
pub(crate) fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let state = cli.state;
    let quiet = cli.quiet;
    common::set_quiet(quiet);
    use records_lists::Kind;
    match cli.command {
        Command::Ext(ExtCommand::Check(args)) => ext_check::run(args),
        Command::Ext(ExtCommand::Install(args)) => ext_manage::install(args, &state, quiet),
        Command::Ext(ExtCommand::Remove(args)) => ext_manage::remove(args, &state),
        Command::Ext(ExtCommand::Enable(args)) => ext_manage::enable(args, &state, quiet),
        Command::Ext(ExtCommand::Disable(args)) => ext_manage::disable(args, &state),
        Command::Ext(ExtCommand::Rollback(args)) => ext_manage::rollback(args, &state, quiet),
        Command::Ext(ExtCommand::List(args)) => ext_status::list(args, &state),
        Command::Ext(ExtCommand::Status(args)) => ext_status::status(args, &state),
        Command::Ext(ExtCommand::Restart(args)) => ext_status::restart(args, &state, quiet),
        Command::Ext(ExtCommand::Logs(args)) => ext_logs::run(args, &state),
        Command::Ext(ExtCommand::Call(args)) => ext_status::call(args, &state),
        Command::Ext(ExtCommand::New(args)) => ext_new::run(args),
        Command::Ext(ExtCommand::Set(args)) => ext_set::run(args, &state),
        Command::Ext(ExtCommand::Dev(args)) => ext_dev::run(args, &state, quiet),
        Command::Daemon(DaemonCommand::Run(args)) => daemon_run::run(args, &state),
        Command::Events(EventsCommand::Push(args)) => records::push(args, &state),
        Command::Events(EventsCommand::List(args)) => records::list_events(args, &state),
        Command::Work(WorkCommand::List(args)) => records::list_work(args, &state),
        Command::Work(WorkCommand::Close(args)) => core_end::close_work(args, &state),
        Command::Timers(TimersCommand::Delete(args)) => core_end::delete_timer(args, &state),
        Command::Waits(WaitsCommand::Cancel(args)) => core_end::cancel_wait(args, &state),
        Command::Timers(TimersCommand::Add(args)) => records::add_timer(args, &state),
        Command::Timers(TimersCommand::List(args)) => {
            records_lists::list(Kind::Timers, args, &state)
        }
        Command::Timers(TimersCommand::Show(args)) => {
            records_lists::show(Kind::Timers, args, &state)
        }
        Command::Waits(WaitsCommand::Add(args)) => records::add_wait(args, &state),
        Command::Waits(WaitsCommand::List(args)) => records_lists::list(Kind::Waits, args, &state),
        Command::Waits(WaitsCommand::Show(args)) => records_lists::show(Kind::Waits, args, &state),
        Command::Emissions(EmissionsCommand::Add(args)) => records::add_emission(args, &state),
        Command::Emissions(EmissionsCommand::List(args)) => {
            records_lists::list(Kind::Emissions, args, &state)
        }
        Command::Emissions(EmissionsCommand::Show(args)) => {
            records_lists::show(Kind::Emissions, args, &state)
        }
        Command::Artifacts(ArtifactsCommand::Get(args)) => records::get_artifact(args, &state),
        Command::Artifacts(ArtifactsCommand::List(args)) => artifacts::list(args, &state),
        Command::Artifacts(ArtifactsCommand::Show(args)) => artifacts::show(args, &state),
        Command::Config(cmd) => config::run(cmd, &state),
        Command::Gc(args) => gc::run(args, &state),
        Command::Service(ServiceCommand::Install(args)) => service::install(args, &state),
        Command::Service(ServiceCommand::Uninstall(args)) => service::uninstall(args, &state),
        Command::Service(ServiceCommand::Status(args)) => service::status(args, &state),
        Command::Metrics(args) => metrics::run(args, &state),
        Command::Doctor(args) => doctor::run(args, &state),
        Command::Top(args) => top::run(args, &state),
        Command::Web(args) => web::run(args, &state),
        Command::Completions(args) => docs_gen::completions(args),
        Command::Man(args) => docs_gen::man(args, Cli::command()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(args: &[&str]) -> &'static str {
        let mut all = vec!["conduit"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap().default_log_filter()
    }

    #[test]
    fn quiet_and_verbose_move_the_default_log_filter() {
        assert_eq!(filter(&["ext", "list"]), "warn");
        assert_eq!(filter(&["ext", "list", "-v"]), "info");
        assert_eq!(filter(&["-vv", "ext", "list"]), "debug");
        assert_eq!(filter(&["ext", "list", "-vvvvv"]), "trace");
        assert_eq!(filter(&["ext", "list", "-q"]), "error");
        assert_eq!(filter(&["daemon", "run"]), "info");
        assert_eq!(filter(&["daemon", "run", "-v"]), "debug");
        assert_eq!(filter(&["-q", "daemon", "run"]), "error");
        assert!(Cli::try_parse_from(["conduit", "-q", "-v", "ext", "list"]).is_err());
    }

    #[test]
    fn the_command_tree_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
