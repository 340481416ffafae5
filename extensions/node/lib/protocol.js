// What the protocol fixes, as this SDK needs it: the version and the limits (docs/protocol.md
// §1.1, §12), the error codes and RpcError, and the method table's rows the SDK routes by.
//
// Values only: nothing here reads, writes or serves. Every other module of the SDK imports from
// this one and it imports none of them, so a limit or a method name has this one home (the
// SDK's tests check the tables against extensions/methods.json). index.js re-exports the public
// names; the others are the SDK's own.

export const PROTOCOL_VERSIONS = [1];
export const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;
export const MAX_CONCURRENT_REQUESTS = 64;
export const MAX_ARTIFACT_CHUNK_BYTES = 256 * 1024;
export const DEFAULT_ARTIFACT_CHUNK_BYTES = 64 * 1024;
/** Bytes of content this SDK puts in one frame on the bulk pipe (docs/protocol.md §8.1). */
export const BULK_FRAME_BYTES = 256 * 1024;
export const BULK_HEADER_BYTES = 8;
export const ID_SCAN_BYTES = 4096;
export const DEFAULT_SHUTDOWN_GRACE_MS = 5000;
export const INT64_MIN = -(2n ** 63n);
export const INT64_MAX = 2n ** 63n - 1n;

/** The error codes of docs/protocol.md §12. */
export const ErrorCode = Object.freeze({
  PARSE_ERROR: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL_ERROR: -32603,
  OVERLOADED: -32000,
  CANCELLED: -32001,
  DEADLINE_EXCEEDED: -32002,
  VERSION_MISMATCH: -32003,
  MESSAGE_TOO_LARGE: -32004,
  EXTENSION_EXITED: -32005,
  REENTRANT_WRITE: -32006,
  NOT_INITIALIZED: -32007,
  SHUTTING_DOWN: -32008,
  ARTIFACT_INVALID: -32009,
  NOT_FOUND: -32010,
  STORAGE_FULL: -32011,
});

/**
 * Whether a request refused with `code` may succeed if sent again unchanged (§12). overloaded
 * (-32000) counts only as conduit sends it, with data.limit or data.held_bytes_limit: a bare
 * -32000 is many libraries' answer to any handler failure and is read as not retryable.
 */
export function isRetryable(code, data) {
  if (code === ErrorCode.OVERLOADED) {
    return data !== null && typeof data === "object" && ("limit" in data || "held_bytes_limit" in data);
  }
  return [-32002, -32005, -32008, -32011].includes(code);
}

/** An error answer: throw it from a handler, or catch it from a ctx.host call. */
export class RpcError extends Error {
  constructor(code, message, data) {
    super(message);
    this.name = "RpcError";
    this.code = code;
    if (data !== undefined) this.data = data;
  }
  get retryable() {
    return isRetryable(this.code, this.data);
  }
  toJSON() {
    const e = { code: this.code, message: this.message };
    if (this.data !== undefined) e.data = this.data;
    return e;
  }
  static invalidParams(message, data) {
    return new RpcError(ErrorCode.INVALID_PARAMS, message, data);
  }
  static internal(message, data) {
    return new RpcError(ErrorCode.INTERNAL_ERROR, message, data);
  }
  static notFound(message) {
    return new RpcError(ErrorCode.NOT_FOUND, message);
  }
}

// The method table's rows this SDK needs (extensions/methods.json is the table; the SDK's tests
// fail while these differ from it). Host calls served by the handler registered under the name
// in one of their params: method -> [that params member, the capability list declaring it].
// Four of them are in-transaction calls; ingress.poll is not (docs/protocol.md §6.5).
export const BY_NAME = {
  "work_kind.trigger": ["kind", "work_kinds"],
  "recurrence.next": ["recurrence", "recurrences"],
  "dependency.filter": ["filter", "dependency_filters"],
  "emit.commit": ["emission", "emissions"],
  "ingress.poll": ["source", "ingress"],
};
// The callbacks an extension makes (docs/protocol.md §7).
export const CALLBACKS = new Set([
  "state.event", "state.events", "state.work", "operation.emit", "ingress.push",
  "artifact.open", "artifact.chunk", "artifact.close", "artifact.abort",
]);
// Names a custom method may not take ($/... aside): every method of the table but check.sleep.
export const RESERVED = new Set([...Object.keys(BY_NAME), ...CALLBACKS, "initialize", "shutdown"]);
/** The tables above, for the SDK's tests (not part of the API). */
export const _methodTables = Object.freeze({ BY_NAME, CALLBACKS, RESERVED });
