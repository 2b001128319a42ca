// Host kernel throughput at transformer shapes: LayerNorm, GELU, attention
// (materialised and flash), softmax cross-entropy, AdamW and the loss scaler's unscale-and-check, fp32
// and bf16. Memory-bound kernels report GB/s (the fewest bytes the kernel must
// move: each input read once, each output written once); attention reports
// GFLOP/s of its matrix products (causal: half of the dense count).
//
// Shapes: the host model (B 16, T 128, C 128, 4 heads, vocabulary
// 256; N = B T = 2048 rows) and, for the row kernels, GPT-2 small's width
// (C 768) and vocabulary (50304) on 1024 rows.
#include <snug/snug.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

using snug::bfloat16;
const snug::host::Device dev{};

template <class T>
std::vector<T> random_values(std::int64_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<T> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = T(dist(rng));
    return v;
}

void bytes_rate(benchmark::State& state, double bytes) {
    state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- LayerNorm: (N, C) rows ----
template <class T>
void layernorm_forward(benchmark::State& state) {
    const std::int64_t N = state.range(0);
    const int C = static_cast<int>(state.range(1));
    const auto inp = random_values<T>(N * C, 1);
    const auto w = random_values<T>(C, 2, 0.5f, 1.5f), b = random_values<T>(C, 3);
    std::vector<T> out(inp.size());
    std::vector<float> mean(static_cast<std::size_t>(N)), rstd(mean.size());
    for (auto _ : state) {
        snug::host::layernorm_forward(dev, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    bytes_rate(state, 2.0 * static_cast<double>(N * C) * sizeof(T) + 8.0 * static_cast<double>(N));
}

template <class T>
void layernorm_backward(benchmark::State& state) {
    const std::int64_t N = state.range(0);
    const int C = static_cast<int>(state.range(1));
    const auto inp = random_values<T>(N * C, 1), dout = random_values<T>(N * C, 4);
    const auto w = random_values<T>(C, 2, 0.5f, 1.5f), b = random_values<T>(C, 3);
    std::vector<T> out(inp.size()), dinp(inp.size(), T(0.0f));
    std::vector<float> mean(static_cast<std::size_t>(N)), rstd(mean.size()), dw(static_cast<std::size_t>(C)),
        db(dw.size());
    snug::host::layernorm_forward(dev, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    for (auto _ : state) {
        snug::host::layernorm_backward(dev, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                                       mean.data(), rstd.data(), N, C);
        benchmark::DoNotOptimize(dinp.data());
        benchmark::ClobberMemory();
    }
    // dout, inp, dinp read; dinp written (it accumulates).
    bytes_rate(state, 4.0 * static_cast<double>(N * C) * sizeof(T) + 8.0 * static_cast<double>(N));
}

// ---- GELU: n elements (the MLP's hidden activations, N x 4C) ----
template <class T>
void gelu_forward(benchmark::State& state) {
    const std::int64_t n = state.range(0);
    const auto inp = random_values<T>(n, 1, -4.0f, 4.0f);
    std::vector<T> out(inp.size());
    for (auto _ : state) {
        snug::host::gelu_forward(dev, out.data(), inp.data(), n);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    bytes_rate(state, 2.0 * static_cast<double>(n) * sizeof(T));
}

template <class T>
void gelu_backward(benchmark::State& state) {
    const std::int64_t n = state.range(0);
    const auto inp = random_values<T>(n, 1, -4.0f, 4.0f), dout = random_values<T>(n, 2);
    std::vector<T> dinp(inp.size());
    for (auto _ : state) {
        snug::host::gelu_backward(dev, dinp.data(), inp.data(), dout.data(), n);
        benchmark::DoNotOptimize(dinp.data());
        benchmark::ClobberMemory();
    }
    bytes_rate(state, 3.0 * static_cast<double>(n) * sizeof(T));
}

// ---- Attention: qkv (B, T, 3C), NH heads ----
// Causal matrix-product FLOPs: forward Q K^T and P V, 2 T^2 hs / 2 each per
// head; backward four products of the same size.
double attention_flops(std::int64_t B, std::int64_t T, std::int64_t C) {
    return 2.0 * double(B) * double(T * T) * double(C);
}

template <class T>
void attention_forward(benchmark::State& state) {
    const int B = static_cast<int>(state.range(0)), Tn = static_cast<int>(state.range(1)),
              C = static_cast<int>(state.range(2)), NH = static_cast<int>(state.range(3));
    const auto qkv = random_values<T>(std::int64_t{B} * Tn * 3 * C, 1);
    std::vector<T> out(static_cast<std::size_t>(B) * Tn * C), att(static_cast<std::size_t>(B) * NH * Tn * Tn);
    for (auto _ : state) {
        snug::host::attention_forward(dev, out.data(), att.data(), qkv.data(), B, Tn, C, NH);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    state.counters["GFLOP/s"] =
        benchmark::Counter(attention_flops(B, Tn, C) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void attention_backward(benchmark::State& state) {
    const int B = static_cast<int>(state.range(0)), Tn = static_cast<int>(state.range(1)),
              C = static_cast<int>(state.range(2)), NH = static_cast<int>(state.range(3));
    const auto qkv = random_values<T>(std::int64_t{B} * Tn * 3 * C, 1);
    const auto dout = random_values<T>(std::int64_t{B} * Tn * C, 2);
    std::vector<T> out(dout.size()), att(static_cast<std::size_t>(B) * NH * Tn * Tn), scratch(att.size()),
        dqkv(qkv.size());
    snug::host::attention_forward(dev, out.data(), att.data(), qkv.data(), B, Tn, C, NH);
    for (auto _ : state) {
        snug::host::attention_backward(dev, dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, Tn,
                                       C, NH);
        benchmark::DoNotOptimize(dqkv.data());
        benchmark::ClobberMemory();
    }
    state.counters["GFLOP/s"] =
        benchmark::Counter(2.0 * attention_flops(B, Tn, C) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- Flash attention beside the materialised one, at GPT-2 small's heads ----
// (B, T 1024, C 768, NH 12: hs 64). Causal FLOPs of the forward's two
// products, 4 B NH T^2 hs / 2; the backward counts 2.5 times that (five
// products' worth; the host flash computes five too, s and p once per tile
// pair, the CUDA kernels seven, their dQ pass recomputing s and p).
// "kept" is the activation memory the forward leaves for the backward besides
// qkv: out and the probabilities (B, NH, T, T) for the materialised kernel,
// out and the fp32 log-sum-exp (B, NH, T) for flash.
double causal_forward_flops(std::int64_t B, std::int64_t T, std::int64_t C) {
    return 4.0 * double(B) * double(T) * double(T) * double(C) / 2.0;
}

void attention_counters(benchmark::State& state, double flops, double kept_bytes) {
    state.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["kept_MiB"] = kept_bytes / double(1 << 20);
}

// The materialised attention, forward, or forward then backward.
template <class T, bool backward>
void materialised_attention(benchmark::State& state) {
    const int B = static_cast<int>(state.range(0)), Tn = static_cast<int>(state.range(1)),
              C = static_cast<int>(state.range(2)), NH = static_cast<int>(state.range(3));
    const auto qkv = random_values<T>(std::int64_t{B} * Tn * 3 * C, 1);
    const auto dout = random_values<T>(std::int64_t{B} * Tn * C, 2);
    std::vector<T> out(dout.size()), att(static_cast<std::size_t>(B) * NH * Tn * Tn), dqkv(qkv.size());
    std::vector<T> scratch(backward ? att.size() : 0);
    for (auto _ : state) {
        snug::host::attention_forward(dev, out.data(), att.data(), qkv.data(), B, Tn, C, NH);
        if constexpr (backward) {
            snug::host::attention_backward(dev, dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B,
                                           Tn, C, NH);
        }
        benchmark::DoNotOptimize(out.data());
        benchmark::DoNotOptimize(dqkv.data());
        benchmark::ClobberMemory();
    }
    attention_counters(state, (backward ? 3.5 : 1.0) * causal_forward_flops(B, Tn, C),
                       double(sizeof(T)) * double(out.size() + att.size()));
}

// Flash attention, forward, or forward then backward.
template <class T, bool backward>
void flash_attention(benchmark::State& state) {
    const int B = static_cast<int>(state.range(0)), Tn = static_cast<int>(state.range(1)),
              C = static_cast<int>(state.range(2)), NH = static_cast<int>(state.range(3));
    using Stat = snug::ops::flash_stat_t<T>;
    const auto qkv = random_values<T>(std::int64_t{B} * Tn * 3 * C, 1);
    const auto dout = random_values<T>(std::int64_t{B} * Tn * C, 2);
    std::vector<T> out(dout.size()), dqkv(qkv.size());
    std::vector<Stat> lse(static_cast<std::size_t>(snug::ops::flash_stat_elems(B, Tn, NH))), D(lse.size());
    for (auto _ : state) {
        snug::host::flash_attention_forward(dev, out.data(), lse.data(), qkv.data(), B, Tn, C, NH);
        if constexpr (backward) {
            snug::host::flash_attention_backward(dev, dqkv.data(), D.data(), dout.data(), qkv.data(), out.data(),
                                                 lse.data(), B, Tn, C, NH);
        }
        benchmark::DoNotOptimize(out.data());
        benchmark::DoNotOptimize(dqkv.data());
        benchmark::ClobberMemory();
    }
    attention_counters(state, (backward ? 3.5 : 1.0) * causal_forward_flops(B, Tn, C),
                       double(sizeof(T)) * double(out.size()) + double(sizeof(Stat)) * double(lse.size()));
}

// ---- Softmax cross-entropy: logits (N, Vp), in place into dlogits ----
// Each call overwrites the logits with their gradient, and the next call
// starts from those: still finite rows of mixed sign, which is all the
// kernel's speed depends on.
template <class T>
void softmax_cross_entropy(benchmark::State& state) {
    const std::int64_t N = state.range(0);
    const int V = static_cast<int>(state.range(1)), Vp = static_cast<int>(state.range(2));
    auto logits = random_values<T>(N * Vp, 1, -4.0f, 4.0f);
    std::vector<float> losses(static_cast<std::size_t>(N));
    std::vector<std::int32_t> targets(losses.size());
    std::mt19937 rng(5);
    for (auto& t : targets) t = static_cast<std::int32_t>(rng() % static_cast<unsigned>(V));
    for (auto _ : state) {
        snug::host::softmax_cross_entropy(dev, losses.data(), logits.data(), targets.data(), N, V, Vp,
                                          1.0f / static_cast<float>(N));
        benchmark::DoNotOptimize(logits.data());
        benchmark::ClobberMemory();
    }
    bytes_rate(state, 2.0 * static_cast<double>(N * Vp) * sizeof(T) + 8.0 * static_cast<double>(N));
}

// ---- AdamW: n parameters, fp32 master / moments, working copy of type T ----
template <class T>
void adamw_update(benchmark::State& state) {
    const std::int64_t n = state.range(0);
    auto master = random_values<float>(n, 1), m = random_values<float>(n, 2, -1e-3f, 1e-3f),
         v = random_values<float>(n, 3, 0.0f, 1e-6f);
    const auto grad = random_values<float>(n, 4, -1e-2f, 1e-2f);
    std::vector<T> working(static_cast<std::size_t>(n));
    int step = 0;
    for (auto _ : state) {
        ++step;
        if constexpr (std::is_same_v<T, float>) {
            snug::host::adamw_update(dev, master.data(), nullptr, grad.data(), m.data(), v.data(), n, 1e-4f, 0.9f,
                                     0.95f, 1e-8f, 0.1f, step, 1.0f);
        } else {
            snug::host::adamw_update(dev, master.data(), working.data(), grad.data(), m.data(), v.data(), n, 1e-4f,
                                     0.9f, 0.95f, 1e-8f, 0.1f, step, 1.0f);
        }
        benchmark::DoNotOptimize(master.data());
        benchmark::ClobberMemory();
    }
    // master, m, v read and written; grad read; the working copy written.
    const double working_bytes = std::is_same_v<T, float> ? 0.0 : sizeof(T);
    bytes_rate(state, static_cast<double>(n) * (7.0 * sizeof(float) + working_bytes));
}

// ---- Loss scaler: unscale in place and flag non-finite values ----
void unscale_and_check(benchmark::State& state) {
    const std::int64_t n = state.range(0);
    auto grads = random_values<float>(n, 1);
    float found_inf = 0.0f;
    // Alternate the factor so values neither grow nor shrink run to run.
    float inv_scale = 0.5f;
    for (auto _ : state) {
        snug::host::unscale_and_check(dev, grads.data(), n, inv_scale, &found_inf);
        inv_scale = 1.0f / inv_scale;
        benchmark::DoNotOptimize(grads.data());
        benchmark::ClobberMemory();
    }
    if (found_inf != 0.0f) state.SkipWithError("unscale_and_check flagged finite data");
    bytes_rate(state, 8.0 * static_cast<double>(n));
}

// Host model rows and GPT-2 small rows.
void rows(benchmark::internal::Benchmark* b) { b->Args({2048, 128})->Args({1024, 768}); }
void elements(benchmark::internal::Benchmark* b) { b->Arg(2048 * 512)->Arg(1024 * 3072); }
void heads(benchmark::internal::Benchmark* b) { b->Args({16, 128, 128, 4})->Args({4, 256, 768, 12}); }
void gpt2_heads(benchmark::internal::Benchmark* b) { b->Args({2, 1024, 768, 12}); }
void vocabularies(benchmark::internal::Benchmark* b) { b->Args({2048, 256, 256})->Args({256, 50257, 50304}); }
// The host model's parameter count (about 0.83 M) and 16 M (far past the caches).
void parameters(benchmark::internal::Benchmark* b) { b->Arg(830'000)->Arg(16'000'000); }

}  // namespace

// The thread pool works inside each call: rates use wall-clock time.
BENCHMARK_TEMPLATE(layernorm_forward, float)->Apply(rows)->UseRealTime();
BENCHMARK_TEMPLATE(layernorm_forward, snug::bfloat16)->Apply(rows)->UseRealTime();
BENCHMARK_TEMPLATE(layernorm_backward, float)->Apply(rows)->UseRealTime();
BENCHMARK_TEMPLATE(layernorm_backward, snug::bfloat16)->Apply(rows)->UseRealTime();
BENCHMARK_TEMPLATE(gelu_forward, float)->Apply(elements)->UseRealTime();
BENCHMARK_TEMPLATE(gelu_forward, snug::bfloat16)->Apply(elements)->UseRealTime();
BENCHMARK_TEMPLATE(gelu_backward, float)->Apply(elements)->UseRealTime();
BENCHMARK_TEMPLATE(gelu_backward, snug::bfloat16)->Apply(elements)->UseRealTime();
BENCHMARK_TEMPLATE(attention_forward, float)->Apply(heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(attention_forward, snug::bfloat16)->Apply(heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(attention_backward, float)->Apply(heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(attention_backward, snug::bfloat16)->Apply(heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(materialised_attention, float, false)->Apply(gpt2_heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(flash_attention, float, false)->Apply(gpt2_heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(materialised_attention, float, true)->Apply(gpt2_heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(flash_attention, float, true)->Apply(gpt2_heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(materialised_attention, snug::bfloat16, false)->Apply(gpt2_heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(flash_attention, snug::bfloat16, false)->Apply(gpt2_heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(materialised_attention, snug::bfloat16, true)->Apply(gpt2_heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(flash_attention, snug::bfloat16, true)->Apply(gpt2_heads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(softmax_cross_entropy, float)->Apply(vocabularies)->UseRealTime();
BENCHMARK_TEMPLATE(softmax_cross_entropy, snug::bfloat16)->Apply(vocabularies)->UseRealTime();
// ---- AdamW with lean state: bf16 weights (no master) and bf16 moments, rounded stochastically ----
void adamw_update_lean(benchmark::State& state) {
    const std::int64_t n = state.range(0);
    auto weights = random_values<snug::bfloat16>(n, 1), m = random_values<snug::bfloat16>(n, 2, -1e-3f, 1e-3f),
         v = random_values<snug::bfloat16>(n, 3, 0.0f, 1e-6f);
    const auto grad = random_values<float>(n, 4, -1e-2f, 1e-2f);
    int step = 0;
    for (auto _ : state) {
        ++step;
        snug::host::adamw_update(dev, weights.data(), nullptr, grad.data(), m.data(), v.data(), n, 1e-4f, 0.9f,
                                 0.95f, 1e-8f, 0.1f, step, 1.0f, snug::ops::AdamWRounding{7, 0});
        benchmark::DoNotOptimize(weights.data());
        benchmark::ClobberMemory();
    }
    // weights, m, v (2 bytes each) read and written; grad read.
    bytes_rate(state, static_cast<double>(n) * (3.0 * 2.0 * 2.0 + sizeof(float)));
}

// ---- AdamW with 8-bit moments: bf16 weights (no master), codes and an absmax per 256 ----
void adamw_update_8bit(benchmark::State& state) {
    const std::int64_t n = state.range(0), blocks = snug::ops::moment_blocks(n);
    auto weights = random_values<snug::bfloat16>(n, 1);
    const auto grad = random_values<float>(n, 4, -1e-2f, 1e-2f);
    std::vector<std::uint8_t> m(static_cast<std::size_t>(n), 0x5A), v(static_cast<std::size_t>(n), 0xC3);
    auto m_absmax = random_values<float>(blocks, 2, 1e-3f, 2e-3f), v_absmax = random_values<float>(blocks, 3, 1e-7f, 1e-6f);
    int step = 0;
    for (auto _ : state) {
        ++step;
        snug::host::adamw_update_8bit(dev, weights.data(), nullptr, grad.data(),
                                      snug::ops::BlockwiseMoments{m.data(), m_absmax.data(), v.data(), v_absmax.data()},
                                      n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 1.0f, snug::ops::AdamWRounding{7, 0});
        benchmark::DoNotOptimize(weights.data());
        benchmark::ClobberMemory();
    }
    // weights (2 bytes) and the two codes (1 byte each) read and written, grad read.
    bytes_rate(state, static_cast<double>(n) * (2.0 * 2.0 + 2.0 * 2.0 + sizeof(float)));
}

BENCHMARK_TEMPLATE(adamw_update, float)->Apply(parameters)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(adamw_update, snug::bfloat16)->Apply(parameters)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(adamw_update_lean)->Apply(parameters)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(adamw_update_8bit)->Apply(parameters)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(unscale_and_check)->Apply(parameters)->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
