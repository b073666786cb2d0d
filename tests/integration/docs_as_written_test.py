"""docs/external_generators.md as a newcomer runs it: its shell blocks,
executed literally (bash, from a directory laid out like the repository:
build/ and proto/ as the doc names them), with Debian's python3 first on
PATH as on a fresh machine; and every flag the page names checked against
the --help of the program it belongs to.

    python3 docs_as_written_test.py SOURCE_DIR BUILD_DIR PKG_DIR WORK_DIR [--flags_only]

PKG_DIR: the client package installed by the PythonPackage.install fixture,
for the example's --help.

Blocks run: section 1 (the install into a virtual environment) and section
5 (the complete example, with the flags its figures were measured with);
the example's reward must rise as "Measured" says. The shell's background
jobs are killed when a block ends. Exit 0 on success, 1 on a failed check.
"""
import json
import os
import re
import shutil
import subprocess
import sys

SRC, BUILD, PKG, WORK = (os.path.abspath(p) for p in sys.argv[1:5])
FLAGS_ONLY = "--flags_only" in sys.argv[5:]
DOC = os.path.join(SRC, "docs", "external_generators.md")

# Flags of programs that are not this project's, which the page names for
# the reader's own commands: pip's and venv's, and the engines'.
FOREIGN = {"--system-site-packages", "--no-build-isolation", "--target", "--model-path", "--weight-transfer-config"}


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)
    print("ok:", what)


def sections(text):
    """{section number: [code of each ```sh block]} for the "## N." sections."""
    out, current = {}, None
    for part in re.split(r"^(## .*)$", text, flags=re.M):
        m = re.match(r"## (\d+)\.", part)
        if m:
            current = int(m.group(1))
            continue
        if current is not None:
            out[current] = re.findall(r"```sh\n(.*?)```", part, flags=re.S)
    return out


def helps():
    """Each program's --help text, by the name the page calls it by."""
    programs = {
        "asympo-learner": [os.path.join(BUILD, "learner_server", "asympo-learner"), "--help"],
        "asympo-submit": [os.path.join(BUILD, "rollout_server", "asympo-submit"), "--help"],
        "asympo-rollout": [os.path.join(BUILD, "rollout_server", "asympo-rollout"), "--help"],
        "external_generator.py": ["/usr/bin/python3",
                                  os.path.join(SRC, "proto", "python", "examples",
                                               "external_generator.py"), "--help"],
    }
    out = {}
    for name, cmd in programs.items():
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, PYTHONPATH=PKG))
        out[name] = r.stdout
    return out


def flag_in(flag, text):
    return re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", text) is not None


def check_flags(text):
    """A flag on a command line belongs to that line's program; one in the
    prose to any of the project's programs."""
    known = helps()
    for name, h in known.items():
        check("--help" in h or "usage" in h.lower() or "Flags" in h,
              "%s --help answers (%d bytes)" % (name, len(h)))
    wrong = []
    for line in text.splitlines():
        for flag in sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", line))):
            if flag in FOREIGN:
                continue
            owner = next((n for n in known if n in line), None)
            if owner is not None and flag_in(flag, known[owner]):
                continue
            if owner is None and any(flag_in(flag, h) for h in known.values()):
                continue
            wrong.append("%s (%s)" % (flag, owner or "no program on the line") + ": " + line.strip())
    check(not wrong, "every flag the page names is in its program's --help%s"
          % ("".join("\n  " + w for w in wrong)))


def own_network():
    """The command prefix that runs a block in a network namespace of its
    own (root, unshare and ip present), else none: the page's default ports
    (50051, 50052, 9464) are then its own, whatever the tests beside it
    bind, as on a newcomer's machine."""
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"],
                           capture_output=True, text=True)
    return ["unshare", "-n"] if probe.returncode == 0 else []


def run_block(code, cwd, timeout):
    """Runs `code` with bash from `cwd`, Debian's python3 first on PATH, in
    a network namespace of its own where it can have one (own_network);
    background jobs are killed at the end. Returns (rc, output)."""
    isolate = own_network()
    script = "set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + code
    if isolate:
        script = "ip link set lo up\n" + script
    env = dict(os.environ, PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""))
    env.pop("PYTHONPATH", None)
    r = subprocess.run(isolate + ["bash", "-c", script], cwd=cwd, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    print("ran %s" % ("in a network namespace of its own" if isolate else
                      "in the machine's network namespace (no unshare -n here)"))
    return r.returncode, r.stdout


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    with open(DOC) as f:
        text = f.read()
    check_flags(text)
    if FLAGS_ONLY:
        return
    blocks = sections(text)
    # The repository as the page sees it: proto/ (the client's sources, built
    # in place as pip does) and build/ (this build tree).
    root = os.path.join(WORK, "repo")
    os.makedirs(root)
    for name, target in (("proto", os.path.join(SRC, "proto")), ("build", BUILD)):
        os.symlink(target, os.path.join(root, name))
    check(len(blocks.get(1, [])) == 1, "section 1 has one shell block")
    rc, out = run_block(blocks[1][0], root, 600)
    print(out[-3000:])
    check(rc == 0, "section 1's install runs as written")
    check(len(blocks.get(5, [])) == 1, "section 5 has one shell block")
    rc, out = run_block(blocks[5][0], root, 900)
    print(out[-4000:])
    check(rc == 0, "section 5's example runs as written")
    summary = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    check(len(summary) == 1, "the example printed its summary")
    first, last = summary[0]["first_reward"], summary[0]["last_reward"]
    check(last >= first + 0.5, "the reward rose from %.2f to %.2f in %d rounds (the page: 0.06 "
          "to 0.95 in 400)" % (first, last, summary[0]["rounds"]))


if __name__ == "__main__":
    main()
