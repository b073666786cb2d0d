#!/usr/bin/env bash
# Downloads the Debian 12 packages that a build on a GPU node needs and the
# node lacks (it has CUDA, PyTorch with its CUDA LibTorch, CMake and ninja,
# often no package registry) into one folder to carry there. Run it on a
# Debian 12 machine with apt, from the project root:
#   deploy/gpu_deps.sh [DIR]          # default .devdeps/ (ignored by git)
# deploy/gpu_check.sh on the node unpacks them with `dpkg -x` into a prefix.
set -euo pipefail
case ${1:-} in
  -h | --help)
    cat <<'EOF'
usage: deploy/gpu_deps.sh [DIR]

Downloads (apt-get download, no install) the Debian 12 packages a GPU node's
build lacks into DIR [.devdeps/], for deploy/gpu_check.sh to unpack there.
EOF
    exit 0 ;;
  -*) echo "gpu_deps: unknown option \"$1\" (--help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
dest=${1:-.devdeps}
mkdir -p "$dest"
cd "$dest"
apt-get download \
  libgrpc++-dev libgrpc-dev libgrpc++1.51 libgrpc29 protobuf-compiler-grpc \
  libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler \
  libabsl-dev libabsl20220623 \
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 \
  libre2-9 libc-ares2 libgoogle-glog-dev libgoogle-glog0v6 libgflags-dev libgflags2.2 \
  libgtest-dev libgmock-dev libpcre2-dev libpcre2-8-0 libunwind8 libunwind-dev \
  nlohmann-json3-dev libicu-dev libicu72 icu-devtools pkgconf pkgconf-bin libpkgconf3 \
  civetweb libcivetweb-dev libc-ares-dev libre2-dev libprometheus-cpp-push1.0 libcurl4-openssl-dev \
  2>&1 | grep -v unsandboxed | tail -1
du -sh .
