//! The artifact through the real daemon into its store: a release `conduit daemon run` (beside
//! this executable) supervising `proto-jsonrpc-child` as an installed package, asked through its
//! API to call `artifact`. What is timed is the API call, so the figure includes what the
//! daemon adds to the transport: the temporary file, the digest, fsync and rename at close, the
//! store's record, the API round trip.
//!
//! Run in every regime and placement, right after the transports' rounds of that placement, so
//! that it is set beside the bench's own host in the same conditions: `same` puts the daemon
//! (every thread, the spawner too) and the extension on CPU 0, `split` the daemon on CPU 0 and
//! the extension on CPU 1 (moved there once ready), `free` leaves all to the scheduler. Both
//! paths: the bulk pipe (what the SDK picks when the daemon offers it) and base64 chunks.
//!
//! CPU is counted per thread (`TaskCpu`): the daemon's blocking-pool threads live 10 s after
//! their last task, so the fsync's thread is still there to be read when a transfer ends.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use conduit_bench::daemon::Daemon;
use conduit_bench::measure::TaskCpu;
use conduit_bench::prototype::jsonrpc::{
    ARTIFACT, ArtifactParams, CALLBACK, CANCEL_SEEN, ECHO, SLEEP,
};
use conduit_bench::prototype::{CHUNK_BYTES, salted_artifact_id};
use conduit_bench::regime::{self, Cpus};
use conduit_host::packages::{self, InstallOptions};
use conduit_host::state_dir::StateDir;
use serde_json::json;

use crate::transport::Figures;

const NAME: &str = "proto-jsonrpc";

/// The next transfer's salt ([`ArtifactParams::salt`]): never 0, never repeated in a run.
static SALT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The run time of a process's threads, as a mark.
fn cpu(pid: u32) -> anyhow::Result<TaskCpu> {
    TaskCpu::now(pid).with_context(|| format!("reading the run time of {pid}"))
}

/// `conduit` beside this executable, if it was built.
pub(crate) fn conduit_beside(exe: &Path) -> Option<PathBuf> {
    let p = exe.parent()?.join("conduit");
    p.is_file().then_some(p)
}

/// `transfers` timed artifacts of `bytes` on each path, after one untimed, with the daemon and
/// the extension placed as `cpus` says (the calling thread must already be where the host
/// goes: the daemon inherits its CPU mask).
pub(crate) async fn artifacts(
    conduit: &Path,
    child: &Path,
    root: &Path,
    bytes: u64,
    transfers: usize,
    cpus: Cpus,
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
    if cpus.child.is_some() {
        regime::pin_process(ext_pid, cpus.child).context("placing the extension")?;
    }
    // Content the store has not seen, every time: it keeps one copy per digest and writes no
    // second one, which would leave out the file's fsync. The digest to expect is computed
    // before the timer starts.
    let call = |json_chunks: bool, salt: u64, want: String| {
        let client = &client;
        async move {
            let p = ArtifactParams {
                bytes,
                chunk_bytes: CHUNK_BYTES,
                json_chunks,
                salt,
            };
            let body = json!({"method": ARTIFACT, "params": p, "timeout_ms": 120_000});
            let v = client
                .post(&format!("/v1/extensions/{NAME}/call"), Some(&body))
                .await?;
            let id = v["result"]["artifact_id"].as_str().unwrap_or_default();
            ensure!(id == want, "the daemon answered {v}, not {want}");
            ensure!(
                v["result"]["sha256"].as_str() == want.strip_prefix("sha256:"),
                "the daemon's digest did not reach the SDK's caller: {v}"
            );
            anyhow::Ok(())
        }
    };
    let next_salt = || SALT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let salt = next_salt();
    call(false, salt, salted_artifact_id(bytes as usize, salt)).await?;
    let mut f = Figures::default();
    for (key, json_chunks) in [("daemon_artifact", false), ("daemon_artifact_json", true)] {
        let mut rates = Vec::with_capacity(transfers);
        let (d0, c0) = (cpu(pid)?, cpu(ext_pid)?);
        for _ in 0..transfers.max(1) {
            let salt = next_salt();
            let want = salted_artifact_id(bytes as usize, salt);
            let t = Instant::now();
            call(json_chunks, salt, want).await?;
            rates.push(bytes as f64 / 1048576.0 / t.elapsed().as_secs_f64().max(1e-9));
        }
        let (d1, c1) = (cpu(pid)?, cpu(ext_pid)?);
        let mib = bytes as f64 / 1048576.0 * rates.len() as f64;
        let per_mib = |d: Duration| d.as_nanos() as f64 / 1000.0 / mib.max(1e-9);
        rates.sort_by(f64::total_cmp);
        f.push(format!("{key}_mib_s"), rates[rates.len() / 2]);
        f.push(
            format!("{key}_daemon_cpu_us_per_mib"),
            per_mib(d1.since(&d0)),
        );
        f.push(
            format!("{key}_child_cpu_us_per_mib"),
            per_mib(c1.since(&c0)),
        );
    }
    drop(daemon);
    Ok(f)
}
