//! The supervisor's side of an extension's limits, for one run: the tree sampled from `/proc`
//! every [`crate::usage::SAMPLE_INTERVAL`] while it runs or nears a limit, less often while it
//! is idle (see [`usage::next_interval`]), not at all while it rests (see `rest.rs`), held to
//! its CPU share by SIGSTOP/SIGCONT, and told apart when it is over its memory or task limit
//! (the run then ends as `over-limit`: see `run.rs`). The decisions are pure
//! ([`crate::usage`]); this module gathers the facts and applies them.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use crate::extension::Extension;
use crate::limits::Limits;
use crate::process::Confinement;
use crate::tree;
use crate::usage::{self, CpuBudget, Duty, Usage};

/// How the limits of `c` are enforced, for `ext status`.
pub(crate) fn mechanism(c: &Confinement) -> Cow<'static, str> {
    Cow::Borrowed(if c.cgroup.is_some() {
        "cgroup v2 (memory.max, cpu.max, pids.max) + RLIMIT_NOFILE"
    } else if cfg!(target_os = "linux") {
        "rlimits (RLIMIT_NOFILE, RLIMIT_DATA) + supervisor (tree RSS and tasks from /proc, CPU share by SIGSTOP/SIGCONT)"
    } else {
        "rlimits (RLIMIT_NOFILE, RLIMIT_DATA); no /proc here, so memory, tasks and CPU share are not enforced"
    })
}

/// Send `sig` to every live process of the tree rooted at `pid`.
pub(crate) fn signal_tree(pid: u32, sig: nix::sys::signal::Signal) {
    signal_procs(&tree::tree(pid), sig);
}

/// Send `sig` to each of `procs` (a tree as [`tree::tree`] just read it).
fn signal_procs(procs: &[tree::ProcStat], sig: nix::sys::signal::Signal) {
    for p in procs {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.id.pid as i32), sig);
    }
}

/// The supervisor's side of the limits for one run: samples the tree, holds it to its CPU
/// share, and says when it is over its memory or task limit.
pub(crate) struct Enforcer {
    limits: Limits,
    budget: CpuBudget,
    ticks: f64,
    throttled: bool,
    throttles: u64,
    /// The tree's CPU ticks at the last sample, to tell an idle tree from a busy one.
    last_ticks: Option<u64>,
    every: Duration,
    due: tokio::time::Instant,
    /// What the last sample said of resting ([`usage::may_rest`]).
    may_rest: bool,
}

impl Enforcer {
    pub(crate) fn new(limits: Limits) -> Self {
        Enforcer {
            limits,
            budget: CpuBudget::new(limits.cpu),
            ticks: usage::ticks_per_second() as f64,
            throttled: false,
            throttles: 0,
            last_ticks: None,
            every: usage::SAMPLE_INTERVAL,
            due: tokio::time::Instant::now() + usage::SAMPLE_INTERVAL,
            may_rest: false,
        }
    }

    /// When the next sample is due.
    pub(crate) fn due(&self) -> tokio::time::Instant {
        self.due
    }

    /// Whether the last sample found the tree fit to rest ([`usage::may_rest`]).
    pub(crate) fn may_rest(&self) -> bool {
        self.may_rest
    }

    /// One sample; `Some(why)` when the tree must be stopped for a limit.
    pub(crate) fn sample(&mut self, ext: &Extension, pid: u32) -> Option<String> {
        use nix::sys::signal::Signal;
        let procs = tree::tree(pid);
        let u = usage::tree_use(procs.iter().map(|p| p.usage));
        if let Some((_, why)) = usage::over_limit(&u, &self.limits) {
            return Some(why);
        }
        let idle = self.last_ticks == Some(u.cpu_ticks);
        let was_throttled = self.throttled;
        self.last_ticks = Some(u.cpu_ticks);
        self.every = usage::next_interval(self.every, idle && !self.throttled, &u, &self.limits);
        self.due = tokio::time::Instant::now() + self.every;
        match self
            .budget
            .step(Instant::now(), u.cpu_ticks as f64 / self.ticks)
        {
            Duty::Stop => {
                if !self.throttled {
                    self.throttles += 1;
                }
                self.throttled = true;
                // Every tick: a process forked just before the last SIGSTOP is stopped too.
                signal_procs(&procs, Signal::SIGSTOP);
            }
            Duty::Run if self.throttled => {
                self.throttled = false;
                signal_procs(&procs, Signal::SIGCONT);
            }
            Duty::Run => {}
        }
        let now = Usage {
            rss_bytes: u.rss_bytes,
            cpu: self.budget.recent_share(),
            tasks: u.tasks,
            processes: u.processes,
            throttled: self.throttled,
            throttles: self.throttles,
        };
        // Not in the sample that continues a stopped tree: it was idle only because it was
        // stopped, and resting now would leave it unread for a whole sweep of full-speed CPU
        // (a debt of fifty seconds at a share of 0.02).
        self.may_rest = usage::may_rest(
            idle,
            was_throttled || self.throttled,
            now.cpu,
            &u,
            &self.limits,
        );
        ext.show_usage(now);
        None
    }
}
