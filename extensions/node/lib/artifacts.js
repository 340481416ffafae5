// Artifact streams (docs/protocol.md §8): ArtifactWriter, as JSON chunks under the host's window
// or as frames on the host's bulk pipe (§8.1).
//
// It sends through the session (callbacks, the bulk pipe) and opens no stream itself:
// Host.artifact does. Invariants: chunks go in seq order with at most `window` unanswered;
// writes are serialized; a stream that fails is aborted.
import { createHash } from "node:crypto";
import { BULK_FRAME_BYTES, MAX_ARTIFACT_CHUNK_BYTES, MAX_CONCURRENT_REQUESTS, RpcError } from "./protocol.js";

/**
 * An open artifact stream: chunks in seq order, at most `window` unanswered (§8). When the host
 * offered the bulk pipe and granted it (`bulk_tag`, §8.1), the bytes go there instead, as
 * frames of up to 256 KiB with no acks. The size is counted on the way; the SHA-256 is the
 * host's (answered at close), computed here too only when verifying end to end or when the
 * host needs it (an older host, whose open answer lacks `sha256_optional`).
 */
export class ArtifactWriter {
  constructor(host, name, opened, chunkBytes, timeoutMs, { verify = false, bulk = true } = {}) {
    const ok = opened && typeof opened.stream_id === "string" && Number.isInteger(opened.max_chunk_bytes) &&
      opened.max_chunk_bytes >= 1 && Number.isInteger(opened.window) && opened.window >= 1;
    if (!ok) throw RpcError.internal(`artifact \`${name}\`: unusable artifact.open answer ${JSON.stringify(opened)}`);
    this._host = host;
    this.name = name;
    this.streamId = opened.stream_id;
    this.maxChunkBytes = Math.min(opened.max_chunk_bytes, MAX_ARTIFACT_CHUNK_BYTES);
    this.chunkBytes = Math.max(1, Math.min(chunkBytes, this.maxChunkBytes));
    this.window = Math.min(opened.window, MAX_CONCURRENT_REQUESTS);
    this._timeoutMs = timeoutMs;
    this._buf = [];
    this._bufLen = 0;
    this._seq = 0;
    this.size = 0;
    this._sha = verify || opened.sha256_optional !== true ? createHash("sha256") : null;
    this._inFlight = new Set();
    this._failure = null;
    this._state = "open";
    this._queue = Promise.resolve(); // serializes writes, so chunks go out in seq order
    const tag = opened.bulk_tag;
    this._bulk = bulk ? host._server.bulk : null;
    this._tag = this._bulk && Number.isInteger(tag) && tag >= 0 && tag < 2 ** 32 ? tag : null;
    if (this._tag !== null) this.chunkBytes = BULK_FRAME_BYTES;
  }
  /** Whether the bytes go on the host's bulk pipe rather than as chunks. */
  get isBulk() {
    return this._tag !== null;
  }
  /** Whether the bytes are hashed here, to be sent at close (verify, or a host that needs it). */
  get isHashing() {
    return this._sha !== null;
  }
  async _room(below) {
    while (this._inFlight.size > below && !this._failure) await Promise.race(this._inFlight);
    if (this._failure) {
      this._state = "failed";
      throw this._failure;
    }
  }
  async _send(chunk) {
    if (this._tag !== null) {
      try {
        return await this._bulk.frame(this._tag, chunk);
      } catch (e) {
        throw RpcError.internal(`artifact \`${this.name}\`: cannot write to the bulk pipe: ${e.message}`);
      }
    }
    await this._room(this.window - 1);
    const seq = this._seq++;
    const p = this._host
      .call("artifact.chunk", { stream_id: this.streamId, seq, data: Buffer.from(chunk).toString("base64") }, { timeoutMs: this._timeoutMs })
      .catch((e) => {
        if (!this._failure) this._failure = e;
      })
      .finally(() => this._inFlight.delete(p));
    this._inFlight.add(p);
  }
  /**
   * Append bytes (a Buffer, Uint8Array or string); resolves once they are sent or buffered. The
   * caller's bytes are sent from where they are, and copied only to be kept for a later chunk,
   * so the caller may reuse its buffer once this resolves.
   */
  write(data) {
    const run = async () => {
      if (this._state !== "open") throw RpcError.internal(`artifact \`${this.name}\`: the stream is ${this._state}`);
      let b = typeof data === "string" ? Buffer.from(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
      if (this._sha) this._sha.update(b);
      this.size += b.length;
      try {
        if (this._bufLen && this._bufLen + b.length >= this.chunkBytes) {
          const take = this.chunkBytes - this._bufLen;
          await this._send(Buffer.concat([...this._buf, b.subarray(0, take)]));
          this._buf = [];
          this._bufLen = 0;
          b = b.subarray(take);
        }
        while (!this._bufLen && b.length >= this.chunkBytes) {
          await this._send(b.subarray(0, this.chunkBytes));
          b = b.subarray(this.chunkBytes);
        }
        if (b.length) {
          this._buf.push(Buffer.from(b));
          this._bufLen += b.length;
        }
      } catch (e) {
        this.abort();
        throw e;
      }
    };
    const p = this._queue.then(run);
    this._queue = p.catch(() => {});
    return p;
  }
  /**
   * Send what is buffered, wait for every ack, close: {artifact_id, size, sha256}, `sha256` being
   * the digest the host computed of what it stored. `sha256` (option): the content's digest if
   * already known (a file hashed earlier); it is sent and the host refuses the stream
   * (artifact_invalid, keeping nothing) unless the bytes it received have it. A writer that
   * hashed the bytes itself refuses a `sha256` that is not its own before closing.
   */
  async finish({ sha256 } = {}) {
    await this._queue;
    if (this._state !== "open") throw RpcError.internal(`artifact \`${this.name}\`: the stream is ${this._state}`);
    let stored, sent;
    try {
      if (this._bufLen) await this._send(Buffer.concat(this._buf));
      this._buf = [];
      this._bufLen = 0;
      await this._room(0);
      const own = this._sha ? this._sha.digest("hex") : undefined;
      if (own !== undefined && sha256 !== undefined && own !== sha256.toLowerCase()) {
        throw RpcError.internal(`artifact \`${this.name}\`: the ${this.size} bytes written have sha256 ${own}, not the ${sha256} given to finish; the stream was aborted`);
      }
      sent = sha256 !== undefined ? sha256 : own;
      const close = { stream_id: this.streamId, size: this.size };
      if (sent !== undefined) close.sha256 = sent;
      this._state = "closing";
      stored = await this._host.call("artifact.close", close, { timeoutMs: this._timeoutMs });
      this._state = "done";
    } catch (e) {
      this.abort();
      throw e;
    }
    if (stored && typeof stored.sha256 !== "string" && typeof stored.artifact_id === "string" && stored.artifact_id.startsWith("sha256:")) {
      stored.sha256 = stored.artifact_id.slice("sha256:".length); // an older host's answer
    }
    if (sent !== undefined && String(stored && stored.sha256).toLowerCase() !== sent.toLowerCase()) {
      throw RpcError.internal(`artifact \`${this.name}\`: the host accepted sha256 ${sent} but answered ${JSON.stringify(stored)}`);
    }
    return stored;
  }
  /** Discard the stream (best effort; nothing waits for the answer). */
  abort() {
    if (this._state === "done" || this._state === "aborted") return;
    this._state = "aborted";
    this._host._server.call("artifact.abort", { stream_id: this.streamId }, 5000).catch(() => {});
  }
}
