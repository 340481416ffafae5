//! Resting extensions, watched together. A tree that is the extension alone, idle and far from
//! its limits ([`crate::usage::may_rest`]) stops being read from `/proc` by its actor: the actor
//! *parks* it here with its CPU clock's reading taken just before the tree was last read, and
//! waits. One task of the supervisor reads every parked clock each [`SWEEP_INTERVAL`] (one
//! system call each, no `/proc` file) and wakes the actor of each whose clock moved or whose
//! process is gone; the actor then reads the tree at once, as it did before resting. A thousand
//! idle extensions thus cost one pass a second over a thousand clocks, instead of two timers
//! and a few `/proc` reads per extension every few seconds.
//!
//! Why an unmoved clock is enough: every way a tree grows — a fork, a thread, an allocation —
//! takes CPU time of one of its processes, and a resting tree has one process. A resting
//! actor still reads its tree every [`REST_LOOK_EVERY`], for what can change without the
//! process running (pages the kernel maps in for it, such as a collapsed huge page).

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

use crate::tree::CpuClock;

/// How often the parked clocks are read: a resting extension that wakes (forks, allocates,
/// spins) is read from `/proc` within this (and one scheduler tick) of its first CPU time —
/// sooner than the 2 s and 4 s an idle tree's sampling and tracking had backed off to before
/// it could rest. (A clock costs a system call of a microsecond or two: at 250 ms, a thousand
/// of them were half a percent of a CPU.)
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The longest a resting extension goes without a read of its tree (six `/proc` reads: at
/// 30 s, a thousand resting extensions made two hundred a second).
pub const REST_LOOK_EVERY: Duration = Duration::from_secs(300);

/// Whether a parked extension must be woken: its clock moved since `parked_at`, or it cannot
/// be read (the process is gone).
pub fn woken(parked_at: u64, now: Option<u64>) -> bool {
    now != Some(parked_at)
}

struct Parked {
    clock: CpuClock,
    at: u64,
    wake: oneshot::Sender<()>,
}

/// The parked extensions of one supervisor.
#[derive(Default)]
pub(crate) struct Resting {
    parked: Mutex<Vec<Parked>>,
    /// Told when the first one is parked, so the sweep sleeps while there is none.
    parked_one: Notify,
}

impl Resting {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Parked>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Park an extension whose process's clock read `at` just before its tree was found
    /// resting; the receiver completes when the clock moves. Dropping it unparks.
    pub(crate) fn park(&self, clock: CpuClock, at: u64) -> oneshot::Receiver<()> {
        let (wake, rx) = oneshot::channel();
        let mut parked = self.lock();
        parked.push(Parked { clock, at, wake });
        if parked.len() == 1 {
            self.parked_one.notify_one();
        }
        rx
    }

    /// How many are parked now (those unparked since the last pass not counted; during a pass,
    /// only those parked since it began).
    pub(crate) fn count(&self) -> usize {
        self.lock().iter().filter(|p| !p.wake.is_closed()).count()
    }

    /// One pass over the parked clocks: wake each whose clock moved, forget each no one waits
    /// for any more. Returns how many stay parked. The list is taken out for the pass, so an
    /// actor parking meanwhile does not wait for a thousand clocks to be read.
    pub(crate) fn sweep(&self) -> usize {
        let mut parked = std::mem::take(&mut *self.lock());
        let mut i = 0;
        while i < parked.len() {
            let p = &parked[i];
            if p.wake.is_closed() || woken(p.at, p.clock.read()) {
                let _ = parked.swap_remove(i).wake.send(());
            } else {
                i += 1;
            }
        }
        let mut now = self.lock();
        now.append(&mut parked);
        now.len()
    }

    /// The sweep, until `stop`: a pass every [`SWEEP_INTERVAL`] while any extension rests.
    pub(crate) async fn run(&self, stop: tokio_util::sync::CancellationToken) {
        let mut left = 0;
        loop {
            if left == 0 && self.lock().is_empty() {
                tokio::select! {
                    () = self.parked_one.notified() => {}
                    () = stop.cancelled() => return,
                }
            }
            tokio::select! {
                () = tokio::time::sleep(SWEEP_INTERVAL) => {}
                () = stop.cancelled() => return,
            }
            left = self.sweep();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parked_extension_is_woken_when_its_clock_moves_or_its_process_is_gone() {
        assert!(!woken(1_000, Some(1_000)));
        assert!(woken(1_000, Some(1_001)));
        assert!(woken(1_000, None));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_sweep_wakes_the_moved_and_forgets_the_unparked() {
        let r = Resting::default();
        let me = CpuClock::of(std::process::id()).expect("this process's clock");
        let now = me.read().unwrap();
        // This process has run since `now - 1`: woken at the first pass.
        let mut moved = r.park(me, now - 1);
        // Dropped by its actor: forgotten.
        drop(r.park(me, now - 1));
        assert_eq!(r.sweep(), 0);
        assert_eq!(moved.try_recv(), Ok(()));
    }
}
