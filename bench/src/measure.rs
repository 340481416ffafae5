//! Clocks and counters every benchmark here reads: latency histograms, CPU time of the host and
//! of its children, and the median-with-spread a repeated figure is reported as.
//!
//! Latencies go into an HDR histogram in nanoseconds with 3 significant figures: the awake
//! floor is a few µs, where whole microseconds would round by up to 20%; nanoseconds keep every
//! figure to 0.1% and are printed as microseconds.
//!
//! CPU time comes from two sources, both the kernel's exact per-thread run time:
//!
//! - [`CpuMark`]: `getrusage` of this process (`RUSAGE_SELF`) and of its reaped children
//!   (`RUSAGE_CHILDREN`). A child is counted only once it has been waited for, so this suits
//!   figures that span whole child lives (a spawn, a crash, a round of calls from spawn to
//!   reap). Context switches come from the same counters: a voluntary one is a thread going to
//!   sleep for input, so it counts wake-ups; an involuntary one is a preemption.
//! - [`proc_cpu`]: the run time of a live process, the sum of `/proc/<pid>/task/*/schedstat`,
//!   in nanoseconds. It lets a figure count the CPU of just the timed calls of a child that is
//!   still running, leaving its start and exit out. Threads that have already exited are not
//!   in the sum; the children measured here run one thread.
//!
//! Invariant: no other child of this process is reaped between the two ends of a [`CpuMark`]
//! (the awake regime's spinners outlive every measurement of their regime), so the
//! `RUSAGE_CHILDREN` delta is the measured children alone.

use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use nix::sys::resource::{UsageWho, getrusage};
use serde::Serialize;

/// A latency histogram in nanoseconds, from 1 ns to 60 s.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static histogram bounds are valid")
}

/// Record one latency.
pub fn record(hist: &mut Histogram<u64>, took: Duration) {
    let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    hist.saturating_record(ns);
}

/// A histogram's quantile, in microseconds.
pub fn quantile_us(hist: &Histogram<u64>, q: f64) -> f64 {
    hist.value_at_quantile(q) as f64 / 1000.0
}

/// What `getrusage` says of `who` so far.
#[derive(Debug, Clone, Copy)]
struct Usage {
    /// User+sys.
    cpu: Duration,
    sys: Duration,
    /// Times a thread gave up the CPU to wait (each is one sleep, so one wake-up).
    voluntary: u64,
    /// Times a thread was preempted.
    involuntary: u64,
}

fn usage(who: UsageWho) -> anyhow::Result<Usage> {
    let u = getrusage(who).context("getrusage")?;
    let as_dur = |tv: nix::sys::time::TimeVal| {
        Duration::from_secs(tv.tv_sec() as u64) + Duration::from_micros(tv.tv_usec() as u64)
    };
    let sys = as_dur(u.system_time());
    Ok(Usage {
        cpu: as_dur(u.user_time()) + sys,
        sys,
        voluntary: u.voluntary_context_switches().max(0) as u64,
        involuntary: u.involuntary_context_switches().max(0) as u64,
    })
}

/// Non-`nice` busy time of the whole machine so far, from the `cpu` line of `/proc/stat`
/// (user, system, irq, softirq, steal; not nice, idle or iowait).
fn machine_busy() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return Duration::ZERO;
    };
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return Duration::ZERO;
    };
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let field = |i: usize| f.get(i).copied().unwrap_or(0);
    // Fields: user nice system idle iowait irq softirq steal. The unit is the kernel's
    // USER_HZ, 100 on every Linux this runs on.
    let ticks = field(0) + field(2) + field(5) + field(6) + field(7);
    Duration::from_millis(ticks * 10)
}

/// Counters taken before a measurement starts.
#[derive(Debug, Clone, Copy)]
pub struct CpuMark {
    host: Usage,
    children: Usage,
    machine: Duration,
    wall: Instant,
}

/// CPU spent since a mark.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSpent {
    pub host: Duration,
    pub child: Duration,
    /// The kernel's share of `host + child`.
    pub sys: Duration,
    /// Context switches of both processes: (voluntary, involuntary).
    pub switches: (u64, u64),
    /// Non-nice CPU the rest of the machine used meanwhile (10 ms resolution).
    pub others: Duration,
    pub wall: Duration,
}

impl CpuSpent {
    /// Host and children together.
    pub fn total(&self) -> Duration {
        self.host + self.child
    }
}

impl CpuMark {
    pub fn now() -> anyhow::Result<Self> {
        Ok(CpuMark {
            host: usage(UsageWho::RUSAGE_SELF)?,
            children: usage(UsageWho::RUSAGE_CHILDREN)?,
            machine: machine_busy(),
            wall: Instant::now(),
        })
    }

    /// CPU spent since the mark. Call after the children are reaped, or their share is
    /// missing.
    pub fn elapsed(&self) -> anyhow::Result<CpuSpent> {
        let now = CpuMark::now()?;
        let host = now.host.cpu.saturating_sub(self.host.cpu);
        let child = now.children.cpu.saturating_sub(self.children.cpu);
        let machine = now.machine.saturating_sub(self.machine);
        let sys =
            (now.host.sys + now.children.sys).saturating_sub(self.host.sys + self.children.sys);
        let count = |f: fn(&Usage) -> u64| {
            (f(&now.host) + f(&now.children)).saturating_sub(f(&self.host) + f(&self.children))
        };
        Ok(CpuSpent {
            host,
            child,
            sys,
            switches: (count(|u| u.voluntary), count(|u| u.involuntary)),
            others: machine.saturating_sub(host + child),
            wall: now.wall - self.wall,
        })
    }
}

/// CPU time a live process has run so far (every thread it has now), in nanoseconds, from
/// `/proc/<pid>/task/*/schedstat`. `None` when the process is gone or the kernel keeps no
/// such counters.
pub fn proc_cpu(pid: u32) -> Option<Duration> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut ns = 0u64;
    for task in dir.flatten() {
        let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(ns))
}

/// The run time of each live thread of a process, by thread id, from
/// `/proc/<pid>/task/*/schedstat`: a mark to measure a long-lived process (a daemon) against
/// with [`TaskCpu::since`]. `None` when the process is gone.
#[derive(Debug, Clone, Default)]
pub struct TaskCpu(std::collections::HashMap<u32, u64>);

impl TaskCpu {
    pub fn now(pid: u32) -> Option<TaskCpu> {
        let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        let mut map = std::collections::HashMap::new();
        for task in dir.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            // A thread that exits between the listing and the read is left out.
            let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
                continue;
            };
            if let Some(ns) = stat.split_whitespace().next().and_then(|v| v.parse().ok()) {
                map.insert(tid, ns);
            }
        }
        Some(TaskCpu(map))
    }

    /// CPU the process's threads ran since `earlier`: each live thread's growth, a thread
    /// started meanwhile counted whole. A thread that ended meanwhile is missing (its run
    /// time since `earlier` is lost, never subtracted), so this reads low, never high, and
    /// never below zero.
    pub fn since(&self, earlier: &TaskCpu) -> Duration {
        let ns: u64 = self
            .0
            .iter()
            .map(|(tid, now)| now.saturating_sub(earlier.0.get(tid).copied().unwrap_or(0)))
            .sum();
        Duration::from_nanos(ns)
    }
}

/// The CPU of this process and of one live child, read together.
#[derive(Debug, Clone, Copy)]
pub struct PairMark {
    host: Duration,
    child: Duration,
}

impl PairMark {
    /// Now, for this process and `child`.
    pub fn now(child: u32) -> anyhow::Result<PairMark> {
        Ok(PairMark {
            host: proc_cpu(std::process::id()).context("reading this process's schedstat")?,
            child: proc_cpu(child).context("reading the child's schedstat")?,
        })
    }

    /// CPU both spent since the mark: (host, child).
    pub fn elapsed(&self, child: u32) -> anyhow::Result<(Duration, Duration)> {
        let now = PairMark::now(child)?;
        Ok((
            now.host.saturating_sub(self.host),
            now.child.saturating_sub(self.child),
        ))
    }
}

/// A figure measured in several runs: their median and spread.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Every run's value, in the order they ran.
    pub runs: Vec<f64>,
}

impl Spread {
    /// The median of `runs` (the mean of the middle two for an even count) and their range.
    pub fn of(runs: Vec<f64>) -> Spread {
        if runs.is_empty() {
            return Spread::default();
        }
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Spread {
            median,
            min: sorted[0],
            max: sorted[n - 1],
            runs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_middle_pair_s_mean() {
        let s = Spread::of(vec![4.0, 1.0, 3.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 4.0));
        assert_eq!(s.runs, [4.0, 1.0, 3.0, 2.0]);
        assert_eq!(Spread::of(vec![5.0, 1.0, 9.0]).median, 5.0);
        assert_eq!(Spread::of(vec![]).median, 0.0);
    }

    #[test]
    fn this_process_s_run_time_grows_as_it_computes() {
        let me = std::process::id();
        let before = proc_cpu(me).expect("schedstat is readable");
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = proc_cpu(me).unwrap();
        assert!(
            after > before + Duration::from_millis(5),
            "{before:?} {after:?}"
        );
    }
}
