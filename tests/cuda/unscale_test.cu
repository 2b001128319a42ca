// The CUDA unscale_and_check against the host kernel on fresh random
// gradients, with and without injected inf/NaN: the same bits (one fp32
// multiply per element on both sides; any NaN matches any NaN, since payloads
// differ between CPU and GPU) and the same found_inf. The kernel works in
// place, so there is no output to poison; found_inf starts at 0, or at a value
// that a clean call must leave alone. Sizes cover one element, a vector tail,
// and more elements than one pass of the grid; a pointer offset by one element
// takes the unvectorised path. Calls are unqualified with the device tag
// first, as the trainer makes them. Runs only where a GPU exists.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "snug/cuda/unscale.cuh"
#include "snug/host/unscale.hpp"
#include "snug/snug.hpp"
#include "support/cuda_support.hpp"

namespace {

using snug::Cuda;
using snug::MemoryCategory;
using snug::MemoryTracker;
using snug::test::fresh_seed;

constexpr float pinf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

// Random non-zero gradients: random sign, mantissa in [1, 2), binary exponent
// in [-40, 10] (some products land on subnormals for small inv_scale).
std::vector<float> random_grads(std::mt19937_64& gen, std::size_t n) {
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::uniform_int_distribution<int> exponent(-40, 10);
    std::bernoulli_distribution sign;
    std::vector<float> g(n);
    for (float& x : g) x = (sign(gen) ? -1.0f : 1.0f) * std::ldexp(mantissa(gen), exponent(gen));
    return g;
}

struct Result {
    std::vector<float> grads;
    float found_inf;
};

// Runs the CUDA kernel on g[offset..] (n = g.size() - offset elements), with
// found_inf starting at `initial`.
Result run_cuda(const std::vector<float>& g, std::size_t offset, float inv_scale, float initial) {
    MemoryTracker tracker;
    const Cuda dev{};
    snug::Buffer<float, Cuda> g_d(tracker, MemoryCategory::temporaries, g.size(), "gradients");
    snug::cuda::copy_to_device(g_d.data(), std::span<const float>(g));
    snug::Buffer<float, Cuda> found_d(tracker, MemoryCategory::temporaries, 1, "found_inf");
    snug::cuda::copy_to_device(found_d.data(), &initial, 1);
    const auto n = static_cast<std::int64_t>(g.size() - offset);
    unscale_and_check(dev, g_d.data() + offset, n, inv_scale, found_d.data());
    snug::cuda::check(cudaDeviceSynchronize());
    Result r{std::vector<float>(g.size()), 0.0f};
    snug::cuda::copy_to_host(r.grads.data(), g_d.data(), g.size());
    snug::cuda::copy_to_host(&r.found_inf, found_d.data(), 1);
    return r;
}

Result run_host(std::vector<float> g, std::size_t offset, float inv_scale, float initial) {
    const snug::Host host;
    float found = initial;
    unscale_and_check(host, g.data() + offset, static_cast<std::int64_t>(g.size() - offset), inv_scale, &found);
    return {std::move(g), found};
}

void check_same(const Result& device, const Result& host) {
    REQUIRE(device.grads.size() == host.grads.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < host.grads.size(); ++i) {
        const float d = device.grads[i], h = host.grads[i];
        const bool same =
            std::isnan(h) ? std::isnan(d) : std::bit_cast<std::uint32_t>(d) == std::bit_cast<std::uint32_t>(h);
        if (!same && ++bad <= 5) FAIL_CHECK("[" << i << "]: device " << d << ", host " << h);
    }
    CHECK(bad == 0);
    CHECK(std::bit_cast<std::uint32_t>(device.found_inf) == std::bit_cast<std::uint32_t>(host.found_inf));
}

}  // namespace

TEST_CASE("cuda unscale_and_check gives the host's bits and found_inf", "[cuda][unscale]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 gen(seed);
    const float inv_scales[] = {0x1p-16f, 1.0f / 3.0f, 0x1p+4f};
    // More than one grid pass: 4096 blocks x 256 threads x 4 floats = 2^22.
    const std::size_t sizes[] = {1, 3, 4, 5, 1001, 4'194'307, 20'000'003};
    for (const std::size_t n : sizes) {
        for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
            if (offset >= n) continue;
            for (const float inv_scale : inv_scales) {
                for (const int specials : {0, 1, 4}) {
                    // Large sizes: one scale, and not the many-specials case (host time).
                    if (n > 1'000'000 && (inv_scale != inv_scales[1] || specials == 4)) continue;
                    INFO("n = " << n << ", offset " << offset << ", inv_scale " << inv_scale << ", specials "
                                << specials);
                    std::vector<float> g = random_grads(gen, n);
                    std::uniform_int_distribution<std::size_t> pos(offset, n - 1);
                    const float values[] = {qnan, pinf, -pinf};
                    for (int k = 0; k < specials; ++k) g[pos(gen)] = values[k % 3];
                    if (specials == 1) g[n - 1] = qnan;  // the last element, in the tail when n % 4 != 0
                    for (const float initial : {0.0f, 0.25f}) {
                        const Result host = run_host(g, offset, inv_scale, initial);
                        const Result device = run_cuda(g, offset, inv_scale, initial);
                        check_same(device, host);
                        CHECK(device.found_inf == (specials > 0 ? 1.0f : initial));
                    }
                }
            }
        }
    }
}

TEST_CASE("cuda unscale_and_check: overflow after scaling, ORing over calls, bad sizes", "[cuda][unscale]") {
    MemoryTracker tracker;
    const Cuda dev{};
    // Finite before, inf after.
    const std::vector<float> big = {1.0f, std::numeric_limits<float>::max(), -2.0f};
    check_same(run_cuda(big, 0, 2.0f, 0.0f), run_host(big, 0, 2.0f, 0.0f));
    CHECK(run_cuda(big, 0, 2.0f, 0.0f).found_inf == 1.0f);

    // Three buffers, one with a NaN: found_inf stays 1 after the later clean call.
    std::mt19937_64 gen(17);
    std::vector<float> a = random_grads(gen, 1001), b = random_grads(gen, 77), c = random_grads(gen, 513);
    b[76] = qnan;
    snug::Buffer<float, Cuda> found_d(tracker, MemoryCategory::temporaries, 1, "found_inf");
    const float zero = 0.0f;
    snug::cuda::copy_to_device(found_d.data(), &zero, 1);
    float found = -1.0f;
    for (std::vector<float>* v : {&a, &b, &c}) {
        snug::Buffer<float, Cuda> v_d(tracker, MemoryCategory::temporaries, v->size(), "gradients");
        snug::cuda::copy_to_device(v_d.data(), std::span<const float>(*v));
        unscale_and_check(dev, v_d.data(), static_cast<std::int64_t>(v->size()), 0.5f, found_d.data());
        snug::cuda::check(cudaDeviceSynchronize());
        snug::cuda::copy_to_host(&found, found_d.data(), 1);
        CHECK(found == (v == &a ? 0.0f : 1.0f));
    }

    using Catch::Matchers::Contains;
    CHECK_THROWS_AS(snug::cuda::unscale_and_check(dev, nullptr, -1, 1.0f, found_d.data()), snug::ShapeError);
    CHECK_THROWS_WITH(snug::cuda::unscale_and_check(dev, nullptr, -4, 1.0f, found_d.data()),
                      Contains("unscale_and_check") && Contains("n = -4"));
    snug::cuda::unscale_and_check(dev, nullptr, 0, 1.0f, found_d.data());  // n == 0 launches nothing
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}
