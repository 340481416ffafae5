//! What the operator views cost at a thousand extensions and a million retained events
//! (`make bench-views`; docs/perf-log/2026-12-04-views.md).
//!
//! ```text
//! bench-views [--extensions 1000] [--events 1000000] [--loads 30] [--top-s 20] [--fresh]
//!             [--json target/bench-views/results.json]
//! ```
//!
//! The fixture: `N` copies of the release `echo` example installed through the package store's
//! own `install`, and `E` events written through the store crate's API (`Store::write`, in
//! transactions of 10,000; no HTTP), ten to a Work over ten kinds, 99% of the Work done, every
//! event routed. It is kept in `target/bench-views/fixture-N-E/` and reused by the next run
//! unless `--fresh`. Then a release `conduit daemon run` on it (every extension ready) and a
//! release `conduit web`, whose token is exchanged for its cookie once.
//!
//! Measured, each page or request loaded `--loads` times in a row after 5 untimed, one TCP or
//! Unix connection each, from the request's first byte to the answer's last:
//!
//! - the web view's pages (the extensions table, sorted by p99, one extension, Work newest
//!   first, by state, by kind, a deep page, one Work with its events, the small lists);
//! - the API requests behind them (`/v1/overview`, `/v1/work/recent`, `/v1/work/{id}/events`,
//!   `/v1/events` pages), beside `GET /v1/extensions` (every extension's whole status, what a
//!   view would read without the overview);
//! - `conduit top --interval 2s` in a pseudo-terminal for `--top-s` seconds: its CPU as a share
//!   of one CPU (target < 2%), and the daemon's CPU over that window beside an equal window
//!   without it.
//!
//! Printed beside the original's figures from its performance page (its pages at 66,000
//! events: about 20 ms each on a quiet machine after its fixes; 77 ms p50 / 112 ms p90 for the
//! runs page and 62–66 / 82–99 ms for a Work on a busy one).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::Parser;
use conduit_bench::daemon::Daemon;
use conduit_bench::machine::{self, Machine};
use conduit_bench::measure::{new_histogram, proc_cpu, quantile_us, record};
use conduit_bench::ordered::Ordered;
use conduit_host::packages::{self, InstallOptions};
use conduit_host::state_dir::StateDir;
use serde_json::{Value, json};

/// The operator views at scale: page and API-list latencies, and `conduit top`'s CPU.
#[derive(Debug, Parser)]
#[command(name = "bench-views")]
struct Args {
    /// Extensions installed (copies of the echo example).
    #[arg(long, default_value_t = 1000)]
    extensions: usize,
    /// Events retained in the store.
    #[arg(long, default_value_t = 1_000_000)]
    events: usize,
    /// Timed loads of each page and request (after 5 untimed).
    #[arg(long, default_value_t = 30)]
    loads: usize,
    /// Seconds `conduit top` runs while its CPU is measured.
    #[arg(long, default_value_t = 20)]
    top_s: u64,
    /// Build the fixture anew even if a complete one is kept.
    #[arg(long)]
    fresh: bool,
    /// Where the JSON results go.
    #[arg(long, default_value = "target/bench-views/results.json")]
    json: PathBuf,
}

/// Events per Work, and kinds of Work.
const PER_WORK: usize = 10;
const KINDS: usize = 10;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-views: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    ensure!(
        args.extensions >= 1 && args.events >= PER_WORK && args.loads >= 1,
        "sizes must be positive"
    );
    let [conduit, echo] =
        conduit_bench::daemon::siblings(["conduit", "conduit-echo"], "make bench-views")?;
    let machine = Machine::this();
    println!(
        "bench-views: {} extensions, {} events; commit {}, {} build; {} CPUs, {}; load {}",
        args.extensions,
        args.events,
        machine::commit(),
        machine::profile(),
        machine.cpus,
        machine.cpu_model,
        machine.loadavg
    );
    // Absolute: `conduit top` runs in a pseudo-terminal whose working directory is not ours.
    let root = std::path::absolute("target/bench-views")?;
    let fixture = root.join(format!("fixture-{}-{}", args.extensions, args.events));
    let seed = prepare(&fixture, args, &echo)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let results = rt.block_on(measure(args, &conduit, &fixture, seed, &machine))?;
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&results)? + "\n")?;
    println!("results: {}", args.json.display());
    Ok(())
}

/// How the fixture was made (or that it was reused).
#[derive(Debug, Clone, Copy)]
struct Seed {
    install_s: f64,
    events_s: f64,
    reused: bool,
    work: usize,
}

fn prepare(dir: &Path, args: &Args, echo: &Path) -> anyhow::Result<Seed> {
    let done = dir.join("complete.json");
    let work = args.events / PER_WORK;
    if !args.fresh && done.is_file() {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&done)?)?;
        println!(
            "fixture: reusing {} (made in {:.0} s; --fresh makes it anew)",
            dir.display(),
            v["seconds"].as_f64().unwrap_or(0.0)
        );
        return Ok(Seed {
            install_s: v["install_s"].as_f64().unwrap_or(0.0),
            events_s: v["events_s"].as_f64().unwrap_or(0.0),
            reused: true,
            work,
        });
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let src = dir.join("src");
    let state_path = dir.join("state");
    std::fs::create_dir_all(&src)?;
    let state = StateDir::open(&state_path).context("the state directory")?;
    let t = Instant::now();
    for i in 1..=args.extensions {
        let name = format!("echo-{i:04}");
        let pkg = src.join(&name);
        std::fs::create_dir_all(&pkg)?;
        std::fs::write(
            pkg.join("conduit-extension.toml"),
            format!(
                "name = \"{name}\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"./conduit-echo\"]\n\n[capabilities]\nmethods = [\"echo\", \"check.sleep\"]\n"
            ),
        )?;
        if std::fs::hard_link(echo, pkg.join("conduit-echo")).is_err() {
            std::fs::copy(echo, pkg.join("conduit-echo"))?;
        }
        packages::install(&state, &pkg, &InstallOptions::default())
            .with_context(|| format!("installing {name}"))?;
        if i % 250 == 0 {
            eprintln!(
                "  {i}/{} installed ({:.1} s)",
                args.extensions,
                t.elapsed().as_secs_f64()
            );
        }
    }
    let install_s = t.elapsed().as_secs_f64();
    // The store, written through its own API, as the daemon's host loop would have.
    let t = Instant::now();
    let store = conduit_store::Store::open(state_path.join("conduit.db"))?;
    let base_ms = conduit_supervisor::now_ms() - args.events as i64 * 10;
    let per_tx = 10_000;
    let mut next = 0usize;
    while next < args.events {
        let end = (next + per_tx).min(args.events);
        store.write(|tx| {
            let mut i = next;
            while i < end {
                let w = i / PER_WORK;
                let kind = format!("k{}", w % KINDS);
                let at = base_ms + i as i64 * 10;
                let mut ids = Vec::with_capacity(PER_WORK);
                for j in i..(i + PER_WORK).min(end) {
                    let payload = json!({
                        "thread": format!("t-{w}"),
                        "author": format!("user-{}", j % 97),
                        "text": format!("event {j}: a note of realistic length about thread t-{w}, with a few words more"),
                    });
                    ids.push(tx.accept_event("bench", &format!("d-{j}"), &format!("{kind}.posted"), &payload, at)?.event_id);
                }
                let id = tx.open_or_feed_work(&kind, &format!("t-{w}"), &ids, true, at)?;
                for e in &ids {
                    tx.mark_routed(*e, Some(id), at)?;
                }
                // 99% done; the newest 1% stays ready.
                if w * 100 < (args.events / PER_WORK) * 99 {
                    tx.set_work_state(id, conduit_store::WorkState::Done, at)?;
                }
                i += ids.len();
            }
            Ok(())
        })?;
        next = end;
        if next.is_multiple_of(100_000) {
            eprintln!(
                "  {next}/{} events written ({:.1} s)",
                args.events,
                t.elapsed().as_secs_f64()
            );
        }
    }
    drop(store);
    let events_s = t.elapsed().as_secs_f64();
    std::fs::write(
        &done,
        json!({ "install_s": install_s, "events_s": events_s, "seconds": install_s + events_s })
            .to_string(),
    )?;
    println!(
        "fixture: {} extensions installed in {install_s:.1} s, {} events in {events_s:.1} s",
        args.extensions, args.events
    );
    Ok(Seed {
        install_s,
        events_s,
        reused: false,
        work,
    })
}

/// One HTTP/1.1 GET on a new TCP connection to the web view; the status and the body.
fn web_get(port: u16, path: &str, cookie: &str) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
    )?;
    answer(&mut s)
}

/// Read a whole `Connection: close` answer: its status and its bytes.
fn answer(s: &mut impl Read) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let code = std::str::from_utf8(&out[..out.len().min(16)])
        .ok()
        .and_then(|h| h.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, out))
}

/// One GET on a new connection to the daemon's socket.
fn api_get(socket: &Path, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: conduit\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let code = std::str::from_utf8(&out[..out.len().min(16)])
        .ok()
        .and_then(|h| h.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, out))
}

/// p50, p90 and p99 in ms of `loads` calls of `f` after 5 untimed, and the answer's size.
fn time(
    loads: usize,
    mut f: impl FnMut() -> anyhow::Result<(u16, Vec<u8>)>,
    what: &str,
) -> anyhow::Result<Ordered<f64>> {
    let mut h = new_histogram();
    let mut bytes = 0;
    for i in 0..loads + 5 {
        let t = Instant::now();
        let (code, body) = f()?;
        let took = t.elapsed();
        if code != 200 {
            bail!(
                "{what} answered {code}: {}",
                String::from_utf8_lossy(&body[..body.len().min(400)])
            );
        }
        if i >= 5 {
            record(&mut h, took);
        }
        bytes = body.len();
    }
    let mut o = Ordered::default();
    o.push("p50_ms", quantile_us(&h, 0.50) / 1e3);
    o.push("p90_ms", quantile_us(&h, 0.90) / 1e3);
    o.push("p99_ms", quantile_us(&h, 0.99) / 1e3);
    o.push("bytes", bytes as f64);
    Ok(o)
}

fn show(label: &str, path: &str, o: &Ordered<f64>) {
    let g = |k| o.get(k).copied().unwrap_or(0.0);
    println!(
        "  {label:<34} {:>8.2} {:>8.2} {:>8.2} {:>9}  {path}",
        g("p50_ms"),
        g("p90_ms"),
        g("p99_ms"),
        g("bytes") as u64
    );
}

async fn measure(
    args: &Args,
    conduit: &Path,
    fixture: &Path,
    seed: Seed,
    machine: &Machine,
) -> anyhow::Result<Value> {
    let state = fixture.join("state");
    let socket = state.join("run").join("conduit.sock");
    let t0 = Instant::now();
    let daemon = Daemon::start(conduit, &state, Duration::from_secs(120)).await?;
    let client = daemon.client.clone();
    loop {
        let o = client.get("/v1/overview?limit=1").await?;
        let ready = o["extensions"]["by_state"]["ready"].as_u64().unwrap_or(0) as usize;
        if ready == args.extensions {
            break;
        }
        if t0.elapsed() > Duration::from_secs(180) {
            bail!(
                "only {ready} of {} extensions were ready after 180 s",
                args.extensions
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "daemon: {} extensions ready in {:.1} s",
        args.extensions,
        t0.elapsed().as_secs_f64()
    );
    // Some calls, so the table has latencies to sort by.
    for i in (1..=args.extensions).step_by((args.extensions / 50).max(1)) {
        let _ = client
            .post(
                &format!("/v1/extensions/echo-{i:04}/call"),
                Some(&json!({"method": "echo", "params": {"i": i}})),
            )
            .await;
    }
    // Settle: the blocking pool's threads end, idle extensions start resting.
    tokio::time::sleep(Duration::from_secs(12)).await;

    let mut web = std::process::Command::new(conduit)
        .args(["web"])
        .env("CONDUIT_STATE_DIR", &state)
        .env("CONDUIT_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting conduit web")?;
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(web.stdout.take().unwrap()),
        &mut line,
    )?;
    let url = line.trim().to_owned();
    let port: u16 = url
        .strip_prefix("http://127.0.0.1:")
        .and_then(|r| r.split('/').next())
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("conduit web's first line is not its URL: {line:?}"))?;
    let token = url.rsplit("token=").next().unwrap_or("").to_owned();
    let (_, answer) = web_get(port, &format!("/?token={token}"), "")?;
    let text = String::from_utf8_lossy(&answer);
    let cookie = text
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .context("no session cookie for the token")?
        .to_owned();

    let total_work = seed.work as i64;
    let one = format!("echo-{:04}", (args.extensions / 2).max(1));
    let mid = total_work / 2;
    let oldest = 1;
    let pages: Vec<(&str, String)> = vec![
        ("extensions (name, first page)", "/extensions".into()),
        (
            "extensions sorted by p99",
            "/extensions?sort=p99&order=desc".into(),
        ),
        ("extensions filtered", "/extensions?filter=echo-05".into()),
        ("one extension", format!("/extensions/{one}")),
        ("Work, newest", "/work".into()),
        ("Work, done", "/work?state=done".into()),
        ("Work, ready", "/work?state=ready".into()),
        ("Work, one kind", "/work?kind=k3".into()),
        ("Work, a page in the middle", format!("/work?before={mid}")),
        ("one Work (newest)", format!("/work/{total_work}")),
        ("one Work (oldest)", format!("/work/{oldest}")),
        ("timers", "/timers".into()),
        ("waits", "/waits".into()),
        ("emissions", "/emissions".into()),
        ("artifacts", "/artifacts".into()),
    ];
    let last_event = args.events as i64;
    let apis: Vec<(&str, String)> = vec![
        ("overview, 50 rows", "/v1/overview?limit=50".into()),
        (
            "overview, 40 by p99 + detail",
            format!("/v1/overview?limit=40&sort=p99&order=desc&detail={one}"),
        ),
        ("work/recent, newest 50", "/v1/work/recent?limit=50".into()),
        (
            "work/recent, done",
            "/v1/work/recent?state=done&limit=50".into(),
        ),
        (
            "work/recent, kind k3",
            "/v1/work/recent?kind=k3&limit=50".into(),
        ),
        (
            "one Work's events",
            format!("/v1/work/{mid}/events?limit=50"),
        ),
        ("events, first page", "/v1/events?limit=50".into()),
        (
            "events, last page",
            format!("/v1/events?after={}&limit=50", last_event - 50),
        ),
        ("one extension", format!("/v1/extensions/{one}")),
        ("every extension (old way)", "/v1/extensions".into()),
        ("health", "/v1/health".into()),
    ];
    println!(
        "\npages of conduit web ({} loads each, ms)      p50      p90      p99     bytes  path",
        args.loads
    );
    let mut page_res = Ordered::default();
    for (label, path) in &pages {
        let o = time(args.loads, || web_get(port, path, &cookie), path)?;
        show(label, path, &o);
        let mut e = Ordered::default();
        e.push("path", json!(path));
        for (k, v) in o.0 {
            e.push(k, json!(v));
        }
        page_res.push(*label, e);
    }
    println!(
        "\nAPI requests on the socket (ms)                p50      p90      p99     bytes  path"
    );
    let mut api_res = Ordered::default();
    for (label, path) in &apis {
        let o = time(args.loads, || api_get(&socket, path), path)?;
        show(label, path, &o);
        let mut e = Ordered::default();
        e.push("path", json!(path));
        for (k, v) in o.0 {
            e.push(k, json!(v));
        }
        api_res.push(*label, e);
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(web.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = web.wait();

    // conduit top: its CPU, and the daemon's, against an equal window without it.
    let dpid = daemon.pid();
    let window = Duration::from_secs(args.top_s);
    let d0 = proc_cpu(dpid).context("the daemon's CPU")?;
    tokio::time::sleep(window).await;
    let daemon_idle = proc_cpu(dpid)
        .context("the daemon's CPU")?
        .saturating_sub(d0);
    let (top_cpu, daemon_top, refreshes) = top_cpu(conduit, &state, window, dpid)?;
    let pct = |d: Duration| d.as_secs_f64() / window.as_secs_f64() * 100.0;
    println!(
        "\nconduit top --interval 2s, {} s at {} extensions: {:.2}% of one CPU ({} refreshes; target < 2%); the daemon meanwhile {:.2}%, without it {:.2}%",
        args.top_s,
        args.extensions,
        pct(top_cpu),
        refreshes,
        pct(daemon_top),
        pct(daemon_idle)
    );
    let load_after = Machine::this().loadavg;
    daemon.stop()?;

    println!(
        "\nthe original's pages (its performance page, 66,000 events, darwin/arm64 M1 Pro): about 20 ms a page on a quiet machine; busy machine: runs 77 / 112 ms, a Work 62–66 / 82–99 ms (p50 / p90)"
    );
    println!("load after: {load_after}");
    Ok(json!({
        "bench": "bench-views",
        "commit": machine::commit(),
        "profile": machine::profile(),
        "machine": machine,
        "load_after": load_after,
        "fixture": {
            "extensions": args.extensions,
            "events": args.events,
            "work": seed.work,
            "reused": seed.reused,
            "install_s": seed.install_s,
            "events_s": seed.events_s,
        },
        "loads": args.loads,
        "pages": page_res,
        "api": api_res,
        "top": {
            "interval_s": 2,
            "window_s": args.top_s,
            "cpu_pct_of_one": pct(top_cpu),
            "refreshes": refreshes,
            "daemon_cpu_pct_with_top": pct(daemon_top),
            "daemon_cpu_pct_without": pct(daemon_idle),
            "target_pct": 2.0,
        },
        "original": {
            "events": 66000,
            "quiet_machine_page_ms": 20,
            "runs_page_p50_ms": 77, "runs_page_p90_ms": 112,
            "work_page_p50_ms": [62, 66], "work_page_p90_ms": [82, 99],
        },
    }))
}

/// Run `conduit top --interval 2s` in a pseudo-terminal for `window` after its first frame:
/// its CPU, the daemon's over the same window, and how many refreshes it drew.
fn top_cpu(
    conduit: &Path,
    state: &Path,
    window: Duration,
    daemon_pid: u32,
) -> anyhow::Result<(Duration, Duration, u64)> {
    use portable_pty::{CommandBuilder, PtySize, native_pty_system};
    let pty = native_pty_system()
        .openpty(PtySize {
            rows: 50,
            cols: 180,
            pixel_width: 0,
            pixel_height: 0,
        })
        .map_err(|e| anyhow::anyhow!("no pseudo-terminal: {e}"))?;
    let mut cmd = CommandBuilder::new(conduit);
    cmd.args(["top", "--interval", "2s"]);
    cmd.env("CONDUIT_STATE_DIR", state);
    cmd.env("TERM", "xterm-256color");
    cmd.cwd(std::env::current_dir()?);
    let mut child = pty
        .slave
        .spawn_command(cmd)
        .map_err(|e| anyhow::anyhow!("starting conduit top: {e}"))?;
    drop(pty.slave);
    let mut reader = pty
        .master
        .try_clone_reader()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // The screen as a terminal shows it: ratatui writes only the cells that changed.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(vt100::Parser::new(50, 180, 0)));
    let s2 = seen.clone();
    let drain = std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            s2.lock().unwrap().process(&buf[..n]);
        }
    });
    let pid = child.process_id().context("conduit top's pid")?;
    let refreshes = |seen: &std::sync::Mutex<vt100::Parser>| -> u64 {
        let text = seen.lock().unwrap().screen().contents();
        text.rsplit("refresh #")
            .next()
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let t = Instant::now();
    while refreshes(&seen) < 2 {
        if t.elapsed() > Duration::from_secs(30) {
            bail!("conduit top drew no frame within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let r0 = refreshes(&seen);
    let top0 = proc_cpu(pid).context("conduit top's CPU")?;
    let d0 = proc_cpu(daemon_pid).context("the daemon's CPU")?;
    std::thread::sleep(window);
    let top = proc_cpu(pid)
        .context("conduit top's CPU")?
        .saturating_sub(top0);
    let daemon = proc_cpu(daemon_pid)
        .context("the daemon's CPU")?
        .saturating_sub(d0);
    let r1 = refreshes(&seen);
    let _ = child.kill();
    let _ = child.wait();
    drop(pty.master);
    let _ = drain.join();
    Ok((top, daemon, r1.saturating_sub(r0)))
}
