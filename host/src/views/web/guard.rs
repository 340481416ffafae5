//! Who may use `conduit web`, and how a request proves it: the rules of a local web UI that
//! can act on the daemon.
//!
//! ```text
//!   request ─► Host is 127.0.0.1:PORT or localhost:PORT?   no ─► 421 (DNS rebinding)
//!           ─► session cookie matches?                     yes ─► the page
//!           ─► GET with ?token= matching?                  yes ─► Set-Cookie, 303 to the
//!                                                                 same URL without the token
//!           ─► otherwise                                        ─► 401, "open the URL it printed"
//!   POST    ─► as above, and the form's `csrf` field matches, and Origin (when sent) is ours
//!                                                          no  ─► 403
//! ```
//!
//! The token, the session and the CSRF token are 128 random bits each, drawn once per process
//! from the system's source; they are compared in constant time. The cookie is `HttpOnly`,
//! `SameSite=Strict` and named after the port, so two views on two ports do not replace each
//! other's. Every answer carries the headers of [`SECURITY_HEADERS`]: a Content-Security-Policy
//! that allows only this server's own script, style and forms, and no framing.
//!
//! Pure functions of the request's parts and the [`Secrets`]; `mod.rs` applies them to every
//! request before any page runs.

use axum::http::HeaderMap;

/// The headers every answer carries.
pub const SECURITY_HEADERS: &[(&str, &str)] = &[
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    // Not `no-referrer`: with it a browser sends `Origin: null` on our own forms' POSTs, and
    // the Origin check could not tell them from another site's.
    ("referrer-policy", "same-origin"),
    ("cache-control", "no-store"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-resource-policy", "same-origin"),
];

/// The three secrets of one `conduit web` process.
#[derive(Clone)]
pub struct Secrets {
    /// In the URL printed at start, exchanged once per browser for the session cookie.
    pub token: String,
    /// The session cookie's value.
    pub session: String,
    /// In every form; a POST without it is refused.
    pub csrf: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets { .. }")
    }
}

/// 128 random bits as 32 lower-case hex digits.
fn random_hex() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(hex::encode(b))
}

impl Secrets {
    /// Fresh secrets from the system's random source.
    pub fn new() -> std::io::Result<Secrets> {
        Ok(Secrets {
            token: random_hex()?,
            session: random_hex()?,
            csrf: random_hex()?,
        })
    }
}

/// Equal, in time that does not depend on where they differ.
pub(super) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The session cookie's name for a view on `port`.
pub(super) fn cookie_name(port: u16) -> String {
    format!("conduit_web_{port}")
}

/// The `Set-Cookie` value that starts a session.
pub(super) fn set_cookie(port: u16, session: &str) -> String {
    format!(
        "{}={session}; Path=/; HttpOnly; SameSite=Strict",
        cookie_name(port)
    )
}

/// Whether `host` (the `Host` header) names this server: `127.0.0.1:PORT` or
/// `localhost:PORT`, exactly. Anything else — another name that resolves here (DNS
/// rebinding), another port, no port — is not.
pub(super) fn host_ok(host: Option<&str>, port: u16) -> bool {
    let Some(h) = host else {
        return false;
    };
    let h = h.to_ascii_lowercase();
    h == format!("127.0.0.1:{port}") || h == format!("localhost:{port}")
}

/// Whether `origin` (the `Origin` header, when a browser sends one) is this server.
pub(super) fn origin_ok(origin: Option<&str>, port: u16) -> bool {
    match origin {
        None => true,
        Some(o) => {
            let o = o.to_ascii_lowercase();
            o == format!("http://127.0.0.1:{port}") || o == format!("http://localhost:{port}")
        }
    }
}

/// Whether the request carries this process's session cookie.
pub(super) fn has_session(headers: &HeaderMap, port: u16, secrets: &Secrets) -> bool {
    let name = cookie_name(port);
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| k == name && same(v, &secrets.session))
}

/// The `token` parameter of a query string, if any.
pub(super) fn token_param(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "token")
        .map(|(_, v)| v)
}

/// The query string without its `token` parameter (`None` when nothing is left).
pub(super) fn without_token(query: Option<&str>) -> Option<String> {
    let rest: Vec<&str> = query?
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("token=") && *kv != "token")
        .collect();
    (!rest.is_empty()).then(|| rest.join("&"))
}

/// One field of an `application/x-www-form-urlencoded` body, decoded (`+` is a space).
pub(super) fn form_field(body: &[u8], name: &str) -> Option<String> {
    body.split(|b| *b == b'&')
        .filter_map(|kv| {
            let mut it = kv.splitn(2, |b| *b == b'=');
            Some((it.next()?, it.next().unwrap_or(b"")))
        })
        .find(|(k, _)| decode(k) == name)
        .map(|(_, v)| decode(v))
}

fn decode(s: &[u8]) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < s.len() => match (hex(s[i + 1]), hex(s[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A path to go back to after a form: one of ours (starting with a single `/`), else `/`.
pub(super) fn local_path(p: &str) -> &str {
    let ok = p.starts_with('/') && !p.starts_with("//") && !p.contains('\\') && !p.contains("://");
    if ok { p } else { "/" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> Secrets {
        Secrets {
            token: "t".repeat(32),
            session: "s".repeat(32),
            csrf: "c".repeat(32),
        }
    }

    #[test]
    fn the_host_must_be_this_server_exactly() {
        assert!(host_ok(Some("127.0.0.1:8080"), 8080));
        assert!(host_ok(Some("LOCALHOST:8080"), 8080));
        assert!(!host_ok(Some("127.0.0.1:8081"), 8080));
        assert!(!host_ok(Some("127.0.0.1"), 8080));
        assert!(!host_ok(Some("evil.example:8080"), 8080));
        assert!(!host_ok(Some("127.0.0.1:8080.evil.example"), 8080));
        assert!(!host_ok(Some("[::1]:8080"), 8080));
        assert!(!host_ok(None, 8080));
        assert!(origin_ok(None, 8080));
        assert!(origin_ok(Some("http://localhost:8080"), 8080));
        assert!(!origin_ok(Some("http://evil.example:8080"), 8080));
        assert!(!origin_ok(Some("null"), 8080));
    }

    #[test]
    fn only_this_process_s_session_cookie_counts() {
        let s = secrets();
        let mut h = HeaderMap::new();
        assert!(!has_session(&h, 8080, &s));
        h.insert(
            "cookie",
            format!("a=b; conduit_web_8080={}", s.session)
                .parse()
                .unwrap(),
        );
        assert!(has_session(&h, 8080, &s));
        assert!(!has_session(&h, 9090, &s));
        let mut h = HeaderMap::new();
        h.insert("cookie", "conduit_web_8080=ssss".parse().unwrap());
        assert!(!has_session(&h, 8080, &s));
        assert!(set_cookie(8080, "x").contains("HttpOnly; SameSite=Strict"));
    }

    #[test]
    fn the_token_is_read_from_and_taken_out_of_the_query() {
        assert_eq!(token_param(Some("a=1&token=abc")), Some("abc"));
        assert_eq!(token_param(Some("tokens=abc")), None);
        assert_eq!(token_param(None), None);
        assert_eq!(without_token(Some("token=abc")), None);
        assert_eq!(
            without_token(Some("a=1&token=abc&b=2")).as_deref(),
            Some("a=1&b=2")
        );
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }

    #[test]
    fn form_fields_are_found_and_decoded() {
        let body = b"back=%2Fwork%3Fstate%3Ddone&csrf=abc+d&x";
        assert_eq!(form_field(body, "csrf").as_deref(), Some("abc d"));
        assert_eq!(
            form_field(body, "back").as_deref(),
            Some("/work?state=done")
        );
        assert_eq!(form_field(body, "x").as_deref(), Some(""));
        assert_eq!(form_field(body, "nope"), None);
        assert_eq!(form_field(b"a=%zz%4", "a").as_deref(), Some("%zz%4"));
    }

    #[test]
    fn a_way_back_is_one_of_our_paths() {
        assert_eq!(local_path("/extensions?sort=p99"), "/extensions?sort=p99");
        assert_eq!(local_path("//evil.example/"), "/");
        assert_eq!(local_path("http://evil.example/"), "/");
        assert_eq!(local_path("/\\evil"), "/");
        assert_eq!(local_path(""), "/");
    }

    #[test]
    fn secrets_are_distinct_and_random() {
        let a = Secrets::new().unwrap();
        let b = Secrets::new().unwrap();
        assert_eq!(a.token.len(), 32);
        assert!(a.token != a.session && a.session != a.csrf && a.token != b.token);
    }
}
