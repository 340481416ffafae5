//! What both OTLP exports (spans in `otlp`, metrics in `otlp_metrics`) share: the bounds of an
//! attempt, the HTTP client, the standard variables and the resource.
//!
//! A leaf: it knows neither export, so neither depends on the other through it.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::Resource;

/// One export attempt's limit, connection included.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts per batch before it is dropped.
pub const ATTEMPTS: u32 = 3;
/// An OTLP answer bigger than this is refused (a collector answers with a few bytes).
const MAX_RESPONSE_BYTES: usize = 1 << 20;

pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The resource every span carries: `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` as the
/// SDK reads them, `service.name` = `conduit` unless one of them names it, and
/// `service.version`.
pub(crate) fn resource() -> Resource {
    let named = env("OTEL_SERVICE_NAME").is_some()
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',').any(|kv| {
                kv.split('=')
                    .next()
                    .is_some_and(|k| k.trim() == "service.name")
            })
        });
    let mut b = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if !named {
        b = b.with_service_name("conduit");
    }
    b.build()
}

/// OTLP's HTTP client: one HTTP/1.1 connection per request over the hyper the daemon already
/// links, no TLS. The caller bounds each request ([`EXPORT_TIMEOUT`]).
#[derive(Debug)]
pub(crate) struct HyperHttp;

#[async_trait::async_trait]
impl HttpClient for HyperHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (mut parts, body) = request.into_parts();
        let host = parts
            .uri
            .host()
            .ok_or("the OTLP endpoint has no host")?
            .to_owned();
        let port = parts.uri.port_u16().unwrap_or(80);
        let authority = parts
            .uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_else(|| host.clone());
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".into());
        parts.uri = path.parse()?;
        parts.headers.insert(http::header::HOST, authority.parse()?);
        let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        let conn = tokio::spawn(conn);
        let answer = send
            .send_request(http::Request::from_parts(parts, Full::new(body)))
            .await;
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                conn.abort();
                return Err(e.into());
            }
        };
        let (parts, body) = answer.into_parts();
        let body = Limited::new(body, MAX_RESPONSE_BYTES).collect().await;
        conn.abort();
        Ok(Response::from_parts(parts, body?.to_bytes()))
    }
}
