//! The builder: an extension's name, version, protocol versions and handlers.
//!
//! Each registration adds a handler and the matching entry of the handshake's capabilities, so
//! what the extension declares and what it serves can never drift apart.
//!
//! Invariant: every name in [`Extension::capabilities`] has a handler (or, for a declared work
//! kind without a trigger and a push-only ingress source, needs none), and `check.sleep` is always
//! declared. Registration mistakes (an empty or repeated name, a custom method named like a
//! protocol method) panic at once, before anything is served: they are bugs in the extension,
//! not conditions to handle at run time.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use conduit_protocol::calls::{
    CommitParams, CommitResult, FilterParams, FilterResult, IngressPollParams, IngressPollResult,
    RecurrenceParams, RecurrenceResult, TriggerParams, TriggerResult,
};
use conduit_protocol::handshake::{Capabilities, WorkKind};
use conduit_protocol::methods::{
    DependencyFilter, EmitCommit, Method, RecurrenceNext, WorkKindTrigger,
};
use conduit_protocol::{RpcError, methods};
use conduit_rpc::{BoxFuture, HandlerResult, to_raw};
use rustc_hash::FxHashMap;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ctx::Ctx;

/// A handler of one of the protocol's typed calls, boxed.
pub(crate) type TypedFn<P, R> = Arc<dyn Fn(Ctx, P) -> BoxFuture<Result<R, RpcError>> + Send + Sync>;

/// The handlers of one of the protocol's methods routed by a declared name, by that name.
pub(crate) type Handlers<M> =
    FxHashMap<String, TypedFn<<M as Method>::Params, <M as Method>::Result>>;

/// A custom method: parses its own params (so the error names the method) and answers raw JSON.
pub(crate) type MethodFn = Arc<dyn Fn(Ctx, Option<&str>) -> BoxFuture<HandlerResult> + Send + Sync>;

/// An extension: who it is, which protocol versions it speaks, and what it serves.
///
/// Build one with [`Extension::new`] and the registration methods, then hand it to
/// [`run`](crate::run) (stdio) or [`Extension::serve`] (any byte streams, for tests).
///
/// # Panics
///
/// Registration methods panic on an empty name, on a name registered twice in the same list, and
/// on a custom method whose name the protocol reserves (`$/…`, any method of `docs/protocol.md`
/// §6–§7, `check.sleep`).
pub struct Extension {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) protocol_versions: Vec<u32>,
    pub(crate) capabilities: Capabilities,
    pub(crate) triggers: Handlers<WorkKindTrigger>,
    pub(crate) recurrences: Handlers<RecurrenceNext>,
    pub(crate) filters: Handlers<DependencyFilter>,
    pub(crate) emissions: Handlers<EmitCommit>,
    /// `None`: a push-only source, whose polls are answered with no events.
    pub(crate) ingress: FxHashMap<String, Option<TypedFn<IngressPollParams, IngressPollResult>>>,
    pub(crate) methods: FxHashMap<String, MethodFn>,
}

impl fmt::Debug for Extension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Extension")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("protocol_versions", &self.protocol_versions)
            .field("capabilities", &self.capabilities)
            .finish_non_exhaustive()
    }
}

fn erase<P, R, F, Fut>(handler: F) -> TypedFn<P, R>
where
    F: Fn(Ctx, P) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, RpcError>> + Send + 'static,
{
    Arc::new(move |cx, p| Box::pin(handler(cx, p)))
}

/// Insert `name` into a capability list and its handler map, refusing repeats.
fn declare<T>(
    list: &mut Vec<String>,
    map: &mut FxHashMap<String, T>,
    what: &str,
    name: String,
    value: T,
) {
    assert!(!name.is_empty(), "{what} names must not be empty");
    assert!(
        !map.contains_key(&name),
        "{what} `{name}` is registered twice"
    );
    list.push(name.clone());
    map.insert(name, value);
}

/// Method names a custom method may not take: the protocol's reserved names
/// (`conduit_protocol::methods::is_reserved`, the list the host's manifest check uses), and
/// `check.sleep`, which this SDK serves itself.
fn is_reserved(name: &str) -> bool {
    methods::is_reserved(name) || name == methods::host::CHECK_SLEEP
}

impl Extension {
    /// An extension named `name` (as in its manifest) at `version` (usually
    /// `env!("CARGO_PKG_VERSION")`), speaking every protocol version this SDK speaks and serving
    /// only `check.sleep` until handlers are registered.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Extension {
            name: name.into(),
            version: version.into(),
            protocol_versions: conduit_protocol::PROTOCOL_VERSIONS.to_vec(),
            capabilities: Capabilities::default(),
            triggers: Default::default(),
            recurrences: Default::default(),
            filters: Default::default(),
            emissions: Default::default(),
            ingress: Default::default(),
            methods: Default::default(),
        }
    }

    /// Speak exactly these protocol versions instead of the SDK's own.
    ///
    /// For tests and diagnostics only: a package that claims a version the SDK does not
    /// implement will be spoken to in that version's terms and answer in this one's. Its use is
    /// to make an extension deliberately incompatible, to see the host refuse it with
    /// `version_mismatch`.
    pub fn protocol_versions(mut self, versions: &[u32]) -> Self {
        self.protocol_versions = versions.to_vec();
        self
    }

    /// Serve `work_kind.trigger` for the work kind `name`, declared with `trigger: true`.
    ///
    /// The handler groups the batch into Work by key; every input must land in exactly one
    /// group (`docs/protocol.md` §6.1). It runs inside the host's transaction with a 250 ms
    /// deadline: compute from the params, and make no write callbacks.
    pub fn work_kind<F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Ctx, TriggerParams) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<TriggerResult, RpcError>> + Send + 'static,
    {
        let name = name.into();
        self.declare_kind(&name, true);
        self.triggers.insert(name, erase(handler));
        self
    }

    /// Declare the work kind `name` without a trigger: the host routes its inputs by itself.
    pub fn declare_work_kind(mut self, name: impl Into<String>) -> Self {
        self.declare_kind(&name.into(), false);
        self
    }

    fn declare_kind(&mut self, name: &str, trigger: bool) {
        assert!(!name.is_empty(), "work kind names must not be empty");
        assert!(
            !self.capabilities.work_kinds.iter().any(|k| k.name == name),
            "work kind `{name}` is registered twice"
        );
        self.capabilities
            .work_kinds
            .push(WorkKind::new(name.to_owned(), trigger));
    }

    /// Serve `recurrence.next` for the recurrence `name` (in-transaction, 250 ms).
    pub fn recurrence<F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Ctx, RecurrenceParams) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<RecurrenceResult, RpcError>> + Send + 'static,
    {
        declare(
            &mut self.capabilities.recurrences,
            &mut self.recurrences,
            "recurrence",
            name.into(),
            erase(handler),
        );
        self
    }

    /// Serve `dependency.filter` for the dependency filter `name` (in-transaction, 250 ms).
    pub fn dependency_filter<F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Ctx, FilterParams) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<FilterResult, RpcError>> + Send + 'static,
    {
        declare(
            &mut self.capabilities.dependency_filters,
            &mut self.filters,
            "dependency filter",
            name.into(),
            erase(handler),
        );
        self
    }

    /// Serve `emit.commit` for the emission `name` (in-transaction, 250 ms). A repeated
    /// `commit_id` must give the same records.
    pub fn emission<F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Ctx, CommitParams) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<CommitResult, RpcError>> + Send + 'static,
    {
        declare(
            &mut self.capabilities.emissions,
            &mut self.emissions,
            "emission",
            name.into(),
            erase(handler),
        );
        self
    }

    /// Serve `ingress.poll` for the ingress source `name`; pushes from it are accepted too.
    pub fn ingress<F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Ctx, IngressPollParams) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<IngressPollResult, RpcError>> + Send + 'static,
    {
        declare(
            &mut self.capabilities.ingress,
            &mut self.ingress,
            "ingress source",
            name.into(),
            Some(erase(handler)),
        );
        self
    }

    /// Declare the ingress source `name` for [`Host::push`](crate::Host::push) only; polls of
    /// it are answered with no events.
    pub fn push_only_ingress(mut self, name: impl Into<String>) -> Self {
        declare(
            &mut self.capabilities.ingress,
            &mut self.ingress,
            "ingress source",
            name.into(),
            None,
        );
        self
    }

    /// Serve the custom request method `name`, with params read as `P` (a mismatch is
    /// `invalid_params` naming the method; absent params read as `{}`) and a result written
    /// from `R`. Declared in `capabilities.methods`.
    pub fn method<P, R, F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(Ctx, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, RpcError>> + Send + 'static,
    {
        let name = name.into();
        assert!(
            !is_reserved(&name),
            "`{name}` is a protocol method and cannot be registered as a custom method"
        );
        let method = name.clone();
        let route: MethodFn = Arc::new(move |cx, params| {
            match crate::params::parse_params::<P>(&method, params, false) {
                Ok(p) => {
                    let fut = handler(cx, p);
                    Box::pin(async move { to_raw(&fut.await?) })
                }
                Err(e) => Box::pin(std::future::ready(Err(e))),
            }
        });
        declare(
            &mut self.capabilities.methods,
            &mut self.methods,
            "method",
            name,
            route,
        );
        self
    }

    /// What the handshake will declare: everything registered, plus `check.sleep`.
    pub fn capabilities(&self) -> Capabilities {
        let mut caps = self.capabilities.clone();
        caps.methods.push(methods::host::CHECK_SLEEP.to_owned());
        caps
    }

    /// The name given to [`Extension::new`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version given to [`Extension::new`].
    pub fn version(&self) -> &str {
        &self.version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo(
        _cx: Ctx,
        p: serde_json::Value,
    ) -> std::future::Ready<Result<serde_json::Value, RpcError>> {
        std::future::ready(Ok(p))
    }

    #[test]
    fn capabilities_follow_registration_order_and_end_with_check_sleep() {
        let ext = Extension::new("x", "1")
            .method("b", echo)
            .method("a", echo)
            .push_only_ingress("inbox")
            .declare_work_kind("plain");
        let caps = ext.capabilities();
        assert_eq!(caps.methods, ["b", "a", "check.sleep"]);
        assert_eq!(caps.ingress, ["inbox"]);
        assert_eq!(caps.work_kinds, [WorkKind::new("plain", false)]);
    }

    #[test]
    #[should_panic(expected = "`shutdown` is a protocol method")]
    fn a_custom_method_cannot_take_a_protocol_name() {
        let _ = Extension::new("x", "1").method("shutdown", echo);
    }

    #[test]
    #[should_panic(expected = "`$/progress` is a protocol method")]
    fn a_custom_method_cannot_look_like_a_notification() {
        let _ = Extension::new("x", "1").method("$/progress", echo);
    }

    #[test]
    #[should_panic(expected = "method `a` is registered twice")]
    fn a_name_cannot_be_registered_twice() {
        let _ = Extension::new("x", "1").method("a", echo).method("a", echo);
    }

    #[test]
    #[should_panic(expected = "work kind `k` is registered twice")]
    fn a_work_kind_cannot_be_declared_twice() {
        let _ = Extension::new("x", "1")
            .declare_work_kind("k")
            .work_kind("k", |_cx, _p| async { Ok(TriggerResult::default()) });
    }
}
