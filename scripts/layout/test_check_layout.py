"""Tests of check_layout.py on small crates written to a temporary folder."""
import os
import tempfile
import textwrap
import unittest

import check_layout


class Layout(unittest.TestCase):
    def crate(self, files):
        root = tempfile.mkdtemp(prefix="layout-")
        self.addCleanup(lambda: __import__("shutil").rmtree(root))
        with open(os.path.join(root, "Cargo.toml"), "w") as f:
            f.write("[package]\nname = \"x\"\n")
        for path, text in files.items():
            p = os.path.join(root, "src", path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(textwrap.dedent(text))
        return root

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
        body = "".join(f"pub const C{i}: u32 = {i};\n" for i in range(check_layout.MAX_LINES + 1))
        root = self.crate({"lib.rs": body})
        problems = check_layout.check(root)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("over 700", problems[0])

    def test_a_file_at_the_limit_passes(self):
        body = "".join(f"pub const C{i}: u32 = {i};\n" for i in range(check_layout.MAX_LINES))
        self.assertEqual(check_layout.check(self.crate({"lib.rs": body})), [])

    def test_a_long_file_that_says_why_passes(self):
        body = "//! Why one file: a table generated from the spec.\n" + "".join(
            f"pub const C{i}: u32 = {i};\n" for i in range(check_layout.MAX_LINES + 10))
        self.assertEqual(check_layout.check(self.crate({"lib.rs": body})), [])

    def test_this_checkout_keeps_both_rules(self):
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        self.assertEqual(check_layout.check(os.path.abspath(root)), [])


if __name__ == "__main__":
    unittest.main()
