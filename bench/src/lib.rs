//! conduit's benchmarks, as a library the bench binaries and their tests share.
//!
//! - [`gate`]: the in-transaction budget gate (`make bench-extension`, and the last step of
//!   `make check`): the four calls the host makes while holding its database transaction, timed
//!   round trip to a real extension process and judged against a latency budget.
//! - [`floor`]: this machine's floors (raw pipe round trip, pipelined pipe messages, pipe
//!   throughput, bare spawn, SIGKILL to EOF), host and child side.
//! - [`daemon`]: a release `conduit daemon run` started, connected to and stopped for a
//!   benchmark (`bench-scale`, `bench-ingress`, the transport comparison's artifact through the
//!   daemon).
//! - [`ingress`]: what `bench-ingress` is made of: a keep-alive HTTP/1.1 client for the
//!   management socket, the floor server, reading the daemon's metrics, the results' shape.
//! - [`measure`]: histograms, CPU time of both processes, median and spread.
//! - [`machine`]: what a result file says about where it was measured.
//! - [`ordered`]: JSON objects that keep their keys in the order they were measured.
//! - [`regime`]: the machine's "awake" speed regime (docs/performance.md, "Machine"), held by low-priority busy loops,
//!   and pinning processes to CPUs.
//! - [`prototype`]: what the transport comparison's host and its JSON-RPC and gRPC extension
//!   children share.
//!
//! Not here: starting extensions (that is `conduit-supervisor`), printing and exit codes (the
//! binaries'). The round trip (`roundtrip`) and the transport comparison (`protocol-prototype`)
//! are binaries of their own.

pub mod daemon;
pub mod floor;
pub mod gate;
pub mod ingress;
pub mod machine;
pub mod measure;
pub mod ordered;
pub mod prototype;
pub mod regime;
