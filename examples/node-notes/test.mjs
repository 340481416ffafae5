// node-notes' own tests: its handlers as functions (the protocol is the SDK's, tested there).
// Run in the staged package (staging puts the SDK beside notes.mjs): make stage, then
// node --test target/packages/node-notes/test.mjs
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { annotate, group, mentions, nextAfter, poll } from "./notes.mjs";

const ev = (id, kind, payload) => ({ id, source: "s", delivery_id: `d${id}`, kind, payload, accepted_at_ms: 0 });

test("notes group by thread; a post starts the group; no thread is its own Work", () => {
  const r = group([ev(1, "node-note.posted", { thread: "t-1" }), ev(2, "node-note.edited", { thread: "t-2" }), ev(3, "node-note.edited", { thread: " t-1 " }), ev(4, "node-note.posted", {}), ev(1, "node-note.posted", { thread: "t-1" })]);
  assert.deepEqual(r.groups, [
    { key: "thread:t-1", event_ids: [1, 3], start: true },
    { key: "thread:t-2", event_ids: [2], start: false },
    { key: "event:4", event_ids: [4], start: true },
  ]);
});

test("digest specs", () => {
  assert.equal(nextAfter("every 15m", 1000), 1000 + 15 * 60000);
  assert.equal(nextAfter("30 9 * * *", 0), 9 * 3600000 + 30 * 60000);
  assert.equal(nextAfter("0 0 * * *", 0), 86400000); // the same minute rolls to tomorrow
  for (const bad of ["every 0s", "every 367d", "every 5", "61 1 * * *", "1 24 * * *", "hourly"]) assert.throws(() => nextAfter(bad, 0), bad);
});

test("mentions are whole words in any case", () => {
  assert.ok(mentions("thanks @Dora!", "dora"));
  assert.ok(mentions("(@dora)", "@dora"));
  for (const no of ["@doramae", "mail@dora.org", "@dora_x", "dora"]) assert.ok(!mentions(no, "dora"), no);
  assert.ok(!mentions("@dora", " "));
});

test("annotations are a function of the params", () => {
  const p = { emission: "annotation", commit_id: "emit-1", work_id: 5, payload: { thread: "t", text: "release #DB notes #db #api", tags: ["Release"] } };
  const a = annotate(p);
  assert.deepEqual(a, annotate(p));
  assert.deepEqual(a.body, { work_id: 5, commit_id: "emit-1", summary: "release #DB notes #db #api", words: 5, tags: ["release", "db", "api"], thread: "t" });
  assert.ok(annotate({ commit_id: "c", payload: { text: "w ".repeat(200) } }).body.summary.endsWith("…"));
});

test("the inbox is read after its cursor, complete lines only", async () => {
  const f = join(mkdtempSync(join(tmpdir(), "notes-")), "inbox.jsonl");
  writeFileSync(f, '{"delivery_id":"a","payload":{"thread":"t"}}\nnot json\n{"delivery_id":"b"}\n{"delivery_id":"c"');
  const one = await poll(f, { source: "notes-inbox", limit: 1 });
  assert.deepEqual(one, { events: [{ delivery_id: "a", kind: "node-note.posted", payload: { thread: "t" } }], cursor: "1" });
  const rest = await poll(f, { source: "notes-inbox", cursor: "1", limit: 10 });
  assert.deepEqual(rest.events.map((e) => e.delivery_id), ["b"]);
  assert.equal(rest.cursor, "3");
  assert.deepEqual(await poll(f, { source: "notes-inbox", cursor: "3", limit: 10 }), { events: [] });
  assert.deepEqual(await poll(null, { limit: 1 }), { events: [] });
});
