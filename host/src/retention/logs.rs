//! Retention of `<state>/logs/`: which files are logs of earlier runs (and may go), which are
//! the current logs of installed packages (which stay), and which to remove by age and by the
//! folder's budget.
//!
//! ```text
//!   logs/<installed>.log        current        never removed (capped at 1 MiB by the supervisor)
//!   logs/<name>.log.1           earlier runs   removable (the rotated part of a log)
//!   logs/<removed>.log          earlier runs   removable (`ext remove` keeps logs)
//!   logs/<name>.log.new         a rotation's leftover, removable once a minute old
//!   anything else (daemon.log)  not ours       never removed, but counted in the folder's size
//! ```
//!
//! The decision ([`plan`]) is a pure function of the files' names, sizes and times and an
//! injected `now`; [`scan`] gathers those facts and [`remove`] applies the plan. The folder holds
//! two files per package ever installed, so one listing per sweep is cheap.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use conduit_store::RemovalReason;
use serde::Serialize;

use super::settings::LogLimits;

/// The daemon's own log under launchd (`service/launchd.rs`), which launchd holds open.
const LAUNCHD_LOG: &str = "daemon.log";

/// A rotation's temporary file this young may still be in use.
const LEFTOVER_MIN_AGE: Duration = Duration::from_secs(60);

/// What a file in `logs/` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogClass {
    /// The log an installed package writes to now.
    Current,
    /// A log of earlier runs: rotated, or of a package no longer installed.
    Previous,
    /// A rotation's temporary file.
    Leftover,
    /// Not a package's log (the launchd daemon log, anything put there by hand).
    Other,
}

/// One file of `logs/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFile {
    pub name: String,
    pub size: u64,
    pub modified_ms: i64,
    pub class: LogClass,
}

/// What a file in `logs/` named `name` is, given the installed packages.
pub fn classify(name: &str, installed: &HashSet<String>) -> LogClass {
    if let Some(pkg) = name.strip_suffix(".log") {
        return if installed.contains(pkg) {
            LogClass::Current
        } else if name == LAUNCHD_LOG {
            LogClass::Other
        } else {
            LogClass::Previous
        };
    }
    if name.ends_with(".log.1") {
        return LogClass::Previous;
    }
    if name.ends_with(".log.new") {
        return LogClass::Leftover;
    }
    LogClass::Other
}

/// Which files go, oldest first, and why: every removable file older than `max_age`, then,
/// while the folder (every file, kept ones included) is over `max_bytes`, the oldest removable
/// one left. The folder's bytes over the budget after that are returned too (the current logs
/// and files not ours are never removed).
pub fn plan(
    files: &[LogFile],
    limits: LogLimits,
    now_ms: i64,
) -> (Vec<(usize, RemovalReason)>, u64) {
    let age_cutoff = now_ms.saturating_sub(limits.max_age.as_millis() as i64);
    let leftover_cutoff = now_ms.saturating_sub(LEFTOVER_MIN_AGE.as_millis() as i64);
    let mut removable: Vec<usize> = (0..files.len())
        .filter(|&i| match files[i].class {
            LogClass::Previous => true,
            LogClass::Leftover => files[i].modified_ms < leftover_cutoff,
            LogClass::Current | LogClass::Other => false,
        })
        .collect();
    removable.sort_by_key(|&i| (files[i].modified_ms, files[i].name.clone()));
    let mut total: u64 = files.iter().map(|f| f.size).sum();
    let mut out = Vec::new();
    for i in removable {
        let reason = if files[i].modified_ms < age_cutoff {
            RemovalReason::Age
        } else if total > limits.max_bytes {
            RemovalReason::Budget
        } else {
            // Sorted by age: nothing younger is old, and the folder is within its budget.
            break;
        };
        total -= files[i].size;
        out.push((i, reason));
    }
    (out, total.saturating_sub(limits.max_bytes))
}

/// The files of `dir` with their sizes and modification times, classified. A folder that
/// does not exist yet holds no logs.
pub fn scan(dir: &Path, installed: &HashSet<String>) -> std::io::Result<Vec<LogFile>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry?;
        let Ok(meta) = entry.metadata() else {
            continue; // removed meanwhile
        };
        if !meta.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let modified_ms = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as i64);
        out.push(LogFile {
            class: classify(&name, installed),
            name,
            size: meta.len(),
            modified_ms,
        });
    }
    Ok(out)
}

/// Removes one planned file; a file already gone counts as removed.
pub fn remove(dir: &Path, file: &LogFile) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(&file.name)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_MS: i64 = 86_400_000;

    fn file(name: &str, size: u64, age_days: i64, installed: &HashSet<String>) -> LogFile {
        LogFile {
            name: name.to_owned(),
            size,
            modified_ms: 100 * DAY_MS - age_days * DAY_MS,
            class: classify(name, installed),
        }
    }

    #[test]
    fn names_say_what_a_file_is() {
        let installed: HashSet<String> = ["notes".to_owned()].into();
        assert_eq!(classify("notes.log", &installed), LogClass::Current);
        assert_eq!(classify("notes.log.1", &installed), LogClass::Previous);
        assert_eq!(classify("gone.log", &installed), LogClass::Previous);
        assert_eq!(classify("gone.log.1", &installed), LogClass::Previous);
        assert_eq!(classify("notes.log.new", &installed), LogClass::Leftover);
        assert_eq!(classify("daemon.log", &installed), LogClass::Other);
        let daemon: HashSet<String> = ["daemon".to_owned()].into();
        assert_eq!(classify("daemon.log", &daemon), LogClass::Current);
        assert_eq!(classify("README", &installed), LogClass::Other);
        assert_eq!(classify("notes.log.2", &installed), LogClass::Other);
    }

    #[test]
    fn earlier_runs_go_by_age_then_oldest_first_past_the_budget_and_current_logs_stay() {
        let installed: HashSet<String> = ["a".to_owned(), "b".to_owned()].into();
        let files = vec![
            file("a.log", 100, 90, &installed),    // current, however old
            file("a.log.1", 100, 40, &installed),  // past max_age
            file("b.log.1", 100, 5, &installed),   // young
            file("gone.log", 100, 10, &installed), // a removed package's
            file("gone.log.1", 100, 20, &installed),
            file("notes.txt", 100, 99, &installed), // not ours
        ];
        let limits = LogLimits {
            max_age: Duration::from_secs(30 * 86_400),
            max_bytes: 350,
        };
        let (out, over) = plan(&files, limits, 100 * DAY_MS);
        let names: Vec<(&str, RemovalReason)> = out
            .iter()
            .map(|&(i, r)| (files[i].name.as_str(), r))
            .collect();
        // 600 bytes: a.log.1 goes for its age (500), then the oldest removable while over 350:
        // gone.log.1 (400), gone.log (300). b.log.1 stays: within the budget now.
        assert_eq!(
            names,
            vec![
                ("a.log.1", RemovalReason::Age),
                ("gone.log.1", RemovalReason::Budget),
                ("gone.log", RemovalReason::Budget),
            ]
        );
        assert_eq!(over, 0);
        // A budget the kept files alone exceed: everything removable goes, the rest is over.
        let (out, over) = plan(
            &files,
            LogLimits {
                max_age: Duration::from_secs(30 * 86_400),
                max_bytes: 150,
            },
            100 * DAY_MS,
        );
        assert_eq!(out.len(), 4);
        assert_eq!(over, 50, "a.log and notes.txt stay: 200 bytes against 150");
        // Exactly at the budget: nothing goes for size.
        let (out, _) = plan(
            &files[2..4],
            LogLimits {
                max_age: Duration::from_secs(30 * 86_400),
                max_bytes: 200,
            },
            100 * DAY_MS,
        );
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn a_rotation_leftover_goes_only_once_it_is_a_minute_old() {
        let installed = HashSet::new();
        let now = 100 * DAY_MS;
        let mut f = file("x.log.new", 10, 0, &installed);
        let limits = LogLimits {
            max_age: Duration::from_secs(86_400),
            max_bytes: 0,
        };
        f.modified_ms = now - 59_000;
        assert!(plan(std::slice::from_ref(&f), limits, now).0.is_empty());
        f.modified_ms = now - 61_000;
        assert_eq!(plan(&[f], limits, now).0.len(), 1);
    }
}
