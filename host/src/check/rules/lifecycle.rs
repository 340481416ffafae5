//! The rules of a session's life, on an instance of their own (`lifecycle`): `not-initialized`
//! before its handshake, `duplicate-id` after it, and `stdin-eof` at its end.
//!
//! Invariant: every request a rule leaves running is cancelled, or ends with the instance (its
//! stdin is closed and the group killed at the end); each wait has a timeout.

use std::time::{Duration, Instant};

use conduit_protocol::{ErrorCode, InitializeResult, RequestId, SHUTDOWN_GRACE};

use super::common::{NEEDS_SLEEP, PROBE_METHOD, RAW_ID, declares_sleep, ms};
use super::ids::{DUPLICATE_ID, NOT_INITIALIZED, STDIN_EOF};
use super::shapes::{Expect, case, run_cases};
use crate::check::ctx::Ctx;
use crate::check::instance::{Instance, Seen, describe_exit};
use crate::check::report::RuleResult;

/// `not-initialized`: before the handshake, a request other than `initialize` (`shutdown`
/// included) is answered `not_initialized` (§4, §3.4); the handshake then still works.
pub(crate) async fn not_initialized(ctx: &Ctx<'_>, inst: &mut Instance) -> RuleResult {
    let id = |i| RequestId::num(RAW_ID + i);
    let cases = vec![
        case(
            "an unknown method before `initialize`",
            format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"{PROBE_METHOD}","params":{{}}}}"#,
                RAW_ID + 70
            ),
            Expect::Error(id(70), ErrorCode::NotInitialized),
        ),
        case(
            "`shutdown` before `initialize`",
            format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"shutdown","params":{{}}}}"#,
                RAW_ID + 71
            ),
            Expect::Error(id(71), ErrorCode::NotInitialized),
        ),
    ];
    run_cases(
        ctx,
        inst,
        NOT_INITIALIZED,
        cases,
        "before answering `initialize`, answer every other request (`shutdown` and unknown methods included) with not_initialized (-32007), and keep waiting for `initialize` (docs/protocol.md §4, §3.4)",
    )
    .await
}

/// How long the first request of `duplicate-id` is held.
const HOLD_MS: u64 = 1000;

/// `duplicate-id`: a request whose id is that of a running request is answered
/// `invalid_request` at once with that id, and the running one goes on (§3.3, §3.4 step 2).
pub(crate) async fn duplicate_id(
    ctx: &Ctx<'_>,
    inst: &mut Instance,
    init: &InitializeResult,
) -> RuleResult {
    if !declares_sleep(init) {
        return RuleResult::skip(DUPLICATE_ID, NEEDS_SLEEP);
    }
    let fix = "keep the ids of running requests; answer a request whose id is still running with invalid_request (-32600) and that id at once, without running it, and let the first go on (docs/protocol.md §3.3, §3.4)";
    let rid = RAW_ID + 80;
    let hold = format!(
        r#"{{"jsonrpc":"2.0","id":{rid},"method":"check.sleep","params":{{"ms":{HOLD_MS}}}}}"#
    );
    let again =
        format!(r#"{{"jsonrpc":"2.0","id":{rid},"method":"check.sleep","params":{{"ms":1}}}}"#);
    let mark = inst.stdout.mark();
    let mut lines = hold.into_bytes();
    lines.push(b'\n');
    if let Err(e) = inst.write_raw(lines, ctx.prompt()).await {
        return RuleResult::fail(
            DUPLICATE_ID,
            format!("could not write check.sleep: {e}"),
            fix,
        );
    }
    // Give the first request time to start before its id comes again.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let res = run_cases(
        ctx,
        inst,
        DUPLICATE_ID,
        vec![case(
            format!("a second request with id {rid} while check.sleep {rid} runs"),
            again,
            Expect::Error(RequestId::num(rid), ErrorCode::InvalidRequest),
        )],
        fix,
    )
    .await;
    let after = inst.stdout.mark();
    let answers: Vec<Seen> = inst
        .stdout
        .snapshot()
        .into_iter()
        .skip(mark)
        .filter(|s| matches!(s, Seen::Answer { id, .. } if *id == RequestId::num(rid)))
        .collect();
    if res.status != crate::check::report::Status::Pass {
        return res;
    }
    if answers.len() != 1 {
        return RuleResult::fail(
            DUPLICATE_ID,
            format!(
                "answered id {rid} {} times before the first check.sleep ({HOLD_MS} ms) could have finished",
                answers.len()
            ),
            fix,
        );
    }
    // The first request must go on: its result comes when its time is up.
    let got = inst
        .stdout
        .wait_for(
            after,
            ctx.prompt() + Duration::from_millis(HOLD_MS),
            |s| match s {
                Seen::Answer { id, error } if *id == RequestId::num(rid) => Some(*error),
                _ => None,
            },
        )
        .await;
    match got {
        Some(None) => RuleResult::pass(
            DUPLICATE_ID,
            format!(
                "refused a second request with id {rid} with invalid_request while the first ran on to its result"
            ),
        ),
        Some(Some(c)) => RuleResult::fail(
            DUPLICATE_ID,
            format!(
                "refused the second request with id {rid}, but the first then answered error {c} instead of its result: the refusal disturbed it"
            ),
            fix,
        ),
        None => RuleResult::fail(
            DUPLICATE_ID,
            format!(
                "refused the second request with id {rid}, but the first (check.sleep {HOLD_MS} ms) gave no result within {} ms: the refusal lost it",
                ms(ctx.prompt()) + u128::from(HOLD_MS)
            ),
            fix,
        ),
    }
}

/// `stdin-eof`: when its stdin closes, the extension exits with code 0 within the grace period
/// (§5), abandoning what it serves.
pub(crate) async fn stdin_eof(_ctx: &Ctx<'_>, inst: &mut Instance) -> RuleResult {
    let t0 = Instant::now();
    inst.close_session();
    match inst.exit_status(SHUTDOWN_GRACE).await {
        Some(s) if s.success() => RuleResult::pass(
            STDIN_EOF,
            format!(
                "exited with code 0 {} ms after its stdin closed",
                ms(t0.elapsed())
            ),
        ),
        Some(s) => RuleResult::fail(
            STDIN_EOF,
            format!("exited with {} when its stdin closed", describe_exit(&s)),
            "exit with code 0 when stdin reaches end of file: it means the same as `shutdown` (docs/protocol.md §5)",
        ),
        None => RuleResult::fail(
            STDIN_EOF,
            format!(
                "was still running {} ms after its stdin closed",
                ms(SHUTDOWN_GRACE)
            ),
            "on end of file on stdin, exit with code 0 promptly (within 5 s), abandoning running requests and without waiting for answers to your own callbacks (docs/protocol.md §5)",
        ),
    }
}
