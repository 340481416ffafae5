//! What an extension's process tree uses now (from `/proc`), and the pure decisions the
//! supervisor takes from it: over the memory or task limit, and the CPU duty cycle.
//!
//! Reading: for each process of the tree, `/proc/<pid>/stat` gives utime + stime (clock
//! ticks), the thread count and the resident set (pages). The tree's use is the sum; shared
//! pages count once per process, as `ps` would show them, so the figure errs on the high side.
//!
//! The CPU share is held by [`CpuBudget`], a token bucket with an injected clock: the tree
//! earns `share` CPU-seconds per second (at most [`BURST`] seconds' worth saved up) and spends
//! what it uses; in debt it is stopped (SIGSTOP to every process of the tree) until the debt is
//! paid, then continued (SIGCONT). Over a few seconds it uses at most its share.
//!
//! Not here: signalling (the supervisor does it), cgroups (see [`crate::cgroup`]).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::limits::{LimitKey, Limits, format_bytes};

/// How often an extension's use is read and its limits enforced while it uses CPU or nears a
/// limit.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// The longest gap between two samples of an idle tree. A tree that uses no CPU can neither
/// allocate nor fork, so reading it less often loses nothing; a thousand idle extensions would
/// otherwise cost the daemon ten thousand `/proc` reads a second.
pub const SAMPLE_INTERVAL_IDLE: Duration = Duration::from_secs(2);

/// The gap to the next sample, after one that found the tree `idle` (no CPU used since the
/// sample before) and using `u`: doubled while idle and under half of its memory and task
/// limits, up to [`SAMPLE_INTERVAL_IDLE`]; back to [`SAMPLE_INTERVAL`] as soon as it is not.
pub fn next_interval(prev: Duration, idle: bool, u: &TreeUse, limits: &Limits) -> Duration {
    let far_from_limits = u.rss_bytes.saturating_mul(2) < limits.memory
        && u64::from(u.tasks) * 2 < u64::from(limits.tasks);
    if idle && far_from_limits {
        (prev * 2).min(SAMPLE_INTERVAL_IDLE)
    } else {
        SAMPLE_INTERVAL
    }
}

/// Whether a tree may *rest* after a sample that found it `idle` and using `u` (and had
/// `recent_share` of a CPU over the last second): watched from then on by its one process's CPU
/// clock alone ([`crate::tree::CpuClock`], read by one shared task every
/// [`crate::rest::SWEEP_INTERVAL`]) instead of sampled from `/proc`, until the clock moves. Only
/// a tree that is the extension alone (a fork takes its CPU time, so no process can join
/// unseen), used no CPU lately, is not held to its CPU share (`throttled`: stopped at this
/// sample or continued by it — a stopped tree's clock stands still however much it owes, and one
/// just continued was idle only because it was stopped) and is under half of its memory and task
/// limits, as for the longest interval of [`next_interval`].
pub fn may_rest(
    idle: bool,
    throttled: bool,
    recent_share: f64,
    u: &TreeUse,
    limits: &Limits,
) -> bool {
    idle && !throttled
        && recent_share == 0.0
        && u.processes == 1
        && u.rss_bytes.saturating_mul(2) < limits.memory
        && u64::from(u.tasks) * 2 < u64::from(limits.tasks)
}

/// The most CPU time an idle extension saves up to spend in one go, in seconds of its share.
pub const BURST: f64 = 0.5;

/// What one process uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcUse {
    pub cpu_ticks: u64,
    pub threads: u32,
    pub rss_pages: u64,
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as u64 } else { 4096 }
}

/// What a whole tree uses now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeUse {
    pub rss_bytes: u64,
    /// CPU time of the live processes, in clock ticks.
    pub cpu_ticks: u64,
    /// Threads of every process (a single-threaded process is one task).
    pub tasks: u32,
    pub processes: u32,
}

/// Sum the use of a tree's processes, each as read from its `stat` with the tree itself (one
/// read of each process's `stat` serves both the tree and its use).
pub fn tree_use(procs: impl IntoIterator<Item = ProcUse>) -> TreeUse {
    let page = page_size();
    let mut u = TreeUse::default();
    for p in procs {
        u.rss_bytes += p.rss_pages * page;
        u.cpu_ticks += p.cpu_ticks;
        u.tasks += p.threads.max(1);
        u.processes += 1;
    }
    u
}

/// What `ext status` shows of current use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Resident memory of the whole tree.
    pub rss_bytes: u64,
    /// CPU used over the last second or so, as a share of one CPU.
    pub cpu: f64,
    /// Processes and threads in the tree.
    pub tasks: u32,
    pub processes: u32,
    /// Whether the tree is stopped now to hold it to its CPU share.
    #[serde(default)]
    pub throttled: bool,
    /// Times it was stopped for its CPU share during this run.
    #[serde(default)]
    pub throttles: u64,
}

/// The limit a tree is over, if any (memory first, then tasks), with the words a status
/// shows: `over its 256 MiB memory limit (used 301 MiB)`.
pub fn over_limit(u: &TreeUse, l: &Limits) -> Option<(LimitKey, String)> {
    if u.rss_bytes > l.memory {
        return Some((
            LimitKey::Memory,
            format!(
                "over its {} memory limit (resident {})",
                format_bytes(l.memory),
                format_bytes(u.rss_bytes)
            ),
        ));
    }
    if u.tasks > l.tasks {
        return Some((
            LimitKey::Tasks,
            format!(
                "over its limit of {} tasks ({} processes and threads)",
                l.tasks, u.tasks
            ),
        ));
    }
    None
}

/// Which limit a stop's reason names, read back from the words [`over_limit`] (and the
/// cgroup's OOM kill in `actor.rs`) write: `memory limit` or `limit of N tasks`.
pub fn limit_named_in(reason: &str) -> Option<LimitKey> {
    if reason.contains("memory limit") {
        Some(LimitKey::Memory)
    } else if reason.contains("tasks") {
        Some(LimitKey::Tasks)
    } else {
        None
    }
}

/// What the duty cycle says to do with the tree now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Duty {
    /// Let it run (continue it if it was stopped).
    Run,
    /// Stop it (it is in debt).
    Stop,
}

/// The CPU share as a token bucket; see the module docs. Pure: fed CPU totals and times.
#[derive(Clone, Debug)]
pub struct CpuBudget {
    share: f64,
    /// Seconds of CPU the tree may still use (negative: its debt).
    balance: f64,
    last: Option<(Instant, f64)>,
    window: std::collections::VecDeque<(Instant, f64)>,
}

impl CpuBudget {
    pub fn new(share: f64) -> Self {
        CpuBudget {
            share,
            balance: share * BURST,
            last: None,
            window: std::collections::VecDeque::new(),
        }
    }

    /// Account for the tree's CPU total (`cpu_secs`, of its live processes) at `now`. A total
    /// that went down (a process ended and took its time with it) counts as no use.
    pub fn step(&mut self, now: Instant, cpu_secs: f64) -> Duty {
        if let Some((t, c)) = self.last {
            let dt = now.saturating_duration_since(t).as_secs_f64();
            let used = (cpu_secs - c).max(0.0);
            self.balance = (self.balance + self.share * dt - used).min(self.share * BURST);
        }
        self.last = Some((now, cpu_secs));
        self.window.push_back((now, cpu_secs));
        while self
            .window
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > Duration::from_secs(1))
        {
            self.window.pop_front();
        }
        if self.balance < 0.0 {
            Duty::Stop
        } else {
            Duty::Run
        }
    }

    /// The share of one CPU used over the last second (from what [`CpuBudget::step`] saw).
    pub fn recent_share(&self) -> f64 {
        let (Some((t0, c0)), Some((t1, c1))) = (self.window.front(), self.window.back()) else {
            return 0.0;
        };
        let dt = t1.saturating_duration_since(*t0).as_secs_f64();
        if dt <= 0.0 {
            0.0
        } else {
            ((c1 - c0).max(0.0) / dt * 100.0).round() / 100.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Limits for the sampling and resting decisions below, and a tree far from them.
    const LIMITS: Limits = Limits {
        memory: 100 << 20,
        cpu: 1.0,
        tasks: 10,
        open_files: 64,
    };
    const CALM: TreeUse = TreeUse {
        rss_bytes: 10 << 20,
        cpu_ticks: 5,
        tasks: 1,
        processes: 1,
    };

    #[test]
    fn a_trees_use_is_the_sum_of_its_processes_and_each_counts_at_least_one_task() {
        let one = ProcUse {
            cpu_ticks: 7,
            threads: 3,
            rss_pages: 2,
        };
        // A process whose thread count read as 0 is still one task.
        let other = ProcUse {
            cpu_ticks: 5,
            threads: 0,
            rss_pages: 1,
        };
        let u = tree_use([one, other]);
        assert_eq!(
            u,
            TreeUse {
                rss_bytes: 3 * page_size(),
                cpu_ticks: 12,
                tasks: 4,
                processes: 2,
            }
        );
        assert_eq!(tree_use([]), TreeUse::default());
    }

    #[test]
    fn an_idle_tree_far_from_its_limits_is_sampled_ever_less_often_and_a_busy_one_at_once() {
        let limits = LIMITS;
        let calm = CALM;
        let mut every = SAMPLE_INTERVAL;
        let mut seen = Vec::new();
        for _ in 0..6 {
            every = next_interval(every, true, &calm, &limits);
            seen.push(every.as_millis());
        }
        assert_eq!(seen, [200, 400, 800, 1600, 2000, 2000]);
        // CPU used since the last sample: back to the short interval at once.
        assert_eq!(next_interval(every, false, &calm, &limits), SAMPLE_INTERVAL);
        // Idle, but at half of a limit (the edge) or past it: the short interval.
        let half_memory = TreeUse {
            rss_bytes: 50 << 20,
            ..calm
        };
        assert_eq!(
            next_interval(every, true, &half_memory, &limits),
            SAMPLE_INTERVAL
        );
        let just_under = TreeUse {
            rss_bytes: (50 << 20) - 1,
            ..calm
        };
        assert_eq!(
            next_interval(SAMPLE_INTERVAL, true, &just_under, &limits).as_millis(),
            200
        );
        let half_tasks = TreeUse { tasks: 5, ..calm };
        assert_eq!(
            next_interval(every, true, &half_tasks, &limits),
            SAMPLE_INTERVAL
        );
    }

    #[test]
    fn only_a_lone_idle_unthrottled_tree_far_from_its_limits_may_rest() {
        let limits = LIMITS;
        let lone = CALM;
        assert!(may_rest(true, false, 0.0, &lone, &limits));
        // CPU used since the last sample, or over the last second.
        assert!(!may_rest(false, false, 0.0, &lone, &limits));
        assert!(!may_rest(true, false, 0.01, &lone, &limits));
        // Stopped for its share: its clock stands still while it owes.
        assert!(!may_rest(true, true, 0.0, &lone, &limits));
        // A descendant could fork unseen by the extension's own clock.
        let two = TreeUse {
            processes: 2,
            tasks: 2,
            ..lone
        };
        assert!(!may_rest(true, false, 0.0, &two, &limits));
        // At half of a limit (the edge), as for the idle interval.
        let half_memory = TreeUse {
            rss_bytes: 50 << 20,
            ..lone
        };
        assert!(!may_rest(true, false, 0.0, &half_memory, &limits));
        let just_under = TreeUse {
            rss_bytes: (50 << 20) - 1,
            ..lone
        };
        assert!(may_rest(true, false, 0.0, &just_under, &limits));
        let half_tasks = TreeUse { tasks: 5, ..lone };
        assert!(!may_rest(true, false, 0.0, &half_tasks, &limits));
    }

    #[test]
    fn a_spinner_is_held_to_its_share_by_the_duty_cycle() {
        // A tree that would use a whole CPU whenever it runs, sampled every 100 ms for 20 s
        // with a share of 0.25: it runs about a quarter of the time.
        let mut b = CpuBudget::new(0.25);
        let t0 = Instant::now();
        let (mut cpu, mut running) = (0.0, true);
        for i in 0..200 {
            if running {
                cpu += 0.1;
            }
            let now = t0 + Duration::from_millis(100 * (i + 1));
            running = b.step(now, cpu) == Duty::Run;
        }
        let share = cpu / 20.0;
        assert!((0.2..=0.3).contains(&share), "share {share}");
    }

    #[test]
    fn an_idle_tree_saves_only_a_short_burst() {
        let mut b = CpuBudget::new(0.5);
        let t0 = Instant::now();
        b.step(t0, 0.0);
        // Idle for a minute, then 0.3 s of CPU in one sample: within the burst, it runs.
        assert_eq!(b.step(t0 + Duration::from_secs(60), 0.0), Duty::Run);
        assert_eq!(b.step(t0 + Duration::from_millis(60_100), 0.3), Duty::Run);
        // Another 0.3 s: past the 0.25 s saved, it is stopped.
        assert_eq!(b.step(t0 + Duration::from_millis(60_200), 0.6), Duty::Stop);
    }

    #[test]
    fn the_first_limit_crossed_is_named_with_its_value() {
        let l = Limits {
            memory: 256 << 20,
            ..Limits::DEFAULT
        };
        let at = TreeUse {
            rss_bytes: 256 << 20,
            tasks: l.tasks,
            ..TreeUse::default()
        };
        assert_eq!(over_limit(&at, &l), None);
        let past = TreeUse {
            rss_bytes: (256 << 20) + 1,
            ..at
        };
        let (k, why) = over_limit(&past, &l).unwrap();
        assert_eq!(k, LimitKey::Memory);
        assert!(why.starts_with("over its 256 MiB memory limit"), "{why}");
        let tasks = TreeUse {
            tasks: l.tasks + 1,
            ..at
        };
        assert_eq!(over_limit(&tasks, &l).unwrap().0, LimitKey::Tasks);
        // The words name the limit again, for whoever reads a recorded stop.
        for u in [past, tasks] {
            let (k, why) = over_limit(&u, &l).unwrap();
            assert_eq!(limit_named_in(&why), Some(k), "{why}");
        }
        assert_eq!(limit_named_in("exit code 3"), None);
    }
}
