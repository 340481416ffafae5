//! One round of the workload against one transport: what is timed, and how CPU is counted.
//!
//! A transport is a way to start an extension child and talk to it ([`Transport`], [`Conn`]);
//! [`round`] drives both transports through the same sequence, so that whatever one is
//! charged the other is charged too:
//!
//! | figure | timed from | to | CPU per operation counts |
//! |---|---|---|---|
//! | cold start | spawn | handshake answered | host from spawn to ready + child's run time at ready |
//! | warm restart | SIGKILL of a ready child | a new child's handshake answered | host + the killed child's exit + the new child's run time at ready |
//! | version refusal | spawn of a child speaking another version | refusal seen | host (reap included) + child's run time at refusal |
//! | echo | request | answer | both processes' run time over the timed calls |
//! | callback | the extension's request | the host's answer | both, over the timed callbacks (the host's `callback` calls included) |
//! | pipelined | first call | last answer, 64 in flight | both, per call |
//! | artifact | host's `artifact` call | stored, digest checked | both, per MiB |
//! | cancellation | host starts cancelling | extension's handler sees it (`CLOCK_MONOTONIC` both sides) | both, per cancel (its follow-up query included) |
//! | crash | SIGKILL with a call pending | the pending call fails | host + the killed child's exit |
//!
//! Run time of a live process comes from `schedstat` (`measure::proc_cpu`), of a reaped one
//! from `getrusage(RUSAGE_CHILDREN)`; both are the kernel's exact per-thread accounting.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use conduit_bench::measure::{CpuMark, PairMark, new_histogram, proc_cpu, quantile_us, record};
use conduit_bench::ordered::Ordered;
use serde::Serialize;
use tokio::io::AsyncReadExt;

/// How long a child gets to start, and any one phase of a round to finish.
pub(crate) const PHASE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one round runs, per transport.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Config {
    pub(crate) rounds: usize,
    /// Untimed echo calls before the timed ones (and before the floor's round trips).
    pub(crate) warmup: u64,
    /// Timed sequential echo calls (and floor round trips).
    pub(crate) calls: u64,
    /// Timed callbacks.
    pub(crate) callbacks: u32,
    /// Timed pipelined calls (and floor messages).
    pub(crate) pipelined: u64,
    /// Calls in flight at once when pipelining.
    pub(crate) in_flight: usize,
    /// Cold starts, warm restarts, refusals and crashes (and floor spawns and kills).
    pub(crate) starts: usize,
    /// Cancellations.
    pub(crate) cancels: usize,
    /// Timed artifact transfers (after one untimed), and floor transfers.
    pub(crate) artifacts: usize,
    pub(crate) artifact_bytes: u64,
    pub(crate) chunk_bytes: usize,
}

/// A way to run the workload's extension.
pub(crate) trait Transport {
    type Conn: Conn;

    /// The key in tables and JSON.
    fn key(&self) -> &'static str;

    /// Spawn the child and complete the handshake.
    async fn start(&mut self) -> anyhow::Result<Self::Conn>;

    /// Spawn a child that speaks another protocol version and time it to the refusal; return
    /// that time and the child's run time when the refusal was seen. The child is reaped.
    async fn refused(&mut self) -> anyhow::Result<(Duration, Duration)>;
}

/// A ready extension child.
pub(crate) trait Conn: Sized {
    fn pid(&self) -> u32;
    /// One echo of the 64-byte payload, checked.
    async fn echo(&mut self) -> anyhow::Result<()>;
    /// Ask the extension for `n` callbacks; their round trips as it timed them, in ns.
    async fn callbacks(&mut self, n: u32) -> anyhow::Result<Vec<u64>>;
    /// `calls` echo calls with `in_flight` outstanding at once.
    async fn pipelined(&mut self, calls: u64, in_flight: usize) -> anyhow::Result<()>;
    /// Have the extension stream an artifact; checks what the host stored. `json_chunks`: by
    /// the transport's second path (JSON-RPC's `artifact.chunk` calls beside its bulk pipe).
    async fn artifact(
        &mut self,
        bytes: u64,
        chunk_bytes: usize,
        json_chunks: bool,
    ) -> anyhow::Result<()>;
    /// Whether [`Conn::artifact`] has a second path to measure.
    fn has_json_chunks(&self) -> bool {
        false
    }
    /// Start a `sleep`, cancel it as soon as it says it runs; from the start of the
    /// cancellation to the extension seeing it.
    async fn cancel(&mut self) -> anyhow::Result<Duration>;
    /// SIGKILL the child as soon as a pending `sleep` says it runs; time until the call fails.
    /// Reaps the child.
    async fn crash(self) -> anyhow::Result<Duration>;
    /// SIGKILL the child and reap it.
    async fn kill(self) -> anyhow::Result<()>;
    /// Close the child's stdin, wait for it to exit cleanly, reap it.
    async fn close(self) -> anyhow::Result<()>;
}

/// One round's figures, in the order they are measured.
pub(crate) type Figures = Ordered<f64>;

fn self_cpu() -> anyhow::Result<Duration> {
    proc_cpu(std::process::id()).context("reading this process's schedstat")
}

fn median_us(v: &mut [Duration]) -> f64 {
    v.sort();
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2].as_nanos() as f64 / 1000.0,
        n => (v[n / 2 - 1] + v[n / 2]).as_nanos() as f64 / 2000.0,
    }
}

fn per_op_us(cpu: Duration, ops: u64) -> f64 {
    cpu.as_nanos() as f64 / 1000.0 / ops.max(1) as f64
}

async fn phase<T>(
    what: &str,
    fut: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(PHASE_TIMEOUT, fut)
        .await
        .with_context(|| format!("{what} did not finish within {PHASE_TIMEOUT:?}"))?
        .with_context(|| what.to_owned())
}

/// Run one round of the workload against `t`.
pub(crate) async fn round<T: Transport>(t: &mut T, cfg: &Config) -> anyhow::Result<Figures> {
    let mut f = Figures::default();
    let k = cfg.starts.max(1);

    // Cold start: spawn to handshake done.
    phase("cold start", async {
        let mut times = Vec::with_capacity(k);
        let mut cpu = Duration::ZERO;
        for _ in 0..k {
            let host0 = self_cpu()?;
            let start = Instant::now();
            let conn = t.start().await?;
            times.push(start.elapsed());
            let child = proc_cpu(conn.pid()).unwrap_or_default();
            cpu += self_cpu()?.saturating_sub(host0) + child;
            conn.close().await?;
        }
        f.push("cold_start_us", median_us(&mut times));
        f.push("cold_start_cpu_us", per_op_us(cpu, k as u64));
        Ok(())
    })
    .await?;

    // Warm restart: SIGKILL a ready child, start another, until it is ready.
    phase("warm restart", async {
        let mut times = Vec::with_capacity(k);
        let mut cpu = Duration::ZERO;
        let mut conn = t.start().await?;
        for _ in 0..k {
            let child0 = proc_cpu(conn.pid()).unwrap_or_default();
            let host0 = self_cpu()?;
            let mark = CpuMark::now()?;
            let start = Instant::now();
            conn.kill().await?;
            let next = t.start().await?;
            times.push(start.elapsed());
            let new_child = proc_cpu(next.pid()).unwrap_or_default();
            let killed = mark.elapsed()?.child;
            cpu += self_cpu()?.saturating_sub(host0) + killed.saturating_sub(child0) + new_child;
            conn = next;
        }
        conn.close().await?;
        f.push("warm_restart_us", median_us(&mut times));
        f.push("warm_restart_cpu_us", per_op_us(cpu, k as u64));
        Ok(())
    })
    .await?;

    // Version-mismatch refusal.
    phase("version refusal", async {
        let mut times = Vec::with_capacity(k);
        let mut cpu = Duration::ZERO;
        for _ in 0..k {
            let host0 = self_cpu()?;
            let (took, child) = t.refused().await?;
            times.push(took);
            cpu += self_cpu()?.saturating_sub(host0) + child;
        }
        f.push("version_refusal_us", median_us(&mut times));
        f.push("version_refusal_cpu_us", per_op_us(cpu, k as u64));
        Ok(())
    })
    .await?;

    // The per-call figures, all on one child.
    let mut conn = phase("start", t.start()).await?;
    let pid = conn.pid();

    phase("echo", async {
        for _ in 0..cfg.warmup {
            conn.echo().await?;
        }
        let mut hist = new_histogram();
        let mark = PairMark::now(pid)?;
        for _ in 0..cfg.calls {
            let start = Instant::now();
            conn.echo().await?;
            record(&mut hist, start.elapsed());
        }
        let (host, child) = mark.elapsed(pid)?;
        f.push("echo_p50_us", quantile_us(&hist, 0.50));
        f.push("echo_p99_us", quantile_us(&hist, 0.99));
        f.push("echo_cpu_us", per_op_us(host + child, cfg.calls));
        f.push("echo_host_cpu_us", per_op_us(host, cfg.calls));
        f.push("echo_child_cpu_us", per_op_us(child, cfg.calls));
        Ok(())
    })
    .await?;

    phase("callback", async {
        const BATCH: u32 = 100;
        conn.callbacks(BATCH.min(cfg.callbacks.max(1))).await?;
        let mut hist = new_histogram();
        let mut made = 0u32;
        let mark = PairMark::now(pid)?;
        while made < cfg.callbacks {
            let n = BATCH.min(cfg.callbacks - made);
            let nanos = conn.callbacks(n).await?;
            ensure!(
                nanos.len() == n as usize,
                "asked for {n} callbacks, got {}",
                nanos.len()
            );
            for ns in nanos {
                record(&mut hist, Duration::from_nanos(ns));
            }
            made += n;
        }
        let (host, child) = mark.elapsed(pid)?;
        f.push("callback_p50_us", quantile_us(&hist, 0.50));
        f.push("callback_p99_us", quantile_us(&hist, 0.99));
        f.push("callback_cpu_us", per_op_us(host + child, made as u64));
        Ok(())
    })
    .await?;

    phase("pipelined echo", async {
        conn.pipelined(
            (cfg.pipelined / 10).max(cfg.in_flight as u64),
            cfg.in_flight,
        )
        .await?;
        let mark = PairMark::now(pid)?;
        let start = Instant::now();
        conn.pipelined(cfg.pipelined, cfg.in_flight).await?;
        let wall = start.elapsed();
        let (host, child) = mark.elapsed(pid)?;
        f.push(
            "pipelined_calls_s",
            cfg.pipelined as f64 / wall.as_secs_f64().max(1e-9),
        );
        f.push("pipelined_cpu_us", per_op_us(host + child, cfg.pipelined));
        f.push("pipelined_host_cpu_us", per_op_us(host, cfg.pipelined));
        f.push("pipelined_child_cpu_us", per_op_us(child, cfg.pipelined));
        Ok(())
    })
    .await?;

    phase("artifact", async {
        // The first transfer also makes the child build its 16 MiB of content.
        conn.artifact(cfg.artifact_bytes, cfg.chunk_bytes, false)
            .await?;
        let paths: &[(&str, bool)] = if conn.has_json_chunks() {
            &[("artifact", false), ("artifact_json", true)]
        } else {
            &[("artifact", false)]
        };
        for &(key, json_chunks) in paths {
            let mut rates = Vec::with_capacity(cfg.artifacts);
            let (mut host_cpu, mut child_cpu) = (Duration::ZERO, Duration::ZERO);
            for _ in 0..cfg.artifacts.max(1) {
                let mark = PairMark::now(pid)?;
                let start = Instant::now();
                conn.artifact(cfg.artifact_bytes, cfg.chunk_bytes, json_chunks)
                    .await?;
                let wall = start.elapsed();
                let (host, child) = mark.elapsed(pid)?;
                host_cpu += host;
                child_cpu += child;
                rates.push(cfg.artifact_bytes as f64 / 1048576.0 / wall.as_secs_f64().max(1e-9));
            }
            let mib = cfg.artifact_bytes as f64 / 1048576.0 * rates.len() as f64;
            rates.sort_by(f64::total_cmp);
            f.push(format!("{key}_mib_s"), rates[rates.len() / 2]);
            let per_mib = |d: Duration| d.as_nanos() as f64 / 1000.0 / mib.max(1e-9);
            f.push(
                format!("{key}_cpu_us_per_mib"),
                per_mib(host_cpu + child_cpu),
            );
            f.push(format!("{key}_host_cpu_us_per_mib"), per_mib(host_cpu));
            f.push(format!("{key}_child_cpu_us_per_mib"), per_mib(child_cpu));
        }
        Ok(())
    })
    .await?;

    phase("cancellation", async {
        let n = cfg.cancels.max(1);
        let mut times = Vec::with_capacity(n);
        let mark = PairMark::now(pid)?;
        for _ in 0..n {
            times.push(conn.cancel().await?);
        }
        let (host, child) = mark.elapsed(pid)?;
        f.push("cancel_seen_us", median_us(&mut times));
        f.push("cancel_cpu_us", per_op_us(host + child, n as u64));
        Ok(())
    })
    .await?;

    phase("close", conn.close()).await?;

    // Crash: SIGKILL with a call pending, until the call fails.
    phase("crash", async {
        let mut times = Vec::with_capacity(k);
        let mut cpu = Duration::ZERO;
        for _ in 0..k {
            let conn = t.start().await?;
            let child0 = proc_cpu(conn.pid()).unwrap_or_default();
            let host0 = self_cpu()?;
            let mark = CpuMark::now()?;
            times.push(conn.crash().await?);
            let killed = mark.elapsed()?.child;
            cpu += self_cpu()?.saturating_sub(host0) + killed.saturating_sub(child0);
        }
        f.push("crash_detected_us", median_us(&mut times));
        f.push("crash_cpu_us", per_op_us(cpu, k as u64));
        Ok(())
    })
    .await?;

    Ok(f)
}

/// The last few KiB a child wrote to stderr, kept for error messages.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tail(Arc<Mutex<VecDeque<u8>>>);

impl Tail {
    const KEEP: usize = 4096;

    /// Read `stderr` to its end in a task, keeping its last bytes.
    pub(crate) fn drain(mut stderr: tokio::process::ChildStderr) -> Tail {
        let tail = Tail::default();
        let keep = tail.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut t = keep.0.lock().unwrap_or_else(|p| p.into_inner());
                t.extend(&buf[..n]);
                let excess = t.len().saturating_sub(Tail::KEEP);
                t.drain(..excess);
            }
        });
        tail
    }

    /// What was kept, as text.
    pub(crate) fn text(&self) -> String {
        let t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&t.iter().copied().collect::<Vec<_>>()).into_owned()
    }
}

/// Wait for `child` to exit after its stdin closed; it must exit cleanly.
pub(crate) async fn reap_clean(
    child: &mut tokio::process::Child,
    what: &str,
    tail: &Tail,
) -> anyhow::Result<()> {
    match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
        Ok(status) => {
            let status = status.with_context(|| format!("waiting for {what}"))?;
            ensure!(
                status.success(),
                "{what} exited with {status}; its stderr ended with:\n{}",
                tail.text()
            );
            Ok(())
        }
        Err(_) => {
            let _ = child.kill().await;
            anyhow::bail!("{what} did not exit after its stdin closed")
        }
    }
}

/// SIGKILL `child` and reap it.
pub(crate) async fn kill_and_reap(child: &mut tokio::process::Child) -> anyhow::Result<()> {
    child.start_kill().context("SIGKILL")?;
    child.wait().await.context("reaping a killed child")?;
    Ok(())
}
