#!/usr/bin/env bash
# The README's test command: installs what is missing (Debian packages, as
# root), builds everything — the CUDA sources too when a CUDA toolkit is
# installed — and runs every test with ctest. CUDA tests report "skipped"
# where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
cmake -S . -B build -G Ninja
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
