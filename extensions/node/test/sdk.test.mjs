// The Node SDK's tests: a sample extension (sample.mjs) run as a child process, driven by a
// host played over its pipes (host.mjs), plus unit tests of the pure functions.
// Run: node --test extensions/node/test/
import { test, describe, beforeEach, afterEach } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { closeSync, constants, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { Socket } from "node:net";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { Extension, isRetryable, readId, scanMembers, BULK_FRAME_BYTES, MAX_MESSAGE_BYTES, _methodTables } from "../index.js";
import { FakeHost, INITIALIZE_PARAMS } from "./host.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const SAMPLE = join(HERE, "sample.mjs");

// The SDK's tables against extensions/methods.json, the method table written from the Rust one
// (conduit_protocol::methods::TABLE): a method added, renamed or moved there fails here until
// this SDK follows.
describe("method table", () => {
  const rows = JSON.parse(readFileSync(join(HERE, "..", "..", "methods.json"), "utf8")).methods;
  test("host calls routed by a declared name", () => {
    const want = Object.fromEntries(rows
      .filter((r) => r.direction === "host_to_extension" && r.name_field)
      .map((r) => [r.name, [r.name_field, r.capability]]));
    assert.deepEqual({ ..._methodTables.BY_NAME }, want);
  });
  test("callbacks", () => {
    const want = new Set(rows.filter((r) => r.direction === "extension_to_host").map((r) => r.name));
    assert.deepEqual(_methodTables.CALLBACKS, want);
  });
  test("reserved names", () => {
    const want = new Set(rows.filter((r) => r.reserved).map((r) => r.name));
    assert.deepEqual(_methodTables.RESERVED, want);
    assert.equal(_methodTables.RESERVED.has("check.sleep"), false);
  });
});

describe("units", () => {
  test("ids are read exactly from their text", () => {
    assert.deepEqual(readId("9223372036854775807"), { key: "n:9223372036854775807", text: "9223372036854775807", value: 9223372036854775807n });
    assert.equal(readId("-9223372036854775808").text, "-9223372036854775808");
    assert.equal(readId("7").value, 7);
    assert.equal(readId('""').value, "");
    for (const bad of ["-0", "1.0", "1e2", "9223372036854775808", "-9223372036854775809", "true", "null", "[1]", "{}", "01"]) {
      assert.equal(readId(bad), null, bad);
    }
    assert.notEqual(readId("7").key, readId('"7"').key);
  });
  test("top-level members are scanned without parsing values", () => {
    const { members, complete } = scanMembers('{"params":{"id":1,"method":"x"},"id":2,"id":"s"}');
    assert.equal(complete, true);
    assert.deepEqual(members.map((m) => [m.key, m.raw]), [["params", '{"id":1,"method":"x"}'], ["id", "2"], ["id", '"s"']]);
    const head = scanMembers('{"jsonrpc":"2.0","id":12');
    assert.equal(head.complete, false);
    assert.deepEqual(head.members.map((m) => [m.key, m.raw]), [["jsonrpc", '"2.0"'], ["id", undefined]]);
  });
  test("a bare -32000 is not retryable", () => {
    assert.equal(isRetryable(-32000), false);
    assert.equal(isRetryable(-32000, { other: 1 }), false);
    assert.equal(isRetryable(-32000, { limit: 64 }), true);
    assert.equal(isRetryable(-32000, { held_bytes_limit: 1 }), true);
    assert.equal(isRetryable(-32603), false);
    assert.equal(isRetryable(-32011), true);
    assert.equal(isRetryable(-39999), false);
  });
  test("registration refuses reserved and repeated names", () => {
    const ext = new Extension("x", "1.0.0");
    ext.method("a", async () => 1);
    assert.throws(() => ext.method("a", async () => 1));
    for (const r of ["$/cancel", "shutdown", "state.event", "work_kind.trigger", "check.sleep", "initialize"]) {
      assert.throws(() => ext.method(r, async () => 1), r);
    }
    assert.deepEqual(ext.capabilities(), { methods: ["a", "check.sleep"] });
  });
});

describe("session", () => {
  let h;
  beforeEach(() => {
    h = new FakeHost([SAMPLE], HERE);
  });
  afterEach(async () => {
    await h.stop();
    assert.deepEqual(h.violations, [], "non-protocol output on stdout");
  });
  const err = (msg, code, id) => {
    assert.ok(msg.error, JSON.stringify(msg));
    assert.equal(msg.error.code, code, JSON.stringify(msg));
    assert.equal(typeof msg.error.message, "string");
    assert.deepEqual(msg.id, id, JSON.stringify(msg));
  };

  test("the handshake declares what is registered", async () => {
    const r = await h.initialize();
    assert.equal(r.protocol_version, 1);
    assert.deepEqual(r.extension, { name: "sample", version: "0.2.0" });
    assert.deepEqual(r.capabilities.work_kinds, [{ name: "job", trigger: true }, { name: "plain", trigger: false }]);
    assert.deepEqual(r.capabilities.ingress, ["feed"]);
    assert.equal(r.capabilities.methods.at(-1), "check.sleep");
  });

  test("version mismatch, then a retry", async () => {
    const p = { protocol_versions: [7, 2], host: { name: "h", version: "1" } };
    const a = await h.call("initialize", p);
    err(a, -32003, a.id);
    assert.deepEqual(a.error.data, { host_versions: [7, 2], extension_versions: [1] });
    err(await h.call("echo", {}), -32007, h.nextId - 1);
    await h.initialize();
    err(await h.call("initialize", p), -32600, h.nextId - 1);
  });

  test("ids beyond 2^53 round-trip exactly", async () => {
    await h.initialize();
    for (const text of ["9223372036854775807", "-9223372036854775808", "9007199254740993", "18014398509481985"]) {
      h.sendRaw(`{"jsonrpc":"2.0","id":${text},"method":"id","params":{}}\n`);
      const a = await h.waitFor("#" + text);
      assert.deepEqual(a.result, { type: "bigint", text });
    }
    // and a running big id is a running id: the second request with it is refused
    h.sendRaw('{"jsonrpc":"2.0","id":9007199254740993,"method":"check.sleep","params":{"ms":60000}}\n');
    h.sendRaw('{"jsonrpc":"2.0","id":9007199254740993,"method":"echo","params":{}}\n');
    const dup = await h.recv();
    assert.equal(dup.id, "9007199254740993");
    assert.equal(dup.msg.error.code, -32600);
    h.sendRaw('{"jsonrpc":"2.0","id":9007199254740992,"method":"echo","params":{}}\n');
    assert.equal((await h.recv()).id, "9007199254740992");
    // A cancel naming the neighbouring id (equal as a JavaScript number) cancels nothing ...
    h.sendRaw('{"jsonrpc":"2.0","method":"$/cancel","params":{"id":9007199254740992}}\n');
    await h.silence(200);
    // ... and one naming the running id exactly cancels it.
    h.sendRaw('{"jsonrpc":"2.0","method":"$/cancel","params":{"id":9007199254740993}}\n');
    const c = await h.recv();
    assert.equal(c.id, "9007199254740993");
    assert.equal(c.msg.error.code, -32001);
  });

  test("the id and shape rules of §3.3", async () => {
    await h.initialize();
    const cases = [
      ['{"jsonrpc":"2.0","id":-0,"method":"echo","params":{}}', -32600, null],
      ['{"jsonrpc":"2.0","id":1.0,"method":"echo"}', -32600, null],
      ['{"jsonrpc":"2.0","id":1e2,"method":"echo"}', -32600, null],
      ['{"jsonrpc":"2.0","id":9223372036854775808,"method":"echo"}', -32600, null],
      ['{"jsonrpc":"2.0","id":3,"id":4,"method":"echo"}', -32600, 4],
      ['{"jsonrpc":"2.0","id":5,"method":"echo","method":"echo"}', -32600, 5],
      ['{"jsonrpc":"2.0","id":6,"method":"echo","result":1}', -32600, 6],
      ['{"jsonrpc":"2.0","id":7,"method":"echo","error":{"code":1,"message":"m"}}', -32600, 7],
      ['{"jsonrpc":"2.0","id":8,"method":7}', -32600, 8],
      ['{"id":9,"method":"echo"}', -32600, 9],
      ['{"jsonrpc":"2.0","id":null,"method":"echo"}', -32600, null],
      ['{"method":"$/cancel","params":{"id":1}}', -32600, null],
      ['[{"jsonrpc":"2.0","id":1,"method":"echo"}]', -32600, null],
      ["17", -32600, null],
      ['{"jsonrpc":"2.0","id":10,"method":"echo","params":{"n":NaN}}', -32700, null],
      ['\ufeff{"jsonrpc":"2.0","id":11,"method":"echo"}', -32700, null],
      ["  \t ", -32700, null],
      ['{"jsonrpc":"2.0","id":13,"method":"$/cancel","params":{"id":1}}', -32601, 13],
      ['{"jsonrpc":"2.0","id":14,"method":"state.event","params":{}}', -32601, 14],
      ['{"jsonrpc":"2.0","id":15,"method":"echo","params":null}', -32602, 15],
      ['{"jsonrpc":"2.0","id":16,"method":"echo","params":[1]}', -32602, 16],
      ['{"jsonrpc":"2.0","id":17,"method":"nope","params":[1]}', -32601, 17],
    ];
    for (const [line, code, id] of cases) {
      h.sendRaw(line + "\n");
      err((await h.recv()).msg, code, id);
    }
    h.proc.stdin.write(Buffer.from('{"jsonrpc":"2.0","id":12,"method":"echo","params":"\xff"}\n', "latin1"));
    err((await h.recv()).msg, -32700, null);
    for (const line of ['{"jsonrpc":"2.0","id":5,"result":{}}', '{"jsonrpc":"2.0","id":5}', '{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}', '{"jsonrpc":"2.0","method":"shutdown"}', '{"jsonrpc":"2.0","method":"x/y","extra":1}', "", "\r"]) {
      h.sendRaw(line + "\n");
    }
    await h.silence(300);
    for (const id of ["", "7"]) {
      assert.deepEqual(await h.waitFor(h.request("echo", { t: 1 }, id)), { jsonrpc: "2.0", id, result: { t: 1 } });
    }
    h.sendRaw('{"jsonrpc":"2.0","id":20,"method":"echo","params":{"a":1},"extra":{"b":2}}\r\n');
    assert.deepEqual((await h.recv()).msg.result, { a: 1 });
  });

  test("in-transaction calls go to the handler of their name", async () => {
    await h.initialize();
    const ev = { id: 4, source: "feed", delivery_id: "d", kind: "job", payload: {}, accepted_at_ms: 1 };
    assert.deepEqual((await h.call("work_kind.trigger", { kind: "job", inputs: [ev] })).result, { groups: [{ key: "k:4", event_ids: [4] }] });
    err(await h.call("work_kind.trigger", { kind: "other", inputs: [ev] }), -32602, h.nextId - 1);
    err(await h.call("work_kind.trigger", { kind: "plain", inputs: [ev] }), -32602, h.nextId - 1);
    err(await h.call("recurrence.next", { recurrence: "r" }), -32601, h.nextId - 1);
    assert.deepEqual((await h.call("ingress.poll", { source: "feed", limit: 5 })).result, { events: [] });
  });

  test("a handler's exception is internal_error, never -32000", async () => {
    await h.initialize();
    let a = await h.call("boom", {});
    err(a, -32603, a.id);
    assert.match(a.error.message, /TypeError: no such thing/);
    a = await h.call("sync-boom", {});
    err(a, -32603, a.id);
    a = await h.call("refuse", { what: "w" });
    err(a, -32010, a.id);
    assert.deepEqual(a.error.data, { what: "w" });
    assert.deepEqual((await h.call("echo", { still: 1 })).result, { still: 1 });
  });

  test("deadlines from params._meta", async () => {
    await h.initialize();
    let r = (await h.call("deadline", { a: 1, _meta: { remaining_ms: 2000 } })).result;
    assert.deepEqual(r.params, { a: 1 });
    assert.ok(r.has_deadline && r.remaining > 0 && r.remaining <= 2000, JSON.stringify(r));
    r = (await h.call("deadline", { a: 1 })).result;
    assert.deepEqual(r, { params: { a: 1 }, remaining: null, has_deadline: false });
  });

  test("stray prints go to stderr", async () => {
    await h.initialize();
    assert.deepEqual((await h.call("stray-print", {})).result, {});
    await h.until("the prints on stderr", () => (h.stderr.includes("nor this") ? true : undefined));
    assert.match(h.stderr, /this must not reach the protocol stream/);
  });

  test("callbacks, while host requests are still served", async () => {
    await h.initialize();
    const rid = h.request("callbacks", {});
    const answers = {
      "state.event": { id: 41, source: "feed", delivery_id: "a", kind: "k", payload: {}, accepted_at_ms: 1 },
      "state.events": { events: [] },
      "ingress.push": { event_id: 3, duplicate: false },
      "operation.emit": { emission_id: 17, commit_id: "emit-17" },
    };
    const seen = [];
    for (let i = 0; i < 5; i++) {
      const c = await h.nextCall();
      seen.push([c.method, c.params]);
      assert.deepEqual((await h.call("echo", { n: i })).result, { n: i });
      if (c.method === "state.work") h.answer(c, undefined, { code: -32010, message: "no work 999" });
      else h.answer(c, answers[c.method]);
    }
    const r = (await h.waitFor(rid)).result;
    assert.equal(r.event.id, 41);
    assert.deepEqual(r.push, answers["ingress.push"]);
    assert.deepEqual(r.emit, answers["operation.emit"]);
    assert.equal(r.work_error, -32010);
    assert.deepEqual(seen[2], ["ingress.push", { source: "feed", delivery_id: "d-1", kind: "job.run", payload: { n: 1 } }]);
    assert.deepEqual(seen[3], ["operation.emit", { emission: "note", work_id: 5, payload: { x: 1 } }]);
  });

  test("a callback past its deadline sends $/cancel", async () => {
    await h.initialize();
    const rid = h.request("slow-callback", { timeout: 200 });
    const c = await h.nextCall();
    assert.deepEqual((await h.waitFor(rid)).result, { code: -32002 });
    assert.deepEqual(await h.nextCall(), { jsonrpc: "2.0", method: "$/cancel", params: { id: c.id } });
    h.answer(c, { late: true });
    assert.deepEqual((await h.call("echo", {})).result, {});
  });

  test("an artifact stream keeps the window and closes with size and sha256", async () => {
    await h.initialize();
    const size = 10 * 1024 + 7;
    const rid = h.request("artifact", { size, chunk: 1024 });
    const op = await h.nextCall();
    assert.deepEqual(op.params, { name: "out.bin", media_type: "application/octet-stream" });
    h.answer(op, { stream_id: "s-1", max_chunk_bytes: 512, window: 3 });
    const parts = [];
    const unacked = [];
    const seqs = [];
    let received = 0;
    let c;
    const giveUp = Date.now() + 30000;
    for (;;) {
      try {
        c = await h.nextCall(500);
      } catch {
        // Quiet for 0.5 s: the sender waits for an ack (it must not send past the window),
        // or it is slow on a busy machine.
        assert.ok(Date.now() < giveUp, "the stream stalled");
        if (!unacked.length) continue;
        const u = unacked.shift();
        received += Buffer.from(u.params.data, "base64").length;
        h.answer(u, { received });
        continue;
      }
      if (c.method === "artifact.close") break;
      assert.equal(c.method, "artifact.chunk");
      unacked.push(c);
      assert.ok(unacked.length <= 3, "more chunks unanswered than the window");
      const d = Buffer.from(c.params.data, "base64");
      assert.ok(d.length <= 512);
      parts.push(d);
      seqs.push(c.params.seq);
    }
    assert.equal(unacked.length, 0);
    const got = Buffer.concat(parts);
    assert.deepEqual(seqs, [...seqs.keys()]);
    assert.equal(got.length, size);
    const sha = createHash("sha256").update(got).digest("hex");
    assert.deepEqual(c.params, { stream_id: "s-1", size, sha256: sha });
    h.answer(c, { artifact_id: "sha256:" + sha, size });
    const r = (await h.waitFor(rid)).result;
    assert.equal(r.size, size);
    assert.equal(r.bulk, false);
  });

  test("cancellation, a running id, and the 64-request limit", async () => {
    await h.initialize();
    const marker = join(mkdtempSync(join(tmpdir(), "sdk-")), "m");
    const rid = h.request("wait-cancel", { marker });
    await h.call("echo", {});
    err(await h.waitFor(h.request("echo", {}, rid)), -32600, rid);
    h.notify("$/cancel", { id: rid });
    err(await h.waitFor(rid), -32001, rid);
    // The handler writes the marker as it ends: wait for what it wrote, not just the file.
    await h.until("the marker to say cancelled", () =>
      existsSync(marker) && readFileSync(marker, "utf8") === "cancelled" ? true : undefined,
    );
    const held = [];
    for (let i = 0; i < 64; i++) held.push(h.request("check.sleep", { ms: 60000 }));
    const extra = await h.waitFor(h.request("check.sleep", { ms: 1 }));
    err(extra, -32000, h.nextId - 1);
    assert.deepEqual(extra.error.data, { limit: 64 });
    err(await h.waitFor(h.request("echo", {}, held[0])), -32600, held[0]);
    err(await h.waitFor(h.request("shutdown", {})), -32000, h.nextId - 1);
    h.notify("$/cancel", { id: held[0] });
    err(await h.waitFor(held[0]), -32001, held[0]);
    assert.deepEqual((await h.call("echo", { x: 1 })).result, { x: 1 });
    for (const r of held.slice(1)) h.notify("$/cancel", { id: r });
    for (const r of held.slice(1)) err(await h.waitFor(r), -32001, r);
  });

  test("check.sleep holds at least ms and checks its params", async () => {
    await h.initialize();
    assert.ok((await h.call("check.sleep", { ms: 50 })).result.slept_ms >= 50);
    for (const bad of [{ ms: -1 }, { ms: 1.5 }, { ms: "100" }, {}]) err(await h.call("check.sleep", bad), -32602, h.nextId - 1);
  });

  test("shutdown lets running requests finish, cancels check.sleep, answers last, exits 0", async () => {
    await h.initialize();
    const rid = h.request("finish-on-shutdown", {});
    const sleeper = h.request("check.sleep", { ms: 60000 });
    await h.call("echo", {});
    const sid = h.request("shutdown", {});
    h.notify("$/cancel", { id: sid });
    err(await h.waitFor(h.request("echo", {})), -32008, h.nextId - 1);
    const order = [];
    for (let i = 0; i < 3; i++) order.push((await h.recv()).msg);
    err(order[0], -32001, sleeper);
    assert.deepEqual(order[1], { jsonrpc: "2.0", id: rid, result: { finished: true } });
    assert.deepEqual(order[2], { jsonrpc: "2.0", id: sid, result: {} });
    assert.equal(await h.exited, 0);
  });

  test("stdin EOF exits 0 at once, with a callback pending", async () => {
    await h.initialize();
    h.request("callbacks", {});
    await h.nextCall();
    const t0 = Date.now();
    h.proc.stdin.end();
    assert.equal(await h.exited, 0);
    assert.ok(Date.now() - t0 < 4000);
  });

  test("an oversized request is answered message_too_large and the session goes on", async () => {
    await h.initialize();
    const head = '{"jsonrpc":"2.0","id":"big","method":"echo","params":{"t":"';
    const line = head + "a".repeat(MAX_MESSAGE_BYTES) + '"}}';
    h.sendRaw(line + "\n");
    const a = await h.waitFor("big", 20000);
    err(a, -32004, "big");
    assert.deepEqual(a.error.data, { limit: MAX_MESSAGE_BYTES, size: line.length });
    assert.deepEqual((await h.call("echo", { after: 1 })).result, { after: 1 });
  });
});

// ---- the bulk pipe -----------------------------------------------------------------------------

const MAX_BULK_FRAME_BYTES = 1024 * 1024;
const sha256 = (b) => createHash("sha256").update(b).digest("hex");

/** The host's end of a bulk pipe (docs/protocol.md §8.1): reads the frames, checking each header. */
class FrameReader {
  constructor(fd) {
    this.frames = []; // {tag, len} in the order read
    this.content = new Map(); // tag -> the frames' bytes
    this.bytes = 0;
    this.problems = [];
    this.rest = Buffer.alloc(0); // a frame not read whole yet
    this.sock = new Socket({ fd, readable: true, writable: false });
    this.sock.on("data", (d) => this.feed(d));
  }
  feed(d) {
    let buf = Buffer.concat([this.rest, d]);
    while (buf.length >= 8) {
      const tag = buf.readUInt32LE(0);
      const len = buf.readUInt32LE(4);
      if (len < 1 || len > MAX_BULK_FRAME_BYTES) {
        this.problems.push(`a frame of tag ${tag} with len ${len}`);
        this.sock.destroy();
        return;
      }
      if (buf.length < 8 + len) break;
      this.frames.push({ tag, len });
      if (!this.content.has(tag)) this.content.set(tag, []);
      this.content.get(tag).push(buf.subarray(8, 8 + len));
      this.bytes += len;
      buf = buf.subarray(8 + len);
    }
    this.rest = Buffer.from(buf);
  }
  of(tag) {
    return Buffer.concat(this.content.get(tag) || []);
  }
}

/** What the sample's `artifact` writes: `size` bytes, byte i being (i + add) % 256. */
function pattern(size, add = 0) {
  const b = Buffer.alloc(size);
  for (let i = 0; i < size; i++) b[i] = (i + add) % 256;
  return b;
}

describe("bulk pipe", () => {
  let h;
  let dir;
  let reader;
  // A real pipe: a FIFO, read here and passed to the extension as its descriptor 3. The
  // extension holds its own copy once spawned, so this process keeps only the read end.
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), "conduit-bulk-"));
    const fifo = join(dir, "bulk");
    execFileSync("mkfifo", [fifo]);
    const r = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
    const w = openSync(fifo, constants.O_WRONLY);
    h = new FakeHost([SAMPLE], HERE, { fd3: w });
    closeSync(w);
    reader = new FrameReader(r);
  });
  afterEach(async () => {
    await h.stop();
    reader.sock.destroy();
    rmSync(dir, { recursive: true, force: true });
    assert.deepEqual(h.violations, [], "non-protocol output on stdout");
    assert.deepEqual(reader.problems, [], "malformed frames on the bulk pipe");
    assert.equal(reader.rest.length, 0, "a frame not written whole");
  });
  const offer = async () => {
    const a = await h.call("initialize", { ...INITIALIZE_PARAMS, bulk: { fd: 3 } });
    assert.ok(a.result, JSON.stringify(a));
  };
  const bytesRead = (n) => h.until(`${n} bytes on the bulk pipe`, () => (reader.bytes >= n ? true : undefined));

  test("an offered pipe carries the bytes as whole frames of 256 KiB, then close has size and sha256", async () => {
    await offer();
    const size = 600 * 1024 + 5;
    const rid = h.request("artifact", { size });
    const op = await h.nextCall();
    assert.equal(op.method, "artifact.open");
    assert.equal(op.params.bulk, true);
    h.answer(op, { stream_id: "s-9", max_chunk_bytes: 262144, window: 8, bulk_tag: 7 });
    await bytesRead(size);
    const close = await h.nextCall();
    assert.equal(close.method, "artifact.close", "no artifact.chunk on a stream granted a tag");
    const got = reader.of(7);
    assert.equal(reader.bytes, size);
    assert.ok(got.equals(pattern(size)), "the frames' content differs from what was written");
    // Writes of 1,000 bytes are gathered: every frame but the last is 256 KiB.
    assert.deepEqual(reader.frames, [BULK_FRAME_BYTES, BULK_FRAME_BYTES, size - 2 * BULK_FRAME_BYTES].map((len) => ({ tag: 7, len })));
    assert.deepEqual(close.params, { stream_id: "s-9", size, sha256: sha256(got) });
    h.answer(close, { artifact_id: "sha256:" + sha256(got), size });
    // An older host's answer (no `sha256`): the SDK reads the digest from the id.
    assert.deepEqual((await h.waitFor(rid)).result, { artifact_id: "sha256:" + sha256(got), size, sha256: sha256(got), bulk: true });
  });

  test("a current host gets no digest on the pipe's close, and its own is returned", async () => {
    await offer();
    const size = 300 * 1024;
    const rid = h.request("artifact", { size, hashing: true });
    const op = await h.nextCall();
    h.answer(op, { stream_id: "s-4", max_chunk_bytes: 262144, window: 8, bulk_tag: 2, sha256_optional: true });
    await bytesRead(size);
    const close = await h.nextCall();
    assert.deepEqual(close.params, { stream_id: "s-4", size });
    const digest = sha256(reader.of(2));
    h.answer(close, { artifact_id: "sha256:" + digest, size, sha256: digest });
    assert.deepEqual((await h.waitFor(rid)).result, { artifact_id: "sha256:" + digest, size, sha256: digest, bulk: true, hashing: false });
  });

  test("frames of two streams written at once never interleave", async () => {
    await offer();
    const size = 1024 * 1024 + 3;
    const rid = h.request("two-artifacts", { size });
    const tags = new Map([["a.bin", 1], ["b.bin", 2]]);
    const ids = new Map();
    for (let i = 0; i < 2; i++) {
      const op = await h.nextCall();
      assert.equal(op.method, "artifact.open");
      assert.equal(op.params.bulk, true);
      ids.set(`s-${op.params.name}`, tags.get(op.params.name));
      h.answer(op, { stream_id: `s-${op.params.name}`, max_chunk_bytes: 262144, window: 8, bulk_tag: tags.get(op.params.name) });
    }
    await bytesRead(2 * size);
    for (const [tag, add] of [[1, 0], [2, 1]]) {
      assert.ok(reader.of(tag).equals(pattern(size, add)), `the content of tag ${tag} differs from what was written`);
    }
    const switches = reader.frames.filter((f, i) => i > 0 && f.tag !== reader.frames[i - 1].tag).length;
    assert.ok(switches > 0, `the two streams' frames did not alternate: ${JSON.stringify(reader.frames)}`);
    for (let i = 0; i < 2; i++) {
      const close = await h.nextCall();
      assert.equal(close.method, "artifact.close");
      const want = sha256(reader.of(ids.get(close.params.stream_id)));
      assert.deepEqual(close.params, { stream_id: close.params.stream_id, size, sha256: want });
      h.answer(close, { artifact_id: "sha256:" + want, size });
    }
    const r = (await h.waitFor(rid)).result;
    assert.deepEqual(r.map((x) => [x.size, x.bulk]), [[size, true], [size, true]]);
  });

  test("without a tag the stream takes chunks, and the pipe stays empty", async () => {
    await offer();
    const rid = h.request("artifact", { size: 3000, chunk: 1000 });
    const op = await h.nextCall();
    assert.equal(op.params.bulk, true);
    h.answer(op, { stream_id: "s-1", max_chunk_bytes: 1000, window: 8 });
    const parts = [];
    let c;
    for (;;) {
      c = await h.nextCall();
      if (c.method === "artifact.close") break;
      assert.equal(c.method, "artifact.chunk");
      assert.equal(c.params.seq, parts.length);
      parts.push(Buffer.from(c.params.data, "base64"));
      h.answer(c, { received: Buffer.concat(parts).length });
    }
    const got = Buffer.concat(parts);
    assert.ok(got.equals(pattern(3000)));
    assert.deepEqual(c.params, { stream_id: "s-1", size: 3000, sha256: sha256(got) });
    h.answer(c, { artifact_id: "sha256:" + sha256(got), size: 3000 });
    assert.deepEqual((await h.waitFor(rid)).result, { artifact_id: "sha256:" + sha256(got), size: 3000, sha256: sha256(got), bulk: false });
    assert.equal(reader.bytes, 0);
  });

  test("the offered descriptor is replaced by a copy the extension's programs do not inherit", async () => {
    await offer();
    const after = (await h.call("descriptors-of", { path: join(dir, "bulk") })).result;
    assert.equal(after.length, 1, JSON.stringify(after));
    assert.notEqual(after[0].fd, 3, "descriptor 3 is still open");
    assert.ok(parseInt(after[0].flags, 8) & 0o2000000, `the copy is not close-on-exec: ${JSON.stringify(after)}`);
  });

  test("an offered descriptor that is not a pipe is not used", async () => {
    await h.stop();
    const file = openSync(join(dir, "not-a-pipe"), "w");
    h = new FakeHost([SAMPLE], HERE, { fd3: file });
    closeSync(file);
    await offer();
    const rid = h.request("artifact", { size: 10 });
    const op = await h.nextCall();
    assert.equal(op.params.bulk, undefined);
    h.answer(op, { stream_id: "s-2", max_chunk_bytes: 262144, window: 8, bulk_tag: 3 });
    const chunk = await h.nextCall();
    assert.equal(chunk.method, "artifact.chunk", "a tag the extension did not ask for is not used");
    h.answer(chunk, { received: 10 });
    const close = await h.nextCall();
    h.answer(close, { artifact_id: "sha256:" + close.params.sha256, size: 10 });
    assert.equal((await h.waitFor(rid)).result.bulk, false);
    assert.match(h.stderr, /cannot use the host's bulk pipe \(descriptor 3\): it is not a pipe/);
  });
});

// docs/protocol.md §8: the host computes the digest; the writer sends one only when asked to
// verify, when given one, or when the host needs it (no `sha256_optional` in the open's answer).
describe("host digest", () => {
  let h;
  const SIZE = 10000;
  const OPENED = { stream_id: "s-1", max_chunk_bytes: 4096, window: 8, sha256_optional: true };
  beforeEach(async () => {
    h = new FakeHost([SAMPLE], HERE);
    await h.initialize();
  });
  afterEach(async () => {
    await h.stop();
    assert.deepEqual(h.violations, [], "non-protocol output on stdout");
  });
  /** Serve one artifact's open and chunks; the request's id and the close call. */
  const stream = async (params, opened = OPENED) => {
    const rid = h.request("artifact", { size: SIZE, hashing: true, ...params });
    const op = await h.nextCall();
    assert.equal(op.method, "artifact.open");
    h.answer(op, opened);
    const parts = [];
    for (;;) {
      const c = await h.nextCall();
      if (c.method === "artifact.close") {
        assert.ok(Buffer.concat(parts).equals(pattern(SIZE)));
        return { rid, close: c };
      }
      parts.push(Buffer.from(c.params.data, "base64"));
      h.answer(c, { received: Buffer.concat(parts).length });
    }
  };
  const digest = sha256(pattern(SIZE));
  const stored = { artifact_id: "sha256:" + digest, size: SIZE, sha256: digest };

  test("by default no digest is sent, and the host's is returned", async () => {
    const { rid, close } = await stream({});
    assert.deepEqual(close.params, { stream_id: "s-1", size: SIZE });
    h.answer(close, stored);
    assert.deepEqual((await h.waitFor(rid)).result, { ...stored, bulk: false, hashing: false });
  });

  test("verify sends the writer's own digest", async () => {
    const { rid, close } = await stream({ verify: true });
    assert.equal(close.params.sha256, digest);
    h.answer(close, stored);
    assert.equal((await h.waitFor(rid)).result.hashing, true);
  });

  test("a known digest is sent as given, and the host's refusal is the caller's", async () => {
    const wrong = sha256(Buffer.from("other bytes"));
    const { rid, close } = await stream({ sha256: wrong });
    assert.equal(close.params.sha256, wrong);
    h.answer(close, undefined, { code: -32009, message: "the artifact does not match its close" });
    assert.equal((await h.waitFor(rid)).error.code, -32009);
  });

  test("a verifying writer refuses a known digest not its own before closing", async () => {
    const wrong = sha256(Buffer.from("other bytes"));
    const rid = h.request("artifact", { size: 3000, chunk: 1000, verify: true, sha256: wrong });
    h.answer(await h.nextCall(), { ...OPENED, max_chunk_bytes: 1000 });
    let c;
    for (;;) {
      c = await h.nextCall();
      if (c.method !== "artifact.chunk") break;
      h.answer(c, { received: 0 });
    }
    assert.equal(c.method, "artifact.abort");
    h.answer(c, {});
    assert.match((await h.waitFor(rid)).error.message, new RegExp(`not the ${wrong} given to finish`));
  });

  test("an older host gets the digest, and its answer is completed", async () => {
    const { sha256_optional: _, ...old } = OPENED;
    const { rid, close } = await stream({}, old);
    assert.equal(close.params.sha256, digest);
    h.answer(close, { artifact_id: "sha256:" + digest, size: SIZE });
    assert.deepEqual((await h.waitFor(rid)).result, { ...stored, bulk: false, hashing: true });
  });
});

// The SDK is ESM modules under lib/; its API is what index.js exports, as when it was one file,
// and index.d.ts types exactly that.
describe("public API", () => {
  const ROOT = join(HERE, "..");
  test("index.js exports what the one-file SDK did, and index.d.ts declares each", async () => {
    const api = await import("../index.js");
    const names = Object.keys(api).sort();
    assert.deepEqual(names, [
      "ArtifactWriter", "BULK_FRAME_BYTES", "Ctx", "DEFAULT_ARTIFACT_CHUNK_BYTES", "ErrorCode", "Extension", "Host",
      "MAX_ARTIFACT_CHUNK_BYTES", "MAX_CONCURRENT_REQUESTS", "MAX_MESSAGE_BYTES", "PROTOCOL_VERSIONS", "RpcError",
      "_methodTables", "isRetryable", "readId", "scanMembers",
    ]);
    const dts = readFileSync(join(ROOT, "index.d.ts"), "utf8");
    const declared = [...dts.matchAll(/^export declare (?:const|function|class) (\w+)/gm)].map((m) => m[1]).sort();
    // _methodTables is for the SDK's tests, not typed as API.
    assert.deepEqual(declared, names.filter((n) => n !== "_methodTables"));
  });
  test("every module opens with its doc, and package.json ships every module", () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
    const shipped = (f) => pkg.files.some((x) => x === f || (x.endsWith("/") && f.startsWith(x)));
    const modules = [
      ...readdirSync(ROOT).filter((f) => f.endsWith(".js") || f.endsWith(".d.ts")),
      ...readdirSync(join(ROOT, "lib")).map((f) => `lib/${f}`),
    ];
    assert.ok(modules.includes("lib/session.js"), modules.join(" "));
    for (const f of modules) {
      assert.ok(shipped(f), `package.json's "files" does not ship ${f}`);
      if (f.endsWith(".js")) assert.match(readFileSync(join(ROOT, f), "utf8"), /^\/\/ \S/, `${f} opens without its doc comment`);
    }
  });
  // tsc is not a dependency of the SDK; where it is installed, the types are checked as strictly
  // as an author's project would check them.
  test("index.d.ts passes tsc --strict", (t) => {
    let tsc;
    try {
      tsc = execFileSync("sh", ["-c", "command -v tsc"], { encoding: "utf8" }).trim();
    } catch {
      t.skip("tsc is not installed (npm install -g typescript checks this)");
      return;
    }
    execFileSync(tsc, ["--strict", "--noEmit", "--lib", "es2022,dom", "--target", "es2022", "--module", "nodenext", "--moduleResolution", "nodenext", join(ROOT, "index.d.ts")], { stdio: "pipe" });
  });
});
