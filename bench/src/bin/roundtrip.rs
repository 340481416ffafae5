//! The round-trip benchmark: sequential echo calls to a child process over its pipes, each
//! figure printed beside the raw pipe floor measured in the same regime of the same run.
//!
//! Run with: `cargo run --release -p conduit-bench --bin roundtrip` (about 15 seconds; see
//! `bench/README.md` for the options).
//!
//! The machines this runs on have two speeds (docs/performance.md, "Machine"): idle vCPUs halt between wake-ups and a
//! pipe round trip across CPUs costs tens of µs or more; kept awake by a lowest-priority busy
//! loop it costs a fraction of that. Every workload therefore runs in both regimes, and in
//! three placements of the two processes (one CPU, two CPUs, the scheduler's choice), and is
//! reported as a ratio to the floor measured the same way in the same run rather than as an
//! absolute number that would mean nothing on another day.
//!
//! Workloads (see `workload.rs`): the floor, a one-task JSON-RPC loop on tokio, the conduit
//! session on both sides, the session against the one-task child, the session against a child
//! dispatching through jsonrpsee's `RpcModule`, and jsonrpsee's client with a demux against that
//! child.
//!
//! The timed calls are split into rounds (5 by default), each a fresh child with its own
//! warm-up, and the workloads take turns round by round: any drift of the machine falls on
//! every workload alike instead of on whichever ran last. Each round's p50 is kept, so the
//! spread is visible.
//!
//! One binary plays every role: the children are this executable re-run with a hidden
//! `--child ROLE` (see `child.rs`), so nothing has to locate another binary.

// The binary's root is this file, so its modules live beside it under `roundtrip/`.
#[path = "roundtrip/child.rs"]
mod child;
#[path = "roundtrip/jsonrpsee_client.rs"]
mod jsonrpsee_client;
#[path = "roundtrip/measure.rs"]
mod measure;
#[path = "roundtrip/workload.rs"]
mod workload;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use conduit_bench::machine;
use conduit_bench::ordered::Ordered;
use conduit_bench::regime::{self, Spinners};
use serde::Serialize;

use crate::child::Role;
use crate::measure::{Run, Summary};
use crate::workload::{HostRuntime, PAYLOAD, Workload};

/// Echo round trips to a child process, beside the raw pipe floor.
#[derive(Debug, Parser)]
#[command(name = "roundtrip")]
struct Args {
    /// Which speed regime(s) to measure.
    #[arg(long, value_enum, default_value = "both")]
    regime: RegimeArg,
    /// Timed calls per workload, over all rounds.
    #[arg(long, default_value_t = 10_000)]
    calls: u64,
    /// Untimed calls each child serves before its timed ones.
    #[arg(long, default_value_t = 1_000)]
    warmup: u64,
    /// Rounds the timed calls are split into, each a fresh child; workloads take turns.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Where host and child run (comma-separated); the first is the one the `regimes` key of
    /// the JSON holds.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "same,split,free"
    )]
    placement: Vec<Placement>,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "target/roundtrip/results.json")]
    json: PathBuf,
    /// Where the host side's calls come from: `current` (a current-thread runtime) or
    /// `host-loop` (the main thread blocking on each call while a two-worker runtime carries
    /// the session, as the daemon's host loop does).
    #[arg(long, value_enum, default_value = "current")]
    host_runtime: HostRuntime,
    /// Run only these workloads (comma-separated); the floor always runs.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Workload>,
    /// Internal: play a child's role.
    #[arg(long, value_enum, hide = true)]
    child: Option<Role>,
    /// Internal: the CPU a child role runs on.
    #[arg(long, hide = true)]
    pin: Option<usize>,
    /// Internal: be a busy loop pinned to this CPU (the awake regime's spinner).
    #[arg(long, hide = true, value_name = "CPU")]
    spin: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RegimeArg {
    Idle,
    Awake,
    Both,
}

/// Where the host and the child run. Which CPU the scheduler puts two processes on moves a
/// round trip more than anything the session does (awake: ≈ 7 µs on one CPU, ≈ 23 µs across
/// two; it picks anew for every child), so every workload is measured with the placement
/// fixed both ways, and once left to the scheduler.
///
/// `same` comes first by default, and is what the `regimes` key of the JSON holds: its floor
/// is the smallest, so its ratios are the strictest. `free` is whatever the scheduler chose
/// for each child: across CPUs when idle, one or the other from child to child when awake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Placement {
    /// Host on CPU 0, child on CPU 1: every message wakes the other CPU.
    Split,
    /// Both on CPU 0: every message is a context switch on one CPU.
    Same,
    /// Wherever the scheduler puts them.
    Free,
}

impl Placement {
    fn key(self) -> &'static str {
        match self {
            Placement::Split => "split-cpus",
            Placement::Same => "same-cpu",
            Placement::Free => "free",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Placement::Split => "host pinned to CPU 0, child to CPU 1",
            Placement::Same => "host and child pinned to CPU 0",
            Placement::Free => "host and child placed by the scheduler",
        }
    }

    /// (the host's CPU, the child's CPU); `None` for the host is every CPU, for the child
    /// whatever it inherits from the host.
    fn cpus(self) -> (Option<usize>, Option<usize>) {
        match self {
            Placement::Split => (Some(0), Some(1)),
            Placement::Same => (Some(0), None),
            Placement::Free => (None, None),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Regime {
    Idle,
    Awake,
}

impl Regime {
    fn key(self) -> &'static str {
        match self {
            Regime::Idle => "idle",
            Regime::Awake => "awake",
        }
    }
}

#[derive(Debug, Serialize)]
struct Machine {
    cpus: usize,
    kernel: String,
    cpu_model: String,
}

/// The state of the machine when a regime started.
#[derive(Debug, Serialize)]
struct Conditions {
    spinners: usize,
    loadavg_before: String,
}

#[derive(Debug, Serialize)]
struct Report {
    commit: String,
    /// Whether the working tree had changes the commit does not hold.
    dirty: bool,
    command: String,
    machine: Machine,
    payload_bytes: usize,
    warmup: u64,
    calls: u64,
    rounds: u64,
    /// Where the host side's calls came from.
    host_runtime: HostRuntime,
    /// The placement `regimes` holds.
    placement: &'static str,
    conditions: Ordered<Conditions>,
    /// Regime → workload → figures, for the first placement asked for.
    regimes: Ordered<Ordered<Summary>>,
    /// Placement → regime → workload → figures, for every placement.
    placements: Ordered<Ordered<Ordered<Summary>>>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(cpu) = args.spin {
        let Err(e) = regime::spin(cpu);
        return Err(e);
    }
    if let Some(role) = args.child {
        return child::run(role, args.pin);
    }
    let exe = std::env::current_exe().context("locating this executable")?;
    let regimes: &[Regime] = match args.regime {
        RegimeArg::Idle => &[Regime::Idle],
        RegimeArg::Awake => &[Regime::Awake],
        RegimeArg::Both => &[Regime::Idle, Regime::Awake],
    };
    let workloads: Vec<Workload> = Workload::ALL
        .into_iter()
        .filter(|w| *w == Workload::Floor || args.only.is_empty() || args.only.contains(w))
        .collect();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut placements = args.placement.clone();
    placements.dedup();
    if cpus < 2 {
        // Nothing to split across: say so instead of pinning to a CPU that does not exist.
        placements.retain(|p| *p != Placement::Split);
        anyhow::ensure!(
            !placements.is_empty(),
            "one CPU: use --placement same or free"
        );
    }

    let commit = machine::commit();
    let dirty = commit.ends_with("-dirty");
    let this = machine::Machine::this();
    let mut report = Report {
        commit: commit.trim_end_matches("-dirty").to_owned(),
        dirty,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: Machine {
            cpus,
            kernel: this.kernel,
            cpu_model: this.cpu_model,
        },
        payload_bytes: PAYLOAD.len(),
        warmup: args.warmup,
        calls: args.calls,
        rounds: args.rounds,
        host_runtime: args.host_runtime,
        placement: placements[0].key(),
        conditions: Ordered::default(),
        regimes: Ordered::default(),
        placements: Ordered(
            placements
                .iter()
                .map(|p| (p.key().to_owned(), Ordered::default()))
                .collect(),
        ),
    };
    println!(
        "round trip: {} sequential echo calls in {} rounds, each after {} warm-up calls, {}-byte payload, {} host runtime; commit {}{}; {} CPUs, {}",
        args.calls,
        args.rounds,
        args.warmup,
        PAYLOAD.len(),
        args.host_runtime.key(),
        report.commit,
        if report.dirty { " (dirty)" } else { "" },
        cpus,
        report.machine.cpu_model,
    );

    for &regime in regimes {
        let loadavg_before = machine::Machine::this().loadavg;
        let spinners = match regime {
            Regime::Idle => None,
            Regime::Awake => Some(Spinners::start(&exe, "--spin")?),
        };
        let n_spinners = spinners.as_ref().map_or(0, Spinners::len);
        for (i, &placement) in placements.iter().enumerate() {
            let (host_cpu, child_cpu) = placement.cpus();
            regime::pin_to(host_cpu).context("pinning the host")?;
            let results = run_regime(
                &exe,
                &workloads,
                args.warmup,
                args.calls,
                args.rounds,
                child_cpu,
                args.host_runtime,
            )?;
            print_table(regime, placement, n_spinners, &results);
            if i == 0 {
                report
                    .regimes
                    .0
                    .push((regime.key().into(), results.clone()));
            }
            report.placements.0[i]
                .1
                .0
                .push((regime.key().into(), results));
        }
        regime::pin_to(None).context("unpinning the host")?;
        drop(spinners);
        report.conditions.0.push((
            regime.key().into(),
            Conditions {
                spinners: n_spinners,
                loadavg_before,
            },
        ));
    }

    write_json(&args.json, &report)?;
    println!("results written to {}", args.json.display());
    Ok(())
}

/// Run the workloads in turns, `rounds` times, and merge each one's rounds.
fn run_regime(
    exe: &Path,
    workloads: &[Workload],
    warmup: u64,
    calls: u64,
    rounds: u64,
    child_cpu: Option<usize>,
    host_runtime: HostRuntime,
) -> anyhow::Result<Ordered<Summary>> {
    let mut runs: Vec<Run> = workloads.iter().map(|_| Run::empty()).collect();
    for round in 0..rounds {
        // The last round takes what does not divide evenly.
        let n = calls / rounds
            + if round == rounds - 1 {
                calls % rounds
            } else {
                0
            };
        // Start each round at a different workload, so none always follows the same one.
        let start = round as usize % workloads.len();
        for i in (start..workloads.len()).chain(0..start) {
            let w = workloads[i];
            let run = w
                .run(exe, warmup, n, child_cpu, host_runtime)
                .with_context(|| w.key())?;
            runs[i].merge(run);
        }
    }
    let floor_at = workloads
        .iter()
        .position(|w| *w == Workload::Floor)
        .context("the floor always runs")?;
    let floor = Summary::new(Workload::Floor.description(), warmup, &runs[floor_at], None);
    let mut out = Ordered::default();
    for (w, run) in workloads.iter().zip(&runs) {
        let s = if *w == Workload::Floor {
            floor.clone()
        } else {
            Summary::new(w.description(), warmup, run, Some(&floor))
        };
        out.0.push((w.key().to_owned(), s));
    }
    Ok(out)
}

fn print_table(regime: Regime, placement: Placement, spinners: usize, results: &Ordered<Summary>) {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\n{} regime, {} ({}; {})",
        regime.key(),
        placement.key(),
        match spinners {
            0 => "no spinner".to_owned(),
            n => format!("{n} `nice -n 19` busy loops, one pinned to each CPU"),
        },
        placement.describe(),
    );
    let _ = writeln!(
        t,
        "{:<20} {:>8} {:>8} {:>8} {:>9} {:>6} {:>6} {:>12} {:>12} {:>6} {:>6} {:>9} {:>7}  p50 by round",
        "workload",
        "p50 µs",
        "p95 µs",
        "p99 µs",
        "max µs",
        "p50×",
        "p99×",
        "CPU µs/call",
        "(host+child)",
        "sys",
        "CPU×",
        "csw/call",
        "others",
    );
    for (key, s) in &results.0 {
        let split = format!(
            "{:.1}+{:.1}",
            s.cpu_host_us_per_call, s.cpu_child_us_per_call
        );
        let _ = writeln!(
            t,
            "{:<20} {:>8.1} {:>8.1} {:>8.1} {:>9.1} {:>6.2} {:>6.2} {:>12.1} {:>12} {:>6.1} {:>6.2} {:>9} {:>6.0}%  {}",
            key,
            s.p50_us,
            s.p95_us,
            s.p99_us,
            s.max_us,
            s.p50_ratio,
            s.p99_ratio,
            s.cpu_us_per_call,
            split,
            s.cpu_sys_us_per_call,
            s.cpu_ratio,
            format!(
                "{:.1}+{:.1}",
                s.voluntary_switches_per_call, s.involuntary_switches_per_call
            ),
            s.others_cpu_pct,
            s.p50_by_round_us
                .iter()
                .map(|v| format!("{v:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let busiest = results
        .0
        .iter()
        .map(|(_, s)| s.others_cpu_pct)
        .fold(0.0, f64::max);
    let _ = writeln!(
        t,
        "(CPU: user+sys of both processes per call, warm-up and start included; sys: the \
         kernel's share of it; csw: context switches of both processes, voluntary+involuntary; \
         others: non-nice CPU the rest of the machine used meanwhile, \
         % of one CPU)"
    );
    // Even a quiet machine shows 10-17% here: `/proc/stat` is sampled by ticks while
    // `getrusage` is exact, and the kernel's work for the nice-19 spinners (switching them
    // out, their timer ticks) is counted as system time, not as nice. A real neighbour (a
    // build, another benchmark) shows 30-100% and more.
    if busiest > 25.0 {
        let _ = writeln!(
            t,
            "warning: other processes used up to {busiest:.0}% of a CPU during this regime; \
             these are not a quiet machine's figures"
        );
    }
    print!("{t}");
}

fn write_json(path: &Path, report: &Report) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut text = serde_json::to_string_pretty(report)?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
