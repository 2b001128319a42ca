// Host unscale_and_check against references formed here another way: each
// product in double (the product of two floats is exact in double, so
// rounding it to float once is the correctly rounded float product), exact
// powers of two by std::ldexp, and the finite check by std::isfinite on the
// input and on the reference product. Also the found_inf contract: left alone
// when clean, set by one inf or NaN anywhere (every position of short buffers,
// the vector tail included), never reset by a later clean call.
#include "snug/host/unscale.hpp"

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "snug/core/error.hpp"

namespace {

using snug::host::Device;

constexpr float pinf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

std::uint64_t fresh_seed() {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

// Random non-zero gradients: random sign, mantissa in [1, 2), exponent in
// [lo, hi] (binary).
std::vector<float> random_grads(std::mt19937_64& gen, std::size_t n, int lo = -40, int hi = 10) {
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::uniform_int_distribution<int> exponent(lo, hi);
    std::bernoulli_distribution sign;
    std::vector<float> g(n);
    for (float& x : g) x = (sign(gen) ? -1.0f : 1.0f) * std::ldexp(mantissa(gen), exponent(gen));
    return g;
}

// Puts `count` values from {+inf, -inf, NaN} at random positions.
void inject(std::mt19937_64& gen, std::vector<float>& g, int count) {
    std::uniform_int_distribution<std::size_t> pos(0, g.size() - 1);
    const float specials[] = {pinf, -pinf, qnan};
    for (int k = 0; k < count; ++k) g[pos(gen)] = specials[k % 3];
}

struct Expected {
    std::vector<float> grads;
    bool found_inf;
};

// The reference: each product in double, rounded to float once; flagged when
// an input or a rounded product is not finite.
Expected reference(const std::vector<float>& g, float inv_scale) {
    Expected e{std::vector<float>(g.size()), false};
    for (std::size_t i = 0; i < g.size(); ++i) {
        e.grads[i] = static_cast<float>(static_cast<double>(g[i]) * static_cast<double>(inv_scale));
        e.found_inf = e.found_inf || !std::isfinite(g[i]) || !std::isfinite(e.grads[i]);
    }
    return e;
}

// Same bits, except that any NaN matches any NaN (payloads are not promised).
void check_values(const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        const bool same = std::isnan(want[i]) ? std::isnan(got[i])
                                              : std::bit_cast<std::uint32_t>(got[i]) ==
                                                    std::bit_cast<std::uint32_t>(want[i]);
        if (!same && ++bad <= 5) FAIL_CHECK("[" << i << "]: got " << got[i] << ", want " << want[i]);
    }
    CHECK(bad == 0);
}

// Runs the kernel on a copy of g with found_inf starting at 0.
Expected run(std::vector<float> g, float inv_scale) {
    float found = 0.0f;
    snug::host::unscale_and_check(Device{}, g.data(), static_cast<std::int64_t>(g.size()), inv_scale, &found);
    REQUIRE((found == 0.0f || found == 1.0f));
    return {std::move(g), found == 1.0f};
}

}  // namespace

TEST_CASE("unscale_and_check matches a double reference on random gradients, with and without inf/NaN",
          "[unscale]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 gen(seed);
    // Powers of two (exact) and scales that round: 1/65536, 1/3, 1/1000, 0.7.
    const float inv_scales[] = {0x1p-16f, 0x1p-24f, 0x1p+3f, 1.0f / 3.0f, 1e-3f, 0.7f};
    // Sizes around the 8-wide lanes and past two parallel ranges of 2^18.
    const std::size_t sizes[] = {1, 7, 8, 9, 1000, 1031, 1'300'003};
    for (const std::size_t n : sizes) {
        for (const float inv_scale : inv_scales) {
            for (const int specials : {0, 1, 5}) {
                INFO("n = " << n << ", inv_scale = " << inv_scale << ", specials = " << specials);
                std::vector<float> g = random_grads(gen, n);
                if (specials > 0) inject(gen, g, specials);
                const Expected want = reference(g, inv_scale);
                const Expected got = run(g, inv_scale);
                check_values(got.grads, want.grads);
                CHECK(got.found_inf == want.found_inf);
                CHECK(got.found_inf == (specials > 0));
            }
        }
    }
}

TEST_CASE("unscale_and_check by a power of two is exact (std::ldexp), subnormal results included", "[unscale]") {
    std::mt19937_64 gen(11);
    const std::vector<float> g = random_grads(gen, 100'003, -120, 120);
    for (const int e : {-16, -1, 1, 5}) {
        INFO("inv_scale = 2^" << e);
        std::vector<float> want(g.size());
        for (std::size_t i = 0; i < g.size(); ++i) want[i] = std::ldexp(g[i], e);  // exact, or one rounding
        const Expected got = run(g, std::ldexp(1.0f, e));
        check_values(got.grads, want);
        CHECK_FALSE(got.found_inf);
    }
    // Products below 2^-126 land on subnormals and round there.
    const std::vector<float> tiny = random_grads(gen, 4099, -126, -100);
    const Expected got = run(tiny, 0x1p-30f);
    check_values(got.grads, reference(tiny, 0x1p-30f).grads);
    std::size_t subnormal = 0;
    for (const float y : got.grads) subnormal += std::fpclassify(y) == FP_SUBNORMAL ? 1 : 0;
    CHECK(subnormal > 1000);
    CHECK_FALSE(got.found_inf);
}

TEST_CASE("unscale_and_check: found_inf stays unchanged on clean gradients", "[unscale]") {
    std::mt19937_64 gen(3);
    for (const std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{4096}, std::size_t{600'001}}) {
        INFO("n = " << n);
        const std::vector<float> g = random_grads(gen, n);
        for (const float initial : {0.0f, 0.25f, -3.0f}) {
            std::vector<float> copy = g;
            float found = initial;
            snug::host::unscale_and_check(Device{}, copy.data(), std::int64_t(n), 0x1p-16f, &found);
            CHECK(std::bit_cast<std::uint32_t>(found) == std::bit_cast<std::uint32_t>(initial));
        }
    }
    // n == 0: nothing read or written (null pointers are fine).
    float found = 0.5f;
    snug::host::unscale_and_check(Device{}, nullptr, 0, 0x1p-16f, &found);
    CHECK(found == 0.5f);
}

TEST_CASE("unscale_and_check: one inf or NaN at any position sets found_inf", "[unscale]") {
    std::mt19937_64 gen(7);
    // Every position of sizes around the 8-wide lanes (the tail included)...
    for (std::size_t n = 1; n <= 35; ++n) {
        const std::vector<float> g = random_grads(gen, n);
        for (std::size_t p = 0; p < n; ++p) {
            for (const float special : {qnan, pinf, -pinf}) {
                INFO("n = " << n << ", position " << p << ", value " << special);
                std::vector<float> copy = g;
                copy[p] = special;
                float found = 0.0f;
                snug::host::unscale_and_check(Device{}, copy.data(), std::int64_t(n), 0x1p-16f, &found);
                CHECK(found == 1.0f);
                CHECK(std::isnan(copy[p]) == std::isnan(special));
            }
        }
    }
    // ...and the first, a middle and the last position of buffers split over
    // several threads, n not a multiple of 8.
    for (const std::size_t n : {std::size_t{1'048'583}, std::size_t{2'000'001}}) {
        const std::vector<float> g = random_grads(gen, n);
        for (const std::size_t p : {std::size_t{0}, n / 2 + 3, n - 1}) {
            INFO("n = " << n << ", position " << p);
            std::vector<float> copy = g;
            copy[p] = qnan;
            float found = 0.0f;
            snug::host::unscale_and_check(Device{}, copy.data(), std::int64_t(n), 0x1p-16f, &found);
            CHECK(found == 1.0f);
        }
    }
}

TEST_CASE("unscale_and_check: overflow after scaling counts, and inf * 0 is caught", "[unscale]") {
    // Finite before, inf after.
    const Expected big = run({1.0f, std::numeric_limits<float>::max(), -2.0f}, 2.0f);
    CHECK(big.found_inf);
    CHECK(big.grads[1] == pinf);
    CHECK(big.grads[0] == 2.0f);
    CHECK(run({0x1p100f, 1.0f}, 0x1p40f).found_inf);
    CHECK_FALSE(run({0x1p100f, 1.0f}, 0x1p20f).found_inf);
    // inv_scale 0: a finite gradient becomes 0 (clean), an inf becomes NaN (flagged).
    const Expected zero = run({3.0f, -5.0f}, 0.0f);
    CHECK_FALSE(zero.found_inf);
    CHECK(zero.grads[0] == 0.0f);
    const Expected inf_times_zero = run({3.0f, pinf}, 0.0f);
    CHECK(inf_times_zero.found_inf);
    CHECK(std::isnan(inf_times_zero.grads[1]));
}

TEST_CASE("unscale_and_check: calls OR into found_inf, a later clean call does not reset it", "[unscale]") {
    std::mt19937_64 gen(19);
    std::vector<float> a = random_grads(gen, 1001), b = random_grads(gen, 77), c = random_grads(gen, 513);
    b[76] = qnan;
    const std::vector<float> c_before = c;
    float found = 0.0f;
    snug::host::unscale_and_check(Device{}, a.data(), std::int64_t(a.size()), 0.5f, &found);
    CHECK(found == 0.0f);
    snug::host::unscale_and_check(Device{}, b.data(), std::int64_t(b.size()), 0.5f, &found);
    CHECK(found == 1.0f);
    snug::host::unscale_and_check(Device{}, c.data(), std::int64_t(c.size()), 0.5f, &found);
    CHECK(found == 1.0f);
    // The clean call still scaled its buffer.
    for (std::size_t i = 0; i < c.size(); ++i) CHECK(c[i] == std::ldexp(c_before[i], -1));
}

TEST_CASE("unscale_and_check rejects a negative size", "[unscale]") {
    using Catch::Matchers::Contains;
    float found = 0.0f;
    CHECK_THROWS_AS(snug::host::unscale_and_check(Device{}, nullptr, -1, 1.0f, &found), snug::ShapeError);
    CHECK_THROWS_WITH(snug::host::unscale_and_check(Device{}, nullptr, -4, 1.0f, &found),
                      Contains("unscale_and_check") && Contains("n = -4"));
    CHECK(found == 0.0f);
}
