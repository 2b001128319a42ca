// The CUDA encoder (token + position embedding) against the host kernel on
// fresh random inputs, outputs poisoned first. Both directions do one fp32
// operation per output element in the host's order (the forward one add, the
// backward its additions one at a time in row order), so the test asks for
// the host's bits, which is stronger than the 1e-5 / 1e-2 tolerances. Sizes
// cover T = 1, C not a multiple of 32, ids that repeat in long runs (the
// backward's list fills and flushes several times), and a GPT-2-sized vocabulary.
// Runs only where a GPU exists.
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

#include "snug/cuda/encoder.cuh"
#include "snug/host/encoder.hpp"
#include "snug/snug.hpp"
#include "support/cuda_support.hpp"

using Catch::Matchers::Contains;
using snug::Cuda;
using snug::MemoryCategory;
using snug::MemoryTracker;
using namespace snug::test;

namespace {

struct EncoderSize {
    int B, T, C, V, Vp, maxT;
};

template <class T>
void check_encoder(snug::Generator& rng, const EncoderSize& z) {
    INFO("B = " << z.B << ", T = " << z.T << ", C = " << z.C << ", V = " << z.V << ", Vp = " << z.Vp);
    MemoryTracker tracker;
    const snug::Host host;
    const Cuda dev{};
    const auto rows = static_cast<std::size_t>(z.B) * z.T;
    const auto C = static_cast<std::size_t>(z.C);
    std::vector<std::int32_t> tokens(rows);
    for (auto& id : tokens) id = static_cast<std::int32_t>(rng.below(static_cast<std::uint32_t>(z.V)));
    const auto wte = random_values<T>(rng, static_cast<std::size_t>(z.Vp) * C, -1.0f, 1.0f);
    const auto wpe = random_values<T>(rng, static_cast<std::size_t>(z.maxT) * C, -1.0f, 1.0f);
    const auto dout = random_values<T>(rng, rows * C, -1.0f, 1.0f);
    // The gradients accumulate: start from values that are not zero.
    const auto dwte0 = random_values<float>(rng, static_cast<std::size_t>(z.Vp) * C, -0.5f, 0.5f);
    const auto dwpe0 = random_values<float>(rng, static_cast<std::size_t>(z.maxT) * C, -0.5f, 0.5f);

    auto tokens_d = to_device(tracker, tokens);
    auto wte_d = to_device(tracker, wte);
    auto wpe_d = to_device(tracker, wpe);
    auto dout_d = to_device(tracker, dout);
    auto out_d = poisoned<T>(tracker, rows * C);
    encoder_forward(dev, out_d.data(), tokens_d.data(), wte_d.data(), wpe_d.data(), z.B, z.T, z.C);
    std::vector<T> out(rows * C);
    encoder_forward(host, out.data(), tokens.data(), wte.data(), wpe.data(), z.B, z.T, z.C);
    check_same_bits(to_host(out_d), out, "out");

    auto dwte_d = to_device(tracker, dwte0);
    auto dwpe_d = to_device(tracker, dwpe0);
    encoder_backward(dev, dwte_d.data(), dwpe_d.data(), dout_d.data(), tokens_d.data(), z.B, z.T, z.C);
    std::vector<float> dwte = dwte0, dwpe = dwpe0;
    encoder_backward(host, dwte.data(), dwpe.data(), dout.data(), tokens.data(), z.B, z.T, z.C);
    check_same_bits(to_host(dwte_d), dwte, "dwte");
    check_same_bits(to_host(dwpe_d), dwpe, "dwpe");

    // Without positions (wpe, dwpe nullptr): wte's rows, and wte's gradient alone.
    auto out0_d = poisoned<T>(tracker, rows * C);
    encoder_forward(dev, out0_d.data(), tokens_d.data(), wte_d.data(), static_cast<const T*>(nullptr), z.B, z.T, z.C);
    std::vector<T> out0(rows * C);
    encoder_forward(host, out0.data(), tokens.data(), wte.data(), static_cast<const T*>(nullptr), z.B, z.T, z.C);
    check_same_bits(to_host(out0_d), out0, "out without positions");
    auto dwte0_d = to_device(tracker, dwte0);
    encoder_backward(dev, dwte0_d.data(), static_cast<float*>(nullptr), dout_d.data(), tokens_d.data(), z.B, z.T, z.C);
    check_same_bits(to_host(dwte0_d), dwte, "dwte without positions");
}

}  // namespace

TEMPLATE_TEST_CASE("cuda encoder forward and backward give the host's bits", "[cuda][encoder]", float, snug::bfloat16,
                   snug::half) {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const EncoderSize sizes[] = {
        {1, 1, 1, 1, 1, 1},            // one of everything
        {2, 1, 37, 11, 16, 4},         // T = 1, C not a multiple of 32, Vp > V, maxT > T
        {3, 7, 33, 5, 8, 9},           // few ids: long runs of one id
        {4, 1250, 19, 3, 3, 1300},     // 5000 rows of 3 ids: every list flushes several times
        {2, 300, 70, 50257, 50304, 300},  // GPT-2's vocabulary: most ids once, C > 64
    };
    for (const auto& z : sizes) check_encoder<TestType>(rng, z);
}

TEST_CASE("cuda encoder backward is deterministic and accumulates", "[cuda][encoder]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    MemoryTracker tracker;
    const Cuda dev{};
    const int B = 8, T = 512, C = 96, V = 40;
    const auto rows = static_cast<std::size_t>(B) * T;
    std::vector<std::int32_t> tokens(rows);
    for (auto& id : tokens) id = static_cast<std::int32_t>(rng.below(V));
    const auto dout = random_values<float>(rng, rows * C, -1.0f, 1.0f);
    const auto dwte0 = random_values<float>(rng, std::size_t{V} * C, -0.5f, 0.5f);
    const auto dwpe0 = random_values<float>(rng, std::size_t{T} * C, -0.5f, 0.5f);
    auto tokens_d = to_device(tracker, tokens);
    auto dout_d = to_device(tracker, dout);

    std::vector<float> first_wte, first_wpe;
    for (int run = 0; run < 3; ++run) {
        auto dwte_d = to_device(tracker, dwte0);
        auto dwpe_d = to_device(tracker, dwpe0);
        encoder_backward(dev, dwte_d.data(), dwpe_d.data(), dout_d.data(), tokens_d.data(), B, T, C);
        if (run == 0) {
            first_wte = to_host(dwte_d);
            first_wpe = to_host(dwpe_d);
            // It accumulated: a second call adds the same gradient again.
            encoder_backward(dev, dwte_d.data(), dwpe_d.data(), dout_d.data(), tokens_d.data(), B, T, C);
            const auto twice = to_host(dwte_d);
            std::size_t moved = 0;
            for (std::size_t i = 0; i < twice.size(); ++i) {
                const double step = double(first_wte[i]) - dwte0[i];
                moved += std::abs((double(twice[i]) - first_wte[i]) - step) <= 1e-4 ? 1 : 0;
            }
            CHECK(moved == twice.size());
        } else {
            check_same_bits(to_host(dwte_d), first_wte, "dwte, run " + std::to_string(run));
            check_same_bits(to_host(dwpe_d), first_wpe, "dwpe, run " + std::to_string(run));
        }
    }
}

TEST_CASE("cuda encoder rejects bad sizes before launching", "[cuda][encoder]") {
    const Cuda dev{};
    float* f = nullptr;
    const std::int32_t* ids = nullptr;
    CHECK_THROWS_AS(snug::cuda::encoder_forward(dev, f, ids, f, f, -1, 4, 8), snug::ShapeError);
    CHECK_THROWS_WITH(snug::cuda::encoder_backward(dev, f, f, f, ids, 2, -3, 8),
                      Contains("encoder_backward") && Contains("T = -3"));
    CHECK_THROWS_WITH(snug::cuda::encoder_forward(dev, f, ids, f, f, 65536, 65536, 8), Contains("B * T"));
    // Nothing to do: no launch, no error.
    snug::cuda::encoder_forward(dev, f, ids, f, f, 0, 4, 8);
    snug::cuda::encoder_backward(dev, f, f, f, ids, 3, 0, 8);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}
