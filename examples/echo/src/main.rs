//! The minimal conduit extension: `echo` answers `{"text": …}` with its own params.
//!
//! Run with `cargo run -p conduit-example-echo`, then type (or pipe) protocol lines on stdin; see
//! `examples/README.md`. Together with `examples/python-echo` it shows that the protocol, not
//! the SDK, is the contract: both answer the same session the same way.
//!
//! Invariant: what [`extension`] declares is what `conduit-extension.toml` declares (a test
//! compares them).

use conduit_extension::prelude::*;
use serde::{Deserialize, Serialize};

/// `echo` params and result: `text` is required; any other member is sent back as it came.
#[derive(Debug, Serialize, Deserialize)]
struct Echo {
    text: String,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

fn extension() -> Extension {
    Extension::new("echo", env!("CARGO_PKG_VERSION"))
        .method("echo", |_cx: Ctx, p: Echo| async move { Ok(p) })
}

fn main() {
    std::process::exit(conduit_extension::run(extension()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use conduit_extension::protocol::handshake::{Capabilities, InitializeResult};
    use conduit_extension::protocol::methods;
    use conduit_rpc::{CallError, NoRequests, Session, SessionConfig};
    use serde_json::{Value, json};
    use std::time::Duration;

    const T: Option<Duration> = Some(Duration::from_secs(10));

    #[derive(Deserialize)]
    struct Manifest {
        name: String,
        version: String,
        protocol: u32,
        command: Vec<String>,
        capabilities: Capabilities,
    }

    #[test]
    fn the_manifest_declares_what_the_extension_serves() {
        let m: Manifest =
            toml::from_str(include_str!("../conduit-extension.toml")).expect("manifest parses");
        let ext = extension();
        assert_eq!(m.name, ext.name());
        assert_eq!(m.version, ext.version());
        assert_eq!(m.protocol, conduit_extension::protocol::PROTOCOL_VERSION);
        assert_eq!(m.command, ["./conduit-echo"]);
        assert_eq!(m.capabilities, ext.capabilities());
    }

    #[tokio::test]
    async fn echo_answers_its_params_and_wants_text() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        let served = tokio::spawn(extension().serve(br, bw));
        let host = Session::new(ar, aw, NoRequests, SessionConfig::named("echo"));
        let peer = host.peer();
        let init: InitializeResult = peer
            .call(
                methods::host::INITIALIZE,
                &InitializeParams::current("test"),
                T,
            )
            .await
            .unwrap();
        assert_eq!(init.capabilities.methods, ["echo", "check.sleep"]);

        let params = json!({ "text": "hello", "n": 1 });
        let v: Value = peer.call("echo", &params, T).await.unwrap();
        assert_eq!(v, params);
        match peer.call::<_, Value>("echo", &json!({}), T).await {
            Err(CallError::Rpc { error, .. }) => {
                assert!(error.is(ErrorCode::InvalidParams), "{error}")
            }
            other => panic!("expected invalid_params, got {other:?}"),
        }

        let _: Value = peer
            .call(methods::host::SHUTDOWN, &json!({}), T)
            .await
            .unwrap();
        assert_eq!(served.await.unwrap().code(), 0);
    }
}
