#!/bin/sh
# Data parallel under mpirun: train_gpt on 2 ranks of micro-batch 2 against
# one process of micro-batch 4 (the same tokens, the same updates within
# rounding), rank 0 alone reports; ZeRO-1 (--zero) against plain data
# parallel, and offloaded (--zero --offload) against on the device; then, on the host: 2-rank resumes (plain and ZeRO-1) equal to the
# uninterrupted runs, ZeRO-1 files resumed without it and back, a resume with
# another global batch refused naming both layouts, one with the same global
# batch on another rank count continuing the run (ZeRO-1 resharding), --plan
# for one rank of a ZeRO-1 job, and
# the faults: a rank that hangs
# (the other names it after --rank-timeout) and a rank that dies (mpirun
# names it), each leaving the last saved state loadable and resumable.
#   data_parallel.sh TRAIN_GPT MPIEXEC DIR host|cuda
# Prints "all ok" at the end.
set -eu
exe=$1 mpiexec=$2 dir=$3 device=$4
here=$(dirname "$0")
rm -rf "$dir"
mkdir -p "$dir"
# Open MPI refuses to run as root (CI) without these, and 2 ranks on a
# one-core machine without oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail() { echo "FAIL: $*"; exit 1; }
base="--device $device --layers 2 --heads 2 --channels 32 --seq 16 --sample 0"
small="$base --accum 2 --eval-batches 2"
every3="--eval-every 3"

# 1. Two ranks of 2 sequences equal one process of 4: bf16 (fp32 master).
#    The ranks add the per-sequence gradients in another order: the losses
#    agree within 16-bit rounding (2e-3 relative), the weights on average
#    within 1e-4 (AdamW may flip an update's sign where a gradient is ~0).
"$exe" $small $every3 --precision bf16 --batch 4 --steps 6 --out "$dir/one" --save-model "$dir/one.bin" > "$dir/one.log"
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 6 --out "$dir/two" --save-model "$dir/two.bin" \
  > "$dir/two.log" 2>&1 || { cat "$dir/two.log"; fail "2 ranks did not train"; }
grep -q "data parallel: 2 ranks over MPI" "$dir/two.log" || fail "the 2-rank run does not say it is data parallel"
[ "$(grep -c '^summary' "$dir/two.log")" = 1 ] || fail "more than one rank printed a summary"
python3 "$here/compare_runs.py" "$dir/one/metrics.jsonl" "$dir/two/metrics.jsonl" --rel 2e-3 \
  --models "$dir/one.bin" "$dir/two.bin" --mean-abs 1e-4
echo "ok: 2 ranks x 2 = 1 x 4"

# 2. ZeRO-1 (--zero): each rank keeps half of the optimizer's state, and the
#    updates are plain data parallel's (the norm is summed in another order:
#    equal within 1e-5; measured equal here).
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 6 --zero --out "$dir/zero" \
  --save-model "$dir/zero.bin" > "$dir/zero.log" 2>&1 || { cat "$dir/zero.log"; fail "ZeRO-1 did not train"; }
grep -q "ZeRO-1: each rank keeps 1/2 of the optimizer's state" "$dir/zero.log" || fail "ZeRO-1 is not reported"
python3 "$here/compare_runs.py" "$dir/two/metrics.jsonl" "$dir/zero/metrics.jsonl" --rel 1e-5 \
  --models "$dir/two.bin" "$dir/zero.bin" --mean-abs 1e-6
echo "ok: ZeRO-1 = plain data parallel"
# ... and with each rank's shard offloaded to its host (--offload): the
# device shards' updates bit for bit.
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 6 --zero --offload --out "$dir/zero_off" \
  --save-model "$dir/zero_off.bin" > "$dir/zero_off.log" 2>&1 || { cat "$dir/zero_off.log"; fail "ZeRO-1 offloaded did not train"; }
python3 "$here/compare_runs.py" "$dir/zero/metrics.jsonl" "$dir/zero_off/metrics.jsonl" --rel 0 \
  --models "$dir/zero.bin" "$dir/zero_off.bin" --mean-abs 0
echo "ok: ZeRO-1 offloaded = ZeRO-1 on the device"
[ "$device" = host ] || { echo "all ok"; exit 0; }

# 3. Stopped after update 3 and resumed on 2 ranks: the uninterrupted run's numbers exactly.
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 6 --stop-after 3 --out "$dir/resumed" > /dev/null 2>&1
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 6 --resume "$dir/resumed/state.snug" \
  --out "$dir/resumed" > "$dir/resumed.log" 2>&1 || { cat "$dir/resumed.log"; fail "2-rank resume"; }
python3 "$here/compare_runs.py" "$dir/two/metrics.jsonl" "$dir/resumed/metrics.jsonl" --rel 0
echo "ok: 2-rank resume"

# ... with ZeRO-1 too (the file holds the state gathered whole); and a ZeRO-1
# file resumes without --zero, a plain one with it.
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 6 --zero --stop-after 3 \
  --out "$dir/zero_resumed" > /dev/null 2>&1
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 6 --zero \
  --resume "$dir/zero_resumed/state.snug" --out "$dir/zero_resumed" > "$dir/zero_resumed.log" 2>&1 ||
  { cat "$dir/zero_resumed.log"; fail "ZeRO-1 resume"; }
python3 "$here/compare_runs.py" "$dir/zero/metrics.jsonl" "$dir/zero_resumed/metrics.jsonl" --rel 0
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 7 --resume "$dir/zero/state.snug" \
  > "$dir/unsharded.log" 2>&1 || { cat "$dir/unsharded.log"; fail "a ZeRO-1 state resumed without --zero"; }
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 7 --zero --resume "$dir/two/state.snug" \
  > "$dir/sharded.log" 2>&1 || { cat "$dir/sharded.log"; fail "a plain state resumed with --zero"; }
# ZeRO-1 offloaded, stopped and resumed: the uninterrupted run's numbers.
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 6 --zero --offload --stop-after 3 \
  --out "$dir/zero_off_resumed" > /dev/null 2>&1
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 6 --zero --offload \
  --resume "$dir/zero_off_resumed/state.snug" --out "$dir/zero_off_resumed" > "$dir/zero_off_resumed.log" 2>&1 ||
  { cat "$dir/zero_off_resumed.log"; fail "ZeRO-1 offloaded resume"; }
python3 "$here/compare_runs.py" "$dir/zero_off/metrics.jsonl" "$dir/zero_off_resumed/metrics.jsonl" --rel 0
echo "ok: ZeRO-1 resume, either way, and offloaded"
# 4. The 2-rank state (2 x 2 x accumulation 2) in one process: as 1 x 2 x 2
#    refused (another global batch), naming both layouts, nothing written; as
#    1 x 4 x 2 or 1 x 2 x 4 (the same rows) it continues the 2-rank run's
#    updates within rounding; and a one-process state resumes on 2 ranks with
#    --zero (each loading its shard).
before=$(cksum < "$dir/two/state.snug")
set +e
"$exe" $small $every3 --precision bf16 --batch 2 --steps 8 --resume "$dir/two/state.snug" --out "$dir/two" > "$dir/refused.log" 2>&1
code=$?
set -e
[ $code = 2 ] || { cat "$dir/refused.log"; fail "resume with another global batch: exit $code, not 2"; }
grep -q "the saved run took 8 sequences per update (2 ranks x micro-batch 2 x accumulation 2) but this one takes 4 (1 rank x micro-batch 2 x accumulation 2)" "$dir/refused.log" ||
  { cat "$dir/refused.log"; fail "message"; }
[ "$(cksum < "$dir/two/state.snug")" = "$before" ] || fail "a refused resume changed the state file"
# (From the 2-rank state after 6 updates to 9: on 2 ranks, then one process.)
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 9 --resume "$dir/two/state.snug" \
  --out "$dir/two9" > /dev/null 2>&1
# Validation reads eval-batches windows of B rows: 4 of 2 are the 2 of 4 the ranks read.
for layout in "--batch 4 --accum 2 --eval-batches 2" "--batch 2 --accum 4 --eval-batches 4"; do
  "$exe" $base $every3 --precision bf16 $layout --steps 9 --resume "$dir/two/state.snug" --out "$dir/relaid" \
    > "$dir/relaid.log" 2>&1 || { cat "$dir/relaid.log"; fail "the 2-rank state in one process ($layout)"; }
  grep -q "resumed from .* at update 6" "$dir/relaid.log" || { cat "$dir/relaid.log"; fail "not resumed at 6"; }
  python3 "$here/compare_runs.py" "$dir/two9/metrics.jsonl" "$dir/relaid/metrics.jsonl" --from 7 --rel 2e-3
  rm -rf "$dir/relaid"
done
"$exe" $small $every3 --precision bf16 --batch 4 --steps 6 --stop-after 3 --out "$dir/one3" > /dev/null
"$mpiexec" -np 2 "$exe" $small $every3 --precision bf16 --batch 2 --steps 6 --zero --resume "$dir/one3/state.snug" \
  --out "$dir/one3" > "$dir/resharded.log" 2>&1 || { cat "$dir/resharded.log"; fail "a one-process state on 2 ZeRO-1 ranks"; }
python3 "$here/compare_runs.py" "$dir/one/metrics.jsonl" "$dir/one3/metrics.jsonl" --from 4 --rel 2e-3
echo "ok: another global batch refused; the same one on another rank count continues (and reshards)"

# 5. --plan under mpirun plans one rank of the job (rank 0 prints it): with
#    --zero --offload, GPT-2 1558M's state sharded on each rank's host
#    (10.19 GiB of host memory against 20.34 for one process); in one
#    process --zero is refused, naming why.
"$mpiexec" -np 2 "$exe" --device host --model 1558M --vocab 50257 --seq 1024 --batch 1 --accum 64 --precision bf16 \
  --zero --offload --plan > "$dir/plan.log" 2>&1 || { cat "$dir/plan.log"; fail "--plan under mpirun"; }
[ "$(grep -c '^model: .*offloaded to the host, sharded over 2 ranks (ZeRO-1)$' "$dir/plan.log")" = 1 ] ||
  { cat "$dir/plan.log"; fail "the plan is not one rank's of 2 ZeRO-1 ranks, printed once"; }
grep -q '^host memory *10.19 GiB' "$dir/plan.log" || { cat "$dir/plan.log"; fail "a rank's host memory"; }
set +e
"$exe" --device host --model 1558M --vocab 50257 --seq 1024 --batch 1 --accum 64 --precision bf16 --zero --plan \
  > "$dir/plan1.log" 2>&1
code=$?
set -e
[ $code = 2 ] && grep -q "this job has one; start it with mpirun -np N" "$dir/plan1.log" ||
  { cat "$dir/plan1.log"; fail "--zero --plan in one process: exit $code"; }
echo "ok: --plan for one rank of a ZeRO-1 job"

# Starts a long 2-rank run saving every 5 updates, waits for its first save,
# then sends rank 1 the signal $2 and waits for the job to end; its output
# goes to $1.log.
fault() {
  out=$1 signal=$2
  "$mpiexec" -np 2 "$exe" $small --batch 2 --steps 100000 --eval-every 100000 --save-every 5 --rank-timeout 3 \
    --out "$out" > "$out.log" 2>&1 &
  job=$!
  i=0
  until [ -f "$out/state.snug" ]; do
    i=$((i + 1))
    [ $i -lt 600 ] || { kill $job 2> /dev/null; cat "$out.log"; fail "no state saved within 60 s"; }
    sleep 0.1
  done
  rank1=""
  for p in $(pgrep -f -- "--out $out\$" || true); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK=1$'; then rank1=$p; fi
  done
  [ -n "$rank1" ] || { kill $job 2> /dev/null; fail "rank 1's process not found"; }
  kill "-$signal" "$rank1"
  set +e
  wait $job
  code=$?
  set -e
  kill -KILL "$rank1" 2> /dev/null || true  # a stopped rank left behind
  [ $code != 0 ] || fail "the job with rank 1 ${signal}ed exited 0"
  # The state is whole: resuming with too few --steps loads it and names its update...
  set +e
  "$mpiexec" -np 2 "$exe" $small --batch 2 --steps 1 --eval-every 100000 --resume "$out/state.snug" > "$out.probe" 2>&1
  set -e
  saved=$(sed -n 's/.*the saved run already did \([0-9]*\) updates.*/\1/p' "$out.probe" | head -n 1)
  [ -n "$saved" ] || { cat "$out.probe"; fail "the state after the fault does not load"; }
  # ... and two more updates from it train.
  "$mpiexec" -np 2 "$exe" $small --batch 2 --steps $((saved + 2)) --eval-every 100000 --resume "$out/state.snug" \
    > "$out.resumed" 2>&1 || { cat "$out.resumed"; fail "resume after the fault"; }
}

# 6. Rank 1 hangs: rank 0 names it after --rank-timeout 3 and the job ends.
fault "$dir/hang" STOP
grep -q "rank 0 of 2 waited 3 s in the .*; rank 1 does not answer: it died or hangs" "$dir/hang.log" ||
  { tail -c 2000 "$dir/hang.log"; fail "the hang's message"; }
echo "ok: a hanging rank is named, the state is intact"

# 7. Rank 1 dies: mpirun names it and ends the job.
fault "$dir/dead" KILL
grep -q "rank 1 with PID" "$dir/dead.log" || { tail -c 2000 "$dir/dead.log"; fail "the death's message"; }
echo "ok: a dead rank is named, the state is intact"
echo "all ok"
