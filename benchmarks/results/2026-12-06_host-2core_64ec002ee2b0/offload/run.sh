#!/bin/sh
# Optimizer offload's cost on the host backend: the default small model, bf16,
# accumulation 8 and 32, with and without --offload, alternated twice.
for round in 1 2; do
  for accum in 8 32; do
    for off in "" "--offload"; do
      ./build/examples/train_gpt --device host --precision bf16 --accum $accum --steps 12 --eval-every 1000 \
        --sample 0 $off --out offload/runs/a${accum}${off:+_offload}_r$round > /dev/null 2>&1
      echo "round $round accum $accum ${off:-device} rc $?"
    done
  done
done
