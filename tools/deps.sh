#!/usr/bin/env bash
# Installs what snug's build needs from Debian's packages, if it is missing.
# Run as root on a fresh machine (CI does); elsewhere it only checks.
#   tools/deps.sh         everything: the tests, benchmarks, fuzzers and MPI too
#   tools/deps.sh train   only what train_gpt's host build needs (tools/train.sh without a GPU)
# ccache makes rebuilds and fresh clones reuse what was compiled before.
# clang-19 and its runtimes: libFuzzer for tools/fuzz.sh, and the emulated
# backend's shared-memory checker (Clang's load/store instrumentation; Clang 14
# cannot compile snug's std::source_location).
# Open MPI starts the ranks of a data-parallel job (mpirun) and is what the
# 2-rank tests run under.
set -euo pipefail
train=(cmake ninja-build g++ ccache libfmt-dev libopenblas-dev libcli11-dev nlohmann-json3-dev)
case "${1:-all}" in
  train) wanted=("${train[@]}") ;;
  all) wanted=("${train[@]}" catch2 libbenchmark-dev clang-19 libclang-rt-19-dev libopenmpi-dev openmpi-bin) ;;
  *) echo "usage: tools/deps.sh [train|all]" >&2; exit 2 ;;
esac
# cuDNN's header-only frontend (PyPI's nvidia-cudnn-frontend wheel carries
# include/cudnn_frontend*.h), for attention on cuDNN's fused SDPA, where a CUDA
# toolkit is installed: unpacked into third_party/cudnn_frontend (ignored by
# git; the device script carries it). Optional: without it (no network, no
# pip) snug builds as before, attention on its own kernels.
cudnn_frontend_version=1.32.0
fetch_cudnn_frontend() {
  local root dir tmp
  root=$(cd "$(dirname "$0")/.." && pwd)
  dir=$root/third_party/cudnn_frontend
  [ -f "$dir/include/cudnn_frontend_version.h" ] &&
    grep -q "PATCH_VERSION $(echo $cudnn_frontend_version | cut -d. -f3)$" "$dir/include/cudnn_frontend_version.h" &&
    grep -q "MINOR_VERSION $(echo $cudnn_frontend_version | cut -d. -f2)$" "$dir/include/cudnn_frontend_version.h" && return 0
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cudnn-frontend==$cudnn_frontend_version" \
       >/dev/null 2>&1 && python3 -m zipfile -e "$tmp"/nvidia_cudnn_frontend-*.whl "$tmp/wheel" >/dev/null 2>&1 &&
     [ -f "$tmp/wheel/include/cudnn_frontend.h" ]; then
    rm -rf "$dir" && mkdir -p "$dir" && cp -r "$tmp/wheel/include" "$dir/" &&
      echo "cuDNN frontend $cudnn_frontend_version headers in third_party/cudnn_frontend"
  else
    echo "note: could not fetch cuDNN's frontend $cudnn_frontend_version from PyPI: attention runs on snug's kernels" >&2
  fi
  rm -rf "$tmp"
}
[ "${1:-all}" = all ] && fetch_cudnn_frontend

need=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for pkg in "${wanted[@]}"; do
  have "$pkg" || need+=("$pkg")
done
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "snug needs these Debian packages: ${need[*]} (run as root: apt-get install ${need[*]})" >&2
  exit 1
fi
echo "installing: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
