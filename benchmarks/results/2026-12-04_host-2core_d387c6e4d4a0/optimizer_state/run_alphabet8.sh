#!/bin/sh
mkdir -p runs
# Lean optimizer state vs PyTorch's AdamW layout, bf16, built-in corpus.
for alphabet in 8 32; do
  for state in "fp32 fp32" "bf16 fp32" "bf16 none"; do
    set -- $state
    out=runs/a${alphabet}_m$1_w$2
    ./build/examples/train_gpt --device host --precision bf16 --alphabet $alphabet --optimizer-state $1 --master $2 \
      --steps 1000 --sample 0 --out $out > $out.log 2>&1
    echo "$alphabet $1 $2 rc $?"
  done
done
