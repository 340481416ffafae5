//! `conduit artifacts list` and `conduit artifacts show ID`: the stored artifacts with their
//! size, creator, whether retention kept their content, whether a live record needs them, and
//! (show) the records that mention them. Like the other lists, these ask the daemon when it
//! runs and read `conduit.db` directly when it does not; both answer
//! `retention::view`'s shape.

use std::fmt::Write as _;
use std::process::ExitCode;

use conduit_host::retention::view::{self, ArtifactPage, ArtifactView};
use conduit_supervisor::limits::format_bytes;
use conduit_supervisor::log::utc_timestamp;

use super::common::{StateArgs, api_error, daemon, print_json, runtime};
use super::outcome::{CliError, print};
use super::records_lists::ListArgs;

/// Show one artifact: size, creator, when stored, whether kept, and the records that mention it.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 shown; 1 the store or the daemon failed; 2 a malformed id or \
no such artifact"
)]
pub(crate) struct ShowArgs {
    /// `sha256:<hex>`, as `artifact.close` answered.
    id: String,
    /// Print it as JSON.
    #[arg(long)]
    json: bool,
}

/// Reads `conduit.db` directly, read only (nothing is created or migrated); `None` when there
/// is no database yet.
fn read_store<T>(
    state: &conduit_host::state_dir::StateDir,
    f: impl FnOnce(&conduit_store::ReadTx<'_>) -> Result<T, conduit_store::StoreError>,
) -> Result<Option<T>, CliError> {
    let db = conduit_host::retention::sweep::db_path(state);
    if !db.exists() {
        return Ok(None);
    }
    conduit_store::read_only(&db, f)
        .map(Some)
        .map_err(CliError::failure)
}

pub(crate) fn list(args: ListArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open_read_only()?;
    let rt = runtime()?;
    let page: ArtifactPage = if let Some(client) = daemon(&rt, &state) {
        // `after` (0 from the start) asks for the oldest first, as the other lists page.
        let path = format!(
            "/v1/artifacts?limit={}&after={}",
            args.limit,
            args.after.unwrap_or(0)
        );
        let v = rt.block_on(client.get(&path)).map_err(CliError::failure)?;
        serde_json::from_value(v).map_err(CliError::failure)?
    } else {
        read_store(&state, |r| {
            view::page(r, view::Order::After(args.after), args.limit)
        })?
        .unwrap_or(ArtifactPage {
            artifacts: Vec::new(),
            next_after: Some(None),
            next_before: None,
        })
    };
    if args.json {
        print_json(&page)?;
        return Ok(ExitCode::SUCCESS);
    }
    if page.artifacts.is_empty() {
        print("no artifacts; extensions store them with artifact.open/chunk/close\n")?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = format!(
        "{:>6}  {:<24} {:>10}  {:<16} {:<8} {:<5} STORED\n",
        "ID", "ARTIFACT", "SIZE", "CREATOR", "STATE", "LIVE"
    );
    for a in &page.artifacts {
        let _ = writeln!(
            out,
            "{:>6}  {:<24} {:>10}  {:<16} {:<8} {:<5} {}",
            a.artifact.id,
            format!("{}…", &a.artifact_id[..22.min(a.artifact_id.len())]),
            format_bytes(a.artifact.size),
            a.artifact.extension,
            a.state,
            if a.live { "yes" } else { "no" },
            utc_timestamp(a.artifact.created_at_ms)
        );
    }
    print(&out)?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn show(args: ShowArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let Some(sha) = conduit_protocol::artifact_id::parse(&args.id) else {
        return Err(CliError::usage(anyhow::anyhow!(
            "an artifact id is `sha256:` and 64 hex digits, not `{}`",
            args.id
        )));
    };
    let state = state.open_read_only()?;
    let rt = runtime()?;
    let missing = || {
        CliError::usage(anyhow::anyhow!(
            "no artifact sha256:{sha}; `conduit artifacts list` shows them"
        ))
    };
    let v: ArtifactView = if let Some(client) = daemon(&rt, &state) {
        let (code, v) = rt
            .block_on(client.request(
                hyper::Method::GET,
                &format!("/v1/artifacts/sha256:{sha}"),
                None,
            ))
            .map_err(CliError::failure)?;
        if code == hyper::StatusCode::NOT_FOUND {
            return Err(missing());
        }
        if !code.is_success() {
            return Err(api_error(code, &v));
        }
        serde_json::from_value(v).map_err(CliError::failure)?
    } else {
        read_store(&state, |r| view::one(r, &sha))?
            .flatten()
            .ok_or_else(missing)?
    };
    if args.json {
        print_json(&v)?;
        return Ok(ExitCode::SUCCESS);
    }
    print(&render(&v))?;
    Ok(ExitCode::SUCCESS)
}

fn render(v: &ArtifactView) -> String {
    let a = &v.artifact;
    let mut out = format!("artifact {}\n", v.artifact_id);
    let mut line = |k: &str, val: String| {
        let _ = writeln!(out, "  {k:<12} {val}");
    };
    line("name", a.name.clone());
    line(
        "media type",
        a.media_type.clone().unwrap_or_else(|| "-".into()),
    );
    line(
        "size",
        format!("{} ({} bytes)", format_bytes(a.size), a.size),
    );
    line("creator", a.extension.clone());
    line("stored", utc_timestamp(a.created_at_ms));
    line(
        "touched",
        format!(
            "{} (its age for retention counts from here)",
            utc_timestamp(a.touched_at_ms)
        ),
    );
    line(
        "state",
        match a.removed_at_ms {
            None => "kept".into(),
            Some(at) => format!("removed by retention at {}", utc_timestamp(at)),
        },
    );
    line(
        "live",
        if v.live {
            "yes: a live record needs it, so retention keeps it".into()
        } else {
            "no".into()
        },
    );
    let total = v.references_total.unwrap_or(0);
    line("references", total.to_string());
    for r in v.references.iter().flatten() {
        let _ = writeln!(
            out,
            "    {} {}{}",
            r.record.as_str(),
            r.id,
            if r.live { " (live)" } else { "" }
        );
    }
    let shown = v.references.as_ref().map_or(0, Vec::len) as u64;
    if shown < total {
        let _ = writeln!(out, "    … and {} more", total - shown);
    }
    out
}
