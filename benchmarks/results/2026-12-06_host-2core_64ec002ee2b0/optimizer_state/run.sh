#!/bin/sh
# 8-bit AdamW moments against fp32, bf16, the built-in corpus, one host thread
# per run (the runs were spread over two parallel streams; each is
# deterministic: the fp32 baselines reproduce 2026-12-04's to the bit).
export SNUG_HOST_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p runs
t=./build/examples/train_gpt
for state in "fp32 fp32" "int8 fp32" "int8 none"; do
  set -- $state
  $t --device host --precision bf16 --alphabet 8 --optimizer-state $1 --master $2 \
    --steps 1000 --sample 0 --out runs/a8_m$1_w$2 > /dev/null 2>&1
  for seed in 1337 1338; do
    $t --device host --precision bf16 --alphabet 32 --optimizer-state $1 --master $2 --seed $seed \
      --steps 3000 --eval-every 250 --sample 0 --out runs/c32_m$1_w$2_s$seed > /dev/null 2>&1
  done
done
# Seed 1337 again to 5000 updates (the schedule over 5000), fp32 and 8-bit with a master.
for state in "fp32 fp32" "int8 fp32"; do
  set -- $state
  $t --device host --precision bf16 --alphabet 32 --optimizer-state $1 --master $2 --seed 1337 \
    --steps 5000 --eval-every 250 --sample 0 --out runs/c32_m$1_w$2_s1337_5000 > /dev/null 2>&1
done
# Plots: python3 tools/plot_runs.py --out alphabet8.png --title ... LABEL=runs/DIR ...
