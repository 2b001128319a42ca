#!/bin/sh
# One process of micro-batch 8 against 2 MPI ranks of micro-batch 4 (plain
# data parallel, then ZeRO-1), alternated twice, on this 2-core machine:
# a process uses both cores' threads, a rank one (SNUG_HOST_THREADS is set to
# cores / ranks under mpirun). As root, Open MPI needs the two variables.
T=${1:-build/examples/train_gpt}
A="--device host --layers 4 --heads 4 --channels 128 --seq 64 --steps 16 --eval-every 1000 --eval-batches 1 --sample 0 --warmup 2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for round in 1 2; do
  $T $A --batch 8 --out one$round
  mpirun -np 2 $T $A --batch 4 --out two$round
  mpirun -np 2 $T $A --batch 4 --zero --out zero$round
done
