//! This machine's floors: what two processes and a pipe cost with nothing of ours in between.
//!
//! Every figure the benchmarks report is set beside one of these, measured in the same regime
//! of the same run, because the absolute numbers move several-fold with the machine's state
//! (docs/performance.md, "Machine") while the ratios carry over.
//!
//! | floor | host side | child side |
//! |---|---|---|
//! | [`ping_pong`] | blocking `write` of a line, blocking `read` of the answer | [`serve_lines`] |
//! | [`pipelined`] | keeps N lines in flight, one `write` per line | [`serve_lines`] |
//! | [`throughput`] | asks for N bytes, reads them in 64 KiB reads | [`blast`] |
//! | [`spawn_first_byte`] | `posix_spawn` (std's `Command`), `read` of one byte | [`first_byte`] |
//! | [`spawn_first_byte_forked`] | the same through `fork` + `exec` | [`first_byte`] |
//! | [`kill_to_eof`] | `SIGKILL`, then a blocking `read` until it returns 0 | [`hang`] (or an extension, to time its own exit) |
//!
//! The child side is plain blocking system calls on std's handles, no runtime, no allocation
//! per message: the least any transport could do. The host side takes a prepared
//! [`Command`] so that each benchmark can run the child roles from its own binary (the round
//! trip re-runs itself; the transport comparison has a minimal `proto-floor-child`), and a
//! [`Cpus`] saying where the child starts.
//!
//! Invariant: every function here reaps the child it spawned before it returns, even on error
//! paths where it can (a child killed on drop is reaped by the caller's next wait).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use hdrhistogram::Histogram;

use crate::measure::{CpuMark, CpuSpent, PairMark, new_histogram, record};
use crate::regime::Cpus;

// ---------------------------------------------------------------------------------------------
// Child side.

/// Give every line back as it came: blocking `read` (buffered), one `write` per line. Returns
/// at stdin EOF.
pub fn serve_lines() -> anyhow::Result<()> {
    let mut input = BufReader::new(std::io::stdin().lock());
    // `Stdout` is line-buffered, but the explicit flush keeps this independent of that.
    let mut output = std::io::stdout().lock();
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        output.write_all(&line)?;
        output.flush()?;
    }
}

/// Write one byte and exit: the least a child can do to say it runs.
pub fn first_byte() -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(b"!")?;
    out.flush()?;
    Ok(())
}

/// For each line `N` read from stdin, write N bytes to stdout in writes of `chunk` bytes.
/// Returns at stdin EOF.
pub fn blast(chunk: usize) -> anyhow::Result<()> {
    let block = vec![0x5au8; chunk.max(1)];
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut output = std::io::stdout().lock();
    let mut line = String::new();
    loop {
        line.clear();
        if input.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut left: usize = line.trim().parse().context("a byte count")?;
        while left > 0 {
            let n = left.min(block.len());
            output.write_all(&block[..n])?;
            left -= n;
        }
        output.flush()?;
    }
}

/// Say so with one line, then wait on stdin until it closes (or the process is killed).
pub fn hang() -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(b"!\n")?;
    out.flush()?;
    drop(out);
    let mut sink = Vec::new();
    std::io::stdin().lock().read_to_end(&mut sink)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Host side.

/// Spawn with stdin and stdout piped; stderr is the caller's choice (inherited by default).
fn spawn_piped(cmd: &mut Command, cpus: Cpus) -> anyhow::Result<Child> {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    cpus.spawn_with(|| cmd.spawn())
        .with_context(|| format!("spawning {:?}", cmd.get_program()))
}

fn reap(mut child: Child, what: &str) -> anyhow::Result<()> {
    drop(child.stdin.take());
    let status = child
        .wait()
        .with_context(|| format!("waiting for {what}"))?;
    ensure!(status.success(), "{what} exited with {status}");
    Ok(())
}

/// Sequential round trips of one line.
#[derive(Debug)]
pub struct PingPong {
    /// The timed round trips, in ns.
    pub hist: Histogram<u64>,
    /// Every round trip made, warm-up included.
    pub calls_total: u64,
    /// From spawn to reap, both processes.
    pub life: CpuSpent,
    /// (host, child) CPU during the timed round trips alone.
    pub timed_cpu: (Duration, Duration),
}

/// Spawn `cmd` (which must play [`serve_lines`]), make `warmup` untimed and `calls` timed
/// round trips of `payload` plus a newline, check every echo, and reap it.
pub fn ping_pong(
    cmd: &mut Command,
    cpus: Cpus,
    warmup: u64,
    calls: u64,
    payload: &str,
) -> anyhow::Result<PingPong> {
    let mark = CpuMark::now()?;
    let mut child = spawn_piped(cmd, cpus)?;
    let pid = child.id();
    let mut stdin = child.stdin.take().context("child stdin")?;
    let mut stdout = BufReader::new(child.stdout.take().context("child stdout")?);
    let line = format!("{payload}\n").into_bytes();
    let mut back = Vec::with_capacity(256);
    let mut hist = new_histogram();
    let mut timed = None;
    for i in 0..warmup + calls {
        if i == warmup {
            timed = Some(PairMark::now(pid)?);
        }
        let start = Instant::now();
        stdin.write_all(&line)?;
        back.clear();
        stdout.read_until(b'\n', &mut back)?;
        let took = start.elapsed();
        ensure!(back == line, "the floor child answered {back:?}");
        if i >= warmup {
            record(&mut hist, took);
        }
    }
    let timed_cpu = match timed {
        Some(m) => m.elapsed(pid)?,
        None => (Duration::ZERO, Duration::ZERO),
    };
    drop(stdin);
    reap(child, "the floor child")?;
    Ok(PingPong {
        hist,
        calls_total: warmup + calls,
        life: mark.elapsed()?,
        timed_cpu,
    })
}

/// A stretch of messages with several in flight.
#[derive(Debug, Clone, Copy)]
pub struct Pipelined {
    pub messages: u64,
    pub wall: Duration,
    /// (host, child) CPU during the timed stretch.
    pub cpu: (Duration, Duration),
}

impl Pipelined {
    pub fn per_second(&self) -> f64 {
        self.messages as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Spawn `cmd` (playing [`serve_lines`]), send `warmup` then `messages` lines of `payload`
/// keeping `in_flight` unanswered at once, one `write` per line; reap it. Only the second
/// stretch is timed.
pub fn pipelined(
    cmd: &mut Command,
    cpus: Cpus,
    warmup: u64,
    messages: u64,
    in_flight: usize,
    payload: &str,
) -> anyhow::Result<Pipelined> {
    let mut child = spawn_piped(cmd, cpus)?;
    let pid = child.id();
    let mut stdin = child.stdin.take().context("child stdin")?;
    let mut stdout = BufReader::new(child.stdout.take().context("child stdout")?);
    let line = format!("{payload}\n").into_bytes();
    // In flight at most `in_flight` lines of ~65 bytes: far below the pipe's 64 KiB, so the
    // writes never block and one thread can do both ends.
    let mut stretch = |n: u64| -> anyhow::Result<()> {
        let mut sent = 0u64;
        let mut got = 0u64;
        let mut back = Vec::with_capacity(256);
        while sent < n.min(in_flight as u64) {
            stdin.write_all(&line)?;
            sent += 1;
        }
        while got < n {
            back.clear();
            if stdout.read_until(b'\n', &mut back)? == 0 {
                bail!("the floor child closed its stdout");
            }
            ensure!(back == line, "the floor child answered {back:?}");
            got += 1;
            if sent < n {
                stdin.write_all(&line)?;
                sent += 1;
            }
        }
        Ok(())
    };
    stretch(warmup)?;
    let mark = PairMark::now(pid)?;
    let start = Instant::now();
    stretch(messages)?;
    let wall = start.elapsed();
    let cpu = mark.elapsed(pid)?;
    drop(stdin);
    reap(child, "the floor child")?;
    Ok(Pipelined {
        messages,
        wall,
        cpu,
    })
}

/// One transfer of a block of bytes.
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    pub bytes: u64,
    pub wall: Duration,
    /// (host, child) CPU during the transfer.
    pub cpu: (Duration, Duration),
}

impl Transfer {
    pub fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / (1024.0 * 1024.0) / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Spawn `cmd` (playing [`blast`] with 64 KiB writes), then `1 + reps` times ask it for
/// `bytes` bytes and read them in 64 KiB reads; the first transfer warms up and is not
/// returned. Each transfer is timed from the request to its last byte.
pub fn throughput(
    cmd: &mut Command,
    cpus: Cpus,
    bytes: u64,
    reps: usize,
) -> anyhow::Result<Vec<Transfer>> {
    let mut child = spawn_piped(cmd, cpus)?;
    let pid = child.id();
    let mut stdin = child.stdin.take().context("child stdin")?;
    let mut stdout = child.stdout.take().context("child stdout")?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let mark = PairMark::now(pid)?;
        let start = Instant::now();
        writeln!(stdin, "{bytes}")?;
        let mut left = bytes;
        while left > 0 {
            let want = (left as usize).min(buf.len());
            let n = stdout.read(&mut buf[..want])?;
            ensure!(n > 0, "the floor child closed its stdout");
            left -= n as u64;
        }
        let wall = start.elapsed();
        let cpu = mark.elapsed(pid)?;
        if rep > 0 {
            out.push(Transfer { bytes, wall, cpu });
        }
    }
    drop(stdin);
    drop(stdout);
    reap(child, "the floor child")?;
    Ok(out)
}

/// Spawn `cmd` (playing [`first_byte`]) with std's `Command` and time it to its first byte on
/// stdout; reap it. The time is the whole of `spawn` (fork or `posix_spawn`, `exec`, the
/// dynamic loader, the runtime's start) and one pipe hop.
pub fn spawn_first_byte(cmd: &mut Command, cpus: Cpus) -> anyhow::Result<Duration> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let start = Instant::now();
    let mut child = cpus
        .spawn_with(|| cmd.spawn())
        .with_context(|| format!("spawning {:?}", cmd.get_program()))?;
    let mut stdout = child.stdout.take().context("child stdout")?;
    let mut one = [0u8; 1];
    stdout.read_exact(&mut one)?;
    let took = start.elapsed();
    drop(stdout);
    reap(child, "the floor child")?;
    Ok(took)
}

/// [`spawn_first_byte`] with a `pre_exec` hook that does nothing: std then spawns with
/// `fork` + `exec` instead of `posix_spawn` (`clone(CLONE_VM | CLONE_VFORK)`), as it must for
/// any hook, and `fork` copies the page tables of the whole parent. The supervisor's spawn has
/// such a hook (for the parent-death signal), so this is the spawn it can get at best.
pub fn spawn_first_byte_forked(cmd: &mut Command, cpus: Cpus) -> anyhow::Result<Duration> {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: the hook runs between fork and exec and does nothing at all.
    unsafe {
        cmd.pre_exec(|| Ok(()));
    }
    spawn_first_byte(cmd, cpus)
}

/// Spawn `cmd`, write `hello` to its stdin (if any), wait for the first line it writes, then
/// time `SIGKILL` to EOF seen on its stdout by a blocking `read`; reap it. The floor is
/// [`hang`], which needs no hello; an extension child is killed the same way once it answered
/// its handshake, to say how long its own exit takes.
pub fn kill_to_eof(
    cmd: &mut Command,
    cpus: Cpus,
    hello: Option<&[u8]>,
) -> anyhow::Result<Duration> {
    let mut child = spawn_piped(cmd, cpus)?;
    if let (Some(hello), Some(stdin)) = (hello, child.stdin.as_mut()) {
        stdin.write_all(hello)?;
    }
    let mut stdout = BufReader::new(child.stdout.take().context("child stdout")?);
    let mut line = Vec::new();
    stdout.read_until(b'\n', &mut line)?;
    ensure!(
        !line.is_empty(),
        "the child wrote nothing before it was killed"
    );
    let start = Instant::now();
    child.kill().context("SIGKILL")?;
    let mut rest = [0u8; 64];
    loop {
        if stdout.read(&mut rest)? == 0 {
            break;
        }
    }
    let took = start.elapsed();
    // Killed on purpose: its exit status is a signal, not a failure.
    drop(child.stdin.take());
    child.wait().context("reaping the killed floor child")?;
    Ok(took)
}
