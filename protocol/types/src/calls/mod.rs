//! Params and results of every method after the handshake, in both directions: the events
//! both directions carry (`event.rs`), the host's calls to an extension (`to_extension.rs`) and
//! the callbacks (`to_host.rs`).
//!
//! Times are Unix milliseconds (`*_ms`), sizes are bytes, binary data is standard base64 with
//! padding. Inbound types ignore unknown fields and outbound ones skip empty optionals, so
//! fields can be added without a new protocol version.
//!
//! Every type but [`Empty`] is `#[non_exhaustive]`: a field added to the protocol is a field
//! added here, and code outside this crate builds values with `new` (the required members) and
//! `with_*` (the optional ones), so that a new optional field breaks no extension's build. Fields
//! stay public for reading and changing.

mod event;
mod to_extension;
mod to_host;

pub use event::{Empty, Event, NewEvent};
pub use to_extension::{
    CommitParams, CommitResult, FilterParams, FilterResult, IngressPollParams, IngressPollResult,
    Record, RecurrenceParams, RecurrenceResult, SleepParams, SleepResult, TriggerGroup,
    TriggerParams, TriggerResult,
};
pub use to_host::{
    ArtifactAbort, ArtifactChunk, ArtifactClose, ArtifactOpen, ArtifactOpened, ArtifactStored,
    ChunkAck, EmitParams, EmitResult, EventRef, EventsPage, EventsQuery, PushParams, PushResult,
    Work, WorkRef,
};
