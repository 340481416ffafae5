//! The host side over gRPC (tonic, HTTP/2 on Unix sockets), run the way go-plugin runs a
//! plugin: spawn the child (with the same `conduit_supervisor::process::spawn` as the JSON-RPC
//! side, so both pay for the same isolation), read its handshake line on stdout, dial the
//! socket it names, call `Handshake`.
//!
//! The host serves `conduit.bench.Host` on a socket of its own for the extension's callbacks:
//! `Ping` (answered unchanged), `Sleeping` (the cue to cancel or kill) and the
//! client-streaming `Artifact`, hashed and checked as the
//! JSON-RPC host checks its `artifact.*` stream.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use conduit_bench::measure::proc_cpu;
use conduit_bench::prototype::grpc::{
    self, ArtifactChunk, ArtifactStored, CallbackReply, CallbackRequest, CancelSeenReply, EchoMsg,
    Empty, Handshake, HandshakeReply, ProduceRequest, Router, SleepReply, SleepRequest,
};
use conduit_bench::prototype::{PAYLOAD, VERSION, artifact_id, mono_ns};
use conduit_bench::regime::Cpus;
use conduit_supervisor::process::{self, ChildCommand};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixListener;
use tokio::process::Child;
use tokio::sync::Notify;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

use crate::transport::{Conn, PHASE_TIMEOUT, Tail, Transport, kill_and_reap, reap_clean};

/// Start serving `conduit.bench.Host` on `dir/host.sock`, in a task of the current runtime;
/// returns the socket's path and what `Sleeping` notifies.
pub(crate) fn serve_host(dir: &Path) -> anyhow::Result<(String, Arc<Notify>)> {
    let path = dir.join("host.sock");
    let _ = std::fs::remove_file(&path);
    let listener =
        UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    let sleeping = Arc::new(Notify::new());
    let notify = sleeping.clone();
    let router = Router::new()
        .unary(grpc::PING, |m: EchoMsg| async move { Ok(m) })
        .unary(grpc::SLEEPING, move |e: Empty| {
            notify.notify_one();
            async move { Ok(e) }
        })
        .client_streaming(grpc::ARTIFACT, receive_artifact);
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tokio::spawn(async move {
        if let Err(e) = tonic::transport::Server::builder()
            .serve_with_incoming(router, incoming)
            .await
        {
            eprintln!("protocol-prototype: the host's gRPC service stopped: {e}");
        }
    });
    let path = path
        .to_str()
        .map(str::to_owned)
        .context("the socket path is not UTF-8")?;
    Ok((path, sleeping))
}

/// Hash the stream as it arrives and check the sender's claim in its last chunk: its size, and
/// its digest when it sent one (the same rule as `artifact.close`, docs/protocol.md §8).
async fn receive_artifact(mut s: Streaming<ArtifactChunk>) -> Result<ArtifactStored, Status> {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut claim = (String::new(), 0u64);
    while let Some(c) = s.message().await? {
        hasher.update(&c.data);
        size += c.data.len() as u64;
        claim = (c.sha256, c.size);
    }
    let digest = hex::encode(hasher.finalize());
    let (sha, n) = claim;
    if n != size || !(sha.is_empty() || sha == digest) {
        return Err(Status::invalid_argument(
            "size or digest do not match what was received",
        ));
    }
    Ok(ArtifactStored {
        artifact_id: format!("sha256:{digest}"),
        size,
    })
}

/// The gRPC transport: `proto-grpc-child` on a Unix socket.
#[derive(Debug)]
pub(crate) struct Grpc {
    program: PathBuf,
    cwd: PathBuf,
    dir: PathBuf,
    host_socket: String,
    sleeping: Arc<Notify>,
    spawned: u64,
    /// Where children start.
    pub(crate) cpus: Cpus,
}

impl Grpc {
    /// Children listen in `dir`; the host serves its callbacks on `host_socket`.
    pub(crate) fn new(
        program: PathBuf,
        dir: &Path,
        (host_socket, sleeping): (String, Arc<Notify>),
    ) -> Grpc {
        let cwd = program
            .parent()
            .map_or_else(|| PathBuf::from("."), |p| p.to_path_buf());
        Grpc {
            program,
            cwd,
            dir: dir.to_path_buf(),
            host_socket,
            sleeping,
            spawned: 0,
            cpus: Cpus::default(),
        }
    }

    /// Spawn, read the handshake line, connect, call `Handshake`.
    async fn handshake(
        &mut self,
        version: Option<u32>,
    ) -> anyhow::Result<(GrpcConn, Result<HandshakeReply, Status>)> {
        self.spawned += 1;
        let socket = self.dir.join(format!("ext-{}.sock", self.spawned));
        let _ = std::fs::remove_file(&socket);
        let mut args: Vec<OsString> = vec![
            "--socket".into(),
            socket.clone().into(),
            "--host-socket".into(),
            self.host_socket.clone().into(),
        ];
        if let Some(v) = version {
            args.push("--protocol-version".into());
            args.push(v.to_string().into());
        }
        let cmd = ChildCommand {
            program: self.program.clone(),
            args,
            cwd: self.cwd.clone(),
            env: vec![("CONDUIT_EXTENSION".into(), "proto-grpc".into())],
        };
        let mut child = self
            .cpus
            .spawn_with(|| process::spawn(&cmd))
            .with_context(|| format!("spawning {}", self.program.display()))?;
        let pid = child.id().context("the child's pid")?;
        let tail = Tail::drain(child.stderr.take().context("the child's stderr")?);
        let mut stdout = BufReader::new(child.stdout.take().context("the child's stdout")?);
        let mut line = String::new();
        let read = tokio::time::timeout(PHASE_TIMEOUT, stdout.read_line(&mut line)).await;
        let path = match read {
            Ok(Ok(n)) if n > 0 => grpc::parse_announce(&line)
                .with_context(|| format!("not a handshake line: {line:?}"))?
                .to_owned(),
            _ => {
                let _ = kill_and_reap(&mut child).await;
                bail!(
                    "no handshake line from the child; its stderr ended with:\n{}",
                    tail.text()
                );
            }
        };
        let channel = match grpc::connect(&path).await {
            Ok(c) => c,
            Err(e) => {
                let _ = kill_and_reap(&mut child).await;
                return Err(e).context(format!("connecting to {path}"));
            }
        };
        let hello = Handshake {
            protocol_versions: vec![VERSION],
            host: "conduit".into(),
        };
        let res = grpc::call::<_, HandshakeReply>(&channel, grpc::HANDSHAKE, hello).await;
        let conn = GrpcConn {
            child,
            channel: Some(channel),
            pid,
            socket,
            tail,
            sleeping: self.sleeping.clone(),
        };
        Ok((conn, res))
    }
}

impl Transport for Grpc {
    type Conn = GrpcConn;

    fn key(&self) -> &'static str {
        "grpc-uds"
    }

    async fn start(&mut self) -> anyhow::Result<GrpcConn> {
        let (mut conn, res) = self.handshake(None).await?;
        match res {
            Ok(r) if r.protocol_version == VERSION => Ok(conn),
            Ok(r) => {
                let _ = kill_and_reap(&mut conn.child).await;
                bail!("the child chose protocol version {}", r.protocol_version)
            }
            Err(e) => {
                let _ = kill_and_reap(&mut conn.child).await;
                bail!(
                    "the handshake failed: {e}; the child's stderr ended with:\n{}",
                    conn.tail.text()
                )
            }
        }
    }

    async fn refused(&mut self) -> anyhow::Result<(Duration, Duration)> {
        let start = Instant::now();
        let (conn, res) = self.handshake(Some(VERSION + 1)).await?;
        let took = start.elapsed();
        let child = proc_cpu(conn.pid).unwrap_or_default();
        match res {
            Err(s) if s.code() == Code::FailedPrecondition => {}
            Err(s) => bail!("expected FAILED_PRECONDITION, got {s}"),
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

/// A ready `proto-grpc-child`.
#[derive(Debug)]
pub(crate) struct GrpcConn {
    child: Child,
    /// `None` once closed.
    channel: Option<Channel>,
    pid: u32,
    socket: PathBuf,
    tail: Tail,
    /// Notified when the extension's `Sleep` says it started.
    sleeping: Arc<Notify>,
}

impl GrpcConn {
    fn channel(&self) -> &Channel {
        self.channel.as_ref().expect("open until closed")
    }

    fn forget_socket(&self) {
        // A killed child leaves its socket behind.
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Conn for GrpcConn {
    fn pid(&self) -> u32 {
        self.pid
    }

    async fn echo(&mut self) -> anyhow::Result<()> {
        let msg = EchoMsg {
            text: PAYLOAD.to_owned(),
        };
        let back: EchoMsg = grpc::call(self.channel(), grpc::ECHO, msg).await?;
        ensure!(back.text == PAYLOAD, "wrong echo {back:?}");
        Ok(())
    }

    async fn callbacks(&mut self, n: u32) -> anyhow::Result<Vec<u64>> {
        let req = CallbackRequest {
            n,
            text: PAYLOAD.to_owned(),
        };
        let r: CallbackReply = grpc::call(self.channel(), grpc::CALLBACK, req).await?;
        Ok(r.nanos)
    }

    async fn pipelined(&mut self, calls: u64, in_flight: usize) -> anyhow::Result<()> {
        let channel = self.channel();
        let call = || {
            let msg = EchoMsg {
                text: PAYLOAD.to_owned(),
            };
            grpc::call::<_, EchoMsg>(channel, grpc::ECHO, msg)
        };
        let mut pending = FuturesUnordered::new();
        let mut sent = 0u64;
        let mut done = 0u64;
        while done < calls {
            while pending.len() < in_flight && sent < calls {
                pending.push(call());
                sent += 1;
            }
            let back = pending.next().await.context("no call in flight")??;
            ensure!(back.text == PAYLOAD, "wrong echo {back:?}");
            done += 1;
        }
        Ok(())
    }

    async fn artifact(
        &mut self,
        bytes: u64,
        chunk_bytes: usize,
        _json_chunks: bool,
    ) -> anyhow::Result<()> {
        let req = ProduceRequest {
            bytes,
            chunk_bytes: chunk_bytes as u32,
        };
        let stored: ArtifactStored = grpc::call(self.channel(), grpc::PRODUCE, req).await?;
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
        let channel = self.channel().clone();
        let call = tokio::spawn(async move {
            grpc::call::<_, SleepReply>(&channel, grpc::SLEEP, SleepRequest { ms: 30_000 }).await
        });
        tokio::time::timeout(PHASE_TIMEOUT, self.sleeping.notified())
            .await
            .context("the extension never said it was sleeping")?;
        // Dropping the call is how a tonic client cancels: the stream is reset (RST_STREAM).
        let t0 = mono_ns();
        call.abort();
        match call.await {
            Err(e) if e.is_cancelled() => {}
            Err(e) => bail!("the cancelled sleep's task failed: {e}"),
            Ok(r) => bail!("the cancelled sleep finished: {r:?}"),
        }
        // The extension records the moment its handler's future was dropped; the reset
        // reaches it before this query on the same connection, but its handler's task may run
        // after the query's, so ask until it has.
        for _ in 0..100 {
            let seen: CancelSeenReply =
                grpc::call(self.channel(), grpc::CANCEL_SEEN, Empty {}).await?;
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

    async fn crash(mut self) -> anyhow::Result<Duration> {
        let channel = self.channel().clone();
        let pending = tokio::spawn(async move {
            grpc::call::<_, SleepReply>(&channel, grpc::SLEEP, SleepRequest { ms: 60_000 }).await
        });
        tokio::time::timeout(PHASE_TIMEOUT, self.sleeping.notified())
            .await
            .context("the extension never said it was sleeping")?;
        let start = Instant::now();
        self.child.start_kill().context("SIGKILL")?;
        let res = pending.await.context("the pending call's task")?;
        let took = start.elapsed();
        if let Ok(r) = res {
            bail!("the pending call answered {r:?}");
        }
        self.child
            .wait()
            .await
            .context("reaping the killed child")?;
        self.forget_socket();
        Ok(took)
    }

    async fn kill(mut self) -> anyhow::Result<()> {
        kill_and_reap(&mut self.child).await?;
        self.channel = None;
        self.forget_socket();
        Ok(())
    }

    async fn close(mut self) -> anyhow::Result<()> {
        self.channel = None;
        // The child exits when its stdin closes, as conduit extensions do.
        drop(self.child.stdin.take());
        let res = reap_clean(&mut self.child, "proto-grpc-child", &self.tail).await;
        self.forget_socket();
        res
    }
}
