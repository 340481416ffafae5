//! Headless Chromium (Debian's `chromium`) driven over the DevTools protocol, for the web
//! view's tests: navigate, evaluate script in the page, take a screenshot.
//!
//! The browser runs as the CI runs it (root, so `--no-sandbox`), with the flags that keep it
//! off the network (no background networking, component updates or sync), a fresh profile, and
//! `rebind.test` resolving to 127.0.0.1 so a test can reach the view under a foreign host name,
//! as a DNS rebinding attack would. One page target, attached with a flat session.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tungstenite::{Message, WebSocket};

/// Where Debian puts it.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// A browser with one page.
pub struct Browser {
    child: Child,
    ws: WebSocket<TcpStream>,
    session: String,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Start the browser; panics, saying how to install it, when it is missing.
    pub fn start() -> Browser {
        assert!(
            Path::new(CHROMIUM).exists(),
            "{CHROMIUM} is missing: install Debian's chromium (`apt-get install chromium`; .ci/run does)"
        );
        let profile = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(CHROMIUM);
        // Its own process group, so the drop ends its helpers (renderer, GPU, zygote) too.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--remote-debugging-port=0",
                "--window-size=1400,900",
                "--host-resolver-rules=MAP rebind.test 127.0.0.1",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && let Some(i) = line.find("ws://") {
                    let _ = tx.send(line[i..].trim().to_owned());
                    sent = true;
                }
            }
        });
        let url = rx
            .recv_timeout(super::PATIENCE)
            .expect("chromium never said where its DevTools endpoint is");
        let rest = url.strip_prefix("ws://").unwrap();
        let host = rest.split('/').next().unwrap().to_owned();
        let stream = TcpStream::connect(&host).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let (ws, _) =
            tungstenite::client::client(url.as_str(), stream).expect("DevTools websocket");
        let mut b = Browser {
            child,
            ws,
            session: String::new(),
            next_id: 0,
            _profile: profile,
        };
        let target = b.call_browser("Target.createTarget", json!({ "url": "about:blank" }));
        let id = target["targetId"].as_str().unwrap().to_owned();
        let attached = b.call_browser(
            "Target.attachToTarget",
            json!({ "targetId": id, "flatten": true }),
        );
        b.session = attached["sessionId"].as_str().unwrap().to_owned();
        b.call("Page.enable", json!({}));
        b.call("Runtime.enable", json!({}));
        b
    }

    fn send(&mut self, method: &str, params: Value, session: Option<&str>) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.ws
            .send(Message::text(msg.to_string()))
            .expect("send to DevTools");
        loop {
            let m = self.ws.read().expect("read from DevTools");
            let Message::Text(text) = m else { continue };
            let v: Value = serde_json::from_str(&text).unwrap();
            if v["id"] == id {
                assert!(v["error"].is_null(), "{method} failed: {v}");
                return v["result"].clone();
            }
        }
    }

    fn call_browser(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, None)
    }

    /// A command to the page.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let s = self.session.clone();
        self.send(method, params, Some(&s))
    }

    /// Evaluate `expr` in the page; its value (awaited when it is a promise).
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
        );
        assert!(
            r["exceptionDetails"].is_null(),
            "{expr} threw: {}",
            r["exceptionDetails"]
        );
        r["result"]["value"].clone()
    }

    /// Go to `url` and wait until the document that answers it has loaded.
    pub fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }));
        self.wait_loaded();
    }

    /// Wait until the current navigation's document is complete.
    pub fn wait_loaded(&mut self) {
        let start = Instant::now();
        loop {
            let st = self.eval("document.readyState + ' ' + location.href");
            if st
                .as_str()
                .is_some_and(|s| s.starts_with("complete") && !s.ends_with("about:blank"))
            {
                return;
            }
            assert!(
                start.elapsed() < super::PATIENCE,
                "the page never loaded: {st}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Poll `expr` until it is `true`.
    pub fn wait_for(&mut self, what: &str, expr: &str) {
        let start = Instant::now();
        loop {
            if self.eval(expr) == json!(true) {
                return;
            }
            assert!(
                start.elapsed() < super::PATIENCE,
                "the page never showed {what}; it reads:\n{}",
                self.eval("document.body ? document.body.innerText : ''")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The HTTP status of the document shown.
    pub fn status(&mut self) -> u64 {
        self.eval("performance.getEntriesByType('navigation')[0].responseStatus")
            .as_u64()
            .unwrap_or(0)
    }

    /// The page's visible text.
    pub fn text(&mut self) -> String {
        self.eval("document.body.innerText")
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// A PNG of the viewport, written to `path`.
    pub fn screenshot(&mut self, path: &Path) -> PathBuf {
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        use base64::Engine;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
        path.to_owned()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.ws.close(None);
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}
