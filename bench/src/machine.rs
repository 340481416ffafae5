//! Where a benchmark ran: the commit, the build profile and the machine, for result files; how
//! busy the rest of the machine was meanwhile; and writing a result file.
//!
//! Everything is read from `git` and `/proc` at the moment of asking; what cannot be read is
//! `"unknown"` (or zero), never an error, since a figure without its context is still a figure.

use std::process::{Command, Stdio};

use serde::Serialize;

/// The machine a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub os: &'static str,
    pub arch: &'static str,
    pub cpus: usize,
    pub cpu_model: String,
    pub kernel: String,
    /// `/proc/loadavg` when the run started: a busy neighbour shows here.
    pub loadavg: String,
}

impl Machine {
    /// This machine, now.
    pub fn this() -> Machine {
        Machine {
            os: std::env::consts::OS,
            arch: std::env::consts::ARCH,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: cpu_model(),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            loadavg: read_trimmed("/proc/loadavg"),
        }
    }
}

/// `release` or `debug`, as this crate was built.
pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// The short commit of the working tree, with `-dirty` when it has uncommitted changes.
pub fn commit() -> String {
    let run = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let Some(commit) = run(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    let dirty = run(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// CPU time counters at one moment: the whole machine's non-`nice` busy time and that of
/// some processes, in the kernel's ticks, with the machine's total time for scale.
///
/// Two samples say how much CPU the *rest* of the machine used in between ([`others_busy`]):
/// a neighbour's build makes an idle-regime figure meaningless, and a result should say so.
/// `nice` time is left out on purpose: the awake regime's busy loops run at nice 19.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSample {
    busy: u64,
    total: u64,
    procs: u64,
}

impl CpuSample {
    /// Now, counting `pids` as ours. A counter that cannot be read counts as zero.
    pub fn now(pids: &[u32]) -> CpuSample {
        let (busy, total) = machine_ticks().unwrap_or_default();
        let procs = pids.iter().filter_map(|&p| process_ticks(p)).sum();
        CpuSample { busy, total, procs }
    }
}

/// How much of one CPU the rest of the machine kept busy between two samples, in percent
/// (0 to 100 × CPUs), leaving out the sampled processes and `nice` time.
pub fn others_busy(before: CpuSample, after: CpuSample, cpus: usize) -> f64 {
    let total = after.total.saturating_sub(before.total);
    if total == 0 {
        return 0.0;
    }
    let busy = after.busy.saturating_sub(before.busy);
    let ours = after.procs.saturating_sub(before.procs);
    busy.saturating_sub(ours) as f64 / total as f64 * cpus as f64 * 100.0
}

/// The `cpu` line of `/proc/stat`: (user + system + irq + softirq + steal, every field).
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    // user nice system idle iowait irq softirq steal guest guest_nice; guest time is already
    // inside user, so only the first eight add up to the total.
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    if f.len() < 8 {
        return None;
    }
    let busy = f[0] + f[2] + f[5] + f[6] + f[7];
    Some((busy, f.iter().sum()))
}

/// utime + stime of one process, from `/proc/<pid>/stat`.
fn process_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; the fields after its
    // closing parenthesis are plain. utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Write a result file: pretty JSON and a newline, its folder made first.
pub fn write_results(path: &std::path::Path, results: &impl Serialize) -> anyhow::Result<()> {
    use anyhow::Context;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut text = serde_json::to_string_pretty(results)?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_cpu_is_counted_and_left_out() {
        let me = [std::process::id()];
        let before = CpuSample::now(&me);
        // Burn some CPU of our own.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = CpuSample::now(&me);
        assert!(after.procs > before.procs, "{before:?} {after:?}");
        assert!(after.total > before.total);
        let others = others_busy(before, after, 2);
        assert!((0.0..=200.0).contains(&others), "{others}");
    }
}
