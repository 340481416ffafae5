//! Memory a burst freed, given back to the system.
//!
//! The daemon allocates with glibc's malloc, which keeps what is freed in its arenas, resident,
//! for the next allocation, and returns to the system on its own only what lies at the top of
//! a heap: after 64 calls of 600 KiB had ended and their extension was removed, a daemon that
//! held 25 MiB before still held 35–58 MiB, and kept it (docs/perf-log/
//! 2026-12-04-burst-memory.md). `trim` reads the resident size once a second and, once it has
//! moved [`MOVED`] from what the last trim left and is not growing, asks malloc to hand every
//! free page back (`malloc_trim(0)`, a few milliseconds, off the runtime's workers).
//! Nothing is done on a call's path: a call costs what it cost.
//!
//! What it does not do: bound memory (the limits do that: the session's held bytes, the API's
//! body size and connection cap) or free anything in use; it only returns pages malloc already
//! holds free. Elsewhere than Linux with glibc it does nothing (no `malloc_trim`).
//!
//! Invariant: the decision is [`Trimmer::tick`], a pure function of the resident sizes seen;
//! at most one trim a second, none while the resident size is growing, none while it stays
//! where the last trim left it.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often the resident size is read.
pub const EVERY: Duration = Duration::from_secs(1);

/// How far the resident size must have moved, up or down, from what the last trim left before
/// another trim: less is not worth a pass over the arenas. Up: a burst took memory and may
/// have freed it. Down: a burst's memory was freed and part of it went back by itself (large
/// blocks malloc had mapped on their own), the rest still held in the arenas. A daemon whose
/// live memory grew (more extensions) trims once and takes the new size as its mark.
pub const MOVED: u64 = 8 << 20;

/// A rise smaller than this between two reads is not growth (a few pages come and go).
const STILL: u64 = 1 << 20;

/// When to trim, from the resident sizes seen one [`EVERY`] apart.
#[derive(Debug, Clone)]
pub struct Trimmer {
    /// The resident size the last trim left (or the one at the start).
    mark: u64,
    /// The size at the previous read.
    last: u64,
}

impl Trimmer {
    /// Starting from a resident size of `rss` bytes.
    pub fn new(rss: u64) -> Self {
        Trimmer {
            mark: rss,
            last: rss,
        }
    }

    /// Whether to trim now, the resident size being `rss` bytes: moved [`MOVED`] from the
    /// mark, and not growing since the last read (a burst still under way would take the
    /// pages back at once).
    pub fn tick(&mut self, rss: u64) -> bool {
        let growing = rss > self.last + STILL;
        self.last = rss;
        !growing && rss.abs_diff(self.mark) >= MOVED
    }

    /// A trim left the resident size at `rss` bytes: the new mark.
    pub fn trimmed(&mut self, rss: u64) {
        self.mark = rss;
        self.last = rss;
    }
}

/// The process's resident size in bytes, if it can be read.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { nix::libc::sysconf(nix::libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// Give malloc's free pages back to the system; whether any were.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn malloc_trim() -> bool {
    // SAFETY: `malloc_trim` takes each arena's lock itself; it frees nothing in use.
    unsafe { nix::libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn malloc_trim() -> bool {
    false
}

/// Read the resident size every [`EVERY`] and trim when [`Trimmer::tick`] says so, until
/// `stop` is cancelled. Returns at once where there is nothing to trim.
pub async fn trim(stop: CancellationToken) {
    if cfg!(not(all(target_os = "linux", target_env = "gnu"))) {
        return;
    }
    let Some(start) = resident_bytes() else {
        return;
    };
    let mut trimmer = Trimmer::new(start);
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        let Some(rss) = resident_bytes() else {
            continue;
        };
        if !trimmer.tick(rss) {
            continue;
        }
        let t = std::time::Instant::now();
        let Ok(gave) = tokio::task::spawn_blocking(malloc_trim).await else {
            continue;
        };
        let after = resident_bytes().unwrap_or(rss);
        trimmer.trimmed(after);
        tracing::debug!(
            before_mib = rss >> 20,
            after_mib = after >> 20,
            gave,
            took_us = t.elapsed().as_micros() as u64,
            "gave free memory back to the system"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn trims_once_a_burst_has_stopped_growing_then_again_once_its_memory_was_freed() {
        let mut t = Trimmer::new(25 * MIB);
        assert!(!t.tick(25 * MIB), "nothing moved");
        assert!(!t.tick(80 * MIB), "growing: a burst under way");
        assert!(!t.tick(110 * MIB), "still growing");
        assert!(t.tick(110 * MIB), "stopped growing, 85 MiB past the mark");
        t.trimmed(90 * MIB);
        assert!(!t.tick(90 * MIB), "what is left is in use");
        assert!(!t.tick(83 * MIB), "7 MiB down: under MOVED");
        assert!(
            t.tick(45 * MIB),
            "freed: part went back by itself, the rest is held"
        );
        t.trimmed(25 * MIB);
        assert!(!t.tick(25 * MIB));
    }

    #[test]
    fn growth_is_trimmed_once_and_then_taken_as_the_mark() {
        let mut t = Trimmer::new(20 * MIB);
        assert!(!t.tick(27 * MIB), "growing");
        assert!(!t.tick(27 * MIB), "7 MiB past the mark: under MOVED");
        assert!(!t.tick(29 * MIB), "a rise of 2 MiB is growth");
        assert!(t.tick(29 * MIB), "9 MiB past the mark and still");
        t.trimmed(29 * MIB);
        assert!(!t.tick(29 * MIB), "all of it in use: no trim again");
    }

    #[test]
    fn a_rise_under_a_mebibyte_is_not_growth() {
        let mut t = Trimmer::new(20 * MIB);
        assert!(!t.tick(29 * MIB));
        assert!(t.tick(29 * MIB + MIB / 2), "half a MiB more is still");
    }

    #[test]
    fn the_resident_size_reads_as_this_process_uses_it() {
        let rss = resident_bytes().expect("/proc/self/statm reads");
        assert!(rss > MIB, "{rss}");
    }
}
