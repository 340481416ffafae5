//! The forker thread: the one thread every extension is forked from (or handed to the spawner
//! from), which lives as long as the process.
//!
//! Two reasons for one thread of its own. The parent-death signal fires when the *thread* that
//! forked a child exits, so children must come from a thread that never does (not a
//! `spawn_blocking` one, which exits when idle). And a fork and exec take milliseconds in a
//! daemon of a thousand extensions: on a runtime worker they stopped every other task on that
//! worker — other extensions' calls, handshakes — for that long.
//!
//! Invariant: every wait on it is bounded ([`FORK_TIMEOUT`]).

use std::io;
use std::time::Duration;

/// The longest [`run`] waits for its turn and its job.
pub(crate) const FORK_TIMEOUT: Duration = Duration::from_secs(30);

type Job = Box<dyn FnOnce() + Send>;

/// The thread's queue; the thread starts with the first job and never exits.
fn queue() -> io::Result<&'static std::sync::mpsc::Sender<Job>> {
    static QUEUE: std::sync::OnceLock<std::sync::mpsc::Sender<Job>> = std::sync::OnceLock::new();
    if let Some(q) = QUEUE.get() {
        return Ok(q);
    }
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let started = std::thread::Builder::new()
        .name("conduit-forker".into())
        .spawn(move || {
            // The queue's sender is static, so this loop ends only with the process.
            while let Ok(job) = rx.recv() {
                job();
            }
        });
    match started {
        // Another job may have started one meanwhile; this one's then ends at once.
        Ok(_) => Ok(QUEUE.get_or_init(|| tx)),
        Err(e) => QUEUE.get().ok_or(e),
    }
}

/// Run `job` on the forker thread, inside the caller's tokio runtime (whose driver then
/// watches what it spawns), and wait for its result. Should the caller stop waiting, the
/// result goes to `abandoned` there instead.
pub(crate) async fn run<T: Send + 'static>(
    job: impl FnOnce() -> io::Result<T> + Send + 'static,
    abandoned: impl FnOnce(T) + Send + 'static,
) -> io::Result<T> {
    let runtime = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _entered = runtime.enter();
        if let Err(Ok(value)) = tx.send(job()) {
            abandoned(value);
        }
    });
    queue()?
        .send(job)
        .map_err(|_| io::Error::other("the thread that starts extensions is gone"))?;
    match tokio::time::timeout(FORK_TIMEOUT, rx).await {
        Ok(Ok(res)) => res,
        Ok(Err(_)) => Err(io::Error::other(
            "the thread that starts extensions dropped the request",
        )),
        Err(_) => Err(io::Error::other(format!(
            "starting the process took longer than {FORK_TIMEOUT:?}"
        ))),
    }
}
