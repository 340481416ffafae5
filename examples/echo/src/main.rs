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
    use conduit_extension::protocol::handshake::Capabilities;
    use conduit_extension_testing::ScriptedHost;
    use serde_json::{Value, json};

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

    /// With the kit (`conduit-extension-testing`): the extension behind a scripted host, its
    /// handshake held to the manifest.
    #[tokio::test]
    async fn echo_answers_its_params_and_wants_text() {
        let host = ScriptedHost::builder()
            .manifest(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/conduit-extension.toml"
            ))
            .start(extension())
            .await
            .unwrap();
        let params = json!({ "text": "hello", "n": 1 });
        let v: Value = host.call("echo", &params).await.unwrap();
        assert_eq!(v, params);
        let e = host.call::<_, Value>("echo", &json!({})).await.unwrap_err();
        assert!(e.is(ErrorCode::InvalidParams), "{e}");
        host.finish().await.unwrap();
    }
}
