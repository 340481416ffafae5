//! The `conduit-notes` binary: the `notes` extension over stdin and stdout.
//!
//! Run with `cargo run -p conduit-example-notes`; set `CONDUIT_NOTES_INBOX` to a JSON-lines file
//! to give the `notes-inbox` source something to poll, and `CONDUIT_LOG=debug` for more log on
//! stderr. Everything else is in the library (`src/lib.rs`).

fn main() {
    std::process::exit(conduit_extension::run(conduit_example_notes::extension()));
}
