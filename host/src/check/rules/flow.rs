//! The rules about requests over time: `cancellation`, `overload`, `shutdown` and
//! `shutting-down`.
//!
//! The first two hold requests open with `check.sleep` (docs/protocol.md §6.7), so they run
//! only when the package declares it. `overload` runs on an instance of its own (see
//! `check::overload`), so that 64 held requests — which a package that ignores `$/cancel`
//! would keep for 10 s — cannot disturb the other rules.
//!
//! Invariant: every request these rules leave open is cancelled or given up within bounded
//! time; each wait has a timeout derived from the protocol's numbers.

use std::time::{Duration, Instant};

use conduit_protocol::calls::SleepParams;
use conduit_protocol::methods::host::{CHECK_SLEEP, SHUTDOWN};
use conduit_protocol::{
    ErrorCode, InitializeResult, MAX_CONCURRENT_REQUESTS, RequestId, SHUTDOWN_GRACE,
};
use conduit_rpc::{CallError, CallOptions};
use tokio_util::sync::CancellationToken;

use super::common::{
    NEEDS_SLEEP, PROBE_METHOD, RAW_ID, call_failure, declares_sleep, error_text, ms, raw, rpc_is,
};
use super::ids::{CANCELLATION, OVERLOAD, SHUTDOWN as SHUTDOWN_RULE, SHUTTING_DOWN};
use super::shapes::{Expect, case, run_cases};
use crate::check::ctx::Ctx;
use crate::check::instance::{Instance, Seen, describe_exit};
use crate::check::report::RuleResult;

/// How long `check.sleep` is asked to hold a request: far longer than any rule waits.
const HOLD: SleepParams = SleepParams::new(10_000);

/// When the checker sends `$/cancel`, after the request.
const CANCEL_AFTER: Duration = Duration::from_millis(50);

/// How soon after `$/cancel` the `cancelled` answer must come.
const CANCEL_WITHIN: Duration = Duration::from_secs(1);

/// How soon the 65th request must be refused ("at once", with room for a loaded machine).
const REFUSE_WITHIN: Duration = Duration::from_secs(1);

/// `cancellation`: `$/cancel` ends a pending `check.sleep` with `cancelled` within 1 s.
pub(crate) async fn cancellation(
    _ctx: &Ctx<'_>,
    inst: &mut Instance,
    init: &InitializeResult,
) -> RuleResult {
    if !declares_sleep(init) {
        return RuleResult::skip(CANCELLATION, NEEDS_SLEEP);
    }
    let fix = "on `$/cancel` {\"id\": N}, answer request N at once with the error cancelled (-32001), even if its work cannot stop; drop its late result (docs/protocol.md §9)";
    let peer = inst.peer();
    let token = CancellationToken::new();
    let trigger = token.clone();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(CANCEL_AFTER).await;
        trigger.cancel();
    });
    let t0 = Instant::now();
    let res = peer
        .request(
            CHECK_SLEEP,
            &raw(&HOLD),
            CallOptions::within(Some(CANCEL_AFTER + CANCEL_WITHIN)).cancelled_by(&token),
        )
        .await;
    let took = t0.elapsed();
    canceller.abort();
    match res {
        Err(e) if rpc_is(&e, ErrorCode::Cancelled) && !token.is_cancelled() => RuleResult::fail(
            CANCELLATION,
            format!(
                "answered check.sleep {{\"ms\": {}}} with `cancelled` after {} ms, before any `$/cancel` was sent",
                HOLD.ms,
                ms(took)
            ),
            "answer `cancelled` only for a request the host cancelled with `$/cancel` (docs/protocol.md §9)",
        ),
        Err(e) if rpc_is(&e, ErrorCode::Cancelled) => RuleResult::pass(
            CANCELLATION,
            format!(
                "answered cancelled {} ms after `$/cancel`",
                ms(took.saturating_sub(CANCEL_AFTER))
            ),
        ),
        Err(CallError::DeadlineExceeded { .. }) => RuleResult::fail(
            CANCELLATION,
            format!(
                "did not answer check.sleep {{\"ms\": {}}} within {} ms of `$/cancel`",
                HOLD.ms,
                ms(CANCEL_WITHIN)
            ),
            fix,
        ),
        Ok(_) if !token.is_cancelled() => RuleResult::fail(
            CANCELLATION,
            format!(
                "answered check.sleep {{\"ms\": {}}} after {} ms, without holding it",
                HOLD.ms,
                ms(took)
            ),
            "hold check.sleep for `ms` milliseconds or until it is cancelled (docs/protocol.md §6.7)",
        ),
        Ok(_) => RuleResult::fail(
            CANCELLATION,
            "answered the cancelled check.sleep with a result instead of the error cancelled",
            fix,
        ),
        Err(CallError::Rpc { error, .. }) => RuleResult::fail(
            CANCELLATION,
            format!(
                "answered the cancelled check.sleep with {} instead of cancelled (-32001)",
                error_text(&error)
            ),
            fix,
        ),
        Err(e) => {
            let state = inst.state_note().await;
            RuleResult::fail(
                CANCELLATION,
                format!(
                    "asked to cancel a check.sleep, the package {}; {state}",
                    call_failure(&e)
                ),
                fix,
            )
        }
    }
}

type Held = (
    CancellationToken,
    tokio::task::JoinHandle<Result<Box<serde_json::value::RawValue>, CallError>>,
);

/// `overload`: with 64 requests held, the 65th is answered `overloaded` at once.
/// With `judge_order` (the package refuses an id in use: duplicate-id passed), a request reusing
/// a held id while 64 are held must be refused as such, not as overloaded (§3.4).
pub(crate) async fn overload(ctx: &Ctx<'_>, inst: &mut Instance, judge_order: bool) -> RuleResult {
    let limit = MAX_CONCURRENT_REQUESTS;
    let fix = "serve at most 64 requests at once: answer a request that arrives while 64 are unfinished at once with overloaded (-32000) and data {\"limit\": 64}, without running its handler (docs/protocol.md §10)";
    let peer = inst.peer();
    // One of the 64 is written by hand, so that its id can be sent again while all are held:
    // an id in use is refused before the limit is looked at (§3.4).
    let rid = RAW_ID + 70;
    let hold_line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{rid},\"method\":\"{CHECK_SLEEP}\",\"params\":{{\"ms\":{}}}}}\n",
        HOLD.ms
    );
    if let Err(e) = inst.write_raw(hold_line.into_bytes(), ctx.prompt()).await {
        return RuleResult::fail(OVERLOAD, format!("could not write check.sleep: {e}"), fix);
    }
    let mut held: Vec<Held> = Vec::with_capacity(limit);
    for _ in 1..limit {
        let token = CancellationToken::new();
        let (p, t) = (peer.clone(), token.clone());
        let task = tokio::spawn(async move {
            p.request(
                CHECK_SLEEP,
                &raw(&HOLD),
                CallOptions::within(Some(Duration::from_secs(15))).cancelled_by(&t),
            )
            .await
        });
        held.push((token, task));
    }
    // The session queues a call for writing as soon as it is pending, so once all 64 are
    // pending (and a moment has passed for the writer), the 65th is written after them.
    let until = Instant::now() + ctx.prompt();
    while peer.outgoing_in_flight() < limit - 1
        && Instant::now() < until
        && !held.iter().any(|(_, t)| t.is_finished())
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;

    let t0 = Instant::now();
    let res = peer
        .request(
            CHECK_SLEEP,
            &raw(&HOLD),
            CallOptions::within(Some(REFUSE_WITHIN)),
        )
        .await;
    let took = t0.elapsed();
    // Still holding 64: the id of the hand-written one again.
    let order = if judge_order && rpc_result_is(&res, ErrorCode::Overloaded) {
        let again = format!(
            r#"{{"jsonrpc":"2.0","id":{rid},"method":"{CHECK_SLEEP}","params":{{"ms":1}}}}"#
        );
        Some(
            run_cases(
                ctx,
                inst,
                OVERLOAD,
                vec![case(
                    format!("while 64 are held, a request with the id {rid} of one of them"),
                    again,
                    Expect::Error(RequestId::num(rid), ErrorCode::InvalidRequest),
                )],
                "refuse a request whose id is in use with invalid_request (-32600) before looking at the limit: an id in use wins over overloaded (docs/protocol.md §3.4)",
            )
            .await,
        )
    } else {
        None
    };
    // A refusal of an earlier request was written before the answer to the 65th.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let early = early_answers(&mut held).await;
    let cancel =
        format!("{{\"jsonrpc\":\"2.0\",\"method\":\"$/cancel\",\"params\":{{\"id\":{rid}}}}}\n");
    let _ = inst.write_raw(cancel.into_bytes(), ctx.prompt()).await;
    release(held).await;
    if let Some(r) = order
        && r.status != crate::check::report::Status::Pass
    {
        return r;
    }

    if let Some((n, what)) = early.first() {
        return RuleResult::fail(
            OVERLOAD,
            format!(
                "while it should have been holding 64 check.sleep requests, it {what} (request {n} of 64; {} answered early)",
                early.len()
            ),
            fix,
        );
    }
    match res {
        Err(CallError::Rpc { error, .. }) if error.is(ErrorCode::Overloaded) => {
            let limit_ok = error
                .data
                .as_ref()
                .and_then(|d| serde_json::from_str::<serde_json::Value>(d.get()).ok())
                .is_some_and(|d| d["limit"] == serde_json::json!(limit));
            if limit_ok {
                RuleResult::pass(
                    OVERLOAD,
                    format!(
                        "answered the 65th concurrent request with overloaded after {} ms",
                        ms(took)
                    ),
                )
            } else {
                let read_as = if error.class() == conduit_protocol::ErrorClass::Overloaded {
                    ""
                } else {
                    "; without data.limit a -32000 is read as a generic server error, not an overload, and is not retried"
                };
                RuleResult::fail(
                    OVERLOAD,
                    format!(
                        "answered the 65th concurrent request with -32000, but its data is {} instead of {{\"limit\": 64}}{read_as}",
                        error.data.as_ref().map_or("absent", |d| d.get())
                    ),
                    "add data {\"limit\": 64} to the overloaded error (docs/protocol.md §10, §12)",
                )
            }
        }
        Err(CallError::DeadlineExceeded { .. }) => RuleResult::fail(
            OVERLOAD,
            format!(
                "accepted a 65th concurrent request: it was not refused within {} ms",
                ms(REFUSE_WITHIN)
            ),
            fix,
        ),
        Ok(_) => RuleResult::fail(
            OVERLOAD,
            "served a 65th concurrent request instead of refusing it",
            fix,
        ),
        Err(CallError::Rpc { error, .. }) => RuleResult::fail(
            OVERLOAD,
            format!(
                "answered the 65th concurrent request with {} instead of overloaded (-32000)",
                error_text(&error)
            ),
            fix,
        ),
        Err(e) => {
            let state = inst.state_note().await;
            RuleResult::fail(
                OVERLOAD,
                format!(
                    "sent a 65th concurrent request, the package {}; {state}",
                    call_failure(&e)
                ),
                fix,
            )
        }
    }
}

fn rpc_result_is<T>(res: &Result<T, CallError>, code: ErrorCode) -> bool {
    matches!(res, Err(e) if rpc_is(e, code))
}

/// Held requests that were answered although nobody cancelled them: (their number, what).
async fn early_answers(held: &mut [Held]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, (_, task)) in held.iter_mut().enumerate() {
        if !task.is_finished() {
            continue;
        }
        let what = match task.await {
            Ok(Ok(_)) => "answered a held check.sleep with a result".to_owned(),
            Ok(Err(e)) if rpc_is(&e, ErrorCode::Overloaded) => {
                "refused a request with overloaded before 64 were running".to_owned()
            }
            Ok(Err(e)) => format!("failed a held check.sleep: it {}", call_failure(&e)),
            Err(_) => "lost a held request".to_owned(),
        };
        out.push((i + 1, what));
    }
    out
}

/// Cancel the held requests and wait a little for their answers; whatever is left is dropped
/// (the instance is killed right after).
async fn release(held: Vec<Held>) {
    for (token, _) in &held {
        token.cancel();
    }
    let until = tokio::time::Instant::now() + Duration::from_millis(300);
    for (_, task) in held {
        if task.is_finished() {
            continue;
        }
        let abort = task.abort_handle();
        if tokio::time::timeout_at(until, task).await.is_err() {
            abort.abort();
        }
    }
}

/// `shutdown` and `shutting-down`: `shutdown` is answered, then the process exits with code 0
/// within the grace period; a request written right behind it is never served: it is answered
/// `shutting_down`, or left unanswered if the package answered `shutdown` and exited first
/// (§5). The checker keeps stdin open meanwhile: `shutdown` alone must be enough.
pub(crate) async fn shutdown(ctx: &Ctx<'_>, inst: &mut Instance) -> (RuleResult, RuleResult) {
    let fix_answer =
        "answer `shutdown` with {}, then exit with code 0 within 5 s (docs/protocol.md §5)";
    let (sid, pid) = (RAW_ID + 90, RAW_ID + 91);
    let lines = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{sid},\"method\":\"{SHUTDOWN}\",\"params\":{{}}}}\n{{\"jsonrpc\":\"2.0\",\"id\":{pid},\"method\":\"{PROBE_METHOD}\",\"params\":{{}}}}\n"
    );
    let mark = inst.stdout.mark();
    let t0 = Instant::now();
    let not_run = |why: &str| RuleResult::skip(SHUTTING_DOWN, format!("`shutdown` {why}"));
    if let Err(e) = inst.write_raw(lines.into_bytes(), ctx.prompt()).await {
        let state = inst.state_note().await;
        return (
            RuleResult::fail(
                SHUTDOWN_RULE,
                format!("could not write `shutdown`: {e}; {state}"),
                fix_answer,
            ),
            not_run("could not be written"),
        );
    }
    let answer = |want: i64| {
        move |s: &Seen| match s {
            Seen::Answer { id, error } if id.as_num() == Some(want) => Some(*error),
            _ => None,
        }
    };
    let answered = inst
        .stdout
        .wait_for(mark, SHUTDOWN_GRACE, answer(sid))
        .await;
    let took = t0.elapsed();
    let first = match answered {
        Some(None) => None,
        Some(Some(code)) => Some(RuleResult::fail(
            SHUTDOWN_RULE,
            format!("answered `shutdown` with error {code} instead of {{}}"),
            fix_answer,
        )),
        None => {
            let status = inst
                .exit_status(SHUTDOWN_GRACE.saturating_sub(t0.elapsed()))
                .await;
            let how = match status {
                Some(s) => format!(
                    "exited ({}) without answering `shutdown`",
                    describe_exit(&s)
                ),
                None if inst.session_ended() => {
                    "closed its stdout without answering `shutdown`".to_owned()
                }
                None => format!("did not answer `shutdown` within {} ms", ms(SHUTDOWN_GRACE)),
            };
            Some(RuleResult::fail(SHUTDOWN_RULE, how, fix_answer))
        }
    };
    let status = inst
        .exit_status(SHUTDOWN_GRACE.saturating_sub(t0.elapsed()))
        .await;
    // The exit closes stdout, so by now the probe's answer, if any, is in the log.
    let probe = inst
        .stdout
        .wait_for(mark, std::time::Duration::from_millis(100), answer(pid))
        .await;
    let second = match probe {
        Some(Some(c)) if c == ErrorCode::ShuttingDown.number() => RuleResult::pass(
            SHUTTING_DOWN,
            "answered the request written right after `shutdown` with shutting_down",
        ),
        Some(other) => RuleResult::fail(
            SHUTTING_DOWN,
            format!(
                "served a request written right after `shutdown`: it answered {} instead of shutting_down (-32008)",
                other.map_or("a result".to_owned(), |c| format!("error {c}"))
            ),
            "once `shutdown` has been received, answer every new request with shutting_down (-32008), before looking at its method (docs/protocol.md §5, §3.4)",
        ),
        None if status.is_some() => RuleResult::pass(
            SHUTTING_DOWN,
            "answered `shutdown` and exited without serving the request written right after it",
        ),
        None => RuleResult::fail(
            SHUTTING_DOWN,
            "did not answer the request written right after `shutdown` and did not exit either",
            "once `shutdown` has been received, answer every new request with shutting_down (-32008) (docs/protocol.md §5)",
        ),
    };
    if let Some(res) = first {
        return (res, second);
    }
    let first = match status {
        Some(status) if status.success() => RuleResult::pass(
            SHUTDOWN_RULE,
            format!(
                "answered `shutdown` in {} ms and exited with code 0, {} ms after the request",
                ms(took),
                ms(t0.elapsed())
            ),
        ),
        Some(status) => RuleResult::fail(
            SHUTDOWN_RULE,
            format!(
                "answered `shutdown`, then exited with {}",
                describe_exit(&status)
            ),
            "exit with code 0 after `shutdown`: the host counts any other exit as a crash",
        ),
        None => RuleResult::fail(
            SHUTDOWN_RULE,
            format!(
                "answered `shutdown` but was still running {} ms later",
                ms(SHUTDOWN_GRACE)
            ),
            "after answering `shutdown`, finish or cancel what is running and exit with code 0 within 5 s, without waiting for stdin to close (docs/protocol.md §5)",
        ),
    };
    (first, second)
}
