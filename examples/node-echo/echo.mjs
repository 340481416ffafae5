// node-echo: the minimal conduit extension, on the Node SDK (extensions/node).
//
// Serves `echo` (params {"text": string}, answered with the params as received) and, like every
// SDK extension, `check.sleep`. The SDK (node_modules/conduit-extension, once staged) does the
// protocol: framing, exact ids, the handshake, cancellation, the 64-request limit, shutdown.
import { Extension, RpcError } from "conduit-extension";

export const ext = new Extension("node-echo", "0.1.0");

ext.method("echo", async (ctx, params) => {
  if (typeof params.text !== "string") {
    throw RpcError.invalidParams('echo needs params {"text": string}');
  }
  return params;
});

// Served when run (`node echo.mjs`), not when a test imports it.
if (import.meta.url === `file://${process.argv[1]}`) ext.run();
