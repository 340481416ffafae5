//! The artifact through the real daemon into its store: a release `conduit daemon run` (beside
//! this executable) supervising `proto-jsonrpc-child` as an installed package, asked through its
//! API to call `artifact`. What is timed is the API call, so the figure includes what the
//! daemon adds to the transport: the temporary file, the digest, fsync and rename at close, the
//! store's record, the API round trip.
//!
//! Run once per regime, placed by the scheduler (the daemon is not pinned). Both paths: the
//! bulk pipe (what the SDK picks when the daemon offers it) and base64 chunks.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use conduit_bench::daemon::Daemon;
use conduit_bench::measure::proc_cpu;
use conduit_bench::prototype::jsonrpc::{
    ARTIFACT, ArtifactParams, CALLBACK, CANCEL_SEEN, ECHO, SLEEP,
};
use conduit_bench::prototype::{CHUNK_BYTES, artifact_id};
use conduit_host::packages::{self, InstallOptions};
use conduit_host::state_dir::StateDir;
use serde_json::json;

use crate::transport::Figures;

const NAME: &str = "proto-jsonrpc";

/// Run time of a process's live threads (the daemon's blocking-pool threads that exit meanwhile
/// are not counted: the fsync at close runs on one).
fn cpu(pid: u32) -> anyhow::Result<Duration> {
    proc_cpu(pid).with_context(|| format!("reading the run time of {pid}"))
}

/// `conduit` beside this executable, if it was built.
pub(crate) fn conduit_beside(exe: &Path) -> Option<PathBuf> {
    let p = exe.parent()?.join("conduit");
    p.is_file().then_some(p)
}

/// `transfers` timed artifacts of `bytes` on each path, after one untimed.
pub(crate) async fn artifacts(
    conduit: &Path,
    child: &Path,
    root: &Path,
    bytes: u64,
    transfers: usize,
) -> anyhow::Result<Figures> {
    let pkg = root.join("pkg");
    let state_path = root.join("state");
    let _ = std::fs::remove_dir_all(&state_path);
    std::fs::create_dir_all(&pkg)?;
    let methods = [ECHO, CALLBACK, SLEEP, CANCEL_SEEN, ARTIFACT, "check.sleep"];
    std::fs::write(
        pkg.join("conduit-extension.toml"),
        format!(
            "name = \"{NAME}\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"./proto-jsonrpc-child\"]\n\n[capabilities]\nmethods = {}\n",
            serde_json::to_string(&methods)?
        ),
    )?;
    let dest = pkg.join("proto-jsonrpc-child");
    if !dest.exists() {
        std::fs::copy(child, &dest).context("staging the child")?;
    }
    let state = StateDir::open(&state_path).context("the state directory")?;
    packages::install(&state, &pkg, &InstallOptions::default()).context("installing")?;

    let daemon = Daemon::start(conduit, &state_path, Duration::from_secs(30)).await?;
    let (pid, client) = (daemon.pid(), daemon.client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    let ext_pid = loop {
        let v = client.get(&format!("/v1/extensions/{NAME}")).await?;
        if v["state"] == "ready" {
            break v["pid"].as_u64().context("the extension's pid")? as u32;
        }
        ensure!(
            Instant::now() < deadline,
            "the package never became ready: {v}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let call = |json_chunks: bool| {
        let client = &client;
        async move {
            let p = ArtifactParams {
                bytes,
                chunk_bytes: CHUNK_BYTES,
                json_chunks,
            };
            let body = json!({"method": ARTIFACT, "params": p, "timeout_ms": 120_000});
            let v = client
                .post(&format!("/v1/extensions/{NAME}/call"), Some(&body))
                .await?;
            let id = v["result"]["artifact_id"].as_str().unwrap_or_default();
            ensure!(id == artifact_id(bytes as usize), "the daemon answered {v}");
            anyhow::Ok(())
        }
    };
    call(false).await?;
    let mut f = Figures::default();
    for (key, json_chunks) in [("daemon_artifact", false), ("daemon_artifact_json", true)] {
        let mut rates = Vec::with_capacity(transfers);
        let (d0, c0) = (cpu(pid)?, cpu(ext_pid)?);
        for _ in 0..transfers.max(1) {
            let t = Instant::now();
            call(json_chunks).await?;
            rates.push(bytes as f64 / 1048576.0 / t.elapsed().as_secs_f64().max(1e-9));
        }
        let (d1, c1) = (cpu(pid)?, cpu(ext_pid)?);
        let mib = bytes as f64 / 1048576.0 * rates.len() as f64;
        let per_mib = |d: Duration| d.as_nanos() as f64 / 1000.0 / mib.max(1e-9);
        rates.sort_by(f64::total_cmp);
        f.push(format!("{key}_mib_s"), rates[rates.len() / 2]);
        f.push(format!("{key}_daemon_cpu_us_per_mib"), per_mib(d1 - d0));
        f.push(format!("{key}_child_cpu_us_per_mib"), per_mib(c1 - c0));
    }
    drop(daemon);
    Ok(f)
}
