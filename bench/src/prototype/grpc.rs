//! The workload over gRPC (tonic, HTTP/2 over Unix sockets), written out by hand: the protobuf
//! messages as prost structs, and the little of tonic-build's output a service needs — a
//! router from method path to handler, and a client call.
//!
//! ```text
//!   service conduit.bench.Extension {          // served by proto-grpc-child on --socket
//!     rpc Handshake(Handshake) returns (HandshakeReply);
//!     rpc Echo(EchoMsg) returns (EchoMsg);
//!     rpc Callback(CallbackRequest) returns (CallbackReply);
//!     rpc Sleep(SleepRequest) returns (SleepReply);
//!     rpc CancelSeen(Empty) returns (CancelSeenReply);
//!     rpc Produce(ProduceRequest) returns (ArtifactStored);
//!   }
//!   service conduit.bench.Host {               // served by the host on --host-socket
//!     rpc Ping(EchoMsg) returns (EchoMsg);
//!     rpc Artifact(stream ArtifactChunk) returns (ArtifactStored);
//!     rpc Sleeping(Empty) returns (Empty);
//!   }
//! ```
//!
//! The extension announces itself the way go-plugin does, one line on stdout once it listens:
//! `1|<protocol version>|unix|<socket path>|grpc`. The host then connects and calls
//! `Handshake`; a child that speaks none of the host's versions answers
//! `FAILED_PRECONDITION`. Bytes travel from the extension to the host, so the artifact is a
//! client stream the extension opens on the host's service, as conduit's `artifact.*`
//! callbacks are.
//!
//! Hand-written rather than generated so that the comparison needs neither protoc nor a build
//! script; the code on the hot path is what tonic-build would emit (a `tonic::server::Grpc`
//! per request with a `ProstCodec`, `ready()` then `unary` on a cloned `Channel`), except that
//! requests find their handler through a `HashMap` instead of a `match`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::uri::PathAndQuery;
use tonic::body::Body;
use tonic::transport::Channel;
use tonic::{Status, Streaming};
use tonic_prost::ProstCodec;

/// `Extension/Handshake`.
pub const HANDSHAKE: &str = "/conduit.bench.Extension/Handshake";
/// `Extension/Echo`.
pub const ECHO: &str = "/conduit.bench.Extension/Echo";
/// `Extension/Callback`.
pub const CALLBACK: &str = "/conduit.bench.Extension/Callback";
/// `Extension/Sleep`.
pub const SLEEP: &str = "/conduit.bench.Extension/Sleep";
/// `Extension/CancelSeen`.
pub const CANCEL_SEEN: &str = "/conduit.bench.Extension/CancelSeen";
/// `Extension/Produce`.
pub const PRODUCE: &str = "/conduit.bench.Extension/Produce";
/// `Host/Ping`.
pub const PING: &str = "/conduit.bench.Host/Ping";
/// `Host/Artifact`.
pub const ARTIFACT: &str = "/conduit.bench.Host/Artifact";
/// `Host/Sleeping`: `Sleep` has started (see `jsonrpc::SLEEPING`).
pub const SLEEPING: &str = "/conduit.bench.Host/Sleeping";

#[derive(Clone, PartialEq, prost::Message)]
pub struct Handshake {
    /// Every version the host speaks, newest first.
    #[prost(uint32, repeated, tag = "1")]
    pub protocol_versions: Vec<u32>,
    #[prost(string, tag = "2")]
    pub host: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HandshakeReply {
    #[prost(uint32, tag = "1")]
    pub protocol_version: u32,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub version: String,
    #[prost(string, repeated, tag = "4")]
    pub methods: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoMsg {
    #[prost(string, tag = "1")]
    pub text: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CallbackRequest {
    #[prost(uint32, tag = "1")]
    pub n: u32,
    #[prost(string, tag = "2")]
    pub text: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CallbackReply {
    /// Each callback's round trip as the extension timed it, in ns.
    #[prost(uint64, repeated, tag = "1")]
    pub nanos: Vec<u64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SleepRequest {
    #[prost(uint64, tag = "1")]
    pub ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SleepReply {
    #[prost(uint64, tag = "1")]
    pub slept_ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CancelSeenReply {
    #[prost(uint64, tag = "1")]
    pub started_ns: u64,
    #[prost(uint64, tag = "2")]
    pub seen_ns: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProduceRequest {
    #[prost(uint64, tag = "1")]
    pub bytes: u64,
    #[prost(uint32, tag = "2")]
    pub chunk_bytes: u32,
}

/// One piece of an artifact stream. The first names it; the last carries the sender's claim,
/// which the host checks: the size, and a SHA-256 when the sender has one (empty: none; the
/// host computes the digest either way).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ArtifactChunk {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub data: bytes::Bytes,
    #[prost(string, tag = "3")]
    pub sha256: String,
    #[prost(uint64, tag = "4")]
    pub size: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ArtifactStored {
    /// `sha256:<hex>`.
    #[prost(string, tag = "1")]
    pub artifact_id: String,
    #[prost(uint64, tag = "2")]
    pub size: u64,
}

/// The line a child prints on stdout once it listens on `socket`.
pub fn announce_line(version: u32, socket: &str) -> String {
    format!("1|{version}|unix|{socket}|grpc\n")
}

/// The socket path in an announce line, if the line is one.
pub fn parse_announce(line: &str) -> Option<&str> {
    let mut parts = line.trim_end().split('|');
    let (Some("1"), Some(_), Some("unix"), Some(path), Some("grpc"), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    Some(path)
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type Route = Arc<dyn Fn(http::Request<Body>) -> BoxFuture<http::Response<Body>> + Send + Sync>;

/// A gRPC service: method paths to handlers. Cheap to clone (tonic clones it per connection).
#[derive(Clone, Default)]
pub struct Router {
    routes: Arc<HashMap<&'static str, Route>>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("routes", &self.routes.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Router {
    pub fn new() -> Router {
        Router::default()
    }

    fn add(mut self, path: &'static str, route: Route) -> Router {
        Arc::get_mut(&mut self.routes)
            .expect("routes are added before the router is shared")
            .insert(path, route);
        self
    }

    /// Serve the unary method `path` with `f`.
    pub fn unary<Req, Resp, F, Fut>(self, path: &'static str, f: F) -> Router
    where
        Req: prost::Message + Default + Send + 'static,
        Resp: prost::Message + Send + 'static,
        F: Fn(Req) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        let route: Route = Arc::new(move |req| {
            let f = f.clone();
            Box::pin(async move {
                let svc = tower::service_fn(move |r: tonic::Request<Req>| {
                    let fut = f(r.into_inner());
                    async move { fut.await.map(tonic::Response::new) }
                });
                let mut grpc = tonic::server::Grpc::new(ProstCodec::<Resp, Req>::default());
                grpc.unary(svc, req).await
            })
        });
        self.add(path, route)
    }

    /// Serve the client-streaming method `path` with `f`.
    pub fn client_streaming<Req, Resp, F, Fut>(self, path: &'static str, f: F) -> Router
    where
        Req: prost::Message + Default + Send + 'static,
        Resp: prost::Message + Send + 'static,
        F: Fn(Streaming<Req>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        let route: Route = Arc::new(move |req| {
            let f = f.clone();
            Box::pin(async move {
                let svc = tower::service_fn(move |r: tonic::Request<Streaming<Req>>| {
                    let fut = f(r.into_inner());
                    async move { fut.await.map(tonic::Response::new) }
                });
                let mut grpc = tonic::server::Grpc::new(ProstCodec::<Resp, Req>::default());
                grpc.client_streaming(svc, req).await
            })
        });
        self.add(path, route)
    }
}

impl tower::Service<http::Request<Body>> for Router {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        match self.routes.get(req.uri().path()) {
            Some(route) => {
                let fut = route(req);
                Box::pin(async move { Ok(fut.await) })
            }
            None => {
                let status = Status::unimplemented(format!("no method {}", req.uri().path()));
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

/// Call the unary method `path` over `channel`, as a generated client does: wait until the
/// channel is ready, then send.
pub async fn call<Req, Resp>(
    channel: &Channel,
    path: &'static str,
    req: Req,
) -> Result<Resp, Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(format!("the channel is not ready: {e}")))?;
    let res = grpc
        .unary(
            tonic::Request::new(req),
            PathAndQuery::from_static(path),
            ProstCodec::<Req, Resp>::default(),
        )
        .await?;
    Ok(res.into_inner())
}

/// Open the client stream `path` over `channel` with `stream` as the messages.
pub async fn client_stream<Req, Resp, S>(
    channel: &Channel,
    path: &'static str,
    stream: S,
) -> Result<Resp, Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
    S: futures::Stream<Item = Req> + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(format!("the channel is not ready: {e}")))?;
    let res = grpc
        .client_streaming(
            tonic::Request::new(stream),
            PathAndQuery::from_static(path),
            ProstCodec::<Req, Resp>::default(),
        )
        .await?;
    Ok(res.into_inner())
}

/// A channel to the Unix socket at `path`; it connects on first use.
pub fn lazy_channel(path: &str) -> Result<Channel, tonic::transport::Error> {
    Ok(tonic::transport::Endpoint::from_shared(format!("unix://{path}"))?.connect_lazy())
}

/// A channel to the Unix socket at `path`, connected now.
pub async fn connect(path: &str) -> Result<Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_shared(format!("unix://{path}"))?
        .connect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_announce_line_round_trips() {
        let line = announce_line(1, "/tmp/x.sock");
        assert_eq!(parse_announce(&line), Some("/tmp/x.sock"));
        assert_eq!(parse_announce("hello\n"), None);
        assert_eq!(parse_announce("1|1|tcp|127.0.0.1:1|grpc"), None);
    }
}
