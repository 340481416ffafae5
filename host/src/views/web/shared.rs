//! What every page of `conduit web` shares: the [`Web`] state the handlers are given, how a
//! page asks the daemon ([`get`], [`api`]) and how a refusal or a failure becomes a page
//! ([`PageError`]), and the page size of every list.
//!
//! A leaf: `mod.rs`, `pages.rs`, `work.rs` and `lists.rs` import it; it imports only `html.rs`.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::Markup;
use serde_json::Value;

use super::guard::Secrets;
use super::html::{self, Page};
use crate::client::Client;

/// What every page handler shares.
#[derive(Debug)]
pub struct Web {
    pub(super) client: Client,
    pub(super) secrets: Secrets,
    pub(super) port: u16,
    /// What the doctor page checks (`conduit doctor`'s options for this state directory).
    pub(super) doctor: crate::doctor::Options,
}

/// How many rows a list page shows.
pub(super) const PAGE: u32 = 50;

/// A page that could not be made: the daemon's error, shown as a page.
#[derive(Debug)]
pub(super) struct PageError {
    pub(super) status: StatusCode,
    pub(super) message: String,
}

impl PageError {
    /// The daemon could not be asked, or its answer could not be read: 502.
    pub(super) fn gateway(e: impl std::fmt::Display) -> PageError {
        PageError {
            status: StatusCode::BAD_GATEWAY,
            message: e.to_string(),
        }
    }
}

impl From<anyhow::Error> for PageError {
    fn from(e: anyhow::Error) -> Self {
        PageError::gateway(format!("{e:#}"))
    }
}

/// One request to the daemon; its JSON answer, or its refusal as this page's: 404 for its
/// 404, 400 for its other 4xx, 502 for anything else.
pub(super) async fn api(w: &Web, method: hyper::Method, path: &str) -> Result<Value, PageError> {
    let (status, v) = w.client.request(method, path, None).await?;
    if status.is_success() {
        return Ok(v);
    }
    let message = v["error"]["message"]
        .as_str()
        .map_or_else(|| format!("the daemon answered {status}"), str::to_owned);
    let status = match status.as_u16() {
        404 => StatusCode::NOT_FOUND,
        400..=499 => StatusCode::BAD_REQUEST,
        _ => StatusCode::BAD_GATEWAY,
    };
    Err(PageError { status, message })
}

pub(super) async fn get(w: &Web, path: &str) -> Result<Value, PageError> {
    api(w, hyper::Method::GET, path).await
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let title = match self.status {
            StatusCode::NOT_FOUND => "Not found",
            StatusCode::BAD_REQUEST => "Not a valid request",
            _ => "The daemon did not answer",
        };
        let body = html::notice(
            title,
            &[
                &self.message,
                "Check that the daemon runs (`conduit ext status`), then reload this page.",
            ],
        );
        (self.status, Html(body.into_string())).into_response()
    }
}

pub(super) type PageResult = Result<Response, PageError>;

pub(super) fn page(p: Page<'_>, body: Markup) -> PageResult {
    Ok(Html(html::layout(&p, body).into_string()).into_response())
}
