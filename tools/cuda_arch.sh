#!/usr/bin/env bash
# Prints the CUDA architectures to compile for, for tools/train.sh and
# tools/test.sh: $CUDAARCHS when set (CMake's own variable: "86;89;90" builds
# for those three), else the architecture of every GPU nvidia-smi sees ("90"
# on an H100), else nothing (no GPU visible).
set -euo pipefail
if [ -n "${CUDAARCHS:-}" ]; then
  echo "$CUDAARCHS"
  exit 0
fi
command -v nvidia-smi >/dev/null 2>&1 || exit 0
caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' | sort -u |
       paste -sd';' || true)
echo "$caps"
