// The extension as its author writes it: Extension, its handlers registered by name, the
// capabilities the handshake declares, and run().
//
// It serves nothing itself: run() hands the process's streams to the session. Invariant: what is
// registered is exactly what the handshake declares, and a custom method never takes a name the
// protocol reserves.
import { BY_NAME, PROTOCOL_VERSIONS, RESERVED } from "./protocol.js";
import { Server } from "./session.js";

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
    if (name.startsWith("$/") || RESERVED.has(name) || name === "check.sleep") {
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
    if (method in BY_NAME) return this._handlers[BY_NAME[method][1]].size > 0;
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
