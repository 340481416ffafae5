//! What `conduit ext dev` tells its user: one [`Event`] per thing that happened, written as a
//! line of text, or with `--json` as one JSON object a line (`{"event": "<kind>", …}`, the
//! fields below; docs/operations.md, "The development loop", lists them).
//!
//! A leaf: the session, the watcher, the build and the scratch daemon all report through it.

use serde::Serialize;

use crate::cli::outcome::{CliError, print};

/// One thing the session reports.
#[derive(Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(super) enum Event {
    /// The session began: what, from where, against which daemon.
    Session {
        name: String,
        version: String,
        path: String,
        state_dir: String,
        /// `running` (a daemon that was already running) or `standalone` (a scratch one).
        daemon: &'static str,
        debounce_ms: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        build: Option<String>,
    },
    /// The files changed (paths relative to the package folder, at most 20; `more` the rest).
    Change {
        paths: Vec<String>,
        more: usize,
    },
    BuildStarted {
        command: String,
    },
    BuildOutput {
        line: String,
    },
    /// A build ended. A failed one keeps what runs (`kept`: a version is installed and keeps
    /// running); `tail` is its last lines.
    BuildFinished {
        ok: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        took_ms: u64,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tail: Vec<String>,
        kept: bool,
    },
    /// The development install was (re)written and the daemon told to (re)start it.
    Installed {
        name: String,
        version: String,
    },
    /// The package could not be installed (its manifest, usually); what ran keeps running.
    InstallFailed {
        error: String,
        kept: bool,
    },
    /// The extension's state changed: `ready` with its pid, or why it is not running.
    State {
        state: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
        version: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A line the extension wrote to stderr (or a run marker of its log).
    Stderr {
        line: String,
    },
    /// A call the host made to it.
    Call {
        seq: u64,
        method: String,
        took_us: u64,
        outcome: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        error_code: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Calls made too fast to show: they fell off the daemon's journal unread.
    MissedCalls {
        missed: u64,
    },
    /// Something to know that is none of the above.
    Note {
        message: String,
    },
    /// The session ended: how, and what it left (`kept`: the dev install stays).
    Ended {
        by: String,
        removed: bool,
        kept: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        scratch_removed: Option<bool>,
    },
}

/// Where events go: text or JSON lines on stdout.
#[derive(Debug, Clone, Copy)]
pub(super) struct Out {
    pub(super) json: bool,
    /// `-q`: notes are left out of the text.
    pub(super) quiet: bool,
}

impl Out {
    pub(super) fn emit(&self, name: &str, ev: &Event) -> Result<(), CliError> {
        if self.json {
            let mut line = serde_json::to_string(ev)
                .map_err(|e| CliError::failure(anyhow::anyhow!("cannot write an event: {e}")))?;
            line.push('\n');
            return print(&line);
        }
        if self.quiet && matches!(ev, Event::Note { .. }) {
            return Ok(());
        }
        print(&format!("{}\n", text(name, ev)))
    }
}

/// The text line of an event.
pub(super) fn text(name: &str, ev: &Event) -> String {
    match ev {
        Event::Session {
            name,
            version,
            path,
            state_dir,
            daemon,
            debounce_ms,
            build,
        } => {
            let on = if *daemon == "standalone" {
                format!("a scratch daemon in {state_dir}")
            } else {
                format!("the running daemon of {state_dir}")
            };
            let build = match build {
                Some(b) => format!("; build: {b}"),
                None => String::new(),
            };
            format!(
                "dev: {name} {version} from {path} on {on}; watching for changes ({debounce_ms} ms quiet){build}. Ctrl-C ends the session"
            )
        }
        Event::Change { paths, more } => {
            let more = if *more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("change: {}{more}", paths.join(", "))
        }
        Event::BuildStarted { command } => format!("build: $ {command}"),
        Event::BuildOutput { line } => format!("build| {line}"),
        Event::BuildFinished {
            ok: true, took_ms, ..
        } => format!("build: ok in {}", secs(*took_ms)),
        Event::BuildFinished {
            exit_code,
            took_ms,
            kept,
            ..
        } => {
            let how = match exit_code {
                Some(c) => format!("exit {c}"),
                None => "killed by a signal".to_owned(),
            };
            let then = if *kept {
                "the last good version keeps running"
            } else {
                "nothing is installed yet"
            };
            format!(
                "build: FAILED ({how}) after {}; {then}; fix and save to build again",
                secs(*took_ms)
            )
        }
        Event::Installed { name, version } => {
            format!("dev: installed {name} {version} (development install); (re)starting it")
        }
        Event::InstallFailed { error, kept } => format!(
            "dev: not installed: {error}{}",
            if *kept {
                "; the last good version keeps running"
            } else {
                ""
            }
        ),
        Event::State {
            state,
            pid,
            version,
            error,
        } => match (pid, error) {
            (Some(pid), _) if state == "ready" => format!("ready: {name} {version} pid {pid}"),
            (_, Some(e)) => format!("{state}: {name} {version}: {e}"),
            _ => format!("{state}: {name} {version}"),
        },
        Event::Stderr { line } => format!("{name}| {line}"),
        Event::Call {
            method,
            took_us,
            outcome,
            error_code,
            error,
            ..
        } => {
            let took = if *took_us >= 10_000 {
                format!("{:.0} ms", *took_us as f64 / 1000.0)
            } else {
                format!("{:.2} ms", *took_us as f64 / 1000.0)
            };
            match (error_code, error) {
                (Some(c), Some(e)) => format!("call: {method} {took} {outcome} {c}: {e}"),
                _ => format!("call: {method} {took} {outcome}"),
            }
        }
        Event::MissedCalls { missed } => {
            format!("call: … {missed} calls made too fast to show")
        }
        Event::Note { message } => format!("dev: {message}"),
        Event::Ended {
            by,
            removed,
            kept,
            scratch_removed,
        } => {
            let mut s = format!("dev: ended by {by}");
            if *removed {
                s.push_str(&format!("; the development install of {name} is removed"));
            }
            if *kept {
                s.push_str(&format!(
                    "; {name} is kept as a development install (`conduit ext remove {name}` removes it)"
                ));
            }
            match scratch_removed {
                Some(true) => s.push_str("; the scratch daemon is stopped and its folder removed"),
                Some(false) => s.push_str("; the scratch daemon's folder could not be removed"),
                None => {}
            }
            s
        }
    }
}

fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}
