// The kit (conduit-extension/testing) proves each thing it offers against a small extension on
// the SDK: the handshake's limits, results, protocol errors, the in-transaction deadline,
// callbacks from a table and a function (recorded), $/cancel, chunked and bulk artifacts, a
// request left unanswered, reentrant writes and the manifest check.
// Run: node --test extensions/node/test/testing.test.mjs
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { ErrorCode, Extension, RpcError } from "../index.js";
import { Answered, DeadlineExceeded, RuleBroken, ScriptedHost } from "../testing.js";

const content = (n) => Buffer.from(Array.from({ length: n }, (_, i) => i % 251));
const sha256 = (b) => createHash("sha256").update(b).digest("hex");
const event = (id, thread) => ({ id, source: "s", delivery_id: `d-${id}`, kind: "note.posted", payload: { thread }, accepted_at_ms: 0 });

function sample() {
  return new Extension("kit-sample", "0.2.0")
    .method("echo", (ctx, p) => {
      if (typeof p.text !== "string") throw RpcError.invalidParams('echo needs params {"text": string}');
      return p;
    })
    .method("limits", (ctx) => ({ chunk: ctx.init.limits.max_artifact_chunk_bytes, remaining: ctx.remaining() }))
    .method("thread_of", async (ctx, p) => ({ thread: (await ctx.host.event(p.event_id)).payload.thread }))
    .method("upload", (ctx, p) => ctx.host.storeArtifact("blob.bin", content(p.bytes), { jsonChunks: !p.bulk }))
    .method("hang", () => new Promise(() => {}))
    .workKind("slow", async (ctx) => {
      // Waits for its cancellation, then tells the host it saw it (a callback still works).
      const remaining = ctx.remaining();
      await new Promise((r) => ctx.signal.addEventListener("abort", r));
      await ctx.host.call("test.saw_cancel", { remaining_ms: Math.floor(remaining) }, { timeoutMs: 5000 });
      return { groups: [] };
    })
    .workKind("writer", async (ctx, p) => {
      let code = 0;
      try {
        await ctx.host.emit("x", {});
      } catch (e) {
        code = e.code;
      }
      return { groups: [{ key: `code:${code}`, event_ids: [p.inputs[0].id] }] };
    });
}

async function until(get, ms = 10000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = get();
    if (v) return v;
    if (Date.now() > end) throw new Error("not seen in time");
    await new Promise((r) => setTimeout(r, 5));
  }
}

test("the handshake carries the chosen limits and artifacts keep them", async () => {
  const h = await ScriptedHost.start(sample(), { limits: { max_artifact_chunk_bytes: 1000, artifact_window: 2 } });
  assert.deepEqual(h.handshake.extension, { name: "kit-sample", version: "0.2.0" });
  assert.equal((await h.call("limits")).chunk, 1000);
  assert.equal((await h.call("upload", { bytes: 4500 })).size, 4500);
  assert.deepEqual([h.artifacts[0].transport, h.artifacts[0].chunks], ["chunks", 5]);
  await h.finish();
});

test("a call gives the result, under the default deadline", async () => {
  const h = await ScriptedHost.start(sample());
  assert.deepEqual(await h.call("echo", { text: "hi" }), { text: "hi" });
  const r = await h.call("limits");
  assert.ok(r.remaining > 25000 && r.remaining <= 30000, `${r.remaining}`);
  await h.finish();
});

test("a protocol error rejects as Answered", async () => {
  const h = await ScriptedHost.start(sample());
  await assert.rejects(h.call("echo", { txt: 1 }), (e) => e instanceof Answered && e.code === ErrorCode.INVALID_PARAMS);
  await assert.rejects(h.call("nope"), (e) => e instanceof Answered && e.code === ErrorCode.METHOD_NOT_FOUND);
  await h.finish();
});

test("a late in-transaction answer is deadline_exceeded and the handler is cancelled", async () => {
  const h = await ScriptedHost.start(sample(), { deadlines: { in_transaction_ms: 100 }, answers: { "test.saw_cancel": {} } });
  await assert.rejects(h.call("work_kind.trigger", { kind: "slow", inputs: [event(1, "t")] }), (e) => e instanceof DeadlineExceeded && e.code === ErrorCode.DEADLINE_EXCEEDED);
  const seen = await until(() => h.callbacksOf("test.saw_cancel")[0]);
  assert.ok(seen.remaining_ms > 0 && seen.remaining_ms <= 100, JSON.stringify(seen));
  await h.finish();
});

test("callbacks are answered from the table and recorded", async () => {
  const h = await ScriptedHost.start(sample(), { answers: { "state.event": event(7, "t-7") } });
  assert.deepEqual(await h.call("thread_of", { event_id: 7 }), { thread: "t-7" });
  assert.deepEqual(h.callbacks, [{ method: "state.event", params: { event_id: 7 } }]);
  await h.finish();
});

test("callbacks are answered by a function or an error", async () => {
  const stateEvent = (p) => {
    if (p.event_id === 404) throw RpcError.notFound("no event 404");
    return event(p.event_id, `t-${p.event_id}`);
  };
  const h = await ScriptedHost.start(sample(), { answers: { "state.event": stateEvent } });
  assert.deepEqual(await h.call("thread_of", { event_id: 3 }), { thread: "t-3" });
  await assert.rejects(h.call("thread_of", { event_id: 404 }), (e) => e.code === ErrorCode.NOT_FOUND);
  assert.deepEqual(h.callbacksOf("state.event"), [{ event_id: 3 }, { event_id: 404 }]);
  await h.finish();
  const h2 = await ScriptedHost.start(sample(), { answers: { "state.event": RpcError.notFound("gone") } });
  await assert.rejects(h2.call("thread_of", { event_id: 1 }), (e) => e.code === ErrorCode.NOT_FOUND && e.rpcMessage === "gone");
  await h2.finish();
  const h3 = await ScriptedHost.start(sample()); // nothing scripted: refused, saying what to script
  await assert.rejects(h3.call("thread_of", { event_id: 1 }), (e) => e.rpcMessage.includes("answers"));
  await h3.finish();
});

test("cancel sends $/cancel and the answer is cancelled", async () => {
  const h = await ScriptedHost.start(sample());
  const p = h.startCall("check.sleep", { ms: 60000 });
  p.cancel();
  await assert.rejects(p.wait(), (e) => e instanceof Answered && e.code === ErrorCode.CANCELLED);
  await h.finish();
});

test("a chunked artifact arrives whole with its digest", async () => {
  const want = content(200000);
  const h = await ScriptedHost.start(sample());
  const stored = await h.call("upload", { bytes: want.length });
  const a = h.artifacts[0];
  assert.deepEqual([a.name, a.transport, a.chunks], ["blob.bin", "chunks", 4]);
  assert.ok(a.data.equals(want));
  assert.equal(a.sha256, sha256(want));
  assert.equal(stored.sha256, a.sha256);
  await h.finish();
});

test("a bulk artifact arrives whole with its digest", async () => {
  const want = content(700000);
  const h = await ScriptedHost.start(sample(), { bulkPipe: true });
  const stored = await h.call("upload", { bytes: want.length, bulk: true });
  const a = h.artifacts[0];
  assert.deepEqual([a.transport, a.chunks], ["bulk-pipe", 0]);
  assert.ok(a.data.equals(want));
  assert.equal(stored.sha256, sha256(want));
  assert.deepEqual(h.callbacksOf("artifact.chunk"), []);
  await h.finish();
});

test("a request left unanswered is named at finish", async () => {
  const h = await ScriptedHost.start(sample(), { patience: 200, deadlines: { shutdown_grace_ms: 1000 } });
  h.startCall("hang", {}, { timeoutMs: null });
  await assert.rejects(h.finish(), (e) => e instanceof RuleBroken && e.rule === "declared-methods-answer" && e.message.includes("`hang`"));
});

test("a write inside a transaction is refused reentrant_write", async () => {
  const h = await ScriptedHost.start(sample(), { answers: { "operation.emit": { emission_id: 1, commit_id: "c" } } });
  const r = await h.call("work_kind.trigger", { kind: "writer", inputs: [event(1, "t")] });
  assert.equal(r.groups[0].key, `code:${ErrorCode.REENTRANT_WRITE}`);
  await h.finish();
});

test("the manifest must state what the handshake says", async () => {
  const dir = mkdtempSync(join(tmpdir(), "kit-manifest-"));
  const path = join(dir, "conduit-extension.toml");
  writeFileSync(path, 'name = "kit-sample"\nversion = "0.1.0"\nprotocol = 1\n');
  await assert.rejects(ScriptedHost.start(sample(), { manifest: path }), (e) => e instanceof RuleBroken && e.rule === "handshake" && e.message.includes("0.1.0"));
  rmSync(dir, { recursive: true });
});

test("the README's kit example runs", () => {
  // Run as the tests it is, from a folder where `conduit-extension` is this SDK.
  const sdk = join(dirname(fileURLToPath(import.meta.url)), "..");
  const readme = readFileSync(join(sdk, "README.md"), "utf8");
  const code = readme.split("## Testing your extension: the kit")[1].split("```js\n")[1].split("```")[0];
  const dir = mkdtempSync(join(tmpdir(), "kit-readme-"));
  try {
    mkdirSync(join(dir, "node_modules"));
    symlinkSync(sdk, join(dir, "node_modules", "conduit-extension"));
    writeFileSync(join(dir, "readme.test.mjs"), code);
    // A test run of its own, not a child reporting to this one.
    const env = { ...process.env };
    delete env.NODE_TEST_CONTEXT;
    const out = execFileSync(process.execPath, ["--test", "readme.test.mjs"], { cwd: dir, encoding: "utf8", env });
    assert.match(out, /# pass 3\n# fail 0/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
