// conduit-extension: write conduit extensions in Node.js (ESM, no dependencies, Node >= 18).
//
// An extension is a child process the conduit daemon talks to over stdin/stdout with JSON-RPC
// 2.0, one message per line (docs/protocol.md). With this package it is a set of async
// handlers; the SDK does the protocol:
//
//   import { Extension } from "conduit-extension";
//   const ext = new Extension("node-echo", "0.1.0");
//   ext.method("echo", async (ctx, params) => params);
//   ext.run();
//
// - framing (§2): bounded line assembly (16 MiB), an oversized line discarded and, when its
//   first 4,096 bytes hold a top-level id and "method", answered message_too_large;
// - ids are exact (§1.1, §3.3): the id is read from the raw line, never through a JavaScript
//   number, so an id beyond 2^53 is answered with exactly its digits; -0, 1.0, 1e2 and integers
//   outside signed 64 bits are invalid; repeated top-level members, method with result/error,
//   batches, NaN, a BOM and non-UTF-8 bytes get the answers of §3.2/§3.3;
// - the refusal order of §3.4, the 64-request limit (overloaded with data.limit), the
//   handshake (§4), dispatch of the in-transaction calls by the name in their params,
//   check.sleep, $/cancel (ctx.signal), shutdown and stdin EOF (§5);
// - callbacks to the host (ctx.host) and artifact streams with the window of §8, or as frames
//   on the host's bulk pipe when it offers one (§8.1);
// - deadlines: params._meta.remaining_ms is removed from the params and read into
//   ctx.deadline / ctx.remaining();
// - stdout is protected: process.stdout.write (and so console.log) is pointed at stderr; the
//   protocol keeps the original writer. Logs go to stderr.
//
// A handler that throws RpcError answers that error; anything else it throws answers
// internal_error (-32603), which conduit treats as not retryable.

import { createHash } from "node:crypto";
import { closeSync, constants as fsConstants, fstatSync, openSync } from "node:fs";
import { Socket } from "node:net";
import { performance } from "node:perf_hooks";

export const PROTOCOL_VERSIONS = [1];
export const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;
export const MAX_CONCURRENT_REQUESTS = 64;
export const MAX_ARTIFACT_CHUNK_BYTES = 256 * 1024;
export const DEFAULT_ARTIFACT_CHUNK_BYTES = 64 * 1024;
/** Bytes of content this SDK puts in one frame on the bulk pipe (docs/protocol.md §8.1). */
export const BULK_FRAME_BYTES = 256 * 1024;
const BULK_HEADER_BYTES = 8;
const ID_SCAN_BYTES = 4096;
const DEFAULT_SHUTDOWN_GRACE_MS = 5000;
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

/** The error codes of docs/protocol.md §12. */
export const ErrorCode = Object.freeze({
  PARSE_ERROR: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL_ERROR: -32603,
  OVERLOADED: -32000,
  CANCELLED: -32001,
  DEADLINE_EXCEEDED: -32002,
  VERSION_MISMATCH: -32003,
  MESSAGE_TOO_LARGE: -32004,
  EXTENSION_EXITED: -32005,
  REENTRANT_WRITE: -32006,
  NOT_INITIALIZED: -32007,
  SHUTTING_DOWN: -32008,
  ARTIFACT_INVALID: -32009,
  NOT_FOUND: -32010,
  STORAGE_FULL: -32011,
});

/**
 * Whether a request refused with `code` may succeed if sent again unchanged (§12). overloaded
 * (-32000) counts only as conduit sends it, with data.limit or data.held_bytes_limit: a bare
 * -32000 is many libraries' answer to any handler failure and is read as not retryable.
 */
export function isRetryable(code, data) {
  if (code === ErrorCode.OVERLOADED) {
    return data !== null && typeof data === "object" && ("limit" in data || "held_bytes_limit" in data);
  }
  return [-32002, -32005, -32008, -32011].includes(code);
}

/** An error answer: throw it from a handler, or catch it from a ctx.host call. */
export class RpcError extends Error {
  constructor(code, message, data) {
    super(message);
    this.name = "RpcError";
    this.code = code;
    if (data !== undefined) this.data = data;
  }
  get retryable() {
    return isRetryable(this.code, this.data);
  }
  toJSON() {
    const e = { code: this.code, message: this.message };
    if (this.data !== undefined) e.data = this.data;
    return e;
  }
  static invalidParams(message, data) {
    return new RpcError(ErrorCode.INVALID_PARAMS, message, data);
  }
  static internal(message, data) {
    return new RpcError(ErrorCode.INTERNAL_ERROR, message, data);
  }
  static notFound(message) {
    return new RpcError(ErrorCode.NOT_FOUND, message);
  }
}

// ---- reading ids exactly -----------------------------------------------------------------------

const WS = new Set([0x20, 0x09, 0x0a, 0x0d]);
const SCALAR_END = new Set([0x2c, 0x7d, 0x5d, 0x20, 0x09, 0x0a, 0x0d]);

function scanString(s, i) {
  for (i += 1; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x5c) i++;
    else if (c === 0x22) return i + 1;
  }
  return -1;
}

function skipValue(s, i) {
  const c = s.charCodeAt(i);
  if (c === 0x22) return scanString(s, i);
  if (c === 0x7b || c === 0x5b) {
    let depth = 0;
    while (i < s.length) {
      const d = s.charCodeAt(i);
      if (d === 0x22) {
        i = scanString(s, i);
        if (i < 0) return -1;
        continue;
      }
      if (d === 0x7b || d === 0x5b) depth++;
      else if (d === 0x7d || d === 0x5d) {
        depth--;
        if (depth === 0) return i + 1;
      }
      i++;
    }
    return -1;
  }
  let j = i;
  while (j < s.length && !SCALAR_END.has(s.charCodeAt(j))) j++;
  return j >= s.length ? -1 : j;
}

/**
 * The top-level members of a JSON object's text, in order, as {key, raw} (raw: the value's
 * text), without parsing the values. Stops where the text ends or stops being well-formed
 * (`complete` is false then); used on whole lines and on the head of an oversized one.
 */
export function scanMembers(s) {
  const members = [];
  const ws = (k) => {
    while (k < s.length && WS.has(s.charCodeAt(k))) k++;
    return k;
  };
  let i = ws(0);
  if (s.charCodeAt(i) !== 0x7b) return { members, complete: false };
  i = ws(i + 1);
  if (s.charCodeAt(i) === 0x7d) return { members, complete: true };
  for (;;) {
    if (s.charCodeAt(i) !== 0x22) break;
    const j = scanString(s, i);
    if (j < 0) break;
    let key;
    try {
      key = JSON.parse(s.slice(i, j));
    } catch {
      break;
    }
    i = ws(j);
    if (s.charCodeAt(i) !== 0x3a) break;
    const keyOnly = { key, raw: undefined };
    i = ws(i + 1);
    if (i >= s.length) {
      members.push(keyOnly);
      break;
    }
    const end = skipValue(s, i);
    if (end < 0) {
      members.push(keyOnly);
      break;
    }
    members.push({ key, raw: s.slice(i, end) });
    i = ws(end);
    if (s.charCodeAt(i) === 0x2c) {
      i = ws(i + 1);
      continue;
    }
    if (s.charCodeAt(i) === 0x7d) return { members, complete: true };
    break;
  }
  return { members, complete: false };
}

/**
 * A valid id (§3.3) from its raw JSON text: {key, text, value} or null. `key` compares ids by
 * type and value; `text` is the id as written back; `value` is a string, a number (safe
 * integers) or a BigInt (beyond 2^53).
 */
export function readId(raw) {
  if (raw === undefined) return null;
  if (raw.charCodeAt(0) === 0x22) {
    let v;
    try {
      v = JSON.parse(raw);
    } catch {
      return null;
    }
    return { key: "s:" + v, text: JSON.stringify(v), value: v };
  }
  if (!/^-?(0|[1-9][0-9]*)$/.test(raw) || raw === "-0") return null;
  const n = BigInt(raw);
  if (n < INT64_MIN || n > INT64_MAX) return null;
  const text = n.toString();
  const value = Number.isSafeInteger(Number(n)) ? Number(n) : n;
  return { key: "n:" + text, text, value };
}

// ignoreBOM keeps a byte-order mark in the text, so that it is refused (§3.3) rather than stripped.
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

// ---- the context --------------------------------------------------------------------------------

const IN_TX = {
  "work_kind.trigger": ["kind", "work_kinds"],
  "recurrence.next": ["recurrence", "recurrences"],
  "dependency.filter": ["filter", "dependency_filters"],
  "emit.commit": ["emission", "emissions"],
  "ingress.poll": ["source", "ingress"],
};
const CALLBACKS = new Set([
  "state.event", "state.events", "state.work", "operation.emit", "ingress.push",
  "artifact.open", "artifact.chunk", "artifact.close", "artifact.abort",
]);
const TOP = new Set(["jsonrpc", "id", "method", "params", "result", "error"]);

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

function abortableSleep(ms, signal) {
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

// ---- the bulk pipe ------------------------------------------------------------------------------

/**
 * The extension's end of the host's bulk pipe (docs/protocol.md §8.1), shared by every artifact
 * stream of the process.
 *
 * It is written through a net.Socket on the descriptor: libuv makes the descriptor non-blocking,
 * writes each queued buffer whole and in order (partial writes and EAGAIN are its business) and
 * waits on the event loop while the pipe is full, which is the flow control. fs.writeSync would
 * stop the event loop, and so every other request, while the host is behind; fs.write on a
 * blocking descriptor would hold a thread of the pool that fs and crypto share.
 *
 * A frame's header and content are queued in one synchronous step, so no other stream's frame
 * can come between them: the socket's queue is the lock. A frame resolves once its bytes are in
 * the pipe, so a caller's buffer is never read after its write resolved.
 */
class BulkPipe {
  /**
   * The pipe the host offered in `initialize` (`{"fd": 3}`), or null without a usable one:
   * artifacts then go as chunks. The offered descriptor is replaced by one that programs the
   * extension runs do not inherit: Node has no dup, so the pipe is opened again through /dev/fd
   * (Node opens every file close-on-exec) and the offered descriptor is closed.
   */
  static take(offer) {
    const fd = offer !== null && typeof offer === "object" ? offer.fd : undefined;
    if (!Number.isInteger(fd) || fd < 3) return null;
    let copy;
    try {
      if (!fstatSync(fd).isFIFO()) throw new Error("it is not a pipe");
      // O_NONBLOCK: without it, opening a pipe to write waits for a reader; with it, a pipe
      // nobody reads fails here (ENXIO). The socket makes the descriptor non-blocking anyway.
      copy = openSync(`/dev/fd/${fd}`, fsConstants.O_WRONLY | fsConstants.O_NONBLOCK);
      closeSync(fd);
      return new BulkPipe(copy);
    } catch (e) {
      if (copy !== undefined) closeSync(copy);
      console.error(`conduit-extension: cannot use the host's bulk pipe (descriptor ${fd}): ${e.message}; artifacts go as JSON chunks`);
      return null;
    }
  }
  constructor(fd) {
    this._sock = new Socket({ fd, readable: false, writable: true, allowHalfOpen: true });
    this._sock.unref(); // the session's stdin keeps the process alive, not this pipe
    this._failure = null;
    this._sock.on("error", (e) => {
      if (!this._failure) this._failure = e;
    });
  }
  /** Write one frame of `data` (1 to 1,048,576 bytes) for stream `tag`. */
  frame(tag, data) {
    return new Promise((resolve, reject) => {
      if (this._failure) return reject(this._failure);
      const header = Buffer.allocUnsafe(BULK_HEADER_BYTES);
      header.writeUInt32LE(tag, 0);
      header.writeUInt32LE(data.length, 4);
      this._sock.cork(); // header and content in one write
      this._sock.write(header);
      this._sock.write(data, (e) => (e ? reject(this._failure || e) : resolve()));
      this._sock.uncork();
    });
  }
}

// ---- the extension ------------------------------------------------------------------------------

/** An extension: a name, a version and its handlers. Register, then run(). */
export class Extension {
  constructor(name, version, { protocolVersions = PROTOCOL_VERSIONS } = {}) {
    this.name = name;
    this.version = version;
    this.protocolVersions = [...protocolVersions].sort((a, b) => b - a);
    this._handlers = { work_kinds: new Map(), recurrences: new Map(), dependency_filters: new Map(), emissions: new Map(), ingress: new Map() };
    this._triggers = new Map();
    this._methods = new Map();
  }
  _add(table, name, fn) {
    if (typeof name !== "string" || name === "") throw new TypeError("a name must be a non-empty string");
    if (table.has(name)) throw new Error(`\`${name}\` is registered twice`);
    table.set(name, fn);
    return this;
  }
  /** work_kind.trigger for kind `name` (declared with trigger: true). */
  workKind(name, fn) {
    this._triggers.set(name, true);
    return this._add(this._handlers.work_kinds, name, fn);
  }
  /** A work kind without a trigger: the host routes its events itself. */
  declareWorkKind(name) {
    this._triggers.set(name, false);
    return this._add(this._handlers.work_kinds, name, null);
  }
  recurrence(name, fn) {
    return this._add(this._handlers.recurrences, name, fn);
  }
  dependencyFilter(name, fn) {
    return this._add(this._handlers.dependency_filters, name, fn);
  }
  emission(name, fn) {
    return this._add(this._handlers.emissions, name, fn);
  }
  ingress(name, fn) {
    return this._add(this._handlers.ingress, name, fn);
  }
  /** A push-only ingress source: its polls are answered {"events": []}. */
  declareIngress(name) {
    return this.ingress(name, async () => ({ events: [] }));
  }
  method(name, fn) {
    if (name.startsWith("$/") || name in IN_TX || CALLBACKS.has(name) || ["initialize", "shutdown", "check.sleep"].includes(name)) {
      throw new Error(`\`${name}\` cannot be a custom method (docs/protocol.md §6.8)`);
    }
    return this._add(this._methods, name, fn);
  }
  /** The handshake's capabilities, from what is registered. */
  capabilities() {
    const caps = {};
    const kinds = [...this._handlers.work_kinds.keys()].map((k) => ({ name: k, trigger: this._triggers.get(k) }));
    if (kinds.length) caps.work_kinds = kinds;
    for (const key of ["recurrences", "dependency_filters", "emissions", "ingress"]) {
      if (this._handlers[key].size) caps[key] = [...this._handlers[key].keys()];
    }
    caps.methods = [...this._methods.keys(), "check.sleep"];
    return caps;
  }
  serves(method) {
    if (method === "shutdown" || method === "check.sleep" || this._methods.has(method)) return true;
    if (method in IN_TX) return this._handlers[IN_TX[method][1]].size > 0;
    return false;
  }
  /**
   * Serve this process's stdin/stdout until shutdown or stdin EOF, then exit 0. Points
   * process.stdout.write (console.log) at stderr first; the protocol keeps the real one.
   */
  run({ stdin = process.stdin, stdout = process.stdout, exit = (c) => process.exit(c) } = {}) {
    const raw = stdout.write.bind(stdout);
    if (stdout === process.stdout) {
      process.stdout.write = (...a) => process.stderr.write(...a);
    }
    stdout.on("error", () => exit(0)); // EPIPE: the host is gone
    const server = new Server(this, (text) => raw(text), exit);
    stdin.on("data", (chunk) => server.feed(chunk));
    stdin.on("end", () => server.onEof());
    stdin.on("error", () => server.onEof());
    return server;
  }
}

// ---- the session --------------------------------------------------------------------------------

class Server {
  constructor(ext, write, exit) {
    this.ext = ext;
    this.write = write;
    this.exit = exit;
    this.running = new Map(); // id key -> request
    this.unfinished = 0;
    this.initialized = false;
    this.initParams = {};
    /** The host's bulk pipe, when it offered one (docs/protocol.md §8.1). */
    this.bulk = null;
    this.shuttingDown = false;
    this.shutdownAbort = new AbortController();
    this.shutdownGraceMs = DEFAULT_SHUTDOWN_GRACE_MS;
    this.calls = new Map(); // our id key -> {resolve, reject, timer}
    this.nextId = 1;
    this.callSlots = MAX_CONCURRENT_REQUESTS;
    this.slotWaiters = [];
    this.finished = false;
    this.changed = [];
    // line assembly
    this.parts = [];
    this.partLen = 0;
    this.discarding = null; // {head, size}
  }

  // -- output ---------------------------------------------------------------------------------

  send(text) {
    if (this.finished) return;
    if (Buffer.byteLength(text) > MAX_MESSAGE_BYTES) throw new RpcError(ErrorCode.MESSAGE_TOO_LARGE, `the message would be over the ${MAX_MESSAGE_BYTES}-byte limit`);
    this.write(text + "\n");
  }

  sendError(idText, code, message, data) {
    const e = { code, message };
    if (data !== undefined) e.data = data;
    this.send(`{"jsonrpc":"2.0","id":${idText},"error":${JSON.stringify(e)}}`);
  }

  answer(req, result, error) {
    if (req.answered) return false;
    req.answered = true;
    try {
      let text;
      if (error) {
        text = `{"jsonrpc":"2.0","id":${req.id.text},"error":${JSON.stringify(error)}}`;
      } else {
        let body;
        try {
          body = JSON.stringify(result === undefined ? null : result);
        } catch (e) {
          return this.answer({ id: req.id, answered: false }, null, { code: ErrorCode.INTERNAL_ERROR, message: `\`${req.method}\` returned a result that is not JSON: ${e.message}` });
        }
        text = `{"jsonrpc":"2.0","id":${req.id.text},"result":${body}}`;
        if (Buffer.byteLength(text) > MAX_MESSAGE_BYTES) {
          text = `{"jsonrpc":"2.0","id":${req.id.text},"error":${JSON.stringify({ code: ErrorCode.MESSAGE_TOO_LARGE, message: `the answer would be ${Buffer.byteLength(text)} bytes, over the ${MAX_MESSAGE_BYTES}-byte limit`, data: { limit: MAX_MESSAGE_BYTES, size: Buffer.byteLength(text) } })}}`;
        }
      }
      this.send(text);
    } finally {
      if (req.ctx) {
        if (this.running.get(req.id.key) === req) this.running.delete(req.id.key);
        this.unfinished--;
        const w = this.changed;
        this.changed = [];
        for (const f of w) f();
      }
    }
    return true;
  }

  cancel(req) {
    req.ctx._abort.abort();
    this.answer(req, null, { code: ErrorCode.CANCELLED, message: "the request was cancelled" });
  }

  // -- input ----------------------------------------------------------------------------------

  feed(chunk) {
    let start = 0;
    while (start < chunk.length) {
      const nl = chunk.indexOf(0x0a, start);
      const end = nl < 0 ? chunk.length : nl;
      const piece = chunk.subarray(start, end);
      if (this.discarding) {
        this.discarding.size += piece.length;
        if (piece.length) this.discarding.cr = piece[piece.length - 1] === 0x0d;
      } else {
        this.parts.push(piece);
        this.partLen += piece.length;
        if (this.partLen > MAX_MESSAGE_BYTES + 1) {
          // Past the cap (one "\r" may still be stripped): keep the head, drop the rest.
          const all = Buffer.concat(this.parts);
          this.discarding = { head: Buffer.from(all.subarray(0, ID_SCAN_BYTES)), size: all.length, cr: all[all.length - 1] === 0x0d };
          this.parts = [];
          this.partLen = 0;
        }
      }
      if (nl < 0) break;
      start = nl + 1;
      if (this.discarding) {
        const d = this.discarding;
        this.discarding = null;
        this.onOversized(d.head, d.cr ? d.size - 1 : d.size); // the size without "\r\n"
      } else {
        const line = this.parts.length === 1 ? this.parts[0] : Buffer.concat(this.parts);
        this.parts = [];
        this.partLen = 0;
        this.onRawLine(line);
      }
    }
  }

  onRawLine(line) {
    let body = line;
    if (body.length && body[body.length - 1] === 0x0d) body = body.subarray(0, body.length - 1);
    if (body.length === 0) return;
    if (body.length > MAX_MESSAGE_BYTES) return this.onOversized(Buffer.from(body.subarray(0, ID_SCAN_BYTES)), body.length);
    this.onLine(body);
  }

  onOversized(head, size) {
    const { members } = scanMembers(head.toString("latin1"));
    const seen = new Set();
    let id = null;
    let hasMethod = false;
    for (const m of members) {
      if (m.key === "method") hasMethod = true;
      if (m.key === "id" && !seen.has("id") && m.raw !== undefined) {
        const raw = m.raw.charCodeAt(0) === 0x22 ? Buffer.from(m.raw, "latin1").toString("utf8") : m.raw;
        id = readId(raw);
      }
      seen.add(m.key);
    }
    const data = { limit: MAX_MESSAGE_BYTES, size };
    if (id && hasMethod) {
      this.sendError(id.text, ErrorCode.MESSAGE_TOO_LARGE, `the request was ${size} bytes, over the ${MAX_MESSAGE_BYTES}-byte limit, and was discarded`, data);
    } else if (id) {
      this.complete(id.key, undefined, new RpcError(ErrorCode.MESSAGE_TOO_LARGE, `the answer was ${size} bytes, over the limit`, data));
    } else {
      console.error(`conduit-extension: discarded an oversized message (${size} bytes) without a readable id`);
    }
  }

  onLine(body) {
    let text;
    try {
      text = utf8.decode(body);
    } catch {
      return this.sendError("null", ErrorCode.PARSE_ERROR, "parse error: not UTF-8");
    }
    let msg;
    try {
      msg = JSON.parse(text);
    } catch (e) {
      return this.sendError("null", ErrorCode.PARSE_ERROR, `parse error: ${e.message}`);
    }
    if (text.charCodeAt(0) === 0xfeff) return this.sendError("null", ErrorCode.PARSE_ERROR, "parse error: a byte-order mark");
    if (Array.isArray(msg)) return this.sendError("null", ErrorCode.INVALID_REQUEST, "invalid request: batches are not supported");
    if (msg === null || typeof msg !== "object") return this.sendError("null", ErrorCode.INVALID_REQUEST, "invalid request: a message must be a JSON object");
    const { members } = scanMembers(text);
    const count = new Map();
    let idRaw;
    let paramsRaw;
    for (const m of members) {
      count.set(m.key, (count.get(m.key) || 0) + 1);
      if (m.key === "id") idRaw = m.raw; // the last one, as JSON.parse keeps it
      if (m.key === "params") paramsRaw = m.raw;
    }
    const dups = [...count].filter(([k, n]) => n > 1 && TOP.has(k)).map(([k]) => k);
    const hasId = count.has("id");
    const id = hasId ? readId(idRaw) : null;
    if (!("method" in msg)) return this.onResponse(msg, id, idRaw, dups);
    let problem = null;
    if (dups.length) problem = `repeated member(s) ${dups.sort().join(", ")}`;
    else if (msg.jsonrpc !== "2.0") problem = 'jsonrpc must be "2.0"';
    else if (hasId && idRaw === "null") problem = "a request id must not be null";
    else if (hasId && !id) problem = "an id must be a string or an integer in signed 64 bits (not -0, 1.0 or 1e2)";
    else if ("result" in msg || "error" in msg) problem = "a request must not carry result or error";
    else if (typeof msg.method !== "string") problem = "method must be a string";
    if (problem) return this.sendError(id ? id.text : "null", ErrorCode.INVALID_REQUEST, `invalid request: ${problem}`);
    if (!hasId) return this.onNotification(msg.method, msg.params, paramsRaw);
    this.onRequest(id, msg.method, "params" in msg, msg.params);
  }

  onResponse(msg, id, idRaw, dups) {
    if (idRaw === "null" && "error" in msg) {
      console.error(`conduit-extension: the host reported an error about an unreadable message: ${JSON.stringify(msg.error)}`);
      return;
    }
    if (!id) return;
    let ok = !dups.length && msg.jsonrpc === "2.0" && ("result" in msg) !== ("error" in msg);
    const err = msg.error;
    if (ok && "error" in msg) ok = err !== null && typeof err === "object" && Number.isInteger(err.code) && typeof err.message === "string";
    if (!ok) return this.complete(id.key, undefined, new RpcError(ErrorCode.INVALID_REQUEST, "the host's answer was not a valid response"));
    if ("error" in msg) return this.complete(id.key, undefined, new RpcError(err.code, err.message, err.data));
    this.complete(id.key, msg.result, null);
  }

  onNotification(method, params, paramsRaw) {
    if (!this.initialized || method !== "$/cancel") return;
    if (params === null || typeof params !== "object" || Array.isArray(params)) return;
    // The id is read from the raw text too, so a cancel names an id beyond 2^53 exactly.
    const m = scanMembers(paramsRaw).members.filter((x) => x.key === "id").pop();
    const id = m ? readId(m.raw) : null;
    if (!id) return; // malformed params: ignored (§3.3)
    const req = this.running.get(id.key);
    if (!req || req.method === "shutdown") return;
    this.cancel(req);
  }

  onRequest(id, method, hasParams, params) {
    // The order of docs/protocol.md §3.4.
    if (this.running.has(id.key)) return this.sendError(id.text, ErrorCode.INVALID_REQUEST, `invalid request: id ${id.text} is already in use by a running request`);
    if (this.unfinished >= MAX_CONCURRENT_REQUESTS) {
      return this.sendError(id.text, ErrorCode.OVERLOADED, `already serving ${MAX_CONCURRENT_REQUESTS} requests; retry after one finishes`, { limit: MAX_CONCURRENT_REQUESTS });
    }
    if (!this.initialized) {
      if (method !== "initialize") return this.sendError(id.text, ErrorCode.NOT_INITIALIZED, `\`${method}\` before initialize: the handshake comes first`);
      return this.onInitialize(id, hasParams ? params : {});
    }
    if (method === "initialize") return this.sendError(id.text, ErrorCode.INVALID_REQUEST, "invalid request: initialize was already done");
    if (this.shuttingDown) return this.sendError(id.text, ErrorCode.SHUTTING_DOWN, "shutting down; no new requests");
    if (!this.ext.serves(method)) return this.sendError(id.text, ErrorCode.METHOD_NOT_FOUND, `method \`${method}\` is not served`);
    let deadline = null;
    if (method !== "shutdown") {
      if (!hasParams) params = {};
      if (params === null || typeof params !== "object" || Array.isArray(params)) return this.sendError(id.text, ErrorCode.INVALID_PARAMS, `\`${method}\`: params must be an object`);
      if ("_meta" in params) {
        const { _meta: meta, ...rest } = params;
        params = rest;
        const ms = meta && typeof meta === "object" ? meta.remaining_ms : undefined;
        if (Number.isInteger(ms)) deadline = performance.now() + Math.max(0, ms);
      }
      const problem = this.checkParams(method, params);
      if (problem) return this.sendError(id.text, ErrorCode.INVALID_PARAMS, `\`${method}\`: ${problem}`);
    }
    const req = { id, method, params, answered: false, ctx: new Ctx(this, id.value, method, deadline) };
    this.running.set(id.key, req);
    this.unfinished++;
    if (method === "shutdown") {
      this.shuttingDown = true;
      this.shutdownAbort.abort();
      this.shutdownTask = this.doShutdown(req);
      return;
    }
    this.serve(req);
  }

  checkParams(method, params) {
    if (method === "check.sleep") {
      const ms = params.ms;
      return Number.isInteger(ms) && ms >= 0 ? null : `needs {"ms": integer >= 0}, got ${JSON.stringify(ms)}`;
    }
    if (method in IN_TX) {
      const [field, key] = IN_TX[method];
      const name = params[field];
      if (typeof name !== "string") return `\`${field}\` must be a string`;
      if (!this.ext._handlers[key].has(name)) return `\`${field}\` ${JSON.stringify(name)} is not declared`;
      if (method === "work_kind.trigger") {
        if (!this.ext._triggers.get(name)) return `work kind ${JSON.stringify(name)} is not declared with trigger = true`;
        if (!Array.isArray(params.inputs)) return "`inputs` must be an array of events";
      }
    }
    return null;
  }

  onInitialize(id, params) {
    if (params === null || typeof params !== "object" || Array.isArray(params)) return this.sendError(id.text, ErrorCode.INVALID_PARAMS, "initialize: params must be an object");
    const v = params.protocol_versions;
    if (!Array.isArray(v) || !v.every((x) => Number.isInteger(x) && x >= 0 && x < 2 ** 32)) {
      return this.sendError(id.text, ErrorCode.INVALID_PARAMS, "initialize: `protocol_versions` must be an array of integers");
    }
    const h = params.host;
    if (!h || typeof h !== "object" || typeof h.name !== "string" || typeof h.version !== "string") {
      return this.sendError(id.text, ErrorCode.INVALID_PARAMS, "initialize: `host` must be {name: string, version: string}");
    }
    const common = this.ext.protocolVersions.filter((x) => v.includes(x));
    if (!common.length) {
      return this.sendError(id.text, ErrorCode.VERSION_MISMATCH, `no protocol version in common: the host speaks ${JSON.stringify(v)}, the extension ${JSON.stringify(this.ext.protocolVersions)}`, { host_versions: v, extension_versions: this.ext.protocolVersions });
    }
    const g = params.deadlines && params.deadlines.shutdown_grace_ms;
    if (Number.isInteger(g) && g > 0) this.shutdownGraceMs = g;
    Object.assign(this.initParams, params);
    this.bulk = BulkPipe.take(params.bulk);
    const result = { protocol_version: Math.max(...common), extension: { name: this.ext.name, version: this.ext.version }, capabilities: this.ext.capabilities() };
    this.send(`{"jsonrpc":"2.0","id":${id.text},"result":${JSON.stringify(result)}}`);
    this.initialized = true;
  }

  async serve(req) {
    let result;
    try {
      if (req.method === "check.sleep") {
        const t0 = performance.now();
        await abortableSleep(req.params.ms, req.ctx.signal);
        // The time actually held, in whole milliseconds rounded down.
        result = { slept_ms: Math.floor(performance.now() - t0) };
      } else {
        let fn;
        if (req.method in IN_TX) {
          const [field, key] = IN_TX[req.method];
          fn = this.ext._handlers[key].get(req.params[field]);
        } else {
          fn = this.ext._methods.get(req.method);
        }
        result = await fn(req.ctx, req.params);
      }
    } catch (e) {
      if (e instanceof RpcError) return this.answer(req, null, e.toJSON());
      console.error(`conduit-extension: the handler of \`${req.method}\` failed:`, e);
      const what = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
      return this.answer(req, null, { code: ErrorCode.INTERNAL_ERROR, message: `the handler of \`${req.method}\` failed: ${what}` });
    }
    if (!req.ctx.signal.aborted) this.answer(req, result, null);
  }

  // -- callbacks ------------------------------------------------------------------------------

  async call(method, params, timeoutMs) {
    if (!this.initialized) throw new RpcError(ErrorCode.NOT_INITIALIZED, "callbacks start after the handshake");
    const start = performance.now();
    if (timeoutMs !== undefined && timeoutMs <= 0) throw new RpcError(ErrorCode.DEADLINE_EXCEEDED, `\`${method}\`: the deadline has passed`);
    if (this.callSlots === 0) {
      await new Promise((resolve, reject) => {
        const w = { resolve, timer: null };
        if (timeoutMs !== undefined) {
          w.timer = setTimeout(() => {
            this.slotWaiters = this.slotWaiters.filter((x) => x !== w);
            reject(new RpcError(ErrorCode.DEADLINE_EXCEEDED, `\`${method}\`: no call slot in time`));
          }, timeoutMs);
        }
        this.slotWaiters.push(w);
      });
    } else {
      this.callSlots--;
    }
    const id = this.nextId++;
    const key = "n:" + id;
    try {
      return await new Promise((resolve, reject) => {
        const c = { resolve, reject, timer: null };
        this.calls.set(key, c);
        if (timeoutMs !== undefined) {
          const left = Math.max(0, timeoutMs - (performance.now() - start));
          c.timer = setTimeout(() => {
            this.calls.delete(key);
            this.send(`{"jsonrpc":"2.0","method":"$/cancel","params":{"id":${id}}}`);
            reject(new RpcError(ErrorCode.DEADLINE_EXCEEDED, `\`${method}\`: no answer within ${timeoutMs} ms`));
          }, left);
        }
        try {
          this.send(`{"jsonrpc":"2.0","id":${id},"method":${JSON.stringify(method)},"params":${JSON.stringify(params)}}`);
        } catch (e) {
          this.calls.delete(key);
          clearTimeout(c.timer);
          reject(e);
        }
      });
    } finally {
      const w = this.slotWaiters.shift();
      if (w) {
        clearTimeout(w.timer);
        w.resolve();
      } else {
        this.callSlots++;
      }
    }
  }

  complete(key, result, error) {
    const c = this.calls.get(key);
    if (!c) return;
    this.calls.delete(key);
    clearTimeout(c.timer);
    if (error) c.reject(error);
    else c.resolve(result);
  }

  // -- stopping -------------------------------------------------------------------------------

  waitChange(ms) {
    return new Promise((resolve) => {
      const t = setTimeout(resolve, ms);
      this.changed.push(() => {
        clearTimeout(t);
        resolve();
      });
    });
  }

  async doShutdown(req) {
    const started = performance.now();
    const waitMs = this.shutdownGraceMs / 2;
    for (const r of [...this.running.values()]) if (r !== req && r.method === "check.sleep") this.cancel(r);
    while (this.unfinished > 1 && performance.now() - started < waitMs) await this.waitChange(waitMs - (performance.now() - started));
    for (const r of [...this.running.values()]) if (r !== req) this.cancel(r);
    this.answer(req, {}, null);
    this.finished = true;
    this.exit(0);
  }

  async onEof() {
    if (this.shutdownTask) {
      await Promise.race([this.shutdownTask, new Promise((r) => setTimeout(r, this.shutdownGraceMs))]);
    }
    this.finished = true;
    this.exit(0);
  }
}
