//! One daemon, many extensions: what installing, starting and idling cost at 10 and at 1,000
//! echo packages (`make bench-scale`; docs/performance.md, "Scale").
//!
//! ```text
//! bench-scale [--extensions 1000] [--small 10] [--calls 2000] [--idle-s 10] [--json PATH]
//! ```
//!
//! Each size gets its own temporary state directory, `N` copies of the release `echo` example
//! (named `echo-0001` …), installed one after the other through the package store's own
//! `install` (the function `conduit ext install` calls, without the CLI's process start), then a
//! release `conduit daemon run` on it. Printed per size:
//!
//! - the install time of the 10th, 100th and 1,000th package (and the median of the ten
//!   installs ending there, which is the steadier figure), beside its floor: right after each
//!   install, this process writes the package's binary into a new file on the same file system
//!   and fsyncs it (kept to the end, as the installs are). The floor grows with the count on a
//!   machine whose fresh page-cache pages cost more than reused ones; what the install adds to
//!   it is the store's own cost;
//! - the time from spawning the daemon to every extension `ready` (polled every 20 ms through
//!   `GET /v1/extensions`);
//! - the daemon's RSS and thread count (`/proc/<pid>/status`), once all are ready and again
//!   after the idle window;
//! - the daemon's CPU over `--idle-s` seconds of nothing, `--settle-s` after all were ready (user + system time of the whole
//!   process, `/proc/<pid>/stat`, in clock ticks: 0.1% resolution over 10 s), as a share of one
//!   CPU, and the same summed over the extension processes; and the daemon's ticks per thread
//!   over the same window (by thread name), which says whether the host loop or the runtime's
//!   workers spend them;
//! - the p50 and p99 of sequential `echo` calls through the API (`POST
//!   /v1/extensions/echo-0001/call`, one connection per call as the CLI makes them);
//! - the median time to restart one extension (`POST …/restart` until it is ready again with a
//!   new pid: stop, tamper check, spawn, handshake), which shows what the daemon's size adds to
//!   a spawn (`fork` copies its page tables);
//! - the stop: SIGTERM to the daemon's exit, every extension stopped.
//!
//! Order: the small daemon, the large one, the small one again, so the two small figures bracket
//! the large one in time and machine drift shows. The binaries are found next to this
//! executable (`conduit`, `conduit-echo`), so build them in the same profile first.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::Parser;
use conduit_bench::daemon::Daemon;
use conduit_bench::machine::{self, Machine};
use conduit_bench::measure::{new_histogram, quantile_us, record};
use conduit_bench::ordered::Ordered;
use conduit_host::packages::{self, InstallOptions};
use conduit_host::state_dir::StateDir;
use hyper::Method;
use serde_json::{Value, json};

/// One daemon supervising many echo extensions: install, start, memory, threads, idle CPU, echo.
#[derive(Debug, Parser)]
#[command(name = "bench-scale")]
struct Args {
    /// The large size.
    #[arg(long, default_value_t = 1000)]
    extensions: usize,
    /// The small size, measured before and after the large one.
    #[arg(long, default_value_t = 10)]
    small: usize,
    /// Sequential echo calls through the API per daemon (after 200 untimed).
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// Seconds of idleness over which the daemon's CPU is measured.
    #[arg(long, default_value_t = 10)]
    idle_s: u64,
    /// Seconds between all ready and the idle window (startup work winds down).
    #[arg(long, default_value_t = 12)]
    settle_s: u64,
    /// Restarts of one extension timed per daemon (the median is printed).
    #[arg(long, default_value_t = 9)]
    restarts: usize,
    /// Longest wait for every extension to be ready, in seconds.
    #[arg(long, default_value_t = 120)]
    ready_timeout_s: u64,
    /// Where the JSON results go.
    #[arg(long, default_value = "target/bench-scale/results.json")]
    json: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-scale: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    ensure!(
        args.extensions >= 1 && args.small >= 1,
        "sizes must be at least 1"
    );
    let [conduit, echo] = conduit_bench::daemon::siblings(
        ["conduit", "conduit-echo"],
        "cargo build --release -p conduit-host -p conduit-example-echo`, or `make bench-scale",
    )?;
    let machine = Machine::this();
    println!(
        "bench-scale: {} and {} echo extensions; commit {}, {} build; {} CPUs, {}; load {:?}",
        args.small,
        args.extensions,
        machine::commit(),
        machine::profile(),
        machine.cpus,
        machine.cpu_model,
        machine.loadavg,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let root = tempfile::Builder::new()
        .prefix("bench-scale-")
        .tempdir()
        .context("a temporary folder")?;

    let small = Size::prepare(root.path(), "small", args.small, &echo)?;
    let large = Size::prepare(root.path(), "large", args.extensions, &echo)?;
    print_installs(&large);
    let floor_small = ready_floor(&echo, args.small)?;
    let floor_large = ready_floor(&echo, args.extensions)?;
    println!(
        "floor: {} / {} echo processes spawned by this process (posix_spawn) and each answered `initialize`: {:.2} s / {:.2} s",
        args.small, args.extensions, floor_small, floor_large
    );
    let mut runs = Vec::new();
    for (label, size) in [
        ("small", &small),
        ("large", &large),
        ("small-again", &small),
    ] {
        let r = rt.block_on(daemon_run(args, &conduit, size))?;
        print_run(label, size.n, &r);
        runs.push((label.to_owned(), r));
    }

    let (small_p50, large_p50) = (
        runs.iter()
            .filter(|(l, _)| l.starts_with("small"))
            .map(|(_, r)| r.echo_p50_us)
            .fold(f64::INFINITY, f64::min),
        runs.iter()
            .find(|(l, _)| l == "large")
            .map_or(0.0, |(_, r)| r.echo_p50_us),
    );
    println!(
        "echo p50 at {}: {:.1} µs, {:.2}× the better of the two runs at {} ({:.1} µs)",
        args.extensions,
        large_p50,
        large_p50 / small_p50,
        args.small,
        small_p50
    );
    if let Some((_, r)) = runs.iter().find(|(l, _)| l == "large") {
        println!(
            "all ready at {}: {:.2} s, {:.2}× the floor ({:.2} s)",
            args.extensions,
            r.ready_s,
            r.ready_s / floor_large,
            floor_large
        );
    }
    let json = json!({
        "ready_floor_s": { "small": floor_small, "large": floor_large },
        "commit": machine::commit(),
        "profile": machine::profile(),
        "machine": machine,
        "sizes": [args.small, args.extensions],
        "installs_ms": { "small": small.installs, "large": large.installs },
        "floors_ms": { "small": small.floors, "large": large.floors },
        "install_ms_at": install_points(&large.installs),
        "floor_ms_at": install_points(&large.floors),
        "runs": runs.iter().map(|(l, r)| (l.clone(), serde_json::to_value(r).unwrap_or(Value::Null))).collect::<serde_json::Map<_, _>>(),
        "echo_p50_ratio": large_p50 / small_p50,
    });
    if let Some(dir) = args.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", args.json.display()))?;
    println!("results written to {}", args.json.display());
    Ok(())
}

/// One state directory with `n` echo packages installed.
struct Size {
    n: usize,
    state: PathBuf,
    /// Milliseconds per install, in order.
    installs: Vec<f64>,
    /// Milliseconds per floor write (the package's binary into a new file, fsynced), one right
    /// after each install.
    floors: Vec<f64>,
}

impl Size {
    fn prepare(root: &Path, label: &str, n: usize, echo: &Path) -> anyhow::Result<Size> {
        let src = root.join(format!("{label}-src"));
        let state_path = root.join(format!("{label}-state"));
        std::fs::create_dir_all(&src)?;
        let state = StateDir::open(&state_path).context("the state directory")?;
        let opts = InstallOptions::default();
        let mut installs = Vec::with_capacity(n);
        let mut floors = Vec::with_capacity(n);
        let bytes = std::fs::read(echo).with_context(|| format!("reading {}", echo.display()))?;
        let floor_dir = root.join(format!("{label}-floor"));
        std::fs::create_dir_all(&floor_dir)?;
        let t_all = Instant::now();
        for i in 1..=n {
            let name = package_name(i);
            let dir = src.join(&name);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(
                dir.join("conduit-extension.toml"),
                format!(
                    "name = \"{name}\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"./conduit-echo\"]\n\n[capabilities]\nmethods = [\"echo\", \"check.sleep\"]\n"
                ),
            )?;
            if std::fs::hard_link(echo, dir.join("conduit-echo")).is_err() {
                std::fs::copy(echo, dir.join("conduit-echo"))?;
            }
            let t = Instant::now();
            packages::install(&state, &dir, &opts).with_context(|| format!("installing {name}"))?;
            installs.push(t.elapsed().as_secs_f64() * 1e3);
            floors.push(floor_write(&floor_dir.join(&name), &bytes)?);
            if i % 100 == 0 {
                eprintln!(
                    "  {label}: {i}/{n} installed ({:.1} s)",
                    t_all.elapsed().as_secs_f64()
                );
            }
        }
        Ok(Size {
            n,
            state: state_path,
            installs,
            floors,
        })
    }
}

/// Milliseconds to write `bytes` into the new file `path` in 64 KiB writes (as the store copies)
/// and fsync it: what the file system alone charges for one package's bytes at this point.
fn floor_write(path: &Path, bytes: &[u8]) -> anyhow::Result<f64> {
    use std::io::Write;
    let t = Instant::now();
    let mut f =
        std::fs::File::create_new(path).with_context(|| format!("creating {}", path.display()))?;
    for chunk in bytes.chunks(64 * 1024) {
        f.write_all(chunk)?;
    }
    f.sync_data()?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

fn package_name(i: usize) -> String {
    format!("echo-{i:04}")
}

/// The 10th, 100th and 1,000th install (as far as there are), each alone and as the median of the
/// ten ending there.
fn install_points(installs: &[f64]) -> Ordered<Ordered<f64>> {
    let mut out = Ordered::default();
    for at in [10usize, 100, 1000] {
        if installs.len() < at {
            continue;
        }
        let mut window: Vec<f64> = installs[at.saturating_sub(10)..at].to_vec();
        window.sort_by(f64::total_cmp);
        let mut o = Ordered::default();
        o.push("ms", installs[at - 1]);
        o.push("median_of_10_ms", window[window.len() / 2]);
        out.push(at.to_string(), o);
    }
    out
}

fn print_installs(size: &Size) {
    let total: f64 = size.installs.iter().sum();
    print!("install (ms):");
    for ((at, o), (_, f)) in install_points(&size.installs)
        .0
        .into_iter()
        .zip(install_points(&size.floors).0)
    {
        let ms = o.0[0].1;
        let med = o.0[1].1;
        let floor = f.0[1].1;
        print!(
            "  #{at}: {ms:.2} (median of ten ending there {med:.2}; floor {floor:.2}, install minus floor {:.2})",
            med - floor
        );
    }
    println!("  all {}: {:.1} s", size.installs.len(), total / 1e3);
}

#[derive(Debug, serde::Serialize)]
struct RunFigures {
    extensions: usize,
    /// How many were ready when the wait ended (all, unless it timed out).
    ready: usize,
    ready_s: f64,
    rss_ready_mib: f64,
    threads_ready: u64,
    rss_idle_mib: f64,
    threads_idle: u64,
    idle_cpu_pct: f64,
    /// The daemon's child processes found for the next figure.
    extension_processes: usize,
    /// Every extension process's CPU over the same window, summed.
    extensions_idle_cpu_pct: f64,
    /// The daemon's CPU over the idle window per live thread, in clock ticks, by thread name
    /// (one entry per thread, busiest first; threads that used none are left out).
    idle_ticks_by_thread: Vec<(String, u64)>,
    echo_p50_us: f64,
    echo_p99_us: f64,
    /// Median time from `POST …/restart` of one extension to it ready again with a new pid.
    restart_ms: f64,
    /// SIGTERM to the daemon's exit, every extension stopped.
    stop_s: f64,
}

fn print_run(label: &str, n: usize, r: &RunFigures) {
    println!(
        "{label:>11} ({n:>4} ext): {} ready {:.2} s; RSS {:.1} MiB ready / {:.1} MiB idle; threads {} / {}; idle CPU {:.3}% (extensions {:.2}%); echo p50 {:.1} µs p99 {:.1} µs; restart {:.1} ms; stop {:.2} s",
        if r.ready == n {
            "all".to_owned()
        } else {
            format!("only {} of {n}", r.ready)
        },
        r.ready_s,
        r.rss_ready_mib,
        r.rss_idle_mib,
        r.threads_ready,
        r.threads_idle,
        r.idle_cpu_pct,
        r.extensions_idle_cpu_pct,
        r.echo_p50_us,
        r.echo_p99_us,
        r.restart_ms,
        r.stop_s
    );
    let by_thread: Vec<String> = r
        .idle_ticks_by_thread
        .iter()
        .map(|(name, ticks)| format!("{name} {ticks}"))
        .collect();
    println!(
        "{:>11}  idle CPU by thread (clock ticks): {}",
        "",
        if by_thread.is_empty() {
            "none".to_owned()
        } else {
            by_thread.join(", ")
        }
    );
}

async fn daemon_run(args: &Args, conduit: &Path, size: &Size) -> anyhow::Result<RunFigures> {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(args.ready_timeout_s);
    let daemon = Daemon::start(
        conduit,
        &size.state,
        Duration::from_secs(args.ready_timeout_s),
    )
    .await?;
    let pid = daemon.pid();
    let client = daemon.client.clone();
    let ready = loop {
        let list = client.get("/v1/extensions").await?;
        let exts = list["extensions"].as_array().cloned().unwrap_or_default();
        let ready = exts.iter().filter(|e| e["state"] == "ready").count();
        if ready == size.n {
            break ready;
        }
        if Instant::now() > deadline {
            // Go on and measure the rest: how far it got is a figure too.
            eprintln!(
                "  only {ready} of {} extensions ready after {} s",
                size.n, args.ready_timeout_s
            );
            break ready;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let ready_s = t0.elapsed().as_secs_f64();
    let (rss_ready_mib, threads_ready) = proc_status(pid)?;

    // Idle: nothing calls, nothing polls.
    // Whole-process counters (`/proc/<pid>/stat`), which keep the time of threads that have
    // exited: the blocking pool's threads end during the window, and a sum over live threads
    // would lose theirs.
    // Settle first: the blocking pool's threads end 10 s after their last task, and each
    // extension's tree is read every 250 ms at first, less often as it stays quiet.
    tokio::time::sleep(Duration::from_secs(args.settle_s)).await;
    // The daemon's direct children: its extensions.
    let kids = conduit_supervisor::tree::children(pid);
    let kids_ticks = || -> u64 { kids.iter().filter_map(|k| proc_cpu_ticks(*k).ok()).sum() };
    let cpu0 = proc_cpu_ticks(pid)?;
    let kids0 = kids_ticks();
    let threads0 = thread_ticks(pid);
    let t_idle = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.idle_s)).await;
    let cpu1 = proc_cpu_ticks(pid)?;
    let kids1 = kids_ticks();
    let idle_ticks_by_thread = ticks_by_name(&threads0, &thread_ticks(pid));
    let secs = t_idle.elapsed().as_secs_f64();
    let tick = 1.0 / clock_ticks_per_s();
    let idle_cpu_pct = 100.0 * cpu1.saturating_sub(cpu0) as f64 * tick / secs;
    let extensions_idle_cpu_pct = 100.0 * kids1.saturating_sub(kids0) as f64 * tick / secs;
    let (rss_idle_mib, threads_idle) = proc_status(pid)?;

    let path = format!("/v1/extensions/{}/call", package_name(1));
    let body = json!({"method": "echo", "params": {"text": conduit_bench::prototype::PAYLOAD}});
    let mut hist = new_histogram();
    for i in 0..(200 + args.calls) {
        let t = Instant::now();
        let (status, answer) = client.request(Method::POST, &path, Some(&body)).await?;
        let took = t.elapsed();
        ensure!(
            status.is_success() && answer["result"]["text"] == conduit_bench::prototype::PAYLOAD,
            "echo answered {status}: {answer}"
        );
        if i >= 200 {
            record(&mut hist, took);
        }
    }

    // Restarts of one extension: stop, tamper check, spawn (a fork of the daemon, whose cost
    // grows with its resident memory), handshake.
    let one = format!("/v1/extensions/{}", package_name(1));
    let mut restarts = Vec::new();
    for _ in 0..args.restarts {
        let before = client.get(&one).await?["pid"].as_u64();
        let t = Instant::now();
        client
            .post(&format!("{one}/restart"), None)
            .await
            .context("restarting")?;
        loop {
            let s = client.get(&one).await?;
            if s["state"] == "ready" && s["pid"].as_u64() != before {
                break;
            }
            ensure!(
                t.elapsed() < Duration::from_secs(60),
                "the restart did not finish: {s}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        restarts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    restarts.sort_by(f64::total_cmp);
    let restart_ms = restarts.get(restarts.len() / 2).copied().unwrap_or(0.0);
    drop(client);
    let stop_s = daemon.stop()?.as_secs_f64();
    Ok(RunFigures {
        stop_s,
        extension_processes: kids.len(),
        extensions_idle_cpu_pct,
        idle_ticks_by_thread,
        restart_ms,
        extensions: size.n,
        ready,
        ready_s,
        rss_ready_mib,
        threads_ready,
        rss_idle_mib,
        threads_idle,
        idle_cpu_pct,
        echo_p50_us: quantile_us(&hist, 0.5),
        echo_p99_us: quantile_us(&hist, 0.99),
    })
}

/// RSS in MiB and the thread count, from `/proc/<pid>/status`.
fn proc_status(pid: u32) -> anyhow::Result<(f64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |key: &str| -> anyhow::Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {key} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")? as f64 / 1024.0, field("Threads:")?))
}

/// The floor of "all ready": `n` echo processes spawned by this process (std's `posix_spawn`,
/// no daemon, no tamper check, no log capture), each sent the `initialize` the daemon sends,
/// until the last has answered. Seconds.
fn ready_floor(echo: &Path, n: usize) -> anyhow::Result<f64> {
    use std::io::{BufRead, BufReader, Write};
    let params = conduit_protocol::handshake::InitializeParams::current("0.1.0");
    let line = format!(
        "{}\n",
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
    );
    let data = tempfile::tempdir()?;
    let t = Instant::now();
    let mut kids = Vec::with_capacity(n);
    for i in 1..=n {
        let mut child = Command::new(echo)
            .env_clear()
            .env("CONDUIT_EXTENSION", package_name(i))
            .env("CONDUIT_DATA_DIR", data.path())
            .env("CONDUIT_PROTOCOL_VERSION", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning the echo example")?;
        child
            .stdin
            .as_mut()
            .context("stdin")?
            .write_all(line.as_bytes())?;
        kids.push(child);
    }
    for child in &mut kids {
        let mut answer = String::new();
        BufReader::new(child.stdout.as_mut().context("stdout")?).read_line(&mut answer)?;
        ensure!(
            answer.contains("\"result\""),
            "the echo example answered {answer:?}"
        );
    }
    let took = t.elapsed().as_secs_f64();
    for mut child in kids {
        drop(child.stdin.take());
        let _ = child.kill();
        let _ = child.wait();
    }
    Ok(took)
}

/// utime + stime of a whole process, exited threads included, in clock ticks (`/proc/<pid>/stat`
/// fields 14 and 15).
fn proc_cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    proc_cpu_ticks_at(Path::new(&format!("/proc/{pid}/stat")))
}

/// utime + stime from a `stat` file of `/proc` (a process's or one thread's).
fn proc_cpu_ticks_at(path: &Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    // The command name is in parentheses and may hold spaces: count fields after the last `)`.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("/proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After `)`, field 3 (state) is index 0, so fields 14 and 15 are indexes 11 and 12.
    let utime: u64 = fields
        .get(11)
        .and_then(|v| v.parse().ok())
        .context("utime")?;
    let stime: u64 = fields
        .get(12)
        .and_then(|v| v.parse().ok())
        .context("stime")?;
    Ok(utime + stime)
}

/// Each live thread of `pid`: its id, name and utime + stime in clock ticks
/// (`/proc/<pid>/task/<tid>/stat`).
fn thread_ticks(pid: u32) -> Vec<(u32, String, u64)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if let Ok(ticks) = proc_cpu_ticks_at(&t.path().join("stat")) {
            out.push((tid, name.trim().to_owned(), ticks));
        }
    }
    out
}

/// What each thread alive at both readings used in between, busiest first, zeros left out.
fn ticks_by_name(
    before: &[(u32, String, u64)],
    after: &[(u32, String, u64)],
) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = after
        .iter()
        .filter_map(|(tid, name, t1)| {
            let (_, _, t0) = before.iter().find(|(b, _, _)| b == tid)?;
            let used = t1.saturating_sub(*t0);
            (used > 0).then(|| (name.clone(), used))
        })
        .collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

fn clock_ticks_per_s() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64
}
