//! `conduit doctor`: every installation check, each one line with ok, warn or fail, what was
//! found and the exact command that fixes it. The CLI prints the [`Report`]; the web view's
//! doctor page renders the same one.
//!
//! ```text
//!   run(&Options) ─┬─ state-dir      files.rs     ownership and modes of the state directory
//!                  ├─ daemon         live.rs      running and answering GET /v1/health
//!                  ├─ store          files.rs     quick_check on a read-only connection, bounded
//!                  ├─ disk, wal      files.rs     free space; the size of conduit.db-wal
//!                  ├─ service        service.rs   the unit runs this binary on this state dir
//!                  ├─ sandbox        confine.rs   the kernel's Landlock ABI
//!                  ├─ cgroups        confine.rs   the daemon's cgroup delegated (read, never made)
//!                  ├─ packages       files.rs     installed files as recorded
//!                  ├─ processes      processes.rs stale pid ledgers, escaped processes
//!                  └─ extensions     live.rs      crash-looping, refused, unresponsive, over limits…
//! ```
//!
//! Invariant: read-only. Nothing here creates, writes, renames, chmods, locks for writing or
//! signals anything: not the state directory (a missing one is reported, never created), not
//! the store (opened read-only), not a package's kept stats, not a cgroup, not a process. Every
//! wait is bounded: the store check by [`Options::store_timeout`], the daemon's answers by
//! [`Options::daemon_timeout`]. What the daemon knows comes through its management API, as
//! for any other client.
//!
//! Entry point: [`run`], given [`Options`] (`options.rs`). The report's JSON shape is fixed in
//! `report.rs`. The parent only runs the checks; each child imports only its siblings.

mod confine;
mod files;
mod live;
mod options;
mod processes;
mod report;
mod service;
mod text;

pub use options::{DAEMON_TIMEOUT, Options, STORE_TIMEOUT};
pub use report::{Check, Report, Status};

/// Run every check and report. Never fails: a check that cannot look says so on its line.
///
/// Async because the daemon is asked through its API; the file checks run on a blocking
/// thread (`spawn_blocking`), so this may be awaited on any runtime, a current-thread one
/// included.
pub async fn run(opts: &Options) -> Report {
    let mut checks = Vec::new();
    let o = opts.clone();
    let dir = blocking(move || files::state_dir(&o)).await;
    let (state, check) = match dir {
        Ok(v) => v,
        Err(e) => (None, Check::fail("state-dir", e, "conduit doctor -v")),
    };
    checks.push(check);
    let service = {
        let o = opts.clone();
        blocking(move || service::read(&o)).await.ok().flatten()
    };
    let live = live::daemon(opts, state.as_ref(), service.as_ref()).await;
    checks.push(live.check.clone());
    let o = opts.clone();
    let (s, svc, l) = (state.clone(), service.clone(), live.answer.clone());
    let local = blocking(move || {
        let mut c = Vec::new();
        if let Some(state) = &s {
            c.extend(files::store(&o, state));
            c.extend(files::disk(state));
            c.extend(files::wal(state));
        }
        c.push(service::check(&o, svc.as_ref()));
        c.push(confine::sandbox());
        c.push(confine::cgroups(l.as_deref(), svc.as_ref()));
        if let Some(state) = &s {
            c.extend(files::packages(state));
            c.push(processes::check(state, l.as_deref()));
        }
        c
    })
    .await;
    match local {
        Ok(c) => checks.extend(c),
        Err(e) => checks.push(Check::fail("doctor", e, "conduit doctor -v")),
    }
    if let Some(answer) = &live.answer {
        checks.extend(live::extensions(answer));
    }
    Report::new(checks)
}

/// Run `f` on a blocking thread; a panic in it becomes a line of the report.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("a check panicked: {e}"))
}
