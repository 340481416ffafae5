//! The `notes` extension: a realistic package serving all four in-transaction calls, one ingress
//! source and `echo`.
//!
//! | call | name | what it does | module |
//! |---|---|---|---|
//! | `work_kind.trigger` | `note` | groups a batch of notes into one Work per thread | [`trigger`] |
//! | `recurrence.next` | `digest` | `every <N>(s\|m\|h\|d)` or daily `M H * * *` (UTC) | [`recurrence`] |
//! | `dependency.filter` | `mentions` | satisfied when the note's text mentions `@<subject>` | [`mentions`] |
//! | `emit.commit` | `annotation` | one ~240-byte annotation record built from the payload | [`annotation`] |
//! | `ingress.poll` | `notes-inbox` | notes from the JSON-lines file `$CONDUIT_NOTES_INBOX` | [`inbox`] |
//! | custom | `echo` | answers `{"text": …}` with its params | here |
//! | custom | `export` | every note (or one thread's) as a JSON-lines artifact | [`export`] |
//!
//! A note is an event whose payload looks like
//! `{"thread": "t-42", "author": "ada", "text": "…about 1 KiB…"}`.
//!
//! Invariant: the four in-transaction handlers compute their answer from their params alone —
//! no callbacks, no I/O, no clock — so each answers in microseconds, well inside the host's
//! 250 ms deadline, and a repeated call (the host retrying a commit) gets the same answer.

pub mod annotation;
pub mod export;
pub mod inbox;
pub mod mentions;
pub mod recurrence;
pub mod trigger;

use std::path::PathBuf;
use std::sync::Arc;

use conduit_extension::prelude::*;
use conduit_extension::protocol::methods;
use serde::{Deserialize, Serialize};

/// `echo` params and result: `text` is required; any other member is sent back as it came.
#[derive(Debug, Serialize, Deserialize)]
pub struct Echo {
    pub text: String,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// The extension, with the inbox file named by `CONDUIT_NOTES_INBOX` (unset or empty: the
/// source never has anything new).
pub fn extension() -> Extension {
    let inbox = std::env::var_os(inbox::ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    extension_with_inbox(inbox)
}

/// The extension, polling `inbox` for the `notes-inbox` source.
pub fn extension_with_inbox(inbox: Option<PathBuf>) -> Extension {
    let inbox = Arc::new(inbox);
    Extension::new("notes", env!("CARGO_PKG_VERSION"))
        .work_kind("note", |_cx: Ctx, p: TriggerParams| async move {
            Ok(trigger::group(&p.inputs))
        })
        .recurrence("digest", |_cx, p: RecurrenceParams| async move {
            let spec = recurrence::Spec::parse(&p.spec)
                .map_err(|e| RpcError::invalid_params(methods::host::RECURRENCE_NEXT, e))?;
            let next = spec.next_after(p.fired_at_ms).ok_or_else(|| {
                RpcError::invalid_params(
                    methods::host::RECURRENCE_NEXT,
                    format!("`{}` has no firing after {}", p.spec, p.fired_at_ms),
                )
            })?;
            Ok(RecurrenceResult::at(next))
        })
        .dependency_filter("mentions", |_cx, p: FilterParams| async move {
            let text = p.event.payload.get("text").and_then(|t| t.as_str());
            Ok(FilterResult::new(
                text.is_some_and(|t| mentions::mentions(t, &p.subject)),
            ))
        })
        .emission("annotation", |_cx, p: CommitParams| async move {
            Ok(CommitResult::new(vec![annotation::annotate(&p)]))
        })
        .ingress("notes-inbox", move |_cx, p: IngressPollParams| {
            let inbox = inbox.clone();
            async move { inbox::poll(inbox.as_deref(), &p).await }
        })
        .method("echo", |_cx: Ctx, p: Echo| async move { Ok(p) })
        .method("export", export::export)
}
