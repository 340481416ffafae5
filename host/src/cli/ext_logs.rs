//! `conduit ext logs NAME [--lines N] [--follow | --previous]`: an extension's stderr log.
//!
//! The log lives in the state directory (`logs/NAME.log`, rotated once at 1 MiB into
//! `NAME.log.1`), so this reads it directly whether or not a daemon runs. Each run starts with a
//! marker line (`=== conduit: run started <time> pid <pid> version <version> ===`);
//! `--previous` shows the run before the last one. `--follow` polls the file and notices a
//! rotation (the file getting shorter) by starting again from its top.

use std::io::{Read, Seek, SeekFrom};
use std::process::ExitCode;
use std::time::Duration;

use conduit_host::packages;
use conduit_supervisor::log::LogFile;

use super::common::StateArgs;
use super::outcome::{CliError, print};

/// Show an extension's stderr log.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Each run of the extension starts its part of the log with a line like
  === conduit: run started 2026-12-01T23:59:00.123Z pid 4242 version 0.1.0 ===
The logs of a removed package are kept (`conduit ext remove --purge` deletes them); this
command needs the package installed, the files are logs/NAME.log and logs/NAME.log.1.

Exit codes: 0 printed; 1 cannot read the log; 2 no such package")]
pub(crate) struct Args {
    /// The package's name.
    #[arg(add = super::common::package_names())]
    name: String,
    /// How many of the last lines to show.
    #[arg(long, short = 'n', default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    lines: u64,
    /// Keep printing new lines as they are written (Ctrl-C stops).
    #[arg(long, short = 'f', conflicts_with_all = ["json", "previous"])]
    follow: bool,
    /// Show the run before the current (or last) one: a crashed run's last words after the
    /// restart that followed.
    #[arg(long, short = 'p')]
    previous: bool,
    /// Print {"name", "log", "previous", "lines": [...]} instead of the lines.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open_read_only()?;
    packages::get(&state, &args.name).map_err(CliError::usage)?;
    let log = LogFile::new(state.logs_dir().join(format!("{}.log", args.name)));
    let read = if args.previous {
        log.previous_run(args.lines as usize)
    } else {
        log.last_lines(args.lines as usize)
    };
    let lines = read.map_err(|e| {
        CliError::failure(anyhow::anyhow!("cannot read {}: {e}", log.path().display()))
    })?;
    if args.json {
        super::common::print_json(
            &serde_json::json!({ "name": args.name, "log": log.path(), "previous": args.previous, "lines": lines }),
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.previous && lines.is_empty() {
        note!(
            "(the log of `{}` holds no run before the last one)",
            args.name
        );
    }
    let mut text = lines.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    print(&text)?;
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    let mut follow = Follow::from_end(log.path());
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let new = follow.read_new();
        if !new.is_empty() {
            print(&String::from_utf8_lossy(&new))?;
        }
    }
}

/// What a log file gained since the last look, from where it ended when following began; a
/// rotation (the file getting shorter) starts again from its top. Shared by `--follow` and
/// `conduit ext dev`.
#[derive(Debug)]
pub(super) struct Follow {
    path: std::path::PathBuf,
    pos: u64,
}

/// The most one look reads, so a log written faster than it is followed is read in bounded
/// steps.
const MAX_READ: u64 = 1 << 20;

impl Follow {
    pub(super) fn from_end(path: &std::path::Path) -> Follow {
        Follow {
            path: path.to_owned(),
            pos: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        }
    }

    /// The bytes written since the last call (at most 1 MiB; the rest on the next call).
    pub(super) fn read_new(&mut self) -> Vec<u8> {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.pos {
            self.pos = 0; // rotated
        }
        let mut buf = Vec::new();
        if len > self.pos
            && f.seek(SeekFrom::Start(self.pos)).is_ok()
            && (&mut f).take(MAX_READ).read_to_end(&mut buf).is_ok()
        {
            self.pos += buf.len() as u64;
        }
        buf
    }
}
