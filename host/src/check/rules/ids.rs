//! The rules' stable ids, the list of them in report order with what each checks ([`RULES`]),
//! and the section of `docs/protocol.md` each enforces.
//!
//! A leaf: the rules, the report and the checker's driver all name rules from here. The ids are
//! part of the CLI's `--json` output: never rename one; add new rules instead.

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
pub(crate) const READ_ONLY_FOLDER: &str = "read-only-folder";

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
        "every declared work kind, recurrence, filter, emission, ingress source and method answers a well-formed request, and every artifact streamed meanwhile is stored (a sha256 at close, if sent, matches the bytes)",
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
        READ_ONLY_FOLDER,
        "starts again from a read-only copy of its folder and writes nothing into it",
    ),
];

/// The section of `docs/protocol.md` a rule enforces.
pub(crate) fn section(id: &str) -> &'static str {
    match id {
        HANDSHAKE => "§4, §4.2",
        VERSION => "§4.3, §16",
        CAPABILITIES_MATCH => "§4.2, §16",
        DECLARED_METHODS => "§6, §8",
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
        READ_ONLY_FOLDER => "§16",
        _ => "",
    }
}
