//! The child side of each workload: this same binary, re-executed with a hidden `--child ROLE`.
//!
//! Every role reads stdin until EOF and then exits, so the host ends a child by closing its
//! stdin. `--pin CPU` runs any role on one CPU only. Roles that use tokio run a current-thread
//! runtime, as the SDK does: a second thread would add a cross-thread wake-up to every message.
//! (The awake regime's busy loops are this binary too, run with `--spin CPU`.)
//!
//! | role        | reads with                     | answers with                              |
//! |-------------|--------------------------------|-------------------------------------------|
//! | `floor`     | blocking `read`                | blocking `write` of the same line (`conduit_bench::floor::serve_lines`) |
//! | `inline`    | `FrameReader` on epoll pipes   | `Message::parse` + `write_result`, inline |
//! | `conduit`   | `conduit_rpc::Session`         | `TestHandler` (`echo` answers its params) |
//! | `jsonrpsee` | `FrameReader` on epoll pipes   | `RpcModule::raw_json_request`, inline     |

use std::borrow::Cow;

use anyhow::Context;
use conduit_bench::floor;
use conduit_bench::regime::pin_to;
use conduit_protocol::message::{self, Message};
use conduit_protocol::{MAX_MESSAGE_BYTES, RpcError};
use conduit_rpc::codec::{Frame, FrameReader};
use conduit_rpc::testing::TestHandler;
use conduit_rpc::{Session, SessionConfig};
use jsonrpsee::RpcModule;
use jsonrpsee::types::ErrorObjectOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::AsyncWriteExt;

/// The roles a child can play.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Role {
    Floor,
    Inline,
    Conduit,
    Jsonrpsee,
}

impl Role {
    /// The argument that selects this role.
    pub(crate) fn arg(self) -> &'static str {
        match self {
            Role::Floor => "floor",
            Role::Inline => "inline",
            Role::Conduit => "conduit",
            Role::Jsonrpsee => "jsonrpsee",
        }
    }
}

/// Play `role` until stdin closes; `pin` is the one CPU to run on.
pub(crate) fn run(role: Role, pin: Option<usize>) -> anyhow::Result<()> {
    if let Some(cpu) = pin {
        pin_to(Some(cpu))?;
    }
    match role {
        Role::Floor => floor::serve_lines(),
        Role::Inline | Role::Conduit | Role::Jsonrpsee => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("tokio runtime")?;
            rt.block_on(async move {
                match role {
                    Role::Inline => inline().await,
                    Role::Conduit => conduit().await,
                    _ => jsonrpsee_dispatch().await,
                }
            })
        }
    }
}

/// A conduit session serving `TestHandler`: what an extension built on the SDK runs.
async fn conduit() -> anyhow::Result<()> {
    let (stdin, stdout) = conduit_rpc::stdio::stdio();
    let session = Session::new(
        stdin,
        stdout,
        TestHandler::default(),
        SessionConfig::named("host"),
    );
    session.wait().await;
    Ok(())
}

/// The same framing, parsing and writing as the session, with none of its tasks, tables or
/// queues: read a frame, answer it, write the answer, all on one task. The difference between
/// this and `conduit` is what the session's machinery costs the extension side.
async fn inline() -> anyhow::Result<()> {
    let (stdin, mut stdout) = conduit_rpc::stdio::stdio();
    let mut frames = FrameReader::new(stdin, MAX_MESSAGE_BYTES);
    let mut out = Vec::with_capacity(256);
    while let Some(frame) = frames.next().await {
        let Frame::Message(line) = frame? else {
            continue;
        };
        // Nothing but requests reaches this child in the benchmark; a real loop would route
        // responses and notifications too.
        let Ok(Message::Request { id, method, params }) = Message::parse(&line) else {
            continue;
        };
        out.clear();
        match (method.as_ref(), params) {
            ("echo", Some(p)) => message::write_result(&mut out, &id, p),
            _ => message::write_error(&mut out, Some(&id), &RpcError::method_not_found(&method)),
        }
        out.push(b'\n');
        stdout.write_all(&out).await?;
    }
    Ok(())
}

/// Just enough of a message to route it: requests have both `method` and `id`.
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
}

/// The module the jsonrpsee child dispatches to: `echo` answers its params unparsed, as
/// `TestHandler` does, so both children do the same work per call.
pub(crate) fn echo_module() -> anyhow::Result<RpcModule<()>> {
    let mut module = RpcModule::new(());
    module.register_method("echo", |params, _, _| {
        let raw = params.as_str().unwrap_or("null").to_owned();
        RawValue::from_string(raw)
            .map_err(|e| ErrorObjectOwned::owned(-32602, e.to_string(), None::<()>))
    })?;
    Ok(module)
}

/// conduit's framing on the same epoll pipes, with dispatch through jsonrpsee's `RpcModule`.
/// `raw_json_request` takes only requests (it cannot parse a notification or a response, and
/// would answer a batch), so each line is peeked at first: that second parse is part of what
/// using it costs.
async fn jsonrpsee_dispatch() -> anyhow::Result<()> {
    let module = echo_module()?;
    let (stdin, mut stdout) = conduit_rpc::stdio::stdio();
    let mut frames = FrameReader::new(stdin, MAX_MESSAGE_BYTES);
    let mut out = Vec::with_capacity(256);
    while let Some(frame) = frames.next().await {
        let Frame::Message(line) = frame? else {
            continue;
        };
        let Ok(text) = std::str::from_utf8(&line) else {
            continue;
        };
        let is_request = serde_json::from_str::<Peek<'_>>(text)
            .is_ok_and(|p| p.id.is_some() && p.method.is_some());
        if !is_request {
            continue;
        }
        let (resp, _subscriptions) = module.raw_json_request(text, 1).await?;
        out.clear();
        out.extend_from_slice(resp.get().as_bytes());
        out.push(b'\n');
        stdout.write_all(&out).await?;
    }
    Ok(())
}
