#!/usr/bin/env bash
# The README's main-job command: installs what is missing, builds train_gpt and
# runs it; arguments go to train_gpt (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build --target train_gpt -j"$(nproc)" >/dev/null
exec build/examples/train_gpt "$@"
