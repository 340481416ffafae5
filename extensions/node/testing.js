// conduit-extension/testing: test an extension's own logic without a daemon.
//
// A ScriptedHost serves your Extension with its own run() — the SDK's real session code, the one
// the daemon starts — in this process, over in-memory streams, and plays the host:
//
//   import { test } from "node:test";
//   import assert from "node:assert/strict";
//   import { ScriptedHost } from "conduit-extension/testing";
//   import { extension } from "./main.mjs";
//
//   test("echo", async () => {
//     const host = await ScriptedHost.start(extension());
//     assert.deepEqual(await host.call("echo", { text: "hi" }), { text: "hi" });
//     await host.finish();
//   });
//
// - the handshake with the limits, deadlines and protocol versions you choose, and the bulk pipe
//   (a real FIFO, `bulkPipe: true`, docs/protocol.md §8.1);
// - host.call(method, params) resolves to the result, or rejects with the protocol error it was
//   answered (Answered: code, message, data); the four in-transaction calls get the host's
//   deadline (in_transaction_ms, 250 by default) in `_meta.remaining_ms`, and an answer later
//   than that rejects with DeadlineExceeded after `$/cancel` was sent, as the host does, so the
//   handler sees ctx.signal abort;
// - callbacks answered from a table (`answers: {"state.event": {...}}`, an RpcError to answer an
//   error) or a function of the params (`answers: {"state.event": (p) => ...}`), every one
//   recorded (host.callbacks); operation.emit, ingress.push and artifact.close during an
//   in-transaction call are refused reentrant_write, as conduit refuses them (§7.6);
// - startCall(...).cancel() sends `$/cancel`;
// - artifacts received whole as bytes, by chunks or on the bulk pipe (host.artifacts);
// - host.finish() checks that every request was answered and every artifact stream kept the
//   rules, then sends `shutdown` and checks that the session exits 0.
//
// A broken rule rejects with RuleBroken, naming the rule as `conduit ext check` names it (RULES).
//
// Not here: the wire's edge rules (`conduit ext check` tests those against the package).
//
// Invariant: every wait is bounded (deadlines, and `patience` for what a test waits on at the
// end), and finish() leaves no stream open.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { constants as fsConstants, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { ErrorCode, RpcError } from "./index.js";

/** The rules a kit test can see broken: id (as `conduit ext check` reports it) -> section. */
export const RULES = Object.freeze({
  handshake: "§4, §4.2",
  version: "§4.3, §16",
  "capabilities-match-manifest": "§4.2, §16",
  "declared-methods-answer": "§6, §8",
  cancellation: "§9",
  shutdown: "§5",
  "stdout-only-protocol": "§2",
});

/** The calls the host makes inside its transaction, under in_transaction_ms. */
export const IN_TRANSACTION = Object.freeze(["work_kind.trigger", "recurrence.next", "dependency.filter", "emit.commit"]);
const WRITES = new Set(["operation.emit", "ingress.push", "artifact.close"]);
const LIMITS = { max_message_bytes: 16777216, max_concurrent_requests: 64, max_artifact_chunk_bytes: 262144, artifact_window: 8 };
const DEADLINES = { in_transaction_ms: 250, default_ms: 30000, shutdown_grace_ms: 5000 };
const START_TIMEOUT_MS = 10000;
const MAX_FRAME = 1024 * 1024;

/** Why a call through the scripted host did not give the result the test asked for. */
export class KitError extends Error {}

/** The extension answered an error object: `code`, `message`, `data` as sent. */
export class Answered extends KitError {
  constructor(method, error) {
    super(`\`${method}\` was answered with error ${error.code}: ${error.message}`);
    this.method = method;
    this.code = error.code;
    this.rpcMessage = error.message;
    this.data = error.data;
  }
}

/** No answer within the deadline the kit applied; `$/cancel` was sent (docs/protocol.md §11). */
export class DeadlineExceeded extends KitError {
  constructor(method, ms) {
    super(`\`${method}\`: deadline_exceeded (-32002): no answer within ${ms} ms; the kit sent \`$/cancel\` as the host does (docs/protocol.md §11)`);
    this.method = method;
    this.code = ErrorCode.DEADLINE_EXCEEDED;
  }
}

/** The extension broke a rule of the protocol; `rule` is its id in `conduit ext check`. */
export class RuleBroken extends KitError {
  constructor(rule, detail) {
    super(`rule \`${rule}\` (docs/protocol.md ${RULES[rule]}) broken: ${detail}`);
    this.rule = rule;
    this.section = RULES[rule];
    this.detail = detail;
  }
}

const isRpcError = (e) => e instanceof Error && Number.isInteger(e.code);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const sha256 = (b) => createHash("sha256").update(b).digest("hex");

/** A request sent to the extension and not yet waited for. */
export class PendingCall {
  constructor(host, id, call, timeoutMs) {
    this._host = host;
    this.id = id;
    this._call = call;
    this._timeoutMs = timeoutMs;
  }
  /** Send `$/cancel` for it (its answer, normally `cancelled`, is still awaited). */
  cancel() {
    this._call.cancelled = true;
    this._host._send({ jsonrpc: "2.0", method: "$/cancel", params: { id: this.id } });
  }
  /** The result; rejects with Answered, DeadlineExceeded or RuleBroken. */
  async wait() {
    const call = this._call;
    const limit = this._timeoutMs ?? this._host.patience;
    let timer;
    const late = new Promise((r) => (timer = setTimeout(() => r(null), limit)));
    const msg = await Promise.race([call.done, late]);
    clearTimeout(timer);
    if (msg === null) {
      if (this._timeoutMs === null) throw new RuleBroken("declared-methods-answer", `\`${call.method}\` was not answered within ${limit} ms`);
      this._host._pending.delete(this.id);
      call.givenUp = true;
      this._host._leaveTransaction(call);
      this._host._send({ jsonrpc: "2.0", method: "$/cancel", params: { id: this.id } });
      throw new DeadlineExceeded(call.method, limit);
    }
    if (msg.closed) throw new RuleBroken("declared-methods-answer", `the session ended before \`${call.method}\` was answered`);
    if ("error" in msg) throw new Answered(call.method, msg.error);
    return msg.result;
  }
}

/** The host, scripted by a test (see the module's comment). */
export class ScriptedHost {
  /**
   * Serve `ext` and make the handshake. Options: limits, deadlines, protocolVersions, bulkPipe,
   * answers (method -> result | RpcError | (params) => result), delays (method -> ms), patience
   * (ms finish() waits for what is unanswered, 5000), manifest (a conduit-extension.toml whose
   * name and version the handshake must state).
   */
  static async start(ext, options = {}) {
    const host = new ScriptedHost(ext, options);
    await host._start();
    return host;
  }

  constructor(ext, { limits, deadlines, protocolVersions = [1], bulkPipe = false, answers = {}, delays = {}, patience = 5000, manifest = null } = {}) {
    this.ext = ext;
    this.limits = { ...LIMITS, ...limits };
    this.deadlines = { ...DEADLINES, ...deadlines };
    this.protocolVersions = protocolVersions;
    this.bulkPipe = bulkPipe;
    this.answers = { ...answers };
    this.delays = { ...delays };
    this.patience = patience;
    this.manifest = manifest;
    this.handshake = null;
    /** Every callback the extension made: {method, params}, in order. */
    this.callbacks = [];
    /** Every artifact stored: {name, mediaType, data (Buffer), sha256, transport, chunks}. */
    this.artifacts = [];
    this.abortedArtifacts = [];
    this._violations = [];
    this._pending = new Map();
    this._started = [];
    this._nextId = 1;
    this._inTx = 0;
    this._streams = new Map();
    this._nextStream = 0;
    this._frames = new Map();
    this._bulkBroken = null;
    this._exit = null;
  }

  async _start() {
    this._toExt = new PassThrough();
    this._fromExt = new PassThrough();
    let exited;
    this._exited = new Promise((r) => (exited = r));
    let bulkFd;
    if (this.bulkPipe) bulkFd = this._openBulk();
    this.ext.run({ stdin: this._toExt, stdout: this._fromExt, exit: (code) => { this._exit = code; exited(code); } });
    let buf = "";
    this._fromExt.on("data", (chunk) => {
      buf += chunk.toString("utf8");
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        this._onLine(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
      }
    });
    const params = { protocol_versions: this.protocolVersions, host: { name: "conduit-extension/testing", version: "0.1.0" }, limits: this.limits, deadlines: this.deadlines };
    if (bulkFd !== undefined) params.bulk = { fd: bulkFd };
    let result;
    try {
      result = await this._request("initialize", params, false, START_TIMEOUT_MS).wait();
    } catch (e) {
      this._close();
      if (e instanceof DeadlineExceeded) throw new RuleBroken("handshake", `no answer to \`initialize\` within ${START_TIMEOUT_MS} ms`);
      throw e;
    }
    const fail = (rule, detail) => {
      this._close();
      return new RuleBroken(rule, detail);
    };
    if (!result || typeof result !== "object" || !result.extension || !result.capabilities) throw fail("handshake", `the \`initialize\` result is ${JSON.stringify(result)}`);
    if (!this.protocolVersions.includes(result.protocol_version)) throw fail("version", `the extension answered protocol version ${result.protocol_version}, the host offered ${JSON.stringify(this.protocolVersions)}`);
    if (JSON.stringify(result.capabilities) !== JSON.stringify(this.ext.capabilities())) throw fail("handshake", `the handshake declares ${JSON.stringify(result.capabilities)}, the extension registered ${JSON.stringify(this.ext.capabilities())}`);
    if (this.manifest !== null) {
      const facts = manifestFacts(this.manifest);
      const said = { name: result.extension.name, version: result.extension.version };
      if (facts.name !== said.name || facts.version !== said.version) {
        throw fail("handshake", `the manifest ${this.manifest} says ${JSON.stringify(facts)}, the handshake ${JSON.stringify(said)}: read the version from one place, or change both`);
      }
    }
    this.handshake = result;
    return result;
  }

  /** Call `method`; `timeoutMs`: the host's deadline for the method by default, null for none. */
  call(method, params = {}, { timeoutMs } = {}) {
    return this.startCall(method, params, { timeoutMs }).wait();
  }

  /** Send `method` now; cancel it, or wait for it later. */
  startCall(method, params = {}, { timeoutMs } = {}) {
    const inTx = IN_TRANSACTION.includes(method);
    if (timeoutMs === undefined) timeoutMs = inTx ? this.deadlines.in_transaction_ms : this.deadlines.default_ms;
    if (timeoutMs !== null && params !== null && typeof params === "object" && !Array.isArray(params)) {
      params = { _meta: { remaining_ms: Math.floor(timeoutMs) }, ...params };
    }
    return this._request(method, params, inTx, timeoutMs);
  }

  /** The params of every `method` callback so far, in order. */
  callbacksOf(method) {
    return this.callbacks.filter((c) => c.method === method).map((c) => c.params);
  }

  /**
   * Check that every request was answered and no rule was broken, then `shutdown`: answered {}
   * and the session exits 0. Rejects with RuleBroken for the first problem (naming the others).
   */
  async finish() {
    const until = Date.now() + this.patience;
    while (this._started.some((c) => !c.answered && !c.givenUp) && Date.now() < until) await sleep(5);
    const problems = [];
    for (const c of this._started) {
      if (c.answered || c.givenUp) continue;
      const rule = c.cancelled ? "cancellation" : "declared-methods-answer";
      problems.push([rule, `the request \`${c.method}\` was ${c.cancelled ? "cancelled with `$/cancel` and " : ""}never answered within ${this.patience} ms; every request is answered exactly once (docs/protocol.md §3)`]);
    }
    problems.push(...this._violations);
    const grace = this.deadlines.shutdown_grace_ms;
    try {
      const a = await this._request("shutdown", {}, false, grace).wait();
      if (JSON.stringify(a) !== "{}") problems.push(["shutdown", `\`shutdown\` was answered ${JSON.stringify(a)}, not {}`]);
    } catch (e) {
      problems.push(["shutdown", `\`shutdown\` failed: ${e.message}`]);
    }
    let timer;
    const code = await Promise.race([this._exited, new Promise((r) => (timer = setTimeout(() => r(null), grace)))]);
    clearTimeout(timer);
    if (code !== 0) problems.push(["shutdown", `after \`shutdown\` the session ended with ${code === null ? "no exit" : `exit(${code})`}, not exit(0)`]);
    this._close();
    if (problems.length) {
      const [rule, detail] = problems[0];
      const more = problems.length > 1 ? `; and ${problems.length - 1} more: ${problems.slice(1).map(([r, d]) => `${r}: ${d}`).join("; ")}` : "";
      throw new RuleBroken(rule, detail + more);
    }
  }

  // -- the wire -----------------------------------------------------------------------------------

  _send(msg) {
    if (!this._toExt.writableEnded) this._toExt.write(JSON.stringify(msg) + "\n");
  }

  _request(method, params, inTx, timeoutMs) {
    const id = this._nextId++;
    let resolve;
    const call = { method, inTx, answered: false, cancelled: false, givenUp: false, done: new Promise((r) => (resolve = r)) };
    call.resolve = resolve;
    this._pending.set(id, call);
    if (inTx) this._inTx++;
    if (method !== "initialize" && method !== "shutdown") this._started.push(call);
    this._send({ jsonrpc: "2.0", id, method, params });
    return new PendingCall(this, id, call, timeoutMs);
  }

  _leaveTransaction(call) {
    if (call.inTx) {
      call.inTx = false;
      this._inTx--;
    }
  }

  _onLine(line) {
    let msg;
    try {
      msg = JSON.parse(line);
      if (msg === null || typeof msg !== "object" || Array.isArray(msg) || msg.jsonrpc !== "2.0") throw new Error("not a JSON-RPC 2.0 message");
    } catch (e) {
      this._violations.push(["stdout-only-protocol", `the extension wrote ${JSON.stringify(line.slice(0, 200))} (${e.message})`]);
      return;
    }
    if ("method" in msg) {
      if ("id" in msg) this._serveCallback(msg);
      return; // a notification ($/cancel of a callback): its answer is still sent
    }
    const call = this._pending.get(msg.id);
    if (!call) return; // the answer to a request the kit gave up on (§11: ignored)
    this._pending.delete(msg.id);
    this._leaveTransaction(call);
    call.answered = true;
    call.resolve(msg);
  }

  // -- callbacks ----------------------------------------------------------------------------------

  async _serveCallback(msg) {
    const { method, params } = msg;
    this.callbacks.push({ method, params });
    let reply;
    try {
      reply = { jsonrpc: "2.0", id: msg.id, result: await this._answer(method, params) };
    } catch (e) {
      // An RpcError of any copy of the SDK (a test may import a vendored one) answers as itself.
      const err = isRpcError(e) ? { code: e.code, message: e.message } : { code: ErrorCode.INTERNAL_ERROR, message: `the scripted answer threw: ${e.message}` };
      if (isRpcError(e) && e.data !== undefined) err.data = e.data;
      reply = { jsonrpc: "2.0", id: msg.id, error: err };
    }
    this._send(reply);
  }

  async _answer(method, params) {
    if (WRITES.has(method) && this._inTx > 0) {
      throw new RpcError(ErrorCode.REENTRANT_WRITE, `\`${method}\` refused: the host is inside a transaction waiting for this extension (docs/protocol.md §7.6)`);
    }
    if (this.delays[method]) await sleep(this.delays[method]);
    if (Object.hasOwn(this.answers, method)) {
      const a = this.answers[method];
      if (isRpcError(a)) throw a;
      return typeof a === "function" ? await a(params) : a;
    }
    if (method.startsWith("artifact.")) return this._artifact(method, params && typeof params === "object" ? params : {});
    throw new RpcError(ErrorCode.METHOD_NOT_FOUND, `the scripted host has no answer for \`${method}\`: give it one with ScriptedHost.start(ext, { answers: { "${method}": ... } })`);
  }

  // -- artifacts (docs/protocol.md §8) ------------------------------------------------------------

  _broken(detail) {
    this._violations.push(["declared-methods-answer", detail]);
    return new RpcError(ErrorCode.ARTIFACT_INVALID, detail);
  }

  async _artifact(method, p) {
    if (method === "artifact.open") {
      const n = this._nextStream++;
      const id = `s-${n}`;
      const tag = p.bulk === true && this._bulkSock ? n : null;
      this._streams.set(id, { name: p.name, mediaType: p.media_type, parts: [], size: 0, seq: 0, tag });
      const opened = { stream_id: id, max_chunk_bytes: this.limits.max_artifact_chunk_bytes, window: this.limits.artifact_window, sha256_optional: true };
      if (tag !== null) opened.bulk_tag = tag;
      return opened;
    }
    const s = this._streams.get(p.stream_id);
    if (!s) throw this._broken(`${method} for \`${p.stream_id}\`, which is not open`);
    if (method === "artifact.abort") {
      this._streams.delete(p.stream_id);
      this.abortedArtifacts.push(s.name);
      return {};
    }
    if (method === "artifact.chunk") {
      const data = typeof p.data === "string" && /^[A-Za-z0-9+/]*={0,2}$/.test(p.data) && p.data.length % 4 === 0 ? Buffer.from(p.data, "base64") : null;
      let problem = null;
      if (s.tag !== null) problem = `artifact \`${s.name}\` was granted the bulk pipe and takes no artifact.chunk (§8.1)`;
      else if (p.seq !== s.seq) problem = `artifact \`${s.name}\`: chunk seq ${JSON.stringify(p.seq)} where ${s.seq} was next`;
      else if (data === null) problem = `artifact \`${s.name}\`: \`data\` is not standard base64`;
      else if (data.length > this.limits.max_artifact_chunk_bytes) problem = `artifact \`${s.name}\`: a chunk of ${data.length} bytes, over the max_chunk_bytes of ${this.limits.max_artifact_chunk_bytes}`;
      if (problem) {
        this._streams.delete(p.stream_id);
        throw this._broken(problem);
      }
      s.parts.push(data);
      s.size += data.length;
      s.seq++;
      return { received: s.size };
    }
    // artifact.close
    this._streams.delete(p.stream_id);
    const data = s.tag === null ? Buffer.concat(s.parts) : await this._bulkBytes(s.tag, p.size, s.name);
    if (data.length !== p.size) throw this._broken(`artifact \`${s.name}\`: close says ${JSON.stringify(p.size)} bytes, ${data.length} were received`);
    const digest = sha256(data);
    if (p.sha256 !== undefined && String(p.sha256).toLowerCase() !== digest) throw this._broken(`artifact \`${s.name}\`: close says sha256 ${p.sha256}, the bytes have ${digest}`);
    this.artifacts.push({ name: s.name, mediaType: s.mediaType, data, sha256: digest, transport: s.tag === null ? "chunks" : "bulk-pipe", chunks: s.seq });
    return { artifact_id: `sha256:${digest}`, size: p.size, sha256: digest };
  }

  /** A FIFO in a scratch folder: the kit reads one end, the extension is offered the other. */
  _openBulk() {
    this._bulkDir = mkdtempSync(join(tmpdir(), "conduit-kit-bulk-"));
    const fifo = join(this._bulkDir, "bulk");
    execFileSync("mkfifo", [fifo]);
    const rfd = openSync(fifo, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK);
    const wfd = openSync(fifo, fsConstants.O_WRONLY | fsConstants.O_NONBLOCK);
    this._bulkSock = new Socket({ fd: rfd, readable: true, writable: false });
    this._bulkSock.unref(); // a test that fails before finish() must not hang the runner on it
    let buf = Buffer.alloc(0);
    this._bulkSock.on("data", (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      while (buf.length >= 8 && !this._bulkBroken) {
        const tag = buf.readUInt32LE(0);
        const n = buf.readUInt32LE(4);
        if (n === 0 || n > MAX_FRAME) {
          this._bulkBroken = `a frame header with length ${n}`;
          return;
        }
        if (buf.length < 8 + n) break;
        if (!this._frames.has(tag)) this._frames.set(tag, []);
        this._frames.get(tag).push(buf.subarray(8, 8 + n));
        buf = buf.subarray(8 + n);
      }
    });
    this._bulkSock.on("error", (e) => (this._bulkBroken ??= e.message));
    return wfd; // the SDK takes it over (and closes this descriptor)
  }

  async _bulkBytes(tag, size, name) {
    const until = Date.now() + this.patience;
    for (;;) {
      const parts = this._frames.get(tag) || [];
      const have = parts.reduce((n, b) => n + b.length, 0);
      if (Number.isInteger(size) && have >= size) {
        const all = Buffer.concat(parts);
        this._frames.set(tag, all.length > size ? [all.subarray(size)] : []);
        return all.subarray(0, size);
      }
      if (this._bulkBroken || Date.now() >= until) {
        throw this._broken(`artifact \`${name}\`: close says ${JSON.stringify(size)} bytes, ${have} came on the bulk pipe${this._bulkBroken ? ` (it broke: ${this._bulkBroken})` : ""}`);
      }
      await sleep(2);
    }
  }

  _close() {
    this._toExt.end();
    if (this._bulkSock) {
      this._bulkSock.destroy();
      this._bulkSock = null;
      rmSync(this._bulkDir, { recursive: true, force: true });
    }
  }
}

/** The `name` and `version` a conduit-extension.toml states (its top-level keys). */
export function manifestFacts(path) {
  const facts = { name: null, version: null };
  for (let line of readFileSync(path, "utf8").split("\n")) {
    line = line.trim();
    if (line.startsWith("[")) break;
    const m = /^(name|version)\s*=\s*"([^"]*)"/.exec(line);
    if (m) facts[m[1]] = m[2];
  }
  return facts;
}
