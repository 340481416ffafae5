//! The host side over conduit's JSON-RPC on stdio: the child is spawned the way the supervisor
//! spawns extensions (`conduit_supervisor::process::spawn`: own process group, parent-death
//! signal, cleared environment, piped stdio), and spoken to through `conduit_rpc::Session`,
//! the session the daemon uses, with `initialize` as the daemon sends it.
//!
//! The host serves the extension's callbacks: `bench.ping` (answered unchanged),
//! `bench.sleeping` (the cue to cancel or kill) and the artifact stream (`artifact.open`/`chunk`/`close`/`abort`), decoding each chunk's base64 and
//! hashing it as the daemon's artifact store does (the digest is the receiver's, answered at
//! close; the SDK sends none), without its disk write: the comparison is of transports, and
//! the gRPC host hashes without writing too. The daemon's own path, disk included, is
//! `daemon.rs`.

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
    BoxFuture, CallError, CallOptions, Handler, HandlerResult, Peer, Request, Session,
    SessionConfig, to_raw,
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

    /// Spawn the child as the supervisor does, the bulk pipe's write end its descriptor 3; the
    /// read end is handed back.
    fn spawn(&self, version: Option<u32>) -> anyhow::Result<(Child, Tail, std::os::fd::OwnedFd)> {
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
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("the bulk pipe")?;
        let mut child = self
            .cpus
            .spawn_with(|| {
                process::spawn_with_bulk(
                    &cmd,
                    &process::Confinement::none(),
                    Some(std::os::fd::AsFd::as_fd(&write)),
                )
            })
            .with_context(|| format!("spawning {}", self.program.display()))?
            .0;
        drop(write);
        let stderr = child.stderr.take().context("the child's stderr")?;
        Ok((child, Tail::drain(stderr), read))
    }

    /// Spawn and send `initialize`; the session and the handshake's outcome.
    async fn handshake(
        &self,
        version: Option<u32>,
    ) -> anyhow::Result<(JsonConn, Result<InitializeResult, CallError>)> {
        let (mut child, tail, bulk) = self.spawn(version)?;
        let pid = child.id().context("the child's pid")?;
        let stdin = child.stdin.take().context("the child's stdin")?;
        let stdout = child.stdout.take().context("the child's stdout")?;
        let sleeping = Arc::new(Notify::new());
        let handler = Arc::new(HostHandler {
            sleeping: sleeping.clone(),
            ..HostHandler::default()
        });
        let session = Session::new(
            stdout,
            stdin,
            Shared(handler.clone()),
            SessionConfig::named("proto-jsonrpc"),
        );
        let peer = session.peer();
        // Read until the child's end closes (it exits) or the session ends.
        let reader = handler.clone();
        let ended = peer.clone();
        tokio::spawn(async move {
            tokio::select! {
                r = reader.read_bulk(bulk) => if let Err(e) = r { eprintln!("protocol-prototype: the bulk pipe: {e:#}") },
                _ = ended.closed() => {}
            }
        });
        let init = InitializeParams::current(env!("CARGO_PKG_VERSION")).with_bulk();
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

    fn has_json_chunks(&self) -> bool {
        true
    }

    async fn artifact(
        &mut self,
        bytes: u64,
        chunk_bytes: usize,
        json_chunks: bool,
    ) -> anyhow::Result<()> {
        let p = ArtifactParams {
            bytes,
            chunk_bytes,
            json_chunks,
            salt: 0,
        };
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
        let params = serde_json::value::to_raw_value(&SleepParams::new(30_000))?;
        let call = self.peer.request(
            SLEEP,
            &params,
            CallOptions::within(Some(PHASE_TIMEOUT)).cancelled_by(&token),
        );
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
        let params = serde_json::value::to_raw_value(&SleepParams::new(60_000))?;
        let pending = tokio::spawn(async move {
            peer.request(SLEEP, &params, CallOptions::within(None))
                .await
        });
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
    /// Its tag on the bulk pipe, when its bytes come that way.
    tag: Option<u32>,
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
    /// Bulk tag → stream id.
    tags: Mutex<HashMap<u32, String>>,
    /// Told whenever bulk bytes were taken.
    bulk_moved: Notify,
}

/// The handler, shared with the bulk pipe's reader.
struct Shared(Arc<HostHandler>);

impl Handler for Shared {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        let h = self.0.clone();
        if req.method == methods::ext::ARTIFACT_CLOSE {
            return Box::pin(async move { h.close(&req).await });
        }
        Box::pin(std::future::ready(h.serve(&req)))
    }
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
                let open: ArtifactOpen = req.params()?;
                let n = self.next_stream.fetch_add(1, Ordering::Relaxed);
                let id = format!("s{n}");
                let tag = open.bulk.then_some(n as u32);
                if let Some(tag) = tag {
                    lock(&self.tags).insert(tag, id.clone());
                }
                self.lock().insert(
                    id.clone(),
                    Stream {
                        hasher: Sha256::new(),
                        received: 0,
                        next_seq: 0,
                        tag,
                    },
                );
                let mut opened = ArtifactOpened::new(
                    id,
                    conduit_protocol::MAX_ARTIFACT_CHUNK_BYTES,
                    conduit_protocol::ARTIFACT_WINDOW,
                )
                .with_sha256_optional(true);
                opened.bulk_tag = tag;
                to_raw(&opened)
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
                to_raw(&ChunkAck::new(s.received))
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
        lock(&self.streams)
    }

    /// `artifact.close`: for a bulk stream, once its `size` bytes have come on the pipe.
    async fn close(&self, req: &Request) -> HandlerResult {
        let c: ArtifactClose = req.params()?;
        let deadline = tokio::time::Instant::now() + PHASE_TIMEOUT;
        loop {
            let moved = self.bulk_moved.notified();
            {
                let streams = self.lock();
                let s = streams
                    .get(&c.stream_id)
                    .ok_or_else(|| invalid("no such stream"))?;
                if s.tag.is_none() || s.received >= c.size {
                    break;
                }
            }
            if tokio::time::timeout_at(deadline, moved).await.is_err() {
                return Err(invalid("the bulk bytes never came"));
            }
        }
        let s = self
            .lock()
            .remove(&c.stream_id)
            .ok_or_else(|| invalid("no such stream"))?;
        if let Some(tag) = s.tag {
            lock(&self.tags).remove(&tag);
        }
        let digest = hex::encode(s.hasher.finalize());
        if c.sha256.is_some_and(|claim| claim != digest) || s.received != c.size {
            return Err(invalid("size or digest do not match what was received"));
        }
        to_raw(&ArtifactStored::new(digest, s.received))
    }

    /// Read the bulk pipe until it ends, hashing each piece into its stream.
    async fn read_bulk(&self, fd: std::os::fd::OwnedFd) -> anyhow::Result<()> {
        // The buffer the daemon gives the pipe while a stream is open on it.
        let _ = process::set_pipe_size(std::os::fd::AsFd::as_fd(&fd), 1024 * 1024);
        let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?;
        let mut decoder = conduit_protocol::bulk::Decoder::new();
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            rx.readable().await?;
            let n = match rx.try_read(&mut buf) {
                Ok(0) => return Ok(decoder.finish()?),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.into()),
            };
            {
                let tags = lock(&self.tags);
                let mut streams = self.lock();
                decoder.feed(&buf[..n], |tag, bytes| {
                    if let Some(s) = tags.get(&tag).and_then(|id| streams.get_mut(id)) {
                        s.hasher.update(bytes);
                        s.received += bytes.len() as u64;
                    }
                })?;
            }
            self.bulk_moved.notify_waiters();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn invalid(msg: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::ArtifactInvalid, msg)
}
