//! The Rust SDK for conduit extensions.
//!
//! An extension is a child process that the conduit daemon starts and talks to over its stdin and
//! stdout with JSON-RPC 2.0, one message per line (`docs/protocol.md`). With this crate an
//! extension is a list of typed async handlers; the SDK does everything else:
//!
//! - the framing, the 16 MiB message cap, the 64-request limit (`overloaded`) and `$/cancel`
//!   (all from `conduit-rpc`, the session the host uses too);
//! - the handshake: `initialize` is answered with the newest protocol version both sides speak
//!   and the capabilities derived from what you registered, or refused with `version_mismatch`;
//!   any other request before it gets `not_initialized`, a second one `invalid_request`;
//! - dispatch: `work_kind.trigger`, `recurrence.next`, `dependency.filter`, `emit.commit` and
//!   `ingress.poll` go to the handler registered under the name in their params (a name that
//!   was not registered is `invalid_params`), custom methods go to theirs, and params that do not
//!   deserialize are `invalid_params` naming the method;
//! - the conformance method `check.sleep`, always served and declared, so that every SDK
//!   extension passes `conduit ext check`'s cancellation and overload rules;
//! - `shutdown` (refuse new requests with `shutting_down`, let running ones finish, answer,
//!   close, exit 0) and stdin EOF (exit 0 at once);
//! - logs to stderr through `tracing`, filtered by `CONDUIT_LOG` (default `info`). Nothing but
//!   protocol ever reaches stdout.
//!
//! Handlers get a [`Ctx`]: the request's cancellation token and a [`Host`] handle for callbacks
//! (`state.event`, `state.events`, `state.work`, `operation.emit`, `ingress.push`) and for
//! streaming artifacts ([`ArtifactWriter`]: on the host's bulk pipe when it offers one,
//! docs/protocol.md §8.1, else as pipelined base64 chunks; the host computes the stored digest,
//! and [`Host::with_verified_artifacts`] asks for end-to-end verification), which it may use
//! while its own request is pending,
//! and the request's deadline as the host sent it ([`Ctx::deadline`], [`Ctx::remaining`], from
//! `params._meta.remaining_ms`, docs/protocol.md §11; `_meta` is stripped before the handler
//! reads its params).
//!
//! # Example
//!
//! Run with `cargo run -p conduit-example-notes` for a complete package; this is its shape:
//!
//! ```no_run
//! use conduit_extension::prelude::*;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Echo {
//!     text: String,
//! }
//!
//! fn main() {
//!     let ext = Extension::new("notes", env!("CARGO_PKG_VERSION"))
//!         // Declares the work kind `note` with `trigger: true`.
//!         .work_kind("note", |_cx: Ctx, p: TriggerParams| async move {
//!             let groups = p
//!                 .inputs
//!                 .iter()
//!                 .map(|e| TriggerGroup::new(format!("note:{}", e.id), vec![e.id]))
//!                 .collect();
//!             Ok(TriggerResult::new(groups))
//!         })
//!         .recurrence("digest", |_cx, p: RecurrenceParams| async move {
//!             Ok(RecurrenceResult::at(p.fired_at_ms + 60_000))
//!         })
//!         .dependency_filter("mentions", |_cx, p: FilterParams| async move {
//!             let text = p.event.payload["text"].as_str().unwrap_or("");
//!             Ok(FilterResult::new(text.contains(&format!("@{}", p.subject))))
//!         })
//!         .emission("annotation", |_cx, p: CommitParams| async move {
//!             // The same commit_id must give the same records: derive them from the params.
//!             let body = serde_json::json!({ "commit_id": p.commit_id, "payload": p.payload });
//!             Ok(CommitResult::new(vec![Record::new("annotation", body)]))
//!         })
//!         .ingress("notes-inbox", |_cx, _p: IngressPollParams| async move {
//!             Ok(IngressPollResult::default())
//!         })
//!         // A custom method with typed params and result; it may call the host back while
//!         // its own request is pending.
//!         .method("echo", |cx: Ctx, p: Echo| async move {
//!             let recent = cx.host().events(EventsQuery::new().with_limit(1)).await?;
//!             tracing::info!(n = recent.events.len(), "echo");
//!             Ok(p)
//!         })
//!         // Streams an artifact: chunks are pipelined; the host answers the sha256 it computed.
//!         .method("report", |cx: Ctx, _p: serde_json::Value| async move {
//!             let open = ArtifactOpen::new("report.txt").with_media_type("text/plain");
//!             let mut w = cx.host().artifact(open).await?;
//!             for i in 0..1000 {
//!                 w.write(format!("line {i}\n").as_bytes()).await?;
//!             }
//!             Ok(w.finish().await?)
//!         });
//!     std::process::exit(conduit_extension::run(ext));
//! }
//! ```
//!
//! # Building params and results
//!
//! The protocol's params and results are `#[non_exhaustive]`: build them with `new` (the
//! required members) and `with_*` (the optional ones), as above, so that a field the protocol
//! adds later does not break your build. Their fields stay public to read and change.
//!
//! # Testing an extension
//!
//! [`Extension::serve`] runs the same extension over any `AsyncRead`/`AsyncWrite` pair, so a test
//! can play the host over `tokio::io::duplex` with a `conduit_rpc::Session` of its own.
//!
//! Invariant: stdout carries only protocol messages written by the session; the SDK itself never
//! writes to it, and [`run`] sends every log line to stderr.

mod artifact;
mod bulk;
mod ctx;
mod error;
mod extension;
mod params;
mod serve;

pub use artifact::ArtifactWriter;
pub use ctx::{Ctx, Host};
pub use error::HostError;
pub use extension::Extension;
pub use serve::ExitReason;

/// The protocol types, for names the prelude does not bring in.
pub use conduit_protocol as protocol;
pub use conduit_protocol::{ErrorCode, RpcError};
pub use tokio_util::sync::CancellationToken;

/// Everything a typical extension names: the builder, the context, errors, and every params
/// and result type of the calls it serves and makes.
pub mod prelude {
    pub use crate::{ArtifactWriter, Ctx, ErrorCode, Extension, Host, HostError, RpcError};
    pub use conduit_protocol::calls::*;
    pub use conduit_protocol::handshake::{InitializeParams, Limits};
}

use std::io::IsTerminal;
use std::time::Duration;

/// The environment variable holding the log filter (`RUST_LOG` syntax, e.g. `debug` or
/// `info,conduit_extension=trace`).
pub const LOG_ENV: &str = "CONDUIT_LOG";

/// Serve `ext` over this process's stdin and stdout until `shutdown` or stdin EOF, and return
/// the exit code to pass to [`std::process::exit`]: 0 for both, 1 if the streams broke or the
/// runtime could not start.
///
/// Installs a `tracing` subscriber that writes to stderr (filter from `CONDUIT_LOG`, default
/// `info`) unless one is already installed, and runs everything on a current-thread tokio
/// runtime: an extension's work is a few small handlers between reads, and keeping every hop on
/// one thread measured faster than a multi-thread runtime. Handlers that compute for
/// long should move that work to `tokio::task::spawn_blocking`, or they hold up the reader.
pub fn run(ext: Extension) -> i32 {
    init_tracing();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "could not start the async runtime");
            return 1;
        }
    };
    let reason = rt.block_on(async move {
        let (stdin, stdout) = conduit_rpc::stdio::stdio();
        ext.serve(stdin, stdout).await
    });
    // When stdin is not a pipe (run by hand from a terminal) it is read on a blocking thread
    // that cannot be interrupted; waiting for it would hang the exit until the next line.
    rt.shutdown_timeout(Duration::from_millis(50));
    reason.code()
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // `try_init` fails only when a subscriber is already installed; the one already there wins.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
