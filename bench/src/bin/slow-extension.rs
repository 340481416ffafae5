//! The budget gate's negative control: the `notes` extension with one in-transaction handler
//! made slow, or made wrong.
//!
//! Run with `slow-extension <METHOD> <MS>` to hold every `<METHOD>` call (one of the four
//! in-transaction methods, e.g. `dependency.filter`) for `MS` milliseconds before answering,
//! or `slow-extension <METHOD> wrong` to answer it wrongly. With no arguments it is the notes
//! extension as it is. It speaks the protocol on stdin and stdout like any extension; the host
//! starts it.
//!
//! The answers come from the notes example's own rules (its library modules), so a gate run
//! against this binary differs from one against `conduit-notes` only in the one method's time
//! or answer. The delay is an async sleep: the extension's reader keeps going meanwhile, as a
//! slow handler that awaits something would.

use std::time::Duration;

use anyhow::{Context, bail};
use conduit_example_notes::{annotation, mentions, recurrence, trigger};
use conduit_extension::prelude::*;
use conduit_extension::protocol::methods;

/// The four in-transaction methods. (Not the gate's own enum: an extension, even a test one,
/// uses only the SDK and the protocol, never host-side code.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Trigger,
    Recurrence,
    Filter,
    Commit,
}

impl Method {
    fn from_name(name: &str) -> Option<Method> {
        use methods::host;
        Some(match name {
            host::WORK_KIND_TRIGGER => Method::Trigger,
            host::RECURRENCE_NEXT => Method::Recurrence,
            host::DEPENDENCY_FILTER => Method::Filter,
            host::EMIT_COMMIT => Method::Commit,
            _ => return None,
        })
    }
}

/// What happens to the chosen method's calls.
#[derive(Clone, Copy, Debug)]
enum Misbehaviour {
    Sleep(Duration),
    Wrong,
}

#[derive(Clone, Copy, Debug)]
struct Plan {
    target: Option<(Method, Misbehaviour)>,
}

impl Plan {
    fn parse(args: &[String]) -> anyhow::Result<Plan> {
        let target = match args {
            [] => None,
            [method, how] => {
                let m = Method::from_name(method).with_context(|| {
                    format!("`{method}` is not one of the four in-transaction methods")
                })?;
                let how = if how == "wrong" {
                    Misbehaviour::Wrong
                } else {
                    let ms: u64 = how
                        .parse()
                        .with_context(|| format!("`{how}` is neither milliseconds nor `wrong`"))?;
                    Misbehaviour::Sleep(Duration::from_millis(ms))
                };
                Some((m, how))
            }
            _ => bail!("usage: slow-extension [<METHOD> <MS>|<METHOD> wrong]"),
        };
        Ok(Plan { target })
    }

    /// Sleep if `m` is the slow method; true if it must answer wrongly.
    async fn apply(self, m: Method) -> bool {
        match self.target {
            Some((t, Misbehaviour::Sleep(d))) if t == m => {
                tokio::time::sleep(d).await;
                false
            }
            Some((t, Misbehaviour::Wrong)) => t == m,
            _ => false,
        }
    }
}

fn extension(plan: Plan) -> Extension {
    Extension::new("notes", env!("CARGO_PKG_VERSION"))
        .work_kind("note", move |_cx: Ctx, p: TriggerParams| async move {
            let wrong = plan.apply(Method::Trigger).await;
            let mut res = trigger::group(&p.inputs);
            if wrong {
                // The host's fallback: one Work per input.
                res.groups = p
                    .inputs
                    .iter()
                    .map(|e| TriggerGroup::new(format!("event:{}", e.id), vec![e.id]))
                    .collect();
            }
            Ok(res)
        })
        .recurrence("digest", move |_cx, p: RecurrenceParams| async move {
            let wrong = plan.apply(Method::Recurrence).await;
            let spec = recurrence::Spec::parse(&p.spec)
                .map_err(|e| RpcError::invalid_params(methods::host::RECURRENCE_NEXT, e))?;
            let next = spec.next_after(p.fired_at_ms);
            Ok(RecurrenceResult::new(if wrong {
                next.map(|t| t + 1)
            } else {
                next
            }))
        })
        .dependency_filter("mentions", move |_cx, p: FilterParams| async move {
            let wrong = plan.apply(Method::Filter).await;
            let text = p.event.payload.get("text").and_then(|t| t.as_str());
            let satisfied = text.is_some_and(|t| mentions::mentions(t, &p.subject));
            Ok(FilterResult::new(satisfied != wrong))
        })
        .emission("annotation", move |_cx, p: CommitParams| async move {
            let wrong = plan.apply(Method::Commit).await;
            let mut records = vec![annotation::annotate(&p)];
            if wrong {
                records.clear();
            }
            Ok(CommitResult::new(records))
        })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let plan = match Plan::parse(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("slow-extension: {e:#}");
            std::process::exit(2);
        }
    };
    std::process::exit(conduit_extension::run(extension(plan)));
}
