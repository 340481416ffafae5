//! The rules of `conduit ext check`: their stable ids, and what they share.
//!
//! Each rule is one async function that returns a [`RuleResult`]; it never panics on what the
//! package does, and every wait in it has a timeout. A failure says what was wrong and, in
//! `fix`, what the author should change, in terms of the protocol (`docs/protocol.md`).
//!
//! The ids are part of the CLI's `--json` output: never rename one; add new rules instead.

pub(crate) mod flow;
pub(crate) mod handshake;
pub(crate) mod lifecycle;
pub(crate) mod lines;
pub(crate) mod methods;
pub(crate) mod shapes;

use std::time::Duration;

use conduit_protocol::{ErrorCode, InitializeResult, RpcError, methods as names};
use conduit_rpc::CallError;
use serde::Serialize;
use serde_json::value::RawValue;

pub(crate) const HANDSHAKE: &str = "handshake";
pub(crate) const VERSION: &str = "version";
pub(crate) const CAPABILITIES_MATCH: &str = "capabilities-match-manifest";
pub(crate) const DECLARED_METHODS: &str = "declared-methods-answer";
pub(crate) const UNKNOWN_METHOD: &str = "unknown-method";
pub(crate) const MALFORMED_LINE: &str = "malformed-line";
pub(crate) const OVERSIZED_LINE: &str = "oversized-line";
pub(crate) const CANCELLATION: &str = "cancellation";
pub(crate) const OVERLOAD: &str = "overload";
pub(crate) const SHUTDOWN: &str = "shutdown";
pub(crate) const STDOUT_ONLY: &str = "stdout-only-protocol";
pub(crate) const NOT_JSON: &str = "not-json";
pub(crate) const BATCH: &str = "batch";
pub(crate) const REQUEST_IDS: &str = "request-ids";
pub(crate) const REPEATED_MEMBERS: &str = "repeated-members";
pub(crate) const METHOD_WITH_RESULT: &str = "method-with-result";
pub(crate) const UNKNOWN_MEMBERS: &str = "unknown-members";
pub(crate) const REFUSAL_ORDER: &str = "refusal-order";
pub(crate) const SHUTTING_DOWN: &str = "shutting-down";
pub(crate) const NOT_INITIALIZED: &str = "not-initialized";
pub(crate) const DUPLICATE_ID: &str = "duplicate-id";
pub(crate) const STDIN_EOF: &str = "stdin-eof";

/// Every rule, in report order, with what it checks.
pub const RULES: &[(&str, &str)] = &[
    (
        HANDSHAKE,
        "answers `initialize` in time with a well-formed result and a version the host offered",
    ),
    (
        VERSION,
        "refuses a host that speaks only version 99 with version_mismatch (-32003) and both lists; agrees with the manifest's `protocol`",
    ),
    (
        CAPABILITIES_MATCH,
        "the handshake declares exactly the manifest's [capabilities]",
    ),
    (
        DECLARED_METHODS,
        "every declared work kind, recurrence, filter, emission, ingress source and method answers a well-formed request",
    ),
    (
        UNKNOWN_METHOD,
        "an unknown method is answered method_not_found (-32601)",
    ),
    (
        MALFORMED_LINE,
        "a line that is not JSON is answered parse_error (-32700) with id null, and the session goes on",
    ),
    (
        NOT_JSON,
        "`NaN`, a byte-order mark and a line of spaces are each answered parse_error (-32700) with id null",
    ),
    (
        BATCH,
        "a batch (a JSON array), `[]` and a bare value are answered invalid_request (-32600) with id null, nothing in them served",
    ),
    (
        REQUEST_IDS,
        "ids `-0`, `1.5`, `1.0`, `1e2`, past signed 64 bits, `true`, `null`, `[1]` are answered invalid_request with id null; the edges of the valid range and string ids are repeated exactly",
    ),
    (
        REPEATED_MEMBERS,
        "a request repeating `id` or `method` at its top level is answered invalid_request with its last id",
    ),
    (
        METHOD_WITH_RESULT,
        "`method` together with `result` or `error` is answered invalid_request with its id",
    ),
    (
        UNKNOWN_MEMBERS,
        "unknown members at the top level and in params are ignored",
    ),
    (
        REFUSAL_ORDER,
        "an unknown method with array params is method_not_found, a second initialize invalid_request, array params of check.sleep invalid_params",
    ),
    (
        OVERSIZED_LINE,
        "a request of 16 MiB + 1 byte is answered message_too_large (-32004), and the session goes on",
    ),
    (
        CANCELLATION,
        "`$/cancel` ends a pending check.sleep with cancelled (-32001) within 1 s",
    ),
    (
        DUPLICATE_ID,
        "a request with the id of a running check.sleep is answered invalid_request at once, and the first goes on",
    ),
    (
        OVERLOAD,
        "with 64 requests held, the 65th is answered overloaded (-32000) with data {\"limit\": 64} at once, and a request reusing a held id invalid_request (an id in use wins)",
    ),
    (
        NOT_INITIALIZED,
        "before the handshake, an unknown method and `shutdown` are answered not_initialized (-32007)",
    ),
    (
        SHUTDOWN,
        "`shutdown` is answered and the process exits with code 0 within 5 s",
    ),
    (
        SHUTTING_DOWN,
        "a request written right after `shutdown` is answered shutting_down (-32008), or left unanswered by a package that exits",
    ),
    (
        STDIN_EOF,
        "when stdin closes, the process exits with code 0 within 5 s",
    ),
    (
        STDOUT_ONLY,
        "everything the package wrote to stdout was a JSON-RPC message",
    ),
    (
        crate::check::readonly::READ_ONLY_FOLDER,
        "starts again from a read-only copy of its folder and writes nothing into it",
    ),
];

/// The section of `docs/protocol.md` a rule enforces.
pub(crate) fn section(id: &str) -> &'static str {
    match id {
        HANDSHAKE => "§4, §4.2",
        VERSION => "§4.3, §16",
        CAPABILITIES_MATCH => "§4.2, §16",
        DECLARED_METHODS => "§6",
        UNKNOWN_METHOD => "§6.8",
        MALFORMED_LINE => "§2",
        NOT_JSON => "§3.3",
        BATCH => "§2, §3.2",
        REQUEST_IDS => "§3.3",
        REPEATED_MEMBERS => "§3.3",
        METHOD_WITH_RESULT => "§3.3",
        UNKNOWN_MEMBERS => "§1.2",
        REFUSAL_ORDER => "§3.4, §3.1",
        OVERSIZED_LINE => "§2",
        CANCELLATION => "§9",
        DUPLICATE_ID => "§3.3",
        OVERLOAD => "§10, §12, §3.4",
        NOT_INITIALIZED => "§4",
        SHUTDOWN => "§5",
        SHUTTING_DOWN => "§5",
        STDIN_EOF => "§5",
        STDOUT_ONLY => "§2",
        crate::check::readonly::READ_ONLY_FOLDER => "§16",
        _ => "",
    }
}

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
        .call_raw(PROBE_METHOD, &raw(&serde_json::json!({})), Some(wait))
        .await
    {
        Ok(_) | Err(CallError::Rpc { .. }) => Ok(()),
        Err(e) => Err(call_failure(&e)),
    }
}

pub(crate) fn ms(d: Duration) -> u128 {
    d.as_millis()
}
