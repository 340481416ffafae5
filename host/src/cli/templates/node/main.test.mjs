// Tests of `{{name}}` with the SDK's test kit (conduit-extension/testing): main.mjs's `ext`
// served on the SDK's own session behind a scripted host, with no daemon.
// Run in this folder: node --test
import { test } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { ErrorCode } from "conduit-extension";
import { Answered, DeadlineExceeded, ScriptedHost } from "conduit-extension/testing";
import { ext } from "./main.mjs";

const MANIFEST = fileURLToPath(new URL("conduit-extension.toml", import.meta.url));

test("echo answers its params", async () => {
  // manifest: the handshake must state the manifest's name and version.
  const host = await ScriptedHost.start(ext, { manifest: MANIFEST });
  assert.deepEqual(await host.call("echo", { text: "hi" }), { text: "hi" });
  await host.finish();
});

test("echo without text is invalid_params", async () => {
  const host = await ScriptedHost.start(ext);
  await assert.rejects(host.call("echo", { txt: "hi" }), (e) => e instanceof Answered && e.code === ErrorCode.INVALID_PARAMS);
  await host.finish();
});

test("a call past its deadline is deadline_exceeded", async () => {
  const host = await ScriptedHost.start(ext);
  await assert.rejects(host.call("check.sleep", { ms: 60000 }, { timeoutMs: 100 }), (e) => e instanceof DeadlineExceeded);
  await host.finish();
});

// A callback answered by the scripted host, and what it was asked:
//
//   const host = await ScriptedHost.start(ext, { answers: { "state.event": { id: 7, ... } } });
//   await host.call("my_method", { event_id: 7 });
//   assert.deepEqual(host.callbacksOf("state.event"), [{ event_id: 7 }]);
