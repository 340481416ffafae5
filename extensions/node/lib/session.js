// The session: one extension process serving one host over its stdin and stdout, the way
// docs/protocol.md says: line assembly under the 16 MiB cap (§2), validation (§3), the refusal
// order (§3.4), the handshake (§4), dispatch to the registered handlers, $/cancel (§9),
// callbacks to the host and their answers (§7), shutdown and stdin EOF (§5).
//
// It does not register handlers (Extension does) or scan ids (wire.js does). Invariants: every
// request is answered exactly once; at most 64 requests are served and 64 callbacks are pending
// at once; an id is written back exactly as it was read.
import { performance } from "node:perf_hooks";
import { BulkPipe } from "./bulk.js";
import { Ctx, abortableSleep } from "./context.js";
import {
  BY_NAME,
  DEFAULT_SHUTDOWN_GRACE_MS,
  ErrorCode,
  ID_SCAN_BYTES,
  MAX_CONCURRENT_REQUESTS,
  MAX_MESSAGE_BYTES,
  RpcError,
} from "./protocol.js";
import { readId, scanMembers, utf8 } from "./wire.js";

const TOP = new Set(["jsonrpc", "id", "method", "params", "result", "error"]);

export class Server {
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
    if (method in BY_NAME) {
      const [field, key] = BY_NAME[method];
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
        if (req.method in BY_NAME) {
          const [field, key] = BY_NAME[req.method];
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
