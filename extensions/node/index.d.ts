// Types of conduit-extension (hand-written; index.js and the modules of lib/ are the
// implementation). The params and results are those of docs/protocol.md §6–§8.

export declare const PROTOCOL_VERSIONS: number[];
export declare const MAX_MESSAGE_BYTES: number;
export declare const MAX_CONCURRENT_REQUESTS: number;
export declare const MAX_ARTIFACT_CHUNK_BYTES: number;
export declare const DEFAULT_ARTIFACT_CHUNK_BYTES: number;
/** Bytes of content in one frame on the host's bulk pipe (docs/protocol.md §8.1): 262144. */
export declare const BULK_FRAME_BYTES: number;

/** The error codes of docs/protocol.md §12. */
export declare const ErrorCode: {
  readonly PARSE_ERROR: -32700;
  readonly INVALID_REQUEST: -32600;
  readonly METHOD_NOT_FOUND: -32601;
  readonly INVALID_PARAMS: -32602;
  readonly INTERNAL_ERROR: -32603;
  readonly OVERLOADED: -32000;
  readonly CANCELLED: -32001;
  readonly DEADLINE_EXCEEDED: -32002;
  readonly VERSION_MISMATCH: -32003;
  readonly MESSAGE_TOO_LARGE: -32004;
  readonly EXTENSION_EXITED: -32005;
  readonly REENTRANT_WRITE: -32006;
  readonly NOT_INITIALIZED: -32007;
  readonly SHUTTING_DOWN: -32008;
  readonly ARTIFACT_INVALID: -32009;
  readonly NOT_FOUND: -32010;
  readonly STORAGE_FULL: -32011;
};

/** Whether `code` (with its `data`) is retryable; a -32000 without data.limit is not. */
export declare function isRetryable(code: number, data?: unknown): boolean;

/** An error answer: throw it from a handler; ctx.host calls reject with it. */
export declare class RpcError extends Error {
  constructor(code: number, message: string, data?: unknown);
  readonly code: number;
  readonly data?: unknown;
  readonly retryable: boolean;
  toJSON(): { code: number; message: string; data?: unknown };
  static invalidParams(message: string, data?: unknown): RpcError;
  static internal(message: string, data?: unknown): RpcError;
  static notFound(message: string): RpcError;
}

/** A request id: a string, a number (safe integers) or a bigint (beyond 2^53). */
export type RequestId = string | number | bigint;

export interface Event {
  id: number;
  source: string;
  delivery_id: string;
  kind: string;
  payload: unknown;
  accepted_at_ms: number;
}
export interface NewEvent {
  delivery_id: string;
  kind: string;
  payload: unknown;
}
export interface TriggerParams {
  kind: string;
  inputs: Event[];
}
export interface TriggerGroup {
  key: string;
  event_ids: number[];
  start?: boolean;
}
export interface TriggerResult {
  groups: TriggerGroup[];
}
export interface RecurrenceParams {
  recurrence: string;
  timer_id: number;
  spec: string;
  fired_at_ms: number;
}
export interface RecurrenceResult {
  next_at_ms: number | null;
}
export interface FilterParams {
  filter: string;
  wait_id: number;
  subject: string;
  event: Event;
}
export interface FilterResult {
  satisfied: boolean;
}
export interface CommitParams {
  emission: string;
  commit_id: string;
  work_id?: number;
  payload: unknown;
}
export interface Record {
  kind: string;
  body: unknown;
}
export interface CommitResult {
  records: Record[];
}
export interface IngressPollParams {
  source: string;
  cursor?: string;
  limit: number;
}
export interface IngressPollResult {
  events: NewEvent[];
  cursor?: string;
}
export interface EventsQuery {
  source?: string;
  after_id?: number;
  limit?: number;
}
export interface Work {
  id: number;
  kind: string;
  key: string;
  state: "open" | "ready" | "done";
  event_ids: number[];
}
export interface EmitResult {
  emission_id: number;
  commit_id: string;
}
export interface PushResult {
  event_id: number;
  duplicate: boolean;
}
export interface ArtifactStored {
  artifact_id: string;
  size: number;
  /** The SHA-256 the host computed of what it stored, lower-case hex. */
  sha256: string;
}
export interface ArtifactOptions {
  mediaType?: string;
  size?: number;
  chunkBytes?: number;
  timeoutMs?: number;
  /** Hash the bytes here too and send the digest at close, for the host to check (end to end). */
  verify?: boolean;
  /** Send base64 chunks even where the host offers the bulk pipe. */
  jsonChunks?: boolean;
}
export interface CallOptions {
  /** Give up after this many ms (deadline_exceeded, and $/cancel to the host). Default: the
   *  request's remaining time, else no limit. */
  timeoutMs?: number;
}

/** The callbacks of docs/protocol.md §7 and §8. */
export declare class Host {
  call<R = unknown>(method: string, params?: object, opts?: CallOptions): Promise<R>;
  event(eventId: number, opts?: CallOptions): Promise<Event>;
  events(query?: EventsQuery, opts?: CallOptions): Promise<{ events: Event[] }>;
  work(workId: number, opts?: CallOptions): Promise<Work>;
  emit(emission: string, payload: unknown, workId?: number | null, opts?: CallOptions): Promise<EmitResult>;
  push(source: string, deliveryId: string, kind: string, payload: unknown, opts?: CallOptions): Promise<PushResult>;
  artifact(name: string, opts?: ArtifactOptions): Promise<ArtifactWriter>;
  storeArtifact(
    name: string,
    data: Uint8Array | string,
    opts?: { mediaType?: string; timeoutMs?: number; verify?: boolean; sha256?: string; jsonChunks?: boolean },
  ): Promise<ArtifactStored>;
}

/** An open artifact stream: write, then finish (or abort). Its bytes go as base64 chunks, or as
 *  frames on the host's bulk pipe when the host offered it and granted this stream a tag. */
export declare class ArtifactWriter {
  readonly name: string;
  readonly streamId: string;
  /** Bytes per chunk, or per frame on the bulk pipe (BULK_FRAME_BYTES). */
  readonly chunkBytes: number;
  readonly window: number;
  readonly size: number;
  /** Whether the bytes go on the host's bulk pipe (docs/protocol.md §8.1) rather than as chunks. */
  readonly isBulk: boolean;
  /** Whether the bytes are hashed here, to be sent at close (verify, or an older host). */
  readonly isHashing: boolean;
  write(data: Uint8Array | string): Promise<void>;
  /** `sha256`: the content's digest if already known, sent for the host to check. */
  finish(opts?: { sha256?: string }): Promise<ArtifactStored>;
  abort(): void;
}

/** What a handler gets besides its params. */
export declare class Ctx {
  readonly id: RequestId;
  readonly method: string;
  /** performance.now() time past which the host stops waiting (from params._meta.remaining_ms), or null. */
  readonly deadline: number | null;
  /** Aborted when the host cancels this request (the SDK has answered `cancelled` already). */
  readonly signal: AbortSignal;
  /** Aborted when the host asks the extension to shut down. */
  readonly shutdownSignal: AbortSignal;
  readonly cancelled: boolean;
  /** The host's initialize params. */
  readonly init: { [key: string]: unknown };
  readonly host: Host;
  /** Milliseconds left before the host's deadline (never below 0), or null. */
  remaining(): number | null;
  /** Wait up to `ms`; resolves true if cancelled first. */
  sleep(ms: number): Promise<boolean>;
  /** Log to stderr. */
  log(...args: unknown[]): void;
}

export type Handler<P, R> = (ctx: Ctx, params: P) => R | Promise<R>;

export declare class Extension {
  constructor(name: string, version: string, opts?: { protocolVersions?: number[] });
  readonly name: string;
  readonly version: string;
  workKind(name: string, fn: Handler<TriggerParams, TriggerResult>): this;
  declareWorkKind(name: string): this;
  recurrence(name: string, fn: Handler<RecurrenceParams, RecurrenceResult>): this;
  dependencyFilter(name: string, fn: Handler<FilterParams, FilterResult>): this;
  emission(name: string, fn: Handler<CommitParams, CommitResult>): this;
  ingress(name: string, fn: Handler<IngressPollParams, IngressPollResult>): this;
  declareIngress(name: string): this;
  method<P = { [key: string]: unknown }, R = unknown>(name: string, fn: Handler<P, R>): this;
  capabilities(): { [key: string]: unknown };
  serves(method: string): boolean;
  /** Serve stdin/stdout until shutdown or stdin EOF, then exit 0. */
  run(opts?: { stdin?: StreamLike; stdout?: StreamLike & { write(text: string): unknown }; exit?: (code: number) => void }): unknown;
}

/** The top-level members of a JSON object's text, without parsing their values. */
export declare function scanMembers(text: string): { members: { key: string; raw?: string }[]; complete: boolean };
/** A valid request id from its raw JSON text, or null (docs/protocol.md §3.3). */
export declare function readId(raw: string | undefined): { key: string; text: string; value: RequestId } | null;

/** What run() needs of a stream (process.stdin / process.stdout by default). */
export interface StreamLike {
  on(event: string, listener: (...args: any[]) => void): unknown;
}
