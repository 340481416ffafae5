//! Reading the id of a message we refused to buffer.
//!
//! An oversized message is discarded unread, but its first bytes are kept. If its top-level
//! `"id"` is among them, the session can still answer it (`message_too_large`) or fail the
//! call it answers. This is a scanner, not a parser: it walks the top-level object's keys,
//! skipping values (nested objects, arrays, strings with escapes), and stops where the head ends.

use conduit_protocol::RequestId;

/// What the head of a message says about it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Peek {
    pub(crate) id: Option<RequestId>,
    pub(crate) has_method: bool,
    /// `params` was seen: only requests and notifications carry it.
    pub(crate) has_params: bool,
    /// `result` or `error` was seen: only responses carry them.
    pub(crate) has_outcome: bool,
}

impl Peek {
    /// A request (or notification) for sure: it names a method, or carries params.
    pub(crate) fn is_request(&self) -> bool {
        self.has_method || (self.has_params && !self.has_outcome)
    }

    /// A response for sure: it carries a result or an error and no method.
    pub(crate) fn is_response(&self) -> bool {
        self.has_outcome && !self.has_method && !self.has_params
    }
}

pub(crate) fn peek(head: &[u8]) -> Peek {
    let mut out = Peek::default();
    let mut s = Scanner { b: head, i: 0 };
    s.ws();
    if !s.eat(b'{') {
        return out;
    }
    loop {
        s.ws();
        let Some(key) = s.string() else { return out };
        s.ws();
        if !s.eat(b':') {
            return out;
        }
        s.ws();
        match key.as_slice() {
            b"id" => {
                // The id counts only if its whole value is in the head and is a valid id.
                let start = s.i;
                if !s.skip_value() || s.i == s.b.len() {
                    return out;
                }
                let token = std::str::from_utf8(&s.b[start..s.i])
                    .unwrap_or("")
                    .trim_end();
                match serde_json::from_str::<RequestId>(token) {
                    Ok(id) => out.id = Some(id),
                    Err(_) => return out,
                }
            }
            b"method" => {
                out.has_method = true;
                if !s.skip_value() {
                    return out;
                }
            }
            key @ (b"params" | b"result" | b"error") => {
                if key == b"params" {
                    out.has_params = true;
                } else {
                    out.has_outcome = true;
                }
                if !s.skip_value() {
                    return out;
                }
            }
            _ => {
                if !s.skip_value() {
                    return out;
                }
            }
        }
        s.ws();
        if !s.eat(b',') {
            return out;
        }
    }
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scanner<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\r' | b'\n') {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// A string's raw bytes (escapes kept as written, which is enough to compare keys; ids are
    /// read with a real JSON parser). `None` if the head ends inside it.
    fn string(&mut self) -> Option<Vec<u8>> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.i;
        while self.i < self.b.len() {
            match self.b[self.i] {
                b'\\' => self.i += 2,
                b'"' => {
                    let v = self.b[start..self.i].to_vec();
                    self.i += 1;
                    return Some(v);
                }
                _ => self.i += 1,
            }
        }
        None
    }

    /// Skip one value; false if the head ends inside it.
    fn skip_value(&mut self) -> bool {
        let mut depth = 0usize;
        while self.i < self.b.len() {
            match self.b[self.i] {
                b'"' => {
                    if self.string().is_none() {
                        return false;
                    }
                    if depth == 0 {
                        return true;
                    }
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    if depth == 0 {
                        return true; // end of the enclosing object: leave it for the caller
                    }
                    depth -= 1;
                    if depth == 0 {
                        self.i += 1;
                        return true;
                    }
                }
                b',' if depth == 0 => return true,
                _ => {}
            }
            self.i += 1;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_top_level_id_wherever_it_is() {
        let p = peek(br#"{"jsonrpc":"2.0","id":42,"method":"x","params":{"a"#);
        assert_eq!(
            (p.id, p.has_method, p.has_params),
            (Some(RequestId::num(42)), true, true)
        );
        let p = peek(br#"{"params":{"id":1,"s":"}\"{"},"method":"m","id":"abc","x""#);
        assert_eq!((p.id, p.has_method), (Some(RequestId::str("abc")), true));
        let p = peek(br#"{"jsonrpc":"2.0","id":-3,"result":[1,2"#);
        assert_eq!(
            (p.id, p.has_method, p.has_outcome),
            (Some(RequestId::num(-3)), false, true)
        );
    }

    #[test]
    fn gives_up_quietly_when_the_id_is_cut_or_absent() {
        assert_eq!(peek(br#"{"jsonrpc":"2.0","params":{"id":1,"#).id, None);
        assert_eq!(
            peek(br#"{"id":12"#).id,
            None,
            "the number may continue past the head"
        );
        assert_eq!(peek(b"garbage").id, None);
        assert_eq!(peek(b"").id, None);
        assert_eq!(
            peek(br#"{"id":1.5,"method":"m","params":"#).id,
            None,
            "not a valid id"
        );
        assert_eq!(peek(br#"{"id":true,"method":"m","params":"#).id, None);
        assert_eq!(
            peek(br#"{"id":"a\"b","method":"m","params":"#).id,
            Some(RequestId::str("a\"b"))
        );
    }

    #[test]
    fn tells_requests_from_responses_even_when_method_comes_late() {
        // params first, method past the head: still a request.
        let p = peek(br#"{"jsonrpc":"2.0","id":1,"params":{"s":"xxxxxxxx"#);
        assert!(p.is_request() && !p.is_response(), "{p:?}");
        let p = peek(br#"{"jsonrpc":"2.0","id":1,"result":{"s":"xxxx"#);
        assert!(p.is_response() && !p.is_request(), "{p:?}");
        // Only the id seen: neither for sure.
        let p = peek(br#"{"jsonrpc":"2.0","id":1,"x":"xxxxx"#);
        assert!(!p.is_response() && !p.is_request(), "{p:?}");
    }
}
