//! What a handle knows of its extension's life beyond the status: the commands its actor
//! takes ([`Cmd`]), and the facts of starting on demand, stopping when idle and being replaced
//! ([`Life`]): when it was last called, whether a need was sent, whether its run is being
//! stopped for idleness, whether a new version is replacing it, and who keeps it awake.
//!
//! Plain atomics and the few rules that read them; `extension.rs` decides with them under its
//! own locks.
//!
//! Invariant: nothing here blocks or awaits.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::status::StopRequest;

/// What the actor is asked to do, by the handle and the registry.
pub(crate) enum Cmd {
    /// End the current run as the request says, then start again at once.
    Restart(StopRequest),
    Stop,
    /// Something needs the extension (why, for its status): start it if it is idle.
    Demand(String),
}

/// The lifecycle facts of one handle.
#[derive(Debug)]
pub(crate) struct Life {
    /// When a call to it or a callback from it last began or ended, in ms since `born`.
    last_call_ms: AtomicU64,
    born: Instant,
    /// A demand was sent to the idle actor and not yet taken up: one is enough.
    demanded: AtomicBool,
    /// The current run was closed for idleness and is being stopped: calls that find no peer
    /// now wait for a need to start it again (they are not failures of a running extension).
    idling: AtomicBool,
    /// A newer version is being started beside this one: a failed run of this one is not
    /// restarted (its files may already be the new version's).
    retiring: AtomicBool,
    /// Holders of an `Awake` guard: while any lives, the run is not stopped for idleness.
    awake: AtomicUsize,
}

impl Default for Life {
    fn default() -> Self {
        Life {
            last_call_ms: AtomicU64::new(0),
            born: Instant::now(),
            demanded: AtomicBool::new(false),
            idling: AtomicBool::new(false),
            retiring: AtomicBool::new(false),
            awake: AtomicUsize::new(0),
        }
    }
}

impl Life {
    /// A call began or ended now.
    pub(crate) fn touch(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.last_call_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// When a call last began or ended (or the handle was made).
    pub(crate) fn last_call(&self) -> Instant {
        self.born + Duration::from_millis(self.last_call_ms.load(Ordering::Relaxed))
    }

    /// Mark a need as sent; `false` if one was sent already and not taken up.
    pub(crate) fn send_demand(&self) -> bool {
        !self.demanded.swap(true, Ordering::SeqCst)
    }

    /// Whether a need was sent and not taken up.
    pub(crate) fn demanded(&self) -> bool {
        self.demanded.load(Ordering::SeqCst)
    }

    /// The actor took the need up, or is idle anew: the next need is sent again.
    pub(crate) fn clear_demand(&self) {
        self.demanded.store(false, Ordering::SeqCst);
    }

    pub(crate) fn set_idling(&self, on: bool) {
        self.idling.store(on, Ordering::SeqCst);
    }

    pub(crate) fn idling(&self) -> bool {
        self.idling.load(Ordering::SeqCst)
    }

    pub(crate) fn set_retiring(&self, on: bool) {
        self.retiring.store(on, Ordering::SeqCst);
    }

    pub(crate) fn retiring(&self) -> bool {
        self.retiring.load(Ordering::SeqCst)
    }

    pub(crate) fn wake(&self) {
        self.awake.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn unwake(&self) {
        self.awake.fetch_sub(1, Ordering::SeqCst);
    }

    /// How many keep it awake now.
    pub(crate) fn kept_awake(&self) -> usize {
        self.awake.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_need_is_sent_until_it_is_taken_up() {
        let life = Life::default();
        assert!(life.send_demand());
        assert!(!life.send_demand());
        assert!(life.demanded());
        life.clear_demand();
        assert!(life.send_demand());
    }

    #[test]
    fn the_last_call_only_moves_forward() {
        let life = Life::default();
        let first = life.last_call();
        life.touch();
        assert!(life.last_call() >= first);
        life.wake();
        life.wake();
        life.unwake();
        assert_eq!(life.kept_awake(), 1);
    }
}
