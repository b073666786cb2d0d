"""Builds the asympo-rl package. The gRPC stubs are generated here, at
build time, from the repository's proto/asympo/v1/*.proto with grpc_tools
(Debian's python3-grpc-tools), into asympo_rl/v1/; none are checked in."""
import os
import re
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.dirname(HERE)  # proto/, which holds asympo/v1/*.proto
PROTOS = ["asympo/v1/rollout.proto", "asympo/v1/learner.proto", "asympo/v1/weight_broadcast.proto",
          "asympo/v1/weight_group.proto", "asympo/v1/environment.proto"]


def generate(out_dir):
    from grpc_tools import protoc

    pkg = os.path.join(out_dir, "asympo_rl", "v1")
    os.makedirs(pkg, exist_ok=True)
    missing = [p for p in PROTOS if not os.path.exists(os.path.join(PROTO_ROOT, p))]
    if missing:
        raise SystemExit("asympo-rl: %s not found under %s; build from the repository's proto/python"
                         % (", ".join(missing), PROTO_ROOT))
    tmp = tempfile.mkdtemp(prefix="asympo_protoc")
    args = ["protoc", "-I" + PROTO_ROOT, "--python_out=" + tmp, "--grpc_python_out=" + tmp]
    if protoc.main(args + [os.path.join(PROTO_ROOT, p) for p in PROTOS]) != 0:
        raise SystemExit("asympo-rl: protoc failed on " + " ".join(PROTOS))
    for name in sorted(os.listdir(os.path.join(tmp, "asympo", "v1"))):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(tmp, "asympo", "v1", name)) as f:
            text = f.read()
        # The stubs import each other as asympo.v1.*; here they live in asympo_rl.v1.
        text = re.sub(r"^from asympo\.v1 import", "from asympo_rl.v1 import", text, flags=re.M)
        with open(os.path.join(pkg, name), "w") as f:
            f.write(text)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write('"""gRPC stubs of asympo.v1, generated at build time from proto/."""\n')
    shutil.rmtree(tmp, ignore_errors=True)


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        generate(self.build_lib)


setup(cmdclass={"build_py": BuildWithStubs})
