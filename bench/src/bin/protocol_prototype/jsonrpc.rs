//! The host side over conduit's JSON-RPC on stdio: the child is spawned the way the supervisor
//! spawns extensions (`conduit_supervisor::process::spawn`: own process group, parent-death
//! signal, cleared environment, piped stdio), and spoken to through `conduit_rpc::Session`,
//! the session the daemon uses, with `initialize` as the daemon sends it.
//!
//! The host serves the extension's callbacks: `bench.ping` (answered unchanged),
//! `bench.sleeping` (the cue to cancel or kill) and the artifact stream (`artifact.open`/`chunk`/`close`/`abort`), decoding each chunk's base64 and
//! hashing it as the daemon's artifact store does, without its disk write: the comparison is of
//! transports, and the gRPC host hashes without writing too.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail, ensure};
use base64::Engine as _;
use conduit_bench::measure::proc_cpu;
use conduit_bench::prototype::jsonrpc::{
    ARTIFACT, ArtifactParams, CALLBACK, CANCEL_SEEN, CallbackParams, CallbackResult, CancelSeen,
    ECHO, Echo, PING, SLEEP, SLEEPING,
};
use conduit_bench::prototype::{PAYLOAD, VERSION, artifact_id, mono_ns};
use conduit_bench::regime::Cpus;
use conduit_protocol::calls::{
    ArtifactAbort, ArtifactClose, ArtifactOpen, ArtifactOpened, ArtifactStored, ChunkAck, Empty,
    SleepParams,
};
use conduit_protocol::handshake::{InitializeParams, InitializeResult};
use conduit_protocol::{ErrorCode, PROTOCOL_VERSIONS, RpcError, methods};
use conduit_rpc::{
    BoxFuture, CallError, Handler, HandlerResult, Peer, Request, Session, SessionConfig, to_raw,
};
use conduit_supervisor::process::{self, ChildCommand};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use tokio::process::Child;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::transport::{Conn, PHASE_TIMEOUT, Tail, Transport, kill_and_reap, reap_clean};

/// The JSON-RPC transport: `proto-jsonrpc-child` over its stdin and stdout.
#[derive(Debug)]
pub(crate) struct JsonRpc {
    program: PathBuf,
    cwd: PathBuf,
    /// Where children start.
    pub(crate) cpus: Cpus,
}

impl JsonRpc {
    pub(crate) fn new(program: PathBuf) -> JsonRpc {
        let cwd = program
            .parent()
            .map_or_else(|| PathBuf::from("."), |p| p.to_path_buf());
        JsonRpc {
            program,
            cwd,
            cpus: Cpus::default(),
        }
    }

    fn spawn(&self, version: Option<u32>) -> anyhow::Result<(Child, Tail)> {
        let mut args: Vec<OsString> = Vec::new();
        if let Some(v) = version {
            args.push("--protocol-version".into());
            args.push(v.to_string().into());
        }
        let cmd = ChildCommand {
            program: self.program.clone(),
            args,
            cwd: self.cwd.clone(),
            env: vec![("CONDUIT_EXTENSION".into(), "proto-jsonrpc".into())],
        };
        let mut child = self
            .cpus
            .spawn_with(|| process::spawn(&cmd))
            .with_context(|| format!("spawning {}", self.program.display()))?;
        let stderr = child.stderr.take().context("the child's stderr")?;
        Ok((child, Tail::drain(stderr)))
    }

    /// Spawn and send `initialize`; the session and the handshake's outcome.
    async fn handshake(
        &self,
        version: Option<u32>,
    ) -> anyhow::Result<(JsonConn, Result<InitializeResult, CallError>)> {
        let (mut child, tail) = self.spawn(version)?;
        let pid = child.id().context("the child's pid")?;
        let stdin = child.stdin.take().context("the child's stdin")?;
        let stdout = child.stdout.take().context("the child's stdout")?;
        let sleeping = Arc::new(Notify::new());
        let handler = HostHandler {
            sleeping: sleeping.clone(),
            ..HostHandler::default()
        };
        let session = Session::new(
            stdout,
            stdin,
            handler,
            SessionConfig::named("proto-jsonrpc"),
        );
        let peer = session.peer();
        let init = InitializeParams::current(env!("CARGO_PKG_VERSION"));
        let res = peer
            .call::<_, InitializeResult>(methods::host::INITIALIZE, &init, Some(PHASE_TIMEOUT))
            .await;
        let conn = JsonConn {
            child,
            session: Some(session),
            peer,
            pid,
            tail,
            echo: Echo {
                text: PAYLOAD.to_owned(),
            },
            sleeping,
        };
        Ok((conn, res))
    }
}

impl Transport for JsonRpc {
    type Conn = JsonConn;

    fn key(&self) -> &'static str {
        "jsonrpc-stdio"
    }

    async fn start(&mut self) -> anyhow::Result<JsonConn> {
        let (mut conn, res) = self.handshake(None).await?;
        match res {
            Ok(r) if PROTOCOL_VERSIONS.contains(&r.protocol_version) => Ok(conn),
            Ok(r) => {
                let _ = kill_and_reap(&mut conn.child).await;
                bail!("the child chose protocol version {}", r.protocol_version)
            }
            Err(e) => {
                let _ = kill_and_reap(&mut conn.child).await;
                Err(anyhow!(e)).context(format!(
                    "the handshake failed; the child's stderr ended with:\n{}",
                    conn.tail.text()
                ))
            }
        }
    }

    async fn refused(&mut self) -> anyhow::Result<(Duration, Duration)> {
        let start = Instant::now();
        let (conn, res) = self.handshake(Some(VERSION + 1)).await?;
        let took = start.elapsed();
        let child = proc_cpu(conn.pid).unwrap_or_default();
        match res {
            Err(e) if e.is(ErrorCode::VersionMismatch) => {}
            Err(e) => bail!("expected version_mismatch, got {e}"),
            Ok(r) => bail!(
                "a child speaking version {} was accepted with version {}",
                VERSION + 1,
                r.protocol_version
            ),
        }
        conn.close().await?;
        Ok((took, child))
    }
}

/// A ready `proto-jsonrpc-child`.
#[derive(Debug)]
pub(crate) struct JsonConn {
    child: Child,
    /// `None` once closed.
    session: Option<Session>,
    peer: Peer,
    pid: u32,
    tail: Tail,
    echo: Echo,
    /// Notified when the extension's `sleep` says it started.
    sleeping: Arc<Notify>,
}

impl JsonConn {
    async fn cancel_seen(&self, t0: u64) -> anyhow::Result<Duration> {
        // The extension records the moment its handler saw the cancellation; ask until it has
        // (it has, always, by the time the cancelled answer came back).
        for _ in 0..100 {
            let seen: CancelSeen = self.peer.call(CANCEL_SEEN, &Empty {}, None).await?;
            ensure!(
                seen.started_ns != 0 && seen.started_ns < t0,
                "the sleep had not started when it was cancelled (started {}, cancelled {t0})",
                seen.started_ns
            );
            if seen.seen_ns != 0 {
                ensure!(seen.seen_ns >= t0, "seen before it was cancelled");
                return Ok(Duration::from_nanos(seen.seen_ns - t0));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        bail!("the extension never saw the cancellation")
    }
}

impl Conn for JsonConn {
    fn pid(&self) -> u32 {
        self.pid
    }

    async fn echo(&mut self) -> anyhow::Result<()> {
        let back: Echo = self.peer.call(ECHO, &self.echo, None).await?;
        ensure!(back == self.echo, "wrong echo {back:?}");
        Ok(())
    }

    async fn callbacks(&mut self, n: u32) -> anyhow::Result<Vec<u64>> {
        let p = CallbackParams {
            n,
            text: PAYLOAD.to_owned(),
        };
        let r: CallbackResult = self.peer.call(CALLBACK, &p, None).await?;
        Ok(r.nanos)
    }

    async fn pipelined(&mut self, calls: u64, in_flight: usize) -> anyhow::Result<()> {
        let mut pending = FuturesUnordered::new();
        let mut sent = 0u64;
        let mut done = 0u64;
        let call = || self.peer.call::<_, Echo>(ECHO, &self.echo, None);
        while done < calls {
            while pending.len() < in_flight && sent < calls {
                pending.push(call());
                sent += 1;
            }
            let back = pending.next().await.context("no call in flight")??;
            ensure!(back == self.echo, "wrong echo {back:?}");
            done += 1;
        }
        Ok(())
    }

    async fn artifact(&mut self, bytes: u64, chunk_bytes: usize) -> anyhow::Result<()> {
        let p = ArtifactParams { bytes, chunk_bytes };
        let stored: ArtifactStored = self.peer.call(ARTIFACT, &p, None).await?;
        ensure!(
            stored.size == bytes,
            "stored {} bytes of {bytes}",
            stored.size
        );
        ensure!(
            stored.artifact_id == artifact_id(bytes as usize),
            "stored {}",
            stored.artifact_id
        );
        Ok(())
    }

    async fn cancel(&mut self) -> anyhow::Result<Duration> {
        let token = CancellationToken::new();
        let params = serde_json::value::to_raw_value(&SleepParams { ms: 30_000 })?;
        let call =
            self.peer
                .call_raw_cancellable(SLEEP, &params, Some(PHASE_TIMEOUT), Some(&token));
        let sleeping = self.sleeping.clone();
        let cancel = async {
            sleeping.notified().await;
            let t0 = mono_ns();
            token.cancel();
            t0
        };
        let (res, t0) = tokio::join!(call, cancel);
        match res {
            Err(e) if e.is(ErrorCode::Cancelled) => {}
            Err(e) => bail!("the cancelled sleep failed otherwise: {e}"),
            Ok(r) => bail!("the cancelled sleep answered {}", r.get()),
        }
        self.cancel_seen(t0).await
    }

    async fn crash(mut self) -> anyhow::Result<Duration> {
        let peer = self.peer.clone();
        let params = serde_json::value::to_raw_value(&SleepParams { ms: 60_000 })?;
        let pending = tokio::spawn(async move { peer.call_raw(SLEEP, &params, None).await });
        tokio::time::timeout(PHASE_TIMEOUT, self.sleeping.notified())
            .await
            .context("the extension never said it was sleeping")?;
        let start = Instant::now();
        self.child.start_kill().context("SIGKILL")?;
        let res = pending.await.context("the pending call's task")?;
        let took = start.elapsed();
        match res {
            Err(CallError::Closed { .. }) => {}
            Err(e) => bail!("the pending call failed otherwise: {e}"),
            Ok(r) => bail!("the pending call answered {}", r.get()),
        }
        self.child
            .wait()
            .await
            .context("reaping the killed child")?;
        Ok(took)
    }

    async fn kill(mut self) -> anyhow::Result<()> {
        kill_and_reap(&mut self.child).await?;
        drop(self.session.take());
        Ok(())
    }

    async fn close(mut self) -> anyhow::Result<()> {
        if let Some(s) = self.session.take() {
            // Writes what is queued, then closes the child's stdin: the SDK exits at EOF.
            s.close(Duration::from_millis(500)).await;
        }
        reap_clean(&mut self.child, "proto-jsonrpc-child", &self.tail).await
    }
}

/// `artifact.chunk` params, borrowing the data from the request.
#[derive(serde::Deserialize)]
struct ChunkRef<'a> {
    #[serde(borrow)]
    stream_id: Cow<'a, str>,
    seq: u64,
    #[serde(borrow)]
    data: Cow<'a, str>,
}

/// One open artifact stream on the host.
struct Stream {
    hasher: Sha256,
    received: u64,
    next_seq: u64,
}

/// The host's side of the callbacks: `bench.ping`, `bench.sleeping` and the artifact stream.
///
/// Each request is served in `request` itself, which the session calls on its reader task in
/// arrival order, so chunks are hashed in `seq` order with no reordering of its own.
#[derive(Default)]
struct HostHandler {
    streams: Mutex<HashMap<String, Stream>>,
    next_stream: AtomicU64,
    sleeping: Arc<Notify>,
}

impl HostHandler {
    fn serve(&self, req: &Request) -> HandlerResult {
        match req.method.as_str() {
            PING => to_raw(&req.params::<Echo>()?),
            SLEEPING => {
                self.sleeping.notify_one();
                to_raw(&Empty {})
            }
            methods::ext::ARTIFACT_OPEN => {
                let _open: ArtifactOpen = req.params()?;
                let id = format!("s{}", self.next_stream.fetch_add(1, Ordering::Relaxed));
                self.lock().insert(
                    id.clone(),
                    Stream {
                        hasher: Sha256::new(),
                        received: 0,
                        next_seq: 0,
                    },
                );
                to_raw(&ArtifactOpened {
                    stream_id: id,
                    max_chunk_bytes: conduit_protocol::MAX_ARTIFACT_CHUNK_BYTES,
                    window: conduit_protocol::ARTIFACT_WINDOW,
                })
            }
            methods::ext::ARTIFACT_CHUNK => {
                // Borrowed from the request rather than copied into an `ArtifactChunk`: the
                // chunk is 87 KiB of base64, and a copy of it per chunk is a cost of this
                // handler, not of the transport.
                let raw = req.params.as_deref().map_or("{}", RawValue::get);
                let c: ChunkRef<'_> = serde_json::from_str(raw)
                    .map_err(|e| RpcError::invalid_params(&req.method, e))?;
                let data = base64::engine::general_purpose::STANDARD
                    .decode(c.data.as_bytes())
                    .map_err(|e| invalid(format!("chunk {}: {e}", c.seq)))?;
                let mut streams = self.lock();
                let s = streams
                    .get_mut(c.stream_id.as_ref())
                    .ok_or_else(|| invalid("no such stream"))?;
                if c.seq != s.next_seq {
                    return Err(invalid(format!("chunk {} out of order", c.seq)));
                }
                s.hasher.update(&data);
                s.received += data.len() as u64;
                s.next_seq += 1;
                to_raw(&ChunkAck {
                    received: s.received,
                })
            }
            methods::ext::ARTIFACT_CLOSE => {
                let c: ArtifactClose = req.params()?;
                let s = self
                    .lock()
                    .remove(&c.stream_id)
                    .ok_or_else(|| invalid("no such stream"))?;
                let digest = hex::encode(s.hasher.finalize());
                if digest != c.sha256 || s.received != c.size {
                    return Err(invalid("size or digest do not match what was received"));
                }
                to_raw(&ArtifactStored {
                    artifact_id: format!("sha256:{digest}"),
                    size: s.received,
                })
            }
            methods::ext::ARTIFACT_ABORT => {
                let a: ArtifactAbort = req.params()?;
                self.lock().remove(&a.stream_id);
                to_raw(&Empty {})
            }
            other => Err(RpcError::method_not_found(other)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Stream>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn invalid(msg: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::ArtifactInvalid, msg)
}

impl Handler for HostHandler {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        Box::pin(std::future::ready(self.serve(&req)))
    }
}
