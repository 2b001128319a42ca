#!/usr/bin/env bash
# The one command for the device machine (an H200; see benchmarks/results/README.md):
#
#   bash benchmarks/device/run.sh            # from the repository root
#
# It builds the CUDA tests, benchmarks and vram_ladder for sm_90, runs the
# CUDA tests, the kernel microbenchmarks, the step benchmark, the VRAM ladder
# (GPT-2 124M, T 1024, 12 GiB), the PyTorch side by side
# (benchmarks/torch/side_by_side.py, eager; torch.compile for bf16) and,
# time permitting, compute-sanitizer's memcheck on the tests; it writes
# everything under $OUT (or ./out when $OUT is unset) and prints a compact
# table last. Each stage has its own time limit so the whole run stays under
# 8 minutes.
#
# The device machine has the CUDA toolkit, CMake and ninja but no Catch2, fmt,
# nlohmann/json or Google Benchmark. So:
#   - the benchmarks are plain CUDA programs, built by the project's CMake
#     with tests off (benchmarks/CMakeLists.txt builds them before it looks
#     for Google Benchmark);
#   - the CUDA tests are built by nvcc directly from tests/cuda/*.cu, with
#     Catch2's single header carried in third_party_headers/ (ignored by git).
#     Run this script once on a CPU machine first: it copies
#     /usr/include/catch2 (and CLI11's and nlohmann/json's headers, for
#     vram_ladder) there, and the device call carries that folder:
#       run(command="bash benchmarks/device/run.sh", carry=["third_party_headers"])
#     No CUDA test needs fmt (only host tests do, and they run in CI), so fmt
#     is not carried: fmt is a compiled library on Debian, and although fmt
#     9's headers work header-only (FMT_HEADER_ONLY pulls in format-inl.h),
#     nothing built here needs it.
#
# SNUG_DEVICE_STAGES picks stages (default: all of "tests kernels step ladder
# torch ncu sanitizer"), e.g. a rerun after a kernel fix with little device
# time left: SNUG_DEVICE_STAGES="tests kernels step".
#
# Attention runs two ways where cuDNN is present (the device image's Python
# environment has it, nvidia-cudnn-cu13; the frontend headers come carried in
# third_party_headers/): snug's flash kernels and cuDNN's fused SDPA, side by
# side in the kernel table and the step rungs, and PyTorch's SDPA is timed per
# backend (flash, cuDNN, efficient). Nsight Compute reads the attention and
# norm kernels (ncu.txt). At most eight files come back: the summaries as
# they are, everything else in rest.tar.gz.
#
# Without a GPU (a CPU machine) it prepares the headers, configures, says
# plainly that no GPU is present and exits 0. SNUG_DEVICE_BUILD=1 makes it
# build the benchmarks there too (a compile check; slow on 2 cores).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
out=${OUT:-$root/out}
mkdir -p "$out"
build=${SNUG_DEVICE_BUILD_DIR:-$root/build-device}
jobs=$(nproc 2>/dev/null || echo 4)
start=$SECONDS
log() { printf '[run.sh %4ds] %s\n' $((SECONDS - start)) "$*" | tee -a "$out/run.log"; }
summary=()
stages=" ${SNUG_DEVICE_STAGES:-tests kernels step ladder torch ncu sanitizer} "
want() { [[ $stages == *" $1 "* ]]; }

# ---- Catch2's header, carried from a machine that has it ----
if [[ ! -f third_party_headers/catch2/catch.hpp && -f /usr/include/catch2/catch.hpp ]]; then
    mkdir -p third_party_headers/catch2
    cp /usr/include/catch2/catch.hpp third_party_headers/catch2/
    log "copied /usr/include/catch2/catch.hpp into third_party_headers/ (carry it to the device machine)"
fi
# CLI11 and nlohmann/json (header-only) for vram_ladder, the same way, and
# fmt's headers for its report.cpp (compiled there with FMT_HEADER_ONLY).
for h in CLI nlohmann fmt; do
    if [[ ! -d third_party_headers/$h && -d /usr/include/$h ]]; then
        cp -r "/usr/include/$h" third_party_headers/
        log "copied /usr/include/$h into third_party_headers/"
    fi
done
# cuDNN's header-only frontend (tools/deps.sh fetched it into
# third_party/cudnn_frontend): the attention path on cuDNN's fused SDPA. cuDNN
# itself is in the device image's Python environment (nvidia-cudnn-cu13).
if [[ ! -f third_party_headers/cudnn_frontend.h && -f third_party/cudnn_frontend/include/cudnn_frontend.h ]]; then
    mkdir -p third_party_headers
    cp -r third_party/cudnn_frontend/include/. third_party_headers/
    log "copied cuDNN's frontend into third_party_headers/"
fi

# ---- is there a GPU? ----
gpu=""
if command -v nvidia-smi >/dev/null 2>&1; then
    gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
fi
# cuDNN: the Python environment's (PyTorch's nvidia-cudnn), else $CUDNN_PATH.
cudnn_dir=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0])" 2>/dev/null || echo "${CUDNN_PATH:-}")
if [[ -n $cudnn_dir && -d $cudnn_dir/lib ]]; then
    export LD_LIBRARY_PATH="$cudnn_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export CUDNN_PATH=$cudnn_dir
fi
export CUDNN_FRONTEND_PATH=$root/third_party_headers
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then commit="$commit+dirty"; fi
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $commit"
    echo "gpu: ${gpu:-none}"
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo "host compiler: $(c++ --version 2>/dev/null | head -1)"
    echo "cudnn: ${cudnn_dir:-none} ($(ls "${cudnn_dir:-/nonexistent}"/lib/libcudnn.so* 2>/dev/null | head -1))"
    echo "cudnn frontend: $(grep -h 'define CUDNN_FRONTEND_[A-Z]*_VERSION ' third_party_headers/cudnn_frontend_version.h \
        2>/dev/null | awk '{printf "%s.", $3}' | sed 's/\.$//')"
} | tee "$out/environment.txt"

if ! command -v nvcc >/dev/null 2>&1; then
    log "NO CUDA TOOLKIT (nvcc) here: nothing to build or run. No GPU results."
    exit 0
fi

# ---- configure: CUDA on, tests off (no Catch2/fmt packages there), sm_90 ----
if ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSNUG_WITH_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DSNUG_BUILD_TESTS=OFF -DSNUG_BUILD_EXAMPLES=OFF \
        -DSNUG_BUILD_BENCHMARKS=ON >"$out/configure.log" 2>&1; then
    log "configure FAILED (see configure.log)"; tail -20 "$out/configure.log"; exit 1
fi
log "configured $build (sm_90)"

if [[ -z $gpu && ${SNUG_DEVICE_BUILD:-0} != 1 ]]; then
    log "NO GPU PRESENT on this machine (nvidia-smi finds none): configured only; no tests or benchmarks run."
    log "On the device machine: run(command=\"bash benchmarks/device/run.sh\", carry=[\"third_party_headers\"])"
    exit 0
fi

# cuDNN's engine is compiled by the host compiler (never nvcc) into a program
# that links cudnn_link: cudnn_object SOURCE OBJECT LOG.
# (The frontend loads libcudnn at run time, found through LD_LIBRARY_PATH above.)
cudnn_link=()
[[ -n $cudnn_dir && -f $cudnn_dir/lib/libcudnn.so.9 ]] && cudnn_link=("-ldl")
cudnn_object() {
    [[ ${#cudnn_link[@]} -gt 0 && -f $cudnn_dir/include/cudnn.h && -f third_party_headers/cudnn_frontend.h ]] &&
        timeout 300 c++ -std=c++20 -O2 -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING=1 -Iinclude -Itests -Ithird_party_headers \
            -I"$cudnn_dir/include" \
            -I"$(dirname "$(command -v nvcc)")/../include" -c "$1" -o "$2" >>"$3" 2>&1 && return 0
    rm -f "$2"
    return 1
}

# ---- build: the two benchmarks (CMake) and the CUDA tests (nvcc), in parallel ----
(timeout 300 cmake --build "$build" -j "$jobs" --target snug_cuda_kernels_bench snug_cuda_step_bench \
    >"$out/build_bench.log" 2>&1; echo $? >"$build/bench.rc") &
bench_pid=$!

tests_bin=""
if ! want tests && ! want sanitizer; then
    :
elif [[ -f third_party_headers/catch2/catch.hpp ]]; then
    mkdir -p "$build/cuda_tests"
    nvcc_flags=(-std=c++20 --expt-relaxed-constexpr -O2 -arch=sm_90 -Iinclude -Itests -Ithird_party_headers
                "-DSNUG_TEST_DATA_DIR=\"$root/tests/data\"" -Xcompiler=-Wall,-Wextra)
    srcs=(tests/cuda/main.cpp tests/cuda/*_test.cu)
    printf '%s\n' "${srcs[@]}" | timeout 300 xargs -P "$jobs" -I{} sh -c \
        'nvcc "$@" -x cu -c {} -o "'"$build"'/cuda_tests/$(basename {}).o"' _ "${nvcc_flags[@]}" \
        >"$out/build_tests.log" 2>&1
    # cuDNN's engine for the fused-attention tests, built by the host compiler.
    test_link=()
    if cudnn_object examples/cudnn_engine.cpp "$build/cuda_tests/cudnn_registration.o" "$out/build_tests.log"
    then
        test_link=("${cudnn_link[@]}")
        log "cuDNN engine built into the CUDA tests ($cudnn_dir)"
    else
        log "CUDA tests without cuDNN (no cuDNN in python3's environment, or no frontend headers carried)"
    fi
    if timeout 120 nvcc -arch=sm_90 "$build"/cuda_tests/*.o -lcublasLt "${test_link[@]}" -o "$build/snug_cuda_tests" \
            >>"$out/build_tests.log" 2>&1; then
        tests_bin="$build/snug_cuda_tests"
        log "built snug_cuda_tests"
    else
        log "snug_cuda_tests FAILED to build (build_tests.log)"; grep -m5 error "$out/build_tests.log"
        summary+=("cuda tests: BUILD FAILED")
    fi
else
    log "no third_party_headers/catch2/catch.hpp: CUDA tests not built (run this script on a CPU machine first)"
    summary+=("cuda tests: not built (Catch2 header not carried)")
fi
# vram_ladder (one nvcc compile of examples/vram_ladder/main.cu) alongside.
ladder_bin=""
# Its report (report.cpp formats with fmt, which nvcc cannot compile) is built
# by the host compiler with fmt header-only.
if want ladder && [[ -f third_party_headers/CLI/CLI.hpp && -d third_party_headers/nlohmann && -d third_party_headers/fmt ]]; then
    (timeout 300 c++ -std=c++20 -O2 -DFMT_HEADER_ONLY -Iinclude -Ithird_party_headers \
        -c examples/vram_ladder/report.cpp -o "$build/ladder_report.o" >"$out/build_ladder.log" 2>&1 &&
     ladder_objs=("$build/ladder_report.o") && ladder_link=() &&
     if cudnn_object examples/cudnn_engine.cpp "$build/ladder_cudnn.o" "$out/build_ladder.log"; then
         ladder_objs+=("$build/ladder_cudnn.o"); ladder_link=("${cudnn_link[@]}")
     fi &&
     timeout 300 nvcc -std=c++20 --expt-relaxed-constexpr -O2 -arch=sm_90 -Iinclude -Ithird_party_headers \
        examples/vram_ladder/main.cu "${ladder_objs[@]}" -lcublasLt "${ladder_link[@]}" -o "$build/vram_ladder" \
        >>"$out/build_ladder.log" 2>&1) &
    ladder_pid=$!
fi
wait "$bench_pid"
bench_rc=$(cat "$build/bench.rc" 2>/dev/null || echo 1)
if [[ $bench_rc != 0 ]]; then
    log "benchmarks FAILED to build (build_bench.log)"; grep -m5 -i error "$out/build_bench.log"
    summary+=("benchmarks: BUILD FAILED")
fi
log "build done"

if [[ -z $gpu ]]; then
    log "NO GPU PRESENT: built only (SNUG_DEVICE_BUILD=1); nothing run."
    exit 0
fi

# ---- CUDA tests ----
if [[ -n $tests_bin ]] && want tests; then
    timeout 150 "$tests_bin" >"$out/cuda_tests.log" 2>&1
    rc=$?
    summary+=("cuda tests: rc $rc, $(grep -E '^(All tests passed|test cases:)' "$out/cuda_tests.log" | tail -1)")
    log "snug_cuda_tests rc $rc"
fi

# ---- microbenchmarks and the step benchmark ----
if [[ $bench_rc == 0 ]] && want kernels; then
    timeout 150 "$build/benchmarks/snug_cuda_kernels_bench" "$out/kernels.csv" 2>&1 | tee "$out/kernels.txt"
    log "kernels_bench rc ${PIPESTATUS[0]}"
fi
if [[ $bench_rc == 0 ]] && want step; then
    timeout 300 "$build/benchmarks/snug_cuda_step_bench" "$out/step.csv" 2>&1 | tee "$out/step.txt"
    log "step_bench rc ${PIPESTATUS[0]}"
fi

# ---- the VRAM ladder: GPT-2 124M (vocabulary 50257) at T = 1024 under 12 GiB ----
if [[ -n ${ladder_pid:-} ]]; then
    wait "$ladder_pid" && ladder_bin="$build/vram_ladder"
    if [[ -n $ladder_bin ]]; then
        timeout 150 "$ladder_bin" --device cuda --model 124M --vocab 50257 --seq 1024 --batch 16 --steps 8 \
            --warmup 2 --lr 6e-4 --eval-batches 2 --vram-budget 12GiB --out "$out/ladder" 2>&1 | tee "$out/ladder.txt"
        log "vram_ladder rc ${PIPESTATUS[0]}"
    else
        log "vram_ladder FAILED to build (build_ladder.log)"; grep -m5 error "$out/build_ladder.log"
        summary+=("vram_ladder: BUILD FAILED")
    fi
fi

# ---- PyTorch side by side: the same model and rungs (the device's python3 has torch) ----
if ! want torch; then
    :
elif python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
    timeout 100 python3 benchmarks/torch/side_by_side.py --modes eager --csv "$out/torch_eager.csv" \
        --json "$out/torch_eager.json" 2>&1 | tee "$out/torch_eager.txt"
    log "side_by_side eager rc ${PIPESTATUS[0]}"
    timeout 100 python3 benchmarks/torch/side_by_side.py --modes compile --rungs bf16 --csv "$out/torch_compile.csv" \
        --json "$out/torch_compile.json" 2>&1 | tee "$out/torch_compile.txt"
    log "side_by_side compile (bf16) rc ${PIPESTATUS[0]}"
    timeout 60 python3 benchmarks/torch/side_by_side.py --attention 16,12,1024,64 --sdpa-backends all 2>&1 |
        tee "$out/torch_attention.txt"
    log "side_by_side attention (SDPA, beside kernels.txt's flash_attention rows) rc ${PIPESTATUS[0]}"
else
    summary+=("pytorch side by side: not run (no python3 with CUDA torch)")
fi

# ---- Nsight Compute on the attention and norm kernels (works under Firecracker, not under gVisor) ----
if want ncu && [[ $bench_rc == 0 ]] && command -v ncu >/dev/null 2>&1; then
    timeout 120 ncu --kernel-name 'regex:flash|cudnn|sdpa|fmha|norm_backward|layernorm' --launch-skip 0 \
        --launch-count 12 --section SpeedOfLight --section Occupancy --section LaunchStats \
        "$build/benchmarks/snug_cuda_kernels_bench" >"$out/ncu.txt" 2>&1
    rc=$?
    if [[ $rc == 0 ]]; then summary+=("ncu: attention and norm kernels in ncu.txt")
    else summary+=("ncu: rc $rc ($(grep -m1 -iE 'error|not supported|permission' "$out/ncu.txt"))"); fi
elif want ncu; then
    summary+=("ncu: not run (absent, or the benchmarks did not build)")
fi

# ---- compute-sanitizer, with what time is left (it refuses the GPU under gVisor) ----
left=$((440 - (SECONDS - start)))
if ! want sanitizer; then
    :
elif [[ -n $tests_bin ]] && command -v compute-sanitizer >/dev/null 2>&1 && ((left > 30)); then
    # API errors are not counted: the tests provoke some on purpose (an
    # allocation past the card, a copy with a bad pointer) to check the
    # errors snug raises; memcheck still fails on any bad memory access.
    timeout "$left" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 "$tests_bin" \
        >"$out/sanitizer.log" 2>&1
    rc=$?
    case $rc in
        0) summary+=("compute-sanitizer memcheck: clean") ;;
        124) summary+=("compute-sanitizer memcheck: stopped at the time limit (${left}s), no error before") ;;
        *) why=$(grep -m1 -E 'ERROR SUMMARY|not supported|error' "$out/sanitizer.log")
           summary+=("compute-sanitizer memcheck: rc $rc ($why)") ;;
    esac
else
    summary+=("compute-sanitizer: not run (absent, no tests, or no time left)")
fi

# ---- the compact table, last ----
echo
echo "===== snug on ${gpu} (commit $commit, $(date -u +%Y-%m-%d)) ====="
for s in "${summary[@]}"; do echo "$s"; done
if [[ -f $out/kernels.csv ]]; then
    echo "--- kernels (achieved / measured ceiling) ---"
    # kernel,dtype,shape,bytes,flops,h200_bound_us,median_ms,achieved,unit,ceiling,fraction
    awk -F, 'NR > 1 { gsub(/"/, "")
        printf "%-30s %-5s %-24s %10.1f us %9.1f %-7s %6.1f%%\n", $1, $2, $3, $7 * 1000, $8, $9, $11 * 100 }' \
        "$out/kernels.csv"
fi
if [[ -f $out/step.csv ]]; then
    echo "--- steps (MFU vs measured bf16 GEMM peak; nominal 989 TFLOP/s in step.csv) ---"
    awk -F, 'NR > 1 { gsub(/"/, "")
        printf "%-20s %-5s %9.0f tok/s  MFU %5.1f%%  HFU %5.1f%%  tracker %6.2f GiB  driver %6.2f GiB  %s\n",
               $1, $2, $7, $8 * 100, $10 * 100, $11, $12, $15 }' \
        "$out/step.csv"
fi
for f in "$out/torch_eager.csv" "$out/torch_compile.csv"; do
    [[ -f $f ]] || continue
    echo "--- PyTorch $(basename "$f" .csv | sed 's/torch_//') (same rungs, same format) ---"
    # framework,mode,rung,model,B,T,micro_batches,median_ms,tokens_per_s,mfu_measured_peak,...,tracker_peak_gib,..,status
    awk -F, 'NR > 1 { gsub(/"/, "")
        printf "%-20s %-5s %9.0f tok/s  MFU %5.1f%%  tracker %6.2f GiB  %s\n", $3, $4, $9, $10 * 100, $13, $17 }' "$f"
done
if [[ -f $out/ladder.txt ]]; then
    echo "--- VRAM ladder ---"
    sed -n '/^VRAM ladder:/,$p' "$out/ladder.txt"
fi
echo "total $((SECONDS - start)) s; full results in $out"
# The device tool returns few files: keep the summaries, tar the rest.
keep="run.log environment.txt kernels.csv step.csv torch_eager.csv torch_compile.csv torch_attention.txt"
(cd "$out" && others=$(ls | grep -vxF -f <(tr ' ' '\n' <<<"$keep") | grep -vx 'rest.tar.gz' || true) &&
    [[ -n $others ]] && tar czf rest.tar.gz $others && rm -rf $others) 2>/dev/null || true
