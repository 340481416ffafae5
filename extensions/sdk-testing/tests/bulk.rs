//! An artifact received whole on the bulk pipe (docs/protocol.md §8.1): a real pipe, read by
//! the kit, the frames decoded by the protocol's decoder.
//!
//! One test in this file: the Rust SDK takes the offered pipe once per process.

use conduit_extension::prelude::*;
use conduit_extension_testing::{ScriptedHost, Transport};
use serde_json::{Value, json};
use sha2::Digest as _;

#[tokio::test]
async fn a_bulk_artifact_arrives_whole_with_its_digest() {
    let want: Vec<u8> = (0..700_000u32).map(|i| (i % 253) as u8).collect();
    let data = want.clone();
    let ext = Extension::new("kit-bulk", "0.1.0").method("upload", move |cx: Ctx, _p: Value| {
        let data = data.clone();
        async move {
            let open: ArtifactOpen = serde_json::from_value(json!({"name": "big.bin"})).unwrap();
            let mut w = cx.host().artifact(open).await?;
            assert!(w.is_bulk(), "the kit granted the bulk pipe");
            w.write(&data).await?;
            Ok(w.finish().await?)
        }
    });
    let host = ScriptedHost::builder()
        .bulk_pipe()
        .start(ext)
        .await
        .unwrap();
    let stored: ArtifactStored = host.call("upload", &json!({})).await.unwrap();
    let a = &host.artifacts()[0];
    assert_eq!(a.transport, Transport::BulkPipe);
    assert_eq!(a.chunks, 0);
    assert_eq!(a.bytes.len(), want.len());
    assert!(a.bytes == want, "the bytes, in order");
    assert_eq!(a.sha256, hex::encode(sha2::Sha256::digest(&want)));
    assert_eq!(stored.sha256, a.sha256);
    assert!(host.callbacks_of("artifact.chunk").is_empty());
    host.finish().await.unwrap();
}
