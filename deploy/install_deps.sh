#!/usr/bin/env bash
# Installs the Debian 12 packages ASymPO-RL builds and tests against, when
# any of them is missing. Safe to run repeatedly; does nothing when all are
# present. Needs root (or sudo) only when something must be installed.
#
#   deploy/install_deps.sh            # build + test dependencies
#   deploy/install_deps.sh --build    # only what building the programs needs
#                                     # (deploy/container/Containerfile.cpu)
#   deploy/install_deps.sh --check    # list what is missing, exit 1 if any
set -euo pipefail

mode=${1:-}
case $mode in
  "" | --build | --check) ;;
  -h | --help)
    cat <<'EOF'
usage: deploy/install_deps.sh [--build | --check | --help]

Installs with apt-get (as root, or through sudo) the Debian 12 packages that
ASymPO-RL builds and tests against and that are missing; does nothing when
all are present.
  (none)    build and test dependencies
  --build   only what building the programs needs
  --check   list what is missing and exit 1 if anything is; installs nothing
EOF
    exit 0 ;;
  *) echo "install_deps: unknown option \"$mode\" (expected --build, --check or --help)" >&2; exit 2 ;;
esac

# The programs: compilers, CMake, and the libraries they link.
packages=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libtorch-dev libgloo-dev prometheus-cpp-dev
  libgoogle-glog-dev libgflags-dev
  libopenblas0-pthread libpcre2-dev nlohmann-json3-dev libicu-dev
)
if [[ $mode != --build ]]; then
  # The tests: GoogleTest, the Python tests' packages, and the real servers
  # the deployment tests start (Prometheus, Alertmanager, Slurm, munge).
  packages+=(
    libgtest-dev libgmock-dev
    python3 python3-torch prometheus python3-grpcio python3-grpc-tools python3-matplotlib
    prometheus-alertmanager slurm-wlm munge
    # ip: a doc's example runs on its default ports in a network namespace
    # of its own (DocsAsWritten), beside tests that bind ports.
    iproute2
    # The Python client package (proto/python): built by pip without build
    # isolation, CRC-32C in C code.
    python3-pip python3-venv python3-setuptools python3-wheel python3-numpy python3-crc32c
    # deploy/run_fuzz.sh: clang with libFuzzer and its sanitizer runtimes,
    # llvm-symbolizer for the reports. deploy/run_sanitizers.sh uses GCC's
    # runtimes, which come with build-essential.
    clang-14 libclang-rt-14-dev llvm-14
  )
  # Installed from Debian only when no other copy is on the PATH (a vendor's
  # kubectl or a newer Node.js stays): kubectl renders the Kubernetes
  # manifests, node and npm validate them.
  command -v kubectl >/dev/null || packages+=(kubernetes-client)
  command -v npm >/dev/null || packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ $mode == --check ]]; then
  if ((${#missing[@]})); then
    echo "missing: ${missing[*]}"
    exit 1
  fi
  echo "all dependencies present"
  exit 0
fi

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then
    sudo_cmd=(sudo)
  else
    echo "install_deps: need root to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
