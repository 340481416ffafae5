//! The checks that ask the running daemon, through its management API as any client does:
//! is it running and answering (and the same version as this binary), and is any extension in
//! trouble — crash-looping, refused, incompatible, unresponsive, over its limits, backing off
//! or degraded, by the one rule the health endpoint uses (`daemon::trouble`).

use std::sync::Arc;
use std::time::Instant;

use super::options::Options;
use super::report::Check;
use super::service::Installed;
use super::text::sh;
use crate::client::Client;
use crate::daemon::ExtensionView;
use crate::daemon::trouble::{self, Trouble};
use crate::state_dir::StateDir;

/// What the daemon answered.
#[derive(Debug)]
pub(super) struct Answer {
    /// Its pid, as its health says.
    pub(super) pid: Option<u32>,
    pub(super) views: Vec<ExtensionView>,
}

/// The daemon check and, when the daemon answered, what it said.
pub(super) struct Live {
    pub(super) check: Check,
    pub(super) answer: Option<Arc<Answer>>,
}

/// How to start the daemon here: the service when one is installed, else by hand.
fn start_command(o: &Options, unit: Option<&Installed>) -> String {
    match unit.filter(|u| u.generated) {
        Some(_) => o.service_config().restart_command(),
        None => {
            let mut cmd = String::from("conduit");
            if o.state_dir.source != crate::state_dir::StateDirSource::PlatformDefault {
                cmd.push_str(&format!(" --state-dir {}", sh(&o.state_dir.path)));
            }
            cmd.push_str(" daemon run");
            cmd
        }
    }
}

/// Is a daemon running on the state directory, and does it answer within the bound?
pub(super) async fn daemon(
    o: &Options,
    state: Option<&StateDir>,
    unit: Option<&Installed>,
) -> Live {
    const NAME: &str = "daemon";
    let start = start_command(o, unit);
    let not_running = |found: String| Live {
        check: Check::warn(NAME, found, start.clone()),
        answer: None,
    };
    let Some(state) = state else {
        return not_running("not running (no state directory)".into());
    };
    let socket = crate::daemon::socket_path(state);
    // The pid a running daemon wrote into its lock file (read, never locked: taking even a
    // shared lock could make a daemon starting now think another holds it).
    let lock_pid: Option<u32> = std::fs::read_to_string(state.lock_path())
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
    if !socket.exists() {
        return not_running(format!("not running on {}", state.path().display()));
    }
    let Some(client) = Client::connect(&socket).await else {
        return match lock_pid {
            Some(pid) => Live {
                check: Check::fail(
                    NAME,
                    format!(
                        "pid {pid} holds the state directory's lock but its socket {} refuses connections",
                        socket.display()
                    ),
                    format!("kill -TERM {pid} && {start}"),
                ),
                answer: None,
            },
            None => not_running(format!(
                "not running on {} (a stale socket {} is left from a daemon that did not stop cleanly)",
                state.path().display(),
                socket.display()
            )),
        };
    };
    let asked = Instant::now();
    let get = |path: &'static str| {
        let client = client.clone();
        async move {
            match tokio::time::timeout(o.daemon_timeout, client.get(path)).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(format!("{path}: {e:#}")),
                Err(_) => Err(format!(
                    "{path} was not answered within {:.0} s",
                    o.daemon_timeout.as_secs_f64()
                )),
            }
        }
    };
    let answered = match get("/v1/health").await {
        Ok(h) => get("/v1/extensions").await.map(|e| (h, e)),
        Err(e) => Err(e),
    };
    let took = asked.elapsed();
    let (health, list) = match answered {
        Ok(v) => v,
        Err(e) => {
            let pid = lock_pid.map_or("its pid is unknown".to_owned(), |p| format!("pid {p}"));
            let fix = match lock_pid {
                Some(p) => format!("kill -TERM {p} && {start}"),
                None => start.clone(),
            };
            return Live {
                check: Check::fail(
                    NAME,
                    format!("the daemon ({pid}) accepts connections but does not answer: {e}"),
                    fix,
                ),
                answer: None,
            };
        }
    };
    let views: Vec<ExtensionView> =
        serde_json::from_value(list["extensions"].clone()).unwrap_or_default();
    let pid = health["pid"].as_u64().map(|p| p as u32);
    let version = health["version"].as_str().unwrap_or("?");
    let up = health["started_at_ms"]
        .as_i64()
        .map(|t| trouble::duration_text((conduit_supervisor::now_ms() - t).max(0) as f64 / 1e3))
        .unwrap_or_else(|| "?".into());
    let found = format!(
        "running, pid {}, conduit {version}, up {up}, answered in {} ms",
        pid.map_or("?".into(), |p| p.to_string()),
        took.as_millis()
    );
    let check = if version != env!("CARGO_PKG_VERSION") {
        Check::warn(
            NAME,
            format!(
                "{found}; this binary is conduit {}: the daemon runs another version",
                env!("CARGO_PKG_VERSION")
            ),
            match unit.filter(|u| u.generated) {
                Some(_) => o.service_config().restart_command(),
                None => format!(
                    "kill -TERM {} && {start}",
                    pid.map_or("PID".into(), |p| p.to_string())
                ),
            },
        )
    } else {
        Check::ok(NAME, found)
    };
    Live {
        check,
        answer: Some(Arc::new(Answer { pid, views })),
    }
}

/// One line for the extensions when none is in trouble; else one line per extension in
/// trouble, with the command that fixes (or shows how to fix) it.
pub(super) fn extensions(answer: &Answer) -> Vec<Check> {
    let summary = trouble::summarize(&answer.views);
    if summary.troubled.is_empty() {
        return vec![Check::ok("extensions", summary.line())];
    }
    let now = conduit_supervisor::now_ms();
    summary
        .troubled
        .iter()
        .map(|t| {
            let view = answer.views.iter().find(|v| v.status.name == t.name);
            let name = &t.name;
            let since = t
                .since_ms
                .map(|at| format!(" since {}", trouble::since_text(at, now)))
                .unwrap_or_default();
            let why = t
                .reason
                .as_deref()
                .map(|r| format!(": {}", super::text::cut(r, 240)))
                .unwrap_or_default();
            let restarts = view.map_or(0, |v| v.status.restarts);
            let found = format!("{}{since}{why} ({restarts} restarts)", t.trouble);
            let fix = fix_for(t.trouble, name, view);
            let check_name = format!("extension {name}");
            if t.trouble.needs_someone() {
                Check::fail(check_name, found, fix)
            } else {
                Check::warn(check_name, found, fix)
            }
        })
        .collect()
}

/// The command that fixes `trouble`, or where none alone can, the one that shows why.
fn fix_for(trouble: Trouble, name: &str, view: Option<&ExtensionView>) -> String {
    match trouble {
        Trouble::Unresponsive | Trouble::Degraded => format!(
            "conduit ext restart {name}   # and read why it stopped answering: conduit ext logs {name}"
        ),
        Trouble::CrashLooping | Trouble::BackingOff => format!(
            "conduit ext logs {name} --previous   # why its runs end; after the fix: conduit ext restart {name} (or stop the retries: conduit ext disable {name})"
        ),
        Trouble::Refused => {
            let error = view
                .and_then(|v| v.status.last_error.as_deref())
                .unwrap_or("");
            // The tamper check's own message names the command that fixes it.
            match error
                .split("reinstall it with `")
                .nth(1)
                .and_then(|r| r.split('`').next())
            {
                Some(cmd) => cmd.to_owned(),
                None => format!(
                    "conduit ext status {name}   # the reason; after the fix: conduit ext restart {name}"
                ),
            }
        }
        Trouble::Incompatible => format!(
            "conduit ext status {name}   # both sides' protocol versions; install a version of it that speaks this host's"
        ),
        Trouble::OverLimit => {
            let limits = view
                .and_then(|v| v.status.resources.as_ref())
                .map(|r| r.limits);
            let reason = view
                .and_then(|v| v.status.recent_exits.first())
                .and_then(|e| e.reason.as_deref())
                .unwrap_or("");
            match (limits, conduit_supervisor::usage::limit_named_in(reason)) {
                (Some(l), Some(conduit_supervisor::limits::LimitKey::Tasks)) => format!(
                    "conduit ext set {name} limits.tasks={}",
                    l.tasks.saturating_mul(2)
                ),
                (Some(l), _) => format!(
                    "conduit ext set {name} limits.memory={}",
                    conduit_supervisor::limits::format_bytes(l.memory.saturating_mul(2))
                        .replace(' ', "")
                ),
                (None, _) => format!("conduit ext status {name}   # its limits and use"),
            }
        }
    }
}
