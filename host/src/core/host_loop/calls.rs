//! How the host loop reads a failed call, and the probe that restores a degraded extension.
//!
//! A failed in-transaction call is either answered (an answer that breaks the method's rules
//! still shows the extension responsive), missed or refused (it degrades), or not made
//! (the supervisor deals with a process that is not running): [`answered`] tells which. The
//! probe makes the failed call again off the writer and reports to `health.rs`.
//!
//! [`keep_awake`] keeps a pass's ready extensions from being stopped for idleness while it
//! may call them.
//!
//! Invariant: a probe never runs on the writer, and its answer is thrown away.

use std::collections::BTreeMap;
use std::sync::Arc;

use conduit_protocol::IN_TRANSACTION_DEADLINE;
use conduit_rpc::CallError;
use conduit_supervisor::{Awake, ExtCallError, Extension, now_ms};

use crate::core::health::ProbeCall;
use crate::core::shared::Core;

/// A failed call, for the log and the extension's status: an error answer says how it is read
/// (docs/protocol.md §12), so a -32000 without `data.limit` — what many JSON-RPC libraries
/// answer for any handler exception — is not mistaken for an overload.
pub fn failure_text(e: &ExtCallError) -> String {
    use conduit_protocol::ErrorClass;
    match e {
        ExtCallError::Call {
            source: CallError::Rpc { .. },
            ..
        } => match e.class() {
            ErrorClass::Overloaded => format!("{e} (overloaded: the extension is busy)"),
            ErrorClass::Permanent if e.is(conduit_protocol::ErrorCode::Overloaded) => format!(
                "{e} (a server error: -32000 without data.limit is not `overloaded`, and not retryable)"
            ),
            _ => e.to_string(),
        },
        _ => e.to_string(),
    }
}

/// Whether a failed call was answered (`Some(true)`: an answer that breaks the method's rules
/// still shows the extension responsive), missed or refused (`Some(false)`: it degrades), or
/// could not be made or finish because the extension is not running (`None`: the supervisor
/// deals with that).
pub(super) fn answered(e: &ExtCallError) -> Option<bool> {
    match e {
        ExtCallError::Call { source, .. } => match source {
            CallError::BadResult { .. } | CallError::TooLarge { .. } => Some(true),
            CallError::Rpc { .. } | CallError::DeadlineExceeded { .. } => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// One probe of a degraded extension, off the writer: the call it failed, made again with the
/// same deadline, its answer thrown away. Any answer in time restores it. Its write callbacks
/// are refused meanwhile, as they would be during the real call.
pub(super) async fn probe_once(core: Arc<Core>, ext: Extension, pid: Option<u32>, call: ProbeCall) {
    let res = {
        let _mark = core.enter_transaction(ext.name());
        ext.call_raw(&call.method, &call.params, Some(IN_TRANSACTION_DEADLINE))
            .await
    };
    let outcome = match &res {
        Err(e @ ExtCallError::Call { source, .. }) => match source {
            CallError::DeadlineExceeded { .. } | CallError::Closed { .. } => Err(e.to_string()),
            _ => Ok(()),
        },
        Err(e) => Err(e.to_string()),
        Ok(_) => Ok(()),
    };
    let (threshold, now) = (core.unresponsive_after(), now_ms());
    let restored = core
        .lock_health()
        .get_mut(ext.name())
        .is_some_and(|h| h.probed(threshold, pid, now, outcome));
    if restored {
        tracing::info!(extension = ext.name(), method = %call.method, "extension answered its probe; its in-transaction calls resume");
        core.nudge();
    }
}

/// Keep every ready extension of a pass (`live`) from being stopped for idleness while the
/// guards live (the pass may call any of them); one whose idle stop has begun already moves to
/// `held`, like an idle one (what needs it starts it again).
pub(super) fn keep_awake<T>(
    live: &mut BTreeMap<String, (Extension, T)>,
    held: &mut BTreeMap<String, (Extension, T)>,
) -> Vec<Awake> {
    let mut awake = Vec::with_capacity(live.len());
    let closing: Vec<String> = live
        .iter()
        .filter_map(|(name, (e, _))| match e.keep_awake() {
            Some(guard) => {
                awake.push(guard);
                None
            }
            None => e.awaits_demand().then(|| name.clone()),
        })
        .collect();
    for name in closing {
        if let Some(v) = live.remove(&name) {
            held.insert(name, v);
        }
    }
    awake
}
