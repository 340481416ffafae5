//! What the rules share: the probe that tells whether a session still answers, the id of the
//! requests the checker writes itself, and the wording of a call's failure in a report.

use std::time::Duration;

use conduit_protocol::{ErrorCode, InitializeResult, RpcError, methods as names};
use conduit_rpc::{CallError, CallOptions};
use serde::Serialize;
use serde_json::value::RawValue;

/// Why the rules that hold requests open were skipped.
pub(crate) const NEEDS_SLEEP: &str =
    "declare check.sleep to run this rule (capabilities.methods; see docs/protocol.md §6.7)";

/// The method the checker calls to find out whether a session still works; no package serves
/// it, so the answer is `method_not_found`, and any answer at all means "alive".
pub(crate) const PROBE_METHOD: &str = "conduit.check.no-such-method";

/// The id the checker gives requests it writes itself, far from the session's own ids.
pub(crate) const RAW_ID: i64 = 900_000_001;

pub(crate) fn declares_sleep(init: &InitializeResult) -> bool {
    init.capabilities
        .methods
        .iter()
        .any(|m| m == names::host::CHECK_SLEEP)
}

pub(crate) fn raw(v: &impl Serialize) -> Box<RawValue> {
    serde_json::value::to_raw_value(v).expect("the checker's params serialize")
}

/// `overloaded (-32000): already serving 64 requests`.
pub(crate) fn error_text(e: &RpcError) -> String {
    let name = e
        .error_code()
        .map_or_else(|| "error".to_owned(), |c| c.name().to_owned());
    format!("{name} ({}): {}", e.code, e.message)
}

/// A call's failure, for a report: "answered method_not_found (-32601): …", "no answer within
/// 10000 ms", "the session ended".
pub(crate) fn call_failure(e: &CallError) -> String {
    match e {
        CallError::Rpc { error, .. } => format!("answered {}", error_text(error)),
        CallError::DeadlineExceeded { deadline, .. } => {
            format!("gave no answer within {} ms", deadline.as_millis())
        }
        CallError::Closed { .. } => "ended the session before answering".to_owned(),
        CallError::TooLarge { detail, .. } => {
            format!("answered with a message over the cap ({detail})")
        }
        CallError::BadResult { detail, .. } => format!("answered something malformed ({detail})"),
        other => other.to_string(),
    }
}

/// Whether the error carries `code`.
pub(crate) fn rpc_is(e: &CallError, code: ErrorCode) -> bool {
    matches!(e, CallError::Rpc { error, .. } if error.is(code))
}

/// Whether the session still answers: any answer to a probe within `wait` counts.
pub(crate) async fn alive(peer: &conduit_rpc::Peer, wait: Duration) -> Result<(), String> {
    match peer
        .request(
            PROBE_METHOD,
            &raw(&serde_json::json!({})),
            CallOptions::within(Some(wait)),
        )
        .await
    {
        Ok(_) | Err(CallError::Rpc { .. }) => Ok(()),
        Err(e) => Err(call_failure(&e)),
    }
}

pub(crate) fn ms(d: Duration) -> u128 {
    d.as_millis()
}
