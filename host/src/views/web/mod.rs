//! `conduit web`: server-rendered pages on loopback, proxying to the daemon's owner-only
//! socket, so the daemon itself opens no TCP port.
//!
//! ```text
//!   browser ──HTTP, 127.0.0.1:PORT──► conduit web ──HTTP, Unix socket──► daemon (management API)
//!            token → cookie, Host,        guard.rs       pages.rs: a few API requests a page
//!            CSRF, CSP                                   html.rs: maud, every value escaped
//! ```
//!
//! It binds 127.0.0.1 only (a port it picks, or `--port`), prints the URL to open with its
//! token as the first line of standard output, and serves until SIGTERM or SIGINT. Every
//! request passes the guard (`guard.rs`) before any page: the Host check, then the session or
//! the token, then for a POST the CSRF token and the Origin. The CSS and the one script are in
//! the binary (`assets/`); the pages work without the script, which only refreshes the parts
//! of a page marked `data-live` every two seconds.
//!
//! Invariant: nothing is served to a request that failed the guard, and no answer leaves
//! without the security headers.

mod guard;
mod html;
mod lists;
mod pages;
mod shared;
mod work;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};

pub use guard::{SECURITY_HEADERS, Secrets};
pub use shared::Web;

use crate::client::Client;

/// The stylesheet and the script, in the binary.
const STYLE: &str = include_str!("assets/style.css");
const SCRIPT: &str = include_str!("assets/live.js");

/// What `conduit web` was asked for.
#[derive(Clone, Debug)]
pub struct Options {
    /// 0: pick a free port.
    pub port: u16,
    /// The doctor page's checks.
    pub doctor: crate::doctor::Options,
}

/// A server bound and ready: its URL (with the token) is known before it serves.
#[derive(Debug)]
pub struct Bound {
    listener: tokio::net::TcpListener,
    web: Arc<Web>,
}

impl Bound {
    /// The URL to open: the token in its query, exchanged for a cookie on first use.
    pub fn url(&self) -> String {
        format!(
            "http://127.0.0.1:{}/?token={}",
            self.web.port, self.web.secrets.token
        )
    }

    pub fn port(&self) -> u16 {
        self.web.port
    }

    /// Serve until `shutdown` resolves (open requests finish first).
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        axum::serve(self.listener, router(self.web))
            .with_graceful_shutdown(shutdown)
            .await
            .context("the web view's server failed")
    }
}

/// Bind 127.0.0.1 on `opts.port` (0 picks one) with fresh secrets.
pub async fn bind(client: Client, opts: &Options) -> anyhow::Result<Bound> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, opts.port));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}; pick another port with --port"))?;
    let port = listener.local_addr()?.port();
    let secrets = Secrets::new().context("cannot draw the web view's token")?;
    Ok(Bound {
        listener,
        web: Arc::new(Web {
            client,
            secrets,
            port,
            doctor: opts.doctor.clone(),
        }),
    })
}

/// Every route, behind the guard, with the security headers on every answer.
pub fn router(web: Arc<Web>) -> Router {
    Router::new()
        .route("/", get(pages::home))
        .route("/extensions", get(pages::extensions))
        .route("/extensions/{name}", get(pages::extension))
        .route("/extensions/{name}/{verb}", post(pages::act))
        .route("/work", get(work::work))
        .route("/work/{id}", get(work::one_work))
        .route("/timers", get(lists::timers))
        .route("/waits", get(lists::waits))
        .route("/emissions", get(lists::emissions))
        .route("/artifacts", get(lists::artifacts))
        .route("/doctor", get(lists::doctor))
        .route("/static/style.css", get(style))
        .route("/static/live.js", get(script))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(web.clone(), guard))
        .layer(middleware::from_fn(headers))
        .with_state(web)
}

async fn headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    for (k, v) in SECURITY_HEADERS {
        res.headers_mut().insert(*k, HeaderValue::from_static(v));
    }
    res
}

fn refuse(status: StatusCode, title: &str, lines: &[&str]) -> Response {
    (status, Html(html::notice(title, lines).into_string())).into_response()
}

/// The guard of `guard.rs`, applied to every request.
async fn guard(State(w): State<Arc<Web>>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    if !guard::host_ok(host, w.port) {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "Wrong address",
            &[&format!(
                "This view answers only at http://127.0.0.1:{0}/ or http://localhost:{0}/; \
                 open the URL conduit web printed.",
                w.port
            )],
        );
    }
    let session = guard::has_session(req.headers(), w.port, &w.secrets);
    if !session {
        let token = guard::token_param(req.uri().query());
        if req.method() == Method::GET
            && let Some(t) = token
            && guard::same(t, &w.secrets.token)
        {
            // The token becomes a cookie, and leaves the address bar (and the history).
            let path = req.uri().path();
            let to = match guard::without_token(req.uri().query()) {
                Some(q) => format!("{path}?{q}"),
                None => path.to_owned(),
            };
            let mut res = Redirect::to(guard::local_path(&to)).into_response();
            res.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_str(&guard::set_cookie(w.port, &w.secrets.session))
                    .expect("hex is a valid header value"),
            );
            return res;
        }
        return refuse(
            StatusCode::UNAUTHORIZED,
            "This view needs its token",
            &[
                "Open the URL that conduit web printed when it started: the token in it lets \
                 this browser in (it is then kept in a cookie for this session).",
                "Lost it? Stop conduit web and start it again for a new URL.",
            ],
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let origin = req
            .headers()
            .get(header::ORIGIN)
            .and_then(|h| h.to_str().ok());
        if !guard::origin_ok(origin, w.port) {
            return refuse(
                StatusCode::FORBIDDEN,
                "Refused",
                &["The request came from another site's page."],
            );
        }
        // The form's fields: read whole (a form is small), checked, and handed on.
        let (parts, body) = req.into_parts();
        let bytes = match axum::body::to_bytes(body, 64 * 1024).await {
            Ok(b) => b,
            Err(_) => {
                return refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Too large",
                    &["A form is at most 64 KiB."],
                );
            }
        };
        let csrf = guard::form_field(&bytes, "csrf");
        if !csrf
            .as_deref()
            .is_some_and(|c| guard::same(c, &w.secrets.csrf))
        {
            return refuse(
                StatusCode::FORBIDDEN,
                "Refused",
                &[
                    "The form did not carry this page's check token (CSRF); reload the page and try again.",
                ],
            );
        }
        let req = Request::from_parts(parts, axum::body::Body::from(bytes));
        return next.run(req).await;
    }
    next.run(req).await
}

async fn not_found() -> Response {
    refuse(
        StatusCode::NOT_FOUND,
        "Not found",
        &["No page here; the navigation at the top lists them."],
    )
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}
