#!/usr/bin/env python3
"""The source layout's two rules, checked (docs/ARCHITECTURE.md, "Layout rules"):

1. No import circle between files. Within each crate, file A depends on file B when A names an
   item of B: in a `use` (braces expanded) or in an inline path that starts with `crate::`,
   `super::`, `self::` or the name of one of A's child modules. A parent (lib.rs, mod.rs) that
   declares and re-exports its children depends on them, so a child that imports from its parent
   closes a circle: what both need belongs in a leaf module both import.
2. No source file over 700 lines unless its first lines say why (a line starting with
   `//! Why one file:`).

Test code does not count: `#[cfg(test)] mod tests { … }` to the end of a file, files named
tests.rs, folders named tests, and binaries (src/bin/). Exit 1 with a list of what breaks a
rule, 0 when nothing does.

Usage: scripts/layout/check_layout.py [ROOT]   (ROOT: the workspace, default: this checkout)
"""
import os
import re
import sys

MAX_LINES = 700
REASON = "//! Why one file:"


def crate_roots(root):
    """Every `src` folder of a crate in the workspace (a folder holding Cargo.toml and src/)."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("target", ".git", "node_modules", "fuzz", "templates")]
        if "Cargo.toml" in files and os.path.isdir(os.path.join(d, "src")):
            out.append(os.path.join(d, "src"))
    return sorted(out)


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[0] == "bin":
        return None
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def source_files(src):
    files = {}
    for d, dirs, names in os.walk(src):
        dirs[:] = [x for x in dirs if x != "tests"]
        for n in names:
            if n.endswith(".rs") and n != "tests.rs":
                p = os.path.join(d, n)
                m = module_of(src, p)
                if m is not None:
                    files[m] = p
    return files


def strip_tests(text):
    text = re.sub(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{.*", "", text, flags=re.S)
    text = re.sub(r"#\[cfg\(test\)\]\s*(#\[[^\]]*\]\s*)*mod\s+\w+\s*;", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def expand_use(tree):
    """`a::{b, c::{d, e}}` → [`a::b`, `a::c::d`, `a::c::e`]."""
    tree = tree.strip()
    m = re.match(r"^(.*?)::\{(.*)\}$", tree, re.S)
    if not m:
        return [re.sub(r"\s+as\s+\w+$", "", tree)]
    prefix, body = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for p in (p.strip() for p in parts):
        if p:
            out += [prefix if e == "self" else f"{prefix}::{e}" for e in expand_use(p)]
    return out


def resolve(mods, here, path):
    """The file (module) a path names an item of, or None if it leaves the crate."""
    parts = path.split("::")
    if parts[0] == "crate":
        base, parts = [], parts[1:]
    elif parts[0] == "self":
        base, parts = list(here), parts[1:]
    elif parts[0] == "super":
        base = list(here)
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
    elif tuple(list(here) + [parts[0]]) in mods:
        base = list(here)
    else:
        return None
    full = base + parts
    for i in range(len(full), -1, -1):
        if tuple(full[:i]) in mods:
            return tuple(full[:i])
    return None


def dependencies(files):
    mods = set(files)
    deps = {}
    for m, p in files.items():
        text = strip_tests(open(p, encoding="utf-8").read())
        found = set()
        paths = [x for u in re.finditer(r"\buse\s+([^;]+);", text) for x in expand_use(u.group(1))]
        paths += [u.group(1) for u in re.finditer(
            r"\b((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)+)", text)]
        for path in paths:
            r = resolve(mods, m, path.strip())
            if r is not None and r != m:
                found.add(r)
        deps[m] = found
    return deps


def circles(deps):
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in deps:
        if start in index:
            continue
        work = [(start, iter(sorted(deps[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in deps:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(deps[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def check(root):
    problems = []
    for src in crate_roots(root):
        files = source_files(src)
        deps = dependencies(files)
        name = lambda m: os.path.relpath(files[m], root)
        for comp in circles(deps):
            lines = [f"import circle in {os.path.relpath(src, root)}:"]
            for a in comp:
                for b in sorted(deps[a]):
                    if b in comp:
                        lines.append(f"    {name(a)} uses {name(b)}")
            problems.append("\n".join(lines))
        for m, p in sorted(files.items()):
            text = open(p, encoding="utf-8").read()
            code = strip_tests(text)
            n = code.count("\n")
            if n > MAX_LINES and REASON not in text[:4000]:
                problems.append(
                    f"{os.path.relpath(p, root)}: {n} lines of non-test code, over {MAX_LINES}: "
                    f"split it along its seams, or say why it is one file in a `{REASON}` line at its top")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    root = os.path.abspath(root)
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"layout: {len(problems)} problem(s); docs/ARCHITECTURE.md, \"Layout rules\", says why")
        return 1
    print(f"layout: no import circle, no file over {MAX_LINES} lines without a reason "
          f"({len(crate_roots(root))} crates)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
