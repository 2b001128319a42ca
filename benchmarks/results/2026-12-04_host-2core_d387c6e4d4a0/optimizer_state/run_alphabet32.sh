#!/bin/sh
mkdir -p runs
for seed in 1337 1338; do
  for state in "fp32 fp32" "bf16 fp32" "bf16 none"; do
    set -- $state
    out=runs/c32_m$1_w$2_s$seed
    ./build/examples/train_gpt --device host --precision bf16 --alphabet 32 --optimizer-state $1 --master $2 --seed $seed \
      --steps 3000 --eval-every 250 --sample 0 --out $out > $out.log 2>&1
    echo "$seed $1 $2 rc $?"
  done
done
