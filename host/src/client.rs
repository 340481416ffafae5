//! The CLI's side of the management API: one HTTP/1.1 request per connection over the Unix
//! socket.
//!
//! [`Client::connect`] answers `None` when no daemon listens (no socket, or a stale one), so a
//! command can fall back to reading the state directory itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::UnixStream;

/// How long one request may take before the CLI gives up.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);

/// A client for one daemon's socket.
#[derive(Clone, Debug)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    /// A client if a daemon answers on `socket`.
    pub async fn connect(socket: &Path) -> Option<Client> {
        match tokio::time::timeout(Duration::from_secs(2), UnixStream::connect(socket)).await {
            Ok(Ok(_)) => Some(Client {
                socket: socket.to_owned(),
            }),
            _ => None,
        }
    }

    /// Send one request; returns the status and the JSON body.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.request_inner(method, path, body))
            .await
            .with_context(|| {
                format!("the daemon did not answer {path} within {REQUEST_TIMEOUT:?}")
            })?
    }

    async fn request_inner(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let (status, body) = self.request_raw(method, path, body).await?;
        let value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).context("the daemon's answer is not JSON")?
        };
        Ok((status, value))
    }

    /// GET an endpoint that answers text (`/v1/metrics`); a non-2xx status fails with the
    /// API's error message.
    pub async fn get_text(&self, path: &str) -> anyhow::Result<String> {
        let (status, body) =
            tokio::time::timeout(REQUEST_TIMEOUT, self.request_raw(Method::GET, path, None))
                .await
                .with_context(|| {
                    format!("the daemon did not answer {path} within {REQUEST_TIMEOUT:?}")
                })??;
        if !status.is_success() {
            let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            ok((status, value))?;
        }
        String::from_utf8(body.to_vec()).context("the daemon's answer is not UTF-8")
    }

    async fn request_raw(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let stream = UnixStream::connect(&self.socket).await.with_context(|| {
            format!("cannot connect to the daemon at {}", self.socket.display())
        })?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let conn = tokio::spawn(conn);
        let bytes = match body {
            Some(v) => Bytes::from(serde_json::to_vec(v)?),
            None => Bytes::new(),
        };
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "conduit")
            .header("content-type", "application/json")
            .body(Full::new(bytes))?;
        let res = sender
            .send_request(req)
            .await
            .context("the daemon closed the connection")?;
        let status = res.status();
        let body = res.into_body().collect().await?.to_bytes();
        conn.abort();
        Ok((status, body))
    }

    /// GET, failing on a non-2xx status with the API's error message.
    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        ok(self.request(Method::GET, path, None).await?)
    }

    /// POST, failing on a non-2xx status with the API's error message.
    pub async fn post(&self, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        ok(self.request(Method::POST, path, body).await?)
    }
}

fn ok((status, value): (StatusCode, Value)) -> anyhow::Result<Value> {
    if status.is_success() {
        return Ok(value);
    }
    match value["error"]["message"].as_str() {
        Some(m) => bail!("{m}"),
        None => bail!("the daemon answered {status}"),
    }
}
