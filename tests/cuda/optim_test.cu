// The CUDA optimizer kernels against the host kernels on fresh random inputs,
// outputs poisoned first: adamw_update (fp32 master weights and moments, and
// a float, bfloat16 or half working copy, or none; and with lean state: bf16
// moments, bf16 weights without a master, rounded stochastically),
// adamw_update_8bit (8-bit block-wise moments: codes and absmax), sum_squares and
// accumulate_sum. AdamW is
// one chain of fp32 operations per element that the CUDA kernel performs in
// the host's order without fused multiply-adds, so the test asks for the
// host's bits (stronger than the 1e-5 tolerance). sum_squares accumulates in
// double on both sides, in different orders: within 1e-6 of the host (fp32
// tolerance 1e-5), and the same bits on every run; accumulate_sum too, within
// 1e-12 of the host's running total (double rounding). Sizes cover one element and
// odd counts larger than one grid. Runs only where a GPU exists.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/cuda/adamw.cuh"
#include "snug/cuda/norms.cuh"
#include "snug/host/adamw.hpp"
#include "snug/host/norms.hpp"
#include "snug/snug.hpp"
#include "support/cuda_support.hpp"
#include "support/offloaded_shards.hpp"

using Catch::Matchers::Contains;
using snug::Cuda;
using snug::MemoryCategory;
using snug::MemoryTracker;
using namespace snug::test;

namespace {

struct AdamWArgs {
    float lr, beta1, beta2, eps, weight_decay;
    int step;
    float grad_scale;
};

// One update on both sides from the same state: P weights updated in place
// (an fp32 master, or bf16 weights with no master), M moments, and a T
// working copy (void: none; only with fp32 P). Lean state rounds
// stochastically from `rounding`'s stream on both sides: the host's bits.
template <class P, class M, class T>
void check_adamw(snug::Generator& rng, std::int64_t n, const AdamWArgs& a, snug::ops::AdamWRounding rounding = {}) {
    INFO("n = " << n << ", step " << a.step << ", weight decay " << a.weight_decay << ", grad scale "
                  << a.grad_scale << ", first index " << rounding.first_index);
    MemoryTracker tracker;
    const snug::Host host;
    const Cuda dev{};
    const auto count = static_cast<std::size_t>(n);
    std::vector<P> p = random_values<P>(rng, count, -1.0f, 1.0f);
    const auto grad = random_values<float>(rng, count, -2.0f, 2.0f);
    std::vector<M> m = random_values<M>(rng, count, -0.1f, 0.1f);
    std::vector<M> v = random_values<M>(rng, count, 1e-6f, 1e-2f);
    auto p_d = to_device(tracker, p);
    auto grad_d = to_device(tracker, grad);
    auto m_d = to_device(tracker, m);
    auto v_d = to_device(tracker, v);
    if constexpr (std::is_void_v<T>) {
        adamw_update(dev, p_d.data(), nullptr, grad_d.data(), m_d.data(), v_d.data(), n, a.lr, a.beta1, a.beta2, a.eps,
                     a.weight_decay, a.step, a.grad_scale, rounding);
        adamw_update(host, p.data(), nullptr, grad.data(), m.data(), v.data(), n, a.lr, a.beta1, a.beta2, a.eps,
                     a.weight_decay, a.step, a.grad_scale, rounding);
    } else {
        auto working_d = poisoned<T>(tracker, count);
        std::vector<T> working(count);
        adamw_update(dev, p_d.data(), working_d.data(), grad_d.data(), m_d.data(), v_d.data(), n, a.lr, a.beta1,
                     a.beta2, a.eps, a.weight_decay, a.step, a.grad_scale, rounding);
        adamw_update(host, p.data(), working.data(), grad.data(), m.data(), v.data(), n, a.lr, a.beta1, a.beta2,
                     a.eps, a.weight_decay, a.step, a.grad_scale, rounding);
        check_same_bits(to_host(working_d), working, "working");
    }
    check_same_bits(to_host(p_d), p, "weights");
    check_same_bits(to_host(m_d), m, "m");
    check_same_bits(to_host(v_d), v, "v");
}

template <class T>
void check_adamw_sizes(snug::Generator& rng, bool past_one_grid) {
    const AdamWArgs args[] = {
        {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, 1.0f},
        {3e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 7, 0.25f},
        {1e-2f, 0.8f, 0.99f, 1e-6f, 0.01f, 1000, 0.5f},
    };
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{1001}}) {
        for (const auto& a : args) check_adamw<float, float, T>(rng, n, a);
    }
    // More elements than one pass of the grid (65536 blocks of 256 threads):
    // the grid-stride loop is the same for every working copy, so one pass
    // past it (20 M elements, the test's cost) is enough.
    if (past_one_grid) check_adamw<float, float, T>(rng, 20'000'003, args[0]);
}

template <class P, class M, class T>
void check_lean_adamw_sizes(snug::Generator& rng, bool past_one_grid) {
    const AdamWArgs args[] = {
        {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, 1.0f},
        {1e-2f, 0.8f, 0.99f, 1e-6f, 0.01f, 1000, 0.5f},
    };
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{1001}}) {
        for (const auto& a : args) check_adamw<P, M, T>(rng, n, a, {rng.next_u32(), 4096 * n});
    }
    // Past one pass of the grid: a thread's later elements keep their own dice.
    if (past_one_grid) check_adamw<P, M, T>(rng, 20'000'003, args[0], {rng.next_u32(), 3});
}

// One update with 8-bit block-wise moments on both sides from the same
// random state (every code byte possible, a positive absmax per block): P
// weights updated in place (fp32 master, or bf16 weights without one) and a T
// working copy (void: none). The update, the absmax reductions (a max, in any
// order the same) and the quantisation are the same fp32 operations on both
// sides: the host's bits. With `nan_at` >= 0 that gradient is NaN: its block
// stores the canonical NaN as absmax on both sides.
template <class P, class T>
void check_adamw_8bit(snug::Generator& rng, std::int64_t n, const AdamWArgs& a, snug::ops::AdamWRounding rounding,
                      std::int64_t nan_at = -1) {
    INFO("8-bit moments, n = " << n << ", step " << a.step << ", first index " << rounding.first_index
                                << ", NaN gradient at " << nan_at);
    MemoryTracker tracker;
    const snug::Host host;
    const Cuda dev{};
    const auto count = static_cast<std::size_t>(n);
    const auto blocks = static_cast<std::size_t>(snug::ops::moment_blocks(n));
    std::vector<P> p = random_values<P>(rng, count, -1.0f, 1.0f);
    auto grad = random_values<float>(rng, count, -2.0f, 2.0f);
    if (nan_at >= 0) grad[static_cast<std::size_t>(nan_at)] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::uint8_t> m(count), v(count);
    for (auto& c : m) c = static_cast<std::uint8_t>(rng.next_u32());
    for (auto& c : v) c = static_cast<std::uint8_t>(rng.next_u32());
    std::vector<float> m_absmax = random_values<float>(rng, blocks, 1e-3f, 0.1f);
    std::vector<float> v_absmax = random_values<float>(rng, blocks, 1e-6f, 1e-2f);
    auto p_d = to_device(tracker, p);
    auto grad_d = to_device(tracker, grad);
    auto m_d = to_device(tracker, m);
    auto v_d = to_device(tracker, v);
    auto ma_d = to_device(tracker, m_absmax);
    auto va_d = to_device(tracker, v_absmax);
    const snug::ops::BlockwiseMoments s_d{m_d.data(), ma_d.data(), v_d.data(), va_d.data()};
    const snug::ops::BlockwiseMoments s{m.data(), m_absmax.data(), v.data(), v_absmax.data()};
    if constexpr (std::is_void_v<T>) {
        adamw_update_8bit(dev, p_d.data(), nullptr, grad_d.data(), s_d, n, a.lr, a.beta1, a.beta2, a.eps,
                          a.weight_decay, a.step, a.grad_scale, rounding);
        adamw_update_8bit(host, p.data(), nullptr, grad.data(), s, n, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                          a.step, a.grad_scale, rounding);
    } else {
        auto working_d = poisoned<T>(tracker, count);
        std::vector<T> working(count);
        adamw_update_8bit(dev, p_d.data(), working_d.data(), grad_d.data(), s_d, n, a.lr, a.beta1, a.beta2, a.eps,
                          a.weight_decay, a.step, a.grad_scale, rounding);
        adamw_update_8bit(host, p.data(), working.data(), grad.data(), s, n, a.lr, a.beta1, a.beta2, a.eps,
                          a.weight_decay, a.step, a.grad_scale, rounding);
        check_same_bits(to_host(working_d), working, "working", NanMatch::any_nan);
    }
    check_same_bits(to_host(p_d), p, "weights", NanMatch::any_nan);
    check_same_bits(to_host(m_d), m, "m codes");
    check_same_bits(to_host(v_d), v, "v codes");
    check_same_bits(to_host(ma_d), m_absmax, "m absmax");
    check_same_bits(to_host(va_d), v_absmax, "v absmax");
    if (nan_at >= 0) {
        const auto b = static_cast<std::size_t>(nan_at / snug::ops::moment_block);
        CHECK(std::bit_cast<std::uint32_t>(to_host(ma_d)[b]) == 0x7FC0'0000U);
    }
}

}  // namespace

TEST_CASE("cuda adamw_update_8bit gives the host's bits: codes, absmax, weights", "[cuda][adamw][8bit]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const AdamWArgs args[] = {
        {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, 1.0f},
        {1e-2f, 0.8f, 0.99f, 1e-6f, 0.01f, 1000, 0.5f},
    };
    // One element, a partial last block, and (for one combination) more
    // quantisation blocks than one pass of the grid (65,536 thread blocks).
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{3 * 256 + 77}}) {
        for (const auto& a : args) {
            check_adamw_8bit<float, void>(rng, n, a, {rng.next_u32(), 4096 * n});
            check_adamw_8bit<float, snug::bfloat16>(rng, n, a, {rng.next_u32(), 7});
            check_adamw_8bit<float, snug::half>(rng, n, a, {rng.next_u32(), 0});
            check_adamw_8bit<snug::bfloat16, void>(rng, n, a, {rng.next_u32(), 1 << 20});
        }
    }
    check_adamw_8bit<float, snug::bfloat16>(rng, 2 * 256 + 3, args[0], {rng.next_u32(), 0}, 256 + 17);
    check_adamw_8bit<snug::bfloat16, void>(rng, std::int64_t{65536 + 3} * 256 + 5, args[1], {rng.next_u32(), 11});
    CHECK_THROWS_WITH(snug::cuda::adamw_update_8bit(Cuda{}, static_cast<float*>(nullptr), nullptr, nullptr,
                                                    snug::ops::BlockwiseMoments{}, -2, 1e-3f, 0.9f, 0.999f, 1e-8f,
                                                    0.0f, 1, 1.0f),
                      Contains("adamw_update_8bit") && Contains("n = -2"));
}

TEST_CASE("cuda adamw_update with lean state gives the host's bits", "[cuda][adamw][lean]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    SECTION("bf16 moments, fp32 master, bf16 working copy") { check_lean_adamw_sizes<float, snug::bfloat16, snug::bfloat16>(rng, false); }
    SECTION("bf16 moments, fp32 master, half working copy") { check_lean_adamw_sizes<float, snug::bfloat16, snug::half>(rng, false); }
    SECTION("bf16 moments, fp32 weights") { check_lean_adamw_sizes<float, snug::bfloat16, void>(rng, false); }
    SECTION("bf16 weights without a master, fp32 moments") { check_lean_adamw_sizes<snug::bfloat16, float, void>(rng, false); }
    SECTION("bf16 weights without a master, bf16 moments") { check_lean_adamw_sizes<snug::bfloat16, snug::bfloat16, void>(rng, true); }
}

TEST_CASE("cuda adamw_update gives the host's bits, with every working copy and without one", "[cuda][adamw]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    SECTION("no working copy") { check_adamw_sizes<void>(rng, false); }
    SECTION("float working copy") { check_adamw_sizes<float>(rng, false); }
    SECTION("bfloat16 working copy") { check_adamw_sizes<snug::bfloat16>(rng, false); }
    SECTION("half working copy") { check_adamw_sizes<snug::half>(rng, true); }
}

TEST_CASE("cuda adamw_update rejects bad arguments before launching", "[cuda][adamw]") {
    const Cuda dev{};
    float* f = nullptr;
    CHECK_THROWS_WITH(snug::cuda::adamw_update(dev, f, f, f, f, f, -5, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 1.0f),
                      Contains("adamw_update") && Contains("n = -5"));
    CHECK_THROWS_WITH(snug::cuda::adamw_update(dev, f, nullptr, f, f, f, 8, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0, 1.0f),
                      Contains("step = 0"));
    CHECK_THROWS_AS(snug::cuda::adamw_update(dev, f, nullptr, f, f, f, 8, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0, 1.0f),
                    snug::ConfigError);
    snug::cuda::adamw_update(dev, f, nullptr, f, f, f, 0, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 1.0f);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("cuda sum_squares matches the host's double sum and is deterministic", "[cuda][norms]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const snug::Host host;
    MemoryTracker blas_tracker;
    snug::cuda::Blas blas(blas_tracker);
    // Partial sums in stream-ordered memory, or in the Blas workspace (what a training step uses).
    Cuda dev{};
    const bool with_blas = GENERATE(false, true);
    INFO((with_blas ? "partial sums in the Blas workspace" : "partial sums from cudaMallocAsync"));
    if (with_blas) dev.blas = &blas;
    for (const std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, std::int64_t{300'007},
                                 std::int64_t{5'000'017}}) {
        INFO("n = " << n);
        MemoryTracker tracker;
        const auto count = static_cast<std::size_t>(n);
        // Magnitudes over six decades, so the small terms matter to the sum's low bits.
        std::vector<float> grad = random_values<float>(rng, count, -1.0f, 1.0f);
        for (float& g : grad) g *= std::pow(10.0f, -3.0f * rng.uniform());
        auto grad_d = to_device(tracker, grad);
        auto out_d = poisoned<float>(tracker, 1);
        snug::cuda::sum_squares(dev, out_d.data(), grad_d.data(), n);
        float expected = -1.0f;
        snug::host::sum_squares(host, &expected, grad.data(), n);
        const float first = to_host(out_d)[0];
        if (n == 0) {
            CHECK(first == 0.0f);
        } else {
            CHECK(std::abs(double(first) - expected) <= 1e-6 * expected);
        }
        for (int run = 0; run < 2; ++run) {
            auto again_d = poisoned<float>(tracker, 1);
            sum_squares(dev, again_d.data(), grad_d.data(), n);
            CHECK(std::bit_cast<std::uint32_t>(to_host(again_d)[0]) == std::bit_cast<std::uint32_t>(first));
        }
    }
}

TEST_CASE("cuda accumulate_sum adds to a device total as the host does, the same bits every run",
          "[cuda][norms]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const snug::Host host;
    const Cuda dev{};
    MemoryTracker tracker;
    const double start = 0.5 + rng.uniform();  // a running total, not zero
    double expected = start;
    auto total_d = to_device(tracker, std::vector<double>{start});
    std::vector<snug::Buffer<float, Cuda>> passes;
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{511}, std::int64_t{16'385}, std::int64_t{0}}) {
        const std::vector<float> losses = random_values<float>(rng, static_cast<std::size_t>(n), 0.0f, 11.0f);
        passes.push_back(to_device(tracker, losses));
        snug::cuda::accumulate_sum(dev, total_d.data(), passes.back().data(), n);
        snug::host::accumulate_sum(host, &expected, losses.data(), n);
    }
    const double got = to_host(total_d)[0];
    CHECK(std::abs(got - expected) <= 1e-12 * expected);
    CHECK(got != start);
    // Again from the same start: the same bits.
    auto again_d = to_device(tracker, std::vector<double>{start});
    for (std::size_t p = 0; p < passes.size(); ++p)
        snug::cuda::accumulate_sum(dev, again_d.data(), passes[p].data(), std::int64_t(passes[p].size()));
    CHECK(std::bit_cast<std::uint64_t>(to_host(again_d)[0]) == std::bit_cast<std::uint64_t>(got));
    CHECK_THROWS_WITH(snug::cuda::accumulate_sum(dev, nullptr, nullptr, -4),
                      Contains("accumulate_sum") && Contains("n = -4"));
}

TEST_CASE("cuda sum_squares: inf past float's range, and inf or NaN elements propagate", "[cuda][norms]") {
    MemoryTracker tracker;
    const Cuda dev{};
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const auto result = [&](const std::vector<float>& x) {
        auto x_d = to_device(tracker, x);
        auto out_d = poisoned<float>(tracker, 1);
        snug::cuda::sum_squares(dev, out_d.data(), x_d.data(), static_cast<std::int64_t>(x.size()));
        return to_host(out_d)[0];
    };
    std::vector<float> big(5000, 1e20f);  // each square 1e40: finite in double, the sum is not a float
    CHECK(result(big) == inf);
    std::vector<float> ones(4096, 1.0f);
    CHECK(result(ones) == 4096.0f);
    ones[1234] = -inf;
    CHECK(result(ones) == inf);
    ones[99] = nan;
    CHECK(std::isnan(result(ones)));
    CHECK_THROWS_WITH(snug::cuda::sum_squares(dev, nullptr, nullptr, -3),
                      Contains("sum_squares") && Contains("n = -3"));
}

// ZeRO-1 with the optimizer offloaded: each shard's gradients cross the
// offload link in chunks of 512 (both slots reused) and its weights come
// back; the device optimizer's bits (tests/support/offloaded_shards.hpp).
TEST_CASE("cuda: a ZeRO-1 shard offloaded to the host gives the device shard's bits", "[cuda][adamw][offload]") {
    using snug::MasterStorage;
    using snug::MomentStorage;
    const Cuda dev{};
    snug::test::offloaded_shards_match<float, Cuda>(dev, MomentStorage::fp32, MasterStorage::fp32, 2, 512);
    snug::test::offloaded_shards_match<snug::bfloat16, Cuda>(dev, MomentStorage::int8, MasterStorage::none, 3, 512);
    snug::test::offloaded_shards_match<snug::half, Cuda>(dev, MomentStorage::bf16, MasterStorage::fp32, 2, 600);
}
