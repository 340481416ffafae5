//! Ingress under load: acknowledgements per second and their latency through the management
//! socket, the time from an acknowledgement to the routing decision, the writer's wait and
//! hold, and whether list reads wait behind pushes (`make bench-ingress`; the figures and
//! what they mean are in docs/perf-log and docs/performance.md).
//!
//! ```text
//! bench-ingress [--seconds 5] [--rate 2000] [--fixed-seconds 10] [--conduit PATH] [--json PATH]
//! ```
//!
//! Run with `make bench-ingress` (release). One run, in this order:
//!
//! 1. **The floor**: the same clients against a server that only answers (`201` and an id, on
//!    axum over hyper with two workers, as the daemon), so every figure is also a ratio. (A
//!    floor for the disk is not printed: an fsync here costs 0.2 ms in the daemon's stream of
//!    commits and 4 ms in a tight loop of them, so no loop of our own stands for it; the
//!    daemon's own commits are in its `writer_hold`.)
//! 2. **Closed loop** on a release daemon with `notes` installed, on a fresh state directory:
//!    1, 8 and 64 clients, each its own keep-alive connection to the management socket, each
//!    pushing `POST /v1/events` back to back and waiting for every acknowledgement (1 s warm-up,
//!    then `--seconds` measured): acknowledgements per second, p50 and p99, the daemon's and
//!    `notes`'s CPU per event, and how long routing took to catch up after each run.
//! 3. **Reads**: `GET /v1/events?limit=50` paced at `--list-rate` per second on a connection of
//!    its own, idle and then beside 8 pushing clients: p50 and p99 of each.
//! 4. **Fixed rate**, on a second fresh daemon: `--rate` events per second offered (open
//!    loop over `--fixed-conns` connections, each event timed from when it was due, so a slow
//!    acknowledgement delays nothing and is not hidden), 1 s warm-up then `--fixed-seconds`:
//!    acknowledgement p50/p99; once routing has caught up, acknowledgement-to-routing p50/p99
//!    and the writer's wait and hold p99 from the daemon's `/v1/metrics`
//!    (`conduit_latency_quantile_seconds`). A daemon that does not export them (a build from
//!    before) gets acknowledgement-to-routing from its events' `routed_at_ms - accepted_at_ms`
//!    (whole milliseconds) and `null` for the writer.
//!
//! `--conduit PATH` measures another build of the daemon (its `conduit-notes` beside it), so a
//! figure before a change and after it come from the same benchmark. Writes
//! `target/bench-ingress/results.json` (keys: `bench_ingress`'s library, `ingress.rs`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::Parser;
use conduit_bench::daemon::Daemon;
use conduit_bench::ingress::{
    CLIENTS, Closed, Conn, Fixed, Floor, Reads, Results, check_shape, conduit_and_notes, metric,
    notes_state, pace, percentile, push_body, quantile_ms, ready_pid, run_local,
};
use conduit_bench::machine::{self, Machine};
use conduit_bench::measure::{new_histogram, proc_cpu_ticks, record};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::time::sleep_until;

/// Ingress throughput and latency through the management socket, beside this machine's floor.
#[derive(Debug, Parser)]
#[command(name = "bench-ingress")]
struct Args {
    /// Seconds each closed-loop run is measured (after a 1 s warm-up).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Events per second offered in the fixed-rate run.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// Seconds the fixed-rate run is measured (after a 1 s warm-up at the same rate).
    #[arg(long, default_value_t = 10.0)]
    fixed_seconds: f64,
    /// Connections the fixed-rate run spreads its events over.
    #[arg(long, default_value_t = 64)]
    fixed_conns: usize,
    /// List requests per second in the reads run.
    #[arg(long, default_value_t = 100.0)]
    list_rate: f64,
    /// Seconds each reads run lasts (idle, then beside 8 pushers).
    #[arg(long, default_value_t = 5.0)]
    reads_seconds: f64,
    /// Seconds of warm-up before each measured window.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// The `conduit` binary to measure, with `conduit-notes` beside it (default: the ones
    /// next to this executable).
    #[arg(long)]
    conduit: Option<PathBuf>,
    /// Where the JSON results go.
    #[arg(long, default_value = "target/bench-ingress/results.json")]
    json: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    run_local("bench-ingress", run(&args))
}

/// The whole run; `true`: it has no bound of its own to miss (the figures are judged from the
/// results file).
async fn run(args: &Args) -> anyhow::Result<bool> {
    ensure!(
        args.seconds > 0.0 && args.fixed_seconds > 0.0 && args.rate > 0.0,
        "durations and the rate must be positive"
    );
    let (conduit, notes) = conduit_and_notes(args.conduit.as_deref(), "bench-ingress")?;
    let machine = Machine::this();
    println!(
        "bench-ingress: commit {}, {} build of this benchmark, daemon {}; {} CPUs, {}; load {}",
        machine::commit(),
        machine::profile(),
        conduit.display(),
        machine.cpus,
        machine.cpu_model,
        machine.loadavg,
    );
    let root = tempfile::Builder::new()
        .prefix("bench-ingress-")
        .tempdir()
        .context("a temporary folder")?;
    let warmup = Duration::from_secs_f64(args.warmup);
    let window = Duration::from_secs_f64(args.seconds);

    // 1. The floor: the same clients against a server that only answers.
    let floor = Floor::start(root.path())?;
    let mut floors = Vec::new();
    for n in CLIENTS {
        let (c, _) = closed_loop(&floor.socket, n, "floor", warmup, window, None).await?;
        println!(
            "floor {n:>2} client{}: {:>8.0} answers/s, p50 {:.3} ms, p99 {:.3} ms",
            if n == 1 { " " } else { "s" },
            c.events_per_s,
            c.ack_p50_ms,
            c.ack_p99_ms
        );
        floors.push((n, c));
    }
    drop(floor);

    // 2. Closed loop on a fresh daemon.
    let d = start(root.path(), "closed", &conduit, &notes).await?;
    let sock = d.socket.clone();
    let mut runs = Vec::new();
    let mut extra_runs = serde_json::Map::new();
    for (n, floor) in CLIENTS.iter().zip(&floors) {
        let pids = Some((d.daemon.pid(), d.notes_pid));
        let (c, cpu) = closed_loop(&sock, *n, "closed", warmup, window, pids).await?;
        let caught_up = drained(&d.daemon).await?;
        println!(
            "daemon {n:>2} client{}: {:>7.0} acks/s ({:.2}× the floor), p50 {:.3} ms ({:.1}× floor), p99 {:.3} ms; CPU per event: daemon {:.0} µs, notes {:.0} µs; routed all {:.2} s after the run",
            if *n == 1 { " " } else { "s" },
            c.events_per_s,
            c.events_per_s / floor.1.events_per_s,
            c.ack_p50_ms,
            c.ack_p50_ms / floor.1.ack_p50_ms,
            c.ack_p99_ms,
            cpu.daemon_us,
            cpu.notes_us,
            caught_up.as_secs_f64(),
        );
        extra_runs.insert(
            n.to_string(),
            json!({
                "floor_ratio": c.events_per_s / floor.1.events_per_s,
                "daemon_cpu_us_per_event": cpu.daemon_us,
                "notes_cpu_us_per_event": cpu.notes_us,
                "routed_all_s_after": caught_up.as_secs_f64(),
            }),
        );
        runs.push((*n, c));
    }
    let one = runs[0].1.events_per_s;
    let eight = runs[1].1.events_per_s;
    println!("8 clients / 1 client: {:.2}×", eight / one);

    // 3. Reads, idle and beside 8 pushers.
    let list_rate = args.list_rate;
    let reads_window = Duration::from_secs_f64(args.reads_seconds);
    let idle = list_latency(&sock, list_rate, reads_window).await?;
    let stop = Rc::new(AtomicBool::new(false));
    let pushers = {
        let (sock, stop) = (sock.clone(), stop.clone());
        tokio::task::spawn_local(async move { push_until(&sock, 8, "reads", &stop).await })
    };
    tokio::time::sleep(warmup).await;
    let pushing = list_latency(&sock, list_rate, reads_window).await;
    stop.store(true, Ordering::Relaxed);
    let pushed = pushers.await.context("the pushers")??;
    let pushing = pushing?;
    println!(
        "list (GET /v1/events?limit=50, {list_rate}/s): idle p50 {:.3} ms p99 {:.3} ms; beside 8 pushing clients ({:.0} acks/s) p50 {:.3} ms p99 {:.3} ms: {:.2}× idle",
        idle.0,
        idle.1,
        pushed as f64 / (warmup + reads_window).as_secs_f64(),
        pushing.0,
        pushing.1,
        pushing.1 / idle.1
    );
    drained(&d.daemon).await?;
    d.daemon.stop()?;

    // 4. Fixed rate on a second fresh daemon, so its histograms hold this run alone.
    let d = start(root.path(), "fixed", &conduit, &notes).await?;
    let fixed = fixed_rate(args, &d.socket, warmup).await?;
    let caught_up = drained(&d.daemon).await?;
    let text = metrics(&d.daemon).await?;
    let (a2r_p50, a2r_p99, a2r_source) = match (
        quantile_ms(&text, "ack_to_route", "0.5"),
        quantile_ms(&text, "ack_to_route", "0.99"),
    ) {
        (Some(p50), Some(p99)) => (p50, p99, "metrics"),
        _ => {
            let mut waits = routed_minus_accepted(&d.daemon, "bench-fixed").await?;
            waits.sort_by(f64::total_cmp);
            (
                percentile(&waits, 0.5),
                percentile(&waits, 0.99),
                "events (whole ms)",
            )
        }
    };
    let q = |m, p| quantile_ms(&text, m, p);
    let f = Fixed {
        offered_per_s: args.rate,
        ack_p99_ms: fixed.p99_ms,
        ack_to_route_p50_ms: Some(a2r_p50),
        ack_to_route_p99_ms: Some(a2r_p99),
        writer_wait_p99_ms: q("writer_wait", "0.99"),
        writer_hold_p99_ms: q("writer_hold", "0.99"),
    };
    let commits = metric(&text, "conduit_ingress_commits_total");
    let passes = metric(&text, "conduit_host_loop_passes_total");
    let pass_s = metric(&text, "conduit_host_loop_pass_seconds_total");
    let new = metric(&text, "conduit_ingress_events_total{outcome=\"new\"}");
    let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
    println!(
        "fixed {:.0}/s offered for {} s: {:.0} acks/s; ack p50 {:.3} ms p99 {:.3} ms max {:.3} ms; ack-to-route p50 {:.3} ms p99 {:.3} ms (from {a2r_source}); writer wait p99 {} ms max {} ms, hold p99 {} ms max {} ms; {} events in {} commits; {} host-loop passes, {} s in them; routed all {:.2} s after",
        args.rate,
        args.fixed_seconds,
        fixed.achieved_per_s,
        fixed.p50_ms,
        fixed.p99_ms,
        fixed.max_ms,
        a2r_p50,
        a2r_p99,
        opt(f.writer_wait_p99_ms),
        opt(q("writer_wait", "1")),
        opt(f.writer_hold_p99_ms),
        opt(q("writer_hold", "1")),
        opt(new),
        opt(commits),
        opt(passes),
        opt(pass_s),
        caught_up.as_secs_f64(),
    );
    d.daemon.stop()?;

    let results = Results {
        clients: runs,
        fixed_rate: f,
        reads: Reads {
            list_p99_ms_idle: idle.1,
            list_p99_ms_pushing: pushing.1,
        },
    };
    let mut extra = serde_json::Map::new();
    extra.insert("commit".into(), json!(machine::commit()));
    extra.insert("profile".into(), json!(machine::profile()));
    extra.insert("machine".into(), json!(machine));
    extra.insert("conduit".into(), json!(conduit.display().to_string()));
    extra.insert(
        "floor".into(),
        Value::Object(
            floors
                .iter()
                .map(|(n, c)| (n.to_string(), json!(c)))
                .collect(),
        ),
    );
    extra.insert("clients_extra".into(), Value::Object(extra_runs));
    extra.insert("eight_over_one".into(), json!(eight / one));
    extra.insert(
        "fixed_rate_extra".into(),
        json!({
            "seconds": args.fixed_seconds,
            "achieved_per_s": fixed.achieved_per_s,
            "ack_p50_ms": fixed.p50_ms,
            "ack_to_route_source": a2r_source,
            "ack_max_ms": fixed.max_ms,
            "writer_wait_p50_ms": q("writer_wait", "0.5"),
            "writer_hold_p50_ms": q("writer_hold", "0.5"),
            "writer_wait_max_ms": q("writer_wait", "1"),
            "writer_hold_max_ms": q("writer_hold", "1"),
            "ack_to_route_max_ms": q("ack_to_route", "1"),
            "events": new,
            "commits": commits,
            "host_loop_passes": passes,
            "host_loop_pass_s": pass_s,
        }),
    );
    extra.insert(
        "reads_extra".into(),
        json!({
            "list_rate_per_s": list_rate,
            "list_p50_ms_idle": idle.0,
            "list_p50_ms_pushing": pushing.0,
            "pushing_acks_per_s": pushed as f64 / (warmup + reads_window).as_secs_f64(),
        }),
    );
    let json = results.to_json(extra);
    check_shape(&json).map_err(anyhow::Error::msg)?;
    machine::write_results(&args.json, &json)?;
    println!("results written to {}", args.json.display());
    Ok(true)
}

/// A daemon on a fresh state directory with `notes` installed and ready.
struct Started {
    daemon: Daemon,
    socket: PathBuf,
    notes_pid: Option<u32>,
}

async fn start(root: &Path, label: &str, conduit: &Path, notes: &Path) -> anyhow::Result<Started> {
    let state = notes_state(root, label, notes)?;
    let daemon = Daemon::start(conduit, &state, Duration::from_secs(60)).await?;
    let notes_pid = ready_pid(&daemon, "notes", Duration::from_secs(60)).await?;
    Ok(Started {
        socket: state.join("run").join("conduit.sock"),
        daemon,
        notes_pid,
    })
}

/// CPU per event over a measured window, in microseconds.
#[derive(Clone, Copy, Debug, Default)]
struct Cpu {
    daemon_us: f64,
    notes_us: f64,
}

/// `n` clients pushing back to back for `warmup` + `window`; the acknowledgements of requests
/// sent within `window` are counted and timed. With `pids` (the daemon's, notes's), the CPU
/// they spent over the window per event.
async fn closed_loop(
    socket: &Path,
    n: usize,
    phase: &str,
    warmup: Duration,
    window: Duration,
    pids: Option<(u32, Option<u32>)>,
) -> anyhow::Result<(Closed, Cpu)> {
    let from = Instant::now() + warmup;
    let until = from + window;
    let mut tasks = Vec::new();
    for c in 0..n {
        let (socket, phase) = (socket.to_owned(), format!("{phase}{n}"));
        tasks.push(tokio::task::spawn_local(async move {
            let mut conn = Conn::connect(&socket).await?;
            let (mut h, mut count, mut i) = (new_histogram(), 0u64, 0u64);
            loop {
                let t = Instant::now();
                if t >= until {
                    break;
                }
                let body = push_body(&phase, c, i);
                let (status, _) = conn.request("POST", "/v1/events", &body).await?;
                ensure!(status == 201, "a push was answered {status}");
                if t >= from {
                    record(&mut h, t.elapsed());
                    count += 1;
                }
                i += 1;
            }
            anyhow::Ok((h, count))
        }));
    }
    let ticks = |pid: Option<u32>| pid.and_then(|p| proc_cpu_ticks(p).ok()).unwrap_or(0);
    let (daemon, notes) = pids.map_or((None, None), |(d, n)| (Some(d), n));
    sleep_until(from.into()).await;
    let before = (ticks(daemon), ticks(notes));
    sleep_until(until.into()).await;
    let after = (ticks(daemon), ticks(notes));
    let mut all: Histogram<u64> = new_histogram();
    let mut count = 0;
    for t in tasks {
        let (h, c) = t.await.context("a client")??;
        all.add(&h).context("merging histograms")?;
        count += c;
    }
    let ms = |q| all.value_at_quantile(q) as f64 / 1e6;
    let per_event = |ticks: u64| {
        // Clock ticks are 10 ms (`getconf CLK_TCK` = 100).
        ticks as f64 * 10_000.0 / count.max(1) as f64
    };
    Ok((
        Closed {
            events_per_s: count as f64 / window.as_secs_f64(),
            ack_p50_ms: ms(0.5),
            ack_p99_ms: ms(0.99),
        },
        Cpu {
            daemon_us: per_event(after.0.saturating_sub(before.0)),
            notes_us: per_event(after.1.saturating_sub(before.1)),
        },
    ))
}

/// `n` clients pushing back to back until `stop`; how many were acknowledged.
async fn push_until(
    socket: &Path,
    n: usize,
    phase: &str,
    stop: &Rc<AtomicBool>,
) -> anyhow::Result<u64> {
    let mut tasks = Vec::new();
    for c in 0..n {
        let (socket, phase, stop) = (socket.to_owned(), phase.to_owned(), stop.clone());
        tasks.push(tokio::task::spawn_local(async move {
            let mut conn = Conn::connect(&socket).await?;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (status, _) = conn
                    .request("POST", "/v1/events", &push_body(&phase, c, i))
                    .await?;
                ensure!(status == 201, "a push was answered {status}");
                i += 1;
            }
            anyhow::Ok(i)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.context("a pusher")??;
    }
    Ok(total)
}

/// `GET /v1/events?limit=50` at `per_s` for `window`: p50 and p99 in milliseconds.
async fn list_latency(socket: &Path, per_s: f64, window: Duration) -> anyhow::Result<(f64, f64)> {
    let mut conn = Conn::connect(socket).await?;
    let mut h = new_histogram();
    let t0 = Instant::now();
    let step = pace(per_s).context("a list rate above 0")?;
    let mut due = t0;
    while due < t0 + window {
        sleep_until(due.into()).await;
        let t = Instant::now();
        let (status, body) = conn.request("GET", "/v1/events?limit=50", b"").await?;
        ensure!(status == 200, "a list was answered {status}");
        ensure!(!body.is_empty(), "a list without a body");
        record(&mut h, t.elapsed());
        due += step;
    }
    Ok((
        h.value_at_quantile(0.5) as f64 / 1e6,
        h.value_at_quantile(0.99) as f64 / 1e6,
    ))
}

/// The fixed-rate run's own figures (the daemon's are read from its metrics).
struct FixedRun {
    achieved_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

/// `args.rate` events per second, event `i` due at `i / rate` and sent on connection
/// `i mod fixed_conns`, timed from when it was due.
async fn fixed_rate(args: &Args, socket: &Path, warmup: Duration) -> anyhow::Result<FixedRun> {
    let k = args.fixed_conns.max(1);
    let t0 = Instant::now() + Duration::from_millis(50);
    let from = t0 + warmup;
    let total = ((warmup.as_secs_f64() + args.fixed_seconds) * args.rate) as u64;
    let step = Duration::from_secs_f64(1.0 / args.rate);
    let mut tasks = Vec::new();
    for c in 0..k {
        let socket = socket.to_owned();
        tasks.push(tokio::task::spawn_local(async move {
            let mut conn = Conn::connect(&socket).await?;
            let (mut h, mut count) = (new_histogram(), 0u64);
            let mut i = c as u64;
            while i < total {
                let due = t0 + step * (i as u32);
                sleep_until(due.into()).await;
                let (status, _) = conn
                    .request("POST", "/v1/events", &push_body("fixed", c, i))
                    .await?;
                ensure!(status == 201, "a push was answered {status}");
                if due >= from {
                    record(&mut h, due.elapsed());
                    count += 1;
                }
                i += k as u64;
            }
            anyhow::Ok((h, count))
        }));
    }
    let mut all: Histogram<u64> = new_histogram();
    let mut count = 0;
    for t in tasks {
        let (h, c) = t.await.context("a fixed-rate client")??;
        all.add(&h).context("merging histograms")?;
        count += c;
    }
    let took = from.elapsed().as_secs_f64();
    Ok(FixedRun {
        achieved_per_s: count as f64 / took.max(args.fixed_seconds),
        p50_ms: all.value_at_quantile(0.5) as f64 / 1e6,
        p99_ms: all.value_at_quantile(0.99) as f64 / 1e6,
        max_ms: all.max() as f64 / 1e6,
    })
}

async fn metrics(d: &Daemon) -> anyhow::Result<String> {
    d.client.get_text("/v1/metrics").await
}

/// Wait until the daemon has routed every event (`conduit_events_unrouted` is 0); how long
/// that took. Gives up after 5 minutes.
async fn drained(d: &Daemon) -> anyhow::Result<Duration> {
    let t = Instant::now();
    loop {
        let text = metrics(d).await?;
        if metric(&text, "conduit_events_unrouted") == Some(0.0) {
            return Ok(t.elapsed());
        }
        ensure!(
            t.elapsed() < Duration::from_secs(300),
            "events were still unrouted 5 minutes after the run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `routed_at_ms - accepted_at_ms` of every event of `source`, in milliseconds.
async fn routed_minus_accepted(d: &Daemon, source: &str) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::new();
    let mut after = 0i64;
    loop {
        let page = d
            .client
            .get(&format!(
                "/v1/events?source={source}&after={after}&limit=200"
            ))
            .await?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        let Some(last) = events.last() else {
            return Ok(out);
        };
        after = last["id"].as_i64().context("an event id")?;
        for e in &events {
            if let (Some(r), Some(a)) = (e["routed_at_ms"].as_i64(), e["accepted_at_ms"].as_i64()) {
                out.push((r - a) as f64);
            }
        }
    }
}
