//! A minimal HTTP/1.1 client for the management socket, for tests that call the API too often
//! to start the CLI each time (the drills measure latencies with it).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// One request; the status code and the body parsed as JSON (`Value::Null` if it is not).
pub fn request(socket: &Path, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    request_text(socket, method, path, &body)
}

/// [`request`] with the body as text, sent as it is: for bodies a `Value` cannot hold (nested
/// past serde_json's recursion limit, or not JSON at all).
pub fn request_text(socket: &Path, method: &str, path: &str, body: &str) -> (u16, Value) {
    let mut s = UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", socket.display()));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: conduit\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let payload = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (code, serde_json::from_str(payload).unwrap_or(Value::Null))
}

/// Push an event; its id (panics unless it was accepted).
pub fn push(socket: &Path, source: &str, delivery: &str, kind: &str, payload: Value) -> i64 {
    let body = serde_json::json!({"source": source, "delivery_id": delivery, "kind": kind, "payload": payload});
    let (code, v) = request(socket, "POST", "/v1/events", Some(&body));
    assert!(code == 200 || code == 201, "push answered {code}: {v}");
    v["event_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("no event_id in {v}"))
}

/// One event as the API lists it, if it exists.
pub fn event(socket: &Path, id: i64) -> Option<Value> {
    let (code, v) = request(
        socket,
        "GET",
        &format!("/v1/events?after={}&limit=1", id - 1),
        None,
    );
    assert_eq!(code, 200, "events list answered {code}: {v}");
    v["events"]
        .as_array()
        .and_then(|a| a.first().cloned())
        .filter(|e| e["id"] == id)
}

/// `GET path`; the body as JSON, whatever the status (panics if it is not JSON).
pub fn get(socket: &Path, path: &str) -> Value {
    let (code, v) = request(socket, "GET", path, None);
    assert!(
        !v.is_null(),
        "GET {path} answered {code} without a JSON body"
    );
    v
}

/// One keep-alive HTTP/1.1 connection to the socket: requests one after another on it, as a
/// client that pushes many events does (so the daemon's group commit sees concurrent callers
/// from several of these). An error means the connection is gone (the daemon was killed).
pub struct Conn {
    s: UnixStream,
    buf: Vec<u8>,
}

impl Conn {
    pub fn connect(socket: &Path) -> std::io::Result<Conn> {
        let s = UnixStream::connect(socket)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn {
            s,
            buf: Vec::with_capacity(4096),
        })
    }

    /// One request; the status and the body as JSON (`Value::Null` if it is not).
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, Value)> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        self.request_text(method, path, &body)
    }

    /// [`Conn::request`] with the body as text, sent as it is (not JSON, say).
    pub fn request_text(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> std::io::Result<(u16, Value)> {
        write!(
            self.s,
            "{method} {path} HTTP/1.1\r\nhost: conduit\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let broken =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
        self.buf.clear();
        let mut chunk = [0u8; 8192];
        let head = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = self.s.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        };
        let text = String::from_utf8_lossy(&self.buf[..head]).into_owned();
        let code = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| broken("no status"))?;
        let len: usize = text
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .ok_or_else(|| broken("no content-length"))?;
        while self.buf.len() < head + len {
            let n = self.s.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let value = serde_json::from_slice(&self.buf[head..head + len]).unwrap_or(Value::Null);
        Ok((code, value))
    }

    /// Push an event: `{event_id, duplicate}` when it was acknowledged.
    pub fn push(
        &mut self,
        source: &str,
        delivery: &str,
        kind: &str,
        payload: Value,
    ) -> std::io::Result<(u16, Value)> {
        let body = serde_json::json!({"source": source, "delivery_id": delivery, "kind": kind, "payload": payload});
        self.request("POST", "/v1/events", Some(&body))
    }
}
