// node-notes: examples/notes on the Node SDK — all four in-transaction calls, one ingress
// source and `echo`. A note is an event whose payload looks like
// {"thread": "t-42", "author": "ada", "text": "…"}.
//
// | call              | name            | what it does                                          |
// |-------------------|-----------------|-------------------------------------------------------|
// | work_kind.trigger | node-note       | one Work per thread (`thread:<t>`), started by a post |
// | recurrence.next   | node-digest     | `every <N>(s|m|h|d)` or daily `M H * * *` (UTC)       |
// | dependency.filter | node-mentions   | satisfied when the note's text mentions `@<subject>`  |
// | emit.commit       | node-annotation | one annotation record built from the payload          |
// | ingress.poll      | node-inbox      | notes from the JSON-lines file $CONDUIT_NOTES_INBOX   |
// | custom            | export          | every note (or one thread's) as a JSON-lines artifact |
//
// The names carry a `node-` prefix so that this package and examples/notes can be installed
// side by side (`make run` installs every example): the same work kind declared by two
// packages would leave it to chance which one routes its events.
//
// Invariant: the four in-transaction handlers compute their answer from their params alone, so
// the same params always get the same answer (§6) and each answers in microseconds.
import { readFile } from "node:fs/promises";
import { ErrorCode, Extension, RpcError } from "conduit-extension";

const POSTED = "node-note.posted";
const UNIT_MS = { s: 1000, m: 60000, h: 3600000, d: 86400000 };
const DAY_MS = UNIT_MS.d;
const MAX_INTERVAL_MS = 366 * DAY_MS;
const isWord = (c) => c !== undefined && /[\p{L}\p{N}_-]/u.test(c);

function threadOf(payload) {
  const t = payload && payload.thread;
  if (typeof t === "string" && t.trim()) return t.trim();
  if (Number.isInteger(t)) return String(t);
  return null;
}

/** work_kind.trigger: notes of one thread share a group; a post starts it. */
export function group(inputs) {
  const groups = [];
  const index = new Map();
  const seen = new Set();
  for (const e of inputs) {
    if (seen.has(e.id)) continue;
    seen.add(e.id);
    const thread = threadOf(e.payload);
    if (thread === null) {
      groups.push({ key: `event:${e.id}`, event_ids: [e.id], start: true });
      continue;
    }
    const key = `thread:${thread}`;
    let g = index.get(key);
    if (!g) {
      g = { key, event_ids: [], start: false };
      index.set(key, g);
      groups.push(g);
    }
    g.event_ids.push(e.id);
    g.start ||= e.kind === POSTED;
  }
  return { groups };
}

/** recurrence.next: the next firing strictly after `firedAt`, or an error naming the spec. */
export function nextAfter(spec, firedAt) {
  const f = spec.trim().split(/\s+/);
  let m;
  if (f.length === 2 && f[0] === "every" && (m = /^([0-9]+)([smhd])$/.exec(f[1]))) {
    const ms = Number(m[1]) * UNIT_MS[m[2]];
    if (ms < 1 || ms > MAX_INTERVAL_MS) throw new Error(`\`${spec}\`: the interval must be from 1 unit to 366 days`);
    return firedAt + ms;
  }
  if (f.length === 5 && f.slice(2).every((x) => x === "*") && /^[0-9]{1,2}$/.test(f[0]) && /^[0-9]{1,2}$/.test(f[1])) {
    const [minute, hour] = [Number(f[0]), Number(f[1])];
    if (minute > 59 || hour > 23) throw new Error(`\`${spec}\`: minute 0-59 and hour 0-23`);
    const at = Math.floor(firedAt / DAY_MS) * DAY_MS + hour * 3600000 + minute * 60000;
    return at > firedAt ? at : at + DAY_MS;
  }
  throw new Error(`unknown digest spec \`${spec}\`: expected \`every <N>(s|m|h|d)\` or \`M H * * *\``);
}

/** dependency.filter: whether `text` mentions `@subject` as a whole word, any letter case. */
export function mentions(text, subject) {
  const s = subject.trim().replace(/^@/, "");
  if (!s || typeof text !== "string") return false;
  const needle = "@" + s.toLowerCase();
  const t = text.toLowerCase();
  for (let at = t.indexOf(needle); at >= 0; at = t.indexOf(needle, at + 1)) {
    if (!isWord(t[at - 1]) && !isWord(t[at + needle.length])) return true;
  }
  return false;
}

/** emit.commit: one annotation record, a function of the params alone. */
export function annotate(p) {
  const payload = p.payload && typeof p.payload === "object" ? p.payload : {};
  const text = typeof payload.text === "string" ? payload.text : "";
  const words = text.split(/\s+/).filter(Boolean);
  let summary = "";
  for (const w of words) {
    if ([...summary].length + (summary ? 1 : 0) + [...w].length > 120) {
      summary = (summary || [...w].slice(0, 120).join("")) + "…";
      break;
    }
    summary += (summary ? " " : "") + w;
  }
  const tags = [];
  const given = Array.isArray(payload.tags) ? payload.tags.filter((x) => typeof x === "string") : [];
  const hashtags = [...text.matchAll(/(?<![\p{L}\p{N}_-])#([\p{L}\p{N}_-]+)/gu)].map((x) => x[1]);
  for (const tag of [...given, ...hashtags]) {
    const t = tag.trim().replace(/^#+/, "").toLowerCase();
    if (t && !tags.includes(t) && tags.length < 5) tags.push(t);
  }
  const body = { work_id: p.work_id ?? null, commit_id: p.commit_id, summary, words: words.length, tags };
  if (payload.thread !== undefined && payload.thread !== null) body.thread = payload.thread;
  return { kind: "annotation", body };
}

/** ingress.poll: complete lines of the inbox file after the cursor (a line number). */
export async function poll(path, p) {
  const cursor = p.cursor === undefined ? 0 : Number(p.cursor);
  if (!Number.isSafeInteger(cursor) || cursor < 0) throw RpcError.invalidParams(`ingress.poll: cursor \`${p.cursor}\` is not a line number`);
  if (!path) return { events: [] };
  let content;
  try {
    content = await readFile(path, "utf8");
  } catch (e) {
    if (e.code === "ENOENT") return { events: [] };
    throw e;
  }
  const lines = content.split("\n").slice(0, -1); // only complete lines
  const events = [];
  let n = cursor;
  for (; n < lines.length && events.length < p.limit; n++) {
    let note;
    try {
      note = JSON.parse(lines[n]);
    } catch {
      continue; // a line that is not a note is skipped, not retried forever
    }
    if (note === null || typeof note !== "object") continue;
    events.push({ delivery_id: String(note.delivery_id ?? `line-${n + 1}`), kind: note.kind ?? POSTED, payload: note.payload ?? note });
  }
  return n === cursor ? { events } : { events, cursor: String(n) };
}

/**
 * `export`: every note the host holds (or only those of `p.thread`), one JSON line each, as the
 * artifact `notes.jsonl`, paging through `state.events` 200 at a time. Answers what the host
 * stored (its digest), how many notes went in and which way the bytes went. A failed callback
 * fails the export with the host's error, and a cancelled request stops it; the stream is then
 * aborted and nothing is stored.
 */
export async function exportNotes(ctx, p) {
  const w = await ctx.host.artifact("notes.jsonl", { mediaType: "application/jsonl", verify: p.verify === true, jsonChunks: p.json_chunks === true });
  let notes = 0;
  try {
    for (let after;;) {
      const page = await ctx.host.events(after === undefined ? { limit: 200 } : { after_id: after, limit: 200 });
      // Cancelled (the host gave up, or is shutting down): stop, keeping nothing.
      if (ctx.cancelled) throw new RpcError(ErrorCode.CANCELLED, "export cancelled");
      for (const e of page.events) {
        if (typeof p.thread === "string" && threadOf(e.payload) !== p.thread) continue;
        await w.write(JSON.stringify(e) + "\n");
        notes++;
      }
      if (page.events.length < 200) break;
      after = page.events[page.events.length - 1].id;
    }
  } catch (e) {
    w.abort();
    throw e;
  }
  const stored = await w.finish();
  return { ...stored, notes, transport: w.isBulk ? "bulk-pipe" : "json-chunks" };
}

export function extension(inbox = process.env.CONDUIT_NOTES_INBOX || null) {
  return new Extension("node-notes", "0.1.0")
    .workKind("node-note", (ctx, p) => group(p.inputs))
    .recurrence("node-digest", (ctx, p) => {
      try {
        return { next_at_ms: nextAfter(p.spec, p.fired_at_ms) };
      } catch (e) {
        throw RpcError.invalidParams(`recurrence.next: ${e.message}`);
      }
    })
    .dependencyFilter("node-mentions", (ctx, p) => ({ satisfied: mentions(p.event.payload && p.event.payload.text, p.subject) }))
    .emission("node-annotation", (ctx, p) => ({ records: [annotate(p)] }))
    .ingress("node-inbox", (ctx, p) => poll(inbox, p))
    .method("echo", (ctx, params) => {
      if (typeof params.text !== "string") throw RpcError.invalidParams('echo needs params {"text": string}');
      return params;
    })
    .method("export", exportNotes);
}

if (import.meta.url === `file://${process.argv[1]}`) extension().run();
