// Types for conduit-extension/testing (testing.js): a scripted host for an extension's tests.
import type { Extension, RpcError } from "./index.js";

/** The rules a kit test can see broken: id (as `conduit ext check` reports it) -> section. */
export const RULES: Readonly<Record<string, string>>;
/** The calls the host makes inside its transaction, under in_transaction_ms. */
export const IN_TRANSACTION: readonly string[];

/** Why a call through the scripted host did not give the result the test asked for. */
export class KitError extends Error {}
/** The extension answered an error object. */
export class Answered extends KitError {
  method: string;
  code: number;
  /** The error object's message as sent. */
  rpcMessage: string;
  data?: unknown;
}
/** No answer within the deadline the kit applied; `$/cancel` was sent. */
export class DeadlineExceeded extends KitError {
  method: string;
  code: -32002;
}
/** The extension broke a rule of the protocol. */
export class RuleBroken extends KitError {
  rule: string;
  section: string;
  detail: string;
}

/** A scripted answer: a result, an RpcError to answer as an error, or a function of the params. */
export type ScriptedAnswer = unknown | RpcError | ((params: any) => unknown | Promise<unknown>);

export interface ScriptedHostOptions {
  limits?: Partial<{ max_message_bytes: number; max_concurrent_requests: number; max_artifact_chunk_bytes: number; artifact_window: number }>;
  deadlines?: Partial<{ in_transaction_ms: number; default_ms: number; shutdown_grace_ms: number }>;
  protocolVersions?: number[];
  /** Offer the bulk pipe (a FIFO the kit reads). */
  bulkPipe?: boolean;
  answers?: Record<string, ScriptedAnswer>;
  /** Milliseconds to hold each callback of a method before answering it. */
  delays?: Record<string, number>;
  /** Milliseconds finish() waits for what is still unanswered (and a bulk close for its bytes). */
  patience?: number;
  /** A conduit-extension.toml whose name and version the handshake must state. */
  manifest?: string | null;
}

export interface Callback {
  method: string;
  params: any;
}

export interface Artifact {
  name: string;
  mediaType?: string;
  data: Buffer;
  /** The SHA-256 of `data`, lowercase hex, as the host answered it. */
  sha256: string;
  transport: "chunks" | "bulk-pipe";
  chunks: number;
}

export class PendingCall {
  readonly id: number;
  /** Send `$/cancel` for it. */
  cancel(): void;
  wait<R = any>(): Promise<R>;
}

export class ScriptedHost {
  static start(ext: Extension, options?: ScriptedHostOptions): Promise<ScriptedHost>;
  readonly handshake: { protocol_version: number; extension: { name: string; version: string }; capabilities: Record<string, unknown> };
  readonly callbacks: Callback[];
  readonly artifacts: Artifact[];
  readonly abortedArtifacts: string[];
  answers: Record<string, ScriptedAnswer>;
  /** `timeoutMs`: the host's deadline for the method by default; null for none. */
  call<R = any>(method: string, params?: unknown, options?: { timeoutMs?: number | null }): Promise<R>;
  startCall(method: string, params?: unknown, options?: { timeoutMs?: number | null }): PendingCall;
  callbacksOf(method: string): any[];
  finish(): Promise<void>;
}

/** The `name` and `version` a conduit-extension.toml states. */
export function manifestFacts(path: string): { name: string | null; version: string | null };
