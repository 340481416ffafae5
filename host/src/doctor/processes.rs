//! Stale pid ledgers and escaped processes. Each running extension's processes are recorded
//! in `run/<name>.pids` (`conduit_supervisor::tree::Ledger`); a ledger is removed when its run
//! ends cleanly and swept at the next daemon start. So a ledger with no daemon, or of an
//! extension the daemon does not run, is stale — and if what it names still runs, those
//! processes escaped their extension's end. A running extension's recorded processes that are
//! no longer in its tree left it (they are still killed when its run ends).
//!
//! Read-only: ledgers are read, processes looked at in `/proc`, nothing removed or signalled.

use std::collections::BTreeSet;

use conduit_supervisor::tree::{self, LEDGER_SUFFIX, Ledger};

use super::live::Answer;
use super::report::Check;
use super::text::sh;
use crate::state_dir::StateDir;

pub(super) fn check(state: &StateDir, live: Option<&Answer>) -> Check {
    const NAME: &str = "processes";
    let run = state.run_dir();
    let mut ledgers: Vec<(String, std::path::PathBuf)> = std::fs::read_dir(&run)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let name = path
                .file_name()?
                .to_str()?
                .strip_suffix(LEDGER_SUFFIX)?
                .to_owned();
            Some((name, path))
        })
        .collect();
    ledgers.sort();
    let mut escaped: Vec<(String, Vec<u32>)> = Vec::new();
    let mut strayed: Vec<(String, Vec<u32>)> = Vec::new();
    let mut stale: Vec<std::path::PathBuf> = Vec::new();
    for (name, path) in &ledgers {
        let recorded = Ledger::new(path).read();
        let running = tree::still_running(&recorded);
        let pids: BTreeSet<u32> = running.iter().map(|p| p.id.pid).collect();
        let live_run = live.and_then(|l| {
            l.views
                .iter()
                .find(|v| &v.status.name == name && v.status.pid.is_some())
        });
        match live_run {
            Some(v) => {
                // Its pid and its tree as the daemon last saw them are where they belong.
                let own: BTreeSet<u32> = v
                    .status
                    .pid
                    .into_iter()
                    .chain(v.status.descendants.iter().copied())
                    .collect();
                let out: Vec<u32> = pids.difference(&own).copied().collect();
                // Whatever left the tree since the daemon's last look is counted only if it
                // is still outside the tree now.
                let now: BTreeSet<u32> = v
                    .status
                    .pid
                    .map(|p| tree::tree(p).iter().map(|s| s.id.pid).collect())
                    .unwrap_or_default();
                let out: Vec<u32> = out.into_iter().filter(|p| !now.contains(p)).collect();
                if !out.is_empty() {
                    strayed.push((name.clone(), out));
                }
            }
            None if pids.is_empty() => stale.push(path.clone()),
            None => escaped.push((name.clone(), pids.into_iter().collect())),
        }
    }
    let list = |v: &[(String, Vec<u32>)]| -> String {
        v.iter()
            .map(|(n, p)| {
                let pids: Vec<String> = p.iter().map(u32::to_string).collect();
                format!("{n}: {}", pids.join(" "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let all_pids = |v: &[(String, Vec<u32>)]| -> String {
        v.iter()
            .flat_map(|(_, p)| p.iter().map(u32::to_string))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if !escaped.is_empty() {
        let whose = if live.is_some() {
            "extensions the daemon does not run"
        } else {
            "extensions of a daemon that is not running"
        };
        return Check::fail(
            NAME,
            format!(
                "processes of {whose} still run (escaped their extension's end): {}",
                list(&escaped)
            ),
            format!("kill {}", all_pids(&escaped)),
        );
    }
    if !strayed.is_empty() {
        let names: Vec<&str> = strayed.iter().map(|(n, _)| n.as_str()).collect();
        return Check::warn(
            NAME,
            format!(
                "processes left their extension's process tree (they are still killed when its run ends): {}",
                list(&strayed)
            ),
            format!(
                "conduit ext restart {}",
                names.join(" && conduit ext restart ")
            ),
        );
    }
    if !stale.is_empty() {
        let paths: Vec<String> = stale.iter().map(|p| sh(p)).collect();
        return Check::warn(
            NAME,
            format!(
                "stale pid ledgers (nothing they name runs; the next daemon start removes them): {}",
                paths.join(" ")
            ),
            format!("rm -f {}", paths.join(" ")),
        );
    }
    Check::ok(
        NAME,
        match ledgers.len() {
            0 => "no pid ledgers, no escaped processes".to_owned(),
            n => format!(
                "{n} pid ledger{} of running extensions, no escaped processes",
                if n == 1 { "" } else { "s" }
            ),
        },
    )
}
