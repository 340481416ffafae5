// Ids read exactly (docs/protocol.md §1.1, §3.3) and the top-level members of a line scanned
// without parsing its values (also the head of an oversized line, §2); the strict UTF-8 decoder.
//
// Pure functions of text: what a line means, and what to answer, is the session's. Invariant:
// an id is never read through a JavaScript number, so an id beyond 2^53 keeps its digits.
import { INT64_MAX, INT64_MIN } from "./protocol.js";

const WS = new Set([0x20, 0x09, 0x0a, 0x0d]);
const SCALAR_END = new Set([0x2c, 0x7d, 0x5d, 0x20, 0x09, 0x0a, 0x0d]);

function scanString(s, i) {
  for (i += 1; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x5c) i++;
    else if (c === 0x22) return i + 1;
  }
  return -1;
}

function skipValue(s, i) {
  const c = s.charCodeAt(i);
  if (c === 0x22) return scanString(s, i);
  if (c === 0x7b || c === 0x5b) {
    let depth = 0;
    while (i < s.length) {
      const d = s.charCodeAt(i);
      if (d === 0x22) {
        i = scanString(s, i);
        if (i < 0) return -1;
        continue;
      }
      if (d === 0x7b || d === 0x5b) depth++;
      else if (d === 0x7d || d === 0x5d) {
        depth--;
        if (depth === 0) return i + 1;
      }
      i++;
    }
    return -1;
  }
  let j = i;
  while (j < s.length && !SCALAR_END.has(s.charCodeAt(j))) j++;
  return j >= s.length ? -1 : j;
}

/**
 * The top-level members of a JSON object's text, in order, as {key, raw} (raw: the value's
 * text), without parsing the values. Stops where the text ends or stops being well-formed
 * (`complete` is false then); used on whole lines and on the head of an oversized one.
 */
export function scanMembers(s) {
  const members = [];
  const ws = (k) => {
    while (k < s.length && WS.has(s.charCodeAt(k))) k++;
    return k;
  };
  let i = ws(0);
  if (s.charCodeAt(i) !== 0x7b) return { members, complete: false };
  i = ws(i + 1);
  if (s.charCodeAt(i) === 0x7d) return { members, complete: true };
  for (;;) {
    if (s.charCodeAt(i) !== 0x22) break;
    const j = scanString(s, i);
    if (j < 0) break;
    let key;
    try {
      key = JSON.parse(s.slice(i, j));
    } catch {
      break;
    }
    i = ws(j);
    if (s.charCodeAt(i) !== 0x3a) break;
    const keyOnly = { key, raw: undefined };
    i = ws(i + 1);
    if (i >= s.length) {
      members.push(keyOnly);
      break;
    }
    const end = skipValue(s, i);
    if (end < 0) {
      members.push(keyOnly);
      break;
    }
    members.push({ key, raw: s.slice(i, end) });
    i = ws(end);
    if (s.charCodeAt(i) === 0x2c) {
      i = ws(i + 1);
      continue;
    }
    if (s.charCodeAt(i) === 0x7d) return { members, complete: true };
    break;
  }
  return { members, complete: false };
}

/**
 * A valid id (§3.3) from its raw JSON text: {key, text, value} or null. `key` compares ids by
 * type and value; `text` is the id as written back; `value` is a string, a number (safe
 * integers) or a BigInt (beyond 2^53).
 */
export function readId(raw) {
  if (raw === undefined) return null;
  if (raw.charCodeAt(0) === 0x22) {
    let v;
    try {
      v = JSON.parse(raw);
    } catch {
      return null;
    }
    return { key: "s:" + v, text: JSON.stringify(v), value: v };
  }
  if (!/^-?(0|[1-9][0-9]*)$/.test(raw) || raw === "-0") return null;
  const n = BigInt(raw);
  if (n < INT64_MIN || n > INT64_MAX) return null;
  const text = n.toString();
  const value = Number.isSafeInteger(Number(n)) ? Number(n) : n;
  return { key: "n:" + text, text, value };
}

// ignoreBOM keeps a byte-order mark in the text, so that it is refused (§3.3) rather than stripped.
export const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
