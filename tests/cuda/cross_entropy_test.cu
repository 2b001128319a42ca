// The CUDA fused softmax + cross-entropy against the host kernel on fresh
// random logits, losses poisoned first, for float, bfloat16 and half: the
// per-row losses within 1e-5 (fp32 math for every T), the gradient written in
// place within 1e-5 (fp32) or 1e-2 (16-bit) relative to |host| + rms(host),
// and the padded columns set to 0. dloss == 0 must leave the logits untouched,
// padding included; a target outside [0, V) gives a NaN loss and an untouched
// row. Sizes cover V = 1, V not a multiple of 8, Vp > V, and GPT-2's
// vocabulary; Vp a multiple of 8 takes the 16-byte vector path (V % W
// columns in the scalar tail), Vp = 513 one column at a time. Runs only where a GPU exists.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/cuda/cross_entropy.cuh"
#include "snug/host/cross_entropy.hpp"
#include "snug/snug.hpp"
#include "support/cuda_support.hpp"

using Catch::Matchers::Contains;
using snug::Cuda;
using snug::MemoryCategory;
using snug::MemoryTracker;
using namespace snug::test;

namespace {

struct CrossEntropySize {
    std::int64_t N;
    int V, Vp;
};

template <class T>
void check_cross_entropy(snug::Generator& rng, const CrossEntropySize& z, float dloss) {
    INFO("N = " << z.N << ", V = " << z.V << ", Vp = " << z.Vp << ", dloss = " << dloss);
    MemoryTracker tracker;
    const snug::Host host;
    const Cuda dev{};
    const auto rows = static_cast<std::size_t>(z.N);
    // Logits in [-6, 6); the padded columns hold random values too, which the
    // gradient must overwrite with 0 (and evaluation must leave alone).
    const auto logits = random_values<T>(rng, rows * static_cast<std::size_t>(z.Vp), -6.0f, 6.0f);
    std::vector<std::int32_t> targets(rows);
    for (auto& t : targets) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint32_t>(z.V)));

    auto logits_d = to_device(tracker, logits);
    auto targets_d = to_device(tracker, targets);
    auto losses_d = poisoned<float>(tracker, rows);
    softmax_cross_entropy(dev, losses_d.data(), logits_d.data(), targets_d.data(), z.N, z.V, z.Vp, dloss);
    std::vector<T> grad = logits;
    std::vector<float> losses(rows);
    softmax_cross_entropy(host, losses.data(), grad.data(), targets.data(), z.N, z.V, z.Vp, dloss);
    check_close(to_host(losses_d), losses, 1e-5, "losses");
    if (dloss == 0.0f) {
        check_same_bits(to_host(logits_d), logits, "logits after evaluation");
        return;
    }
    const auto device_grad = to_host(logits_d);
    check_close(device_grad, grad, tolerance<T>(), "dlogits");
    std::size_t nonzero_padding = 0;
    for (std::size_t r = 0; r < rows; ++r) {
        for (int j = z.V; j < z.Vp; ++j) {
            nonzero_padding += bits_of(device_grad[r * static_cast<std::size_t>(z.Vp) + j]) == 0 ? 0 : 1;
        }
    }
    CHECK(nonzero_padding == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("cuda softmax_cross_entropy matches the host", "[cuda][cross_entropy]", float, snug::bfloat16,
                   snug::half) {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const CrossEntropySize sizes[] = {
        {1, 1, 1}, {3, 1, 8}, {7, 50, 56}, {5, 1000, 1024}, {1, 513, 513}, {3, 50257, 50304},
    };
    for (const auto& z : sizes) {
        check_cross_entropy<TestType>(rng, z, 1.0f / static_cast<float>(z.N));
        check_cross_entropy<TestType>(rng, z, 0.0f);
    }
}

TEST_CASE("cuda softmax_cross_entropy: a target outside 0 .. V-1 gives a NaN loss and leaves its row alone",
          "[cuda][cross_entropy]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    MemoryTracker tracker;
    const Cuda dev{};
    const int V = 37, Vp = 40;
    const auto logits = random_values<float>(rng, 3 * Vp, -3.0f, 3.0f);
    const std::vector<std::int32_t> targets{V, 5, -1};
    auto logits_d = to_device(tracker, logits);
    auto targets_d = to_device(tracker, targets);
    auto losses_d = poisoned<float>(tracker, 3);
    snug::cuda::softmax_cross_entropy(dev, losses_d.data(), logits_d.data(), targets_d.data(), 3, V, Vp, 0.5f);
    const auto losses = to_host(losses_d);
    const auto after = to_host(logits_d);
    CHECK(std::isnan(losses[0]));
    CHECK(std::isnan(losses[2]));
    CHECK(std::isfinite(losses[1]));
    CHECK(losses[1] > 0.0f);
    std::size_t changed = 0;
    for (std::size_t j = 0; j < std::size_t{Vp}; ++j) {
        changed += bits_of(after[j]) == bits_of(logits[j]) ? 0 : 1;                  // row 0
        changed += bits_of(after[2 * Vp + j]) == bits_of(logits[2 * Vp + j]) ? 0 : 1;  // row 2
    }
    CHECK(changed == 0);
    // The valid row became a gradient: it sums to 0 over the classes.
    double sum = 0.0;
    for (int j = 0; j < V; ++j) sum += after[static_cast<std::size_t>(Vp + j)];
    CHECK(std::abs(sum) < 1e-5);
}

TEST_CASE("cuda softmax_cross_entropy rejects bad sizes before launching", "[cuda][cross_entropy]") {
    const Cuda dev{};
    float* f = nullptr;
    const std::int32_t* ids = nullptr;
    CHECK_THROWS_WITH(snug::cuda::softmax_cross_entropy(dev, f, f, ids, 4, 60, 56, 1.0f),
                      Contains("V = 60") && Contains("Vp = 56"));
    CHECK_THROWS_WITH(snug::cuda::softmax_cross_entropy(dev, f, f, ids, -1, 4, 8, 1.0f), Contains("N = -1"));
    CHECK_THROWS_AS(snug::cuda::softmax_cross_entropy(dev, f, f, ids, 4, 0, 8, 1.0f), snug::ShapeError);
    snug::cuda::softmax_cross_entropy(dev, f, f, ids, 0, 4, 8, 1.0f);  // no rows: nothing to launch
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}
