// node-echo tested with the kit (conduit-extension/testing): echo.mjs's `ext` behind a scripted
// host, on the SDK's own session, with no daemon. Run in the staged package (`make stage`):
// node --test target/packages/node-echo/echo.test.mjs
import { test } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { Answered, DeadlineExceeded, ScriptedHost } from "conduit-extension/testing";
import { ErrorCode } from "conduit-extension";
import { ext } from "./echo.mjs";

const MANIFEST = fileURLToPath(new URL("conduit-extension.toml", import.meta.url));

test("echo answers its params, without the _meta the host added", async () => {
  const host = await ScriptedHost.start(ext, { manifest: MANIFEST });
  assert.deepEqual(await host.call("echo", { text: "hi", n: 1 }), { text: "hi", n: 1 });
  await host.finish();
});

test("echo without text is invalid_params", async () => {
  const host = await ScriptedHost.start(ext);
  await assert.rejects(host.call("echo", { txt: "hi" }), (e) => e instanceof Answered && e.code === ErrorCode.INVALID_PARAMS);
  await host.finish();
});

test("a sleep past its deadline is deadline_exceeded, and the $/cancel frees it", async () => {
  const host = await ScriptedHost.start(ext);
  await assert.rejects(host.call("check.sleep", { ms: 60000 }, { timeoutMs: 100 }), (e) => e instanceof DeadlineExceeded);
  assert.deepEqual(await host.call("echo", { text: "after" }), { text: "after" });
  await host.finish();
});
