#!/usr/bin/env python3
"""The house: one room (folder) per component, one CMake library per room,
and an include graph between rooms without cycles or upward arrows.

    house.py check ROOT   exit 1 naming every broken rule (a ctest test)
    house.py draw ROOT    print the Markdown that docs/architecture.md
                          carries between its "house" markers

Rules checked:
- every .h/.cc under a source folder belongs to a room below;
- each room's CMakeLists.txt defines exactly one library;
- every quoted #include names a file of the project (or a generated
  asympo/v1/*.pb.h) and points to the same room or to a room of a lower
  level: no cycles, no upward or sideways arrows;
- a room links the library of every room it includes (directly or through
  the libraries it links);
- tests mirror the tree: every folder under tests/ is a room's mirror or one
  of the test-only folders, and tests include only rooms and tests/testing;
- no function in the source rooms or bench/ reaches MAX_FUNCTION_LINES
  lines, counted from its signature through a constructor's initializer
  list (split it where it has parts); the same for the Python under
  deploy/, bench/ and proto/python;
- no source file of a room is over MAX_FILE_LINES lines (split it by job);
- no two files of a test program define the same name at namespace scope
  (an alias of the same type excepted): the program compiles its files a
  batch at a time as one unit (ASYMPO_UNITY_TESTS), where two helpers of
  one name clash, or one file's call quietly picks the other's overload;
- docs/architecture.md shows the current drawing.
"""
import ast
import os
import re
import sys

# Rooms, their libraries and levels: a room may include rooms of lower
# levels only. The order here is the order of the drawing.
ROOMS = [
    ("proto", "asympo_proto", 0),
    ("common", "asympo_common", 1),
    ("common/listener", "asympo_listener", 1),
    ("common/wire", "asympo_wire", 2),
    ("common/tokenizer", "asympo_tokenizer", 2),
    ("common/model", "asympo_model", 2),
    ("common/daemon", "asympo_daemon", 2),
    ("common/security", "asympo_security", 2),
    ("common/collective", "asympo_collective", 2),
    ("weight_broadcaster/nccl", "asympo_nccl", 2),
    ("weight_broadcaster", "asympo_broadcast", 3),
    ("weight_broadcaster/model_weights", "asympo_weights", 4),
    ("weight_broadcaster/weight_group", "asympo_weight_group", 4),
    ("learner_server/loss", "asympo_loss", 5),
    ("learner_server/optim", "asympo_optim", 5),
    ("learner_server/admission", "asympo_admission", 5),
    ("rollout_server/engine", "asympo_engine", 5),
    ("rollout_server/tasks", "asympo_tasks", 5),
    ("rollout_server/submit", "asympo_submit", 5),
    ("learner_server/trainer", "asympo_trainer", 6),
    ("learner_server/plan", "asympo_plan", 6),
    ("rollout_server/episodes", "asympo_episodes", 6),
    ("rollout_server", "asympo_rollout", 7),
    ("learner_server/parallel", "asympo_parallel", 7),
    ("learner_server", "asympo_learner", 8),
]
SOURCE_ROOTS = ["common", "learner_server", "rollout_server", "weight_broadcaster"]
TEST_ONLY = ["tests/testing", "tests/integration", "tests/layout", "tests/reference", "tests/bench", "tests/deploy",
             "tests/common/tokenizer/reference", "tests/fuzz", "tests/sanitizers"]
BEGIN, END = "<!-- house:begin -->", "<!-- house:end -->"
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 550
# The Python held to the same function rule (tests/ are not).
PYTHON_ROOTS = ["deploy", "bench", "proto/python"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room_of(path):
    """The deepest room holding `path` (relative to the root), or None."""
    best = None
    for name, _, _ in ROOMS:
        if path == name or path.startswith(name + "/"):
            if best is None or len(name) > len(best):
                best = name
    return best


def sources(root, top, suffixes=(".h", ".cc")):
    """The files under `top` ending in `suffixes`, relative to `root`; what
    tools and builds leave there (installs, caches, pip's build folders,
    generated protobuf modules) is not the project's source."""
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
        dirnames[:] = [d for d in dirnames if d not in ("node_modules", "__pycache__", "build")
                       and not d.endswith(".egg-info")]
        for f in sorted(filenames):
            if f.endswith(suffixes) and not f.endswith(("_pb2.py", "_pb2_grpc.py")):
                yield os.path.relpath(os.path.join(dirpath, f), root)


def includes(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return INCLUDE.findall(f.read())


def target_of_include(root, inc):
    """The room an include points to; None for third-party headers."""
    if inc.startswith("asympo/v1/"):
        return "proto"
    if os.path.exists(os.path.join(root, inc)):
        return room_of(inc) or ("tests" if inc.startswith("tests/") else None)
    return None


def cmake_libraries(root, room):
    """(libraries defined, asympo_* libraries each links) in the room's CMakeLists.txt."""
    path = os.path.join(root, room, "CMakeLists.txt")
    if not os.path.exists(path):
        return [], {}
    text = re.sub(r"#[^\n]*", "", open(path, encoding="utf-8").read())
    defined = re.findall(r"add_library\(\s*([A-Za-z0-9_]+)", text)
    links = {}
    for target, body in re.findall(r"target_link_libraries\(\s*([A-Za-z0-9_-]+)([^)]*)\)", text):
        links.setdefault(target, set()).update(re.findall(r"\b(asympo_[a-z0-9_]+)", body))
    return defined, links


def cmake_description(root, room):
    """The first sentence of the leading comment of the room's CMakeLists.txt."""
    path = os.path.join(root, room, "CMakeLists.txt")
    lines = []
    for line in open(path, encoding="utf-8"):
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    text = " ".join(lines)
    text = re.sub(r"^asympo_[a-z_]+:\s*", "", text)
    m = re.match(r"(.+?\.)(\s|$)", text)
    return (m.group(1) if m else text).rstrip(".")


def graph(root):
    """room -> set of rooms it includes, and the list of broken rules."""
    errors, edges = [], {name: set() for name, _, _ in ROOMS}
    level = {name: lvl for name, _, lvl in ROOMS}
    for top in SOURCE_ROOTS:
        for path in sources(root, top):
            room = room_of(path)
            if room is None:
                errors.append("%s belongs to no room" % path)
                continue
            for inc in includes(root, path):
                target = target_of_include(root, inc)
                if target is None:
                    if inc.startswith(tuple(r + "/" for r in SOURCE_ROOTS)):
                        errors.append('%s includes "%s", which does not exist' % (path, inc))
                    continue
                if target == "tests":
                    errors.append('%s includes the test file "%s"' % (path, inc))
                    continue
                if target == room:
                    continue
                edges[room].add(target)
                if level[target] >= level[room]:
                    errors.append('%s (room %s, level %d) includes "%s" of room %s (level %d): '
                                  "an arrow that is not downward" %
                                  (path, room, level[room], inc, target, level[target]))
    return edges, errors


def check_cmake(root, edges):
    errors = []
    lib_of = {name: lib for name, lib, _ in ROOMS}
    links = {}
    for name, lib, _ in ROOMS:
        if name == "proto":
            continue
        defined, room_links = cmake_libraries(root, name)
        if defined != [lib]:
            errors.append("%s/CMakeLists.txt defines %s; one library, %s, expected" %
                          (name, defined or "no library", lib))
        links[lib] = room_links.get(lib, set())

    def closure(lib, seen=None):
        seen = set() if seen is None else seen
        for dep in links.get(lib, ()):
            if dep not in seen:
                seen.add(dep)
                closure(dep, seen)
        return seen

    for room, targets in edges.items():
        if room == "proto":
            continue
        reach = closure(lib_of[room])
        for t in sorted(targets):
            if lib_of[t] not in reach:
                errors.append("%s includes room %s but %s does not link %s" %
                              (room, t, lib_of[room], lib_of[t]))
    return errors


def check_tests(root):
    errors = []
    rooms = {name for name, _, _ in ROOMS}
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "tests")):
        dirnames[:] = [d for d in dirnames if d not in ("node_modules", "__pycache__")]
        rel = os.path.relpath(dirpath, root)
        if rel == "tests":
            continue
        mirrored = rel[len("tests/"):]
        if mirrored not in rooms and not any(rel == t or rel.startswith(t + "/") for t in TEST_ONLY):
            if not any(r.startswith(mirrored + "/") for r in rooms):
                errors.append("%s mirrors no room" % rel)
        for f in filenames:
            if not f.endswith((".h", ".cc")):
                continue
            path = os.path.join(rel, f)
            for inc in includes(root, path):
                # Shared helpers live in tests/testing/; otherwise a helper
                # serves the tests of its own branch: its folder, the
                # folders below it and those above it.
                helper_dir = os.path.dirname(inc)
                if inc.startswith("tests/") and not inc.startswith("tests/testing/") and \
                        not (rel == helper_dir or rel.startswith(helper_dir + "/") or
                             helper_dir.startswith(rel + "/")):
                    errors.append('%s includes "%s" from another test folder' % (path, inc))
    return errors


def strip_code(text):
    """Comments, string and character literals blanked out (line breaks kept),
    in one pass so that "//" in a string or a quote in a comment is no trouble."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            k = text.find("(", i)
            delim = ")" + text[i + 2:k] + '"'
            j = text.find(delim, k)
            j = n if j < 0 else j + len(delim)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_functions(root, path):
    """(first line, length, signature) of each outermost function body of
    MAX_FUNCTION_LINES lines or more. A function is a brace block opened
    after a parameter list (not after if/for/while/switch/catch nor a lambda),
    or after a constructor's initializer list. Braces inside parentheses and
    a member's brace initializer (`: a_{1}, b_(2) {`) open no block: the
    function's body is the brace after them."""
    text = strip_code(open(os.path.join(root, path), encoding="utf-8").read())
    stack, found, line, last, parens = [], [], 1, 0, 0
    ctor_list = re.compile(r"\)\s*(noexcept\s*)?:(?!:)")
    for i, ch in enumerate(text):
        if ch == "\n":
            line += 1
        elif ch == "(":
            parens += 1
        elif ch == ")":
            parens = max(0, parens - 1)
        elif ch == "{":
            head = re.sub(r"\s+", " ", text[last:i]).strip()
            if parens or (ctor_list.search(head) and re.search(r"[\w>]$", head)):
                stack.append((line, "init", head))
                continue
            is_function = (re.search(r"\)\s*(const)?\s*(override|final)?\s*(noexcept)?$", head) or
                           (ctor_list.search(head) and re.search(r"[)}]$", head))) and \
                not re.match(r"^(if|for|while|switch|catch|else if)\b", head) and \
                not re.search(r"\[[^\]]*\]\s*\(", head)
            # A function's lines count from its signature, not its brace.
            # (blank and preprocessor lines before it are not its own).
            lead = text[last:i].split("\n")
            skip = next((k for k, l in enumerate(lead) if l.strip() and not l.lstrip().startswith("#")), 0)
            first = line - (len(lead) - 1) + skip
            stack.append((first if is_function else line, bool(is_function), head))
            last = i + 1
        elif ch == "}":
            if stack:
                start, is_function, head = stack.pop()
                if is_function == "init":
                    continue
                if is_function and not any(f is True for _, f, _ in stack):
                    length = line - start + 1
                    if length >= MAX_FUNCTION_LINES:
                        signature = ctor_list.split(head)[0] if ctor_list.search(head) else head
                        found.append((start, length, signature[-70:]))
            last = i + 1
        elif ch == ";" and not parens:
            last = i + 1
    return found


def long_python_functions(root, path):
    """(first line, length, name) of each Python function (methods and nested
    functions too) of MAX_FUNCTION_LINES lines or more, from its `def` line
    (decorators not counted) to its last line."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length >= MAX_FUNCTION_LINES:
                found.append((node.lineno, length, node.name))
    return sorted(found)


# asympo_add_gtest(NAME name SOURCES ...) in tests/CMakeLists.txt, and a
# namespace-scope definition: a type, an alias (its target kept), or a
# function, constant or variable, declared from the line's first column as
# the house style writes them.
GTEST = re.compile(r"asympo_add_gtest\(NAME (\w+)\s+SOURCES(.*?)(?:\bLIBS\b|\bLABELS\b|\))", re.S)
TOP_TYPE = re.compile(r"^(?:template\s*<[^>]*>\s*)?(?:struct|class|enum class|enum)\s+(\w+)", re.M)
TOP_ALIAS = re.compile(r"^using\s+(\w+)\s*=\s*([^;]*);", re.M)
TOP_VALUE = re.compile(r"^(?=[A-Za-z_])(?!TEST|TYPED_TEST|INSTANTIATE|MATCHER|namespace|using|return|typedef|class |struct |enum |union )"
                       r"(?:template\s*<[^>]*>\s*)?[\w:<>,*& ]*?[\w>*&][ *&]+(\w+)\s*[(=\[{;]", re.M)


def test_programs(root):
    """Each test program of several files under tests/: name -> its files."""
    text = open(os.path.join(root, "tests", "CMakeLists.txt"), encoding="utf-8").read()
    programs = {}
    for m in GTEST.finditer(text):
        files = [os.path.join("tests", f) for f in m.group(2).split() if f.endswith(".cc") and "$" not in f]
        if len(files) > 1:
            programs[m.group(1)] = files
    return programs


def top_names(root, path):
    """The names `path` defines at namespace scope, each with what it stands
    for when it is an alias (None otherwise)."""
    code = strip_code(open(os.path.join(root, path), encoding="utf-8").read())
    names = {m.group(1): None for m in TOP_TYPE.finditer(code)}
    names.update({m.group(1): None for m in TOP_VALUE.finditer(code)})
    names.update({m.group(1): " ".join(m.group(2).split()) for m in TOP_ALIAS.finditer(code)})
    return names


def check_unity_names(root):
    errors = []
    for program, files in sorted(test_programs(root).items()):
        seen = {}
        for path in files:
            for name, target in top_names(root, path).items():
                seen.setdefault(name, []).append((path, target))
        for name, defs in sorted(seen.items()):
            if len(defs) > 1 and not (defs[0][1] is not None and all(t == defs[0][1] for _, t in defs)):
                errors.append("%s: `%s` is defined in %s; the program's files compile together "
                              "(ASYMPO_UNITY_TESTS): name each helper for its file's job, or share one "
                              "from tests/testing" % (program, name, ", ".join(p for p, _ in defs)))
    return errors


def check_function_lengths(root):
    errors = []
    for top in SOURCE_ROOTS + ["bench"]:
        for path in sources(root, top):
            for start, length, head in long_functions(root, path):
                errors.append("%s:%d: a function of %d lines (%s); split it where it has parts"
                              % (path, start, length, head))
    for top in PYTHON_ROOTS:
        for path in sources(root, top, (".py",)):
            for start, length, name in long_python_functions(root, path):
                errors.append("%s:%d: a function of %d lines (%s); split it where it has parts"
                              % (path, start, length, name))
    return errors


def check_file_lengths(root):
    """No source file of a room over MAX_FILE_LINES lines: a file that grows
    past it holds more than one job."""
    errors = []
    for top in SOURCE_ROOTS:
        for path in sources(root, top):
            with open(os.path.join(root, path), encoding="utf-8") as f:
                n = sum(1 for _ in f)
            if n > MAX_FILE_LINES:
                errors.append("%s: %d lines, over %d; split it by job" % (path, n, MAX_FILE_LINES))
    return errors


def drawing(root, edges):
    lines = [BEGIN, "",
             "| room (folder) | library | level | what it holds | includes |",
             "| --- | --- | --- | --- | --- |"]
    for name, lib, lvl in ROOMS:
        what = "the `.proto` files; generated messages and stubs" if name == "proto" else \
            cmake_description(root, name)
        deps = ", ".join("`%s`" % d for d in sorted(edges[name], key=lambda r: [n for n, _, _ in ROOMS].index(r)))
        lines.append("| `%s/` | `%s` | %d | %s | %s |" % (name, lib, lvl, what, deps or "-"))
    lines += ["", "```"]
    by_level = {}
    for name, _, lvl in ROOMS:
        by_level.setdefault(lvl, []).append(name)
    for lvl in sorted(by_level, reverse=True):
        lines.append("level %d  %s" % (lvl, "   ".join("[%s]" % n for n in by_level[lvl])))
        if lvl:
            lines.append("            |  every arrow points down")
    lines += ["```", "", "Generated by `python3 tests/layout/house.py draw .` from the include",
              "graph; the `LayoutIncludeGraph` test fails when this drawing is stale.", END]
    return "\n".join(lines)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "draw"):
        print(__doc__)
        return 2
    root = os.path.abspath(sys.argv[2])
    edges, errors = graph(root)
    if sys.argv[1] == "draw":
        print(drawing(root, edges))
        return 0
    errors += check_cmake(root, edges)
    errors += check_tests(root)
    errors += check_function_lengths(root)
    errors += check_file_lengths(root)
    errors += check_unity_names(root)
    doc = open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8").read()
    m = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), doc, re.S)
    if m is None or m.group(0) != drawing(root, edges):
        errors.append("docs/architecture.md does not show the current house: "
                      "run python3 tests/layout/house.py draw . and paste it between the markers")
    for e in errors:
        print("FAIL:", e)
    if not errors:
        print("ok: %d rooms, %d arrows, all downward; one library per room; tests mirror the "
              "tree; no function of %d lines or more (C++ and Python); no source file over %d lines; "
              "no name twice at namespace scope in a test program" %
              (len(ROOMS), sum(len(v) for v in edges.values()), MAX_FUNCTION_LINES, MAX_FILE_LINES))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
