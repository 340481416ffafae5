//! What one workload measured, and how it is summarised.
//!
//! Latencies are HDR histograms in nanoseconds and CPU time is `getrusage` of both processes
//! from just before the spawn to just after the child is reaped (`conduit_bench::measure`).
//! Both include the start and the exit of the child (about a millisecond, 0.1 µs per call
//! over 11,000 calls); the figure is divided by every call made, warm-up included.
//!
//! Context switches come from the same counters: a voluntary one is a thread going to sleep
//! for input, so it counts wake-ups; an involuntary one is a preemption.
//!
//! The machine is shared, so each workload also records how busy the rest of it was: the
//! non-`nice` CPU time `/proc/stat` counted while the workload ran, minus the workload's own.
//! The awake regime's spinners run at nice 19 and their user time is counted apart. A
//! workload measured beside a busy neighbour is not an idle-regime figure. The figure is
//! rough: `/proc/stat` counts in 10 ms ticks, and the kernel's time spent on the spinners'
//! behalf is system time, so a quiet machine reads 0-17%.

use std::time::Duration;

use conduit_bench::measure::{CpuSpent, new_histogram};
use hdrhistogram::Histogram;
use serde::Serialize;

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
            cpu: CpuSpent::default(),
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
