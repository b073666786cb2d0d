#!/usr/bin/env python3
"""What the executables load at start (their DT_NEEDED entries, readelf):

- asympo-tokenize loads neither LibTorch nor prometheus-cpp nor gRPC: a tool
  that only tokenizes starts in milliseconds;
- every executable that loads LibTorch names libstdc++ before it, so that
  libstdc++'s own std::filesystem functions are bound rather than the copies
  some LibTorch builds export (cmake/AsympoDependencies.cmake).

    linked_libraries.py ASYMPO_TOKENIZE ASYMPO_LEARNER ASYMPO_ROLLOUT
"""
import re
import shutil
import subprocess
import sys


def needed(binary):
    out = subprocess.run(["readelf", "-d", binary], check=True, capture_output=True, text=True)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out.stdout)


def main():
    if shutil.which("readelf") is None:
        print("SKIP: readelf (binutils) is missing")
        return 77
    tokenize, daemons = sys.argv[1], sys.argv[2:]
    failures = []
    libs = needed(tokenize)
    for banned in ("libtorch", "libc10", "libprometheus", "libgrpc"):
        if any(l.startswith(banned) for l in libs):
            failures.append("asympo-tokenize loads %s: %s" % (banned, libs))
    for binary in daemons:
        libs = needed(binary)
        torch = [i for i, l in enumerate(libs) if l.startswith(("libtorch", "libc10"))]
        stdcxx = [i for i, l in enumerate(libs) if l.startswith("libstdc++")]
        if not torch:
            failures.append("%s does not load LibTorch: %s" % (binary, libs))
        elif not stdcxx or stdcxx[0] > torch[0]:
            failures.append("%s names libstdc++ after LibTorch: %s" % (binary, libs))
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("ok: asympo-tokenize loads %d libraries, none of LibTorch, prometheus-cpp or gRPC; "
              "the daemons name libstdc++ before LibTorch" % len(needed(tokenize)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
