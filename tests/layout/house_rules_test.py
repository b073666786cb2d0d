#!/usr/bin/env python3
"""The house check's own rules on small made-up files (ctest LayoutRules):
function length counted from the signature, through a constructor's
initializer list with braces in it; the Python function rule; the file
length rule; one name at namespace scope per test program."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import house  # noqa: E402


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text)


def body(n, indent="  "):
    return "".join("%sx += %d;\n" % (indent, i) for i in range(n))


class FunctionLengthTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def lengths(self, text):
        write(self.root, "a.cc", text)
        return [(start, length) for start, length, _ in house.long_functions(self.root, "a.cc")]

    def test_a_constructor_counts_its_initializer_list_with_braces(self):
        # 3 lines of signature and list, 76 of body, the closing brace: 80.
        init = ("Foo::Foo(int a)\n"
                "    : a_{a}, h_(Make({0.1, 0.3})),\n"
                "      b_(Make(\"x\", {1, 2})) {\n")
        self.assertEqual(self.lengths("#include <x>\n\n" + init + body(76) + "}\n"), [(3, 80)])
        self.assertEqual(self.lengths(init + body(75) + "}\n"), [])

    def test_a_function_counts_from_its_signature_not_its_brace(self):
        sig = "absl::Status Long(\n    int a,\n    int b)\n{\n"
        self.assertEqual(self.lengths("// c\n" + sig + body(75) + "}\n"), [(2, 80)])

    def test_braces_inside_a_call_and_lambdas_open_no_function(self):
        text = ("void F() {\n  Call({1, 2}, [&] {\n" + body(40, "    ") + "  });\n" + body(40) + "}\n")
        self.assertEqual(self.lengths(text), [(1, 84)])

    def test_control_blocks_are_not_functions(self):
        text = "int x = 0;\nnamespace n {\nstruct S {\n  void G() {\n" + body(10) + "  }\n};\n}\n"
        self.assertEqual(self.lengths(text), [])


class PythonAndFileRulesTest(unittest.TestCase):
    def test_a_long_python_function_is_named(self):
        with tempfile.TemporaryDirectory() as root:
            lines = "".join("    x = %d\n" % i for i in range(79))
            write(root, "deploy/a.py", "import os\n\n\n@staticmethod\ndef long():\n" + lines +
                  "\n\ndef short():\n    pass\n")
            self.assertEqual(house.long_python_functions(root, "deploy/a.py"), [(5, 80, "long")])

    def test_a_file_over_the_mark_is_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            write(tmp, "common/big.cc", "int x;\n" * 551)
            write(tmp, "common/fine.cc", "int x;\n" * 550)
            errors = house.check_file_lengths(tmp)
            self.assertEqual(len(errors), 1)
            self.assertIn("common/big.cc: 551 lines", errors[0])


class UnityNamesTest(unittest.TestCase):
    """A test program's files compile together: a helper name two of them
    define is named, an alias of the same type twice is not, and neither are
    the TEST macros, names inside functions, or a program's only file."""

    def errors(self, files):
        with tempfile.TemporaryDirectory() as root:
            write(root, "tests/CMakeLists.txt",
                  "asympo_add_gtest(NAME two_tests\n  SOURCES\n    a_test.cc\n    b_test.cc\n"
                  "    ${PROJECT_SOURCE_DIR}/bench/x.cc\n  LIBS x)\n"
                  "asympo_add_gtest(NAME one_test SOURCES c_test.cc LIBS x)\n")
            for name, text in files.items():
                write(root, "tests/" + name, text)
            return house.check_unity_names(root)

    def test_a_helper_defined_in_two_files_is_named(self):
        a = ("namespace {\nv1::Batch Batch(int n) {\n  return {};\n}\n"
             "const absl::Time kT0 = absl::Now();\nstruct Rx {};\n}  // namespace\n")
        b = ("namespace {\n// Batch(int n, int m) below\nv1::Batch Batch(int n, int m) {\n  int kT0 = 1;\n"
             "  return {};\n}\nclass Rx : public Base {\n};\nTEST(B, Batch) {}\n}  // namespace\n")
        errors = self.errors({"a_test.cc": a, "b_test.cc": b, "c_test.cc": a})
        self.assertEqual(len(errors), 2, errors)
        self.assertIn("two_tests: `Batch` is defined in tests/a_test.cc, tests/b_test.cc", errors[0])
        self.assertIn("two_tests: `Rx`", errors[1])

    def test_the_same_alias_twice_is_allowed_a_different_one_is_not(self):
        a = "using Tensors = std::vector<at::Tensor>;\nusing Id = int;\nusing ::x::Y;\n"
        b = "using Tensors = std::vector< at::Tensor >;\nusing Id = long;\nusing ::x::Y;\n"
        errors = self.errors({"a_test.cc": a, "b_test.cc": b.replace("< at::Tensor >", "<at::Tensor>"),
                              "c_test.cc": ""})
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("`Id`", errors[0])


if __name__ == "__main__":
    unittest.main()
