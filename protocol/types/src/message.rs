//! One JSON-RPC 2.0 message: parsing a received line, and writing one to send.
//!
//! ```text
//! request       {"jsonrpc":"2.0","id":7,"method":"echo","params":{...}}
//! notification  {"jsonrpc":"2.0","method":"$/cancel","params":{"id":7}}
//! response      {"jsonrpc":"2.0","id":7,"result":{...}}
//! error         {"jsonrpc":"2.0","id":7,"error":{"code":-32001,"message":"..."}}
//! ```
//!
//! Parsing borrows from the received line: params and results stay raw JSON until the handler
//! or caller that knows their type reads them. Writing appends compact JSON to a buffer; the
//! framing (the newline) belongs to `conduit-rpc`.
//!
//! Batches (a JSON array of messages) are not part of conduit's protocol; a batch is answered
//! with `invalid_request`.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::{ErrorCode, RpcError};

/// A request id: a number or a string, as JSON-RPC allows. conduit itself sends numbers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(IdRepr);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum IdRepr {
    Num(i64),
    Str(String),
}

impl RequestId {
    /// A numeric id.
    pub const fn num(n: i64) -> Self {
        RequestId(IdRepr::Num(n))
    }

    /// A string id.
    pub fn str(s: impl Into<String>) -> Self {
        RequestId(IdRepr::Str(s.into()))
    }

    /// The number, if this is a numeric id.
    pub fn as_num(&self) -> Option<i64> {
        match self.0 {
            IdRepr::Num(n) => Some(n),
            IdRepr::Str(_) => None,
        }
    }

    fn write_json(&self, out: &mut Vec<u8>) {
        match &self.0 {
            IdRepr::Num(n) => out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes()),
            IdRepr::Str(s) => {
                serde_json::to_writer(&mut *out, s).expect("writing a string to a Vec cannot fail")
            }
        }
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            IdRepr::Num(n) => write!(f, "{n}"),
            IdRepr::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl Serialize for RequestId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            IdRepr::Num(n) => s.serialize_i64(*n),
            IdRepr::Str(v) => s.serialize_str(v),
        }
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor, not an untagged enum: serde buffers an untagged enum's input to try each
        // variant, and every message read has an id.
        struct Id;
        impl serde::de::Visitor<'_> for Id {
            type Value = RequestId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer or a string")
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<RequestId, E> {
                Ok(RequestId::num(n))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<RequestId, E> {
                i64::try_from(n)
                    .map(RequestId::num)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<RequestId, E> {
                Ok(RequestId::str(s.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<RequestId, E> {
                Ok(RequestId::str(s))
            }
        }
        d.deserialize_any(Id)
    }
}

/// A received message, classified.
#[derive(Debug)]
pub enum Message<'a> {
    /// A call that wants an answer.
    Request {
        id: RequestId,
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    /// A call that wants none.
    Notification {
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    /// The answer to one of our requests.
    Response {
        id: RequestId,
        result: Result<&'a RawValue, RpcError>,
    },
}

/// Why a received line is not a message we can act on.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// Not JSON, or not UTF-8.
    #[error("not valid JSON: {0}")]
    Parse(String),
    /// JSON, but not a JSON-RPC 2.0 message. `id` is the request's id when it could be read,
    /// so the receiver can answer it.
    #[error("not a JSON-RPC 2.0 message: {reason}")]
    Invalid {
        id: Option<RequestId>,
        reason: String,
    },
    /// Something shaped like a response (no `method`) that breaks the rules. It is never
    /// answered — answering a response could confuse the peer's own pending calls — but the
    /// call it names, if any, fails with `invalid_request`.
    #[error("malformed response: {reason}")]
    BadResponse {
        id: Option<RequestId>,
        reason: String,
    },
    /// A response with a `null` id: the peer could not read one of our messages (usually a
    /// parse error); the error it sent is kept.
    #[error("the peer reported an error it could not tie to a request: {0}")]
    Orphan(RpcError),
}

impl MessageError {
    /// The error to answer with, and the id to answer to (`None` → `"id": null`).
    pub fn reply(&self) -> Option<(Option<RequestId>, RpcError)> {
        match self {
            MessageError::Parse(e) => Some((
                None,
                RpcError::new(ErrorCode::ParseError, format!("parse error: {e}")),
            )),
            MessageError::Invalid { id, reason } => Some((
                id.clone(),
                RpcError::new(ErrorCode::InvalidRequest, reason.clone()),
            )),
            // Never answer a response, nor an error with an error: two confused peers would loop.
            MessageError::Orphan(_) | MessageError::BadResponse { .. } => None,
        }
    }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<RpcError>,
}

/// A field that is present is `Some`, even when its value is `null` (`"result": null` is a
/// successful response; a plain `Option` would read it as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// A message whose fields all have their plain types: `id` an integer or a string (not
/// `null`), `method` and `jsonrpc` strings without escapes. Most messages are; [`Message::parse`]
/// reads them in one pass and falls back to [`Envelope`] for the rest.
#[derive(Deserialize)]
struct Plain<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<&'a str>,
    #[serde(default, deserialize_with = "some_id")]
    id: Option<RequestId>,
    #[serde(borrow, default, deserialize_with = "some_str")]
    method: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<RpcError>,
}

/// An id that is present must be one (`null` is refused, so that [`Envelope`] reads it).
fn some_id<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<RequestId>, D::Error> {
    RequestId::deserialize(d).map(Some)
}

/// A string borrowed from the line (one with escapes is refused, so that [`Envelope`] reads it).
fn some_str<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de str>, D::Error> {
    <&'de str>::deserialize(d).map(Some)
}

impl<'a> Message<'a> {
    /// Classify one received line (without its newline).
    pub fn parse(line: &'a [u8]) -> Result<Message<'a>, MessageError> {
        // JSON text is UTF-8. serde skips the fields a message does not know without checking
        // their bytes, so the whole line is checked once here; the parses below then take it as
        // a `str` and do not check again.
        let text = std::str::from_utf8(line)
            .map_err(|e| MessageError::Parse(format!("the line is not UTF-8: {e}")))?;
        // Serde reads a struct from a JSON array too (by position); a message is an object.
        match line.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') => {}
            Some(b'[') if check_json(text).is_ok() => {
                return Err(MessageError::Invalid {
                    id: None,
                    reason: "batches are not supported: send one message per line".into(),
                });
            }
            _ => {
                return Err(match check_json(text) {
                    Ok(()) => MessageError::Invalid {
                        id: None,
                        reason: "a message must be a JSON object".into(),
                    },
                    Err(e) => MessageError::Parse(e),
                });
            }
        }
        // A request or an answer exactly as the writers below make them: matched, not parsed.
        if let Some(message) = parse_as_written(text) {
            return message;
        }
        // The common case in one pass: every field of its plain type. Anything else — a field
        // of the wrong type, a `null` id, a name with escapes, a duplicate — is read again below,
        // field by field, to say exactly what is wrong; both end in `classify`.
        if let Ok(plain) = serde_json::from_str::<Plain<'a>>(text) {
            let id_absent = plain.id.is_none();
            return classify(
                plain.jsonrpc == Some("2.0"),
                plain.id,
                id_absent,
                plain.method.map(Cow::Borrowed),
                plain.params,
                plain.result,
                plain.error,
            );
        }
        Self::parse_field_by_field(text)
    }

    /// What [`Message::parse`] makes of a line that is UTF-8 and starts with `{`, read field by
    /// field, without its one-pass reading of plain messages. Both must agree on every line:
    /// tests and the `message_parse` fuzz target compare them.
    #[doc(hidden)]
    pub fn parse_field_by_field(text: &'a str) -> Result<Message<'a>, MessageError> {
        let env: Envelope<'a> = match serde_json::from_str(text) {
            Ok(env) => env,
            // serde calls a number too large for its field a syntax error; it is valid JSON.
            Err(e) if e.is_data() || check_json(text).is_ok() => {
                return Err(invalid_shape(text, e));
            }
            Err(e) => return Err(MessageError::Parse(e.to_string())),
        };
        let is_request_like = env.method.is_some();
        // `"id": null` is the same as no id for a request, and marks an orphan error response.
        let id = match env.id {
            None => None,
            Some(raw) if raw.get() == "null" => None,
            Some(raw) => match serde_json::from_str::<RequestId>(raw.get()) {
                Ok(id) => Some(id),
                Err(_) => {
                    let reason = format!("`id` must be an integer or a string, not {}", raw.get());
                    // A response is never answered, not even one with a bad id.
                    return Err(if is_request_like {
                        MessageError::Invalid { id: None, reason }
                    } else {
                        MessageError::BadResponse { id: None, reason }
                    });
                }
            },
        };
        let method: Option<Cow<'a, str>> = match env.method {
            None => None,
            // A plain `&str` borrows from the line; only a name with escapes is copied.
            Some(raw) => match serde_json::from_str::<&'a str>(raw.get())
                .map(Cow::Borrowed)
                .or_else(|_| serde_json::from_str::<String>(raw.get()).map(Cow::Owned))
            {
                Ok(m) => Some(m),
                Err(_) => {
                    return Err(MessageError::Invalid {
                        id,
                        reason: format!("`method` must be a string, not {}", raw.get()),
                    });
                }
            },
        };
        classify(
            env.jsonrpc.map(RawValue::get) == Some("\"2.0\""),
            id,
            env.id.is_none(),
            method,
            env.params,
            env.result,
            env.error,
        )
    }
}

/// A request or a successful response in exactly the bytes [`write_request`] and
/// [`write_result`] make for an id of up to 18 digits and a method without escapes —
/// `{"jsonrpc":"2.0","id":7,"method":"echo","params":{..}}`, `{"jsonrpc":"2.0","id":7,"result":..}`
/// — read by matching those bytes: most lines a session reads are these, and serde's reading
/// of an object costs more than the rest of the message. Only the params or result are parsed
/// (validated: they are the line's one remaining value). `None` for any other line, however
/// slightly different (another key order, an escape, another key), which the readings of
/// [`Message::parse`] take; what this returns they return too (tests and the `message_parse`
/// fuzz target compare them).
fn parse_as_written(text: &str) -> Option<Result<Message<'_>, MessageError>> {
    let body = text
        .strip_prefix(r#"{"jsonrpc":"2.0","id":"#)?
        .strip_suffix('}')?;
    let digits = body.bytes().take_while(u8::is_ascii_digit).count();
    // JSON has no leading zeros; 18 digits fit an `i64` whatever they are.
    if digits == 0 || digits > 18 || (digits > 1 && body.starts_with('0')) {
        return None;
    }
    let id = RequestId::num(body[..digits].parse().ok()?);
    let body = &body[digits..];
    let (method, value) = match body.strip_prefix(r#","method":""#) {
        Some(rest) => {
            let end = rest
                .bytes()
                .position(|b| b == b'"' || b == b'\\' || b < 0x20)?;
            let value = rest[end..].strip_prefix(r#"","params":"#)?;
            (Some(&rest[..end]), value)
        }
        None => (None, body.strip_prefix(r#","result":"#)?),
    };
    // The value must be the rest of the line: one with more after it (another key) is left to
    // the readings that say what is wrong.
    let value: &RawValue = serde_json::from_str(value).ok()?;
    Some(match method {
        Some(method) => classify(
            true,
            Some(id),
            false,
            Some(Cow::Borrowed(method)),
            Some(value),
            None,
            None,
        ),
        None => classify(true, Some(id), false, None, None, Some(value), None),
    })
}

/// What a message is, from its fields once each has been read as its type: `jsonrpc_ok` says
/// `"jsonrpc": "2.0"` was there, `id_absent` that there was no `id` at all (`"id": null` is an
/// id of `None` that is not absent).
fn classify<'a>(
    jsonrpc_ok: bool,
    id: Option<RequestId>,
    id_absent: bool,
    method: Option<Cow<'a, str>>,
    params: Option<&'a RawValue>,
    result: Option<&'a RawValue>,
    error: Option<RpcError>,
) -> Result<Message<'a>, MessageError> {
    if !jsonrpc_ok {
        let reason = "`jsonrpc` must be \"2.0\"".to_owned();
        return Err(match method {
            Some(_) => MessageError::Invalid { id, reason },
            None => MessageError::BadResponse { id, reason },
        });
    }
    match (method, id, result, error) {
        (Some(method), Some(id), None, None) => Ok(Message::Request { id, method, params }),
        (Some(method), None, None, None) if id_absent => {
            Ok(Message::Notification { method, params })
        }
        (Some(_), None, None, None) => Err(MessageError::Invalid {
            id: None,
            reason: "a request's `id` must not be null".into(),
        }),
        (None, Some(id), Some(result), None) => Ok(Message::Response {
            id,
            result: Ok(result),
        }),
        (None, Some(id), None, Some(err)) => Ok(Message::Response {
            id,
            result: Err(err),
        }),
        (None, None, None, Some(err)) => Err(MessageError::Orphan(err)),
        (method, id, _, _) => {
            let reason = "a message has either `method` (request, notification) or exactly \
                          one of `result` and `error` (response)"
                .to_owned();
            Err(match method {
                Some(_) => MessageError::Invalid { id, reason },
                None => MessageError::BadResponse { id, reason },
            })
        }
    }
}

/// The two fields that say how to answer a message of the wrong shape.
#[derive(Deserialize)]
struct Shape<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    method: Option<&'a RawValue>,
}

/// Whether `text` is well-formed JSON, and if not why.
fn check_json(text: &str) -> Result<(), String> {
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn invalid_shape(text: &str, e: serde_json::Error) -> MessageError {
    // serde refused a field as soon as it read it, before it saw the rest of the line, which may
    // still be broken: that is a parse error, not a bad shape. This is the error path, so reading
    // the line again (here and as a generic value to recover its id and whether it was a
    // request) costs nothing that matters.
    if let Err(p) = check_json(text) {
        return MessageError::Parse(p);
    }
    let reason = if text.starts_with('[') {
        "batches are not supported: send one message per line".to_owned()
    } else {
        format!("wrong shape: {e}")
    };
    let (id, is_request_like) = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(obj)) => (
            obj.get("id").and_then(|v| RequestId::deserialize(v).ok()),
            obj.contains_key("method"),
        ),
        // A generic value cannot hold a number out of range either; read the two fields alone.
        _ => match serde_json::from_str::<Shape<'_>>(text) {
            Ok(shape) => (
                shape
                    .id
                    .and_then(|raw| serde_json::from_str::<RequestId>(raw.get()).ok()),
                shape.method.is_some(),
            ),
            Err(_) => return MessageError::Invalid { id: None, reason },
        },
    };
    if is_request_like {
        MessageError::Invalid { id, reason }
    } else {
        MessageError::BadResponse { id, reason }
    }
}

/// A request's params, as the request writers take them: written straight into the request's
/// frame, with no buffer of their own. [`RawValue`] (checked JSON), [`JsonText`] (JSON text the
/// caller vouches for) and [`Typed`] (a value serialized as it is written).
pub trait RequestParams {
    /// Append the params' JSON to `out`. If it fails, `out` may hold part of them.
    fn write_to(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error>;

    /// The params' JSON text, when they are text already: a writer can then look at it before
    /// writing (`meta::write_params` does). `None` for a value serialized as it is written.
    fn as_json(&self) -> Option<&str>;

    /// About how many bytes the params take, so that a frame is allocated once.
    fn size_hint(&self) -> usize;
}

impl RequestParams for RawValue {
    fn write_to(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.extend_from_slice(self.get().as_bytes());
        Ok(())
    }

    fn as_json(&self) -> Option<&str> {
        Some(self.get())
    }

    fn size_hint(&self) -> usize {
        self.get().len()
    }
}

impl<T: RequestParams + ?Sized> RequestParams for Box<T> {
    fn write_to(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        (**self).write_to(out)
    }

    fn as_json(&self) -> Option<&str> {
        (**self).as_json()
    }

    fn size_hint(&self) -> usize {
        (**self).size_hint()
    }
}

/// Params given as JSON text the caller built itself and vouches for — a large payload written
/// straight into one buffer, say — sent as they are, without the parse a [`RawValue`] would
/// cost. Text that is not valid JSON makes the peer answer a parse error (a call that then waits
/// for its deadline): use it only for params you generate.
#[derive(Clone, Copy, Debug)]
pub struct JsonText<'a>(pub &'a str);

impl RequestParams for JsonText<'_> {
    fn write_to(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.extend_from_slice(self.0.as_bytes());
        Ok(())
    }

    fn as_json(&self) -> Option<&str> {
        Some(self.0)
    }

    fn size_hint(&self) -> usize {
        self.0.len()
    }
}

/// Params serialized as they are written into the frame.
#[derive(Debug)]
pub struct Typed<'a, T: ?Sized>(pub &'a T);

/// Room for typed params before they are written (their size is known only then): most fit,
/// and a larger one grows the buffer as it is written.
const TYPED_PARAMS_BYTES: usize = 128;

impl<T: Serialize + ?Sized> RequestParams for Typed<'_, T> {
    fn write_to(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        serde_json::to_writer(&mut *out, self.0)
    }

    fn as_json(&self) -> Option<&str> {
        None
    }

    fn size_hint(&self) -> usize {
        TYPED_PARAMS_BYTES
    }
}

/// Append a request to `out`, its params written by `params` straight into `out` (see
/// [`RequestParams`]; `meta::write_params` places `_meta` among them). The one request writer.
/// If `params` fails, `out` may hold part of the request: discard it.
pub fn write_request<E>(
    out: &mut Vec<u8>,
    id: &RequestId,
    method: &str,
    params: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(), E> {
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    id.write_json(out);
    out.extend_from_slice(br#","method":"#);
    write_str(out, method);
    out.extend_from_slice(br#","params":"#);
    params(out)?;
    out.push(b'}');
    Ok(())
}

/// Append a notification to `out`.
pub fn write_notification(out: &mut Vec<u8>, method: &str, params: &RawValue) {
    out.extend_from_slice(br#"{"jsonrpc":"2.0","method":"#);
    write_str(out, method);
    out.extend_from_slice(br#","params":"#);
    out.extend_from_slice(params.get().as_bytes());
    out.push(b'}');
}

/// Append a successful response to `out`.
pub fn write_result(out: &mut Vec<u8>, id: &RequestId, result: &RawValue) {
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    id.write_json(out);
    out.extend_from_slice(br#","result":"#);
    out.extend_from_slice(result.get().as_bytes());
    out.push(b'}');
}

/// Append an error response to `out`; `id: None` writes `"id":null`.
pub fn write_error(out: &mut Vec<u8>, id: Option<&RequestId>, err: &RpcError) {
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    match id {
        Some(id) => id.write_json(out),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(br#","error":"#);
    serde_json::to_writer(&mut *out, err).expect("an error object always serializes");
    out.push(b'}');
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes()
        .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b < 0x7f)
    {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("writing a string to a Vec cannot fail");
    }
}

/// Params of `$/cancel`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CancelParams {
    /// The id of the request to cancel.
    pub id: RequestId,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn writes_compact_messages() {
        let mut out = Vec::new();
        write_request(&mut out, &RequestId::num(-7), "echo", |out| {
            raw(r#"{"text":"hi"}"#).write_to(out)
        })
        .unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"jsonrpc":"2.0","id":-7,"method":"echo","params":{"text":"hi"}}"#
        );
        out.clear();
        write_error(&mut out, None, &RpcError::new(ErrorCode::ParseError, "bad"));
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"bad"}}"#
        );
        out.clear();
        write_result(&mut out, &RequestId::str("a\"b"), &raw("1"));
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"jsonrpc":"2.0","id":"a\"b","result":1}"#
        );
    }

    #[test]
    fn classifies_each_kind() {
        let m = Message::parse(br#"{"jsonrpc":"2.0","id":1,"method":"a","params":[1]}"#).unwrap();
        assert!(
            matches!(m, Message::Request { ref id, ref method, params: Some(p) } if *id == RequestId::num(1) && method == "a" && p.get() == "[1]")
        );
        let m = Message::parse(br#"{"jsonrpc":"2.0","method":"$/cancel","params":{"id":"x"}}"#)
            .unwrap();
        assert!(matches!(m, Message::Notification { ref method, .. } if method == "$/cancel"));
        let m = Message::parse(br#"{"jsonrpc":"2.0","id":"x","result":null}"#).unwrap();
        assert!(matches!(m, Message::Response { result: Ok(r), .. } if r.get() == "null"));
        let m =
            Message::parse(br#"{"jsonrpc":"2.0","id":2,"error":{"code":-32001,"message":"c"}}"#)
                .unwrap();
        assert!(
            matches!(m, Message::Response { result: Err(ref e), .. } if e.is(ErrorCode::Cancelled))
        );
        // Escaped method names still parse (borrowing falls back to owning).
        let m = Message::parse(br#"{"jsonrpc":"2.0","id":3,"method":"a\u002eb"}"#).unwrap();
        assert!(matches!(m, Message::Request { ref method, params: None, .. } if method == "a.b"));
    }

    /// Found by the `message_parse` fuzz target: a batch or a bare value holding bytes that are
    /// not UTF-8 was answered as an invalid request, though it is not JSON at all.
    #[test]
    fn bytes_that_are_not_utf8_are_a_parse_error_whatever_the_shape() {
        for line in [
            &b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\xf7\"}]"[..],
            b"\"\xff\"",
            b"  [\"\xc3\x28\"]",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}",
            // In a field nobody reads.
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\",\"x\":\"\xff\"}",
        ] {
            let e = Message::parse(line).unwrap_err();
            assert!(matches!(e, MessageError::Parse(_)), "{line:?}: {e:?}");
            assert!(e.reply().unwrap().1.is(ErrorCode::ParseError), "{line:?}");
        }
        // Valid UTF-8 of those shapes is still the invalid request it was.
        let e = Message::parse("[\"é\"]".as_bytes()).unwrap_err();
        assert!(matches!(e, MessageError::Invalid { .. }), "{e:?}");
    }

    /// Found by the `message_parse` fuzz target: a line broken after a field serde refuses (here
    /// an unknown key inside `error`) was answered as valid JSON of the wrong shape.
    #[test]
    fn broken_json_is_a_parse_error_even_past_a_refused_field() {
        let line = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"id"message":"x"}}"#;
        let e = Message::parse(line).unwrap_err();
        assert!(matches!(e, MessageError::Parse(_)), "{e:?}");
        // The same refusal in valid JSON is still a bad shape.
        let line = br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32700,"id":1,"message":"x"}}"#;
        let e = Message::parse(line).unwrap_err();
        assert!(matches!(e, MessageError::BadResponse { .. }), "{e:?}");
    }

    /// Found by the `message_parse` fuzz target: valid JSON with a number too large for the
    /// field it is in (`error.code`) was answered as a parse error, so a broken response was
    /// answered at all.
    #[test]
    fn a_number_out_of_range_is_a_bad_shape_not_a_parse_error() {
        let e =
            Message::parse(br#"{"jsonrpc":"2.0","id":4,"error":{"code":-3e999,"message":"x"}}"#)
                .unwrap_err();
        assert!(
            matches!(&e, MessageError::BadResponse { id: Some(id), .. } if *id == RequestId::num(4)),
            "{e:?}"
        );
        assert!(e.reply().is_none(), "a response is never answered");
        let e = Message::parse(br#"{"jsonrpc":"2.0","id":5,"method":"m","error":{"code":1e999}}"#)
            .unwrap_err();
        assert!(
            matches!(&e, MessageError::Invalid { id: Some(id), .. } if *id == RequestId::num(5)),
            "{e:?}"
        );
    }

    #[test]
    fn bad_messages_are_values_with_the_right_reply() {
        let e = Message::parse(b"{not json").unwrap_err();
        assert!(matches!(e, MessageError::Parse(_)));
        assert_eq!(e.reply().unwrap().1.code, -32700);

        let e = Message::parse(br#"{"jsonrpc":"1.0","id":5,"method":"a"}"#).unwrap_err();
        let (id, err) = e.reply().unwrap();
        assert_eq!((id, err.code), (Some(RequestId::num(5)), -32600));

        let e = Message::parse(br#"{"jsonrpc":"2.0","id":6,"method":7}"#).unwrap_err();
        assert_eq!(e.reply().unwrap().0, Some(RequestId::num(6)));

        let e = Message::parse(br#"[{"jsonrpc":"2.0","id":1,"method":"a"}]"#).unwrap_err();
        assert!(e.to_string().contains("batches"), "{e}");

        let e = Message::parse(br#"{"jsonrpc":"2.0","id":1.5,"method":"a"}"#).unwrap_err();
        assert!(matches!(e, MessageError::Invalid { id: None, .. }));

        let e =
            Message::parse(br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#)
                .unwrap_err();
        assert!(matches!(e, MessageError::Orphan(_)));
        assert!(
            e.reply().is_none(),
            "an error is never answered with an error"
        );

        let e = Message::parse(
            br#"{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"x"}}"#,
        )
        .unwrap_err();
        assert!(
            matches!(e, MessageError::BadResponse { id: Some(_), .. }),
            "{e:?}"
        );
        assert!(e.reply().is_none(), "a response is never answered");
        // Arrays are never read as messages by position.
        let e = Message::parse(br#"["2.0",43,"echo",{"text":"x"}]"#).unwrap_err();
        assert!(matches!(e, MessageError::Invalid { id: None, .. }), "{e:?}");
        assert!(matches!(
            Message::parse(b"[]").unwrap_err(),
            MessageError::Invalid { .. }
        ));
        assert!(matches!(
            Message::parse(b"42").unwrap_err(),
            MessageError::Invalid { .. }
        ));
        // A null or non-string method is an invalid request that keeps its id.
        let e = Message::parse(br#"{"jsonrpc":"2.0","id":8,"method":null}"#).unwrap_err();
        assert!(
            matches!(e, MessageError::Invalid { id: Some(ref i), .. } if *i == RequestId::num(8)),
            "{e:?}"
        );
        // A response with a bad id is never answered.
        let e = Message::parse(br#"{"jsonrpc":"2.0","id":1.5,"result":1}"#).unwrap_err();
        assert!(e.reply().is_none(), "{e:?}");
        // Repeated members are refused, keeping the id.
        let e = Message::parse(br#"{"jsonrpc":"2.0","id":45,"id":46,"method":"a"}"#).unwrap_err();
        assert!(matches!(e, MessageError::Invalid { .. }), "{e:?}");
        let e = Message::parse(br#"{"jsonrpc":"2.0","id":1,"error":"oops"}"#).unwrap_err();
        assert!(
            matches!(e, MessageError::BadResponse { id: Some(_), .. }),
            "{e:?}"
        );
    }

    /// The one-pass reading of plain messages and the field-by-field reading agree on every
    /// combination of each field's usual and unusual values (absent, `null`, the wrong type,
    /// escapes, out of range, duplicated), in two key orders.
    #[test]
    fn the_one_pass_reading_agrees_with_the_field_by_field_one() {
        let jsonrpc = [
            None,
            Some(r#""2.0""#),
            Some(r#""1.0""#),
            Some("2.0"),
            Some("null"),
            Some(r#""2\u002e0""#),
        ];
        let id = [
            None,
            Some("1"),
            Some("-5"),
            Some("9223372036854775807"),
            Some("9223372036854775808"),
            Some("1.5"),
            Some(r#""a""#),
            Some(r#""a\"b""#),
            Some("null"),
            Some("true"),
            Some("[1]"),
        ];
        let method = [
            None,
            Some(r#""echo""#),
            Some(r#""ec\u0068o""#),
            Some("5"),
            Some("null"),
        ];
        let params = [None, Some("{}"), Some("[1]"), Some("null")];
        let result = [None, Some("null"), Some("1")];
        let error = [
            None,
            Some(r#"{"code":1,"message":"m"}"#),
            Some("null"),
            Some(r#""bad""#),
        ];
        let mut lines = 0;
        for j in jsonrpc {
            for i in id {
                for m in method {
                    for p in params {
                        for r in result {
                            for e in error {
                                let fields = [
                                    ("jsonrpc", j),
                                    ("id", i),
                                    ("method", m),
                                    ("params", p),
                                    ("result", r),
                                    ("error", e),
                                ];
                                let present: Vec<String> = fields
                                    .iter()
                                    .filter_map(|(k, v)| v.map(|v| format!(r#""{k}":{v}"#)))
                                    .collect();
                                let mut orders = vec![present.clone()];
                                orders.push(present.iter().rev().cloned().collect());
                                // A field given twice.
                                if let Some(first) = present.first() {
                                    let mut twice = present.clone();
                                    twice.push(first.clone());
                                    orders.push(twice);
                                }
                                for order in orders {
                                    let line = format!("{{{}}}", order.join(","));
                                    let one_pass = Message::parse(line.as_bytes());
                                    let by_field = Message::parse_field_by_field(&line);
                                    assert_eq!(
                                        format!("{one_pass:?}"),
                                        format!("{by_field:?}"),
                                        "{line}"
                                    );
                                    lines += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(lines > 30_000, "{lines}");
    }

    /// Lines in the writers' own bytes are matched, not parsed; every line near them, matched
    /// or not, reads as the field-by-field reading reads it.
    #[test]
    fn lines_as_written_are_matched_and_read_as_the_other_readings_read_them() {
        let raw = |s: &str| RawValue::from_string(s.into()).unwrap();
        // What the writers make: matched.
        let mut written = Vec::new();
        for id in [0, 7, 10, 999_999_999_999_999_999] {
            for method in ["echo", "", "a b/c.d", "é✓", "\u{7f}"] {
                for params in ["{}", r#"{"text":"}\"x"}"#, "[1,2]", "null", "3", r#""s""#] {
                    let mut out = Vec::new();
                    write_request(&mut out, &RequestId::num(id), method, |out| {
                        raw(params).write_to(out)
                    })
                    .unwrap();
                    written.push(String::from_utf8(out).unwrap());
                }
            }
            for result in ["null", "{}", r#"{"a":[1,{"b":"}"}]}"#, "-1.5e3", "true"] {
                let mut out = Vec::new();
                write_result(&mut out, &RequestId::num(id), &raw(result));
                written.push(String::from_utf8(out).unwrap());
            }
        }
        for line in &written {
            assert!(parse_as_written(line).is_some(), "not matched: {line}");
            let read = Message::parse(line.as_bytes());
            assert!(read.is_ok(), "{line}: {read:?}");
            assert_eq!(
                format!("{read:?}"),
                format!("{:?}", Message::parse_field_by_field(line)),
                "{line}"
            );
        }
        // Near them: some matched, most not, every one read alike.
        let head = r#"{"jsonrpc":"2.0","id":"#;
        let mut near = vec![
            format!(r#"{head}01,"method":"m","params":{{}}}}"#),
            format!(r#"{head}1234567890123456789,"method":"m","params":{{}}}}"#),
            format!(r#"{head}9223372036854775808,"result":1}}"#),
            format!(r#"{head}-1,"method":"m","params":{{}}}}"#),
            format!(r#"{head}1.0,"result":1}}"#),
            format!(r#"{head}1e2,"result":1}}"#),
            format!(r#"{head},"result":1}}"#),
            format!(r#"{head}1,"method":"a"b","params":{{}}}}"#),
            format!(r#"{head}1,"method":"ab","params":{{}}}}"#),
            format!("{head}1,\"method\":\"a\tb\",\"params\":{{}}}}"),
            format!(r#"{head}1,"method":"m","params": {{}}}}"#),
            format!(r#"{head}1,"method":"m","params":{{}} }}"#),
            format!(r#"{head}1,"method":"m","params":{{}}}} "#),
            format!(r#"{head}1,"method":"m","params":}}"#),
            format!(r#"{head}1,"method":"m","params":{{}}}}}}"#),
            format!(r#"{head}1,"method":"m","params":{{}},"params":2}}"#),
            format!(r#"{head}1,"method":"m","params":{{}},"result":2}}"#),
            format!(r#"{head}1,"method":"m","params":{{}},"id":2}}"#),
            format!(r#"{head}1,"method":"m","params":{{"a":1}}"#),
            format!(r#"{head}1,"method":"m","params":[1,}}"#),
            format!(r#"{head}1,"method":"m","params":"x}}"#),
            format!(r#"{head}1,"method":"m"}}"#),
            format!(r#"{head}1,"result":1,"error":{{"code":1,"message":"m"}}}}"#),
            format!(r#"{head}1,"result":1,"method":"m"}}"#),
            format!(r#"{head}1,"result":nul}}"#),
            format!(r#"{head}1,"error":{{"code":1,"message":"m"}}}}"#),
            format!(r#"{head}1 ,"result":1}}"#),
            format!(r#"{head}"1","result":1}}"#),
            format!(r#"{head}1,"result":1}}"#).replace("2.0", "1.0"),
            format!(r#" {head}1,"result":1}}"#),
        ];
        near.extend(
            written
                .iter()
                .map(|l| l.replace(r#""params":"#, r#""params" :"#)),
        );
        for line in &near {
            let matched = parse_as_written(line);
            if let Some(m) = &matched {
                assert!(m.is_ok(), "matched, yet refused: {line}: {m:?}");
            }
            let read = Message::parse(line.as_bytes());
            let by_field = Message::parse_field_by_field(line.trim_start());
            assert_eq!(format!("{read:?}"), format!("{by_field:?}"), "{line}");
        }
    }

    #[test]
    fn an_id_is_an_integer_or_a_string_and_nothing_else() {
        let id = |s: &str| serde_json::from_str::<RequestId>(s).ok();
        assert_eq!(id("7"), Some(RequestId::num(7)));
        assert_eq!(id("-7"), Some(RequestId::num(-7)));
        assert_eq!(id("9223372036854775807"), Some(RequestId::num(i64::MAX)));
        assert_eq!(id(r#""x\"y""#), Some(RequestId::str("x\"y")));
        for bad in ["9223372036854775808", "1.0", "true", "null", "[1]", "{}"] {
            assert_eq!(id(bad), None, "{bad}");
        }
    }
}
