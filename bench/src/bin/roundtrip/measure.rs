//! What one workload measured, and how it is summarised.
//!
//! Latencies go into an HDR histogram in nanoseconds with 3 significant figures: the awake
//! floor is about 12 µs, where whole microseconds would round by up to 8%; nanoseconds keep
//! every figure to 0.1% and are printed as microseconds.
//!
//! Context switches come from the same counters: a voluntary one is a thread going to sleep
//! for input, so it counts wake-ups; an involuntary one is a preemption.
//!
//! CPU time is user+sys of both processes from just before the spawn to just after the child
//! is reaped: this process's own from `getrusage(RUSAGE_SELF)`, the child's from
//! `getrusage(RUSAGE_CHILDREN)`, which only counts a child once it has been waited for. Both
//! therefore include the start and the exit of the child (about a millisecond, 0.1 µs per call
//! over 11,000 calls); the figure is divided by every call made, warm-up included.
//!
//! The machine is shared, so each workload also records how busy the rest of it was: the
//! non-`nice` CPU time `/proc/stat` counted while the workload ran, minus the workload's own.
//! The awake regime's spinners run at nice 19 and their user time is counted apart. A
//! workload measured beside a busy neighbour is not an idle-regime figure. The figure is
//! rough: `/proc/stat` counts in 10 ms ticks, and the kernel's time spent on the spinners'
//! behalf is system time, so a quiet machine reads 0-17%.
//!
//! Invariant: no other child of this process is reaped while a workload runs (the spinners of
//! the awake regime outlive every workload of their regime), so the `RUSAGE_CHILDREN` delta is
//! the workload's child alone.

use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use nix::sys::resource::{UsageWho, getrusage};
use serde::Serialize;

/// A latency histogram in nanoseconds, from 1 ns to 60 s.
pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static histogram bounds are valid")
}

/// Record one round trip.
pub(crate) fn record(hist: &mut Histogram<u64>, took: Duration) {
    let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    hist.saturating_record(ns);
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

/// Counters taken before a workload starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuMark {
    host: Usage,
    children: Usage,
    machine: Duration,
    wall: Instant,
}

/// CPU spent since a mark.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuSpent {
    pub(crate) host: Duration,
    pub(crate) child: Duration,
    /// The kernel's share of `host + child`.
    pub(crate) sys: Duration,
    /// Context switches of both processes: (voluntary, involuntary).
    pub(crate) switches: (u64, u64),
    /// Non-nice CPU the rest of the machine used meanwhile (10 ms resolution).
    pub(crate) others: Duration,
    pub(crate) wall: Duration,
}

impl CpuMark {
    pub(crate) fn now() -> anyhow::Result<Self> {
        Ok(CpuMark {
            host: usage(UsageWho::RUSAGE_SELF)?,
            children: usage(UsageWho::RUSAGE_CHILDREN)?,
            machine: machine_busy(),
            wall: Instant::now(),
        })
    }

    /// CPU spent since the mark. Call after the child is reaped, or its share is missing.
    pub(crate) fn elapsed(&self) -> anyhow::Result<CpuSpent> {
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

/// What a workload's run hands back: one child's, or several merged.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) hist: Histogram<u64>,
    /// Every call made, warm-up included (the CPU figures cover them all).
    pub(crate) calls_total: u64,
    pub(crate) cpu: CpuSpent,
    /// The p50 of each child's timed calls, in the order they ran.
    pub(crate) p50_by_round: Vec<Duration>,
}

impl Run {
    /// A run that holds nothing yet, to merge rounds into.
    pub(crate) fn empty() -> Run {
        Run {
            hist: new_histogram(),
            calls_total: 0,
            cpu: CpuSpent {
                host: Duration::ZERO,
                child: Duration::ZERO,
                sys: Duration::ZERO,
                switches: (0, 0),
                others: Duration::ZERO,
                wall: Duration::ZERO,
            },
            p50_by_round: Vec::new(),
        }
    }

    /// A run of one child.
    pub(crate) fn one(hist: Histogram<u64>, calls_total: u64, cpu: CpuSpent) -> Run {
        let p50 = Duration::from_nanos(hist.value_at_quantile(0.5));
        Run {
            hist,
            calls_total,
            cpu,
            p50_by_round: vec![p50],
        }
    }

    /// Add another round of the same workload.
    pub(crate) fn merge(&mut self, other: Run) {
        self.hist
            .add(&other.hist)
            .expect("histograms with the same bounds merge");
        self.calls_total += other.calls_total;
        self.cpu.host += other.cpu.host;
        self.cpu.child += other.cpu.child;
        self.cpu.sys += other.cpu.sys;
        self.cpu.switches.0 += other.cpu.switches.0;
        self.cpu.switches.1 += other.cpu.switches.1;
        self.cpu.others += other.cpu.others;
        self.cpu.wall += other.cpu.wall;
        self.p50_by_round.extend(other.p50_by_round);
    }
}

/// One workload's figures, as printed and written to JSON. Times in microseconds.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Summary {
    pub(crate) description: &'static str,
    /// Timed calls, over all rounds.
    pub(crate) calls: u64,
    /// Untimed calls each child served first.
    pub(crate) warmup: u64,
    pub(crate) p50_us: f64,
    pub(crate) p95_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) max_us: f64,
    pub(crate) mean_us: f64,
    /// Each round's p50 (one child each): how much the machine moved during the regime.
    pub(crate) p50_by_round_us: Vec<f64>,
    /// p50 over the floor's p50 in the same regime and run.
    pub(crate) p50_ratio: f64,
    /// p99 over the floor's p99 in the same regime and run.
    pub(crate) p99_ratio: f64,
    /// CPU per round trip, both processes.
    pub(crate) cpu_us_per_call: f64,
    pub(crate) cpu_host_us_per_call: f64,
    pub(crate) cpu_child_us_per_call: f64,
    /// The kernel's share of `cpu_us_per_call`.
    pub(crate) cpu_sys_us_per_call: f64,
    /// Context switches per call, both processes: waits for input (each one a wake-up) ...
    pub(crate) voluntary_switches_per_call: f64,
    /// ... and preemptions.
    pub(crate) involuntary_switches_per_call: f64,
    /// CPU per round trip over the floor's.
    pub(crate) cpu_ratio: f64,
    /// From spawn to reap.
    pub(crate) wall_s: f64,
    /// How busy the rest of the machine was meanwhile, in percent of one CPU (nice excluded).
    pub(crate) others_cpu_pct: f64,
}

impl Summary {
    /// Summarise `run`; `floor` is `None` when `run` is the floor itself.
    pub(crate) fn new(
        description: &'static str,
        warmup: u64,
        run: &Run,
        floor: Option<&Summary>,
    ) -> Summary {
        let us = |ns: u64| ns as f64 / 1000.0;
        let per_call = |d: Duration| d.as_nanos() as f64 / 1000.0 / run.calls_total.max(1) as f64;
        let calls_total = run.calls_total.max(1) as f64;
        let h = &run.hist;
        let mut s = Summary {
            description,
            calls: h.len(),
            warmup,
            p50_us: us(h.value_at_quantile(0.50)),
            p95_us: us(h.value_at_quantile(0.95)),
            p99_us: us(h.value_at_quantile(0.99)),
            max_us: us(h.max()),
            mean_us: h.mean() / 1000.0,
            p50_by_round_us: run
                .p50_by_round
                .iter()
                .map(|d| d.as_nanos() as f64 / 1000.0)
                .collect(),
            p50_ratio: 1.0,
            p99_ratio: 1.0,
            cpu_us_per_call: per_call(run.cpu.host + run.cpu.child),
            cpu_host_us_per_call: per_call(run.cpu.host),
            cpu_child_us_per_call: per_call(run.cpu.child),
            cpu_sys_us_per_call: per_call(run.cpu.sys),
            voluntary_switches_per_call: run.cpu.switches.0 as f64 / calls_total,
            involuntary_switches_per_call: run.cpu.switches.1 as f64 / calls_total,
            cpu_ratio: 1.0,
            wall_s: run.cpu.wall.as_secs_f64(),
            others_cpu_pct: 100.0 * run.cpu.others.as_secs_f64()
                / run.cpu.wall.as_secs_f64().max(1e-9),
        };
        if let Some(f) = floor {
            s.p50_ratio = s.p50_us / f.p50_us;
            s.p99_ratio = s.p99_us / f.p99_us;
            s.cpu_ratio = s.cpu_us_per_call / f.cpu_us_per_call;
        }
        s
    }
}
