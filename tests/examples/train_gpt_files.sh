#!/bin/sh
# train_gpt's files, end to end on the host (ctest runs this):
#   1. resume is bit-identical: for fp32, bf16, fp16 and bf16 with lean
#      optimizer state (bf16 or 8-bit moments, no master; with accumulation and
#      selective recomputation), 8 updates straight and 3 + stop + resume 5
#      (with full recomputation: the policy may change on resume) give the
#      same final weights (llm.c model files compared with cmp) and the same
#      training losses for updates 4-8;
#   2. a resume with another global batch (sequences per update) or optimizer
#      state is refused, naming it, and one with the other attention kind is
#      accepted;
#   3. Ctrl-C (SIGINT) saves the state and exits 130, and the state resumes;
#   4. a trained model saved as an llm.c file (and exported as Hugging Face
#      safetensors) and read back with --init-from --eval-only gives the
#      validation loss the training run printed;
#   5. so does a grouped-query Llama exported as a Hugging Face directory.
# usage: train_gpt_files.sh TRAIN_GPT WORK_DIR
set -u
exe=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
shape="--device host --layers 2 --heads 2 --channels 16 --seq 16 --warmup 2 --eval-batches 2 --sample 0"
tiny="$shape --batch 4"
losses() { sed -n 's/.*"train_loss":\([^,]*\),.*/\1/p' "$1" | tail -n 5; }

# 1 and 2: resume.
for p in fp32 bf16 fp16 bf16-lean bf16-int8; do
    case $p in
        bf16-lean) precision="bf16 --optimizer-state bf16 --master none" ;;
        bf16-int8) precision="bf16 --optimizer-state int8 --master none" ;;
        *) precision=$p ;;
    esac
    run="$tiny --steps 8 --eval-every 4 --precision $precision --accum 2"
    "$exe" $run --checkpoint selective --out "$dir/straight-$p" --save-model "$dir/straight-$p.bin" >"$dir/straight-$p.log" 2>&1 ||
        fail "$p: the straight run failed: $(tail -3 "$dir/straight-$p.log")"
    "$exe" $run --checkpoint selective --out "$dir/resumed-$p" --stop-after 3 >"$dir/first-$p.log" 2>&1 ||
        fail "$p: the first half failed: $(tail -3 "$dir/first-$p.log")"
    [ -f "$dir/resumed-$p/state.snug" ] || fail "$p: --stop-after 3 left no $dir/resumed-$p/state.snug"
    # The second half recomputes differently (checkpointing may change on resume): still the same bits.
    "$exe" $run --checkpoint full --out "$dir/resumed-$p" --resume "$dir/resumed-$p/state.snug" --save-model "$dir/resumed-$p.bin" \
        >"$dir/second-$p.log" 2>&1 || fail "$p: the resumed run failed: $(tail -3 "$dir/second-$p.log")"
    grep -q "resumed from .* at update 3" "$dir/second-$p.log" || fail "$p: the resumed run does not say it resumed at update 3"
    cmp "$dir/straight-$p.bin" "$dir/resumed-$p.bin" || fail "$p: final weights differ between the straight and the resumed run"
    [ "$(losses "$dir/straight-$p/metrics.jsonl")" = "$(losses "$dir/resumed-$p/metrics.jsonl")" ] ||
        fail "$p: training losses of updates 4-8 differ: $(losses "$dir/straight-$p/metrics.jsonl" | tr '\n' ' ') vs $(losses "$dir/resumed-$p/metrics.jsonl" | tr '\n' ' ')"
    [ "$(grep -c . "$dir/resumed-$p/metrics.jsonl")" = 8 ] || fail "$p: the resumed metrics.jsonl does not hold 8 updates"
    echo "ok: $p resume is bit-identical (weights and losses of updates 4-8)"
done
"$exe" $shape --steps 8 --precision fp32 --accum 2 --checkpoint selective --batch 2 \
    --resume "$dir/resumed-fp32/state.snug" >"$dir/mismatch.log" 2>&1
rc=$?
[ $rc = 2 ] || fail "a resume with another --batch exited $rc, not 2"
grep -q "the saved run took 8 sequences per update (1 rank x micro-batch 4 x accumulation 2) but this one takes 4 (1 rank x micro-batch 2 x accumulation 2)" "$dir/mismatch.log" ||
    fail "the mismatch message does not name the global batch: $(cat "$dir/mismatch.log")"
echo "ok: a resume with another global batch is refused with exit 2"
"$exe" $tiny --steps 8 --precision bf16 --accum 2 --checkpoint selective \
    --resume "$dir/resumed-bf16-lean/state.snug" >"$dir/mismatch-lean.log" 2>&1
rc=$?
[ $rc != 0 ] || fail "a resume of a lean state with fp32 moments succeeded"
grep -q "moment storage does not match: the file has bf16, this training step has fp32" "$dir/mismatch-lean.log" ||
    fail "the mismatch message does not name the moment storage: $(cat "$dir/mismatch-lean.log")"
echo "ok: a resume with another optimizer state is refused (exit $rc)"

# The attention kind may change on resume (the same weights, the same result within rounding).
"$exe" $tiny --steps 9 --eval-every 9 --precision fp32 --accum 2 --checkpoint selective --attention materialized \
    --resume "$dir/resumed-fp32/state.snug" --out "$dir/other-attention" >"$dir/other-attention.log" 2>&1 ||
    fail "a resume with --attention materialized failed: $(tail -3 "$dir/other-attention.log")"
grep -q "materialized attention" "$dir/other-attention.log" || fail "the resumed run does not say materialized attention"
echo "ok: a flash-attention state resumes under materialized attention"

# 3: Ctrl-C. The signal goes once training has started ("step 0:" is printed
# after the handler is installed): a background job of a non-interactive
# shell starts with SIGINT ignored, so an earlier signal would be lost.
"$exe" $tiny --steps 20000 --eval-every 20000 --out "$dir/signal" >"$dir/signal.log" 2>&1 &
pid=$!
waited=0
until grep -q "^step 0:" "$dir/signal.log"; do
    [ $waited -lt 600 ] || { kill -KILL $pid; fail "train_gpt printed no 'step 0:' line in 60 s: $(tail -3 "$dir/signal.log")"; }
    sleep 0.1
    waited=$((waited + 1))
done
kill -INT $pid
wait $pid
rc=$?
[ $rc = 130 ] || fail "after SIGINT train_gpt exited $rc, not 130: $(tail -3 "$dir/signal.log")"
k=$(sed -n 's/^stopped by a signal after update \([0-9]*\);.*/\1/p' "$dir/signal.log")
[ -n "$k" ] || fail "no 'stopped by a signal after update K' line: $(tail -3 "$dir/signal.log")"
"$exe" $tiny --steps 20000 --eval-every 20000 --out "$dir/signal" --resume "$dir/signal/state.snug" \
    --stop-after $((k + 2)) >"$dir/signal-resume.log" 2>&1 || fail "resuming after SIGINT failed: $(tail -3 "$dir/signal-resume.log")"
grep -q "resumed from .* at update $k " "$dir/signal-resume.log" || fail "the run after SIGINT did not resume at update $k"
echo "ok: SIGINT saved the state at update $k (exit 130) and it resumed"

# 4: model files.
"$exe" $tiny --steps 6 --eval-every 6 --out "$dir/model" --save-model "$dir/model.bin" --export-hf "$dir/hf" \
    >"$dir/model.log" 2>&1 || fail "training for the model files failed: $(tail -3 "$dir/model.log")"
want=$(sed -n 's/^step 6: val loss \([0-9.]*\) nats.*/\1/p' "$dir/model.log")
[ -n "$want" ] || fail "no 'step 6: val loss' line in $dir/model.log"
for source in "$dir/model.bin" "$dir/hf"; do
    "$exe" --device host --init-from "$source" --eval-only --seq 16 --batch 4 --eval-batches 2 --sample 0 \
        >"$dir/eval.log" 2>&1 || fail "--init-from $source --eval-only failed: $(tail -3 "$dir/eval.log")"
    got=$(sed -n 's/^eval: loss \([0-9.]*\) nats.*/\1/p' "$dir/eval.log")
    [ "$got" = "$want" ] || fail "--init-from $source: eval loss $got, but training ended at val loss $want"
    echo "ok: --init-from $source --eval-only gives the trained model's val loss $want"
done
# 5: a Llama (grouped-query: 2 heads sharing 1 key/value head) exported as a
# Hugging Face directory reads back (--arch llama --init-from DIR) to the
# validation loss the training run printed.
"$exe" $tiny --arch llama --kv-heads 1 --steps 6 --eval-every 6 --export-hf "$dir/llama-hf" >"$dir/llama.log" 2>&1 ||
    fail "training the Llama for --export-hf failed: $(tail -3 "$dir/llama.log")"
want=$(sed -n 's/^step 6: val loss \([0-9.]*\) nats.*/\1/p' "$dir/llama.log")
[ -n "$want" ] || fail "no 'step 6: val loss' line in $dir/llama.log"
"$exe" --device host --arch llama --init-from "$dir/llama-hf" --eval-only --seq 16 --batch 4 --eval-batches 2 \
    --sample 0 >"$dir/llama-eval.log" 2>&1 || fail "--arch llama --init-from failed: $(tail -3 "$dir/llama-eval.log")"
got=$(sed -n 's/^eval: loss \([0-9.]*\) nats.*/\1/p' "$dir/llama-eval.log")
[ "$got" = "$want" ] || fail "--arch llama --init-from $dir/llama-hf: eval loss $got, but training ended at val loss $want"
grep -q "2 heads (1 key/value)" "$dir/llama-eval.log" || fail "the read Llama does not report 2 heads (1 key/value)"
echo "ok: a grouped-query Llama's Hugging Face export reads back to the trained model's val loss $want"
echo "all train_gpt file checks passed"
