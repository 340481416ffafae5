// What a handler gets: its context (Ctx: id, cancellation signal, deadline) and the host as
// seen from it (Host: the callbacks of docs/protocol.md §7 and §8).
//
// It does not read or write the stream: a callback goes through the session, which matches the
// answer. Invariant: a callback made from a request waits at most until that request's deadline
// unless given a timeout of its own.
import { performance } from "node:perf_hooks";
import { ArtifactWriter } from "./artifacts.js";
import { DEFAULT_ARTIFACT_CHUNK_BYTES } from "./protocol.js";

/** What a handler gets besides its params (see index.d.ts). */
export class Ctx {
  constructor(server, id, method, deadline) {
    this.id = id;
    this.method = method;
    /** performance.now() time past which the host stops waiting, or null. */
    this.deadline = deadline;
    this._abort = new AbortController();
    /** Aborted when the host cancels the request or a shutdown gives up on it. */
    this.signal = this._abort.signal;
    /** Aborted when the host asks the extension to stop. */
    this.shutdownSignal = server.shutdownAbort.signal;
    this.init = server.initParams;
    this.host = new Host(server, this);
  }
  /** Milliseconds until the host's deadline (never below 0), or null without one. */
  remaining() {
    return this.deadline === null ? null : Math.max(0, this.deadline - performance.now());
  }
  get cancelled() {
    return this.signal.aborted;
  }
  /** Wait `ms`, or less if cancelled; resolves true if cancelled. */
  sleep(ms) {
    return abortableSleep(ms, this.signal);
  }
  log(...args) {
    console.error(`${this.method}:`, ...args);
  }
}

export function abortableSleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(true);
    const done = (v) => {
      clearTimeout(t);
      signal.removeEventListener("abort", onAbort);
      resolve(v);
    };
    const onAbort = () => done(true);
    const t = setTimeout(() => done(false), Math.max(0, Math.min(ms, 2 ** 31 - 1)));
    signal.addEventListener("abort", onAbort);
  });
}

/** The callbacks of docs/protocol.md §7 and §8. */
export class Host {
  constructor(server, ctx) {
    this._server = server;
    this._ctx = ctx || null;
  }
  /** Any callback by name; `timeoutMs` defaults to the request's remaining time. */
  call(method, params = {}, { timeoutMs } = {}) {
    if (timeoutMs === undefined && this._ctx) timeoutMs = this._ctx.remaining() ?? undefined;
    return this._server.call(method, params, timeoutMs);
  }
  event(eventId, opts) {
    return this.call("state.event", { event_id: eventId }, opts);
  }
  events(query = {}, opts) {
    return this.call("state.events", query, opts);
  }
  work(workId, opts) {
    return this.call("state.work", { work_id: workId }, opts);
  }
  emit(emission, payload, workId, opts) {
    const p = { emission };
    if (workId !== undefined && workId !== null) p.work_id = workId;
    p.payload = payload;
    return this.call("operation.emit", p, opts);
  }
  push(source, deliveryId, kind, payload, opts) {
    return this.call("ingress.push", { source, delivery_id: deliveryId, kind, payload }, opts);
  }
  /**
   * Open an artifact stream. The host computes the SHA-256 of what it received and finish()
   * returns it. `verify: true` also hashes the bytes here and sends that digest at close; the
   * host then refuses the stream (artifact_invalid, keeping nothing) unless what it received
   * matches: end-to-end verification, for one SHA-256 pass here. `jsonChunks: true` sends base64
   * chunks even where the host offers the bulk pipe (docs/protocol.md §8.1).
   */
  async artifact(name, { mediaType, size, chunkBytes = DEFAULT_ARTIFACT_CHUNK_BYTES, timeoutMs, verify = false, jsonChunks = false } = {}) {
    const p = { name };
    if (mediaType !== undefined) p.media_type = mediaType;
    if (size !== undefined) p.size = size;
    if (this._server.bulk && !jsonChunks) p.bulk = true;
    const opened = await this.call("artifact.open", p, { timeoutMs });
    return new ArtifactWriter(this, name, opened, chunkBytes, timeoutMs, { verify, bulk: !jsonChunks });
  }
  /** Store `data` as one artifact; `sha256`: its digest if already known, for the host to check. */
  async storeArtifact(name, data, { mediaType, timeoutMs, verify, sha256, jsonChunks } = {}) {
    const size = typeof data === "string" ? Buffer.byteLength(data) : data.length;
    const w = await this.artifact(name, { mediaType, size, timeoutMs, verify, jsonChunks });
    try {
      await w.write(data);
      return await w.finish({ sha256 });
    } catch (e) {
      w.abort();
      throw e;
    }
  }
}
