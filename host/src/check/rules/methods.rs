//! The rules about serving methods: `declared-methods-answer` and `unknown-method`.
//!
//! The checker calls what the handshake declared, as the host would, with small well-formed
//! params (three synthetic events, the spec `every 15m`, `{"text":"conduit"}`), and checks the
//! answers against the rules of docs/protocol.md §6. `invalid_params` is accepted as an answer
//! with a note: the checker's made-up inputs may not be ones a package can serve.
//!
//! Invariant: every call has a deadline; once the session ends no further call is made.

use std::time::{Duration, Instant};

use conduit_protocol::calls::{
    CommitParams, CommitResult, FilterParams, FilterResult, IngressPollParams, IngressPollResult,
    RecurrenceParams, RecurrenceResult, SleepParams, SleepResult, TriggerParams, TriggerResult,
};
use conduit_protocol::methods::host;
use conduit_protocol::{ErrorCode, IN_TRANSACTION_DEADLINE, InitializeResult};
use conduit_rpc::{CallError, CallOptions, Peer};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::common::{PROBE_METHOD, call_failure, error_text, ms, raw, rpc_is};
use super::ids::{DECLARED_METHODS, UNKNOWN_METHOD};
use crate::check::callbacks::synthetic_events;
use crate::check::ctx::Ctx;
use crate::check::instance::{Instance, sample};
use crate::check::report::RuleResult;

/// The limit `ingress.poll` is called with.
const POLL_LIMIT: u32 = 10;

/// What one rule run collects.
#[derive(Default)]
struct Tally {
    answered: Vec<String>,
    problems: Vec<String>,
    fixes: Vec<String>,
    notes: Vec<String>,
    /// The session ended: make no more calls.
    ended: bool,
}

impl Tally {
    fn problem(&mut self, what: String, fix: &str) {
        self.problems.push(what);
        if !self.fixes.iter().any(|f| f == fix) {
            self.fixes.push(fix.to_owned());
        }
    }
}

/// Call `method` and parse its answer as `T`. `Some(t)` is an answer; `None` means the call
/// did not produce one (the reason is already in `tally`: a problem, or an accepted
/// `invalid_params` noted).
async fn ask<T: DeserializeOwned>(
    ctx: &Ctx<'_>,
    peer: &Peer,
    tally: &mut Tally,
    label: &str,
    method: &str,
    params: &impl Serialize,
    section: &str,
) -> Option<T> {
    let t0 = Instant::now();
    let res = peer
        .request(
            method,
            &raw(params),
            CallOptions::within(Some(ctx.opts.timeout)),
        )
        .await;
    judge(tally, label, method, section, res, t0.elapsed())
}

/// Judge an answer to `method` (see [`ask`]).
fn judge<T: DeserializeOwned>(
    tally: &mut Tally,
    label: &str,
    method: &str,
    section: &str,
    res: Result<Box<RawValue>, CallError>,
    took: Duration,
) -> Option<T> {
    let in_transaction = host::IN_TRANSACTION.contains(&method);
    if in_transaction && took > IN_TRANSACTION_DEADLINE {
        tally.notes.push(format!(
            "{label} took {} ms; the host gives in-transaction calls {} ms and applies the fallback after that",
            ms(took),
            ms(IN_TRANSACTION_DEADLINE)
        ));
    }
    let fix = format!(
        "answer a well-formed {method} with a result of the shape docs/protocol.md {section} gives"
    );
    match res {
        Ok(answer) => match serde_json::from_str::<T>(answer.get()) {
            Ok(t) => {
                tally.answered.push(label.to_owned());
                Some(t)
            }
            Err(e) => {
                tally.problem(
                    format!(
                        "{label} answered {}, which does not parse: {e}",
                        sample(answer.get().as_bytes())
                    ),
                    &fix,
                );
                None
            }
        },
        Err(e) if rpc_is(&e, ErrorCode::InvalidParams) => {
            tally.answered.push(label.to_owned());
            tally.notes.push(format!(
                "{label} {}; accepted as an answer, but check that a real request of this shape is served",
                call_failure(&e)
            ));
            None
        }
        Err(e @ CallError::Rpc { .. }) => {
            let consequence = if in_transaction {
                "; the host would record a failure and apply the fallback"
            } else {
                ""
            };
            if e.is(ErrorCode::Overloaded) && e.class() != conduit_protocol::ErrorClass::Overloaded
            {
                tally.notes.push(format!(
                    "{label} answered -32000 without data.limit: the host reads that as a generic, non-retryable server error (a handler exception in many JSON-RPC libraries), not as overloaded (docs/protocol.md §12)"
                ));
            }
            tally.problem(format!("{label} {}{consequence}", call_failure(&e)), &fix);
            None
        }
        Err(e) => {
            tally.ended = matches!(e, CallError::Closed { .. });
            tally.problem(
                format!("{label} {}", call_failure(&e)),
                "answer every declared capability; in-transaction calls within 250 ms",
            );
            None
        }
    }
}

/// What is wrong with a trigger answer for a batch of `ids`, if anything: the host's own rule
/// (`TriggerResult::check`, docs/protocol.md §6.1), so a package that passes here is never
/// given the fallback for its grouping in the daemon.
pub(crate) fn trigger_problem(r: &TriggerResult, ids: &[i64]) -> Option<String> {
    r.check(ids).err().map(|e| e.0)
}

/// `declared-methods-answer`: every declared capability answers a well-formed request.
pub(crate) async fn declared_methods(
    ctx: &Ctx<'_>,
    inst: &mut Instance,
    init: &InitializeResult,
) -> RuleResult {
    let caps = &init.capabilities;
    let peer = inst.peer();
    let events = synthetic_events(&ctx.source, ctx.now_ms);
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    let mut t = Tally::default();

    for kind in caps.work_kinds.iter().filter(|k| k.trigger) {
        if t.ended {
            break;
        }
        let label = format!("work_kind.trigger `{}`", kind.name);
        let params = TriggerParams::new(kind.name.clone(), events.clone());
        if let Some(r) = ask::<TriggerResult>(
            ctx,
            &peer,
            &mut t,
            &label,
            host::WORK_KIND_TRIGGER,
            &params,
            "§6.1",
        )
        .await
        {
            if let Some(p) = trigger_problem(&r, &ids) {
                t.problem(
                    format!("{label} answered a malformed grouping of events {ids:?}: {p}"),
                    "put every input's id in exactly one group, name no other id, use distinct keys of 1 to 200 bytes and no empty group (docs/protocol.md §6.1)",
                );
            } else if r.groups.iter().any(|g| g.key.starts_with("event:")) {
                t.notes.push(format!(
                    "{label} used a key starting with `event:`, which the host's fallback uses"
                ));
            }
        }
    }
    for name in &caps.recurrences {
        if t.ended {
            break;
        }
        let label = format!("recurrence.next `{name}`");
        let params = RecurrenceParams::new(name.clone(), 1, "every 15m", ctx.now_ms);
        if let Some(r) = ask::<RecurrenceResult>(
            ctx,
            &peer,
            &mut t,
            &label,
            host::RECURRENCE_NEXT,
            &params,
            "§6.2",
        )
        .await
        {
            match r.check(ctx.now_ms) {
                Err(why) => t.problem(
                    format!("{label} answered {why}"),
                    "answer a next_at_ms after fired_at_ms, or null to stop the timer (docs/protocol.md §6.2)",
                ),
                Ok(Some(_)) => {}
                Ok(None) => t.notes.push(format!("{label} answered next_at_ms null for spec `every 15m`, which stops the timer")),
            }
        }
    }
    for name in &caps.dependency_filters {
        if t.ended {
            break;
        }
        let label = format!("dependency.filter `{name}`");
        let params = FilterParams::new(name.clone(), 1, "thread:t-1", events[0].clone());
        ask::<FilterResult>(
            ctx,
            &peer,
            &mut t,
            &label,
            host::DEPENDENCY_FILTER,
            &params,
            "§6.3",
        )
        .await;
    }
    for name in &caps.emissions {
        if t.ended {
            break;
        }
        let label = format!("emit.commit `{name}`");
        let params = CommitParams::new(
            name.clone(),
            format!("conduit-check-commit-{name}"),
            serde_json::json!({ "text": "conduit" }),
        );
        let Some(first) = ask::<CommitResult>(
            ctx,
            &peer,
            &mut t,
            &label,
            host::EMIT_COMMIT,
            &params,
            "§6.4",
        )
        .await
        else {
            continue;
        };
        if let Err(why) = first.check() {
            t.problem(
                format!("{label} answered a malformed result: {why}"),
                "give every record a non-empty kind (docs/protocol.md §6.4)",
            );
        }
        // A repeated commit_id is the same commit (a retry): it must give the same records.
        let again = format!("{label} (repeated commit_id)");
        if let Some(second) = ask::<CommitResult>(
            ctx,
            &peer,
            &mut t,
            &again,
            host::EMIT_COMMIT,
            &params,
            "§6.4",
        )
        .await
            && second != first
        {
            t.problem(
                format!("{label} returned different records for a repeated commit_id"),
                "return the same records for a commit_id seen before: the host retries a commit whose transaction did not commit (docs/protocol.md §6.4)",
            );
        }
    }
    for source in &caps.ingress {
        if t.ended {
            break;
        }
        let label = format!("ingress.poll `{source}`");
        let params = IngressPollParams::new(source.clone(), POLL_LIMIT);
        let t0 = Instant::now();
        let res = peer
            .request(
                host::INGRESS_POLL,
                &raw(&params),
                CallOptions::within(Some(ctx.opts.timeout)),
            )
            .await;
        match res {
            // The protocol allows it: the host then stops polling the source (§6.5).
            Err(e) if rpc_is(&e, ErrorCode::MethodNotFound) => {
                t.answered.push(label.clone());
                t.notes.push(format!(
                    "{label} answered method_not_found, so the host stops polling it for the session; a push-only source may answer {{\"events\":[]}} instead"
                ));
            }
            res => {
                if let Some(r) = judge::<IngressPollResult>(
                    &mut t,
                    &label,
                    host::INGRESS_POLL,
                    "§6.5",
                    res,
                    t0.elapsed(),
                ) && let Err(why) = r.check(POLL_LIMIT)
                {
                    t.problem(
                        format!("{label} returned {why}"),
                        "return at most `limit` events per poll (docs/protocol.md §6.5)",
                    );
                }
            }
        }
    }
    for method in &caps.methods {
        if t.ended {
            break;
        }
        if method == host::CHECK_SLEEP {
            let label = format!("`{method}`");
            ask::<SleepResult>(
                ctx,
                &peer,
                &mut t,
                &label,
                method,
                &SleepParams::new(1),
                "§6.7",
            )
            .await;
            continue;
        }
        let label = format!("`{method}`");
        let params = serde_json::json!({ "text": "conduit" });
        match peer
            .request(
                method,
                &raw(&params),
                CallOptions::within(Some(ctx.opts.timeout)),
            )
            .await
        {
            Ok(_) => t.answered.push(label),
            Err(e) if rpc_is(&e, ErrorCode::MethodNotFound) => t.problem(
                format!(
                    "{label} is declared in capabilities.methods but answered method_not_found"
                ),
                "serve every method listed in capabilities.methods, or stop declaring it",
            ),
            Err(CallError::Rpc { error, .. }) => {
                t.answered.push(label.clone());
                t.notes.push(format!(
                    "{label} answered {{\"text\":\"conduit\"}} with {}; accepted (custom params are the package's choice)",
                    error_text(&error)
                ));
            }
            Err(e) => {
                t.ended = matches!(e, CallError::Closed { .. });
                t.problem(
                    format!("{label} {}", call_failure(&e)),
                    "answer every declared method, with a result or an error, within the host's deadline",
                );
            }
        }
    }

    let callbacks = ctx.host.calls();
    if !callbacks.is_empty() {
        let list: Vec<String> = callbacks.iter().map(|(m, n)| format!("{m} ×{n}")).collect();
        t.notes
            .push(format!("the package called back: {}", list.join(", ")));
    }
    t.notes.extend(ctx.host.artifact_notes());
    for why in ctx.host.artifact_refusals() {
        t.problem(
            why,
            "stream artifacts as docs/protocol.md §8 says: chunks in `seq` order within the window (or whole frames on the bulk pipe), then `artifact.close` with the size sent and, if you send one, the sha256 of exactly those bytes (or leave it out: the host computes it)",
        );
    }
    if t.answered.is_empty() && t.problems.is_empty() {
        return RuleResult::skip(
            DECLARED_METHODS,
            "the package declares no work kind with a trigger, recurrence, dependency filter, emission, ingress source or method",
        );
    }
    if t.ended {
        let state = inst.state_note().await;
        t.problems.push(format!("no more calls were made: {state}"));
    }
    if t.problems.is_empty() {
        RuleResult::pass(
            DECLARED_METHODS,
            format!("answered {}", t.answered.join(", ")),
        )
        .with_notes(t.notes)
    } else {
        RuleResult::fail(DECLARED_METHODS, t.problems.join("; "), t.fixes.join("; "))
            .with_notes(t.notes)
    }
}

/// `unknown-method`: a method nobody serves is answered `method_not_found`.
pub(crate) async fn unknown_method(ctx: &Ctx<'_>, inst: &mut Instance) -> RuleResult {
    let fix =
        "answer a request for a method you do not serve with the error method_not_found (-32601)";
    let res = inst
        .peer()
        .request(
            PROBE_METHOD,
            &raw(&serde_json::json!({})),
            CallOptions::within(Some(ctx.prompt().max(Duration::from_secs(1)))),
        )
        .await;
    match res {
        Err(e) if rpc_is(&e, ErrorCode::MethodNotFound) => RuleResult::pass(
            UNKNOWN_METHOD,
            format!("answered `{PROBE_METHOD}` with method_not_found"),
        ),
        Ok(answer) => RuleResult::fail(
            UNKNOWN_METHOD,
            format!(
                "answered the unknown method `{PROBE_METHOD}` with the result {}",
                sample(answer.get().as_bytes())
            ),
            fix,
        ),
        Err(CallError::Rpc { error, .. }) => RuleResult::fail(
            UNKNOWN_METHOD,
            format!(
                "answered the unknown method `{PROBE_METHOD}` with {}",
                error_text(&error)
            ),
            fix,
        ),
        Err(e) => {
            let state = inst.state_note().await;
            RuleResult::fail(
                UNKNOWN_METHOD,
                format!(
                    "asked for the unknown method `{PROBE_METHOD}`, the package {}; {state}",
                    call_failure(&e)
                ),
                fix,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conduit_protocol::calls::TriggerGroup;

    fn groups(gs: &[(&str, &[i64])]) -> TriggerResult {
        TriggerResult::new(
            gs.iter()
                .map(|(k, ids)| TriggerGroup::new(*k, ids.to_vec()))
                .collect(),
        )
    }

    #[test]
    fn trigger_answers_must_cover_each_input_once() {
        let ids = [1, 2, 3];
        assert_eq!(
            trigger_problem(&groups(&[("a", &[1, 2]), ("b", &[3])]), &ids),
            None
        );
        let p = |g| trigger_problem(&g, &ids).unwrap();
        assert!(p(groups(&[("a", &[1, 2])])).contains("in no group: [3]"));
        assert!(p(groups(&[("a", &[1, 2, 3]), ("b", &[3])])).contains("event 3 is in two groups"));
        assert!(p(groups(&[("a", &[1, 2, 3, 9])])).contains("event 9 was not in the batch"));
        assert!(p(groups(&[("a", &[1]), ("a", &[2, 3])])).contains("`a` appears twice"));
        assert!(p(groups(&[("a", &[1, 2, 3]), ("b", &[])])).contains("names no event"));
        let long = "k".repeat(201);
        assert!(p(groups(&[(long.as_str(), &[1, 2, 3])])).contains("1 to 200 bytes"));
    }

    /// The same bad answers through the checker's rule and the check the host's loop applies
    /// before it uses an answer (`TriggerResult::check`, the loop's call in `route`): the
    /// verdicts agree, so a package that passes `ext check` never gets the fallback for its
    /// grouping in the daemon, and one that the daemon refuses fails the check.
    #[test]
    fn the_checker_and_the_host_loop_give_the_same_verdict() {
        let ids = [1, 2, 3];
        let long = "k".repeat(201);
        let at_limit = "k".repeat(200);
        let cases: Vec<TriggerResult> = vec![
            groups(&[("a", &[1, 2, 3])]),
            groups(&[(at_limit.as_str(), &[1, 2, 3])]),
            groups(&[(long.as_str(), &[1, 2, 3])]),
            groups(&[("", &[1, 2, 3])]),
            groups(&[("a", &[1, 2])]),
            groups(&[("a", &[1, 2, 3]), ("b", &[3])]),
            groups(&[("a", &[1, 2, 3, 9])]),
            groups(&[("a", &[1]), ("a", &[2, 3])]),
            groups(&[("a", &[1, 2, 3]), ("b", &[])]),
        ];
        for answer in cases {
            let host = crate::core::host_loop::trigger_verdict(&answer, &ids);
            let checker = trigger_problem(&answer, &ids);
            assert_eq!(host.err(), checker, "{answer:?}");
        }
    }
}
