//! The `read-only-folder` rule: the package starts again from a read-only copy of its folder
//! and writes nothing into it, as an installed package must (installs are read-only, and a file
//! written into the folder is refused as tampering at the next start).
//!
//! The copy is made in a scratch folder, its write bits cleared, and a listing of its files
//! (path, size, modification time) taken before and after the instance ran through its
//! handshake. The instance runs with the package's limits but without the sandbox, which would
//! refuse a write into the folder without the package or the checker seeing it: this rule is
//! there to show what the package tries to write (an unprivileged user's write fails on the
//! write bits, and a package that cannot start then fails the rule; root ignores write bits,
//! and the listing shows what it wrote).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use conduit_rpc::SessionConfig;

use super::ctx::Ctx;
use super::instance::Instance;
use super::report::RuleResult;
use super::rules::handshake;
use super::rules::ids::READ_ONLY_FOLDER;

/// The most files a package copied for this rule may hold; more is skipped, not failed.
const MAX_FILES: usize = 20_000;

const FIX: &str = "write only to $CONDUIT_DATA_DIR (the extension's data directory) or $TMPDIR: an installed package is read-only, and a file written into its folder is refused as tampering at the next start (for Python the host sets PYTHONDONTWRITEBYTECODE=1)";

type Listing = BTreeMap<PathBuf, (u64, Option<SystemTime>)>;

fn copy_tree(from: &Path, to: &Path, n: &mut usize) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        *n += 1;
        if *n > MAX_FILES {
            return Err(std::io::Error::other(format!(
                "more than {MAX_FILES} files"
            )));
        }
        let (src, dst) = (e.path(), to.join(e.file_name()));
        // Links are followed, as an install copies what they lead to.
        let meta = std::fs::metadata(&src)?;
        if meta.is_dir() {
            copy_tree(&src, &dst, n)?;
        } else if meta.is_file() {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

fn listing(root: &Path) -> Listing {
    let mut out = Listing::new();
    let mut todo = vec![root.to_owned()];
    while let Some(dir) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let rel = p.strip_prefix(root).unwrap_or(&p).to_owned();
            if meta.is_dir() {
                // Folders only as the way to their files: a file written shows as itself.
                todo.push(p);
                continue;
            }
            out.insert(rel, (meta.len(), meta.modified().ok()));
        }
    }
    out
}

fn changes(before: &Listing, after: &Listing) -> Vec<String> {
    let mut out = Vec::new();
    for (p, v) in after {
        match before.get(p) {
            None => out.push(format!("{} was added", p.display())),
            Some(b) if b != v => out.push(format!("{} was changed", p.display())),
            Some(_) => {}
        }
    }
    for p in before.keys() {
        if !after.contains_key(p) {
            out.push(format!("{} was removed", p.display()));
        }
    }
    out
}

/// Run the rule: copy, make read-only, start through the handshake, compare.
pub(crate) async fn read_only_restart(ctx: &Ctx<'_>, dir: &Path) -> (RuleResult, Option<Instance>) {
    let scratch = match tempfile::Builder::new()
        .prefix("conduit-check-ro-")
        .tempdir()
    {
        Ok(s) => s,
        Err(e) => {
            return (
                RuleResult::skip(
                    READ_ONLY_FOLDER,
                    format!("no scratch folder for the copy: {e}"),
                ),
                None,
            );
        }
    };
    let copy = scratch.path().join("pkg");
    let mut n = 0;
    if let Err(e) = copy_tree(dir, &copy, &mut n) {
        let _ = crate::packages::readonly::make_writable(&copy);
        return (
            RuleResult::skip(
                READ_ONLY_FOLDER,
                format!("the package could not be copied: {e}"),
            ),
            None,
        );
    }
    let _ = crate::packages::readonly::make_read_only(&copy);
    let before = listing(&copy);
    let mut launch = ctx.launch.clone();
    let real = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    if let Ok(rel) = launch.program.strip_prefix(&real) {
        launch.program = copy.join(rel);
    }
    launch.dir = copy.clone();
    // Without the sandbox, which would refuse the write silently: what the package tries to
    // write into its folder is what this rule is for.
    launch.sandbox = None;
    let config = SessionConfig {
        name: format!("{} (read-only)", ctx.manifest.name),
        ..SessionConfig::default()
    };
    let host = ctx.host.for_instance("read-only");
    let bulk = host.bulk_sink();
    let result = match Instance::spawn(&launch, "read-only", host, bulk, config) {
        Err(e) => (
            RuleResult::fail(
                READ_ONLY_FOLDER,
                format!("could not start the package from a read-only copy of its folder: {e}"),
                FIX,
            ),
            None,
        ),
        Ok((mut inst, _)) => {
            let hs = handshake::handshake(ctx, &mut inst).await;
            inst.finish().await;
            let after = listing(&copy);
            let changed = changes(&before, &after);
            let res = if !changed.is_empty() {
                RuleResult::fail(
                    READ_ONLY_FOLDER,
                    format!(
                        "started from a read-only copy of its folder, the package wrote into it: {}",
                        changed.join("; ")
                    ),
                    FIX,
                )
            } else if hs.init.is_none() {
                RuleResult::fail(
                    READ_ONLY_FOLDER,
                    format!(
                        "the package does not start from a read-only copy of its folder: {} (see the read-only instance's stderr)",
                        hs.result.detail
                    ),
                    FIX,
                )
            } else {
                RuleResult::pass(
                    READ_ONLY_FOLDER,
                    "started again from a read-only copy of its folder and wrote nothing into it",
                )
            };
            (res, Some(inst))
        }
    };
    let _ = crate::packages::readonly::make_writable(&copy);
    result
}
