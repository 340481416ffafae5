//! One round of this machine's floors (`conduit_bench::floor`), run against the minimal
//! `proto-floor-child` with the same payload, counts, pipelining and placement as the
//! transports' round beside it.
//!
//! Besides the floors proper, each round times what separates a transport's lifecycle figures
//! from them without being the transport's doing: the same minimal spawn forced through
//! `fork` (the supervisor's spawn forks; see `floor::spawn_first_byte_forked`), and SIGKILL →
//! EOF of the two extension children themselves after their handshake (a process with a
//! runtime and a larger binary takes longer to exit than the minimal child, and that part of
//! "crash detected" is the kernel's).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use conduit_bench::floor;
use conduit_bench::measure::{CpuMark, quantile_us};
use conduit_bench::prototype::PAYLOAD;
use conduit_bench::regime::Cpus;

use crate::transport::{Config, Figures};

/// The three children.
#[derive(Debug, Clone)]
pub(crate) struct Programs {
    pub(crate) floor: std::path::PathBuf,
    pub(crate) jsonrpc: std::path::PathBuf,
    pub(crate) grpc: std::path::PathBuf,
}

fn per_op_us(cpu: Duration, ops: u64) -> f64 {
    cpu.as_nanos() as f64 / 1000.0 / ops.max(1) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn us(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

/// Measure every floor once.
pub(crate) fn round(
    programs: &Programs,
    sockets: &Path,
    cfg: &Config,
    cpus: Cpus,
) -> anyhow::Result<Figures> {
    let cmd = |role: &str| {
        let mut c = Command::new(&programs.floor);
        c.arg(role);
        c
    };
    let mut f = Figures::default();

    let pp = floor::ping_pong(&mut cmd("lines"), cpus, cfg.warmup, cfg.calls, PAYLOAD)?;
    f.push("pipe_rtt_p50_us", quantile_us(&pp.hist, 0.50));
    f.push("pipe_rtt_p99_us", quantile_us(&pp.hist, 0.99));
    let (host, child) = pp.timed_cpu;
    f.push("pipe_cpu_us", per_op_us(host + child, cfg.calls));

    let p = floor::pipelined(
        &mut cmd("lines"),
        cpus,
        (cfg.pipelined / 10).max(cfg.in_flight as u64),
        cfg.pipelined,
        cfg.in_flight,
        PAYLOAD,
    )?;
    f.push("pipe_msgs_s", p.per_second());
    f.push("pipe_msgs_cpu_us", per_op_us(p.cpu.0 + p.cpu.1, p.messages));

    let transfers = floor::throughput(
        &mut cmd("blast"),
        cpus,
        cfg.artifact_bytes,
        cfg.artifacts.max(1),
    )?;
    let cpu: Duration = transfers.iter().map(|t| t.cpu.0 + t.cpu.1).sum();
    let mib = cfg.artifact_bytes as f64 / 1048576.0 * transfers.len() as f64;
    f.push(
        "pipe_mib_s",
        median(transfers.iter().map(floor::Transfer::mib_per_s).collect()),
    );
    f.push(
        "pipe_cpu_us_per_mib",
        cpu.as_nanos() as f64 / 1000.0 / mib.max(1e-9),
    );

    let k = cfg.starts.max(1);
    let mark = CpuMark::now()?;
    let mut spawns = Vec::with_capacity(k);
    for _ in 0..k {
        spawns.push(us(floor::spawn_first_byte(&mut cmd("first-byte"), cpus)?));
    }
    let cpu = mark.elapsed()?.total();
    f.push("spawn_us", median(spawns));
    f.push("spawn_cpu_us", per_op_us(cpu, k as u64));
    let mut spawns = Vec::with_capacity(k);
    for _ in 0..k {
        spawns.push(us(floor::spawn_first_byte_forked(
            &mut cmd("first-byte"),
            cpus,
        )?));
    }
    f.push("spawn_fork_us", median(spawns));

    let mut kills = Vec::with_capacity(k);
    for _ in 0..k {
        kills.push(us(floor::kill_to_eof(&mut cmd("hang"), cpus, None)?));
    }
    f.push("kill_to_eof_us", median(kills));

    // The extension children's own exit, after their handshake.
    let init = concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":"#,
        r#"{"protocol_versions":[1],"host":{"name":"conduit","version":"0"}}}"#,
        "\n"
    );
    let mut kills = Vec::with_capacity(k);
    for _ in 0..k {
        let mut c = Command::new(&programs.jsonrpc);
        // Its log lines are of no interest here.
        c.stderr(Stdio::null());
        kills.push(us(floor::kill_to_eof(&mut c, cpus, Some(init.as_bytes()))?));
    }
    f.push("kill_to_eof_jsonrpc_child_us", median(kills));
    let mut kills = Vec::with_capacity(k);
    for i in 0..k {
        let socket = sockets.join(format!("floor-{i}.sock"));
        let mut c = Command::new(&programs.grpc);
        // It announces itself once it listens; nobody connects, and it never calls back.
        c.arg("--socket")
            .arg(&socket)
            .arg("--host-socket")
            .arg(sockets.join("nobody.sock"));
        kills.push(us(floor::kill_to_eof(&mut c, cpus, None)?));
        let _ = std::fs::remove_file(&socket);
    }
    f.push("kill_to_eof_grpc_child_us", median(kills));
    Ok(f)
}
