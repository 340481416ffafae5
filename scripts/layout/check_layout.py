#!/usr/bin/env python3
"""The source layout's rules, checked (docs/ARCHITECTURE.md, "Layout rules"), for Rust, Python
and JavaScript files alike:

1. No import circle between files. Within each crate, file A depends on file B when A names an
   item of B: in a `use` (braces expanded) or in an inline path that starts with `crate::`,
   `super::`, `self::` or the name of one of A's child modules. A parent (lib.rs, mod.rs) that
   declares and re-exports its children depends on them, so a child that imports from its parent
   closes a circle: what both need belongs in a leaf module both import. A Python file depends
   on the files its imports load: a relative import names a module of its package (`from . import
   x`, `from .x import y`), an absolute one a module found beside the file or from the top of
   its package, and loads every package on the way (`import a.b` runs a/__init__.py, so a
   module that imports its own package by name depends on its __init__.py). A JavaScript file
   (.js, .mjs, .cjs) depends on the files its relative specifiers name: `import … from "./x.js"`,
   `export … from "./x.js"`, `import "./x.js"`, `import("./x.js")`, `require("./x.js")`.
2. No source file over 700 lines of non-test code unless its module doc says why, in a line
   starting with `Why one file:` (Rust: `//! Why one file:` in its first lines; Python: a line of
   the module docstring; JavaScript: a line of the comment that opens the file).
3. Every Python and JavaScript file, and every Rust file of a crate's src/, opens with its module
   doc: Rust `//!` lines, Python a module docstring (after an optional shebang and comments),
   JavaScript a comment (`//` lines or a `/* */` block, after an optional shebang).

Test code does not count for rules 1 and 2: `#[cfg(test)] mod tests { … }` to the end of a file,
files named tests.rs, folders named tests, test or fixtures, Python files named test_*.py or
*_test.py, JavaScript files named test.mjs or *.test.mjs (and .js/.cjs), and Rust binaries
(src/bin/). Folders named target, node_modules or starting with a dot are not read. Exit 1 with a
list of what breaks a rule, 0 when nothing does.

Usage: scripts/layout/check_layout.py [ROOT]   (ROOT: the workspace, default: this checkout)
"""
import ast
import os
import re
import sys

MAX_LINES = 700
REASON = "//! Why one file:"
#: How a module doc says why its file is over MAX_LINES (Python, JavaScript): a line starting so.
REASON_WORDS = "Why one file:"
#: Folders never read, besides those starting with a dot.
SKIP_DIRS = ("target", "node_modules")
PY = (".py",)
JS = (".js", ".mjs", ".cjs")
TEST_DIRS = ("tests", "test", "fixtures")


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


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
        text = strip_tests(read_text(p))
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


def rust_doc_problem(path, text):
    """A Rust file must open with `//!` lines (inner attributes and blank lines may come first)."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#!["):
            continue
        if line.startswith("//!"):
            return None
        break
    return f"{path}: does not open with a module doc: start it with `//!` lines (what it is for, what it does not do, its invariant)"


# ---- Python and JavaScript --------------------------------------------------------------------


def is_test_script(rel):
    """Test code among Python and JavaScript files: by folder or by name."""
    parts = rel.split(os.sep)
    if any(p in TEST_DIRS for p in parts[:-1]):
        return True
    name = parts[-1]
    stem, ext = os.path.splitext(name)
    if ext in PY:
        return stem.startswith("test_") or stem.endswith("_test") or stem == "conftest"
    return stem == "test" or stem.endswith(".test") or stem.endswith(".spec")


def script_files(root):
    """Every Python and JavaScript file below root, relative path -> absolute path."""
    out = {}
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("."))
        for n in names:
            if n.endswith(PY + JS):
                p = os.path.join(d, n)
                out[os.path.relpath(p, root)] = p
    return out


def py_doc(text):
    """The module docstring, None without one; raises SyntaxError if the file does not parse."""
    tree = ast.parse(text)
    return ast.get_docstring(tree, clean=True), tree


def js_doc(text):
    """The comment that opens a JavaScript file (after an optional shebang), or None."""
    lines = text.split("\n")
    i = 1 if lines and lines[0].startswith("#!") else 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines):
        return None
    first = lines[i].strip()
    if first.startswith("/*"):
        rest = "\n".join(lines[i:])
        end = rest.find("*/")
        if end < 0:
            return None
        body = [re.sub(r"^\s*(/\*+|\*(?!/))?\s?", "", x) for x in rest[:end].split("\n")]
        return "\n".join(body).strip() or None
    body = []
    while i < len(lines) and lines[i].strip().startswith("//"):
        body.append(re.sub(r"^//+\s?", "", lines[i].strip()))
        i += 1
    return "\n".join(body).strip() or None


def says_why(doc):
    return doc is not None and any(l.strip().startswith(REASON_WORDS) for l in doc.splitlines())


def py_module(path):
    """The file a Python module path names (folder/a/b -> a/b.py or a/b/__init__.py), or None."""
    if os.path.isfile(path + ".py"):
        return path + ".py"
    init = os.path.join(path, "__init__.py")
    return init if os.path.isfile(init) else None


def py_top(path):
    """The folder a Python file's package hierarchy is imported from (the file's own folder when
    it is not in a package)."""
    d = os.path.dirname(path)
    while os.path.isfile(os.path.join(d, "__init__.py")):
        d = os.path.dirname(d)
    return d


def py_dependencies(path, tree):
    """The files a Python file's imports load (see the module doc, rule 1)."""
    here = os.path.dirname(path)
    roots = [here, py_top(path)]
    found = set()

    def absolute(name):
        parts = name.split(".")
        for r in roots:
            for i in range(1, len(parts) + 1):
                f = py_module(os.path.join(r, *parts[:i]))
                if f is None:
                    break
                found.add(f)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                absolute(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                absolute(node.module)
                base = None
                for r in roots:
                    f = py_module(os.path.join(r, *node.module.split(".")))
                    if f is not None and f.endswith("__init__.py"):
                        base = os.path.dirname(f)
                        break
            else:
                base = here
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
                if node.module:
                    base = os.path.join(base, *node.module.split("."))
                f = py_module(base)
                if f is not None and (node.module or any(py_module(os.path.join(base, a.name)) is None
                                                         for a in node.names)):
                    found.add(f)
            if base is not None:
                for a in node.names:
                    f = py_module(os.path.join(base, a.name))
                    if f is not None:
                        found.add(f)
    return found


_JS_IMPORT = re.compile(
    r"^\s*(?:import|export)\b[^;'\"`]*?\bfrom\s*(['\"])(\.{1,2}/[^'\"]+)\1"  # import/export … from
    r"|^\s*import\s*(['\"])(\.{1,2}/[^'\"]+)\3"  # import "./x.js"
    r"|\b(?:import|require)\s*\(\s*(['\"])(\.{1,2}/[^'\"]+)\5\s*\)",  # import("./x.js")
    re.M)


def js_dependencies(path, text):
    """The files a JavaScript file's relative specifiers name (see the module doc, rule 1)."""
    here = os.path.dirname(path)
    found = set()
    for m in _JS_IMPORT.finditer(text):
        spec = m.group(2) or m.group(4) or m.group(6)
        base = os.path.normpath(os.path.join(here, spec))
        for f in (base, base + ".js", base + ".mjs", base + ".cjs", os.path.join(base, "index.js")):
            if os.path.isfile(f):
                found.add(f)
                break
    return found


def check_scripts(root):
    """Rules 1 to 3 for the Python and JavaScript files below root."""
    problems = []
    deps = {}
    for rel, p in script_files(root).items():
        text = read_text(p)
        test = is_test_script(rel)
        if rel.endswith(PY):
            try:
                doc, tree = py_doc(text)
            except SyntaxError as e:
                problems.append(f"{rel}: cannot be read as Python ({e.msg}, line {e.lineno})")
                continue
            form = "a module docstring"
            if not test:
                deps[p] = py_dependencies(p, tree)
        else:
            doc = js_doc(text)
            form = "a comment (`//` lines or a `/* */` block)"
            if not test:
                deps[p] = js_dependencies(p, text)
        if not doc:
            problems.append(f"{rel}: does not open with a module doc: start it with {form} saying "
                            f"what it is for, what it does not do, its invariant")
        n = text.count("\n")
        if not test and n > MAX_LINES and not says_why(doc):
            problems.append(
                f"{rel}: {n} lines of non-test code, over {MAX_LINES}: split it along its seams, "
                f"or say why it is one file in a `{REASON_WORDS}` line of its module doc")
    graph = {p: {d for d in ds if d in deps and d != p} for p, ds in deps.items()}
    for comp in circles(graph):
        lines = ["import circle:"]
        for a in comp:
            for b in sorted(graph[a]):
                if b in comp:
                    lines.append(f"    {os.path.relpath(a, root)} uses {os.path.relpath(b, root)}")
        problems.append("\n".join(lines))
    return problems


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
            text = read_text(p)
            problem = rust_doc_problem(os.path.relpath(p, root), text)
            if problem:
                problems.append(problem)
            code = strip_tests(text)
            n = code.count("\n")
            if n > MAX_LINES and REASON not in text[:4000]:
                problems.append(
                    f"{os.path.relpath(p, root)}: {n} lines of non-test code, over {MAX_LINES}: "
                    f"split it along its seams, or say why it is one file in a `{REASON}` line at its top")
    return problems + check_scripts(root)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    root = os.path.abspath(root)
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"layout: {len(problems)} problem(s); docs/ARCHITECTURE.md, \"Layout rules\", says why")
        return 1
    print(f"layout: no import circle, no file over {MAX_LINES} lines without a reason, every file "
          f"with its module doc ({len(crate_roots(root))} crates, "
          f"{len(script_files(root))} Python and JavaScript files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
