#!/usr/bin/env bash
# The README's main-job command: installs what is missing, builds train_gpt
# for what this machine can run, and runs it; arguments go to train_gpt (try
# --help). It says in one line which build it made:
#   no GPU visible: the host program (g++ only, no nvcc), in build-host/;
#   a GPU: CUDA code for that card's architecture only, in build/ (shared
#   with tools/test.sh).
# CUDAARCHS="86;89;90" tools/train.sh builds CUDA code for those cards, GPU or
# not (tools/cuda_arch.sh); SNUG_TRAIN_BUILD=host forces the host program.
set -euo pipefail
cd "$(dirname "$0")/.."
archs=$(tools/cuda_arch.sh)
if [ "${SNUG_TRAIN_BUILD:-}" = host ] || [ -z "$archs" ] || ! command -v nvcc >/dev/null 2>&1; then
  tools/deps.sh train
  build=build-host
  echo "train.sh: building the host program in $build/ (no GPU visible: no CUDA code compiled)" >&2
  cmake -S . -B "$build" -G Ninja -DSNUG_WITH_CUDA=OFF -DSNUG_BUILD_TESTS=OFF -DSNUG_BUILD_BENCHMARKS=OFF >/dev/null
else
  tools/deps.sh
  build=build
  echo "train.sh: building train_gpt in $build/ with CUDA code for sm_${archs//;/, sm_}" >&2
  cmake -S . -B "$build" -G Ninja -DCMAKE_CUDA_ARCHITECTURES="$archs" >/dev/null
fi
cmake --build "$build" --target train_gpt -j"$(nproc)" >/dev/null
exec "$build/examples/train_gpt" "$@"
