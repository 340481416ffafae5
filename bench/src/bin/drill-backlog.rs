//! A daemon coming back to a large backlog (`make drill-backlog`): how long a release daemon
//! takes, started normally on a state directory holding N unrouted events across N/10 Work and
//! N/10 due timers, to make its first routing decision, to leave no event unrouted and to fire
//! every due timer; its peak RSS; and how fast pushes made during the drain are acknowledged.
//!
//! ```text
//! drill-backlog [--sizes 10000,20000] [--push-rate 200] [--conduit PATH] [--json PATH]
//! ```
//!
//! For each size N, on a fresh state directory with `notes` installed:
//!
//! 1. **The backlog, made by the daemon itself.** The daemon is started with its host loop
//!    behind the fault switch `CONDUIT_FAULT_STALL_HOST_LOOP` (a file that exists: the loop
//!    makes no pass, so no extension is asked to take anything). N `note.posted` events are
//!    pushed through the management socket (8 keep-alive clients, `POST /v1/events`, each
//!    acknowledged after its commit), over N/10 threads (so N/10 Work once routed), and N/10
//!    `digest` timers created (`POST /v1/timers`, `every 1h`, first due now). The daemon's
//!    metrics must show all N unrouted; then it is stopped with SIGTERM.
//! 2. **The normal start.** The same daemon binary on the same state directory, without the
//!    switch. From the moment it is spawned: a pusher offers `--push-rate` events per second
//!    (open loop over 4 keep-alive connections, each push timed from when it was due) until
//!    the backlog is routed and every timer has fired; then the daemon's peak RSS (`VmHWM`)
//!    is read.
//! 3. **The checks** (any failure ends the drill with exit status 1): every backlog event
//!    routed into a Work, exactly N/10 of them; every pushed event acknowledged and routed
//!    into a Work; every timer fired after the start and rescheduled past it.
//!
//! The figures come from the store's own stamps, read through the API afterwards:
//! `first_route_s` and `drained_s` are the earliest and latest `routed_at_ms` of the backlog
//! events, `timers_fired_s` the latest `last_fired_at_ms` of the timers, each less the wall
//! clock when the daemon was spawned. Writes `target/drill-backlog/results.json`: one object
//! per size (`"10000"`, `"20000"`) holding exactly `first_route_s`, `drained_s`,
//! `timers_fired_s`, `peak_rss_mib`, `push_ack_p99_ms`; everything else (counts, the ratios,
//! the machine) goes to `details.json` beside it.
//!
//! The bounds (docs/reliability.md): pushes during the drain acknowledged within 100 ms at
//! p99, and the drain linear: from the smallest size to the largest, `drained_s` grows at most
//! 1.1× the size ratio (2.2× from 10,000 to 20,000). A missed bound ends with exit status 2,
//! after the results are written.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::Parser;
use conduit_bench::daemon::Daemon;
use conduit_bench::ingress::{
    Conn, conduit_and_notes, metric, notes_state, pace, quantile_ms, ready_pid, run_local,
};
use conduit_bench::machine::{self, Machine};
use conduit_bench::measure::{new_histogram, proc_cpu_ticks, record};
use conduit_host::core::host_loop::STALL_FILE_VAR;
use conduit_supervisor::now_ms;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::time::sleep_until;

/// The source of the backlog's events, and of the pushes made during the drain.
const BACKLOG: &str = "drill-backlog";
const DRAIN: &str = "drill-drain";
/// Clients pushing the backlog, and connections the drain's pushes are spread over.
const BACKLOG_CLIENTS: u64 = 8;
const DRAIN_CONNS: u64 = 4;
/// The bounds the drill holds.
const PUSH_P99_MS: f64 = 100.0;
const LINEAR_SLACK: f64 = 1.1;
/// How long the drain may take before the drill gives up.
const GIVE_UP: Duration = Duration::from_secs(600);

/// A restart onto a large backlog: first routing, drain, due timers, RSS, pushes meanwhile.
#[derive(Debug, Parser)]
#[command(name = "drill-backlog")]
struct Args {
    /// Backlog sizes in events (each with a tenth as many Work and due timers).
    #[arg(long, value_delimiter = ',', default_value = "10000,20000")]
    sizes: Vec<u64>,
    /// Events per second pushed while the daemon drains the backlog.
    #[arg(long, default_value_t = 200.0)]
    push_rate: f64,
    /// The `conduit` binary to drill, with `conduit-notes` beside it (default: the ones next
    /// to this executable).
    #[arg(long)]
    conduit: Option<PathBuf>,
    /// Where the results go (`details.json` is written beside it).
    #[arg(long, default_value = "target/drill-backlog/results.json")]
    json: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    run_local("drill-backlog", run(&args))
}

/// One size's figures.
#[derive(Clone, Debug)]
struct Figures {
    events: u64,
    first_route_s: f64,
    drained_s: f64,
    timers_fired_s: f64,
    peak_rss_mib: f64,
    push_ack_p99_ms: f64,
    push_ack_p50_ms: f64,
    push_ack_max_ms: f64,
    pushed: u64,
    work: usize,
    backlog_made_s: f64,
    stopped_s: f64,
    passes: Option<f64>,
    /// The daemon's writer wait p99 and maximum, and hold maximum, over its drain (ms).
    writer: [Option<f64>; 3],
    /// CPU the daemon spent from its start until the backlog was routed, in seconds (clock
    /// ticks of 10 ms): less sensitive to a loaded machine than the drain's wall time.
    drain_cpu_s: f64,
}

async fn run(args: &Args) -> anyhow::Result<bool> {
    ensure!(
        !args.sizes.is_empty() && args.sizes.iter().all(|n| *n >= 10),
        "--sizes needs at least one size of 10 events or more"
    );
    ensure!(args.push_rate > 0.0, "--push-rate must be above 0");
    let (conduit, notes) = conduit_and_notes(args.conduit.as_deref(), "drill-backlog")?;
    let machine = Machine::this();
    println!(
        "drill-backlog: commit {}, daemon {}; {} CPUs, {}; load {}",
        machine::commit(),
        conduit.display(),
        machine.cpus,
        machine.cpu_model,
        machine.loadavg,
    );
    let root = tempfile::Builder::new()
        .prefix("drill-backlog-")
        .tempdir()
        .context("a temporary folder")?;
    let mut all = Vec::new();
    for &n in &args.sizes {
        let f = one_size(args, root.path(), &conduit, &notes, n).await?;
        println!(
            "{n:>6} events, {} Work, {} timers: first route {:.2} s, drained {:.2} s ({:.2} s of daemon CPU), timers fired {:.2} s after the start; peak RSS {:.1} MiB; {} pushes during the drain: ack p50 {:.2} ms p99 {:.2} ms max {:.2} ms; writer wait p99 {} ms max {} ms, hold max {} ms; backlog made in {:.1} s",
            f.work,
            n / 10,
            f.first_route_s,
            f.drained_s,
            f.drain_cpu_s,
            f.timers_fired_s,
            f.peak_rss_mib,
            f.pushed,
            f.push_ack_p50_ms,
            f.push_ack_p99_ms,
            f.push_ack_max_ms,
            opt(f.writer[0]),
            opt(f.writer[1]),
            opt(f.writer[2]),
            f.backlog_made_s,
        );
        all.push(f);
    }

    let mut ok = true;
    for f in &all {
        let held = f.push_ack_p99_ms <= PUSH_P99_MS;
        ok &= held;
        println!(
            "{}: pushes during the drain of {} acknowledged within {PUSH_P99_MS} ms at p99 ({:.2} ms)",
            verdict(held),
            f.events,
            f.push_ack_p99_ms
        );
    }
    let mut ratios = serde_json::Map::new();
    if let (Some(small), Some(large)) = (all.first(), all.last())
        && large.events > small.events
    {
        let size = large.events as f64 / small.events as f64;
        let bound = LINEAR_SLACK * size;
        let drain = large.drained_s / small.drained_s;
        let timers = large.timers_fired_s / small.timers_fired_s;
        let cpu = large.drain_cpu_s / small.drain_cpu_s;
        let held = drain <= bound;
        ok &= held;
        println!(
            "{}: drained {:.2} s at {} against {:.2} s at {}: {drain:.2}× for {size:.1}× the backlog (bound {bound:.2}×); daemon CPU to drain {cpu:.2}×; timers {timers:.2}×",
            verdict(held),
            large.drained_s,
            large.events,
            small.drained_s,
            small.events,
        );
        ratios.insert(
            "drained".into(),
            json!({ "ratio": drain, "bound": bound, "size_ratio": size }),
        );
        ratios.insert("drain_cpu".into(), json!(cpu));
        ratios.insert("timers_fired".into(), json!(timers));
    }

    let results: serde_json::Map<String, Value> = all
        .iter()
        .map(|f| {
            (
                f.events.to_string(),
                json!({
                    "first_route_s": f.first_route_s,
                    "drained_s": f.drained_s,
                    "timers_fired_s": f.timers_fired_s,
                    "peak_rss_mib": f.peak_rss_mib,
                    "push_ack_p99_ms": f.push_ack_p99_ms,
                }),
            )
        })
        .collect();
    machine::write_results(&args.json, &results)?;
    let details = json!({
        "commit": machine::commit(),
        "machine": machine,
        "conduit": conduit.display().to_string(),
        "push_rate_per_s": args.push_rate,
        "ratios": ratios,
        "passed": ok,
        "sizes": all.iter().map(|f| (f.events.to_string(), json!({
            "work": f.work,
            "timers": f.events / 10,
            "pushed_during_drain": f.pushed,
            "push_ack_p50_ms": f.push_ack_p50_ms,
            "push_ack_max_ms": f.push_ack_max_ms,
            "backlog_made_s": f.backlog_made_s,
            "stop_before_restart_s": f.stopped_s,
            "host_loop_passes": f.passes,
            "drain_cpu_s": f.drain_cpu_s,
            "writer_wait_p99_ms": f.writer[0],
            "writer_wait_max_ms": f.writer[1],
            "writer_hold_max_ms": f.writer[2],
        }))).collect::<serde_json::Map<_, _>>(),
    });
    let details_path = args.json.with_file_name("details.json");
    machine::write_results(&details_path, &details)?;
    println!(
        "results written to {} and {}",
        args.json.display(),
        details_path.display()
    );
    Ok(ok)
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

fn verdict(held: bool) -> &'static str {
    if held { "held" } else { "MISSED" }
}

async fn one_size(
    args: &Args,
    root: &Path,
    conduit: &Path,
    notes: &Path,
    n: u64,
) -> anyhow::Result<Figures> {
    let (work, timers) = (n / 10, n / 10);
    let state = notes_state(root, &format!("size-{n}"), notes)?;
    let socket = state.join("run").join("conduit.sock");

    // 1. The backlog, with the host loop behind its fault switch.
    let made = Instant::now();
    let stall = root.join(format!("stall-{n}"));
    std::fs::write(&stall, b"").context("the stall switch's file")?;
    let d = Daemon::start_with(
        conduit,
        &state,
        Duration::from_secs(60),
        &[(STALL_FILE_VAR, stall.as_os_str())],
    )
    .await?;
    ready_pid(&d, "notes", Duration::from_secs(60)).await?;
    let last_id = push_backlog(&socket, n, work).await?;
    create_timers(&socket, timers).await?;
    let text = d.client.get_text("/v1/metrics").await?;
    ensure!(
        metric(&text, "conduit_events_unrouted") == Some(n as f64),
        "the backlog should hold {n} unrouted events, the daemon counts {:?}",
        metric(&text, "conduit_events_unrouted")
    );
    let backlog_made_s = made.elapsed().as_secs_f64();
    let stopped = d.stop()?;

    // 2. The normal start, and pushes while it drains.
    let t0_ms = now_ms();
    let d = Daemon::start(conduit, &state, Duration::from_secs(60)).await?;
    let stop = Rc::new(AtomicBool::new(false));
    let pusher = {
        let (socket, stop, rate) = (socket.clone(), stop.clone(), args.push_rate);
        tokio::task::spawn_local(async move { push_at(&socket, rate, &stop).await })
    };
    let waited = wait_for_drain(&d, last_id, timers, t0_ms).await;
    let drain_ticks = waited.as_ref().map_or(0, |t| *t);
    stop.store(true, Ordering::Relaxed);
    let pushed = pusher.await.context("the pusher")?;
    waited?;
    let (hist, acked) = pushed?;
    let peak_rss_mib = peak_rss_kib(d.pid())? as f64 / 1024.0;
    // The drain's own pushes routed too, then the checks.
    let t = Instant::now();
    loop {
        let text = d.client.get_text("/v1/metrics").await?;
        if metric(&text, "conduit_events_unrouted") == Some(0.0) {
            break;
        }
        ensure!(t.elapsed() < GIVE_UP, "pushed events still unrouted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = d.client.get_text("/v1/metrics").await?;
    let passes = metric(&text, "conduit_host_loop_passes_total");
    let writer = [
        quantile_ms(&text, "writer_wait", "0.99"),
        quantile_ms(&text, "writer_wait", "1"),
        quantile_ms(&text, "writer_hold", "1"),
    ];
    let routes = checked_events(&d, n, work, acked).await?;
    let fired_ms = checked_timers(&d, timers, t0_ms).await?;
    d.stop()?;

    let s = |ms: i64| (ms - t0_ms) as f64 / 1000.0;
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1e6;
    Ok(Figures {
        events: n,
        first_route_s: s(routes.0),
        drained_s: s(routes.1),
        timers_fired_s: s(fired_ms),
        peak_rss_mib,
        push_ack_p99_ms: ms(0.99),
        push_ack_p50_ms: ms(0.5),
        push_ack_max_ms: hist.max() as f64 / 1e6,
        pushed: acked,
        work: work as usize,
        backlog_made_s,
        stopped_s: stopped.as_secs_f64(),
        passes,
        writer,
        drain_cpu_s: drain_ticks as f64 / 100.0,
    })
}

/// The body of backlog event `i`: a note in thread `i mod work`.
fn backlog_body(i: u64, work: u64) -> Vec<u8> {
    note(BACKLOG, &format!("b-{i}"), &format!("t-{}", i % work))
}

fn note(source: &str, delivery: &str, thread: &str) -> Vec<u8> {
    json!({
        "source": source,
        "delivery_id": delivery,
        "kind": "note.posted",
        "payload": {
            "thread": thread,
            "author": "drill",
            "text": format!("{delivery}: the quick brown fox jumps over the lazy dog"),
        },
    })
    .to_string()
    .into_bytes()
}

/// Push the `n` backlog events over [`BACKLOG_CLIENTS`] keep-alive clients; the highest
/// event id acknowledged.
async fn push_backlog(socket: &Path, n: u64, work: u64) -> anyhow::Result<i64> {
    let mut tasks = Vec::new();
    for c in 0..BACKLOG_CLIENTS {
        let socket = socket.to_owned();
        tasks.push(tokio::task::spawn_local(async move {
            let mut conn = Conn::connect(&socket).await?;
            let mut last = 0i64;
            for i in (c..n).step_by(BACKLOG_CLIENTS as usize) {
                let (status, body) = conn
                    .request("POST", "/v1/events", &backlog_body(i, work))
                    .await?;
                ensure!(status == 201, "a backlog push was answered {status}");
                let v: Value = serde_json::from_slice(body)?;
                ensure!(v["duplicate"] == false, "backlog event {i} was a duplicate");
                last = last.max(v["event_id"].as_i64().context("an event id")?);
            }
            anyhow::Ok(last)
        }));
    }
    let mut last = 0;
    for t in tasks {
        last = last.max(t.await.context("a backlog client")??);
    }
    Ok(last)
}

/// Create `n` `digest` timers of `notes`, every hour, first due now.
async fn create_timers(socket: &Path, n: u64) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for c in 0..BACKLOG_CLIENTS {
        let socket = socket.to_owned();
        tasks.push(tokio::task::spawn_local(async move {
            let mut conn = Conn::connect(&socket).await?;
            for _ in (c..n).step_by(BACKLOG_CLIENTS as usize) {
                let body = json!({
                    "extension": "notes",
                    "recurrence": "digest",
                    "spec": "every 1h",
                    "first_at_ms": now_ms(),
                })
                .to_string();
                let (status, _) = conn.request("POST", "/v1/timers", body.as_bytes()).await?;
                ensure!(status == 201, "a timer was answered {status}");
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await.context("a timer client")??;
    }
    Ok(())
}

/// Push at `per_s` (event `i` due at `i / per_s`, on connection `i mod DRAIN_CONNS`) until
/// `stop`; the acknowledgements' latency from when each was due, and how many there were.
async fn push_at(
    socket: &Path,
    per_s: f64,
    stop: &Rc<AtomicBool>,
) -> anyhow::Result<(Histogram<u64>, u64)> {
    let step = pace(per_s).context("a push rate above 0")?;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..DRAIN_CONNS {
        let (socket, stop) = (socket.to_owned(), stop.clone());
        tasks.push(tokio::task::spawn_local(async move {
            let mut conn = Conn::connect(&socket).await?;
            let (mut h, mut i) = (new_histogram(), c);
            while !stop.load(Ordering::Relaxed) {
                let due = t0 + step * (i as u32);
                sleep_until(due.into()).await;
                let body = note(DRAIN, &format!("d-{i}"), &format!("d-{}", i % 100));
                let (status, _) = conn.request("POST", "/v1/events", &body).await?;
                ensure!(
                    status == 201,
                    "a push during the drain was answered {status}"
                );
                record(&mut h, due.elapsed());
                i += DRAIN_CONNS;
            }
            anyhow::Ok(h)
        }));
    }
    let mut all = new_histogram();
    for t in tasks {
        all.add(&t.await.context("a drain pusher")??)
            .context("merging histograms")?;
    }
    let n = all.len();
    Ok((all, n))
}

/// Wait until the backlog's last event is routed and every timer has fired since `t0_ms`; the
/// daemon's CPU clock ticks when the backlog was first seen routed.
async fn wait_for_drain(d: &Daemon, last_id: i64, timers: u64, t0_ms: i64) -> anyhow::Result<u64> {
    let t = Instant::now();
    let mut routed = None;
    loop {
        if routed.is_none() {
            // Routing goes through the unrouted events in id order, each batch committed before
            // the next is read: once the last is routed, the rest are (checked after).
            let page = d
                .client
                .get(&format!("/v1/events?after={}&limit=1", last_id - 1))
                .await?;
            if page["events"][0]["routed_at_ms"].is_i64() {
                routed = Some(proc_cpu_ticks(d.pid())?);
            }
        }
        if let Some(ticks) = routed
            && fired_since(d, t0_ms).await? == timers
        {
            return Ok(ticks);
        }
        ensure!(
            t.elapsed() < GIVE_UP,
            "the backlog was not drained within {GIVE_UP:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every timer, through the API's pages.
async fn all_timers(d: &Daemon) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut after = 0i64;
    loop {
        let page = d
            .client
            .get(&format!("/v1/timers?after={after}&limit=200"))
            .await?;
        let rows = page["timers"].as_array().cloned().unwrap_or_default();
        let Some(last) = rows.last() else {
            return Ok(out);
        };
        after = last["id"].as_i64().context("a timer id")?;
        out.extend(rows);
    }
}

async fn fired_since(d: &Daemon, t0_ms: i64) -> anyhow::Result<u64> {
    Ok(all_timers(d)
        .await?
        .iter()
        .filter(|t| t["last_fired_at_ms"].as_i64().is_some_and(|f| f >= t0_ms))
        .count() as u64)
}

/// Check every event: the backlog's `n` each routed into a Work, `work` Work in all, and the
/// `pushed` of the drain each stored once and routed into a Work. The backlog's earliest and
/// latest `routed_at_ms`.
async fn checked_events(d: &Daemon, n: u64, work: u64, pushed: u64) -> anyhow::Result<(i64, i64)> {
    let (mut backlog, mut drain) = (0u64, 0u64);
    let mut works = HashSet::new();
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    let mut after = 0i64;
    loop {
        let page = d
            .client
            .get(&format!("/v1/events?after={after}&limit=200"))
            .await?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        let Some(end) = events.last() else {
            break;
        };
        after = end["id"].as_i64().context("an event id")?;
        for e in &events {
            let (Some(at), Some(w)) = (e["routed_at_ms"].as_i64(), e["work_id"].as_i64()) else {
                bail!("event {} was not routed into a Work: {e}", e["id"]);
            };
            match e["source"].as_str() {
                Some(BACKLOG) => {
                    backlog += 1;
                    works.insert(w);
                    first = first.min(at);
                    last = last.max(at);
                }
                Some(DRAIN) => drain += 1,
                other => bail!("an event of an unknown source {other:?}"),
            }
        }
    }
    ensure!(backlog == n, "{backlog} backlog events stored, {n} pushed");
    ensure!(
        works.len() as u64 == work,
        "the backlog went into {} Work, not {work}",
        works.len()
    );
    ensure!(
        drain == pushed,
        "{drain} events stored of the {pushed} acknowledged during the drain"
    );
    Ok((first, last))
}

/// Check every timer fired after `t0_ms` and was rescheduled past it; the latest firing.
async fn checked_timers(d: &Daemon, n: u64, t0_ms: i64) -> anyhow::Result<i64> {
    let timers = all_timers(d).await?;
    ensure!(timers.len() as u64 == n, "{} timers, not {n}", timers.len());
    let mut last = i64::MIN;
    for t in &timers {
        let fired = t["last_fired_at_ms"].as_i64().unwrap_or(i64::MIN);
        let next = t["next_at_ms"].as_i64().unwrap_or(i64::MIN);
        ensure!(
            fired >= t0_ms && next > fired,
            "timer {} did not fire after the start: {t}",
            t["id"]
        );
        last = last.max(fired);
    }
    Ok(last)
}

/// The process's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in the process's status")
}
