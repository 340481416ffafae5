//! `export`: every note the host holds (optionally of one thread), as a JSON-lines artifact.
//!
//! Pages through `state.events` (200 at a time, oldest first) and writes each event as one
//! line into an artifact stream; the SDK sends the bytes on the host's bulk pipe when it offers
//! one (`docs/protocol.md` §8.1), else as JSON chunks. The answer is what the host stored —
//! under the SHA-256 the host computed of what it received (§8) — with how many notes went in
//! and which way the bytes went. `verify` asks for end-to-end verification (the SDK hashes the
//! lines as it writes them and the host checks that digest); `json_chunks` sends JSON chunks
//! even where the pipe is offered.

use conduit_extension::prelude::*;
use serde::{Deserialize, Serialize};

/// `export` params.
#[derive(Debug, Default, Deserialize)]
pub struct ExportParams {
    /// Only notes whose payload's `thread` is this.
    #[serde(default)]
    pub thread: Option<String>,
    /// Hash here too and have the host check it (`Host::with_verified_artifacts`).
    #[serde(default)]
    pub verify: bool,
    /// Send JSON chunks even where the host offers the bulk pipe (`Host::with_json_chunks`).
    #[serde(default)]
    pub json_chunks: bool,
}

/// `export` result.
#[derive(Debug, Serialize, Deserialize)]
pub struct Exported {
    pub artifact_id: String,
    pub size: u64,
    /// The SHA-256 the host computed of what it stored.
    pub sha256: String,
    pub notes: u64,
    /// `"bulk-pipe"` or `"json-chunks"`.
    pub transport: String,
}

const PAGE: u32 = 200;

pub async fn export(cx: Ctx, p: ExportParams) -> Result<Exported, RpcError> {
    let mut host = cx.host().clone();
    if p.verify {
        host = host.with_verified_artifacts();
    }
    if p.json_chunks {
        host = host.with_json_chunks();
    }
    let open = ArtifactOpen::new("notes.jsonl").with_media_type("application/jsonl");
    let mut w = host.artifact(open).await?;
    let transport = if w.is_bulk() {
        "bulk-pipe"
    } else {
        "json-chunks"
    };
    let (mut after, mut notes) = (None, 0u64);
    loop {
        let page = host
            .events({
                let mut q = EventsQuery::new().with_limit(PAGE);
                q.after_id = after;
                q
            })
            .await?;
        for e in &page.events {
            let thread = e.payload.get("thread").and_then(|t| t.as_str());
            if p.thread.as_deref().is_some_and(|want| thread != Some(want)) {
                continue;
            }
            let mut line = serde_json::to_vec(e)
                .map_err(|err| RpcError::internal(format!("event {}: {err}", e.id)))?;
            line.push(b'\n');
            w.write(&line).await?;
            notes += 1;
        }
        match page.events.last() {
            Some(last) if page.events.len() == PAGE as usize => after = Some(last.id),
            _ => break,
        }
    }
    let stored = w.finish().await?;
    Ok(Exported {
        artifact_id: stored.artifact_id,
        size: stored.size,
        sha256: stored.sha256,
        notes,
        transport: transport.into(),
    })
}
