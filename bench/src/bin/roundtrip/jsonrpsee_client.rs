//! jsonrpsee's client over a child's pipes, with the demultiplexer a bidirectional protocol
//! needs.
//!
//! ```text
//!   Client ──► send task ──► StdinSender ──┐ (shared, locked per line)
//!                                          ├──► child stdin
//!   demux task: host RpcModule answers ────┘
//!        ▲  lines with `method` and `id` (the child's callbacks)
//!        │
//!   child stdout ──► FrameReader ──► demux ──► other lines ──► ChannelReceiver ──► Client
//! ```
//!
//! jsonrpsee's client has no idea the server may call it: it reads an incoming request as a
//! notification and drops its id. So one reader task owns the child's stdout, answers the
//! requests among its lines with an `RpcModule` of the host's own, and passes everything else
//! to the client through a channel. Reads stay bounded by conduit's `FrameReader`.
//!
//! Not here: deadlines with `$/cancel`, overload limits, cancellation of handlers — jsonrpsee
//! has none of these for this transport; the recommendation in `docs/jsonrpsee.md` weighs
//! that.

use std::borrow::Cow;
use std::io;
use std::sync::Arc;

use conduit_rpc::codec::{Frame, FrameReader};
use jsonrpsee::RpcModule;
use jsonrpsee::core::client::{ReceivedMessage, TransportReceiverT, TransportSenderT};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;

/// The child's stdin, shared by the client's send task and the demux's answers.
type SharedWriter<W> = Arc<Mutex<W>>;

/// Writes each message the client sends as one line.
pub(crate) struct StdinSender<W> {
    out: SharedWriter<W>,
}

impl<W: AsyncWrite + Unpin + Send + 'static> TransportSenderT for StdinSender<W> {
    type Error = io::Error;

    async fn send(&mut self, msg: String) -> Result<(), io::Error> {
        let mut line = msg.into_bytes();
        line.push(b'\n');
        self.out.lock().await.write_all(&line).await
    }
}

/// Hands the client the lines the demux did not keep.
pub(crate) struct ChannelReceiver {
    lines: mpsc::Receiver<String>,
}

impl TransportReceiverT for ChannelReceiver {
    type Error = io::Error;

    async fn receive(&mut self) -> Result<ReceivedMessage, io::Error> {
        match self.lines.recv().await {
            Some(line) => Ok(ReceivedMessage::Text(line)),
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the child closed its stdout",
            )),
        }
    }
}

#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
}

/// The transport halves for `ClientBuilder::build_with_tokio`, and the demux task. Abort the
/// task when done with the client: it holds the write half too, so the child's stdin closes
/// only when both the client and the task are gone.
pub(crate) fn transport<R, W>(
    read: R,
    write: W,
    host_methods: RpcModule<()>,
    max_line: usize,
) -> (StdinSender<W>, ChannelReceiver, JoinHandle<()>)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let out = Arc::new(Mutex::new(write));
    // Room for as many answers as calls the client may have in flight by default.
    let (tx, rx) = mpsc::channel(256);
    let demux_out = out.clone();
    let demux = tokio::spawn(async move {
        let mut frames = FrameReader::new(read, max_line);
        while let Some(Ok(frame)) = frames.next().await {
            let Frame::Message(line) = frame else {
                continue;
            };
            let Ok(text) = std::str::from_utf8(&line) else {
                continue;
            };
            let is_request = serde_json::from_str::<Peek<'_>>(text)
                .is_ok_and(|p| p.id.is_some() && p.method.is_some());
            if is_request {
                let Ok((resp, _)) = host_methods.raw_json_request(text, 1).await else {
                    continue;
                };
                let mut answer = resp.get().as_bytes().to_vec();
                answer.push(b'\n');
                if demux_out.lock().await.write_all(&answer).await.is_err() {
                    break;
                }
            } else if tx.send(text.to_owned()).await.is_err() {
                break;
            }
        }
    });
    (StdinSender { out }, ChannelReceiver { lines: rx }, demux)
}
