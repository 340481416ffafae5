//! The transport comparison's gRPC extension: the workload of `conduit_bench::prototype` served
//! with tonic on a Unix socket, the way a go-plugin-style plugin runs.
//!
//! Run by `protocol-prototype` as
//! `proto-grpc-child --socket PATH --host-socket PATH [--protocol-version N]`: it listens on
//! `--socket`, prints go-plugin's handshake line (`1|<version>|unix|<path>|grpc`) on stdout,
//! serves `conduit.bench.Extension`, and calls the host back on `--host-socket`
//! (`conduit.bench.Host`: `Ping`, `Sleeping`, and the client-streaming `Artifact`). It exits when its stdin
//! closes, as conduit extensions do, removing its socket.
//!
//! Like the SDK, it runs one current-thread tokio runtime: the comparison is between
//! transports, not between threading models.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use conduit_bench::prototype::grpc::{
    self, ArtifactChunk, ArtifactStored, CallbackReply, CallbackRequest, CancelSeenReply, EchoMsg,
    Empty, Handshake, HandshakeReply, ProduceRequest, Router, SleepReply, SleepRequest,
};
use conduit_bench::prototype::{ARTIFACT_NAME, ChildArgs, SleepProbe, VERSION, artifact_bytes};
use futures::StreamExt as _;
use tokio::io::AsyncReadExt;
use tokio::net::UnixListener;
use tonic::Status;
use tonic::transport::Channel;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("proto-grpc-child: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let args = ChildArgs::parse(std::env::args().skip(1)).map_err(anyhow::Error::msg)?;
    let socket = args.socket.context("--socket is required")?;
    let host_socket = args.host_socket.context("--host-socket is required")?;
    let version = args.protocol_version.unwrap_or(VERSION);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(serve(socket, host_socket, version))
}

async fn serve(socket: String, host_socket: String, version: u32) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).with_context(|| format!("binding {socket}"))?;
    // Connected on first use: a plugin that never calls back never dials.
    let host = grpc::lazy_channel(&host_socket).context("the host's endpoint")?;
    let router = routes(version, host);

    {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        out.write_all(grpc::announce_line(version, &socket).as_bytes())?;
        out.flush()?;
    }

    // Exit when the host closes our stdin. Read through the reactor, not tokio's stdin, whose
    // blocking read on a thread of its own would keep the runtime from shutting down.
    let stdin = std::io::stdin();
    let fd = std::os::fd::AsFd::as_fd(&stdin)
        .try_clone_to_owned()
        .context("stdin")?;
    let mut stdin = tokio::net::unix::pipe::Receiver::from_owned_fd(fd).context("stdin pipe")?;
    let closed = async move {
        let mut buf = [0u8; 64];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
    };

    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let res = tokio::select! {
        r = tonic::transport::Server::builder().serve_with_incoming(router, incoming) => r.context("serving"),
        () = closed => Ok(()),
    };
    let _ = std::fs::remove_file(&socket);
    res
}

fn routes(version: u32, host: Channel) -> Router {
    let cb_host = host.clone();
    let sleep_host = host.clone();
    Router::new()
        .unary(grpc::HANDSHAKE, move |h: Handshake| async move {
            if !h.protocol_versions.contains(&version) {
                return Err(Status::failed_precondition(format!(
                    "version mismatch: the host speaks {:?}, this extension {version}",
                    h.protocol_versions
                )));
            }
            Ok(HandshakeReply {
                protocol_version: version,
                name: "proto-grpc".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                methods: ["Echo", "Callback", "Sleep", "CancelSeen", "Produce"]
                    .map(String::from)
                    .to_vec(),
            })
        })
        .unary(grpc::ECHO, |m: EchoMsg| async move { Ok(m) })
        .unary(grpc::CALLBACK, move |r: CallbackRequest| {
            let host = cb_host.clone();
            async move { callback(&host, r).await }
        })
        .unary(grpc::SLEEP, move |r: SleepRequest| {
            let host = sleep_host.clone();
            async move {
                // gRPC tells a handler of a cancellation only by dropping its future: the
                // probe's drop is the moment the extension sees it.
                let probe = SleepProbe::start();
                // Not awaited, as in the JSON-RPC child.
                tokio::spawn(async move {
                    let _ = grpc::call::<_, Empty>(&host, grpc::SLEEPING, Empty {}).await;
                });
                tokio::time::sleep(Duration::from_millis(r.ms)).await;
                probe.finished();
                Ok(SleepReply { slept_ms: r.ms })
            }
        })
        .unary(grpc::CANCEL_SEEN, |_e: Empty| async move {
            let (started_ns, seen_ns) = SleepProbe::take();
            Ok(CancelSeenReply {
                started_ns,
                seen_ns,
            })
        })
        .unary(grpc::PRODUCE, move |r: ProduceRequest| {
            let host = host.clone();
            async move { produce(&host, r).await }
        })
}

/// `n` sequential `Ping` calls to the host, each timed here.
async fn callback(host: &Channel, r: CallbackRequest) -> Result<CallbackReply, Status> {
    let mut nanos = Vec::with_capacity(r.n as usize);
    for _ in 0..r.n {
        let ping = EchoMsg {
            text: r.text.clone(),
        };
        let start = Instant::now();
        let back: EchoMsg = grpc::call(host, grpc::PING, ping).await?;
        nanos.push(start.elapsed().as_nanos() as u64);
        if back.text != r.text {
            return Err(Status::internal("the host's ping answered other text"));
        }
    }
    Ok(CallbackReply { nanos })
}

/// Stream the artifact to the host's `Artifact` in chunks; the last chunk carries the size.
/// The host computes the digest and answers it, as conduit's host does (docs/protocol.md §8):
/// the sender does not hash.
async fn produce(host: &Channel, r: ProduceRequest) -> Result<ArtifactStored, Status> {
    let data = bytes::Bytes::from_static(artifact_bytes(r.bytes as usize));
    let chunk = (r.chunk_bytes as usize).max(1);
    let n = data.len().div_ceil(chunk).max(1);
    let total = data.len() as u64;
    let chunks = futures::stream::iter(0..n).map(move |i| {
        let piece = data.slice(i * chunk..((i + 1) * chunk).min(data.len()));
        let last = i + 1 == n;
        ArtifactChunk {
            name: if i == 0 {
                ARTIFACT_NAME.into()
            } else {
                String::new()
            },
            data: piece,
            sha256: String::new(),
            size: if last { total } else { 0 },
        }
    });
    grpc::client_stream(host, grpc::ARTIFACT, chunks).await
}
