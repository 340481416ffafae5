//! Test an extension built on `conduit-extension` the way you test any other code: no daemon,
//! no install. A [`ScriptedHost`] runs your [`Extension`] in this process, on the SDK's own
//! session code (the same `serve` that runs over stdin and stdout in the daemon), over an
//! in-memory duplex, and plays the host with a `conduit-rpc` session of its own:
//!
//! - the handshake, with the limits, deadlines and protocol versions you choose, and the bulk
//!   pipe (a real pipe) when you ask for it;
//! - [`ScriptedHost::call`] any method with params and get the typed result or the protocol
//!   error ([`KitError::Answered`]); in-transaction calls (`work_kind.trigger`,
//!   `recurrence.next`, `dependency.filter`, `emit.commit`) get the host's deadline
//!   (`in_transaction_ms`, 250 by default) in `_meta.remaining_ms`, and an answer later than
//!   that is [`KitError::DeadlineExceeded`], with `$/cancel` sent as the host sends it, so the
//!   handler sees its cancellation;
//! - the extension's callbacks answered from a table ([`HostBuilder::answer`]) or a function
//!   ([`HostBuilder::answer_with`]), every one recorded ([`ScriptedHost::callbacks`]);
//!   `operation.emit`, `ingress.push` and `artifact.close` during an in-transaction call are
//!   refused `reentrant_write`, as conduit refuses them;
//! - [`PendingCall::cancel`] sends `$/cancel`;
//! - artifacts received whole, as bytes, by chunks or on the bulk pipe ([`ScriptedHost::artifacts`]);
//! - [`ScriptedHost::finish`] checks that every request was answered and every artifact stream
//!   kept the rules, then shuts the extension down as the host does.
//!
//! A broken rule is [`KitError::Rule`], named as `conduit ext check` names it ([`rules`]).
//!
//! ```no_run
//! # async fn t() {
//! use conduit_extension::prelude::*;
//! use conduit_extension_testing::ScriptedHost;
//! use serde_json::json;
//!
//! let ext = Extension::new("greeter", "0.1.0")
//!     .method("greet", |cx: Ctx, p: serde_json::Value| async move {
//!         let e = cx.host().event(p["event_id"].as_i64().unwrap_or(0)).await?;
//!         Ok(json!({ "hello": e.payload["name"] }))
//!     });
//! let host = ScriptedHost::builder()
//!     .answer("state.event", json!({"id": 7, "source": "s", "delivery_id": "d", "kind": "k",
//!                                  "payload": {"name": "ada"}, "accepted_at_ms": 0}))
//!     .start(ext)
//!     .await
//!     .unwrap();
//! let r: serde_json::Value = host.call("greet", &json!({"event_id": 7})).await.unwrap();
//! assert_eq!(r, json!({"hello": "ada"}));
//! assert_eq!(host.callbacks()[0].method, "state.event");
//! host.finish().await.unwrap();
//! # }
//! ```
//!
//! Not here: the framing and edge rules of the wire (`conduit ext check` tests those against
//! the built package); a real store (the scripted host answers what the test scripts).
//!
//! The Rust SDK takes the bulk pipe once per process: ask for it ([`HostBuilder::bulk_pipe`])
//! in one test per test binary (one file under `tests/`); later ones get JSON chunks.
//!
//! Invariant: every wait is bounded (the deadlines, and [`HostBuilder::patience`] for what a
//! test waits on at the end), so a broken extension fails its test instead of hanging it.

// The README's examples are compiled as doc tests (their `#[tokio::test]` functions are not run
// there; the same calls run in tests/kit.rs).
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

mod artifacts;
mod error;
mod script;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conduit_extension::{ExitReason, Extension};
use conduit_protocol::handshake::{Capabilities, Deadlines, InitializeResult, Limits};
use conduit_protocol::{PROTOCOL_VERSIONS, RpcError, methods};
use conduit_rpc::{CallError, CallOptions, Peer, Session, SessionConfig};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use artifacts::{Artifact, Transport};
pub use error::{KitError, Rule, rules};
pub use script::{AnswerFn, Callback};

use script::{Answer, HostSide, Serve};

/// How long `initialize` may take, as the host's start timeout.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes the in-memory duplex buffers each way.
const DUPLEX_BYTES: usize = 256 * 1024;

/// Chooses what the scripted host says in the handshake and how it answers callbacks.
#[derive(Clone)]
pub struct HostBuilder {
    versions: Vec<u32>,
    limits: Limits,
    deadlines: Deadlines,
    bulk: bool,
    answers: HashMap<String, Answer>,
    delays: HashMap<String, Duration>,
    patience: Duration,
    manifest: Option<PathBuf>,
}

impl std::fmt::Debug for HostBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuilder")
            .field("versions", &self.versions)
            .field("limits", &self.limits)
            .field("deadlines", &self.deadlines)
            .field("bulk", &self.bulk)
            .field("answers", &self.answers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Default for HostBuilder {
    fn default() -> Self {
        HostBuilder {
            versions: PROTOCOL_VERSIONS.to_vec(),
            limits: Limits::default(),
            deadlines: Deadlines::default(),
            bulk: false,
            answers: HashMap::new(),
            delays: HashMap::new(),
            patience: Duration::from_secs(5),
            manifest: None,
        }
    }
}

impl HostBuilder {
    /// The limits sent in `initialize`; artifact streams are answered with its
    /// `max_artifact_chunk_bytes` and `artifact_window`, and held to them.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The deadlines sent in `initialize`; `in_transaction_ms` is applied to the four
    /// in-transaction calls and `default_ms` to every other call.
    pub fn deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    /// The protocol versions offered, newest first.
    pub fn protocol_versions(mut self, versions: &[u32]) -> Self {
        self.versions = versions.to_vec();
        self
    }

    /// Offer the bulk pipe (a real pipe, read by the kit): artifacts that ask for it come as
    /// frames on it. The Rust SDK takes it once per process.
    pub fn bulk_pipe(mut self) -> Self {
        self.bulk = true;
        self
    }

    /// Answer every `method` callback with `result`.
    pub fn answer(mut self, method: &str, result: impl Serialize) -> Self {
        let value = serde_json::to_value(result).expect("a scripted answer serializes");
        self.answers
            .insert(method.to_owned(), Answer::Fixed(Ok(value)));
        self
    }

    /// Answer every `method` callback with the error `error` (`not_found`, `storage_full`, …).
    pub fn answer_error(mut self, method: &str, error: RpcError) -> Self {
        self.answers
            .insert(method.to_owned(), Answer::Fixed(Err(error)));
        self
    }

    /// Answer `method` callbacks with `f(params)`.
    pub fn answer_with(
        mut self,
        method: &str,
        f: impl Fn(&Value) -> Result<Value, RpcError> + Send + Sync + 'static,
    ) -> Self {
        self.answers
            .insert(method.to_owned(), Answer::With(Arc::new(f)));
        self
    }

    /// Hold every `method` callback for `delay` before answering it (a slow host).
    pub fn delay(mut self, method: &str, delay: Duration) -> Self {
        self.delays.insert(method.to_owned(), delay);
        self
    }

    /// How long [`ScriptedHost::finish`] waits for requests still unanswered, and a bulk close
    /// for its bytes (5 s by default).
    pub fn patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// Check the handshake against this manifest (`conduit-extension.toml`): the same name,
    /// version and `[capabilities]`, as `conduit ext check` does.
    pub fn manifest(mut self, path: impl AsRef<Path>) -> Self {
        self.manifest = Some(path.as_ref().to_owned());
        self
    }

    /// Serve `ext` in this process and make the handshake. Must be called inside a tokio
    /// runtime (`#[tokio::test]`).
    pub async fn start(self, ext: Extension) -> Result<ScriptedHost, KitError> {
        let (bulk_rx, bulk_fd) = if self.bulk {
            let (rx, tx) = std::io::pipe().expect("a pipe for the bulk offer");
            (Some(rx), Some(std::os::fd::IntoRawFd::into_raw_fd(tx)))
        } else {
            (None, None)
        };
        let violations = Arc::new(Mutex::new(Vec::new()));
        let store = artifacts::Store::new(
            self.limits.clone(),
            bulk_rx,
            self.patience,
            violations.clone(),
        );
        let side = Arc::new(HostSide {
            answers: self.answers,
            delays: self.delays,
            calls: Mutex::default(),
            in_transaction: AtomicUsize::new(0),
            store,
        });
        let (a, b) = tokio::io::duplex(DUPLEX_BYTES);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        let expect = ext_facts(&ext);
        let served = tokio::spawn(ext.serve(br, bw));
        let session = Session::new(
            ar,
            aw,
            Serve(side.clone()),
            SessionConfig::named("scripted-host"),
        );
        let peer = session.peer();
        let mut init = serde_json::json!({
            "protocol_versions": self.versions,
            "host": {"name": "conduit-extension-testing", "version": env!("CARGO_PKG_VERSION")},
            "limits": self.limits,
            "deadlines": self.deadlines,
        });
        if let Some(fd) = bulk_fd {
            init["bulk"] = serde_json::json!({ "fd": fd });
        }
        let host = ScriptedHost {
            peer,
            session: Some(session),
            served: Some(served),
            side,
            violations,
            handshake: None,
            deadlines: self.deadlines,
            outstanding: Arc::default(),
            patience: self.patience,
        };
        host.handshake(init, &self.versions, self.manifest.as_deref(), expect)
            .await
    }
}

/// What the extension registered, to hold the handshake to.
fn ext_facts(ext: &Extension) -> (String, String, Capabilities) {
    (
        ext.name().to_owned(),
        ext.version().to_owned(),
        ext.capabilities(),
    )
}

/// A request the test started, until it is answered.
struct Outstanding {
    method: String,
    answered: Arc<AtomicBool>,
    cancelled: CancellationToken,
}

/// The host, scripted by a test: see the crate's docs.
pub struct ScriptedHost {
    peer: Peer,
    session: Option<Session>,
    served: Option<JoinHandle<ExitReason>>,
    side: Arc<HostSide>,
    violations: Arc<Mutex<Vec<KitError>>>,
    handshake: Option<InitializeResult>,
    deadlines: Deadlines,
    outstanding: Arc<Mutex<Vec<Outstanding>>>,
    patience: Duration,
}

impl std::fmt::Debug for ScriptedHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedHost")
            .field("handshake", &self.handshake)
            .finish_non_exhaustive()
    }
}

#[derive(serde::Deserialize)]
struct ManifestFacts {
    name: String,
    version: String,
    #[serde(default)]
    capabilities: Capabilities,
}

impl ScriptedHost {
    /// A host with conduit's limits and deadlines and no scripted answers.
    pub fn builder() -> HostBuilder {
        HostBuilder::default()
    }

    /// Serve `ext` behind a default host (see [`HostBuilder::start`]).
    pub async fn start(ext: Extension) -> Result<ScriptedHost, KitError> {
        HostBuilder::default().start(ext).await
    }

    async fn handshake(
        mut self,
        init: Value,
        offered: &[u32],
        manifest: Option<&Path>,
        (name, version, caps): (String, String, Capabilities),
    ) -> Result<ScriptedHost, KitError> {
        let res: InitializeResult = self
            .peer
            .call(methods::host::INITIALIZE, &init, Some(START_TIMEOUT))
            .await
            .map_err(|e| match e {
                CallError::Rpc { method, error } => KitError::Answered { method, error },
                other => KitError::rule(rules::HANDSHAKE, other.to_string()),
            })?;
        if !offered.contains(&res.protocol_version) {
            return Err(KitError::rule(
                rules::VERSION,
                format!(
                    "the extension answered protocol version {}, the host offered {offered:?}",
                    res.protocol_version
                ),
            ));
        }
        if (
            &res.extension.name,
            &res.extension.version,
            &res.capabilities,
        ) != (&name, &version, &caps)
        {
            return Err(KitError::rule(
                rules::HANDSHAKE,
                format!(
                    "the handshake says {res:?}, the extension registered {name} {version} {caps:?}"
                ),
            ));
        }
        if let Some(path) = manifest {
            check_manifest(path, &res)?;
        }
        self.handshake = Some(res);
        Ok(self)
    }

    /// The extension's answer to `initialize`.
    pub fn handshake_result(&self) -> &InitializeResult {
        self.handshake.as_ref().expect("set by start")
    }

    /// Call `method` with `params` and wait for the typed result, under the host's deadline
    /// for the method (`in_transaction_ms` for an in-transaction call, else `default_ms`).
    pub async fn call<P, R>(&self, method: &str, params: &P) -> Result<R, KitError>
    where
        P: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        self.start_call(method, params).wait().await
    }

    /// [`ScriptedHost::call`] under `deadline` instead (`None`: wait as long as it takes, up
    /// to [`ScriptedHost::finish`]).
    pub async fn call_within<P, R>(
        &self,
        method: &str,
        params: &P,
        deadline: Option<Duration>,
    ) -> Result<R, KitError>
    where
        P: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        self.start_within(method, params, deadline).wait().await
    }

    /// Send `method` now and return at once: cancel it, or wait for its answer later.
    pub fn start_call<P: Serialize + ?Sized>(&self, method: &str, params: &P) -> PendingCall {
        let ms = if methods::host::IN_TRANSACTION.contains(&method) {
            self.deadlines.in_transaction_ms
        } else {
            self.deadlines.default_ms
        };
        self.start_within(method, params, Some(Duration::from_millis(ms)))
    }

    /// [`ScriptedHost::start_call`] under `deadline`.
    pub fn start_within<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
        deadline: Option<Duration>,
    ) -> PendingCall {
        let raw = serde_json::value::to_raw_value(params).expect("params serialize");
        let in_tx = methods::host::IN_TRANSACTION.contains(&method);
        if in_tx {
            self.side.in_transaction.fetch_add(1, Ordering::SeqCst);
        }
        let cancel = CancellationToken::new();
        let answered = Arc::new(AtomicBool::new(false));
        self.outstanding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Outstanding {
                method: method.to_owned(),
                answered: answered.clone(),
                cancelled: cancel.clone(),
            });
        let (peer, side, token, m) = (
            self.peer.clone(),
            self.side.clone(),
            cancel.clone(),
            method.to_owned(),
        );
        let task = tokio::spawn(async move {
            // `_meta.remaining_ms` carried as the host carries it (the whole deadline, written
            // into the params by the session's one writer of `_meta`).
            let opts = CallOptions::within(deadline)
                .carrying_deadline()
                .cancelled_by(&token);
            let r = peer.request(&m, &*raw, opts).await;
            if in_tx {
                side.in_transaction.fetch_sub(1, Ordering::SeqCst);
            }
            answered.store(true, Ordering::SeqCst);
            r
        });
        PendingCall {
            method: method.to_owned(),
            cancel,
            task,
        }
    }

    /// Every callback the extension made so far, in the order they came.
    pub fn callbacks(&self) -> Vec<Callback> {
        self.side
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The callbacks of `method` made so far, their params in order.
    pub fn callbacks_of(&self, method: &str) -> Vec<Value> {
        self.callbacks()
            .into_iter()
            .filter(|c| c.method == method)
            .map(|c| c.params)
            .collect()
    }

    /// Every artifact stored so far (closed successfully), in the order of their closes.
    pub fn artifacts(&self) -> Vec<Artifact> {
        self.side.store.stored()
    }

    /// The names of the artifact streams the extension aborted.
    pub fn aborted_artifacts(&self) -> Vec<String> {
        self.side.store.aborted()
    }

    /// End the test: wait (up to the patience) for every request started to be answered,
    /// report the first request left unanswered or rule broken, then send `shutdown` and
    /// check that it is answered `{}` and the extension's `serve` returns.
    pub async fn finish(mut self) -> Result<(), KitError> {
        let until = Instant::now() + self.patience;
        let unanswered = loop {
            let left: Vec<(String, bool)> = self
                .outstanding
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|o| !o.answered.load(Ordering::SeqCst))
                .map(|o| (o.method.clone(), o.cancelled.is_cancelled()))
                .collect();
            if left.is_empty() || Instant::now() >= until {
                break left;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let mut problems: Vec<KitError> = unanswered
            .iter()
            .map(|(method, cancelled)| {
                let (rule, how) = if *cancelled {
                    (rules::CANCELLATION, "cancelled with `$/cancel` and")
                } else {
                    (rules::DECLARED_METHODS, "")
                };
                KitError::rule(
                    rule,
                    format!(
                        "the request `{method}` was {how} never answered within {:?}; every request is answered exactly once (docs/protocol.md §3)",
                        self.patience
                    ),
                )
            })
            .collect();
        problems.append(&mut self.violations.lock().unwrap_or_else(|p| p.into_inner()));
        let grace = Duration::from_millis(self.deadlines.shutdown_grace_ms);
        let stop: Result<Value, _> = self
            .peer
            .call(methods::host::SHUTDOWN, &serde_json::json!({}), Some(grace))
            .await;
        match stop {
            Ok(v) if v == serde_json::json!({}) => {}
            other => problems.push(KitError::rule(
                rules::SHUTDOWN,
                format!("`shutdown` was answered {other:?}, not {{}}"),
            )),
        }
        if let Some(served) = self.served.take() {
            match tokio::time::timeout(grace, served).await {
                Ok(Ok(ExitReason::Shutdown)) => {}
                other => problems.push(KitError::rule(
                    rules::SHUTDOWN,
                    format!("after `shutdown` the extension's serve ended with {other:?}"),
                )),
            }
        }
        if let Some(s) = self.session.take() {
            s.close(Duration::from_millis(100)).await;
        }
        match problems.len() {
            0 => Ok(()),
            1 => Err(problems.remove(0)),
            n => {
                let first = problems.remove(0);
                let rest: Vec<String> = problems.iter().map(ToString::to_string).collect();
                match first {
                    KitError::Rule { rule, detail } => Err(KitError::Rule {
                        rule,
                        detail: format!("{detail}; and {} more: {}", n - 1, rest.join("; ")),
                    }),
                    other => Err(other),
                }
            }
        }
    }
}

fn check_manifest(path: &Path, res: &InitializeResult) -> Result<(), KitError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        KitError::rule(
            rules::CAPABILITIES_MATCH,
            format!("cannot read the manifest {}: {e}", path.display()),
        )
    })?;
    let m: ManifestFacts = toml::from_str(&text).map_err(|e| {
        KitError::rule(
            rules::CAPABILITIES_MATCH,
            format!("the manifest {} does not read: {e}", path.display()),
        )
    })?;
    let said = (&res.extension.name, &res.extension.version);
    if (&m.name, &m.version) != said {
        return Err(KitError::rule(
            rules::HANDSHAKE,
            format!(
                "the manifest {} says {} {}, the handshake {} {}: state the version once (read it from one place) or change both",
                path.display(),
                m.name,
                m.version,
                said.0,
                said.1
            ),
        ));
    }
    if m.capabilities != res.capabilities {
        return Err(KitError::rule(
            rules::CAPABILITIES_MATCH,
            format!(
                "the manifest's [capabilities] are {:?}, the handshake declares {:?}",
                m.capabilities, res.capabilities
            ),
        ));
    }
    Ok(())
}

/// A request sent to the extension and not yet waited for.
#[derive(Debug)]
pub struct PendingCall {
    method: String,
    cancel: CancellationToken,
    task: JoinHandle<Result<Box<RawValue>, CallError>>,
}

impl PendingCall {
    /// Send `$/cancel` for it (the answer, normally `cancelled`, is still awaited).
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Wait for the answer: the typed result, the extension's error, the deadline, or a rule
    /// broken (a result of the wrong shape).
    pub async fn wait<R: DeserializeOwned>(self) -> Result<R, KitError> {
        let method = self.method;
        let raw = match self.task.await {
            Ok(r) => r,
            Err(e) => {
                return Err(KitError::rule(
                    rules::DECLARED_METHODS,
                    format!("the call of `{method}` did not complete: {e}"),
                ));
            }
        };
        let raw = raw.map_err(|e| match e {
            CallError::Rpc { method, error } => KitError::Answered { method, error },
            CallError::DeadlineExceeded { method, deadline } => {
                KitError::DeadlineExceeded { method, deadline }
            }
            other => KitError::rule(rules::DECLARED_METHODS, other.to_string()),
        })?;
        serde_json::from_str(raw.get()).map_err(|e| {
            KitError::rule(
                rules::DECLARED_METHODS,
                format!(
                    "the result of `{method}` does not read as {}: {e}; it was {}",
                    std::any::type_name::<R>(),
                    raw.get()
                ),
            )
        })
    }
}
