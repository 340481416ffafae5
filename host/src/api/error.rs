//! The management API's error answers: `{"error": {"code", "message"}}` with a fitting HTTP
//! status, for the handlers' own errors (`ApiError`, with the store's and the core's errors
//! converted by `From`), for a body that does not parse (`Body`), and for the framework's
//! rejections (`envelope`).
//!
//! Invariant: a store error becomes an answer only through `StoreError::fault`, the
//! classification the callbacks' wire errors follow too; a bug in the host (a panic) is a 500,
//! never a 400.

use axum::Json;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use conduit_store::{Fault, StoreError};
use serde_json::json;

use crate::core::ops::OwnerError;

/// The largest body `POST /v1/events` accepts.
pub const MAX_PUSH_BODY: usize = 1024 * 1024;

/// The largest body of every other endpoint (axum's default, named here so the error can say it).
pub const MAX_BODY: usize = 2 * 1024 * 1024;

/// The path whose body limit is [`MAX_PUSH_BODY`].
pub(super) const EVENTS_PATH: &str = "/v1/events";

/// The body limit of a path: the one rule the routes apply (`DefaultBodyLimit`) and the
/// `too_large` answers name.
pub(super) fn body_limit(path: &str) -> usize {
    if path == EVENTS_PATH {
        MAX_PUSH_BODY
    } else {
        MAX_BODY
    }
}

/// What a body over its path's limit is told.
fn too_large(path: &str) -> String {
    format!(
        "the body is over the {}-byte limit of {path}",
        body_limit(path)
    )
}

/// Rewrites an error answer that is not already the JSON envelope (the framework's rejections:
/// 405 with an empty body, 413, 415, 422 and bad query strings or paths as plain text) into
/// `{"error": {"code", "message"}}`, keeping its status and headers (`allow` on a 405). Applied
/// to what the whole router answered, so it sees what the method router adds.
pub(super) async fn envelope(method: axum::http::Method, path: String, res: Response) -> Response {
    let status = res.status();
    let is_json = res
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    // Rejection texts are a line or two; more is cut.
    let text = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_owned(),
        Err(_) => String::new(),
    };
    let allow = parts
        .headers
        .get(axum::http::header::ALLOW)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (code, message) = match status {
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            match allow {
                Some(a) => format!("{path} does not take {method}; it takes {a}"),
                None => format!("{path} does not take {method}"),
            },
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ("too_large", too_large(&path)),
        StatusCode::NOT_FOUND => ("not_found", or(text, "not found")),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "invalid",
            or(
                text,
                "send the body as JSON with `content-type: application/json`",
            ),
        ),
        s if s.is_server_error() => ("internal", or(text, "the daemon failed")),
        _ => ("invalid", or(text, "the request is not valid")),
    };
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    parts.headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    let body = json!({ "error": { "code": code, "message": message } }).to_string();
    Response::from_parts(parts, axum::body::Body::from(body))
}

fn or(text: String, default: &str) -> String {
    if text.is_empty() {
        default.to_owned()
    } else {
        text
    }
}

/// An API error: an HTTP status and `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub(super) fn not_installed(name: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no package named `{name}` is installed; `conduit ext list` shows the installed ones"
            ),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({ "error": { "code": self.code, "message": self.message } })),
        )
            .into_response()
    }
}

/// A store failure as an answer, by [`StoreError::fault`], the classification the callbacks'
/// wire errors follow too: a full disk is 507, the caller's value 400, a missing record 404,
/// the store's own failure 500 `store`, and a bug in the host (a panic) 500 `internal`.
impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let (status, code) = match e.fault() {
            Fault::DiskFull => {
                return ApiError::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    "disk_full",
                    crate::core::disk_full_message(&e),
                );
            }
            Fault::Invalid => (StatusCode::BAD_REQUEST, "invalid"),
            Fault::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            Fault::Store => (StatusCode::INTERNAL_SERVER_ERROR, "store"),
            Fault::Host => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// A name no running extension owns: the caller's mistake, 400 `invalid`.
impl From<OwnerError> for ApiError {
    fn from(e: OwnerError) -> Self {
        bad_request(e.to_string())
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            crate::error_chain::chain(&e),
        )
    }
}

pub(super) type ApiResult = Result<Response, ApiError>;

pub(super) fn bad_request(msg: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid", msg)
}

/// `Json<T>` whose rejection (bad JSON, missing field, body too large) is our error shape.
pub(super) struct Body<T>(pub(super) T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let path = req.uri().path().to_owned();
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(rej) => {
                let status = rej.status();
                let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    "too_large"
                } else {
                    "invalid"
                };
                let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    too_large(&path)
                } else {
                    rej.body_text()
                };
                Err(ApiError::new(status, code, msg))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_too_large_is_told_the_limit_of_its_own_path() {
        assert_eq!(body_limit("/v1/events"), MAX_PUSH_BODY);
        assert_eq!(body_limit("/v1/timers"), MAX_BODY);
        assert_eq!(
            too_large("/v1/events"),
            "the body is over the 1048576-byte limit of /v1/events"
        );
        assert_eq!(
            too_large("/v1/extensions/m/call"),
            "the body is over the 2097152-byte limit of /v1/extensions/m/call"
        );
    }

    fn answer(e: StoreError) -> (StatusCode, &'static str) {
        let a = ApiError::from(e);
        (a.status, a.code)
    }

    #[test]
    fn store_errors_answer_by_their_fault_and_a_panic_is_the_hosts() {
        // A full disk (507 `disk_full`) is what the store's own tests and the limits suite
        // check: it needs a SQLite error, which only the store makes.
        assert_eq!(
            answer(StoreError::InvalidLimit { limit: 0, max: 200 }),
            (StatusCode::BAD_REQUEST, "invalid")
        );
        assert_eq!(
            answer(StoreError::NotFound {
                record: "work",
                id: 3
            }),
            (StatusCode::NOT_FOUND, "not_found")
        );
        assert_eq!(
            answer(StoreError::ReaderTimeout {
                waited: std::time::Duration::from_secs(5)
            }),
            (StatusCode::INTERNAL_SERVER_ERROR, "store")
        );
        let panicked = ApiError::from(StoreError::Panicked {
            what: "write",
            reason: "boom".into(),
        });
        assert_eq!(
            (panicked.status, panicked.code),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal")
        );
        assert_eq!(
            panicked.message,
            "the write panicked (a bug in the host): boom"
        );
    }
}
