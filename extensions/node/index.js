// conduit-extension: write conduit extensions in Node.js (ESM, no dependencies, Node >= 18).
//
// An extension is a child process the conduit daemon talks to over stdin/stdout with JSON-RPC
// 2.0, one message per line (docs/protocol.md). With this package it is a set of async
// handlers; the SDK does the protocol:
//
//   import { Extension } from "conduit-extension";
//   const ext = new Extension("node-echo", "0.1.0");
//   ext.method("echo", async (ctx, params) => params);
//   ext.run();
//
// - framing (§2): bounded line assembly (16 MiB), an oversized line discarded and, when its
//   first 4,096 bytes hold a top-level id and "method", answered message_too_large;
// - ids are exact (§1.1, §3.3): the id is read from the raw line, never through a JavaScript
//   number, so an id beyond 2^53 is answered with exactly its digits; -0, 1.0, 1e2 and integers
//   outside signed 64 bits are invalid; repeated top-level members, method with result/error,
//   batches, NaN, a BOM and non-UTF-8 bytes get the answers of §3.2/§3.3;
// - the refusal order of §3.4, the 64-request limit (overloaded with data.limit), the
//   handshake (§4), dispatch of the in-transaction calls by the name in their params,
//   check.sleep, $/cancel (ctx.signal), shutdown and stdin EOF (§5);
// - callbacks to the host (ctx.host) and artifact streams with the window of §8, or as frames
//   on the host's bulk pipe when it offers one (§8.1);
// - deadlines: params._meta.remaining_ms is removed from the params and read into
//   ctx.deadline / ctx.remaining();
// - stdout is protected: process.stdout.write (and so console.log) is pointed at stderr; the
//   protocol keeps the original writer. Logs go to stderr.
//
// A handler that throws RpcError answers that error; anything else it throws answers
// internal_error (-32603), which conduit treats as not retryable.
//
// This file only re-exports; the SDK's modules are in lib/, each importing only those listed
// before it: protocol.js (the version, limits, error codes and method names), wire.js (ids read
// exactly, members scanned), artifacts.js (artifact streams), bulk.js (the bulk pipe),
// context.js (Ctx, Host), session.js (serving one host) and extension.js (Extension). Import
// every name from "conduit-extension" itself, which is the API (index.d.ts types it); which
// module holds a name is not.

export {
  BULK_FRAME_BYTES,
  DEFAULT_ARTIFACT_CHUNK_BYTES,
  ErrorCode,
  MAX_ARTIFACT_CHUNK_BYTES,
  MAX_CONCURRENT_REQUESTS,
  MAX_MESSAGE_BYTES,
  PROTOCOL_VERSIONS,
  RpcError,
  _methodTables,
  isRetryable,
} from "./lib/protocol.js";
export { readId, scanMembers } from "./lib/wire.js";
export { ArtifactWriter } from "./lib/artifacts.js";
export { Ctx, Host } from "./lib/context.js";
export { Extension } from "./lib/extension.js";
