#!/bin/sh
# train_gpt with its optimizer offloaded to the host, end to end (ctest runs
# this on the host backend and on the emulated CUDA backend):
#   1. training with --offload writes the same model file as training with the
#      optimizer on the device, byte for byte (bf16 with 8-bit moments and no
#      master; fp32), and says where the state lives;
#   2. a run offloaded for 3 updates resumes on the device for 3 more, and one
#      on the device resumes offloaded: both give the straight run's file.
# usage: offload.sh TRAIN_GPT WORK_DIR DEVICE
set -u
exe=$1
dir=$2
device=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
shape="--device $device --layers 2 --heads 2 --channels 16 --seq 16 --batch 4 --accum 2 --warmup 2 --eval-batches 1 --sample 0"

for p in bf16-int8 fp32; do
    case $p in
        bf16-int8) precision="bf16 --optimizer-state int8 --master none" ;;
        *) precision=$p ;;
    esac
    run="$shape --steps 6 --eval-every 6 --precision $precision"
    "$exe" $run --save-model "$dir/$p-device.bin" >"$dir/$p-device.log" 2>&1 ||
        fail "$p: the run on the device failed: $(tail -3 "$dir/$p-device.log")"
    "$exe" $run --offload --save-model "$dir/$p-offload.bin" >"$dir/$p-offload.log" 2>&1 ||
        fail "$p: the offloaded run failed: $(tail -3 "$dir/$p-offload.log")"
    grep -q "offloaded to the host" "$dir/$p-offload.log" || fail "$p: the offloaded run does not say so"
    grep -q "host memory (offload)" "$dir/$p-offload.log" || fail "$p: the offloaded run reports no host memory"
    cmp "$dir/$p-device.bin" "$dir/$p-offload.bin" || fail "$p: offloaded training gave other weights"
    echo "ok: $p offloaded training gives the device's weights"

    for way in offload-device device-offload; do
        case $way in
            offload-device) first="--offload" second="" ;;
            *) first="" second="--offload" ;;
        esac
        "$exe" $run $first --out "$dir/$p-$way" --stop-after 3 >"$dir/$p-$way-1.log" 2>&1 ||
            fail "$p $way: the first half failed: $(tail -3 "$dir/$p-$way-1.log")"
        "$exe" $run $second --out "$dir/$p-$way" --resume "$dir/$p-$way/state.snug" --save-model "$dir/$p-$way.bin" \
            >"$dir/$p-$way-2.log" 2>&1 || fail "$p $way: the resumed run failed: $(tail -3 "$dir/$p-$way-2.log")"
        grep -q "resumed from .* at update 3" "$dir/$p-$way-2.log" || fail "$p $way: the second half did not resume"
        cmp "$dir/$p-device.bin" "$dir/$p-$way.bin" || fail "$p $way: the resumed run's weights differ"
        echo "ok: $p $way resume gives the straight run's weights"
    done
done
echo "all ok"
