//! The scripted host's artifact store: `artifact.open`, `.chunk`, `.close` and `.abort`
//! answered as conduit answers them (docs/protocol.md §8), and the host's end of the bulk pipe
//! (§8.1), so a test receives every artifact whole, as bytes, with the digest the host would
//! store it under.
//!
//! Not here: where artifacts go afterwards (a real host files them by digest); the store keeps
//! them in memory for the test to read.
//!
//! Invariant: only a successful close stores an artifact; a stream that breaks a rule of §8 is
//! answered `artifact_invalid`, dropped, and recorded as a violation the kit reports at
//! `finish`.

use std::collections::HashMap;
use std::io::Read as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use conduit_protocol::bulk::Decoder;
use conduit_protocol::handshake::Limits;
use conduit_protocol::{ErrorCode, RpcError};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::error::{KitError, rules};

/// How an artifact's bytes reached the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `artifact.chunk` requests, base64 in JSON (§8).
    Chunks,
    /// Frames on the bulk pipe (§8.1).
    BulkPipe,
}

/// An artifact the extension stored: its bytes, and the digest the host answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Artifact {
    pub name: String,
    pub media_type: Option<String>,
    pub bytes: Vec<u8>,
    /// The SHA-256 of `bytes`, lowercase hex, as the host answered it at close.
    pub sha256: String,
    pub transport: Transport,
    /// How many `artifact.chunk` requests carried it (0 on the bulk pipe).
    pub chunks: usize,
}

struct Stream {
    name: String,
    media_type: Option<String>,
    bytes: Vec<u8>,
    next_seq: u64,
    chunks: usize,
    tag: Option<u32>,
}

#[derive(Default)]
struct State {
    next_id: u32,
    open: HashMap<String, Stream>,
    stored: Vec<Artifact>,
    aborted: Vec<String>,
}

/// The bytes read from the bulk pipe so far, by tag, and whether the pipe broke.
#[derive(Default)]
struct Frames {
    by_tag: HashMap<u32, Vec<u8>>,
    broken: Option<String>,
}

pub(crate) struct Store {
    limits: Limits,
    state: Mutex<State>,
    bulk: Option<Arc<Mutex<Frames>>>,
    /// How long a bulk close waits for its bytes.
    patience: Duration,
    pub(crate) violations: Arc<Mutex<Vec<KitError>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn invalid(detail: String) -> RpcError {
    RpcError::new(ErrorCode::ArtifactInvalid, detail)
}

impl Store {
    pub(crate) fn new(
        limits: Limits,
        bulk: Option<std::io::PipeReader>,
        patience: Duration,
        violations: Arc<Mutex<Vec<KitError>>>,
    ) -> Store {
        let bulk = bulk.map(|rx| {
            let frames = Arc::new(Mutex::new(Frames::default()));
            let sink = frames.clone();
            // Reads until the extension's end closes (its session ended); detached, like the
            // pipe's reader in the host.
            std::thread::spawn(move || read_frames(rx, &sink));
            frames
        });
        Store {
            limits,
            state: Mutex::default(),
            bulk,
            patience,
            violations,
        }
    }

    pub(crate) fn stored(&self) -> Vec<Artifact> {
        lock(&self.state).stored.clone()
    }

    pub(crate) fn aborted(&self) -> Vec<String> {
        lock(&self.state).aborted.clone()
    }

    /// A stream broke §8: answered `artifact_invalid` and recorded for `finish`.
    fn broken(&self, detail: String) -> RpcError {
        lock(&self.violations).push(KitError::rule(rules::DECLARED_METHODS, detail.clone()));
        invalid(detail)
    }

    pub(crate) async fn serve(&self, method: &str, p: &Value) -> Result<Value, RpcError> {
        match method {
            "artifact.open" => Ok(self.open(p)),
            "artifact.chunk" => self.chunk(p),
            "artifact.close" => self.close(p).await,
            "artifact.abort" => {
                let id = p["stream_id"].as_str().unwrap_or_default();
                let mut st = lock(&self.state);
                match st.open.remove(id) {
                    Some(s) => {
                        st.aborted.push(s.name);
                        Ok(json!({}))
                    }
                    None => Err(invalid(format!("no open stream `{id}`"))),
                }
            }
            other => Err(RpcError::method_not_found(other)),
        }
    }

    fn open(&self, p: &Value) -> Value {
        let mut st = lock(&self.state);
        let n = st.next_id;
        st.next_id += 1;
        let id = format!("s-{n}");
        let tag = (p["bulk"] == json!(true) && self.bulk.is_some()).then_some(n);
        st.open.insert(
            id.clone(),
            Stream {
                name: p["name"].as_str().unwrap_or_default().to_owned(),
                media_type: p["media_type"].as_str().map(str::to_owned),
                bytes: Vec::new(),
                next_seq: 0,
                chunks: 0,
                tag,
            },
        );
        let mut answer = json!({
            "stream_id": id,
            "max_chunk_bytes": self.limits.max_artifact_chunk_bytes,
            "window": self.limits.artifact_window,
            "sha256_optional": true,
        });
        if let Some(tag) = tag {
            answer["bulk_tag"] = json!(tag);
        }
        answer
    }

    fn chunk(&self, p: &Value) -> Result<Value, RpcError> {
        let id = p["stream_id"].as_str().unwrap_or_default();
        let mut st = lock(&self.state);
        let Some(s) = st.open.get_mut(id) else {
            drop(st);
            return Err(self.broken(format!("artifact.chunk for `{id}`, which is not open")));
        };
        let seq = p["seq"].as_u64();
        let problem = if s.tag.is_some() {
            Some(format!(
                "artifact `{}` was granted the bulk pipe and takes no artifact.chunk (§8.1)",
                s.name
            ))
        } else if seq != Some(s.next_seq) {
            Some(format!(
                "artifact `{}`: chunk seq {:?} where {} was next (chunks go in seq order, no gap)",
                s.name, p["seq"], s.next_seq
            ))
        } else {
            None
        };
        let data = p["data"]
            .as_str()
            .map(|d| base64::engine::general_purpose::STANDARD.decode(d));
        let problem = problem.or_else(|| match &data {
            Some(Ok(b)) if b.len() > self.limits.max_artifact_chunk_bytes => Some(format!(
                "artifact `{}`: a chunk of {} bytes, over the max_chunk_bytes of {} this host answered",
                s.name,
                b.len(),
                self.limits.max_artifact_chunk_bytes
            )),
            Some(Ok(_)) => None,
            _ => Some(format!("artifact `{}`: `data` is not standard base64", s.name)),
        });
        if let Some(detail) = problem {
            st.open.remove(id);
            drop(st);
            return Err(self.broken(detail));
        }
        if let Some(Ok(bytes)) = data {
            s.bytes.extend_from_slice(&bytes);
        }
        s.next_seq += 1;
        s.chunks += 1;
        Ok(json!({ "received": s.bytes.len() }))
    }

    async fn close(&self, p: &Value) -> Result<Value, RpcError> {
        let id = p["stream_id"].as_str().unwrap_or_default().to_owned();
        let Some(mut s) = lock(&self.state).open.remove(&id) else {
            return Err(self.broken(format!("artifact.close for `{id}`, which is not open")));
        };
        let Some(size) = p["size"].as_u64().map(|n| n as usize) else {
            return Err(self.broken(format!("artifact `{}`: close without a size", s.name)));
        };
        if let (Some(tag), Some(frames)) = (s.tag, &self.bulk) {
            s.bytes = self.bulk_bytes(frames, tag, size, &s.name).await?;
        }
        let sha = hex::encode(Sha256::digest(&s.bytes));
        if s.bytes.len() != size {
            return Err(self.broken(format!(
                "artifact `{}`: close says {size} bytes, {} were received",
                s.name,
                s.bytes.len()
            )));
        }
        if let Some(claimed) = p["sha256"].as_str()
            && !claimed.eq_ignore_ascii_case(&sha)
        {
            return Err(self.broken(format!(
                "artifact `{}`: close says sha256 {claimed}, the {size} bytes received have {sha}",
                s.name
            )));
        }
        let answer = json!({ "artifact_id": format!("sha256:{sha}"), "size": size, "sha256": sha });
        lock(&self.state).stored.push(Artifact {
            name: s.name,
            media_type: s.media_type,
            bytes: s.bytes,
            sha256: sha,
            transport: if s.tag.is_some() {
                Transport::BulkPipe
            } else {
                Transport::Chunks
            },
            chunks: s.chunks,
        });
        Ok(answer)
    }

    /// The `size` bytes of stream `tag`, once the pipe has delivered them (polled: the reader
    /// is a thread).
    async fn bulk_bytes(
        &self,
        frames: &Mutex<Frames>,
        tag: u32,
        size: usize,
        name: &str,
    ) -> Result<Vec<u8>, RpcError> {
        let until = Instant::now() + self.patience;
        loop {
            {
                let mut f = lock(frames);
                let have = f.by_tag.get(&tag).map_or(0, Vec::len);
                if have >= size {
                    let mut all = f.by_tag.remove(&tag).unwrap_or_default();
                    let rest = all.split_off(size);
                    if !rest.is_empty() {
                        f.by_tag.insert(tag, rest);
                    }
                    return Ok(all);
                }
                if let Some(why) = &f.broken {
                    let detail = format!("artifact `{name}`: the bulk pipe broke: {why}");
                    drop(f);
                    return Err(self.broken(detail));
                }
                if Instant::now() >= until {
                    let detail = format!(
                        "artifact `{name}`: close says {size} bytes, {have} came on the bulk pipe within {:?}",
                        self.patience
                    );
                    drop(f);
                    return Err(self.broken(detail));
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

fn read_frames(mut rx: std::io::PipeReader, frames: &Mutex<Frames>) {
    let mut decoder = Decoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match rx.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut f = lock(frames);
        let Frames { by_tag, broken } = &mut *f;
        if let Err(e) = decoder.feed(&buf[..n], |tag, b| {
            by_tag.entry(tag).or_default().extend_from_slice(b)
        }) {
            broken.get_or_insert(e.to_string());
        }
    }
    if let Err(e) = decoder.finish() {
        lock(frames).broken.get_or_insert(e.to_string());
    }
}
