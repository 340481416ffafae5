//! Ingress polls: each pass starts an `ingress.poll` of every declared ingress source that is
//! due, and the poll's events and new cursor are written in one transaction when it answers.
//!
//! Polls are not in-transaction calls: they run as tasks on the runtime (deadline 30 s), off
//! the writer, so a slow source never holds a pass. Whether a source is polled now is a pure
//! decision over its [`PollState`](super::poll::PollState) and an injected `now`
//! ([`PollState::due`](super::poll::PollState::due), in `poll.rs`); this module only gathers the
//! facts and starts the task.
//!
//! Invariant: at most one poll of an (extension, source) is outstanding, and polls of it begin
//! at most once per [`INGRESS_INTERVAL`](super::INGRESS_INTERVAL).

use std::sync::Arc;
use std::time::Instant;

use conduit_protocol::Capabilities;
use conduit_supervisor::Extension;

use crate::core::ops::IngressCursor;
use crate::core::shared::Core;

/// The most events one poll may return.
pub const INGRESS_LIMIT: u32 = 100;

/// Start a poll of each due ingress source of the ready extensions.
pub(crate) fn start_polls<'a>(
    core: &Arc<Core>,
    rt: &tokio::runtime::Handle,
    exts: impl IntoIterator<Item = (&'a String, &'a (Extension, Arc<Capabilities>))>,
) {
    for (name, (ext, caps)) in exts {
        let status = ext.run_brief();
        if status.state != conduit_supervisor::State::Ready {
            continue;
        }
        for source in &caps.ingress {
            let key = (name.clone(), source.clone());
            {
                let mut polls = core.polls.lock().unwrap_or_else(|p| p.into_inner());
                let st = polls.entry(key.clone()).or_default();
                let now = Instant::now();
                if !st.due(now, status.pid) {
                    continue;
                }
                st.begin(now);
            }
            let (c, ext, pid) = (core.clone(), ext.clone(), status.pid);
            core.tasks.spawn_on(poll_once(c, ext, key, pid), rt);
        }
    }
}

/// One `ingress.poll`: its events and new cursor are committed together.
async fn poll_once(core: Arc<Core>, ext: Extension, key: (String, String), pid: Option<u32>) {
    use conduit_protocol::calls::IngressPollParams;
    use conduit_protocol::methods::IngressPoll;
    let (name, source) = key.clone();
    let (n, s) = (name.clone(), source.clone());
    let cursor = core
        .read(move |r| r.ingress_cursor(&n, &s))
        .await
        .ok()
        .flatten();
    let params = IngressPollParams::new(source.clone(), INGRESS_LIMIT).with_cursor(cursor.clone());
    let res = ext
        .call::<IngressPoll>(&params, Some(conduit_protocol::DEFAULT_CALL_DEADLINE))
        .await;
    let mut declined = false;
    match res {
        Ok(r) if r.check(INGRESS_LIMIT).is_err() => {
            tracing::warn!(extension = %name, %source, got = r.events.len(), "ingress.poll returned more events than its limit; nothing accepted");
        }
        Ok(r) => {
            let events: Vec<_> = r
                .events
                .into_iter()
                .filter(|e| match crate::core::callbacks::check_polled_event(&source, e) {
                    Ok(()) => true,
                    Err(err) => {
                        tracing::warn!(extension = %name, %source, error = %err.message, "skipped a polled event");
                        false
                    }
                })
                .collect();
            let moved = r.cursor.is_some() && r.cursor != cursor;
            if !events.is_empty() || moved {
                // The events and the new cursor are written together; the loop is nudged
                // unless every event was one it had already.
                let cursor = r.cursor.map(|cursor| IngressCursor {
                    extension: name.clone(),
                    cursor,
                });
                if let Err(e) = core.accept_events(source.clone(), events, cursor).await {
                    tracing::error!(extension = %name, %source, error = %e, "cannot store polled events")
                }
            }
        }
        Err(e) if e.is(conduit_protocol::ErrorCode::MethodNotFound) => declined = true,
        Err(e) => {
            tracing::warn!(extension = %name, %source, error = %e, "ingress.poll failed; the cursor stays")
        }
    }
    let mut polls = core.polls.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(st) = polls.get_mut(&key) {
        st.end(declined, pid);
    }
}
