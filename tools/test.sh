#!/usr/bin/env bash
# The README's test command: installs what is missing (Debian packages, as
# root), builds everything — the CUDA sources too when a CUDA toolkit is
# installed, for one architecture: the GPU's (tools/cuda_arch.sh), else sm_86
# — and runs every test with ctest. CUDA tests report "skipped" where there
# is no GPU (they run emulated everywhere).
# All three default architectures: CUDAARCHS="86;89;90" tools/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
archs=$(tools/cuda_arch.sh)
archs=${archs:-86}
echo "test.sh: CUDA code (where a toolkit is installed) for sm_${archs//;/, sm_}" >&2
cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES="$archs" -DSNUG_BUILD_TESTS=ON -DSNUG_BUILD_BENCHMARKS=ON
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
