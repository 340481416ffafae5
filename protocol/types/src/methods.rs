//! The method table: every request method of the protocol, in both directions, once.
//!
//! Each method is a type implementing [`Method`] — its name, params and result types, its
//! direction, whether the host makes it inside its write transaction, whether it needs the
//! host's writer, and the capability list that permits it — in the way lsp-types ties a request
//! to its types (`trait Request { type Params; type Result; const METHOD }`). The same rows make
//! [`TABLE`] (the table as data: `extensions/methods.json` is written from it, and the Python and
//! Node SDKs' tests read that file), and two enums, one per direction, whose variants carry each
//! method's params: [`HostCall`] (what the SDK serves) and [`Callback`] (what the host serves),
//! as Nushell's engine calls are one enum. Neither enum is `#[non_exhaustive]`, and every
//! dispatcher matches its variants without a catch-all, so a method added to the table fails to
//! compile wherever it is not yet handled:
//!
//! ```compile_fail,E0004
//! use conduit_protocol::methods::Callback;
//!
//! // A dispatcher that handles every callback of the table but the last one added.
//! fn handled(call: &Callback) -> bool {
//!     match call {
//!         Callback::StateEvent(_) | Callback::StateEvents(_) | Callback::StateWork(_) => true,
//!         Callback::OperationEmit(_) | Callback::IngressPush(_) => true,
//!         Callback::ArtifactOpen(_) | Callback::ArtifactChunk(_) | Callback::ArtifactClose(_) => true,
//!     }
//! }
//! ```
//!
//! A name is `noun.verb`; names starting with `$/` are notifications that either side may send
//! and the other may ignore if it does not know them. The names themselves are `pub const`s in
//! [`host`], [`ext`] and [`notify`], split by direction.
//!
//! Invariant: a method is one row of the table below (a `direction!` block per direction);
//! every list of names (`host::IN_TRANSACTION`, `ext::WRITES`, [`is_reserved`]) is computed from
//! those rows, at compile time where it is a constant.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::calls::{
    self, ArtifactOpened, ArtifactStored, ChunkAck, CommitParams, CommitResult, EmitParams,
    EmitResult, Empty, Event, EventRef, EventsPage, EventsQuery, FilterParams, FilterResult,
    IngressPollParams, IngressPollResult, PushParams, PushResult, RecurrenceParams,
    RecurrenceResult, SleepParams, SleepResult, TriggerParams, TriggerResult, Work, WorkRef,
};
use crate::error::RpcError;
use crate::handshake::{Capability, InitializeParams, InitializeResult};
use crate::rules::{parse_params, parse_params_with_payload};

/// Requests the host sends to an extension.
pub mod host {
    /// The first message of every session: versions, limits, deadlines.
    pub const INITIALIZE: &str = "initialize";
    /// Asks the extension to finish its work and exit.
    pub const SHUTDOWN: &str = "shutdown";
    /// In-transaction: route a batch of pending inputs for a work kind with a trigger.
    pub const WORK_KIND_TRIGGER: &str = "work_kind.trigger";
    /// In-transaction: a timer fired; when is the next one?
    pub const RECURRENCE_NEXT: &str = "recurrence.next";
    /// In-transaction: does this event satisfy this wait?
    pub const DEPENDENCY_FILTER: &str = "dependency.filter";
    /// In-transaction: the records to write with a planned emission.
    pub const EMIT_COMMIT: &str = "emit.commit";
    /// Asks an ingress source for the events it has seen since a cursor (not in-transaction).
    pub const INGRESS_POLL: &str = "ingress.poll";
    /// The conformance method: hold the request open for a while (see `conduit ext check`).
    pub const CHECK_SLEEP: &str = "check.sleep";
    /// The calls made while the host holds its database transaction: the rows of the table
    /// marked so (§6).
    pub const IN_TRANSACTION: [&str; 4] =
        crate::methods::names(crate::methods::Column::InTransaction);
}

/// Requests an extension sends to the host (callbacks).
pub mod ext {
    /// Read one event by id.
    pub const STATE_EVENT: &str = "state.event";
    /// Read a page of events.
    pub const STATE_EVENTS: &str = "state.events";
    /// Read one Work by id.
    pub const STATE_WORK: &str = "state.work";
    /// Plan an emission (an operation the host commits later with `emit.commit`). Writes.
    pub const OPERATION_EMIT: &str = "operation.emit";
    /// Push an event into the host. Writes.
    pub const INGRESS_PUSH: &str = "ingress.push";
    /// Open an artifact stream.
    pub const ARTIFACT_OPEN: &str = "artifact.open";
    /// One chunk of an open artifact stream.
    pub const ARTIFACT_CHUNK: &str = "artifact.chunk";
    /// Finish a stream: size and digest are checked, the artifact stored.
    pub const ARTIFACT_CLOSE: &str = "artifact.close";
    /// Give up on a stream: nothing is kept.
    pub const ARTIFACT_ABORT: &str = "artifact.abort";
    /// Callbacks that need the host's writer, refused with `reentrant_write` while an
    /// in-transaction call to the same extension is pending (§7.6): the rows of the table marked
    /// so. (`artifact.open` and `artifact.chunk` only touch the stream's file, so a background
    /// upload goes on.)
    pub const WRITES: [&str; 3] = crate::methods::names(crate::methods::Column::Writes);
}

/// Notifications, in either direction.
pub mod notify {
    /// Cancel a request the sender made earlier: `{"id": <its id>}`.
    pub const CANCEL: &str = "$/cancel";
}

/// Which way a method goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// The host calls the extension (§6).
    HostToExtension,
    /// The extension calls the host back (§7).
    ExtensionToHost,
}

/// What permits a call: always, or a name the extension declared in a capability list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Permit {
    /// Any session past the handshake (`initialize`, `shutdown`, reads, artifacts).
    Always,
    /// The name in the params member `field` must be declared in `capability` (the host calls
    /// `recurrence.next` only for a declared recurrence; a push must name a declared source).
    Named {
        capability: Capability,
        field: &'static str,
    },
    /// The method's own name must be listed in `capability` (`check.sleep` in `methods`).
    Listed(Capability),
}

impl Permit {
    /// The capability list, if one permits the call.
    pub const fn capability(self) -> Option<Capability> {
        match self {
            Permit::Always => None,
            Permit::Named { capability, .. } | Permit::Listed(capability) => Some(capability),
        }
    }

    /// The params member that names what is declared, if the call names one.
    pub const fn field(self) -> Option<&'static str> {
        match self {
            Permit::Named { field, .. } => Some(field),
            Permit::Always | Permit::Listed(_) => None,
        }
    }
}

/// One method of the protocol: a zero-sized type per method (see the module docs), which typed
/// calls are made through (the host's `Extension::call::<WorkKindTrigger>`, the SDK's
/// `Host` callbacks).
pub trait Method {
    /// The method's name on the wire.
    const NAME: &'static str;
    /// Which way it goes.
    const DIRECTION: Direction;
    /// Made while the host holds its write transaction: 250 ms, a fallback on failure (§6).
    const IN_TRANSACTION: bool;
    /// A callback that needs the host's writer, refused with `reentrant_write` during an
    /// in-transaction call to the same extension (§7.6).
    const WRITES: bool;
    /// What permits the call.
    const PERMIT: Permit;
    /// The row of [`TABLE`].
    const INFO: MethodInfo;
    /// The params.
    type Params: Serialize + DeserializeOwned + Send + 'static;
    /// The result.
    type Result: Serialize + DeserializeOwned + Send + 'static;

    /// Read a request's params (absent is `{}`), by the protocol's one reader (§3.1); a payload
    /// is measured before it is parsed (§1.3). A mismatch is `invalid_params` naming the method.
    fn parse_params(params: Option<&str>) -> Result<Self::Params, RpcError>;

    /// The declared name `params` carries in the member [`Permit::Named`] names, if any.
    fn declared_name(params: &Self::Params) -> Option<&str>;
}

/// One row of [`TABLE`], as data (what `extensions/methods.json` holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MethodInfo {
    pub name: &'static str,
    pub direction: Direction,
    /// The params type's name in `conduit_protocol` (and in docs/protocol.md).
    pub params: &'static str,
    /// The result type's name.
    pub result: &'static str,
    pub in_transaction: bool,
    pub writes: bool,
    /// The capability list that permits the call (`work_kinds`, …), if one does.
    pub capability: Option<Capability>,
    /// The params member that names what is declared in `capability`, if the call names one.
    pub name_field: Option<&'static str>,
    /// A custom method may not take the name (§6.8): every method of the table but
    /// `check.sleep`, which a package declares among its `methods`.
    pub reserved: bool,
}

/// A type's name without its path (`ArtifactOpen` for `calls::ArtifactOpen`), as the docs name it.
const fn last_segment(path: &'static str) -> &'static str {
    let bytes = path.as_bytes();
    let mut i = bytes.len();
    while i > 0 && bytes[i - 1] != b':' && bytes[i - 1] != b' ' {
        i -= 1;
    }
    match std::str::from_utf8(bytes.split_at(i).1) {
        Ok(name) => name,
        Err(_) => panic!("a type's name is UTF-8"),
    }
}

/// How a row's params are read: [`parse_params`], or [`parse_params_with_payload`] for params
/// that carry a payload.
macro_rules! reader {
    (params) => {
        parse_params
    };
    (payload_first) => {
        parse_params_with_payload
    };
    (ignored) => {
        ignore_params
    };
}

/// `shutdown`'s params: never looked at, so a stop is never refused over them (§6.6).
fn ignore_params(_method: &str, _params: Option<&str>) -> Result<Empty, RpcError> {
    Ok(Empty {})
}

/// A row's [`Permit`] and the name its params carry.
macro_rules! permit {
    (@name $p:ident always) => {
        None
    };
    (@name $p:ident listed $cap:ident) => {
        None
    };
    (@name $p:ident $cap:ident by $field:ident) => {
        Some($p.$field.as_str())
    };
    (always) => {
        Permit::Always
    };
    (listed $cap:ident) => {
        Permit::Listed(Capability::$cap)
    };
    ($cap:ident by $field:ident) => {
        Permit::Named {
            capability: Capability::$cap,
            field: stringify!($field),
        }
    };
}

/// The rows of one direction: a marker type per method with its [`Method`] impl, the
/// direction's enum (a variant per method, holding its params) and its rows of [`TABLE`].
macro_rules! direction {
    (
        $(#[$enum_doc:meta])*
        enum $enum:ident, rows $rows:ident, $dir:ident;
        $(
            $(#[$doc:meta])*
            $ty:ident = $name:path, $params:ty => $result:ty,
                in_transaction: $tx:literal, writes: $writes:literal,
                reserved: $reserved:literal, read: $read:ident,
                permit: ($($permit:tt)+);
        )+
    ) => {
        $(
            $(#[$doc])*
            #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
            pub struct $ty;

            impl Method for $ty {
                const NAME: &'static str = $name;
                const DIRECTION: Direction = Direction::$dir;
                const IN_TRANSACTION: bool = $tx;
                const WRITES: bool = $writes;
                const PERMIT: Permit = permit!($($permit)+);
                const INFO: MethodInfo = MethodInfo {
                    name: $name,
                    direction: Direction::$dir,
                    params: last_segment(stringify!($params)),
                    result: last_segment(stringify!($result)),
                    in_transaction: $tx,
                    writes: $writes,
                    capability: Self::PERMIT.capability(),
                    name_field: Self::PERMIT.field(),
                    reserved: $reserved,
                };
                type Params = $params;
                type Result = $result;

                fn parse_params(params: Option<&str>) -> Result<$params, RpcError> {
                    reader!($read)($name, params)
                }

                fn declared_name(params: &$params) -> Option<&str> {
                    let _ = params;
                    permit!(@name params $($permit)+)
                }
            }
        )+

        $(#[$enum_doc])*
        #[derive(Clone, Debug, PartialEq)]
        pub enum $enum {
            $( $(#[$doc])* $ty($params), )+
        }

        impl $enum {
            /// The request `method` with `params` (absent is `{}`), read by its row: `None`
            /// when the table has no such method in this direction, `invalid_params` when the
            /// params do not read.
            pub fn parse(method: &str, params: Option<&str>) -> Option<Result<$enum, RpcError>> {
                Some(match method {
                    $( $name => <$ty as Method>::parse_params(params).map($enum::$ty), )+
                    _ => return None,
                })
            }

            /// The call's row of [`TABLE`].
            pub fn info(&self) -> &'static MethodInfo {
                match self {
                    $( $enum::$ty(_) => &<$ty as Method>::INFO, )+
                }
            }

            /// The capability list the call's declared name must be in, and that name, when
            /// the call names one ([`Permit::Named`]).
            pub fn declared_name(&self) -> Option<(Capability, &str)> {
                match self {
                    $( $enum::$ty(p) => Some((
                        <$ty as Method>::PERMIT.capability()?,
                        <$ty as Method>::declared_name(p)?,
                    )), )+
                }
            }
        }

        const $rows: &[MethodInfo] = &[ $( <$ty as Method>::INFO, )+ ];
    };
}

direction! {
    /// A request the host sends an extension, with its params: what an extension serves (§6).
    enum HostCall, rows HOST_ROWS, HostToExtension;

    /// `initialize`: the handshake (§4).
    Initialize = host::INITIALIZE, InitializeParams => InitializeResult,
        in_transaction: false, writes: false, reserved: true, read: params,
        permit: (always);
    /// `shutdown`: finish and exit (§5, §6.6). Its params are never looked at.
    Shutdown = host::SHUTDOWN, Empty => Empty,
        in_transaction: false, writes: false, reserved: true, read: ignored,
        permit: (always);
    /// `work_kind.trigger`: route a batch of inputs into Work (§6.1).
    WorkKindTrigger = host::WORK_KIND_TRIGGER, TriggerParams => TriggerResult,
        in_transaction: true, writes: false, reserved: true, read: params,
        permit: (WorkKinds by kind);
    /// `recurrence.next`: when a timer fires next (§6.2).
    RecurrenceNext = host::RECURRENCE_NEXT, RecurrenceParams => RecurrenceResult,
        in_transaction: true, writes: false, reserved: true, read: params,
        permit: (Recurrences by recurrence);
    /// `dependency.filter`: whether an event satisfies a wait (§6.3).
    DependencyFilter = host::DEPENDENCY_FILTER, FilterParams => FilterResult,
        in_transaction: true, writes: false, reserved: true, read: params,
        permit: (DependencyFilters by filter);
    /// `emit.commit`: the records written with an emission (§6.4).
    EmitCommit = host::EMIT_COMMIT, CommitParams => CommitResult,
        in_transaction: true, writes: false, reserved: true, read: params,
        permit: (Emissions by emission);
    /// `ingress.poll`: what a source has seen since a cursor (§6.5). Off the writer.
    IngressPoll = host::INGRESS_POLL, IngressPollParams => IngressPollResult,
        in_transaction: false, writes: false, reserved: true, read: params,
        permit: (Ingress by source);
    /// `check.sleep`: the conformance method (§6.7), served when declared among `methods`.
    CheckSleep = host::CHECK_SLEEP, SleepParams => SleepResult,
        in_transaction: false, writes: false, reserved: false, read: params,
        permit: (listed Methods);
}

direction! {
    /// A callback an extension sends the host, with its params: what the host serves (§7).
    enum Callback, rows CALLBACK_ROWS, ExtensionToHost;

    /// `state.event`: one event by id (§7.1).
    StateEvent = ext::STATE_EVENT, EventRef => Event,
        in_transaction: false, writes: false, reserved: true, read: params,
        permit: (always);
    /// `state.events`: a page of events (§7.2).
    StateEvents = ext::STATE_EVENTS, EventsQuery => EventsPage,
        in_transaction: false, writes: false, reserved: true, read: params,
        permit: (always);
    /// `state.work`: one Work by id (§7.3).
    StateWork = ext::STATE_WORK, WorkRef => Work,
        in_transaction: false, writes: false, reserved: true, read: params,
        permit: (always);
    /// `operation.emit`: plan an emission (§7.4).
    OperationEmit = ext::OPERATION_EMIT, EmitParams => EmitResult,
        in_transaction: false, writes: true, reserved: true, read: payload_first,
        permit: (Emissions by emission);
    /// `ingress.push`: push an event (§7.5).
    IngressPush = ext::INGRESS_PUSH, PushParams => PushResult,
        in_transaction: false, writes: true, reserved: true, read: payload_first,
        permit: (Ingress by source);
    /// `artifact.open`: open an artifact stream (§8).
    ArtifactOpen = ext::ARTIFACT_OPEN, calls::ArtifactOpen => ArtifactOpened,
        in_transaction: false, writes: false, reserved: true, read: params,
        permit: (always);
    /// `artifact.chunk`: one chunk of a stream (§8).
    ArtifactChunk = ext::ARTIFACT_CHUNK, calls::ArtifactChunk => ChunkAck,
        in_transaction: false, writes: false, reserved: true, read: params,
        permit: (always);
    /// `artifact.close`: finish a stream and store the artifact (§8).
    ArtifactClose = ext::ARTIFACT_CLOSE, calls::ArtifactClose => ArtifactStored,
        in_transaction: false, writes: true, reserved: true, read: params,
        permit: (always);
    /// `artifact.abort`: give up on a stream (§8).
    ArtifactAbort = ext::ARTIFACT_ABORT, calls::ArtifactAbort => Empty,
        in_transaction: false, writes: false, reserved: true, read: params,
        permit: (always);
}

/// Every method of the protocol: host → extension first, then the callbacks, each in the order
/// of docs/protocol.md §6 and §7.
pub const TABLE: [MethodInfo; HOST_ROWS.len() + CALLBACK_ROWS.len()] = {
    let mut all = [HOST_ROWS[0]; HOST_ROWS.len() + CALLBACK_ROWS.len()];
    let mut i = 0;
    while i < all.len() {
        all[i] = if i < HOST_ROWS.len() {
            HOST_ROWS[i]
        } else {
            CALLBACK_ROWS[i - HOST_ROWS.len()]
        };
        i += 1;
    }
    all
};

/// A boolean column of [`TABLE`], for the lists of names computed from it.
#[derive(Clone, Copy)]
enum Column {
    InTransaction,
    Writes,
}

/// The names of the rows marked in `column`, in table order. Evaluated at compile time for the
/// constants above: a list whose length no longer matches the table fails to compile.
const fn names<const N: usize>(column: Column) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut i, mut n) = (0, 0);
    while i < TABLE.len() {
        let row = &TABLE[i];
        let marked = match column {
            Column::InTransaction => row.in_transaction,
            Column::Writes => row.writes,
        };
        if marked {
            assert!(n < N, "more rows are marked than the list holds");
            out[n] = row.name;
            n += 1;
        }
        i += 1;
    }
    assert!(n == N, "fewer rows are marked than the list holds");
    out
}

/// The row of the method `name`, if the protocol has one.
pub fn find(name: &str) -> Option<&'static MethodInfo> {
    TABLE.iter().find(|m| m.name == name)
}

/// Whether the host makes `name` inside its write transaction (§6).
pub fn in_transaction(name: &str) -> bool {
    find(name).is_some_and(|m| m.in_transaction)
}

/// Whether a custom method (`capabilities.methods`) may not take `name` (§6.8, §16): it starts
/// with `$/` (notifications) or is one of the table's reserved rows (every protocol method but
/// `check.sleep`, which a package declares among its methods).
pub fn is_reserved(name: &str) -> bool {
    name.starts_with("$/") || find(name).is_some_and(|m| m.reserved)
}

/// The table as the JSON that `extensions/methods.json` holds: one object per row, in table
/// order, pretty-printed with a final newline.
pub fn table_json() -> String {
    #[derive(Serialize)]
    struct File {
        #[serde(rename = "//")]
        note: &'static str,
        methods: &'static [MethodInfo],
    }
    let file = File {
        note: "Generated from conduit_protocol::methods::TABLE; do not edit. Refresh with UPDATE_EXPECT=1 cargo test -p conduit-protocol --test methods_json.",
        methods: &TABLE,
    };
    let mut text = serde_json::to_string_pretty(&file).expect("the table serializes");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names_are_the_protocols_own_and_notifications() {
        for m in TABLE.iter().filter(|m| m.name != host::CHECK_SLEEP) {
            assert!(is_reserved(m.name), "{}", m.name);
        }
        for name in ["$/cancel", "$/anything"] {
            assert!(is_reserved(name), "{name}");
        }
        for name in [
            host::CHECK_SLEEP,
            "echo",
            "notes.search",
            "initialize2",
            "$",
        ] {
            assert!(!is_reserved(name), "{name}");
        }
    }

    #[test]
    fn the_lists_of_names_are_the_tables_marked_rows() {
        assert_eq!(
            host::IN_TRANSACTION,
            [
                host::WORK_KIND_TRIGGER,
                host::RECURRENCE_NEXT,
                host::DEPENDENCY_FILTER,
                host::EMIT_COMMIT
            ]
        );
        assert!(!in_transaction(host::INGRESS_POLL), "§6.5: off the writer");
        assert_eq!(
            ext::WRITES,
            [ext::OPERATION_EMIT, ext::INGRESS_PUSH, ext::ARTIFACT_CLOSE]
        );
        let names: std::collections::HashSet<_> = TABLE.iter().map(|m| m.name).collect();
        assert_eq!(names.len(), TABLE.len(), "a name appears twice");
        assert!(
            TABLE
                .iter()
                .all(|m| !m.in_transaction || m.direction == Direction::HostToExtension)
        );
        assert!(
            TABLE
                .iter()
                .all(|m| !m.writes || m.direction == Direction::ExtensionToHost)
        );
    }

    #[test]
    fn each_direction_parses_its_own_methods_only() {
        for m in TABLE {
            let host = HostCall::parse(m.name, Some("{}")).is_some();
            let callback = Callback::parse(m.name, Some("{}")).is_some();
            match m.direction {
                Direction::HostToExtension => assert!(host && !callback, "{}", m.name),
                Direction::ExtensionToHost => assert!(callback && !host, "{}", m.name),
            }
        }
        assert!(HostCall::parse("echo", None).is_none());
        let call = Callback::parse(ext::STATE_EVENT, Some(r#"{"event_id":7}"#))
            .unwrap()
            .unwrap();
        assert_eq!(call, Callback::StateEvent(EventRef { event_id: 7 }));
        assert_eq!(call.info().name, ext::STATE_EVENT);
        let err = Callback::parse(ext::STATE_EVENT, Some("[7]"))
            .unwrap()
            .unwrap_err();
        assert!(err.message.contains("`state.event`"), "{err}");
    }

    /// The member a row names is the one its params carry the declared name in.
    #[test]
    fn the_declared_name_is_read_from_the_member_the_row_names() {
        let named = [
            (host::WORK_KIND_TRIGGER, r#"{"kind":"x","inputs":[]}"#),
            (
                host::RECURRENCE_NEXT,
                r#"{"recurrence":"x","timer_id":1,"spec":"s","fired_at_ms":1}"#,
            ),
            (
                host::DEPENDENCY_FILTER,
                r#"{"filter":"x","wait_id":1,"subject":"s","event":{"id":1,"source":"s","delivery_id":"d","kind":"k","payload":null}}"#,
            ),
            (
                host::EMIT_COMMIT,
                r#"{"emission":"x","commit_id":"c","payload":null}"#,
            ),
            (host::INGRESS_POLL, r#"{"source":"x","limit":1}"#),
        ];
        for (name, params) in named {
            let call = HostCall::parse(name, Some(params)).unwrap().unwrap();
            let field = call.info().name_field.unwrap();
            let json: serde_json::Value = serde_json::from_str(params).unwrap();
            let (capability, declared) = call.declared_name().unwrap();
            assert_eq!(declared, json[field], "{name}");
            assert_eq!(Some(capability), call.info().capability);
        }
        let push = Callback::parse(
            ext::INGRESS_PUSH,
            Some(r#"{"source":"x","delivery_id":"d","kind":"k","payload":{}}"#),
        )
        .unwrap()
        .unwrap();
        assert_eq!(push.declared_name(), Some((Capability::Ingress, "x")));
        let sleep = HostCall::parse(host::CHECK_SLEEP, Some(r#"{"ms":1}"#))
            .unwrap()
            .unwrap();
        assert_eq!(sleep.declared_name(), None);
        assert_eq!(sleep.info().capability, Some(Capability::Methods));
    }

    #[test]
    fn a_payload_is_measured_before_it_is_parsed() {
        let deep = crate::depth::nested(crate::MAX_PAYLOAD_DEPTH + 1, "0");
        let params = format!(r#"{{"emission":"x","payload":{deep}}}"#);
        let err = Callback::parse(ext::OPERATION_EMIT, Some(&params))
            .unwrap()
            .unwrap_err();
        assert!(err.message.contains("nested"), "{err}");
        assert!(err.data.unwrap().get().contains("\"limit\":64"));
        let at_limit = crate::depth::nested(crate::MAX_PAYLOAD_DEPTH, "0");
        let params = format!(r#"{{"emission":"x","payload":{at_limit}}}"#);
        assert!(matches!(
            Callback::parse(ext::OPERATION_EMIT, Some(&params)),
            Some(Ok(Callback::OperationEmit(_)))
        ));
    }
}
