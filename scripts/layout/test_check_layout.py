"""Tests of check_layout.py on small crates, Python packages and JavaScript modules written to a
temporary folder."""
import os
import tempfile
import textwrap
import unittest

import check_layout


class Layout(unittest.TestCase):
    def tree(self, files):
        """A temporary folder holding `files` (path -> text, dedented)."""
        root = tempfile.mkdtemp(prefix="layout-")
        self.addCleanup(lambda: __import__("shutil").rmtree(root))
        for path, text in files.items():
            p = os.path.join(root, path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(textwrap.dedent(text))
        return root

    def crate(self, files, docs=True):
        """A crate of `files` (path under src/ -> text); with `docs`, a file without `//!` lines
        gets one first."""
        tree = {"Cargo.toml": "[package]\nname = \"x\"\n"}
        for path, text in files.items():
            text = textwrap.dedent(text)
            tree["src/" + path] = text if not docs or "//!" in text else "//! The module.\n" + text
        return self.tree(tree)

    def test_a_one_way_layout_passes(self):
        root = self.crate({
            "lib.rs": "mod a;\nmod b;\npub use a::A;\npub use b::B;\n",
            "a.rs": "pub struct A;\n",
            "b.rs": "use crate::a::A;\npub struct B(A);\n",
        })
        self.assertEqual(check_layout.check(root), [])

    def test_two_siblings_that_use_each_other_are_a_circle(self):
        root = self.crate({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::b::B;\npub struct A;\n",
            "b.rs": "pub struct B;\nfn f() -> crate::a::A { crate::a::A }\n",
        })
        problems = check_layout.check(root)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("src/a.rs uses src/b.rs", problems[0])
        self.assertIn("src/b.rs uses src/a.rs", problems[0])

    def test_a_child_that_imports_from_its_re_exporting_parent_is_a_circle(self):
        root = self.crate({
            "lib.rs": "mod core;\npub use core::Core;\n",
            "core/mod.rs": "mod ops;\npub struct Core;\npub use ops::op;\n",
            "core/ops.rs": "use super::{Core};\npub fn op(_: &Core) {}\n",
        })
        problems = check_layout.check(root)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("src/core/ops.rs uses src/core/mod.rs", problems[0])

    def test_braced_and_nested_uses_are_followed(self):
        root = self.crate({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::{b::{self, B}};\npub struct A;\n",
            "b.rs": "use crate::{a::A as Renamed};\npub struct B;\n",
        })
        self.assertEqual(len(check_layout.check(root)), 1)

    def test_test_code_is_not_counted(self):
        root = self.crate({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "pub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}\n",
            "b.rs": "use crate::a::A;\npub struct B;\n",
            "b/tests.rs": "use crate::a::A;\n",
        })
        self.assertEqual(check_layout.check(root), [])

    def test_a_long_file_needs_a_reason(self):
        body = "".join(f"pub const C{i}: u32 = {i};\n" for i in range(check_layout.MAX_LINES))
        root = self.crate({"lib.rs": body})
        problems = check_layout.check(root)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("over 700", problems[0])

    def test_a_file_at_the_limit_passes(self):
        body = "".join(f"pub const C{i}: u32 = {i};\n" for i in range(check_layout.MAX_LINES - 1))
        self.assertEqual(check_layout.check(self.crate({"lib.rs": body})), [])

    def test_a_long_file_that_says_why_passes(self):
        body = "//! Why one file: a table generated from the spec.\n" + "".join(
            f"pub const C{i}: u32 = {i};\n" for i in range(check_layout.MAX_LINES + 10))
        self.assertEqual(check_layout.check(self.crate({"lib.rs": body})), [])

    def test_a_rust_file_without_its_module_doc_is_named(self):
        root = self.crate({
            "lib.rs": "//! The crate.\nmod a;\nmod b;\n",
            "a.rs": "#![allow(dead_code)]\n\n//! A, with an inner attribute first.\npub struct A;\n",
            "b.rs": "// a plain comment is not a module doc\npub struct B;\n",
        }, docs=False)
        problems = check_layout.check(root)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("src/b.rs: does not open with a module doc", problems[0])

    # ---- Python and JavaScript ----------------------------------------------------------------

    def test_a_python_package_in_layers_passes(self):
        root = self.tree({
            "pkg/__init__.py": '"""The package."""\nfrom .session import Server\nfrom .wire import encode\n',
            "pkg/wire.py": '"""Bytes."""\nimport json\n\ndef encode(x):\n    return json.dumps(x)\n',
            "pkg/session.py": '"""Serving."""\nfrom . import wire\nfrom .wire import encode\n',
            "app.py": '#!/usr/bin/env python3\n# a comment first\n"""An app."""\nfrom pkg import Server\n',
        })
        self.assertEqual(check_layout.check(root), [])

    def test_python_siblings_that_import_each_other_are_a_circle(self):
        root = self.tree({
            "pkg/__init__.py": '"""The package."""\n',
            "pkg/a.py": '"""A."""\nfrom .b import B\n',
            "pkg/b.py": '"""B."""\n\ndef f():\n    from . import a  # a late import is a dependency too\n',
        })
        problems = check_layout.check(root)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("pkg/a.py uses pkg/b.py", problems[0])
        self.assertIn("pkg/b.py uses pkg/a.py", problems[0])

    def test_a_python_module_that_imports_its_re_exporting_package_is_a_circle(self):
        for how in ("from . import Server\n", "from pkg import Server\n", "import pkg.wire\n"):
            root = self.tree({
                "pkg/__init__.py": '"""The package."""\nfrom .session import Server\nfrom .wire import encode\n',
                "pkg/wire.py": '"""Bytes."""\n' + how,
                "pkg/session.py": '"""Serving."""\nclass Server:\n    pass\n',
            })
            problems = check_layout.check(root)
            self.assertEqual(len(problems), 1, (how, problems))
            self.assertIn("pkg/wire.py uses pkg/__init__.py", problems[0])

    def test_a_python_file_without_a_module_docstring_is_named(self):
        root = self.tree({
            "tool.py": "# only a comment\nimport os\n",
            "tests/test_tool.py": "import tool\n",  # tests keep the doc rule too
            "ok.py": '"""Documented."""\n',
            "broken.py": '"""Documented."""\ndef (:\n',
        })
        problems = sorted(check_layout.check(root))
        self.assertEqual(len(problems), 3, problems)
        self.assertIn("broken.py: cannot be read as Python", problems[0])
        self.assertIn("tests/test_tool.py: does not open with a module doc", problems[1])
        self.assertIn("tool.py: does not open with a module doc: start it with a module docstring",
                      problems[2])

    def test_a_long_python_file_needs_a_reason_in_its_docstring(self):
        body = "".join(f"C{i} = {i}\n" for i in range(check_layout.MAX_LINES))
        root = self.tree({
            "at_limit.py": '"""At the limit."""\n' + body[:body.rindex("C")],
            "long.py": '"""Long."""\n' + body,
            "why.py": '"""Long, and says why.\n\nWhy one file: a table.\n"""\n' + body + body,
            "tests/long_helper.py": '"""A test helper."""\n' + body,
            "test_long.py": '"""A test."""\n' + body,
        })
        problems = check_layout.check(root)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("long.py: 701 lines of non-test code, over 700", problems[0])

    def test_javascript_modules_in_layers_pass(self):
        root = self.tree({
            "sdk/index.js": "// The SDK.\nexport { a } from \"./lib/a.js\";\nexport * from \"./lib/b.js\";\n",
            "sdk/lib/a.js": "/**\n * A.\n */\nimport { b } from \"./b.js\";\nexport const a = b;\n",
            "sdk/lib/b.js": "#!/usr/bin/env node\n// B.\nimport { readFileSync } from \"node:fs\";\nexport const b = 1;\n",
            "app.mjs": "// An app.\nimport { a } from \"./sdk/index.js\";\n",
        })
        self.assertEqual(check_layout.check(root), [])

    def test_javascript_modules_that_import_each_other_are_a_circle(self):
        root = self.tree({
            "index.js": "// The SDK.\nexport { a } from \"./lib/a.js\";\n",
            "lib/a.js": "// A.\nimport {\n  b,\n} from \"./b.js\";\n// import { x } from \"../index.js\" (a comment)\nexport const a = 1;\n",
            "lib/b.js": "// B.\nexport async function b() {\n  return import(\"../index.js\");\n}\n",
        })
        problems = check_layout.check(root)
        self.assertEqual(len(problems), 1, problems)
        for edge in ("index.js uses lib/a.js", "lib/a.js uses lib/b.js", "lib/b.js uses index.js"):
            self.assertIn(edge, problems[0])
        self.assertNotIn("lib/a.js uses index.js", problems[0])

    def test_a_javascript_file_without_an_opening_comment_is_named(self):
        root = self.tree({
            "a.js": "import x from \"./b.js\"; // a comment after code\n",
            "b.mjs": "\n\n/* B, after blank lines. */\nexport default 1;\n",
            "c.cjs": "/* */\nmodule.exports = {};\n",
        })
        problems = sorted(check_layout.check(root))
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("a.js: does not open with a module doc: start it with a comment", problems[0])
        self.assertIn("c.cjs: does not open with a module doc", problems[1])

    def test_a_long_javascript_file_needs_a_reason_in_its_opening_comment(self):
        body = "".join(f"export const C{i} = {i};\n" for i in range(check_layout.MAX_LINES))
        root = self.tree({
            "at_limit.js": "// At the limit.\n" + body[:body.rindex("export")],
            "long.js": "// Long.\n" + body,
            "why.mjs": "// Long, and says why.\n//\n// Why one file: a table.\n" + body + body,
            "block.js": "/**\n * Long, and says why.\n * Why one file: a table.\n */\n" + body,
            "late.js": "// Long.\n" + body + "// Why one file: said too late, not in the opening comment.\n",
            "test/long_helper.mjs": "// A test helper.\n" + body,
            "long.test.mjs": "// A test.\n" + body,
        })
        problems = sorted(check_layout.check(root))
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("late.js: 702 lines of non-test code, over 700", problems[0])
        self.assertIn("long.js: 701 lines of non-test code, over 700", problems[1])

    def test_target_and_node_modules_are_not_read(self):
        root = self.tree({
            "target/packages/x/big.py": "import os\n",
            "node_modules/dep/index.js": "module.exports = 1;\n",
            ".hidden/tool.py": "import os\n",
        })
        self.assertEqual(check_layout.check(root), [])

    def test_this_checkout_keeps_every_rule(self):
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        self.assertEqual(check_layout.check(os.path.abspath(root)), [])


if __name__ == "__main__":
    unittest.main()
