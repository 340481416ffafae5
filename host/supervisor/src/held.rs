//! A run that is not retried by itself: the extension shown `refused`, `incompatible` or (a
//! development install that failed) `stopped`, with its cause and no process, until an operator
//! restarts or stops it. The actor (`actor.rs`) holds it here.
//!
//! What this does not do: start anything; a need (`Cmd::Demand`) is passed over, since only an
//! operator or the author's next change can cure what held it.
//!
//! Invariant: the wait ends on a restart, a stop, or the shutdown, and on nothing else.

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::extension::Extension;
use crate::life::Cmd;
use crate::status::{State, now_ms};

/// Show `state` and why, with no process, until the operator restarts or stops the
/// extension: a start that was refused or is incompatible is not retried by itself.
pub(crate) async fn hold(
    ext: &Extension,
    state: State,
    why: String,
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    shutdown: &CancellationToken,
) -> Cmd {
    ext.update(|s| {
        s.state = state;
        s.failing_since_ms.get_or_insert_with(now_ms);
        s.last_error = Some(why);
        s.next_start_at_ms = None;
        s.backoff_ms = None;
        s.pid = None;
        s.spawn_to_ready_ms = None;
        s.handshake_ms = None;
    });
    wait_for_operator(cmds, shutdown).await
}

/// Wait for an operator's restart or stop (or the shutdown), passing every need over.
async fn wait_for_operator(
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    shutdown: &CancellationToken,
) -> Cmd {
    loop {
        tokio::select! {
            cmd = cmds.recv() => match cmd {
                // A need does not start what only an operator can cure.
                Some(Cmd::Demand(_)) => continue,
                cmd => return cmd.unwrap_or(Cmd::Stop),
            },
            () = shutdown.cancelled() => return Cmd::Stop,
        }
    }
}
