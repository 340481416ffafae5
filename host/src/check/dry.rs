//! The dry handshake `conduit ext install` makes of an on-demand package: it starts the
//! installed package once, exactly as the daemon would (the same launch plan, environment,
//! limits, sandbox and bulk pipe, through the checker's [`Instance`]), completes the handshake,
//! asks it to shut down, and keeps what it declared (`packages::handshakes`), so the daemon
//! knows the package's capabilities before anything starts it.
//!
//! It never touches the package's own state: the run gets scratch data and temporary folders
//! (gone afterwards), and its callbacks are answered as an empty daemon would (the checker's
//! host). Every wait is bounded: the handshake by `timeout`, the stop by the protocol's
//! shutdown grace, and the instance's whole process group is killed at the end.

use std::time::{Duration, Instant};

use conduit_protocol::calls::Empty;
use conduit_protocol::methods::host::{INITIALIZE, SHUTDOWN};
use conduit_protocol::{InitializeParams, InitializeResult, PROTOCOL_VERSIONS, SHUTDOWN_GRACE};
use conduit_rpc::SessionConfig;

use super::callbacks::CheckHost;
use super::instance::Instance;
use crate::packages::handshakes::HandshakeRecord;
use crate::packages::{self, PackageRecord};
use crate::state_dir::StateDir;

/// Why the dry handshake did not complete; the message says what happened and where to look.
#[derive(Debug, thiserror::Error)]
pub enum DryError {
    #[error("cannot start `{name}` for its handshake: {why}")]
    Start { name: String, why: String },
    #[error("`{name}` did not complete its handshake: {why}{}", stderr_tail(.stderr))]
    Handshake {
        name: String,
        why: String,
        stderr: String,
    },
}

fn stderr_tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    let tail = &lines[lines.len().saturating_sub(10)..];
    if tail.is_empty() {
        String::new()
    } else {
        format!("\n  stderr (last lines):\n    {}", tail.join("\n    "))
    }
}

/// What the dry handshake found: the record kept, and how long the start to handshake took.
#[derive(Debug)]
pub struct DryHandshake {
    pub record: HandshakeRecord,
    pub took: Duration,
}

/// Start `rec`'s installed package once, handshake within `timeout`, stop it, and return what
/// it declared (the caller keeps it with `packages::handshakes::record`).
pub async fn dry_handshake(
    state: &StateDir,
    rec: &PackageRecord,
    timeout: Duration,
) -> Result<DryHandshake, DryError> {
    let name = rec.name.clone();
    let start_err = |why: String| DryError::Start {
        name: name.clone(),
        why,
    };
    let dir = packages::package_dir(state, &rec.name);
    let cmd = rec
        .manifest
        .resolve_command(&dir)
        .map_err(|e| start_err(e.to_string()))?;
    let settings =
        packages::settings::for_package(state, &rec.name).map_err(|e| start_err(e.to_string()))?;
    let scratch = tempfile::Builder::new()
        .prefix("dry-handshake-")
        .tempdir_in(state.tmp_dir())
        .map_err(|e| start_err(format!("no scratch folder: {e}")))?;
    let folders = packages::launch::Folders {
        package: dir,
        data: scratch.path().join("data"),
        tmp: scratch.path().join("tmp"),
    };
    let plan = packages::launch::plan(
        &rec.manifest,
        cmd.program.clone(),
        cmd.args.clone(),
        &folders,
        &settings,
    )
    .map_err(|e| start_err(format!("cannot prepare its folders: {e}")))?;
    let host = CheckHost::new(Vec::new(), &scratch.path().join("host")).for_instance("dry");
    let bulk = host.bulk_sink();
    let config = SessionConfig::named(&rec.name);
    let t = Instant::now();
    let (mut inst, _) = Instance::spawn(&plan.launch, "dry", host, bulk, config)
        .map_err(|e| start_err(format!("`{}`: {e}", cmd.program.display())))?;
    let params = InitializeParams::current(env!("CARGO_PKG_VERSION")).with_bulk();
    let answer = inst
        .peer()
        .call::<_, InitializeResult>(INITIALIZE, &params, Some(timeout))
        .await;
    let took = t.elapsed();
    let result = match answer {
        Ok(r) if PROTOCOL_VERSIONS.contains(&r.protocol_version) => Ok(r),
        Ok(r) => Err(format!(
            "it chose protocol version {}, which this host does not speak (it speaks {PROTOCOL_VERSIONS:?})",
            r.protocol_version
        )),
        Err(e) => {
            let state = inst.state_note().await;
            Err(format!("{e} ({state})"))
        }
    };
    if result.is_ok() {
        // A well-behaved package answers and exits; the group is killed afterwards anyway.
        let _ = inst
            .peer()
            .call::<_, Empty>(SHUTDOWN, &Empty {}, Some(SHUTDOWN_GRACE))
            .await;
        inst.close_session();
        let _ = inst.exit_status(SHUTDOWN_GRACE).await;
    }
    inst.finish().await;
    match result {
        Ok(r) => Ok(DryHandshake {
            record: HandshakeRecord {
                version: rec.version.clone(),
                installed_at_ms: rec.installed_at_ms,
                protocol_version: r.protocol_version,
                capabilities: r.capabilities,
                at_ms: conduit_supervisor::now_ms(),
                by: "install".into(),
            },
            took,
        }),
        Err(why) => Err(DryError::Handshake {
            name,
            why,
            stderr: inst.stderr.lock().unwrap_or_else(|p| p.into_inner()).text(),
        }),
    }
}
