#!/usr/bin/env bash
# The README's test command: installs what is missing (Debian packages, as
# root), builds what this machine can run and runs every test with ctest.
# It says in one line which build it made:
#   no GPU visible: the host library, the programs and the CUDA code on the
#   emulated backend (every CUDA test runs emulated); no nvcc;
#   a GPU: the same and the CUDA sources for that card's architecture only
#   (tools/cuda_arch.sh), whose tests then run on the card too.
# CUDAARCHS="86;89;90" tools/test.sh compiles the CUDA sources for those
# architectures, GPU or not (CI sets CUDAARCHS=86: .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
archs=$(tools/cuda_arch.sh)
if [ -n "$archs" ]; then
  echo "test.sh: CUDA sources (where a toolkit is installed) for sm_${archs//;/, sm_}; the CUDA tests run emulated, and on the GPU where one is visible" >&2
  cuda=(-DSNUG_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$archs")
else
  echo "test.sh: no GPU visible: host and emulated CUDA only, no nvcc (CUDAARCHS=86 compiles the CUDA sources too)" >&2
  cuda=(-DSNUG_WITH_CUDA=OFF)
fi
cmake -S . -B build -G Ninja "${cuda[@]}" -DSNUG_BUILD_TESTS=ON -DSNUG_BUILD_BENCHMARKS=ON
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
