//! What `bench-ingress` is made of: a keep-alive HTTP/1.1 client for the management socket, the
//! floor (the same clients against a server that only answers), reading the daemon's metrics,
//! and the results file's shape.
//!
//! The client is hand-written and small on purpose: one request at a time per connection,
//! written in one `write`, its answer read until `content-length` bytes of body have come.
//! It costs the benchmark a few microseconds per request, so on a two-CPU machine the daemon
//! keeps the CPU it would have with a real client that does as little.
//!
//! Not here: starting the daemon ([`crate::daemon`]), the phases and printing (the binary).
//!
//! Invariant: the results file has exactly the keys other tools read (`clients` → `"1"`,
//! `"8"`, `"64"` → `events_per_s`, `ack_p50_ms`, `ack_p99_ms`; `fixed_rate` →
//! `offered_per_s`, `ack_p99_ms`, `ack_to_route_p50_ms`, `ack_to_route_p99_ms`,
//! `writer_wait_p99_ms`, `writer_hold_p99_ms`; `reads` → `list_p99_ms_idle`,
//! `list_p99_ms_pushing`), built in one place ([`Results::to_json`]) and checked by
//! [`check_shape`]; more keys beside them are fine.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use conduit_host::packages::{self, InstallOptions};
use conduit_host::state_dir::StateDir;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::daemon::Daemon;

/// The client counts the closed-loop phase measures, as the results file names them.
pub const CLIENTS: [usize; 3] = [1, 8, 64];

/// One keep-alive connection to an HTTP/1.1 server on a Unix socket.
#[derive(Debug)]
pub struct Conn {
    s: UnixStream,
    out: Vec<u8>,
    buf: Vec<u8>,
}

impl Conn {
    pub async fn connect(path: &Path) -> anyhow::Result<Conn> {
        let s = UnixStream::connect(path)
            .await
            .with_context(|| format!("connecting to {}", path.display()))?;
        Ok(Conn {
            s,
            out: Vec::with_capacity(1024),
            buf: Vec::with_capacity(16 * 1024),
        })
    }

    /// One request and its answer: the status and the body. The body is valid until the next
    /// request on this connection.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> anyhow::Result<(u16, &[u8])> {
        self.out.clear();
        write!(
            self.out,
            "{method} {path} HTTP/1.1\r\nhost: conduit\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )?;
        self.out.extend_from_slice(body);
        self.s.write_all(&self.out).await?;
        self.buf.clear();
        let (head, status, len) = loop {
            if let Some(h) = find(&self.buf, b"\r\n\r\n") {
                let (status, len) = parse_head(&self.buf[..h])?;
                break (h + 4, status, len);
            }
            self.fill().await?;
        };
        while self.buf.len() < head + len {
            self.fill().await?;
        }
        ensure!(
            self.buf.len() == head + len,
            "the server sent more than one answer"
        );
        Ok((status, &self.buf[head..head + len]))
    }

    async fn fill(&mut self) -> anyhow::Result<()> {
        self.buf.reserve(8 * 1024);
        let n = self.s.read_buf(&mut self.buf).await?;
        ensure!(n > 0, "the server closed the connection");
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The status and `content-length` of an answer's head (a body without one is refused: the
/// daemon and the floor answer with a length).
fn parse_head(head: &[u8]) -> anyhow::Result<(u16, usize)> {
    let text = std::str::from_utf8(head).context("the answer's head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {text:?}"))?;
    for l in lines {
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            return Ok((status, v.trim().parse().context("content-length")?));
        }
    }
    bail!("an answer without content-length: {text:?}")
}

/// The body of event `n` from client `client` of phase `phase`: a note of about 150 bytes
/// (`notes` routes it, grouping by thread).
pub fn push_body(phase: &str, client: usize, n: u64) -> Vec<u8> {
    json!({
        "source": format!("bench-{phase}"),
        "delivery_id": format!("{phase}-c{client}-{n}"),
        "kind": "note.posted",
        "payload": {
            "thread": format!("t-{}", n % 50),
            "author": "bench",
            "text": format!("note {n} from client {client}: the quick brown fox jumps over the lazy dog"),
        },
    })
    .to_string()
    .into_bytes()
}

/// Run `fut` on a current-thread runtime in a `LocalSet` (its clients cost one CPU at most, and
/// `spawn_local` lets them share counters without locks); errors are printed after `name`.
/// `Ok(true)` exits 0, `Ok(false)` 2 (a bound missed), an error 1.
pub fn run_local(
    name: &str,
    fut: impl std::future::Future<Output = anyhow::Result<bool>>,
) -> std::process::ExitCode {
    use std::process::ExitCode;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match tokio::task::LocalSet::new().block_on(&rt, fut) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The `conduit` binary (`given`, else the one beside this executable) and `conduit-notes`
/// beside it; an error naming the one missing and the `make` target that builds both.
pub fn conduit_and_notes(given: Option<&Path>, make: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let conduit = match given {
        Some(p) => p.to_owned(),
        None => std::env::current_exe()?
            .parent()
            .context("this executable's folder")?
            .join("conduit"),
    };
    let notes = conduit.with_file_name("conduit-notes");
    for p in [&conduit, &notes] {
        ensure!(
            p.is_file(),
            "{} is missing: build it first (`make {make}` builds both in release)",
            p.display()
        );
    }
    Ok((conduit, notes))
}

/// A fresh state directory `root/<label>-state` with `notes` (the binary `notes`, the example's
/// manifest) installed, as `conduit ext install` would; its path.
pub fn notes_state(root: &Path, label: &str, notes: &Path) -> anyhow::Result<PathBuf> {
    let state = root.join(format!("{label}-state"));
    let pkg = root.join(format!("{label}-pkg")).join("notes");
    std::fs::create_dir_all(&pkg)?;
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/notes/conduit-extension.toml");
    std::fs::copy(&manifest, pkg.join("conduit-extension.toml"))
        .with_context(|| format!("copying {}", manifest.display()))?;
    std::fs::copy(notes, pkg.join("conduit-notes"))
        .with_context(|| format!("copying {}", notes.display()))?;
    let dir = StateDir::open(&state).context("the state directory")?;
    packages::install(&dir, &pkg, &InstallOptions::default()).context("installing notes")?;
    Ok(state)
}

/// Wait at most `within` for extension `name` to be ready; its pid.
pub async fn ready_pid(d: &Daemon, name: &str, within: Duration) -> anyhow::Result<Option<u32>> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let list = d.client.get("/v1/extensions").await?;
        let ready = list["extensions"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["name"] == name))
            .filter(|e| e["state"] == "ready")
            .map(|e| e["pid"].as_u64().map(|p| p as u32));
        if let Some(pid) = ready {
            return Ok(pid);
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "{name} was not ready within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The floor: a server that only answers `POST /v1/events` as the daemon does (`201` and an
/// event id), on the same HTTP stack as the daemon (axum over hyper) with the same two-worker
/// runtime, on its own threads. Stopped when dropped.
#[derive(Debug)]
pub struct Floor {
    pub socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Floor {
    pub fn start(dir: &Path) -> anyhow::Result<Floor> {
        let socket = dir.join("floor.sock");
        let _ = std::fs::remove_file(&socket);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("the floor's runtime")?;
        let listener = {
            let _guard = rt.enter();
            tokio::net::UnixListener::bind(&socket)
                .with_context(|| format!("binding {}", socket.display()))?
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bench-floor".into())
            .spawn(move || {
                rt.block_on(async move {
                    let app = axum::Router::new().route(
                        "/v1/events",
                        axum::routing::post(|body: axum::body::Bytes| async move {
                            (
                                axum::http::StatusCode::CREATED,
                                axum::Json(json!({ "event_id": body.len(), "duplicate": false })),
                            )
                        }),
                    );
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                });
            })
            .context("the floor's thread")?;
        Ok(Floor {
            socket,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The clients have closed their connections by now, so the graceful stop ends at once.
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A sample's value in the Prometheus text `text`: the line that starts with `series` (the
/// family's name and its labels as the daemon writes them, e.g.
/// `conduit_latency_quantile_seconds{measure="writer_wait",quantile="0.99"}`).
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// A quantile the daemon exports in `conduit_latency_quantile_seconds`, in milliseconds; `None`
/// from a daemon that does not export it (a build before it did).
pub fn quantile_ms(text: &str, measure: &str, q: &str) -> Option<f64> {
    metric(
        text,
        &format!("conduit_latency_quantile_seconds{{measure=\"{measure}\",quantile=\"{q}\"}}"),
    )
    .map(|s| s * 1e3)
}

/// The `p`-quantile of `sorted` (nearest rank); 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// One closed-loop run: acknowledgements per second and their latency.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Closed {
    pub events_per_s: f64,
    pub ack_p50_ms: f64,
    pub ack_p99_ms: f64,
}

/// The fixed-rate run.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Fixed {
    pub offered_per_s: f64,
    pub ack_p99_ms: f64,
    pub ack_to_route_p50_ms: Option<f64>,
    pub ack_to_route_p99_ms: Option<f64>,
    pub writer_wait_p99_ms: Option<f64>,
    pub writer_hold_p99_ms: Option<f64>,
}

/// The list latency without and with pushing clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Reads {
    pub list_p99_ms_idle: f64,
    pub list_p99_ms_pushing: f64,
}

/// The figures the results file's fixed keys hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Results {
    /// By client count, in [`CLIENTS`]'s order.
    pub clients: Vec<(usize, Closed)>,
    pub fixed_rate: Fixed,
    pub reads: Reads,
}

impl Results {
    /// The results file: the fixed keys, then `extra` (each of its keys beside them).
    pub fn to_json(&self, extra: serde_json::Map<String, Value>) -> Value {
        let clients: serde_json::Map<String, Value> = self
            .clients
            .iter()
            .map(|(n, c)| (n.to_string(), json!(c)))
            .collect();
        let mut out = serde_json::Map::new();
        out.insert("clients".into(), Value::Object(clients));
        out.insert("fixed_rate".into(), json!(self.fixed_rate));
        out.insert("reads".into(), json!(self.reads));
        for (k, v) in extra {
            out.entry(k).or_insert(v);
        }
        Value::Object(out)
    }
}

/// Whether `v` has the results file's fixed keys, each a number (the fixed-rate figures read
/// from the daemon's metrics may be `null` for a build that does not export them). Says what
/// is missing.
pub fn check_shape(v: &Value) -> Result<(), String> {
    let num = |v: &Value, at: &str, nullable: bool| -> Result<(), String> {
        match v {
            Value::Number(_) => Ok(()),
            Value::Null if nullable => Ok(()),
            other => Err(format!("{at} is {other}, not a number")),
        }
    };
    for n in CLIENTS {
        let c = &v["clients"][n.to_string()];
        for k in ["events_per_s", "ack_p50_ms", "ack_p99_ms"] {
            num(&c[k], &format!("clients.{n}.{k}"), false)?;
        }
    }
    let f = &v["fixed_rate"];
    num(&f["offered_per_s"], "fixed_rate.offered_per_s", false)?;
    num(&f["ack_p99_ms"], "fixed_rate.ack_p99_ms", false)?;
    for k in [
        "ack_to_route_p50_ms",
        "ack_to_route_p99_ms",
        "writer_wait_p99_ms",
        "writer_hold_p99_ms",
    ] {
        num(&f[k], &format!("fixed_rate.{k}"), true)?;
        if f.get(k).is_none() {
            return Err(format!("fixed_rate.{k} is missing"));
        }
    }
    for k in ["list_p99_ms_idle", "list_p99_ms_pushing"] {
        num(&v["reads"][k], &format!("reads.{k}"), false)?;
    }
    Ok(())
}

/// A pause between requests of a paced client, or none.
pub fn pace(per_s: f64) -> Option<Duration> {
    (per_s > 0.0).then(|| Duration::from_secs_f64(1.0 / per_s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_gives_its_status_and_length() {
        let head = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\nContent-Length: 33";
        assert_eq!(parse_head(head).unwrap(), (201, 33));
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked").is_err());
    }

    #[test]
    fn a_series_is_found_by_its_whole_name_and_labels() {
        let text = "# TYPE x gauge\nconduit_latency_quantile_seconds{measure=\"writer_wait\",quantile=\"0.99\"} 0.0042\nconduit_latency_quantile_seconds{measure=\"writer_wait\",quantile=\"0.999\"} 1\nconduit_events_unrouted 7\n";
        assert_eq!(quantile_ms(text, "writer_wait", "0.99"), Some(4.2));
        assert_eq!(quantile_ms(text, "writer_hold", "0.99"), None);
        assert_eq!(metric(text, "conduit_events_unrouted"), Some(7.0));
        assert_eq!(metric(text, "conduit_events"), None);
    }

    #[test]
    fn the_results_have_their_fixed_keys_and_extras_beside_them() {
        let r = Results {
            clients: CLIENTS.iter().map(|&n| (n, Closed::default())).collect(),
            fixed_rate: Fixed::default(),
            reads: Reads::default(),
        };
        let mut extra = serde_json::Map::new();
        extra.insert("floor".into(), json!({}));
        extra.insert("reads".into(), json!("not this"));
        let v = r.to_json(extra);
        check_shape(&v).unwrap();
        assert!(v["floor"].is_object());
        assert!(
            v["reads"].is_object(),
            "an extra never replaces a fixed key"
        );
        let mut broken = v.clone();
        broken["clients"]["8"]
            .as_object_mut()
            .unwrap()
            .remove("ack_p99_ms");
        assert_eq!(
            check_shape(&broken).unwrap_err(),
            "clients.8.ack_p99_ms is null, not a number"
        );
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
