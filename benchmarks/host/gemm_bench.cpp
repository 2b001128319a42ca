// Host GEMM throughput (GFLOP/s, counting 2 M N K per call): the main entry
// point (OpenBLAS where snug is built with it) against the portable blocked
// kernel, fp32 and 16-bit inputs, on a 512^3 square and on the three products
// of a transformer linear layer (tokens 2048, d_in 128, d_out 384).
#include "snug/host/gemm.hpp"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

using snug::host::Op;

struct Shape {
    Op op_a, op_b;
    std::int64_t M, N, K;
};

// The square, and a linear layer y = x W^T with x (2048, 128), W (384, 128):
// forward y = x W^T, backward dx = dy W and dW = dy^T x.
const Shape square{Op::N, Op::N, 512, 512, 512};
const Shape linear_forward{Op::N, Op::T, 2048, 384, 128};
const Shape linear_backward_data{Op::N, Op::N, 2048, 128, 384};
const Shape linear_backward_weight{Op::T, Op::N, 384, 128, 2048};

enum class Entry { gemm, portable };

template <class T>
std::vector<T> random_values(std::int64_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<T> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = T(dist(rng));
    return v;
}

template <class T, class TC, Entry E>
void run_gemm(benchmark::State& state, const Shape& s) {
    // Operands stored as op() says: A (M, K) or (K, M), B (K, N) or (N, K).
    const std::int64_t lda = s.op_a == Op::N ? s.K : s.M;
    const std::int64_t ldb = s.op_b == Op::N ? s.N : s.K;
    const auto A = random_values<T>(s.M * s.K, 1);
    const auto B = random_values<T>(s.K * s.N, 2);
    auto C = random_values<TC>(s.M * s.N, 3);
    for (auto _ : state) {
        if constexpr (E == Entry::gemm) {
            snug::host::gemm(s.op_a, s.op_b, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), s.N);
        } else {
            snug::host::gemm_portable(s.op_a, s.op_b, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f,
                                      C.data(), s.N);
        }
        benchmark::DoNotOptimize(C.data());
        benchmark::ClobberMemory();
    }
    state.counters["GFLOP/s"] =
        benchmark::Counter(2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K) * 1e-9,
                           benchmark::Counter::kIsIterationInvariantRate);
    state.SetLabel(E == Entry::portable ? "portable" : snug::host::gemm_uses_cblas() ? "openblas" : "portable");
}

// One function per (entry, input type, output type), so the names read well.
void gemm_f32(benchmark::State& st, Shape s) { run_gemm<float, float, Entry::gemm>(st, s); }
void portable_f32(benchmark::State& st, Shape s) { run_gemm<float, float, Entry::portable>(st, s); }
void gemm_f16_to_f32(benchmark::State& st, Shape s) { run_gemm<snug::half, float, Entry::gemm>(st, s); }
void portable_f16_to_f32(benchmark::State& st, Shape s) { run_gemm<snug::half, float, Entry::portable>(st, s); }
void gemm_f16_to_f16(benchmark::State& st, Shape s) { run_gemm<snug::half, snug::half, Entry::gemm>(st, s); }
void portable_f16_to_f16(benchmark::State& st, Shape s) {
    run_gemm<snug::half, snug::half, Entry::portable>(st, s);
}
void gemm_bf16_to_f32(benchmark::State& st, Shape s) { run_gemm<snug::bfloat16, float, Entry::gemm>(st, s); }
void portable_bf16_to_f32(benchmark::State& st, Shape s) {
    run_gemm<snug::bfloat16, float, Entry::portable>(st, s);
}
void gemm_bf16_to_bf16(benchmark::State& st, Shape s) {
    run_gemm<snug::bfloat16, snug::bfloat16, Entry::gemm>(st, s);
}
void portable_bf16_to_bf16(benchmark::State& st, Shape s) {
    run_gemm<snug::bfloat16, snug::bfloat16, Entry::portable>(st, s);
}

}  // namespace

// Threads run inside the calls: rates use wall-clock time.
BENCHMARK_CAPTURE(gemm_f32, square_512, square)->UseRealTime();
BENCHMARK_CAPTURE(portable_f32, square_512, square)->UseRealTime();
BENCHMARK_CAPTURE(gemm_f16_to_f32, square_512, square)->UseRealTime();
BENCHMARK_CAPTURE(portable_f16_to_f32, square_512, square)->UseRealTime();
BENCHMARK_CAPTURE(gemm_f16_to_f16, square_512, square)->UseRealTime();
BENCHMARK_CAPTURE(portable_f16_to_f16, square_512, square)->UseRealTime();
BENCHMARK_CAPTURE(gemm_bf16_to_f32, square_512, square)->UseRealTime();
BENCHMARK_CAPTURE(portable_bf16_to_f32, square_512, square)->UseRealTime();
BENCHMARK_CAPTURE(gemm_bf16_to_bf16, square_512, square)->UseRealTime();
BENCHMARK_CAPTURE(portable_bf16_to_bf16, square_512, square)->UseRealTime();

BENCHMARK_CAPTURE(gemm_f32, linear_forward, linear_forward)->UseRealTime();
BENCHMARK_CAPTURE(portable_f32, linear_forward, linear_forward)->UseRealTime();
BENCHMARK_CAPTURE(gemm_f32, linear_backward_data, linear_backward_data)->UseRealTime();
BENCHMARK_CAPTURE(portable_f32, linear_backward_data, linear_backward_data)->UseRealTime();
BENCHMARK_CAPTURE(gemm_f32, linear_backward_weight, linear_backward_weight)->UseRealTime();
BENCHMARK_CAPTURE(portable_f32, linear_backward_weight, linear_backward_weight)->UseRealTime();
BENCHMARK_CAPTURE(gemm_bf16_to_bf16, linear_forward, linear_forward)->UseRealTime();
BENCHMARK_CAPTURE(portable_bf16_to_bf16, linear_forward, linear_forward)->UseRealTime();

BENCHMARK_MAIN();
