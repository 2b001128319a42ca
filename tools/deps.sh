#!/usr/bin/env bash
# Installs what snug's build needs from Debian's packages, if it is missing.
# Run as root on a fresh machine (CI does); elsewhere it only checks.
#   tools/deps.sh         everything: the tests, benchmarks, fuzzers and MPI too
#   tools/deps.sh train   only what train_gpt needs (tools/train.sh)
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
