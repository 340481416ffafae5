//! The rules about message shapes (docs/protocol.md §2, §3): `not-json`, `batch`,
//! `request-ids`, `repeated-members`, `method-with-result`, `unknown-members` and
//! `refusal-order`.
//!
//! Each writes hand-made lines to the package's stdin (between two of the session's frames)
//! and reads the answers from the stdout log: the session would never send these lines, and it
//! ignores answers with `"id": null` or to ids it never used. No session call is pending while
//! a rule runs, so every answer after a line's mark is the answer to that line.
//!
//! Invariant: one line at a time, each answer waited for within `Ctx::prompt`; each rule ends
//! with a probe request, so "the session goes on" is checked, not assumed.

use conduit_protocol::{ErrorCode, InitializeResult, RequestId};

use super::common::{PROBE_METHOD, RAW_ID, alive, declares_sleep, ms};
use super::ids::{
    BATCH, METHOD_WITH_RESULT, NOT_JSON, REFUSAL_ORDER, REPEATED_MEMBERS, REQUEST_IDS,
    UNKNOWN_MEMBERS,
};
use crate::check::ctx::Ctx;
use crate::check::instance::{Instance, Seen};
use crate::check::report::RuleResult;

/// What a line must be answered with.
#[derive(Clone, Debug)]
pub(crate) enum Expect {
    /// An error with `"id": null` and this code.
    NullId(ErrorCode),
    /// An error with this id and code.
    Error(RequestId, ErrorCode),
    /// A result (not an error) with this id.
    Result(RequestId),
}

impl Expect {
    fn describe(&self) -> String {
        match self {
            Expect::NullId(c) => format!("{} ({}) with id null", c.name(), c.number()),
            Expect::Error(id, c) => format!("{} ({}) with id {id}", c.name(), c.number()),
            Expect::Result(id) => format!("a result with id {id}"),
        }
    }
}

/// One hand-made line and what it must get.
pub(crate) struct Case {
    /// How the report names it: "`-0` as an id".
    pub(crate) what: String,
    /// The line, without its newline.
    pub(crate) line: Vec<u8>,
    pub(crate) expect: Expect,
}

pub(crate) fn case(what: impl Into<String>, line: impl Into<Vec<u8>>, expect: Expect) -> Case {
    Case {
        what: what.into(),
        line: line.into(),
        expect,
    }
}

/// A request for the probe method (which no package serves) with the raw id text `id`.
fn probe_with_id(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{PROBE_METHOD}","params":{{}}}}"#)
}

fn n(i: i64) -> RequestId {
    RequestId::num(RAW_ID + i)
}

/// What the package answered a line with, for a report.
fn seen_text(s: &Seen) -> String {
    match s {
        Seen::NullIdError { code } => format!("an error {code} with id null"),
        Seen::Answer { id, error: Some(c) } => format!("an error {c} with id {id}"),
        Seen::Answer { id, error: None } => format!("a result with id {id}"),
        _ => "something else".into(),
    }
}

fn matches(s: &Seen, e: &Expect) -> bool {
    match (s, e) {
        (Seen::NullIdError { code }, Expect::NullId(c)) => *code == c.number(),
        (
            Seen::Answer {
                id,
                error: Some(code),
            },
            Expect::Error(want, c),
        ) => id == want && *code == c.number(),
        (Seen::Answer { id, error: None }, Expect::Result(want)) => id == want,
        _ => false,
    }
}

/// Write each case's line, wait for its answer, and judge the lot as rule `id`.
pub(crate) async fn run_cases(
    ctx: &Ctx<'_>,
    inst: &mut Instance,
    id: &'static str,
    cases: Vec<Case>,
    fix: &str,
) -> RuleResult {
    let mut problems = Vec::new();
    for c in &cases {
        let mark = inst.stdout.mark();
        let mut line = c.line.clone();
        line.push(b'\n');
        if let Err(e) = inst.write_raw(line, ctx.prompt()).await {
            let state = inst.state_note().await;
            return RuleResult::fail(id, format!("could not write {}: {e}; {state}", c.what), fix);
        }
        let answer = inst
            .stdout
            .wait_for(mark, ctx.prompt(), |s| match s {
                Seen::NullIdError { .. } | Seen::Answer { .. } => Some(s.clone()),
                _ => None,
            })
            .await;
        match answer {
            Some(s) if matches(&s, &c.expect) => {}
            Some(s) => problems.push(format!(
                "answered {} with {} instead of {}",
                c.what,
                seen_text(&s),
                c.expect.describe()
            )),
            None if inst.session_ended() => {
                let state = inst.state_note().await;
                problems.push(format!("ended the session after {}; {state}", c.what));
                break;
            }
            None => problems.push(format!(
                "did not answer {} within {} ms (it must get {})",
                c.what,
                ms(ctx.prompt()),
                c.expect.describe()
            )),
        }
    }
    if problems.is_empty()
        && let Err(why) = alive(&inst.peer(), ctx.prompt()).await
    {
        let state = inst.state_note().await;
        problems.push(format!("after these lines, the package {why}; {state}"));
    }
    if problems.is_empty() {
        let list: Vec<&str> = cases.iter().map(|c| c.what.as_str()).collect();
        RuleResult::pass(id, format!("answered {} as required", list.join(", ")))
    } else {
        RuleResult::fail(id, problems.join("; "), fix)
    }
}

/// `not-json`: `NaN`, a byte-order mark and a line of spaces are parse errors (§3.3).
pub(crate) async fn not_json(ctx: &Ctx<'_>, inst: &mut Instance) -> RuleResult {
    let nan = format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"{PROBE_METHOD}","params":{{"x":NaN}}}}"#,
        RAW_ID + 10
    );
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend_from_slice(probe_with_id(&(RAW_ID + 11).to_string()).as_bytes());
    let cases = vec![
        case(
            "a request holding `NaN`",
            nan,
            Expect::NullId(ErrorCode::ParseError),
        ),
        case(
            "a request after a byte-order mark",
            bom,
            Expect::NullId(ErrorCode::ParseError),
        ),
        case(
            "a line of spaces",
            "   ",
            Expect::NullId(ErrorCode::ParseError),
        ),
    ];
    run_cases(
        ctx,
        inst,
        NOT_JSON,
        cases,
        "parse strictly: `NaN`/`Infinity` and a leading byte-order mark are not JSON, and a line of whitespace is not empty; answer each with parse_error (-32700) and id null (docs/protocol.md §3.3; Python: json.loads(text, parse_constant=…) after decoding with 'utf-8', not 'utf-8-sig')",
    )
    .await
}

/// `batch`: a JSON array is answered `invalid_request` with id null, its requests unserved
/// (§2, §3.2).
pub(crate) async fn batch(ctx: &Ctx<'_>, inst: &mut Instance) -> RuleResult {
    let one = format!("[{}]", probe_with_id(&(RAW_ID + 20).to_string()));
    let cases = vec![
        case(
            "a batch of one request",
            one,
            Expect::NullId(ErrorCode::InvalidRequest),
        ),
        case(
            "an empty batch `[]`",
            "[]",
            Expect::NullId(ErrorCode::InvalidRequest),
        ),
        case(
            "the bare value `7`",
            "7",
            Expect::NullId(ErrorCode::InvalidRequest),
        ),
    ];
    run_cases(
        ctx,
        inst,
        BATCH,
        cases,
        "answer a line holding a JSON array (a batch) or any value that is not an object with invalid_request (-32600) and id null, serving none of its requests (docs/protocol.md §2, §3.2)",
    )
    .await
}

/// `request-ids`: ids that are not valid (`-0`, a fraction, an exponent, past 64 bits, `true`)
/// are answered `invalid_request` with id null; the edges of the valid range are served.
pub(crate) async fn request_ids(ctx: &Ctx<'_>, inst: &mut Instance) -> RuleResult {
    let mut cases: Vec<Case> = [
        "-0",
        "1.5",
        "1.0",
        "1e2",
        "9223372036854775808",
        "-9223372036854775809",
        "true",
        "null",
        "[1]",
    ]
    .iter()
    .map(|id| {
        case(
            format!("the id `{id}`"),
            probe_with_id(id),
            Expect::NullId(ErrorCode::InvalidRequest),
        )
    })
    .collect();
    for (text, id) in [
        ("9223372036854775807", RequestId::num(i64::MAX)),
        ("-9223372036854775808", RequestId::num(i64::MIN)),
        ("\"\"", RequestId::str("")),
        ("\"0\"", RequestId::str("0")),
    ] {
        cases.push(case(
            format!("the valid id `{text}`"),
            probe_with_id(text),
            Expect::Error(id, ErrorCode::MethodNotFound),
        ));
    }
    run_cases(
        ctx,
        inst,
        REQUEST_IDS,
        cases,
        "accept as ids only strings and integers written without fraction or exponent within signed 64 bits, `-0` excluded; answer any other id with invalid_request (-32600) and id null, and repeat a valid id exactly (docs/protocol.md §3.3; JavaScript: read ids from the text, since numbers past 2^53 lose digits)",
    )
    .await
}

/// `repeated-members`: a repeated top-level member is `invalid_request`, with the last id
/// (§3.3).
pub(crate) async fn repeated_members(ctx: &Ctx<'_>, inst: &mut Instance) -> RuleResult {
    let twice_id = format!(
        r#"{{"jsonrpc":"2.0","id":{},"id":{},"method":"{PROBE_METHOD}","params":{{}}}}"#,
        RAW_ID + 30,
        RAW_ID + 31
    );
    let twice_method = format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"{PROBE_METHOD}","method":"{PROBE_METHOD}","params":{{}}}}"#,
        RAW_ID + 32
    );
    let cases = vec![
        case(
            "a request with `id` twice",
            twice_id,
            Expect::Error(n(31), ErrorCode::InvalidRequest),
        ),
        case(
            "a request with `method` twice",
            twice_method,
            Expect::Error(n(32), ErrorCode::InvalidRequest),
        ),
    ];
    run_cases(
        ctx,
        inst,
        REPEATED_MEMBERS,
        cases,
        "refuse a message that repeats jsonrpc, id, method, params, result or error at its top level with invalid_request (-32600) and its last id (docs/protocol.md §3.3; Python: json.loads(..., object_pairs_hook=…) sees the repeats)",
    )
    .await
}

/// `method-with-result`: `method` together with `result` or `error` is a broken request,
/// `invalid_request` with its id (§3.3).
pub(crate) async fn method_with_result(ctx: &Ctx<'_>, inst: &mut Instance) -> RuleResult {
    let with_result = format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"{PROBE_METHOD}","params":{{}},"result":{{}}}}"#,
        RAW_ID + 40
    );
    let with_error = format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"{PROBE_METHOD}","error":{{"code":1,"message":"x"}}}}"#,
        RAW_ID + 41
    );
    let cases = vec![
        case(
            "a request with `result`",
            with_result,
            Expect::Error(n(40), ErrorCode::InvalidRequest),
        ),
        case(
            "a request with `error`",
            with_error,
            Expect::Error(n(41), ErrorCode::InvalidRequest),
        ),
    ];
    run_cases(
        ctx,
        inst,
        METHOD_WITH_RESULT,
        cases,
        "answer a message that has `method` together with `result` or `error` with invalid_request (-32600) and its id, before looking at the method (docs/protocol.md §3.3)",
    )
    .await
}

/// `unknown-members`: members the receiver does not know are ignored, at the top level and in
/// params (§1.2, §13).
pub(crate) async fn unknown_members(
    ctx: &Ctx<'_>,
    inst: &mut Instance,
    init: &InitializeResult,
) -> RuleResult {
    let mut cases = vec![case(
        "a request with an unknown top-level member",
        format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"{PROBE_METHOD}","params":{{}},"conduit_check_extra":{{"a":[1]}}}}"#,
            RAW_ID + 50
        ),
        Expect::Error(n(50), ErrorCode::MethodNotFound),
    )];
    if declares_sleep(init) {
        cases.push(case(
            "check.sleep with an unknown member in its params",
            format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"check.sleep","params":{{"ms":1,"conduit_check_extra":true}},"conduit_check_extra":1}}"#,
                RAW_ID + 51
            ),
            Expect::Result(n(51)),
        ));
        cases.push(case(
            "check.sleep with `_meta` in its params (docs/protocol.md §11)",
            format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"check.sleep","params":{{"_meta":{{"remaining_ms":30000}},"ms":1}}}}"#,
                RAW_ID + 52
            ),
            Expect::Result(n(52)),
        ));
    }
    run_cases(
        ctx,
        inst,
        UNKNOWN_MEMBERS,
        cases,
        "ignore object members you do not know, at the top level of a message and in params (`_meta` included, §11): that is how the protocol grows without a new version (docs/protocol.md §1.2, §13)",
    )
    .await
}

/// `refusal-order`: the refusals of §3.4 that one session can reach, in their order: an unknown
/// method with malformed params is `method_not_found`; a second `initialize` is
/// `invalid_request`; malformed params of a served method are `invalid_params` (§3.1).
pub(crate) async fn refusal_order(
    ctx: &Ctx<'_>,
    inst: &mut Instance,
    init: &InitializeResult,
) -> RuleResult {
    let mut cases = vec![
        case(
            "an unknown method with params `[1,2]`",
            format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"{PROBE_METHOD}","params":[1,2]}}"#,
                RAW_ID + 60
            ),
            Expect::Error(n(60), ErrorCode::MethodNotFound),
        ),
        case(
            "a second `initialize`",
            format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"initialize","params":{}}}"#,
                RAW_ID + 61,
                serde_json::to_string(&conduit_protocol::InitializeParams::current(env!(
                    "CARGO_PKG_VERSION"
                )))
                .expect("initialize params serialize")
            ),
            Expect::Error(n(61), ErrorCode::InvalidRequest),
        ),
    ];
    if declares_sleep(init) {
        cases.push(case(
            "check.sleep with params `[1]`",
            format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"check.sleep","params":[1]}}"#,
                RAW_ID + 62
            ),
            Expect::Error(n(62), ErrorCode::InvalidParams),
        ));
    }
    run_cases(
        ctx,
        inst,
        REFUSAL_ORDER,
        cases,
        "refuse in the order of docs/protocol.md §3.4: an id in use, then overloaded, not_initialized (or invalid_request for a second initialize), shutting_down, method_not_found, and only then invalid_params; params of a protocol method must be an object (§3.1)",
    )
    .await
}
