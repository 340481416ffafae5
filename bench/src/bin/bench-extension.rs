//! `bench-extension`: the in-transaction latency budget gate, against the `notes` example.
//!
//! Run with `make bench-extension` (release, both speed regimes), or by hand:
//!
//! ```text
//! cargo build --release -p conduit-example-notes -p conduit-bench
//! target/release/bench-extension [--rounds 5] [--calls 300] [--warmup 20] [--regime idle|awake]
//! ```
//!
//! It starts `conduit-notes` from its own target folder (the same profile: a release gate
//! times a release extension) under a [`Supervisor`], runs [`conduit_bench::gate`] against it,
//! prints each method's median, p95, p99 and max per round and then over the run, and writes
//! the run to `target/bench-extension/results.json`.
//!
//! Exit status: 0 when the gate passes; 1 when it fails (a method over budget in three rounds
//! running, or a wrong answer — the message names the method, the percentile and the rounds);
//! 2 when it could not run (no extension binary, the extension never became ready, bad
//! arguments).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::{Parser, ValueEnum};
use conduit_bench::gate::{self, Budget, GateConfig, GateReport, Method, Outcome, Stats, fmt_ms};
use conduit_bench::machine::{self, CpuSample, Machine};
use conduit_bench::regime::{self, Regime, Spinners};
use conduit_supervisor::process::ChildCommand;
use conduit_supervisor::{ExtensionSpec, State, Supervisor, no_callbacks};
use serde::Serialize;

/// The in-transaction latency budget gate.
#[derive(Debug, Parser)]
#[command(name = "bench-extension", version)]
struct Args {
    /// Rounds of timed calls of each method (at least 3: a method fails when it is over
    /// budget in 3 rounds running).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Timed calls of each method per round.
    #[arg(long, default_value_t = 300)]
    calls: usize,
    /// Untimed calls of each method before the first round.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// `idle`: nothing else runs. `awake`: a `nice -n 19` busy loop pinned to each CPU keeps
    /// the vCPUs from halting between calls (docs/performance.md, "Machine").
    #[arg(long, value_enum, default_value_t = RegimeArg::Idle)]
    regime: RegimeArg,
    /// Where the host side's calls come from: `host-loop` (the default: a thread of its own
    /// blocking on each call on a two-worker runtime, exactly as the daemon's host loop makes
    /// its in-transaction calls), `multi` (a task on that runtime) or `current` (a task on a
    /// one-thread runtime).
    #[arg(long, value_enum, default_value_t = HostRuntime::HostLoop)]
    host_runtime: HostRuntime,
    /// The extension to time (default: `conduit-notes` next to this binary). Anything that
    /// serves the notes example's handlers will do, e.g. `slow-extension`.
    #[arg(long, value_name = "PATH")]
    extension: Option<PathBuf>,
    /// An argument for the extension; repeat for several.
    #[arg(long = "extension-arg", value_name = "ARG", allow_hyphen_values = true)]
    extension_args: Vec<String>,
    /// Where the results go, relative to the current directory.
    #[arg(long, default_value = "target/bench-extension/results.json")]
    json: PathBuf,
    /// Internal: be a busy loop pinned to this CPU (the awake regime's spinner).
    #[arg(long, hide = true, value_name = "CPU")]
    spin: Option<usize>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RegimeArg {
    Idle,
    Awake,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum HostRuntime {
    HostLoop,
    Multi,
    Current,
}

impl From<RegimeArg> for Regime {
    fn from(r: RegimeArg) -> Regime {
        match r {
            RegimeArg::Idle => Regime::Idle,
            RegimeArg::Awake => Regime::Awake,
        }
    }
}

/// How long the extension gets to become ready.
const READY_WITHIN: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(cpu) = args.spin {
        return match regime::spin(cpu) {
            Err(e) => {
                eprintln!("bench-extension: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("bench-extension: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Run the gate; `Ok(false)` when it failed, `Err` when it could not run.
fn run(args: Args) -> anyhow::Result<bool> {
    let cfg = GateConfig {
        warmup: args.warmup,
        calls_per_round: args.calls,
        rounds: args.rounds,
        ..GateConfig::default()
    };
    cfg.validate().map_err(|e| anyhow!(e))?;
    let regime = Regime::from(args.regime);
    let exe = std::env::current_exe().context("finding this executable")?;
    let program = match &args.extension {
        Some(p) => p.clone(),
        None => default_extension(&exe)?,
    };
    let program = program
        .canonicalize()
        .with_context(|| format!("the extension {} is not there", program.display()))?;
    let machine = Machine::this();
    let commit = machine::commit();

    let rt = match args.host_runtime {
        // Several workers, as a daemon with an API beside its host loop has: the host side
        // pays the thread hops it would.
        HostRuntime::HostLoop | HostRuntime::Multi => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
        HostRuntime::Current => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    }
    .context("starting the runtime")?;
    let logs = tempfile::tempdir().context("creating a folder for the extension's log")?;
    let (report, others) = rt.block_on(async {
        let sup = Supervisor::new(no_callbacks());
        let command = ChildCommand {
            program: program.clone(),
            args: args.extension_args.iter().map(Into::into).collect(),
            cwd: program.parent().unwrap_or(Path::new("/")).to_path_buf(),
            env: vec![("CONDUIT_EXTENSION".into(), "notes".into())],
        };
        let spec = ExtensionSpec::new(
            "notes",
            env!("CARGO_PKG_VERSION"),
            command,
            logs.path().join("notes.log"),
        );
        let ext = sup.start(spec).await;
        if let Err(state) = ext.wait_for(READY_WITHIN, |s| s == State::Ready).await {
            let st = ext.status();
            sup.shutdown().await;
            return Err(anyhow!(
                "{} did not become ready within {READY_WITHIN:?} (it is {state}{}); its stderr:\n{}",
                program.display(),
                st.last_error.map(|e| format!(": {e}")).unwrap_or_default(),
                st.stderr_tail.join("\n")
            ));
        }
        let spinners = match regime {
            Regime::Idle => None,
            Regime::Awake => match Spinners::start(&exe, "--spin") {
                Ok(s) => Some(s),
                Err(e) => {
                    sup.shutdown().await;
                    return Err(e);
                }
            },
        };
        println!(
            "in-transaction calls to {} ({} build, {} regime{}, {} host runtime): {} warm-up \
             calls, then up to {} rounds of {} calls of each method; budget median {}, p95 {}",
            program.display(),
            machine::profile(),
            regime.as_str(),
            spinners
                .as_ref()
                .map(|s| format!(", {} busy loops", s.len()))
                .unwrap_or_default(),
            match args.host_runtime {
                HostRuntime::HostLoop => "host-loop thread on a multi-thread",
                HostRuntime::Multi => "multi-thread",
                HostRuntime::Current => "current-thread",
            },
            cfg.warmup,
            cfg.rounds,
            cfg.calls_per_round,
            fmt_ms(cfg.budget.median),
            fmt_ms(cfg.budget.p95),
        );
        let ours: Vec<u32> = [Some(std::process::id()), ext.status().pid]
            .into_iter()
            .flatten()
            .collect();
        let before = CpuSample::now(&ours);
        let report = if args.host_runtime == HostRuntime::HostLoop {
            // The daemon's host loop runs on a thread of its own and blocks on each call with
            // `Handle::block_on` while its transaction is open; time the calls the same way.
            let handle = tokio::runtime::Handle::current();
            let (ext, cfg) = (ext.clone(), cfg.clone());
            let thread = std::thread::spawn(move || {
                handle.block_on(gate::run_gate(&ext, &cfg, |m, s| {
                    println!("{}", round_line(m, s, cfg.rounds));
                }))
            });
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .map_err(|e| anyhow!("the gate's thread was lost: {e}"))?
                .map_err(|_| anyhow!("the gate's thread panicked"))?
        } else {
            gate::run_gate(&ext, &cfg, |m, s| {
                println!("{}", round_line(m, s, cfg.rounds));
            })
            .await
        };
        let others = machine::others_busy(before, CpuSample::now(&ours), machine.cpus);
        // The busy loops only matter while calls are timed.
        drop(spinners);
        // A wrong answer may be a crash or a panic: the extension's own words say which.
        if matches!(report.outcome, Outcome::WrongAnswer(_)) {
            let tail = ext.status().stderr_tail;
            if !tail.is_empty() {
                eprintln!("the extension's stderr, last lines:\n{}", tail.join("\n"));
            }
        }
        sup.shutdown().await;
        Ok((report, others))
    })?;

    print!("{}", table(&report, &cfg, regime, others));
    let results = Results::new(
        &report,
        &cfg,
        regime,
        args.host_runtime,
        commit,
        machine,
        others,
    );
    write_json(&args.json, &results)?;
    println!("results: {}", args.json.display());
    match &report.outcome {
        Outcome::Passed => {
            println!("the gate passed");
            Ok(true)
        }
        failed => {
            eprintln!("bench-extension: the gate failed:\n{failed}");
            Ok(false)
        }
    }
}

/// `conduit-notes` in this executable's folder, built in the same profile.
fn default_extension(exe: &Path) -> anyhow::Result<PathBuf> {
    let dir = exe.parent().context("this executable has no folder")?;
    let notes = dir.join("conduit-notes");
    if notes.is_file() {
        return Ok(notes);
    }
    let release = if cfg!(debug_assertions) {
        ""
    } else {
        " --release"
    };
    Err(anyhow!(
        "no `conduit-notes` in {}: build it with `cargo build{release} -p conduit-example-notes` \
         (or pass --extension PATH)",
        dir.display()
    ))
}

fn round_line(m: Method, s: &Stats, rounds: usize) -> String {
    let mut line = format!(
        "round {}/{rounds}  {:<18}  median {:>9}  p95 {:>9}  p99 {:>9}  max {:>9}",
        s.round,
        m.name(),
        fmt_ms(s.median),
        fmt_ms(s.p95),
        fmt_ms(s.p99),
        fmt_ms(s.max),
    );
    for o in &s.over {
        let _ = write!(line, "  OVER {} > {}", o.percentile, fmt_ms(o.budget));
    }
    line
}

/// Other processes' CPU above which the figures are not a quiet machine's, in % of a CPU.
const BUSY_NEIGHBOURS: f64 = 5.0;

fn table(report: &GateReport, cfg: &GateConfig, regime: Regime, others: f64) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\n{} build, {} regime; over every timed call (rounds × calls); budget median {}, p95 {}",
        machine::profile(),
        regime.as_str(),
        fmt_ms(report.budget.median),
        fmt_ms(report.budget.p95),
    );
    let _ = writeln!(
        t,
        "{:<18}  {:>9}  {:>9}  {:>9}  {:>9}  {:>6}  {:>6}  round medians",
        "method", "median", "p95", "p99", "max", "rounds", "calls"
    );
    for m in &report.methods {
        if m.rounds.is_empty() {
            let _ = writeln!(t, "{:<18}  not timed", m.method.name());
            continue;
        }
        let medians: Vec<String> = m
            .rounds
            .iter()
            .map(|r| format!("{:.3}", r.median.as_secs_f64() * 1e3))
            .collect();
        let _ = writeln!(
            t,
            "{:<18}  {:>9}  {:>9}  {:>9}  {:>9}  {:>6}  {:>6}  {}",
            m.method.name(),
            fmt_ms(m.total.median),
            fmt_ms(m.total.p95),
            fmt_ms(m.total.p99),
            fmt_ms(m.total.max),
            m.rounds.len(),
            m.total.calls,
            medians.join(" "),
        );
    }
    let _ = writeln!(
        t,
        "p99 and max are reported, not gated. {} calls per round; {} warm-up calls per method.",
        cfg.calls_per_round, cfg.warmup
    );
    let _ = writeln!(
        t,
        "other processes used {others:.1}% of a CPU meanwhile (non-nice time)"
    );
    if others > BUSY_NEIGHBOURS {
        let _ = writeln!(
            t,
            "warning: more than {BUSY_NEIGHBOURS}%: these are not a quiet machine's figures"
        );
    }
    t
}

/// `target/bench-extension/results.json`: the last run.
#[derive(Debug, Serialize)]
struct Results {
    commit: String,
    profile: &'static str,
    regime: &'static str,
    host_runtime: HostRuntime,
    machine: Machine,
    /// How much of one CPU other processes used while the calls were made, in percent
    /// (non-nice time: the awake regime's busy loops are not counted).
    others_cpu_percent: f64,
    passed: bool,
    /// `passed`, or why the gate failed.
    outcome: String,
    budget: BudgetJson,
    warmup: usize,
    calls_per_round: usize,
    methods: BTreeMap<&'static str, MethodJson>,
}

#[derive(Debug, Serialize)]
struct BudgetJson {
    median_us: u64,
    p95_us: u64,
}

/// The figures over every round; `null` for a method the gate never timed (it stopped at a
/// wrong answer first).
#[derive(Debug, Serialize)]
struct MethodJson {
    median_us: Option<u64>,
    p95_us: Option<u64>,
    p99_us: Option<u64>,
    max_us: Option<u64>,
    rounds: usize,
    calls: u64,
    per_round: Vec<RoundJson>,
}

#[derive(Debug, Serialize)]
struct RoundJson {
    round: usize,
    median_us: u64,
    p95_us: u64,
    p99_us: u64,
    max_us: u64,
    /// The gated percentiles over budget in this round.
    over: Vec<String>,
}

fn us(d: Duration) -> u64 {
    // Rounded to the nearest microsecond.
    ((d.as_nanos() + 500) / 1_000)
        .try_into()
        .unwrap_or(u64::MAX)
}

impl Results {
    fn new(
        report: &GateReport,
        cfg: &GateConfig,
        regime: Regime,
        host_runtime: HostRuntime,
        commit: String,
        machine: Machine,
        others: f64,
    ) -> Results {
        let budget = |b: Budget| BudgetJson {
            median_us: us(b.median),
            p95_us: us(b.p95),
        };
        let methods = report
            .methods
            .iter()
            .map(|m| {
                let per_round = m
                    .rounds
                    .iter()
                    .map(|r| RoundJson {
                        round: r.round,
                        median_us: us(r.median),
                        p95_us: us(r.p95),
                        p99_us: us(r.p99),
                        max_us: us(r.max),
                        over: r.over.iter().map(|o| o.percentile.to_string()).collect(),
                    })
                    .collect();
                let timed = |d: Duration| (m.total.calls > 0).then(|| us(d));
                let json = MethodJson {
                    median_us: timed(m.total.median),
                    p95_us: timed(m.total.p95),
                    p99_us: timed(m.total.p99),
                    max_us: timed(m.total.max),
                    rounds: m.rounds.len(),
                    calls: m.total.calls,
                    per_round,
                };
                (m.method.name(), json)
            })
            .collect();
        Results {
            commit,
            profile: machine::profile(),
            regime: regime.as_str(),
            host_runtime,
            machine,
            others_cpu_percent: (others * 10.0).round() / 10.0,
            passed: report.passed(),
            outcome: report.outcome.to_string(),
            budget: budget(report.budget),
            warmup: cfg.warmup,
            calls_per_round: cfg.calls_per_round,
            methods,
        }
    }
}

fn write_json(path: &Path, results: &Results) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut text = serde_json::to_string_pretty(results)?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
