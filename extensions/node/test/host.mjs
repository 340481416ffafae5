// A host for tests: starts an extension as a child process and plays conduit over its pipes.
import { spawn } from "node:child_process";
import { readId, scanMembers } from "../index.js";

export const INITIALIZE_PARAMS = {
  protocol_versions: [1],
  host: { name: "conduit", version: "0.1.0" },
  limits: { max_message_bytes: 16777216, max_concurrent_requests: 64, max_artifact_chunk_bytes: 262144, artifact_window: 8 },
  deadlines: { in_transaction_ms: 250, default_ms: 30000, shutdown_grace_ms: 5000 },
};

/** The id of a raw line as text (exact digits, or the JSON string), or "null". */
export function rawId(line) {
  const m = scanMembers(line).members.filter((x) => x.key === "id").pop();
  if (!m) return undefined;
  const id = readId(m.raw);
  return id ? id.text : m.raw;
}

export class FakeHost {
  /** `fd3`: a descriptor of this process the extension gets as its descriptor 3. */
  constructor(argv, cwd, { fd3 } = {}) {
    const stdio = fd3 === undefined ? ["pipe", "pipe", "pipe"] : ["pipe", "pipe", "pipe", fd3];
    this.proc = spawn(process.execPath, argv, { cwd, stdio });
    this.answers = [];
    this.calls = [];
    this.waiters = [];
    this.violations = [];
    this.stderr = "";
    this.nextId = 100;
    this.closed = false;
    let buf = "";
    this.proc.stdout.setEncoding("utf8");
    this.proc.stdout.on("data", (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        let msg;
        try {
          msg = JSON.parse(line);
          if (msg.jsonrpc !== "2.0") throw new Error("not 2.0");
        } catch {
          this.violations.push(line);
          continue;
        }
        const item = { msg, line, id: rawId(line) };
        ("method" in msg ? this.calls : this.answers).push(item);
        this.wake();
      }
    });
    this.proc.stdout.on("end", () => {
      this.closed = true;
      this.wake();
    });
    this.proc.stderr.setEncoding("utf8");
    this.proc.stderr.on("data", (d) => {
      this.stderr += d;
      this.wake();
    });
    this.exited = new Promise((r) => this.proc.on("exit", (code) => r(code)));
  }
  wake() {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }
  async until(what, pick, ms = 10000) {
    const end = Date.now() + ms;
    for (;;) {
      const v = pick();
      if (v !== undefined) return v;
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}; stderr:\n${this.stderr}`);
      await new Promise((r) => {
        this.waiters.push(r);
        setTimeout(r, 50);
      });
    }
  }
  sendRaw(text) {
    this.proc.stdin.write(text);
  }
  send(msg) {
    this.sendRaw(JSON.stringify(msg) + "\n");
  }
  request(method, params, id) {
    if (id === undefined) id = this.nextId++;
    const msg = { jsonrpc: "2.0", id, method };
    if (params !== undefined) msg.params = params;
    this.send(msg);
    return id;
  }
  notify(method, params) {
    this.send({ jsonrpc: "2.0", method, params });
  }
  /** The next answer (any id). */
  recv(ms) {
    return this.until("an answer", () => (this.answers.length ? this.answers.shift() : undefined), ms);
  }
  /** The answer whose id's text is `idText` (JSON.stringify(id) for ordinary ids). */
  waitFor(id, ms) {
    const text = typeof id === "string" && id.startsWith("#") ? id.slice(1) : JSON.stringify(id);
    return this.until(`the answer to ${text}`, () => {
      const i = this.answers.findIndex((a) => a.id === text);
      return i >= 0 ? this.answers.splice(i, 1)[0].msg : undefined;
    }, ms);
  }
  async call(method, params, ms) {
    return this.waitFor(this.request(method, params), ms);
  }
  nextCall(ms) {
    return this.until("a call from the extension", () => (this.calls.length ? this.calls.shift().msg : undefined), ms);
  }
  answer(call, result, error) {
    this.send(error ? { jsonrpc: "2.0", id: call.id, error } : { jsonrpc: "2.0", id: call.id, result });
  }
  async silence(ms) {
    await new Promise((r) => setTimeout(r, ms));
    if (this.answers.length) throw new Error(`unexpected answer ${this.answers[0].line}`);
  }
  async initialize() {
    const a = await this.call("initialize", INITIALIZE_PARAMS);
    if (!a.result) throw new Error(`initialize failed: ${JSON.stringify(a)}`);
    return a.result;
  }
  async stop() {
    try {
      this.proc.stdin.end();
    } catch {}
    const t = setTimeout(() => this.proc.kill("SIGKILL"), 5000);
    await this.exited;
    clearTimeout(t);
  }
}
