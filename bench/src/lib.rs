//! conduit's benchmarks, as a library the bench binaries and their tests share.
//!
//! - [`gate`]: the in-transaction budget gate (`make bench-extension`, and the last step of
//!   `make check`): the four calls the host makes while holding its database transaction, timed
//!   round trip to a real extension process and judged against a latency budget.
//! - [`machine`]: what a result file says about where it was measured.
//! - [`regime`]: the machine's "awake" speed regime (SPEC §12), held by low-priority busy loops.
//!
//! Not here: starting extensions (that is `conduit-supervisor`), printing and exit codes (the
//! binaries'). The transport comparison (`roundtrip`) is a binary of its own.

pub mod gate;
pub mod machine;
pub mod regime;
