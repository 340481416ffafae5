//! `conduit web` in a real browser (headless Chromium over the DevTools protocol), against a
//! real daemon with real extensions: the token flow, the extensions table, a restart button
//! that restarts, the Work pages, the doctor page, the live refresh, and the refusals — no
//! token (401), a foreign host name (421, as DNS rebinding would bring), a POST without the
//! CSRF token (403) — and a description and an event payload holding `<script>` shown as text.
//! Screenshots of the main pages go to `target/screenshots/`.

mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use support::PATIENCE;
use support::browser::Browser;
use support::fixture::Fixture;

/// A running `conduit web`, stopped (SIGTERM) when dropped.
struct WebView {
    child: Child,
    url: String,
    port: u16,
    token: String,
}

impl WebView {
    fn start(f: &Fixture) -> WebView {
        let mut child = Command::new(env!("CARGO_BIN_EXE_conduit"))
            .args(["web"])
            .env("CONDUIT_STATE_DIR", f.state())
            .env_remove("CONDUIT_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start conduit web");
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let url = first.trim().to_owned();
        // http://127.0.0.1:PORT/?token=HEX
        let port = url
            .strip_prefix("http://127.0.0.1:")
            .and_then(|r| r.split('/').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the first line is not the URL: {first:?}"));
        let token = url.rsplit("token=").next().unwrap().to_owned();
        assert_eq!(token.len(), 32, "{url}");
        WebView {
            child,
            url,
            port,
            token,
        }
    }

    fn at(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn stop(&mut self) -> Option<i32> {
        support::fixture::kill(self.child.id() as i32, nix::sys::signal::Signal::SIGTERM);
        self.child.wait().ok().and_then(|s| s.code())
    }
}

impl Drop for WebView {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn screens() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("screenshots")
}

/// A package whose description holds markup, to see that it is shown as text.
fn marked(f: &Fixture) -> PathBuf {
    let pkg = f.dir.path().join("src").join("marked");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::copy(
        support::workspace_root().join("host/supervisor/tests/fixtures/misbehave.py"),
        pkg.join("misbehave.py"),
    )
    .unwrap();
    std::fs::write(
        pkg.join("conduit-extension.toml"),
        "name = \"marked\"\nversion = \"0.1.0\"\nprotocol = 1\n\
         description = \"<script>window.__pwned = 1</script><b>bold</b>\"\n\
         command = [\"python3\", \"misbehave.py\", \"ok\"]\n\n[capabilities]\nmethods = [\"echo\"]\n",
    )
    .unwrap();
    pkg
}

#[test]
fn the_web_view_in_a_real_browser() {
    let mut f = Fixture::new();
    f.install(&f.misbehave("steady", "ok"));
    f.install(&marked(&f));
    f.install(&f.core_ext("worker", "ok"));
    f.start_daemon();
    for name in ["steady", "marked", "worker"] {
        f.wait_state(name, "ready", PATIENCE);
    }
    // Some calls, for the latency histogram.
    for i in 0..20 {
        f.conduit(&["ext", "call", "steady", "echo", &format!("{{\"i\":{i}}}")])
            .expect_code(0);
    }
    // An event whose payload holds markup, routed to a Work.
    f.push(
        "feed",
        "d-1",
        "job.created",
        r#"{"group":"g1","text":"<script>window.__pwned = 2</script><i>it</i>"}"#,
    );
    let socket = f.state().join("run/conduit.sock");
    let work_id = f.wait_until("the event to open a Work", || {
        let v = support::http::get(&socket, "/v1/work/recent");
        v["work"][0]["id"].as_i64()
    });

    let mut web = WebView::start(&f);
    let mut b = Browser::start();

    // No token, no cookie: 401, and the page says what to do.
    b.goto(&web.at("/extensions"));
    assert_eq!(b.status(), 401, "{}", b.text());
    assert!(b.text().contains("needs its token"), "{}", b.text());
    // A foreign host name that resolves here (DNS rebinding): 421, even with the token.
    b.goto(&format!(
        "http://rebind.test:{}/?token={}",
        web.port, web.token
    ));
    assert_eq!(b.status(), 421, "{}", b.text());
    assert!(b.text().contains("Wrong address"), "{}", b.text());

    // The token: exchanged for a cookie script cannot read, then dropped from the address.
    b.goto(&web.url);
    b.wait_for("the extensions page", "location.pathname === '/extensions'");
    assert_eq!(b.eval("location.search"), "");
    assert_eq!(b.status(), 200);
    assert_eq!(
        b.eval("document.cookie"),
        "",
        "the session cookie is HttpOnly"
    );
    b.wait_for(
        "the three extensions, ready",
        "['steady','marked','worker'].every(n => [...document.querySelectorAll('#extensions tbody tr')]\
           .some(r => r.cells[0].innerText === n && r.cells[1].innerText === 'ready'))",
    );
    // The live parts refresh without a reload (the script runs under the CSP).
    b.wait_for(
        "a live refresh",
        "document.body.hasAttribute('data-refreshed')",
    );
    b.screenshot(&screens().join("web-extensions.png"));

    // A description holding markup is text; nothing of it ran.
    b.goto(&web.at("/extensions/marked"));
    assert!(
        b.text()
            .contains("<script>window.__pwned = 1</script><b>bold</b>"),
        "{}",
        b.text()
    );
    assert_eq!(b.eval("typeof window.__pwned"), "undefined");
    assert_eq!(b.eval("document.querySelectorAll('b').length"), 0);
    assert_eq!(
        b.eval("document.scripts.length"),
        1,
        "only the view's own script"
    );

    // One extension: its status, calls and latency histogram.
    b.goto(&web.at("/extensions/steady"));
    b.wait_for(
        "the histogram",
        "!!document.querySelector('svg.hist rect.bar')",
    );
    assert!(b.text().contains("echo"), "{}", b.text());
    b.screenshot(&screens().join("web-extension.png"));

    // A POST without the CSRF token is refused, and restarts nothing.
    let pid = f.status("steady")["pid"].as_i64().unwrap();
    let refused = b.eval(
        "fetch('/extensions/steady/restart', {method: 'POST', \
           headers: {'content-type': 'application/x-www-form-urlencoded'}, body: 'back=%2F'})\
           .then(r => r.status)",
    );
    assert_eq!(refused, 403);
    assert_eq!(f.status("steady")["pid"].as_i64(), Some(pid));

    // The restart button restarts it, and the page comes back.
    b.goto(&web.at("/extensions?filter=steady"));
    b.eval("document.querySelector('form[action=\"/extensions/steady/restart\"] button').click()");
    f.wait_for("steady", PATIENCE, |s| {
        s["state"] == "ready" && s["pid"].as_i64().is_some_and(|p| p != pid)
    });
    b.wait_loaded();
    b.wait_for(
        "the list again after the restart",
        "location.pathname === '/extensions' && location.search === '?filter=steady'",
    );

    // Work: the list, then one Work with its event, the payload shown as text.
    b.goto(&web.at("/work"));
    b.wait_for(
        "the Work row",
        &format!(
            "[...document.querySelectorAll('#work tbody tr')].some(r => r.cells[0].innerText === '{work_id}' && r.cells[1].innerText === 'job')"
        ),
    );
    b.screenshot(&screens().join("web-work.png"));
    b.eval(&format!(
        "document.querySelector('#work a[href=\"/work/{work_id}\"]').click()"
    ));
    b.wait_for(
        "the Work's page",
        &format!("location.pathname === '/work/{work_id}'"),
    );
    b.wait_loaded();
    assert!(
        b.text()
            .contains("<script>window.__pwned = 2</script><i>it</i>"),
        "{}",
        b.text()
    );
    assert_eq!(b.eval("typeof window.__pwned"), "undefined");
    assert_eq!(b.eval("document.querySelectorAll('main i').length"), 0);
    b.screenshot(&screens().join("web-one-work.png"));

    // The doctor: every check with its status.
    b.goto(&web.at("/doctor"));
    assert_eq!(b.status(), 200);
    b.wait_for(
        "the doctor's checks",
        "[...document.querySelectorAll('#doctor tbody tr')].some(r => r.cells[0].innerText === 'daemon')",
    );
    b.screenshot(&screens().join("web-doctor.png"));

    // The other lists answer.
    for path in ["/timers", "/waits", "/emissions", "/artifacts"] {
        b.goto(&web.at(path));
        assert_eq!(b.status(), 200, "{path}: {}", b.text());
    }

    drop(b);
    assert_eq!(web.stop(), Some(0), "conduit web exits 0 on SIGTERM");
}

#[test]
fn the_web_view_refuses_plain_requests_it_should() {
    let mut f = Fixture::new();
    f.install(&f.misbehave("steady", "ok"));
    f.start_daemon();
    let web = WebView::start(&f);
    // Without a browser: the raw answers, headers included.
    let get = |path: &str, host: &str, extra: &str| -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", web.port)).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let here = format!("127.0.0.1:{}", web.port);
    let ok = get(&format!("/?token={}", web.token), &here, "");
    assert!(ok.starts_with("HTTP/1.1 303"), "{ok}");
    assert!(
        ok.to_ascii_lowercase()
            .contains("httponly; samesite=strict"),
        "{ok}"
    );
    assert!(
        ok.contains("content-security-policy: default-src 'none'"),
        "{ok}"
    );
    let cookie = ok
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_owned();
    let page = get("/extensions", &here, &format!("Cookie: {cookie}\r\n"));
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("x-frame-options: DENY"), "{page}");
    // Another port in the Host, no Host's port, a wrong token, another process's cookie.
    let other = format!("127.0.0.1:{}", web.port.wrapping_add(1));
    assert!(
        get("/extensions", &other, &format!("Cookie: {cookie}\r\n")).starts_with("HTTP/1.1 421")
    );
    assert!(
        get("/extensions", "127.0.0.1", &format!("Cookie: {cookie}\r\n"))
            .starts_with("HTTP/1.1 421")
    );
    assert!(get(&format!("/?token={}", "0".repeat(32)), &here, "").starts_with("HTTP/1.1 401"));
    let forged = format!("conduit_web_{}={}", web.port, "0".repeat(32));
    assert!(
        get("/extensions", &here, &format!("Cookie: {forged}\r\n")).starts_with("HTTP/1.1 401")
    );
    // A POST from another site's page is refused even with the session.
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", web.port)).unwrap();
    let body = "csrf=whatever&back=%2F";
    write!(
        s,
        "POST /extensions/steady/restart HTTP/1.1\r\nHost: {here}\r\nCookie: {cookie}\r\n\
         Origin: http://evil.example\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
}

#[test]
fn the_web_view_needs_a_daemon() {
    let f = Fixture::new();
    f.install(&f.misbehave("steady", "ok"));
    let run = f.conduit(&["web"]);
    run.expect_code(3);
    assert!(
        run.stderr().contains("conduit daemon run"),
        "{}",
        run.context()
    );
    assert!(run.stdout().is_empty(), "{}", run.context());
}
