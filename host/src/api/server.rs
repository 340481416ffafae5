//! The management API's transport: the owner-only socket, the accept loop with its connection
//! cap (the oldest connection that sent no request makes room), the header-read timeout, and
//! the peer check (SO_PEERCRED, once per connection).
//!
//! It knows nothing of the endpoints: it serves whatever router it is given, wrapped in the peer
//! check, and passes every answer through the error envelope.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::Request;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use super::error::{ApiError, envelope};

/// Who is on the other end of a connection.
#[derive(Clone, Copy, Debug)]
pub struct PeerCred {
    pub uid: Option<u32>,
    pub pid: Option<i32>,
}

impl Connected<IncomingStream<'_, UnixListener>> for PeerCred {
    fn connect_info(stream: IncomingStream<'_, UnixListener>) -> Self {
        let cred = stream.io().peer_cred().ok();
        PeerCred {
            uid: cred.map(|c| c.uid()),
            pid: cred.and_then(|c| c.pid()),
        }
    }
}

/// The variable that sets the header-read timeout, in milliseconds.
pub const HEADER_TIMEOUT_ENV: &str = "CONDUIT_API_HEADER_TIMEOUT_MS";
/// The variable that sets the connection cap.
pub const MAX_CONNECTIONS_ENV: &str = "CONDUIT_API_MAX_CONNECTIONS";

/// How long a connection may take to send a request's head, and how many are served at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub header_read_timeout: std::time::Duration,
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: std::time::Duration::from_secs(10),
            max_connections: 256,
        }
    }
}

impl Limits {
    /// The limits from [`HEADER_TIMEOUT_ENV`] (100 to 600,000 ms, default 10,000) and
    /// [`MAX_CONNECTIONS_ENV`] (1 to 65,536, default 256); a value out of range or not a number
    /// is an error naming the variable.
    pub fn from_env() -> Result<Limits, String> {
        Limits::parse(
            std::env::var(HEADER_TIMEOUT_ENV).ok().as_deref(),
            std::env::var(MAX_CONNECTIONS_ENV).ok().as_deref(),
        )
    }

    /// [`Limits::from_env`] on given values (`None` or empty: the default).
    pub fn parse(timeout_ms: Option<&str>, max: Option<&str>) -> Result<Limits, String> {
        fn num(var: &str, v: Option<&str>, lo: u64, hi: u64) -> Result<Option<u64>, String> {
            match v.map(str::trim).filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                    _ => Err(format!(
                        "{var} must be a whole number from {lo} to {hi}, not `{v}`; unset it for the default"
                    )),
                },
            }
        }
        let mut l = Limits::default();
        if let Some(ms) = num(HEADER_TIMEOUT_ENV, timeout_ms, 100, 600_000)? {
            l.header_read_timeout = std::time::Duration::from_millis(ms);
        }
        if let Some(n) = num(MAX_CONNECTIONS_ENV, max, 1, 65_536)? {
            l.max_connections = n as usize;
        }
        Ok(l)
    }
}

/// The longest a Unix socket's path may be, in bytes (Linux and macOS keep it in a fixed
/// 108- or 104-byte field, with a terminating zero).
/// The most a connection's read buffer grows to. hyper's default (about 400 KiB) is reached
/// while a large body is read and then kept, reserved for the next read, while the handler
/// runs: 64 calls of 600 KiB waiting for a slow extension held 11 MiB of them. A body is
/// read in pieces of at most this size instead (a request's head must fit in it too).
const READ_BUF_MAX: usize = 64 * 1024;

const MAX_SOCKET_PATH: usize = if cfg!(target_os = "macos") { 103 } else { 107 };

/// Bind the socket: remove a stale one, bind, and make it owner-only.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} owner-only", dir.display()))?;
    }
    // The state lock is already held, so a socket file here is a leftover of a daemon that
    // did not exit cleanly, not a live one.
    match std::fs::remove_file(path) {
        Ok(()) => tracing::debug!(path = %path.display(), "removed a stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot remove the stale socket {}", path.display()));
        }
    }
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        anyhow::bail!(
            "cannot listen on {}: a Unix socket's path may be at most {MAX_SOCKET_PATH} bytes long, and this one is {len}; use a state directory with a shorter path (--state-dir or CONDUIT_STATE_DIR)",
            path.display()
        );
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot make {} owner-only", path.display()))?;
    Ok(listener)
}

/// Serve `app` until `shutdown` is cancelled, as [`super::serve_with`] describes: the peer
/// check and the error envelope are added here, around the whole router.
pub(super) async fn serve_router(
    listener: UnixListener,
    app: Router,
    shutdown: CancellationToken,
    limits: Limits,
) -> std::io::Result<()> {
    let own_uid = nix::unistd::geteuid().as_raw();
    let app = app.layer(axum::middleware::from_fn(
        move |req: Request, next: Next| check_peer(own_uid, req, next),
    ));
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    // Connections that have not sent a request yet, oldest first: the ones closed to make room.
    let waiting: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, CancellationToken>>> =
        Arc::default();
    let mut conns = tokio::task::JoinSet::new();
    let mut next_id = 0u64;
    let mut at_cap_logged = false;
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of descriptors, most often: wait a little rather than spin.
                    tracing::warn!(error = %e, "cannot accept a management connection");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        while conns.try_join_next().is_some() {}
        // At the cap, the oldest connection that has not sent a request makes room, so a flood
        // of stalled connections cannot keep a working client out; if every one is in a
        // request, the new one waits for a slot.
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => {
                at_cap_logged = false;
                p
            }
            Err(_) => {
                let evicted = {
                    let mut w = waiting.lock().unwrap_or_else(|p| p.into_inner());
                    w.pop_first().map(|(_, cancel)| cancel.cancel()).is_some()
                };
                if !at_cap_logged {
                    tracing::warn!(
                        max = limits.max_connections,
                        evicted,
                        "the management API is at its connection cap; the oldest connection that sent no request is closed to make room"
                    );
                    at_cap_logged = true;
                }
                tokio::select! {
                    p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                    () = shutdown.cancelled() => break,
                }
            }
        };
        let cred = stream.peer_cred().ok();
        let peer = PeerCred {
            uid: cred.map(|c| c.uid()),
            pid: cred.and_then(|c| c.pid()),
        };
        let id = next_id;
        next_id += 1;
        let evict = CancellationToken::new();
        waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, evict.clone());
        let svc = WithPeer {
            app: app.clone(),
            peer,
            first_request: Arc::new(FirstRequest {
                id,
                waiting: waiting.clone(),
            }),
        };
        let stop = shutdown.clone();
        let waiting = waiting.clone();
        conns.spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(READ_BUF_MAX);
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "a management connection ended with an error");
                    }
                }
                () = evict.cancelled() => {}
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
    }
    // The daemon bounds this wait (and aborts this future, which aborts the connections).
    while conns.join_next().await.is_some() {}
    Ok(())
}

/// The router for one connection, with the peer's credentials in every request.
#[derive(Clone)]
struct WithPeer {
    app: Router,
    peer: PeerCred,
    first_request: Arc<FirstRequest>,
}

/// Takes a connection off the list of those that may be closed to make room, at its first
/// request (its head was read: it is a working client).
struct FirstRequest {
    id: u64,
    waiting: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, CancellationToken>>>,
}

impl FirstRequest {
    fn seen(&self) {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for WithPeer {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response, std::convert::Infallible>> + Send>,
    >;

    fn call(&self, mut req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        self.first_request.seen();
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let mut app = self.app.clone();
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        // A router is always ready (`poll_ready` answers at once), so `call` may come first.
        Box::pin(async move {
            let res = tower_service::Service::call(&mut app, req.map(axum::body::Body::new)).await;
            match res {
                Ok(res) => Ok(envelope(method, path, res).await),
                Err(never) => match never {},
            }
        })
    }
}

async fn check_peer(own_uid: u32, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<PeerCred>>().map(|c| c.0);
    match peer.and_then(|p| p.uid) {
        Some(uid) if uid == own_uid => next.run(req).await,
        other => {
            tracing::warn!(
                uid = other,
                pid = peer.and_then(|p| p.pid),
                "refused a management connection from another user"
            );
            let who = other.map_or("an unknown user".to_owned(), |u| format!("uid {u}"));
            ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("the management socket serves only uid {own_uid}, not {who}"),
            )
            .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_take_their_range_and_refuse_a_value_past_it_naming_the_variable() {
        assert_eq!(Limits::parse(None, None), Ok(Limits::default()));
        assert_eq!(Limits::parse(Some(""), Some(" ")), Ok(Limits::default()));
        let edges = Limits::parse(Some("100"), Some("1")).unwrap();
        assert_eq!(
            edges.header_read_timeout,
            std::time::Duration::from_millis(100)
        );
        assert_eq!(edges.max_connections, 1);
        let top = Limits::parse(Some("600000"), Some("65536")).unwrap();
        assert_eq!(top.header_read_timeout, std::time::Duration::from_secs(600));
        assert_eq!(top.max_connections, 65_536);
        for (t, m, var) in [
            (Some("99"), None, HEADER_TIMEOUT_ENV),
            (Some("600001"), None, HEADER_TIMEOUT_ENV),
            (Some("10s"), None, HEADER_TIMEOUT_ENV),
            (None, Some("0"), MAX_CONNECTIONS_ENV),
            (None, Some("65537"), MAX_CONNECTIONS_ENV),
        ] {
            let e = Limits::parse(t, m).unwrap_err();
            assert!(e.starts_with(var), "{e}");
        }
    }
}
