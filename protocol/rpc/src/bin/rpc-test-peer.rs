//! Serves `conduit_rpc::testing::TestHandler` on stdin/stdout, for the session's tests and the
//! round-trip benchmark. Exits when stdin closes.
//!
//! Run with: `cargo run -p conduit-rpc --bin rpc-test-peer`, then type JSON-RPC lines.

use conduit_rpc::testing::TestHandler;
use conduit_rpc::{Session, SessionConfig};

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (stdin, stdout) = conduit_rpc::stdio::stdio();
        let session = Session::new(
            stdin,
            stdout,
            TestHandler::default(),
            SessionConfig::named("host"),
        );
        session.wait().await;
    });
}
