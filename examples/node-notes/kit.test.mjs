// node-notes tested with the kit (conduit-extension/testing): its handlers behind a scripted
// host, on the SDK's own session, with no daemon.
//
// - a trigger with three notes grouped as notes.mjs documents;
// - `export` when `state.events` is answered not_found: the handler's error, its stream aborted;
// - `export` past its deadline: the kit reports deadline_exceeded, the handler is cancelled (its
//   stream aborted, nothing stored);
// - `export`'s artifact received whole, on the bulk pipe, with its digest.
//
// Run in the staged package (`make stage`, which puts the SDK and its kit beside it):
// node --test target/packages/node-notes/kit.test.mjs
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { fileURLToPath } from "node:url";
import { Answered, DeadlineExceeded, ScriptedHost } from "conduit-extension/testing";
import { ErrorCode, RpcError } from "conduit-extension";
import { extension } from "./notes.mjs";

const MANIFEST = fileURLToPath(new URL("conduit-extension.toml", import.meta.url));
const note = (id, kind, payload) => ({ id, source: "node-inbox", delivery_id: `n-${id}`, kind, payload, accepted_at_ms: 1764579600000 + id });

async function aborted(host, name) {
  const end = Date.now() + 10000;
  while (!host.abortedArtifacts.includes(name)) {
    if (Date.now() > end) throw new Error(`the stream ${name} was never aborted`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

test("a trigger groups three notes by thread; a post starts the group", async () => {
  const host = await ScriptedHost.start(extension(null), { manifest: MANIFEST });
  const inputs = [
    note(1, "node-note.edited", { thread: "t-42", text: "typo" }),
    note(2, "node-note.posted", { text: "no thread" }),
    note(3, "node-note.posted", { thread: "t-42", text: "hi @ada" }),
  ];
  assert.deepEqual(await host.call("work_kind.trigger", { kind: "node-note", inputs }), {
    groups: [
      { key: "thread:t-42", event_ids: [1, 3], start: true },
      { key: "event:2", event_ids: [2], start: true },
    ],
  });
  const edits = await host.call("work_kind.trigger", { kind: "node-note", inputs: [note(4, "node-note.edited", { thread: "t-7" })] });
  assert.equal(edits.groups[0].start, false);
  await host.finish();
});

test("an export whose events are not found fails with not_found", async () => {
  const host = await ScriptedHost.start(extension(null), { answers: { "state.events": new RpcError(ErrorCode.NOT_FOUND, "no such source") } });
  await assert.rejects(host.call("export", {}), (e) => e instanceof Answered && e.code === ErrorCode.NOT_FOUND && e.rpcMessage === "no such source");
  assert.equal(host.callbacksOf("state.events").length, 1);
  await aborted(host, "notes.jsonl");
  assert.deepEqual(host.artifacts, []);
  await host.finish();
});

test("an export past its deadline is cancelled", async () => {
  const host = await ScriptedHost.start(extension(null), { answers: { "state.events": { events: [] } }, delays: { "state.events": 600 } });
  // The handler's callback waits at most the request's remaining time (`_meta.remaining_ms`), so
  // either the handler answers deadline_exceeded itself a moment before the host gives up, or
  // the kit does: the same code either way.
  await assert.rejects(host.call("export", {}, { timeoutMs: 100 }), (e) => (e instanceof DeadlineExceeded || e instanceof Answered) && e.code === ErrorCode.DEADLINE_EXCEEDED);
  await aborted(host, "notes.jsonl");
  assert.deepEqual(host.artifacts, []);
  await host.finish();
});

test("an export arrives whole on the bulk pipe with its digest", async () => {
  const events = [
    note(1, "node-note.posted", { thread: "t-1", text: "a" }),
    note(2, "node-note.posted", { thread: "t-2", text: "b" }),
    note(3, "node-note.edited", { thread: "t-1", text: "c" }),
  ];
  const host = await ScriptedHost.start(extension(null), {
    bulkPipe: true,
    answers: { "state.events": (p) => ({ events: p.after_id === undefined ? events : [] }) },
  });
  const r = await host.call("export", { thread: "t-1" });
  const want = Buffer.from([events[0], events[2]].map((e) => JSON.stringify(e) + "\n").join(""));
  const a = host.artifacts[0];
  assert.deepEqual([a.name, a.transport], ["notes.jsonl", "bulk-pipe"]);
  assert.equal(a.data.toString(), want.toString());
  const digest = createHash("sha256").update(want).digest("hex");
  assert.deepEqual([r.notes, r.size, r.sha256, r.transport], [2, want.length, digest, "bulk-pipe"]);
  await host.finish();
});
