//! `conduit daemon run`: the long-running process an operator starts (by hand, or under
//! systemd or launchd).
//!
//! It takes the state directory's exclusive lock, serves the management API on a Unix socket
//! in `<state>/run/`, runs every enabled package under the supervisor, and re-reads the package
//! registry whenever the CLI asks (`POST /v1/reload`, sent after install, remove, enable and
//! disable), so changes take effect without a restart. SIGTERM or SIGINT stops every extension
//! gracefully and exits 0.
//!
//! Three parts, imported one way only:
//! - [`handle`]: the [`Daemon`] handle the API, the telemetry, the service notifier and the CLI
//!   use, with the types they read ([`ExtensionView`], [`ReloadReport`]) and the I/O of a
//!   reload. It imports none of them.
//! - [`overview`]: `GET /v1/overview`, what `conduit top` and `conduit web` read: the
//!   extensions table filtered, sorted and paged by a pure [`overview::select`].
//! - [`reload`]: what a reload starts, stops and restarts, a pure function of the registry's
//!   records and what is supervised.
//! - [`trouble`]: whether an extension is in trouble and since when, and the daemon's health
//!   summed up from that, pure functions of the views (what every health report reads).
//! - [`routes`]: where an event stands with routing (in a Work, in none, or waiting and for
//!   whom), read back from the views by the host loop's own rules.
//! - `run`: the startup and shutdown wiring (signals, the store, the host loop thread, the
//!   API, the notifier); the only part that imports the API.
//!
//! Invariant: registry changes are applied by one reconciler task, one request at a time, so
//! no lock is held while extensions start or stop; the API only sends it a request and waits
//! (bounded) for its report.

pub mod handle;
pub mod overview;
pub mod reload;
pub mod routes;
mod run;
pub mod trouble;

pub use handle::{
    Daemon, ExtensionView, POLL_INTERVAL, ReloadReport, SOCKET_NAME, SettingError, socket_path,
};
pub use run::run;
