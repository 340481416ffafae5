//! Method names, one constant each, grouped by direction.
//!
//! A name is `noun.verb`; names starting with `$/` are notifications that either side may send
//! and the other may ignore if it does not know them.

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
    /// Asks an ingress source for the events it has seen since a cursor.
    pub const INGRESS_POLL: &str = "ingress.poll";
    /// The conformance method: hold the request open for a while (see `conduit ext check`).
    pub const CHECK_SLEEP: &str = "check.sleep";
    /// The four calls made while the host holds its database transaction.
    pub const IN_TRANSACTION: [&str; 4] = [
        WORK_KIND_TRIGGER,
        RECURRENCE_NEXT,
        DEPENDENCY_FILTER,
        EMIT_COMMIT,
    ];
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
    /// in-transaction call to the same extension is pending. (`artifact.open` and
    /// `artifact.chunk` only touch the stream's file, so a background upload goes on.)
    pub const WRITES: [&str; 3] = [OPERATION_EMIT, INGRESS_PUSH, ARTIFACT_CLOSE];
}

/// Notifications, in either direction.
pub mod notify {
    /// Cancel a request the sender made earlier: `{"id": <its id>}`.
    pub const CANCEL: &str = "$/cancel";
}

/// Every request method of the protocol in both directions (§6, §7), `check.sleep` aside: it is
/// optional, and a package declares it in `capabilities.methods`.
pub const PROTOCOL: [&str; 16] = [
    host::INITIALIZE,
    host::SHUTDOWN,
    host::WORK_KIND_TRIGGER,
    host::RECURRENCE_NEXT,
    host::DEPENDENCY_FILTER,
    host::EMIT_COMMIT,
    host::INGRESS_POLL,
    ext::STATE_EVENT,
    ext::STATE_EVENTS,
    ext::STATE_WORK,
    ext::OPERATION_EMIT,
    ext::INGRESS_PUSH,
    ext::ARTIFACT_OPEN,
    ext::ARTIFACT_CHUNK,
    ext::ARTIFACT_CLOSE,
    ext::ARTIFACT_ABORT,
];

/// Whether a custom method (`capabilities.methods`) may not take `name` (§6.8, §16): it starts
/// with `$/` (notifications) or is one of the protocol's own methods. `check.sleep` is allowed.
pub fn is_reserved(name: &str) -> bool {
    name.starts_with("$/") || PROTOCOL.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names_are_the_protocols_own_and_notifications() {
        for name in PROTOCOL.iter().chain(&["$/cancel", "$/anything"]) {
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
        assert!(host::IN_TRANSACTION.iter().all(|m| PROTOCOL.contains(m)));
        assert!(ext::WRITES.iter().all(|m| PROTOCOL.contains(m)));
    }
}
