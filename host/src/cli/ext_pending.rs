//! What waits for a package, for `conduit ext disable` and `conduit ext remove`: counted, and
//! dropped with `--drop-pending`. With a daemon running it is asked (so the drop is in its log
//! and counted in its metrics); without one the store is read and written here, by the same
//! rule (`core::pending`).

use conduit_host::core::pending::{self, Pending};
use conduit_host::packages;
use conduit_host::state_dir::StateDir;

use super::common::{api_error, daemon};
use super::outcome::CliError;

/// Every installed package with its capabilities as best known (who owns which event kinds).
fn owners(state: &StateDir) -> Result<Vec<(String, conduit_protocol::Capabilities)>, CliError> {
    Ok(packages::list(state)
        .map_err(CliError::failure)?
        .iter()
        .map(|r| (r.name.clone(), packages::handshakes::capabilities(state, r)))
        .collect())
}

fn store(state: &StateDir) -> Result<Option<conduit_store::Store>, CliError> {
    let db = state.path().join("conduit.db");
    if !db.exists() {
        return Ok(None);
    }
    conduit_store::Store::open(&db)
        .map(Some)
        .map_err(CliError::failure)
}

/// Ask the running daemon, if one runs, for the `Pending` under `key` of its answer to
/// `method path`; `None` without a daemon.
fn ask_daemon(
    rt: &tokio::runtime::Runtime,
    state: &StateDir,
    method: hyper::Method,
    path: &str,
    key: &str,
) -> Result<Option<Pending>, CliError> {
    let Some(client) = daemon(rt, state) else {
        return Ok(None);
    };
    let (code, v) = rt
        .block_on(client.request(method, path, None))
        .map_err(CliError::failure)?;
    if !code.is_success() {
        return Err(api_error(code, &v));
    }
    serde_json::from_value(v[key].clone())
        .map(Some)
        .map_err(|e| CliError::failure(anyhow::anyhow!("the daemon's answer: {e}")))
}

/// What waits for `name` now.
pub(crate) fn count(
    rt: &tokio::runtime::Runtime,
    state: &StateDir,
    name: &str,
) -> Result<Pending, CliError> {
    let path = format!("/v1/extensions/{name}/pending");
    if let Some(p) = ask_daemon(rt, state, hyper::Method::GET, &path, "pending")? {
        return Ok(p);
    }
    let Some(store) = store(state)? else {
        return Ok(Pending::default());
    };
    let owners = owners(state)?;
    let name = name.to_owned();
    store
        .read(move |r| pending::count(r, &name, &owners))
        .map_err(CliError::failure)
}

/// Drop what waits for the disabled package `name` (see `core::pending`); what was dropped.
pub(crate) fn drop(
    rt: &tokio::runtime::Runtime,
    state: &StateDir,
    name: &str,
) -> Result<Pending, CliError> {
    let path = format!("/v1/extensions/{name}/drop-pending");
    if let Some(p) = ask_daemon(rt, state, hyper::Method::POST, &path, "dropped")? {
        return Ok(p);
    }
    let Some(store) = store(state)? else {
        return Ok(Pending::default());
    };
    let owners = owners(state)?;
    let ext = name.to_owned();
    let dropped = store
        .write(move |tx| pending::drop_pending(tx, &ext, &owners, conduit_host::core::now_ms()))
        .map_err(CliError::failure)?;
    dropped.log_dropped(name);
    Ok(dropped)
}

/// `dropped 2 events (routed to no Work) and 1 timer (deleted) that waited for flaky`.
pub(crate) fn dropped_line(name: &str, p: &Pending) -> String {
    if p.total() == 0 {
        return format!("nothing waited for {name}; nothing dropped");
    }
    format!("dropped {} that waited for {name}", p.describe_dropped())
}
