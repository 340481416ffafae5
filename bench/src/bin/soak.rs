//! The soak (`make soak`, `SOAK_MINUTES`, default 10): one release daemon with 100 extensions
//! run as an operator would leave it for months, sampled every 10 s, failing when anything
//! grows that should stay flat.
//!
//! ```text
//! soak [--minutes 10] [--rate 50] [--out target/soak]
//! ```
//!
//! What runs, all through the management socket as a client would:
//!
//! - 100 extensions: `notes` (Rust, the router of the ingress), `soak-blob` (Python, stores
//!   artifacts), `soak-hung` (Python, stopped with SIGSTOP right after its start and whenever it
//!   is started again: a process that never answers), and echo extensions in Rust, Python and
//!   Node, one of which (`echo-rs-01`) is killed with SIGKILL every 30 s;
//! - ingress at a fixed rate (`--rate` events/s, `POST /v1/events` of `note.posted` events on
//!   `notes-inbox`, over at most 32 connections at once as a client's pool would, each
//!   delivery retried with backoff until acknowledged, so the restart loses none);
//! - an `echo` call through the API every 200 ms, round robin over the echo extensions, and one
//!   to the hung extension every 10 s (each must end in its timeout);
//! - a 64 KiB artifact every 2 s (`soak-blob`), under a small retention budget (4 MiB, a sweep
//!   every minute, no grace), so the sweep removes content all along;
//! - halfway, the daemon stopped with SIGTERM and started again on the same state directory.
//!
//! Every 10 s: the daemon's RSS, threads, open descriptors (less the API connections open at
//! that moment, which come and go with the load), CPU (since the last sample), and the
//! sizes of `conduit.db`, its WAL, `artifacts/` and `logs/`. At the end: every acknowledged event
//! looked up in the Work that hold it. Printed: the table, each series' figures after a 2-minute
//! warm-up (`report.rs`), the verdict. Written: `report.json` (the keys issue 30 names),
//! `samples.json` (every sample and the run's counts), `soak.svg` (the plot). Exit 1 when a bound
//! broke, 2 when the run itself could not be made.
//!
//! Not here: the bounds' arithmetic and the plot (`report.rs`). Invariant: this process stops
//! only what it started (the daemon, and through it the extensions); the hung extension is
//! continued before the daemon is stopped, so a stop never waits on a stopped process.

#[path = "soak/report.rs"]
mod report;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::Parser;
use conduit_bench::daemon::Daemon;
use conduit_bench::machine::{self, Machine};
use conduit_bench::measure::{new_histogram, quantile_us, record};
use conduit_host::client::Client;
use conduit_host::packages::{self, InstallOptions};
use conduit_host::state_dir::StateDir;
use hdrhistogram::Histogram;
use hyper::Method;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use report::{Bounds, Sample};

/// A daemon with 100 extensions under ingress, calls, artifacts, crashes, a hung extension and a
/// restart, sampled every 10 s; fails when RSS, threads, descriptors, the WAL or artifacts/ grow
/// past their bounds or an acknowledged event is not in exactly one Work.
#[derive(Debug, Parser)]
#[command(name = "soak")]
struct Args {
    /// How long the run lasts (the daemon restarts halfway).
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Events offered per second.
    #[arg(long, default_value_t = 50)]
    rate: u32,
    /// Extensions in all (at least 6: notes, soak-blob, soak-hung and one echo of each SDK).
    #[arg(long, default_value_t = 100)]
    extensions: usize,
    /// Where the state directory, report.json, samples.json and soak.svg go.
    #[arg(long, default_value = "target/soak")]
    out: PathBuf,
}

const SAMPLE_EVERY: Duration = Duration::from_secs(10);
const WARMUP_S: f64 = 120.0;
const CRASH_EVERY: Duration = Duration::from_secs(30);
const CALL_EVERY: Duration = Duration::from_millis(200);
const HUNG_CALL_EVERY: Duration = Duration::from_secs(10);
const BLOB_EVERY: Duration = Duration::from_secs(2);
const BLOB_BYTES: u64 = 64 * 1024;
const BUDGET_BYTES: u64 = 4 * 1024 * 1024;
const SWEEP_INTERVAL_S: u64 = 60;
/// Pushes waiting for their acknowledgement at once; past this an offered event is counted as
/// shed (the daemon is not keeping up), not queued without end.
const MAX_IN_FLIGHT: u64 = 2048;
/// Connections the pushes use at once (a client's pool).
const PUSH_CONNECTIONS: usize = 32;
const READY_WITHIN: Duration = Duration::from_secs(180);

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("soak: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Counts the load tasks keep.
#[derive(Default)]
struct Counts {
    offered: AtomicU64,
    shed: AtomicU64,
    in_flight: AtomicU64,
    push_retries: AtomicU64,
    calls_ok: AtomicU64,
    calls_failed: AtomicU64,
    hung_calls_timed_out: AtomicU64,
    hung_calls_answered: AtomicU64,
    blobs_ok: AtomicU64,
    blobs_failed: AtomicU64,
    crashes: AtomicU64,
    hung_stops: AtomicU64,
}

/// What the load shares: the client of the daemon running now (`None` while it restarts).
struct Shared {
    client: Mutex<Option<Client>>,
    stop: AtomicBool,
    counts: Counts,
    /// delivery id → the event ids its acknowledgements named (one, unless deduplication broke).
    acked: Mutex<HashMap<String, HashSet<i64>>>,
    ack_hist: Mutex<Histogram<u64>>,
    echo_names: Vec<String>,
    /// Whether the hung extension's process is stopped (its calls are made only then).
    hung_stopped: AtomicBool,
    /// Failed echo calls by extension and reason.
    failures: Mutex<HashMap<String, u64>>,
    /// The pushes' connections, as a client's pool bounds them: the rest wait here.
    push_slots: tokio::sync::Semaphore,
}

impl Shared {
    fn client(&self) -> Option<Client> {
        self.client.lock().unwrap().clone()
    }
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

fn run(args: &Args) -> anyhow::Result<bool> {
    ensure!(args.minutes > 0.0, "--minutes must be above 0");
    ensure!(args.rate >= 1, "--rate must be at least 1");
    ensure!(args.extensions >= 6, "--extensions must be at least 6");
    let [conduit, echo, notes] = conduit_bench::daemon::siblings(
        ["conduit", "conduit-echo", "conduit-notes"],
        "cargo build --release -p conduit-host -p conduit-example-echo -p conduit-example-notes --bins`, or `make soak",
    )?;
    let machine = Machine::this();
    let commit = machine::commit();
    println!(
        "soak: {} min, {} extensions, {} events/s, commit {}, {} build; {} CPUs, {}; load {}",
        args.minutes,
        args.extensions,
        args.rate,
        commit,
        machine::profile(),
        machine.cpus,
        machine.cpu_model,
        machine.loadavg,
    );
    let state_path = args.out.join("state");
    if state_path.exists() {
        std::fs::remove_dir_all(&state_path)
            .with_context(|| format!("removing the last run's {}", state_path.display()))?;
    }
    std::fs::create_dir_all(&args.out)?;
    let state_path = std::fs::canonicalize(&args.out)?.join("state");
    let echo_names = install_all(args, &state_path, &args.out.join("packages"), &echo, &notes)?;
    configure(&conduit, &state_path)?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(soak(
        args,
        &conduit,
        &state_path,
        echo_names,
        machine,
        commit,
    ))
}

/// The packages, installed through the store's own `install`: the echo extensions' names.
fn install_all(
    args: &Args,
    state_path: &Path,
    src: &Path,
    echo: &Path,
    notes: &Path,
) -> anyhow::Result<Vec<String>> {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    if src.exists() {
        std::fs::remove_dir_all(src)?;
    }
    std::fs::create_dir_all(src)?;
    let state = StateDir::open(state_path).context("the state directory")?;
    let opts = InstallOptions::default();
    let mut dirs = Vec::new();

    let rust_pkg =
        |name: &str, bin: &Path, bin_name: &str, manifest: String| -> anyhow::Result<PathBuf> {
            let dir = src.join(name);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("conduit-extension.toml"), manifest)?;
            if std::fs::hard_link(bin, dir.join(bin_name)).is_err() {
                std::fs::copy(bin, dir.join(bin_name))?;
            }
            Ok(dir)
        };
    let notes_manifest = std::fs::read_to_string(examples.join("notes/conduit-extension.toml"))?;
    dirs.push(rust_pkg("notes", notes, "conduit-notes", notes_manifest)?);

    let python_pkg = |name: &str,
                      script: &str,
                      body: &str,
                      methods: &str|
     -> anyhow::Result<PathBuf> {
        let dir = src.join(name);
        vendor_sdk("python", &dir)?;
        std::fs::write(dir.join(script), body)?;
        std::fs::write(
            dir.join("conduit-extension.toml"),
            format!(
                "name = \"{name}\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"python3\", \"-B\", \"{script}\"]\n\n[capabilities]\nmethods = [{methods}]\n"
            ),
        )?;
        Ok(dir)
    };
    dirs.push(python_pkg("soak-blob", "blob.py", BLOB_PY, "\"blob\"")?);
    let echo_py = std::fs::read_to_string(examples.join("python-echo/echo.py"))?;
    dirs.push(python_pkg("soak-hung", "echo.py", &echo_py, "\"echo\"")?);

    // The rest: echo extensions, a third each in Rust, Python and Node.
    let mut names = Vec::new();
    let rest = args.extensions - dirs.len();
    for i in 0..rest {
        let (kind, n) = (i % 3, i / 3 + 1);
        let name = match kind {
            0 => format!("echo-rs-{n:02}"),
            1 => format!("echo-py-{n:02}"),
            _ => format!("echo-node-{n:02}"),
        };
        let dir = match kind {
            0 => rust_pkg(
                &name,
                echo,
                "conduit-echo",
                format!(
                    "name = \"{name}\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"./conduit-echo\"]\n\n[capabilities]\nmethods = [\"echo\"]\n"
                ),
            )?,
            1 => python_pkg(&name, "echo.py", &echo_py, "\"echo\"")?,
            _ => {
                let dir = src.join(&name);
                copy_tree(&examples.join("node-echo"), &dir)?;
                vendor_sdk("node", &dir)?;
                let manifest = std::fs::read_to_string(dir.join("conduit-extension.toml"))?
                    .replace("name = \"node-echo\"", &format!("name = \"{name}\""));
                std::fs::write(dir.join("conduit-extension.toml"), manifest)?;
                dir
            }
        };
        dirs.push(dir);
        names.push(name);
    }
    let t = Instant::now();
    for dir in &dirs {
        packages::install(&state, dir, &opts)
            .with_context(|| format!("installing {}", dir.display()))?;
    }
    println!(
        "installed {} packages in {:.1} s",
        dirs.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(names)
}

/// The artifact writer: `blob {size, seed}` stores `size` bytes made from `seed`.
const BLOB_PY: &str = r#"#!/usr/bin/env python3
"""soak-blob: stores an artifact of `size` bytes made from `seed` (the soak's artifact writer)."""
import hashlib

from conduit_extension import Extension, RpcError

ext = Extension("soak-blob", "0.1.0")


@ext.method("blob")
def blob(ctx, params):
    size, seed = params.get("size"), params.get("seed")
    if not isinstance(size, int) or not isinstance(seed, int) or not 0 < size <= 1 << 20:
        raise RpcError.invalid_params('blob needs {"size": 1..1048576, "seed": integer}')
    block = hashlib.sha256(str(seed).encode()).digest()
    data = (block * (size // len(block) + 1))[:size]
    return ctx.host.store_artifact("blob-%d.bin" % seed, data)


if __name__ == "__main__":
    ext.run()
"#;

/// The checkout's SDK for `lang` copied into the package folder `dir`, as staging does
/// (`scripts/vendor-sdk.sh`).
fn vendor_sdk(lang: &str, dir: &Path) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/vendor-sdk.sh");
    std::fs::create_dir_all(dir)?;
    let out = Command::new(&script)
        .arg(lang)
        .arg(dir)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    ensure!(
        out.status.success(),
        "{} {lang} {} failed: {}",
        script.display(),
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &dest)?;
        } else {
            std::fs::copy(e.path(), dest)?;
        }
    }
    Ok(())
}

/// The small retention budget, through `conduit config set` as an operator would.
fn configure(conduit: &Path, state: &Path) -> anyhow::Result<()> {
    let out = Command::new(conduit)
        .args([
            "config",
            "set",
            &format!("retention.interval={SWEEP_INTERVAL_S}s"),
            &format!("retention.artifacts.max_bytes={BUDGET_BYTES}"),
            "retention.artifacts.grace=0s",
        ])
        .env("CONDUIT_STATE_DIR", state)
        .stdin(Stdio::null())
        .output()
        .context("conduit config set")?;
    ensure!(
        out.status.success(),
        "conduit config set failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

async fn soak(
    args: &Args,
    conduit: &Path,
    state: &Path,
    echo_names: Vec<String>,
    machine: Machine,
    commit: String,
) -> anyhow::Result<bool> {
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let t0 = Instant::now();
    let mut daemon = start(conduit, state, args.extensions).await?;
    println!(
        "all {} extensions ready in {:.1} s",
        args.extensions,
        t0.elapsed().as_secs_f64()
    );
    let shared = Arc::new(Shared {
        client: Mutex::new(Some(daemon.client.clone())),
        stop: AtomicBool::new(false),
        counts: Counts::default(),
        acked: Mutex::default(),
        ack_hist: Mutex::new(new_histogram()),
        echo_names,
        hung_stopped: AtomicBool::new(false),
        failures: Mutex::default(),
        push_slots: tokio::sync::Semaphore::new(PUSH_CONNECTIONS),
    });
    keep_hung(&shared).await;
    let t0 = Instant::now();
    let load = vec![
        tokio::spawn(ingress(shared.clone(), args.rate)),
        tokio::spawn(calls(shared.clone())),
        tokio::spawn(hung_calls(shared.clone())),
        tokio::spawn(blobs(shared.clone())),
        tokio::spawn(crasher(shared.clone())),
    ];
    let mut samples = Vec::new();
    let mut cpu = CpuClock::new(daemon.pid());
    let mut restart_s = None;
    // Every 10 s; the samples the restart's wait misses are skipped, not taken in a row.
    let mut tick = tokio::time::interval_at((t0 + SAMPLE_EVERY).into(), SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        // Keep the hung extension hung (it is started again after the restart).
        keep_hung(&shared).await;
        let s = sample(t0, daemon.pid(), &mut cpu, state)?;
        println!(
            "  {:>5.0} s  rss {:>6.1} MiB  threads {:>3}  fds {:>4}  cpu {:>5.1}%  db {:>6.2}  wal {:>5.2}  artifacts {:>5.2}  logs {:>5.2} MiB  acked {}",
            s.t_s,
            s.rss_mib,
            s.threads,
            s.fds,
            s.cpu_pct,
            s.db_mib,
            s.wal_mib,
            s.artifacts_mib,
            s.logs_mib,
            shared.acked.lock().unwrap().len()
        );
        samples.push(s);
        let elapsed = t0.elapsed();
        if restart_s.is_none() && elapsed >= total / 2 {
            // SIGTERM and a start on the same state directory, the load going on meanwhile.
            *shared.client.lock().unwrap() = None;
            continue_hung(&shared, &daemon).await;
            shared.hung_stopped.store(false, Ordering::Relaxed);
            let t = Instant::now();
            let stopped = tokio::task::spawn_blocking(move || daemon.stop()).await??;
            // The load goes on as soon as the socket answers, while the extensions start.
            daemon = Daemon::start(conduit, state, READY_WITHIN).await?;
            *shared.client.lock().unwrap() = Some(daemon.client.clone());
            wait_ready(&daemon.client, args.extensions).await?;
            keep_hung(&shared).await;
            cpu = CpuClock::new(daemon.pid());
            restart_s = Some(elapsed.as_secs_f64());
            println!(
                "  restart: SIGTERM to exit {:.1} s, to every extension ready again {:.1} s",
                stopped.as_secs_f64(),
                t.elapsed().as_secs_f64()
            );
        }
        if elapsed >= total {
            break;
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    for task in load {
        let _ = task.await;
    }
    continue_hung(&shared, &daemon).await;

    let (acked, lost, duplicated, stored) = account(&daemon.client, &shared).await?;
    let series = report::series_json(&samples, WARMUP_S);
    let bounds = Bounds {
        wal_mib: conduit_store::JOURNAL_SIZE_LIMIT as f64 / MIB,
        artifacts_mib: (BUDGET_BYTES as f64
            + BLOB_BYTES as f64 * (SWEEP_INTERVAL_S as f64 / BLOB_EVERY.as_secs_f64()) * 1.5)
            / MIB,
    };
    let mut report = json!({
        "passed": false,
        "minutes": args.minutes,
        "series": series,
        "acked": acked,
        "lost": lost,
        "duplicated": duplicated,
    });
    let why = report::verdict(&series, &bounds, &report);
    report["passed"] = json!(why.is_empty());

    println!();
    print!("{}", report::table(&samples, &series));
    let c = &shared.counts;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let hist = shared.ack_hist.lock().unwrap().clone();
    println!(
        "\nevents: offered {}, shed {}, acknowledged {acked} (p50 {:.1} ms, p99 {:.1} ms, retries {}), stored {stored}, lost {lost}, duplicated {duplicated}",
        get(&c.offered),
        get(&c.shed),
        quantile_us(&hist, 0.5) / 1e3,
        quantile_us(&hist, 0.99) / 1e3,
        get(&c.push_retries),
    );
    println!(
        "calls: echo {} answered, {} failed; hung {} timed out, {} answered; artifacts {} stored, {} failed; crashes made {}; hung extension stopped {} times",
        get(&c.calls_ok),
        get(&c.calls_failed),
        get(&c.hung_calls_timed_out),
        get(&c.hung_calls_answered),
        get(&c.blobs_ok),
        get(&c.blobs_failed),
        get(&c.crashes),
        get(&c.hung_stops),
    );
    let mut failures: Vec<(String, u64)> = shared
        .failures
        .lock()
        .unwrap()
        .clone()
        .into_iter()
        .collect();
    failures.sort_by_key(|f| std::cmp::Reverse(f.1));
    for (why, n) in failures.iter().take(8) {
        println!("  failed echo calls: {n} × {why}");
    }
    let retention = daemon
        .client
        .get_text("/v1/metrics")
        .await
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("conduit_retention_"))
        .map(str::to_owned)
        .collect::<Vec<_>>();
    println!(
        "bounds: WAL ≤ {:.0} MiB; artifacts/ ≤ {:.2} MiB (budget {:.0} MiB and one {} s interval of {} KiB every {} s, 1.5×)",
        bounds.wal_mib,
        bounds.artifacts_mib,
        BUDGET_BYTES as f64 / MIB,
        SWEEP_INTERVAL_S,
        BLOB_BYTES / 1024,
        BLOB_EVERY.as_secs()
    );
    let title = format!(
        "conduit soak: {} min, {} extensions, {} events/s, commit {}",
        args.minutes, args.extensions, args.rate, commit
    );
    let svg_path = args.out.join("soak.svg");
    std::fs::write(
        &svg_path,
        report::svg(&samples, WARMUP_S, restart_s, &bounds, &title),
    )?;
    let json_path = args.out.join("report.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)? + "\n")?;
    let details = json!({
        "commit": commit,
        "profile": machine::profile(),
        "machine": machine,
        "load_at_end": Machine::this().loadavg,
        "rate": args.rate,
        "extensions": args.extensions,
        "restart_s": restart_s,
        "warmup_s": WARMUP_S,
        "bounds": {"wal_mib": bounds.wal_mib, "artifacts_mib": bounds.artifacts_mib},
        "events": {"offered": get(&c.offered), "shed": get(&c.shed), "acked": acked, "stored": stored,
                   "ack_p50_ms": quantile_us(&hist, 0.5) / 1e3, "ack_p99_ms": quantile_us(&hist, 0.99) / 1e3},
        "calls": {"ok": get(&c.calls_ok), "failed": get(&c.calls_failed), "failures": failures,
                  "hung_timed_out": get(&c.hung_calls_timed_out), "hung_answered": get(&c.hung_calls_answered)},
        "artifacts": {"stored": get(&c.blobs_ok), "failed": get(&c.blobs_failed)},
        "crashes": get(&c.crashes),
        "retention_metrics": retention,
        "samples": samples,
    });
    std::fs::write(
        args.out.join("samples.json"),
        serde_json::to_string_pretty(&details)? + "\n",
    )?;
    let stopped = tokio::task::spawn_blocking(move || daemon.stop()).await??;
    println!(
        "stopped in {:.1} s; plot {}; report {}",
        stopped.as_secs_f64(),
        svg_path.display(),
        json_path.display()
    );
    if why.is_empty() {
        println!("soak: passed");
    } else {
        for w in &why {
            println!("soak: FAILED: {w}");
        }
    }
    Ok(why.is_empty())
}

const MIB: f64 = 1024.0 * 1024.0;

/// Start the daemon and wait for every extension to be ready (the hung one included: it is
/// stopped only once ready).
async fn start(conduit: &Path, state: &Path, n: usize) -> anyhow::Result<Daemon> {
    let daemon = Daemon::start(conduit, state, READY_WITHIN).await?;
    wait_ready(&daemon.client, n).await?;
    Ok(daemon)
}

async fn wait_ready(client: &Client, n: usize) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        // A request the daemon refuses or drops while it starts is asked again.
        let list = client.get("/v1/extensions").await.unwrap_or_default();
        let exts = list["extensions"].as_array().cloned().unwrap_or_default();
        let ready = exts.iter().filter(|e| e["state"] == "ready").count();
        if ready == n {
            return Ok(());
        }
        if t.elapsed() > READY_WITHIN {
            let not: Vec<String> = exts
                .iter()
                .filter(|e| e["state"] != "ready")
                .map(|e| format!("{} {}", e["name"], e["state"]))
                .collect();
            bail!(
                "only {ready} of {n} extensions ready after {READY_WITHIN:?}: {}",
                not.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Fixed-rate ingress: one push every 1/rate s, each retried until acknowledged.
async fn ingress(shared: Arc<Shared>, rate: u32) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut i = 0u64;
    while !shared.stopped() {
        tick.tick().await;
        let c = &shared.counts;
        c.offered.fetch_add(1, Ordering::Relaxed);
        if c.in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            c.shed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        c.in_flight.fetch_add(1, Ordering::Relaxed);
        let delivery = format!("soak-{i}");
        let body = json!({
            "source": "notes-inbox",
            "delivery_id": delivery,
            "kind": "note.posted",
            "payload": {"thread": format!("t-{}", i % 50), "author": "soak", "text": "x".repeat(200)},
        });
        i += 1;
        let shared = shared.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let mut backoff = Duration::from_millis(100);
            loop {
                let answer = match shared.client() {
                    Some(client) => {
                        let _slot = shared.push_slots.acquire().await;
                        Some(
                            client
                                .request(Method::POST, "/v1/events", Some(&body))
                                .await,
                        )
                    }
                    None => None,
                };
                if let Some(Ok((status, v))) = answer
                    && status.is_success()
                    && let Some(id) = v["event_id"].as_i64()
                {
                    record(&mut shared.ack_hist.lock().unwrap(), t.elapsed());
                    shared
                        .acked
                        .lock()
                        .unwrap()
                        .entry(delivery)
                        .or_default()
                        .insert(id);
                    break;
                }
                // Refused or the daemon is restarting: the same delivery again (deduplicated).
                if shared.stopped() && t.elapsed() > Duration::from_secs(60) {
                    break;
                }
                shared.counts.push_retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            shared.counts.in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
    // Wait for the pushes still in flight to be acknowledged.
    let t = Instant::now();
    while shared.counts.in_flight.load(Ordering::Relaxed) > 0
        && t.elapsed() < Duration::from_secs(90)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn call(
    client: &Client,
    name: &str,
    method: &str,
    params: Value,
    timeout_ms: u64,
) -> anyhow::Result<Value> {
    client
        .post(
            &format!("/v1/extensions/{name}/call"),
            Some(&json!({"method": method, "params": params, "timeout_ms": timeout_ms})),
        )
        .await
}

/// An `echo` every 200 ms, round robin. The one killed every 30 s fails now and then.
async fn calls(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(CALL_EVERY);
    let mut i = 0usize;
    while !shared.stopped() {
        tick.tick().await;
        let Some(client) = shared.client() else {
            continue;
        };
        let name = &shared.echo_names[i % shared.echo_names.len()];
        i += 1;
        let answer = call(&client, name, "echo", json!({"text": "soak"}), 10_000).await;
        let c = &shared.counts;
        let why = match answer {
            Ok(v) if v["result"]["text"] == "soak" => {
                c.calls_ok.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Ok(v) => v["error"]["message"]
                .as_str()
                .unwrap_or("no result")
                .to_owned(),
            Err(e) => e.to_string(),
        };
        c.calls_failed.fetch_add(1, Ordering::Relaxed);
        let key = format!("{name}: {}", why.chars().take(100).collect::<String>());
        *shared.failures.lock().unwrap().entry(key).or_default() += 1;
    }
}

/// A call to the hung extension every 10 s: it must end in its 2 s timeout.
async fn hung_calls(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(HUNG_CALL_EVERY);
    while !shared.stopped() {
        tick.tick().await;
        let Some(client) = shared.client() else {
            continue;
        };
        if !shared.hung_stopped.load(Ordering::Relaxed) {
            continue;
        }
        let answered = call(&client, "soak-hung", "echo", json!({"text": "soak"}), 2_000)
            .await
            .is_ok_and(|v| v["result"]["text"] == "soak");
        let c = &shared.counts;
        if answered {
            &c.hung_calls_answered
        } else {
            &c.hung_calls_timed_out
        }
        .fetch_add(1, Ordering::Relaxed);
    }
}

/// A 64 KiB artifact every 2 s, each new.
async fn blobs(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(BLOB_EVERY);
    let mut seed = 0u64;
    while !shared.stopped() {
        tick.tick().await;
        let Some(client) = shared.client() else {
            continue;
        };
        seed += 1;
        let ok = call(
            &client,
            "soak-blob",
            "blob",
            json!({"size": BLOB_BYTES, "seed": seed}),
            30_000,
        )
        .await
        .is_ok_and(|v| v["result"]["artifact_id"].is_string());
        let c = &shared.counts;
        if ok { &c.blobs_ok } else { &c.blobs_failed }.fetch_add(1, Ordering::Relaxed);
    }
}

async fn ext_pid(client: &Client, name: &str) -> Option<i32> {
    let v = client.get(&format!("/v1/extensions/{name}")).await.ok()?;
    (v["state"] == "ready")
        .then(|| v["pid"].as_i64())
        .flatten()
        .map(|p| p as i32)
}

/// `echo-rs-01` killed with SIGKILL every 30 s (a crash the daemon did not cause).
async fn crasher(shared: Arc<Shared>) {
    let victim = shared.echo_names[0].clone();
    let mut tick = tokio::time::interval(CRASH_EVERY);
    tick.tick().await;
    while !shared.stopped() {
        tick.tick().await;
        let Some(client) = shared.client() else {
            continue;
        };
        if let Some(pid) = ext_pid(&client, &victim).await
            && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
        {
            shared.counts.crashes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// SIGSTOP the hung extension's process unless it is stopped already.
async fn keep_hung(shared: &Shared) {
    let Some(client) = shared.client() else {
        return;
    };
    let Some(pid) = ext_pid(&client, "soak-hung").await else {
        return;
    };
    if !process_stopped(pid) && kill(Pid::from_raw(pid), Signal::SIGSTOP).is_ok() {
        shared.counts.hung_stops.fetch_add(1, Ordering::Relaxed);
    }
    shared
        .hung_stopped
        .store(process_stopped(pid), Ordering::Relaxed);
}

/// SIGCONT the hung extension before a stop, so the daemon's shutdown is not the one waiting.
async fn continue_hung(shared: &Shared, daemon: &Daemon) {
    let client = shared.client().unwrap_or_else(|| daemon.client.clone());
    let pid = client
        .get("/v1/extensions/soak-hung")
        .await
        .ok()
        .and_then(|v| v["pid"].as_i64());
    if let Some(pid) = pid {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
    }
}

fn process_stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
        .unwrap_or(false)
}

/// The daemon's whole-process CPU time (`/proc/<pid>/stat` utime + stime, threads that exited
/// included), read against the wall clock.
struct CpuClock {
    pid: u32,
    last_ticks: u64,
    last_at: Instant,
}

impl CpuClock {
    fn new(pid: u32) -> CpuClock {
        CpuClock {
            pid,
            last_ticks: cpu_ticks(pid).unwrap_or(0),
            last_at: Instant::now(),
        }
    }
    fn pct(&mut self) -> f64 {
        let ticks = cpu_ticks(self.pid).unwrap_or(self.last_ticks);
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
        let secs = self.last_at.elapsed().as_secs_f64().max(1e-3);
        let pct = 100.0 * ticks.saturating_sub(self.last_ticks) as f64 / hz / secs;
        self.last_ticks = ticks;
        self.last_at = Instant::now();
        pct
    }
}

fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14 and stime 15 (1-based) of the whole line.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn sample(t0: Instant, pid: u32, cpu: &mut CpuClock, state: &Path) -> anyhow::Result<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("the daemon ({pid}) is gone"))?;
    let field = |key: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let fds = descriptors(pid, &state.join("run/conduit.sock"));
    let file = |p: &str| std::fs::metadata(state.join(p)).map_or(0.0, |m| m.len() as f64) / MIB;
    Ok(Sample {
        t_s: t0.elapsed().as_secs_f64(),
        rss_mib: field("VmRSS:") / 1024.0,
        threads: field("Threads:"),
        fds,
        cpu_pct: cpu.pct(),
        db_mib: file("conduit.db"),
        wal_mib: file("conduit.db-wal"),
        artifacts_mib: tree_bytes(&state.join("artifacts")) as f64 / MIB,
        logs_mib: tree_bytes(&state.join("logs")) as f64 / MIB,
    })
}

/// The daemon's open descriptors less the management API's connections open at that moment:
/// those come and go with the load (tens at a time while pushes wait for the writer), and a
/// leak would show in the rest. A connection is a socket of the daemon that `/proc/net/unix`
/// lists connected (`St` 03) under the API's socket path.
fn descriptors(pid: u32, api_socket: &Path) -> f64 {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return f64::NAN;
    };
    let api = api_socket.to_string_lossy();
    let connections: HashSet<String> = std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[5] == "03" && f[7] == api).then(|| f[6].to_owned())
        })
        .collect();
    fds.flatten()
        .filter(|e| {
            let link = std::fs::read_link(e.path()).unwrap_or_default();
            let link = link.to_string_lossy();
            !link
                .strip_prefix("socket:[")
                .and_then(|r| r.strip_suffix(']'))
                .is_some_and(|inode| connections.contains(inode))
        })
        .count() as f64
}

fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// Every acknowledged event found in the Work that hold it: (acked, lost, duplicated, stored).
/// Lost: acknowledged but not stored, or in no Work. Duplicated: in more than one Work, or a
/// delivery acknowledged under two event ids, or stored twice.
async fn account(client: &Client, shared: &Shared) -> anyhow::Result<(u64, u64, u64, u64)> {
    let acked = shared.acked.lock().unwrap().clone();
    // Wait until every stored event is routed (the router may still be catching up).
    let t = Instant::now();
    let events = loop {
        let events = pages(client, "/v1/events", "events").await?;
        if events.iter().all(|e| e.get("routed_at_ms").is_some()) {
            break events;
        }
        ensure!(
            t.elapsed() < Duration::from_secs(300),
            "events still unrouted after 300 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let works = pages(client, "/v1/work", "work").await?;
    let mut in_works: HashMap<i64, u64> = HashMap::new();
    for w in &works {
        for id in w["event_ids"].as_array().into_iter().flatten() {
            if let Some(id) = id.as_i64() {
                *in_works.entry(id).or_default() += 1;
            }
        }
    }
    let mut by_delivery: HashMap<&str, u64> = HashMap::new();
    let mut stored: HashSet<i64> = HashSet::new();
    for e in &events {
        if let (Some(d), Some(id)) = (e["delivery_id"].as_str(), e["id"].as_i64()) {
            *by_delivery.entry(d).or_default() += 1;
            stored.insert(id);
        }
    }
    let (mut lost, mut duplicated) = (0, 0);
    for (delivery, ids) in &acked {
        if ids.len() > 1 || by_delivery.get(delivery.as_str()).copied().unwrap_or(0) > 1 {
            duplicated += 1;
            continue;
        }
        let id = *ids
            .iter()
            .next()
            .expect("an acknowledged delivery has an id");
        match (
            stored.contains(&id),
            in_works.get(&id).copied().unwrap_or(0),
        ) {
            (true, 1) => {}
            (true, n) if n > 1 => duplicated += 1,
            _ => lost += 1,
        }
    }
    Ok((acked.len() as u64, lost, duplicated, events.len() as u64))
}

/// Every row of a list endpoint, 200 at a time.
async fn pages(client: &Client, path: &str, key: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut after = 0i64;
    loop {
        let v = client
            .get(&format!("{path}?after={after}&limit=200"))
            .await?;
        let rows = v[key].as_array().cloned().unwrap_or_default();
        let Some(last) = rows.last().and_then(|r| r["id"].as_i64()) else {
            return Ok(out);
        };
        after = last;
        out.extend(rows);
    }
}
