//! The SDK's bulk pipe end to end, over a real pipe: frames as `docs/protocol.md` §8.1 says,
//! decoded by the protocol's own decoder, and a write cancelled part-way through a frame.
//!
//! One test per file: the SDK takes the offered descriptor once per process.
//!
//! Invariant: every wait is bounded, so a regression fails instead of hanging the suite.

use std::io::Read as _;
use std::os::fd::IntoRawFd as _;
use std::sync::Mutex;
use std::time::Duration;

use conduit_extension::prelude::*;
use conduit_extension::protocol;
use conduit_rpc::{BoxFuture, Handler, HandlerResult, Request, Session, SessionConfig, to_raw};
use protocol::bulk::Decoder;
use protocol::handshake::{BulkOffer, InitializeResult};
use protocol::methods;
use serde_json::{Value, json};
use sha2::Digest as _;

const T: Duration = Duration::from_secs(10);

/// Grants the bulk pipe to every stream that asks, and records what it was told.
#[derive(Default)]
struct Host {
    next_tag: Mutex<u32>,
    calls: Mutex<Vec<String>>,
}

impl Handler for Host {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        self.calls.lock().unwrap().push(req.method.clone());
        let answer = match req.method.as_str() {
            methods::ext::ARTIFACT_OPEN => {
                let open: ArtifactOpen = req.params().unwrap();
                assert!(open.bulk, "the SDK did not ask for the offered pipe");
                let mut next = self.next_tag.lock().unwrap();
                let tag = *next;
                *next += 1;
                to_raw(
                    &ArtifactOpened::new(
                        format!("s-{tag}"),
                        protocol::MAX_ARTIFACT_CHUNK_BYTES,
                        protocol::ARTIFACT_WINDOW,
                    )
                    .with_bulk_tag(tag)
                    .with_sha256_optional(true),
                )
            }
            methods::ext::ARTIFACT_CLOSE => {
                // Only the second, whole upload closes: its content is known, so its digest
                // is answered as the host computes it. The SDK sends none (§8).
                let c: ArtifactClose = req.params().unwrap();
                assert_eq!(c.sha256, None, "the SDK sent a digest");
                let digest = hex::encode(sha2::Sha256::digest(content(c.size as usize, 0)));
                to_raw(&ArtifactStored::new(digest, c.size))
            }
            methods::ext::ARTIFACT_ABORT => to_raw(&Empty {}),
            other => Err(RpcError::method_not_found(other)),
        };
        Box::pin(std::future::ready(answer))
    }
}

#[derive(serde::Deserialize)]
struct Upload {
    bytes: usize,
    /// Give up on the write after this long (the pipe is full and nobody reads it).
    #[serde(default)]
    give_up_ms: Option<u64>,
}

fn content(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ salt).collect()
}

fn extension() -> Extension {
    Extension::new("bulk-test", "0.1.0").method("upload", |cx: Ctx, p: Upload| async move {
        let mut w = cx.host().artifact(ArtifactOpen::new("x.bin")).await?;
        assert!(w.is_bulk());
        let data = content(p.bytes, p.give_up_ms.is_some() as u8);
        match p.give_up_ms {
            // Dropped mid-frame: the writer is dropped with it, which aborts the stream.
            Some(ms) => match tokio::time::timeout(Duration::from_millis(ms), w.write(&data)).await
            {
                Ok(_) => Err(RpcError::internal("the write into a full pipe completed")),
                Err(_) => Err(RpcError::internal("gave up")),
            },
            None => {
                w.write(&data).await?;
                Ok(w.finish().await?)
            }
        }
    })
}

#[tokio::test]
async fn frames_survive_a_write_cancelled_inside_a_frame() {
    let (mut rx, tx) = std::io::pipe().unwrap();
    let fd = tx.into_raw_fd();
    let (a, b) = tokio::io::duplex(256 * 1024);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    let served = tokio::spawn(extension().serve(br, bw));
    let host = Session::new(ar, aw, Host::default(), SessionConfig::named("bulk-host"));
    let peer = host.peer();
    let mut init = InitializeParams::current("test");
    init.bulk = Some(BulkOffer::new(fd));
    let _: InitializeResult = peer
        .call(methods::host::INITIALIZE, &init, Some(T))
        .await
        .unwrap();

    // 1 MiB into a pipe nobody reads: the first 256 KiB frame stops part-way.
    let r: Result<Value, _> = peer
        .call(
            "upload",
            &json!({"bytes": 1 << 20, "give_up_ms": 200}),
            Some(T),
        )
        .await;
    assert!(format!("{r:?}").contains("gave up"), "{r:?}");

    // Now read the pipe while a second artifact is written: it must decode whole.
    let want = content(300_000, 0);
    let reader = std::thread::spawn(move || {
        let mut d = Decoder::new();
        let mut by_tag: std::collections::BTreeMap<u32, Vec<u8>> = Default::default();
        let mut buf = vec![0u8; 65536];
        while by_tag.get(&1).map_or(0, Vec::len) < 300_000 {
            let n = rx.read(&mut buf).unwrap();
            assert!(n > 0, "the pipe ended early");
            d.feed(&buf[..n], |tag, b| {
                by_tag.entry(tag).or_default().extend_from_slice(b)
            })
            .expect("every frame is well formed");
        }
        assert!(!d.in_frame(), "the second stream's last frame is whole");
        by_tag
    });
    let stored: ArtifactStored =
        tokio::time::timeout(T, peer.call("upload", &json!({"bytes": 300_000}), Some(T)))
            .await
            .expect("the second upload finished")
            .unwrap();
    assert_eq!(stored.size, 300_000);
    assert_eq!(
        stored.sha256,
        hex::encode(sha2::Sha256::digest(&want)),
        "the host's digest, handed to the caller"
    );
    let by_tag = tokio::task::spawn_blocking(move || reader.join().unwrap())
        .await
        .unwrap();
    assert_eq!(by_tag[&1], want, "the second stream's bytes");
    // The torn stream's frame was completed with zeros after the real bytes that made it in.
    let torn = &by_tag[&0];
    let first = content(1 << 20, 1);
    let real = torn.iter().zip(&first).take_while(|(a, b)| a == b).count();
    assert!(real > 0 && real < torn.len(), "{real} of {}", torn.len());
    assert!(
        torn[real..].iter().all(|&b| b == 0),
        "the torn frame's rest is zeros"
    );
    assert_eq!(
        torn.len() % protocol::bulk::DEFAULT_BULK_FRAME_BYTES,
        0,
        "whole frames only"
    );
    drop(peer);
    host.close(Duration::from_secs(1)).await;
    tokio::time::timeout(T, served)
        .await
        .expect("serve() returned in time")
        .unwrap();
}
