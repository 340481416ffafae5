//! From rounds to results: each figure's median and spread over the rounds, its ratio to the
//! floor measured beside it, the performance targets, the printed table and the JSON.
//!
//! The JSON's `floors` and `transports` objects hold medians only, under fixed keys that
//! scripts and `docs/performance.md` read; `spread` holds every figure's min, max and rounds.

use std::fmt::Write as _;

use conduit_bench::measure::Spread;
use conduit_bench::ordered::Ordered;
use serde::Serialize;

use crate::transport::Figures;

/// Which regime a result is for; the idle regime's echo targets are tighter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Regime {
    Idle,
    Awake,
}

impl Regime {
    pub(crate) fn key(self) -> &'static str {
        match self {
            Regime::Idle => "idle",
            Regime::Awake => "awake",
        }
    }
}

/// How busy the machine was while a regime ran.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Conditions {
    pub(crate) spinners: usize,
    pub(crate) placement: &'static str,
    pub(crate) loadavg_before: String,
    /// Non-nice CPU the rest of the machine used meanwhile, in % of one CPU (10 ms ticks).
    pub(crate) others_cpu_pct: f64,
    pub(crate) wall_s: f64,
}

/// One performance target, judged.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Target {
    pub(crate) transport: String,
    pub(crate) target: String,
    pub(crate) value: f64,
    pub(crate) limit: f64,
    pub(crate) met: bool,
    /// Whether the target applies in this regime and placement; one that does not is printed
    /// and tracked (`met` still says where it stands) but is no miss.
    pub(crate) gated: bool,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct SpreadSection {
    pub(crate) floors: Ordered<Spread>,
    pub(crate) transports: Ordered<Ordered<Spread>>,
}

/// One regime's results, as written to JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RegimeResult {
    /// Median over the rounds of each floor.
    pub(crate) floors: Ordered<f64>,
    /// Transport → figure → median over the rounds.
    pub(crate) transports: Ordered<Ordered<f64>>,
    /// Transport → figure → median over its floor's median.
    pub(crate) ratios: Ordered<Ordered<f64>>,
    pub(crate) targets: Vec<Target>,
    /// Whether JSON-RPC beat gRPC, figure by figure.
    pub(crate) jsonrpc_beats_grpc: Ordered<bool>,
    pub(crate) spread: SpreadSection,
    pub(crate) conditions: Conditions,
    /// The artifact through a real daemon into its store, in this regime and placement
    /// (absent without `conduit` beside the executable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) through_daemon: Option<Figures>,
}

/// Median and spread of each key over `rounds` (keys in the first round's order).
fn spreads(rounds: &[Figures]) -> Ordered<Spread> {
    let mut out = Ordered::default();
    let Some(first) = rounds.first() else {
        return out;
    };
    for (key, _) in &first.0 {
        let runs = rounds.iter().filter_map(|r| r.get(key).copied()).collect();
        out.push(key.clone(), Spread::of(runs));
    }
    out
}

fn medians(s: &Ordered<Spread>) -> Ordered<f64> {
    Ordered(s.0.iter().map(|(k, v)| (k.clone(), v.median)).collect())
}

/// A row of the table: a transport figure, the floor it is set beside, its CPU figure.
struct Row {
    label: &'static str,
    unit: &'static str,
    key: &'static str,
    floor: Floor,
    cpu: Option<&'static str>,
    floor_cpu: Option<&'static str>,
    /// Throughputs: more is better, and the ratio is a share of the floor.
    higher_is_better: bool,
}

enum Floor {
    Key(&'static str),
    /// SIGKILL → EOF, then a bare spawn: what a restart cannot go below.
    KillThenSpawn,
    None,
}

const ROWS: &[Row] = &[
    Row {
        label: "cold start (spawn → handshake done)",
        unit: "µs",
        key: "cold_start_us",
        floor: Floor::Key("spawn_us"),
        cpu: Some("cold_start_cpu_us"),
        floor_cpu: Some("spawn_cpu_us"),
        higher_is_better: false,
    },
    Row {
        label: "warm restart (SIGKILL → ready again)",
        unit: "µs",
        key: "warm_restart_us",
        floor: Floor::KillThenSpawn,
        cpu: Some("warm_restart_cpu_us"),
        floor_cpu: None,
        higher_is_better: false,
    },
    Row {
        label: "version-mismatch refusal",
        unit: "µs",
        key: "version_refusal_us",
        floor: Floor::Key("spawn_us"),
        cpu: Some("version_refusal_cpu_us"),
        floor_cpu: Some("spawn_cpu_us"),
        higher_is_better: false,
    },
    Row {
        label: "echo p50 (64-byte text)",
        unit: "µs",
        key: "echo_p50_us",
        floor: Floor::Key("pipe_rtt_p50_us"),
        cpu: Some("echo_cpu_us"),
        floor_cpu: Some("pipe_cpu_us"),
        higher_is_better: false,
    },
    Row {
        label: "echo p99",
        unit: "µs",
        key: "echo_p99_us",
        floor: Floor::Key("pipe_rtt_p99_us"),
        cpu: None,
        floor_cpu: None,
        higher_is_better: false,
    },
    Row {
        label: "host callback p50",
        unit: "µs",
        key: "callback_p50_us",
        floor: Floor::Key("pipe_rtt_p50_us"),
        cpu: Some("callback_cpu_us"),
        floor_cpu: Some("pipe_cpu_us"),
        higher_is_better: false,
    },
    Row {
        label: "pipelined echo, 64 in flight",
        unit: "calls/s",
        key: "pipelined_calls_s",
        floor: Floor::Key("pipe_msgs_s"),
        cpu: Some("pipelined_cpu_us"),
        floor_cpu: Some("pipe_msgs_cpu_us"),
        higher_is_better: true,
    },
    Row {
        label: "artifact 16 MiB in 64 KiB writes (JSON-RPC: bulk pipe)",
        unit: "MiB/s",
        key: "artifact_mib_s",
        floor: Floor::Key("pipe_mib_s"),
        cpu: Some("artifact_cpu_us_per_mib"),
        floor_cpu: Some("pipe_cpu_us_per_mib"),
        higher_is_better: true,
    },
    Row {
        label: "artifact 16 MiB, JSON-RPC as base64 chunks",
        unit: "MiB/s",
        key: "artifact_json_mib_s",
        floor: Floor::Key("pipe_mib_s"),
        cpu: Some("artifact_json_cpu_us_per_mib"),
        floor_cpu: Some("pipe_cpu_us_per_mib"),
        higher_is_better: true,
    },
    Row {
        label: "cancellation seen by the extension",
        unit: "µs",
        key: "cancel_seen_us",
        floor: Floor::Key("pipe_rtt_p50_us"),
        cpu: Some("cancel_cpu_us"),
        floor_cpu: None,
        higher_is_better: false,
    },
    Row {
        label: "crash: the child's own SIGKILL → EOF",
        unit: "µs",
        key: "child_kill_to_eof_us",
        floor: Floor::Key("kill_to_eof_us"),
        cpu: None,
        floor_cpu: None,
        higher_is_better: false,
    },
    Row {
        label: "crash detected (SIGKILL → call fails)",
        unit: "µs",
        key: "crash_detected_us",
        floor: Floor::Key("kill_to_eof_us"),
        cpu: Some("crash_cpu_us"),
        floor_cpu: None,
        higher_is_better: false,
    },
    Row {
        label: "crash: what the host adds to that EOF",
        unit: "µs",
        key: "crash_host_added_us",
        floor: Floor::None,
        cpu: None,
        floor_cpu: None,
        higher_is_better: false,
    },
    Row {
        label: "release binary size",
        unit: "bytes",
        key: "binary_bytes",
        floor: Floor::None,
        cpu: None,
        floor_cpu: None,
        higher_is_better: false,
    },
];

fn floor_of(row: &Row, floors: &Ordered<f64>) -> Option<f64> {
    match row.floor {
        Floor::Key(k) => floors.get(k).copied(),
        Floor::KillThenSpawn => Some(floors.get("kill_to_eof_us")? + floors.get("spawn_us")?),
        Floor::None => None,
    }
}

/// The floor that holds SIGKILL → EOF of a transport's own child, measured in the same round.
fn child_exit_floor(transport: &str) -> Option<&'static str> {
    match transport {
        "jsonrpc-stdio" => Some("kill_to_eof_jsonrpc_child_us"),
        "grpc-uds" => Some("kill_to_eof_grpc_child_us"),
        _ => None,
    }
}

/// Each round's crash figures set beside its transport's own child's exit in the same round:
/// that exit (`child_kill_to_eof_us`) and what the host adds to it before the pending call
/// fails (`crash_host_added_us`: the round's median crash minus the round's median exit).
fn with_crash_addition(key: &str, rounds: &[Figures], floors: &[Figures]) -> Vec<Figures> {
    let Some(exit_key) = child_exit_floor(key) else {
        return rounds.to_vec();
    };
    rounds
        .iter()
        .zip(floors)
        .map(|(r, fl)| {
            let mut r = r.clone();
            if let (Some(&crash), Some(&exit)) = (r.get("crash_detected_us"), fl.get(exit_key)) {
                r.push("child_kill_to_eof_us", exit);
                r.push("crash_host_added_us", crash - exit);
            }
            r
        })
        .collect()
}

/// Median, spread, ratios and targets of one regime in one placement (`same-cpu`,
/// `split-cpus`, `free`), with the artifact through the daemon measured beside it.
pub(crate) fn summarise(
    regime: Regime,
    placement: &str,
    floors: &[Figures],
    transports: &Ordered<Vec<Figures>>,
    binaries: &Ordered<u64>,
    conditions: Conditions,
    through_daemon: Option<Figures>,
) -> RegimeResult {
    let floor_spread = spreads(floors);
    let floor_med = medians(&floor_spread);
    let mut t_spread = Ordered::default();
    let mut t_med = Ordered::default();
    let mut ratios = Ordered::default();
    for (key, rounds) in &transports.0 {
        let s = spreads(&with_crash_addition(key, rounds, floors));
        let mut m = medians(&s);
        if let Some(&b) = binaries.get(key) {
            m.push("binary_bytes", b as f64);
        }
        let mut r = Ordered::default();
        for row in ROWS {
            if let (Some(v), Some(fl)) = (m.get(row.key), floor_of(row, &floor_med)) {
                r.push(row.key, v / fl);
            }
        }
        ratios.push(key.clone(), r);
        t_spread.push(key.clone(), s);
        t_med.push(key.clone(), m);
    }
    let mut targets = judge(regime, placement, &floor_med, &t_med);
    if let (Some(d), Some(host)) = (&through_daemon, t_med.get("jsonrpc-stdio")) {
        targets.extend(judge_daemon(d, host));
    }
    let mut beats = Ordered::default();
    if let (Some(j), Some(g)) = (t_med.get("jsonrpc-stdio"), t_med.get("grpc-uds")) {
        for row in ROWS {
            if let (Some(a), Some(b)) = (j.get(row.key), g.get(row.key)) {
                let better = if row.higher_is_better { a > b } else { a < b };
                beats.push(row.key, better);
            }
        }
    }
    RegimeResult {
        floors: floor_med,
        transports: t_med,
        ratios,
        targets,
        jsonrpc_beats_grpc: beats,
        spread: SpreadSection {
            floors: floor_spread,
            transports: t_spread,
        },
        conditions,
        through_daemon,
    }
}

/// The performance targets (docs/performance.md, SPEC §12), for every transport (they are
/// JSON-RPC's; gRPC's are for comparison). Some apply only in some placements and are printed,
/// not gated, elsewhere: pipelined calls on one CPU only; cold start on one CPU and unpinned
/// (across two CPUs the VM's scheduler tick decides it); and every ratio of the `free`
/// placement but the lifecycle's, whose floor and figure may have been placed differently.
fn judge(
    regime: Regime,
    placement: &str,
    floors: &Ordered<f64>,
    transports: &Ordered<Ordered<f64>>,
) -> Vec<Target> {
    let fl = |k: &str| floors.get(k).copied().unwrap_or(f64::NAN);
    let (p50_limit, p99_limit) = match regime {
        Regime::Awake => (2.0, 3.0),
        Regime::Idle => (1.5, 1.5),
    };
    let pinned = placement != "free";
    let one_cpu = placement == "same-cpu";
    let grpc = transports.get("grpc-uds");
    let mut out = Vec::new();
    for (t, m) in &transports.0 {
        let v = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
        let mut push = |target: String, value: f64, limit: f64, at_most: bool, gated: bool| {
            out.push(Target {
                transport: t.clone(),
                target,
                value,
                limit,
                met: if at_most {
                    value <= limit
                } else {
                    value >= limit
                },
                gated,
            });
        };
        push(
            format!("echo p50 ≤ {p50_limit}× the pipe's p50"),
            v("echo_p50_us") / fl("pipe_rtt_p50_us"),
            p50_limit,
            true,
            pinned,
        );
        push(
            format!("echo p99 ≤ {p99_limit}× the pipe's p99"),
            v("echo_p99_us") / fl("pipe_rtt_p99_us"),
            p99_limit,
            true,
            pinned,
        );
        push(
            "CPU per echo ≤ 3× the pipe's round trip".into(),
            v("echo_cpu_us") / fl("pipe_cpu_us"),
            3.0,
            true,
            pinned,
        );
        push(
            "artifact ≥ 40% of the pipe's throughput".into(),
            v("artifact_mib_s") / fl("pipe_mib_s"),
            0.4,
            false,
            pinned,
        );
        if t != "grpc-uds"
            && let Some(g) = grpc
        {
            push(
                "artifact faster than gRPC's (ratio of MiB/s)".into(),
                v("artifact_mib_s") / g.get("artifact_mib_s").copied().unwrap_or(f64::NAN),
                1.0,
                false,
                true,
            );
        }
        push(
            "cold start ≤ the spawn floor + 1 ms (µs over the floor)".into(),
            v("cold_start_us") - fl("spawn_us"),
            1000.0,
            true,
            placement != "split-cpus",
        );
        push(
            "crash: the host adds ≤ 50 µs to the child's own EOF (µs)".into(),
            v("crash_host_added_us"),
            50.0,
            true,
            pinned,
        );
        push(
            "crash detected ≤ 1.5× the minimal child's SIGKILL → EOF".into(),
            v("crash_detected_us") / fl("kill_to_eof_us"),
            1.5,
            true,
            false,
        );
        push(
            "cancellation seen ≤ 2× its echo p50".into(),
            v("cancel_seen_us") / v("echo_p50_us"),
            2.0,
            true,
            pinned,
        );
        push(
            "pipelined ≥ 50% of the pipe's message rate".into(),
            v("pipelined_calls_s") / fl("pipe_msgs_s"),
            0.5,
            false,
            one_cpu,
        );
    }
    out
}

/// The artifact through the daemon against the bench's own JSON-RPC host (`host`: its medians)
/// in the same regime and placement: its rate, and the daemon's CPU per MiB against the host's.
fn judge_daemon(d: &Figures, host: &Ordered<f64>) -> Vec<Target> {
    let g = |m: &Ordered<f64>, k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    let rate = g(d, "daemon_artifact_mib_s") / g(host, "artifact_mib_s");
    let cpu =
        g(d, "daemon_artifact_daemon_cpu_us_per_mib") / g(host, "artifact_host_cpu_us_per_mib");
    vec![
        Target {
            transport: "daemon".into(),
            target: "artifact through the daemon ≥ 60% of the bench host's rate".into(),
            value: rate,
            limit: 0.6,
            met: rate >= 0.6,
            gated: true,
        },
        Target {
            transport: "daemon".into(),
            target: "daemon CPU per MiB ≤ 1.5× the bench host's".into(),
            value: cpu,
            limit: 1.5,
            met: cpu <= 1.5,
            gated: true,
        },
    ]
}

/// A number as a table shows it: thousands separated, fewer decimals as it grows.
pub(crate) fn num(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v.abs() >= 1000.0 {
        let s = format!("{:.0}", v.abs());
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        if v < 0.0 { format!("-{out}") } else { out }
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn with_spread(s: Option<&Spread>, median: Option<f64>) -> String {
    match (s, median) {
        (Some(s), _) if s.runs.len() > 1 => {
            format!("{} [{}–{}]", num(s.median), num(s.min), num(s.max))
        }
        (_, Some(m)) => num(m),
        _ => "-".into(),
    }
}

/// The side-by-side table of one regime.
pub(crate) fn table(regime: Regime, placement: &str, r: &RegimeResult) -> String {
    let mut t = String::new();
    let c = &r.conditions;
    let _ = writeln!(
        t,
        "\n{} regime, {placement} ({}; {}); median [min–max] over {} rounds; others used {:.0}% of a CPU",
        regime.key(),
        match c.spinners {
            0 => "no spinner".to_owned(),
            n => format!("{n} `nice -n 19` busy loops, one pinned to each CPU"),
        },
        c.placement,
        r.spread.floors.0.first().map_or(0, |(_, s)| s.runs.len()),
        c.others_cpu_pct,
    );
    let keys: Vec<&String> = r.transports.0.iter().map(|(k, _)| k).collect();
    let _ = write!(t, "{:<38} {:>8} {:>26}", "figure", "unit", "floor");
    for k in &keys {
        let _ = write!(t, " {:>28} {:>7} {:>9}", k, "×floor", "CPU µs");
    }
    let _ = writeln!(t);
    for row in ROWS {
        let floor = match row.floor {
            Floor::Key(k) => with_spread(r.spread.floors.get(k), r.floors.get(k).copied()),
            Floor::KillThenSpawn => floor_of(row, &r.floors).map_or("-".into(), num),
            Floor::None => "-".into(),
        };
        let floor = match row.floor_cpu.and_then(|k| r.floors.get(k)) {
            Some(cpu) => format!("{floor} ({})", num(*cpu)),
            None => floor,
        };
        let _ = write!(t, "{:<38} {:>8} {:>26}", row.label, row.unit, floor);
        for k in &keys {
            let m = r.transports.get(k);
            let s = r.spread.transports.get(k).and_then(|s| s.get(row.key));
            let v = with_spread(s, m.and_then(|m| m.get(row.key)).copied());
            let ratio = r
                .ratios
                .get(k)
                .and_then(|x| x.get(row.key))
                .map_or("-".into(), |x| format!("{x:.2}"));
            let cpu = row
                .cpu
                .and_then(|c| m.and_then(|m| m.get(c)))
                .map_or("-".into(), |x| num(*x));
            let _ = write!(t, " {v:>28} {ratio:>7} {cpu:>9}");
        }
        let _ = writeln!(t);
    }
    let _ = writeln!(
        t,
        "(floor CPU in parentheses; CPU µs is user+sys of both processes per operation — per \
         call, per MiB for the artifact, per start for the lifecycle rows)"
    );
    let fl = |k: &str| r.floors.get(k).map_or("-".into(), |v| num(*v));
    let _ = writeln!(
        t,
        "(beside the floors: the minimal spawn through fork, as the supervisor's spawn does it, \
         {} µs; SIGKILL → EOF of the extension children themselves: jsonrpc {} µs, grpc {} µs)",
        fl("spawn_fork_us"),
        fl("kill_to_eof_jsonrpc_child_us"),
        fl("kill_to_eof_grpc_child_us"),
    );
    if let Some(d) = &r.through_daemon {
        t.push_str(&daemon_table(d));
    }
    let _ = writeln!(t, "targets:");
    for g in &r.targets {
        let shown = if g.target.contains("(µs") {
            format!("{} µs", num(g.value))
        } else {
            format!("{:.2}", g.value)
        };
        let verdict = match (g.gated, g.met) {
            (true, true) => "met",
            (true, false) => "MISSED",
            (false, true) => "(met; not gated here)",
            (false, false) => "(missed; not gated here)",
        };
        let _ = writeln!(
            t,
            "  {:<14} {:<62} {:>12}  {verdict}",
            g.transport, g.target, shown,
        );
    }
    if c.others_cpu_pct > 25.0 {
        let _ = writeln!(
            t,
            "warning: other processes used {:.0}% of a CPU during this regime; these are not a \
             quiet machine's figures",
            c.others_cpu_pct
        );
    }
    t
}

/// The artifact through the daemon: MiB/s and CPU per MiB (daemon, extension) on both paths.
fn daemon_table(f: &Figures) -> String {
    let g = |k: &str| f.get(k).copied().unwrap_or(f64::NAN);
    let mut out = "the artifact through the daemon into its store (same placement):\n".to_owned();
    for (label, key) in [
        ("bulk pipe", "daemon_artifact"),
        ("base64 chunks", "daemon_artifact_json"),
    ] {
        out.push_str(&format!(
            "  {label:<14} {:>8.0} MiB/s   CPU µs per MiB: daemon {:>6.0}, extension {:>6.0}\n",
            g(&format!("{key}_mib_s")),
            g(&format!("{key}_daemon_cpu_us_per_mib")),
            g(&format!("{key}_child_cpu_us_per_mib")),
        ));
    }
    out
}
