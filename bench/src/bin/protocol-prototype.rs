//! The transport comparison: one workload over conduit's JSON-RPC on stdio (the real SDK and
//! session) and over gRPC on a Unix socket (tonic), each figure beside this machine's floor
//! measured in the same regime of the same run.
//!
//! Run with `make protocol-prototype`, or:
//!
//! ```text
//! cargo build --release -p conduit-bench --features grpc
//! target/release/protocol-prototype [--regime idle|awake|both] [--rounds 5] [--json PATH]
//! ```
//!
//! It takes under a minute on a 2-CPU machine (both regimes, three placements of host and
//! children, 5 rounds each), prints one table per regime and placement, and writes
//! `target/protocol-prototype/results.json`.
//!
//! Figures (per transport): cold start, warm restart, version-mismatch refusal, echo p50 and
//! p99, host callback, pipelined echo with 64 in flight, a 16 MiB artifact in 64 KiB chunks,
//! cancellation seen by the extension, crash detected, and the release binary's size; each with
//! the CPU time of both processes per operation. Floors: raw pipe round trip of the same
//! payload, the pipe's message rate with the same pipelining, bare spawn to first byte, raw
//! pipe throughput of 16 MiB in 64 KiB writes, and SIGKILL of a child to EOF on its pipe. See
//! `transport.rs` for what each timer spans.
//!
//! Each figure is the median over rounds (5 by default), with its spread. A round measures
//! the floors, then both transports, in alternating order, so that drift of the machine falls
//! on all alike. The machine's two speeds (docs/performance.md, "Machine") are measured one after the other: idle,
//! then awake with one `nice -n 19` busy loop pinned to each CPU; within each, every placement
//! (`same`, `split`, `free`; see [`Placement`]).
//!
//! The children (`proto-jsonrpc-child`, `proto-grpc-child`, `proto-floor-child`) are found next
//! to this executable, so build the package as a whole.

#[path = "protocol_prototype/daemon.rs"]
mod daemon;
#[path = "protocol_prototype/floors.rs"]
mod floors;
#[path = "protocol_prototype/grpc.rs"]
mod grpc;
#[path = "protocol_prototype/jsonrpc.rs"]
mod jsonrpc;
#[path = "protocol_prototype/report.rs"]
mod report;
#[path = "protocol_prototype/transport.rs"]
mod transport;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, ensure};
use clap::{Parser, ValueEnum};
use conduit_bench::machine::{self, Machine};
use conduit_bench::measure::CpuMark;
use conduit_bench::ordered::Ordered;
use conduit_bench::prototype::{ARTIFACT_BYTES, CHUNK_BYTES, PAYLOAD};
use conduit_bench::regime::{self, Cpus, Spinners};
use serde::Serialize;

use crate::report::{Conditions, Regime, RegimeResult};
use crate::transport::{Config, Figures, Transport};

/// The transport comparison: JSON-RPC on stdio against gRPC on a Unix socket, beside this
/// machine's floors.
#[derive(Debug, Parser)]
#[command(name = "protocol-prototype", version)]
struct Args {
    /// Which speed regime(s) to measure.
    #[arg(long, value_enum, default_value_t = RegimeArg::Both)]
    regime: RegimeArg,
    /// Rounds; every figure is the median over them.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Untimed echo calls (and floor round trips) before the timed ones, per round.
    #[arg(long, default_value_t = 500)]
    warmup: u64,
    /// Timed sequential echo calls (and floor round trips) per round.
    #[arg(long, default_value_t = 2000)]
    calls: u64,
    /// Timed host callbacks per round.
    #[arg(long, default_value_t = 1000)]
    callbacks: u32,
    /// Timed pipelined echo calls (and floor messages) per round.
    #[arg(long, default_value_t = 20_000)]
    pipelined: u64,
    /// Calls in flight at once when pipelining.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// Cold starts, warm restarts, refusals and crashes (and floor spawns and kills) per round.
    #[arg(long, default_value_t = 10)]
    starts: usize,
    /// Cancellations per round.
    #[arg(long, default_value_t = 20)]
    cancels: usize,
    /// Timed 16 MiB transfers per round (after one untimed).
    #[arg(long, default_value_t = 2)]
    artifacts: usize,
    /// The artifact's size in bytes (16 MiB; smaller only for quick runs).
    #[arg(long, default_value_t = ARTIFACT_BYTES)]
    artifact_bytes: u64,
    /// Where host and children run (comma-separated; each is measured in both regimes, and
    /// the first is what the JSON's `regimes` key holds): `same` pins all to CPU 0, `split`
    /// the host to CPU 0 and the children to CPU 1, `free` leaves it to the scheduler.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "same,split,free"
    )]
    placement: Vec<Placement>,
    /// Run only these transports (comma-separated; for profiling one at a time).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "jsonrpc-stdio,grpc-uds"
    )]
    transport: Vec<Which>,
    /// Where the results go, relative to the current directory.
    #[arg(long, default_value = "target/protocol-prototype/results.json")]
    json: PathBuf,
    /// Internal: be a busy loop pinned to this CPU (the awake regime's spinner).
    #[arg(long, hide = true, value_name = "CPU")]
    spin: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum RegimeArg {
    Idle,
    Awake,
    Both,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Which {
    JsonrpcStdio,
    GrpcUds,
}

/// Where the host and the children run. Placement moves a round trip more than anything the
/// code does (one CPU: every message is a context switch; two: every message wakes the other
/// CPU), and the scheduler picks anew for every child, so each figure is measured with the
/// placement fixed both ways, and once left to the scheduler.
///
/// `same` comes first by default: its floors are the smallest and steadiest, so its ratios
/// are the strictest. Throughputs are another matter: on one CPU the two processes' work adds
/// up, across two it overlaps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Placement {
    Same,
    Split,
    Free,
}

impl Placement {
    fn key(self) -> &'static str {
        match self {
            Placement::Same => "same-cpu",
            Placement::Split => "split-cpus",
            Placement::Free => "free",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Placement::Same => "host and children pinned to CPU 0",
            Placement::Split => "host pinned to CPU 0, children to CPU 1",
            Placement::Free => "host and children placed by the scheduler",
        }
    }

    fn cpus(self) -> Cpus {
        match self {
            Placement::Same => Cpus {
                host: Some(0),
                child: None,
            },
            Placement::Split => Cpus {
                host: Some(0),
                child: Some(1),
            },
            Placement::Free => Cpus::default(),
        }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    commit: String,
    machine: Machine,
    profile: &'static str,
    command: String,
    payload_bytes: usize,
    config: Config,
    /// The size of each child binary, by transport (and the floor's).
    binaries: Ordered<u64>,
    /// The placement `regimes` holds.
    placement: &'static str,
    /// Regime → results, for the first placement asked for.
    regimes: Ordered<RegimeResult>,
    /// Placement → regime → results, for every placement.
    placements: Ordered<Ordered<RegimeResult>>,
    /// Regime → the artifact through a real daemon into its store, in the placement `regimes`
    /// holds (every placement's is in `placements`; absent without `conduit` beside this
    /// executable).
    through_daemon: Ordered<Figures>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(cpu) = args.spin {
        return match regime::spin(cpu) {
            Err(e) => {
                eprintln!("protocol-prototype: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("protocol-prototype: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let programs = programs_beside(&exe)?;
    let cfg = Config {
        rounds: args.rounds as usize,
        warmup: args.warmup,
        calls: args.calls.max(1),
        callbacks: args.callbacks.max(1),
        pipelined: args.pipelined.max(args.in_flight as u64),
        in_flight: args.in_flight.max(1),
        starts: args.starts.max(1),
        cancels: args.cancels.max(1),
        artifacts: args.artifacts.max(1),
        artifact_bytes: args.artifact_bytes.clamp(1, ARTIFACT_BYTES),
        chunk_bytes: CHUNK_BYTES,
    };
    let regimes: &[Regime] = match args.regime {
        RegimeArg::Idle => &[Regime::Idle],
        RegimeArg::Awake => &[Regime::Awake],
        RegimeArg::Both => &[Regime::Idle, Regime::Awake],
    };
    let mut placements = args.placement.clone();
    placements.dedup();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        // Nothing to split across: say so instead of pinning to a CPU that does not exist.
        placements.retain(|p| *p != Placement::Split);
        ensure!(
            !placements.is_empty(),
            "one CPU: use --placement same or free"
        );
    }
    let mut transports = args.transport.clone();
    transports.dedup();
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut binaries = Ordered::default();
    binaries.push("jsonrpc-stdio", size(&programs.jsonrpc));
    binaries.push("grpc-uds", size(&programs.grpc));
    binaries.push("floor", size(&programs.floor));

    let machine = Machine::this();
    let commit = machine::commit();
    println!(
        "protocol-prototype: {} rounds per regime and placement; commit {commit}, {} build; {} CPUs, {}",
        cfg.rounds,
        machine::profile(),
        machine.cpus,
        machine.cpu_model,
    );
    if machine::profile() == "debug" {
        println!(
            "note: a debug build; the figures mean little (make protocol-prototype builds release)"
        );
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let dir = tempfile::Builder::new()
        .prefix("protocol-prototype-")
        .tempdir()
        .context("a folder for the sockets")?;
    let host = rt.block_on(async { grpc::serve_host(dir.path()) })?;
    let mut json = jsonrpc::JsonRpc::new(programs.jsonrpc.clone());
    let mut grpc = grpc::Grpc::new(programs.grpc.clone(), dir.path(), host);

    let mut by_placement: Ordered<Ordered<RegimeResult>> = Ordered(
        placements
            .iter()
            .map(|p| (p.key().to_owned(), Ordered::default()))
            .collect(),
    );
    let started = Instant::now();
    let conduit = daemon::conduit_beside(&exe);
    if conduit.is_none() {
        println!(
            "note: no `conduit` beside this executable; the artifact through the daemon is not measured"
        );
    }
    let mut through_daemon: Ordered<Figures> = Ordered::default();
    for &regime in regimes {
        let spinners = match regime {
            Regime::Idle => None,
            Regime::Awake => Some(Spinners::start(&exe, "--spin")?),
        };
        let n_spinners = spinners.as_ref().map_or(0, Spinners::len);
        for (pi, &placement) in placements.iter().enumerate() {
            let cpus = placement.cpus();
            cpus.pin_host().context("pinning the host")?;
            json.cpus = cpus;
            grpc.cpus = cpus;
            let loadavg_before = Machine::this().loadavg;
            let mark = CpuMark::now()?;
            let mut floors: Vec<Figures> = Vec::new();
            let mut rounds: Ordered<Vec<Figures>> = Ordered::default();
            for w in &transports {
                let key = match w {
                    Which::JsonrpcStdio => json.key(),
                    Which::GrpcUds => grpc.key(),
                };
                rounds.push(key, Vec::new());
            }
            for round in 0..cfg.rounds {
                let t = Instant::now();
                floors
                    .push(floors::round(&programs, dir.path(), &cfg, cpus).context("the floors")?);
                // Alternate which transport goes first, so neither always follows the floors.
                let mut order: Vec<usize> = (0..transports.len()).collect();
                if round % 2 == 1 {
                    order.reverse();
                }
                for i in order {
                    let figures = match transports[i] {
                        Which::JsonrpcStdio => rt
                            .block_on(transport::round(&mut json, &cfg))
                            .context("jsonrpc-stdio")?,
                        Which::GrpcUds => rt
                            .block_on(transport::round(&mut grpc, &cfg))
                            .context("grpc-uds")?,
                    };
                    rounds.0[i].1.push(figures);
                }
                eprintln!(
                    "  {} regime, {}: round {}/{} done in {:.1} s",
                    regime.key(),
                    placement.key(),
                    round + 1,
                    cfg.rounds,
                    t.elapsed().as_secs_f64()
                );
            }
            let spent = mark.elapsed()?;
            // The daemon's path in the same regime and placement, beside the bench's host.
            let through = match &conduit {
                Some(conduit) => Some(
                    rt.block_on(daemon::artifacts(
                        conduit,
                        &programs.jsonrpc,
                        dir.path(),
                        cfg.artifact_bytes,
                        cfg.artifacts,
                        cpus,
                    ))
                    .context("the artifact through the daemon")?,
                ),
                None => None,
            };
            let conditions = Conditions {
                spinners: n_spinners,
                placement: placement.describe(),
                loadavg_before,
                others_cpu_pct: 100.0 * spent.others.as_secs_f64()
                    / spent.wall.as_secs_f64().max(1e-9),
                wall_s: spent.wall.as_secs_f64(),
            };
            let res = report::summarise(
                regime,
                placement.key(),
                &floors,
                &rounds,
                &binaries,
                conditions,
                through.clone(),
            );
            if pi == 0
                && let Some(f) = through
            {
                through_daemon.push(regime.key(), f);
            }
            print!("{}", report::table(regime, placement.key(), &res));
            // The progress lines go to stderr; keep the two in order when both are a file.
            std::io::Write::flush(&mut std::io::stdout())?;
            by_placement.0[pi].1.push(regime.key(), res);
        }
        regime::pin_to(None).context("unpinning the host")?;
        drop(spinners);
    }
    drop(rt);

    let report = Report {
        commit,
        machine,
        profile: machine::profile(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        payload_bytes: PAYLOAD.len(),
        config: cfg,
        binaries,
        placement: placements[0].key(),
        regimes: by_placement.0[0].1.clone(),
        placements: by_placement,
        through_daemon,
    };
    write_json(&args.json, &report)?;
    println!(
        "\nresults written to {} ({:.0} s)",
        args.json.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The children, next to this executable.
fn programs_beside(exe: &Path) -> anyhow::Result<floors::Programs> {
    let dir = exe.parent().context("this executable's folder")?;
    let find = |name: &str| -> anyhow::Result<PathBuf> {
        let p = dir.join(name);
        ensure!(
            p.is_file(),
            "{} is missing: build the whole package (`cargo build --release -p conduit-bench --features grpc`)",
            p.display()
        );
        Ok(p)
    };
    Ok(floors::Programs {
        jsonrpc: find("proto-jsonrpc-child")?,
        grpc: find("proto-grpc-child")?,
        floor: find("proto-floor-child")?,
    })
}

fn write_json(path: &Path, report: &Report) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut text = serde_json::to_string_pretty(report)?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
