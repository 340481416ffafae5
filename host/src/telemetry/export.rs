//! What both OTLP exports (spans in `otlp`, metrics in `otlp_metrics`) share: the export thread
//! with its bounded stop ([`ExportThread`]), the bounded attempts of one send ([`attempts`]), the
//! HTTP client, the standard variables and the resource.
//!
//! A leaf: it knows neither export, so neither depends on the other through it.
//!
//! Invariant: an export thread never holds its lock while it sends, and its owner's stop waits
//! for it at most the time it is given; a thread that could not start counts as stopped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// What an export thread shares with its owner under one lock: `data` (spans waiting, or
/// nothing), `closing` (set by the owner's stop) and whether the thread has ended.
pub(crate) struct Guarded<T> {
    pub(crate) data: T,
    pub(crate) closing: bool,
    done: bool,
}

/// One export thread (spans or metrics): its own single-threaded runtime for the HTTP client,
/// the lock and condition it shares with its owner, and the stop ([`ExportThread::shutdown`]).
pub(crate) struct ExportThread<T>(Arc<(Mutex<Guarded<T>>, Condvar)>);

impl<T> Clone for ExportThread<T> {
    fn clone(&self) -> Self {
        ExportThread(self.0.clone())
    }
}

impl<T> std::fmt::Debug for ExportThread<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExportThread")
    }
}

impl<T: Send + 'static> ExportThread<T> {
    /// The shared state, before the thread starts (the span queue is fed from the start).
    pub(crate) fn new(data: T) -> Self {
        let guarded = Guarded {
            data,
            closing: false,
            done: false,
        };
        ExportThread(Arc::new((Mutex::new(guarded), Condvar::new())))
    }

    /// Start the thread `name` running `body` on its own runtime, until `body` returns (when
    /// it finds `closing`). `what` names the export in the error logged if the thread or its
    /// runtime cannot start; then nothing is exported and the stop does not wait. Whether the
    /// thread started.
    pub(crate) fn spawn(
        &self,
        name: &str,
        what: &'static str,
        body: impl FnOnce(&ExportThread<T>, &tokio::runtime::Runtime) + Send + 'static,
    ) -> bool {
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => body(&me, &rt),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the runtime of the {what} exporter; {what} are not exported")
                    }
                }
                me.finish();
            });
        match spawned {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the {what} exporter thread; {what} are not exported");
                self.finish();
                false
            }
        }
    }

    /// The shared state, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Guarded<T>> {
        self.0.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wake the thread (it waits in [`ExportThread::wait`]).
    pub(crate) fn wake(&self) {
        self.0.1.notify_all();
    }

    /// Wait until `ready` holds for the data, the owner is closing, or `until` has come; the
    /// state, locked.
    pub(crate) fn wait(
        &self,
        until: Instant,
        ready: impl Fn(&T) -> bool,
    ) -> MutexGuard<'_, Guarded<T>> {
        self.wait_while(self.lock(), until, |g| !ready(&g.data) && !g.closing)
    }

    /// Wait on the condition while `waiting` holds and `until` has not come.
    fn wait_while<'a>(
        &'a self,
        mut g: MutexGuard<'a, Guarded<T>>,
        until: Instant,
        waiting: impl Fn(&Guarded<T>) -> bool,
    ) -> MutexGuard<'a, Guarded<T>> {
        while waiting(&g) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            g = self
                .0
                .1
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        g
    }

    fn finish(&self) {
        self.lock().done = true;
        self.wake();
    }

    /// Tell the thread to close and wait for it to end, at most `within` (what it sends
    /// meanwhile is its last; a hung collector costs at most that).
    pub(crate) fn shutdown(&self, within: Duration) {
        let mut g = self.lock();
        g.closing = true;
        self.wake();
        drop(self.wait_while(g, Instant::now() + within, |g| !g.done));
    }
}

/// Send by `attempt` up to `n` times, each bounded by `timeout`, waiting 100 ms, 200 ms, …
/// between them; each failed attempt is counted in `failed`. Whether one succeeded.
pub(crate) async fn attempts<F, Fut, E>(
    n: u32,
    timeout: Duration,
    failed: &AtomicU64,
    mut attempt: F,
) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
{
    for i in 0..n {
        if matches!(tokio::time::timeout(timeout, attempt()).await, Ok(Ok(()))) {
            return true;
        }
        failed.fetch_add(1, Ordering::Relaxed);
        if i + 1 < n {
            tokio::time::sleep(Duration::from_millis(100 << i)).await;
        }
    }
    false
}

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
