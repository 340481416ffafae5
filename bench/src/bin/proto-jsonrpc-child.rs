//! The transport comparison's JSON-RPC extension: the workload of `conduit_bench::prototype`
//! served with the real SDK (`conduit-extension`) over stdin and stdout, as an extension author
//! would write it.
//!
//! Run by `protocol-prototype`; by hand, `proto-jsonrpc-child [--protocol-version N]` speaks
//! JSON-RPC on its stdin and stdout like any conduit extension. `--protocol-version` makes it
//! speak only that version, so that the host refuses it with `version_mismatch`.
//!
//! Methods (besides the SDK's own `initialize`, `shutdown` and `check.sleep`): `echo`,
//! `callback` (timed `bench.ping` callbacks to the host), `sleep` (tells the host it started
//! with `bench.sleeping`, is cancellable, and records when it saw the cancellation),
//! `cancel_seen`, and `artifact` (a 16 MiB stream through the SDK's `ArtifactWriter`).

use std::time::{Duration, Instant};

use conduit_bench::prototype::jsonrpc::{
    ARTIFACT, ArtifactParams, CALLBACK, CANCEL_SEEN, CallbackParams, CallbackResult, CancelSeen,
    ECHO, Echo, PING, SLEEP, SLEEPING,
};
use conduit_bench::prototype::{ARTIFACT_NAME, ChildArgs, SleepProbe, artifact_bytes, salted};
use conduit_extension::prelude::*;
use conduit_extension::protocol::calls::{Empty, SleepParams, SleepResult};

fn main() {
    let args = match ChildArgs::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("proto-jsonrpc-child: {e}");
            std::process::exit(2);
        }
    };
    let mut ext = Extension::new("proto-jsonrpc", env!("CARGO_PKG_VERSION"))
        .method(ECHO, |_cx: Ctx, p: Echo| async move { Ok(p) })
        .method(CALLBACK, callback)
        .method(SLEEP, sleep)
        .method(CANCEL_SEEN, |_cx: Ctx, _p: Empty| async move {
            let (started_ns, seen_ns) = SleepProbe::take();
            Ok(CancelSeen {
                started_ns,
                seen_ns,
            })
        })
        .method(ARTIFACT, artifact);
    if let Some(v) = args.protocol_version {
        ext = ext.protocol_versions(&[v]);
    }
    std::process::exit(conduit_extension::run(ext));
}

/// `n` sequential callbacks to the host, each timed here: the round trip an extension sees.
async fn callback(cx: Ctx, p: CallbackParams) -> Result<CallbackResult, RpcError> {
    let ping = Echo { text: p.text };
    let mut nanos = Vec::with_capacity(p.n as usize);
    for _ in 0..p.n {
        let start = Instant::now();
        let back: Echo = cx.host().call(PING, &ping).await?;
        nanos.push(start.elapsed().as_nanos() as u64);
        if back != ping {
            return Err(RpcError::internal("the host's ping answered other text"));
        }
    }
    Ok(CallbackResult { nanos })
}

/// Tell the host this started, then wait `ms`, or until the host cancels; the probe records
/// which, and when.
async fn sleep(cx: Ctx, p: SleepParams) -> Result<SleepResult, RpcError> {
    let probe = SleepProbe::start();
    // Not awaited: the handler is waiting for the cancellation before the host even reads this.
    let host = cx.host().clone();
    tokio::spawn(async move {
        let _ = host.call::<_, Empty>(SLEEPING, &Empty {}).await;
    });
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(p.ms)) => {
            probe.finished();
            Ok(SleepResult::new(p.ms))
        }
        () = cx.cancel_token().cancelled() => {
            probe.saw_cancel();
            Err(RpcError::cancelled())
        }
    }
}

/// Stream `bytes` bytes to the host through the SDK's artifact writer: on the bulk pipe when the
/// host offers it (unless `json_chunks`), else as pipelined JSON chunks.
async fn artifact(cx: Ctx, p: ArtifactParams) -> Result<ArtifactStored, RpcError> {
    let data = artifact_bytes(p.bytes as usize);
    let open = ArtifactOpen::new(ARTIFACT_NAME)
        .with_media_type("application/octet-stream")
        .with_size(data.len() as u64);
    let host = if p.json_chunks {
        cx.host().with_json_chunks()
    } else {
        cx.host().clone()
    };
    let mut w = host.artifact(open).await?;
    let chunk = p.chunk_bytes.max(1);
    let (first, rest) = data.split_at(chunk.min(data.len()));
    w.write(&salted(first, p.salt)).await?;
    for piece in rest.chunks(chunk) {
        w.write(piece).await?;
    }
    Ok(w.finish().await?)
}
