// sum_squares against sums formed here a different way: a compensated
// (Kahan) double sum over the values sorted by magnitude, and closed forms.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/host/norms.hpp"

namespace {

using snug::host::Device;

float run(const std::vector<float>& x) {
    float out = std::numeric_limits<float>::quiet_NaN();
    snug::host::sum_squares(Device{}, &out, x.data(), std::int64_t(x.size()));
    return out;
}

// Smallest squares first, with Kahan compensation: accurate to about one
// double rounding, far below the float result's own rounding.
double reference(const std::vector<float>& x) {
    std::vector<double> sq(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) sq[i] = double(x[i]) * double(x[i]);
    std::sort(sq.begin(), sq.end());
    double sum = 0.0, c = 0.0;
    for (const double s : sq) {
        const double y = s - c;
        const double t = sum + y;
        c = (t - sum) - y;
        sum = t;
    }
    return sum;
}

// |got - want| <= one float ulp of want: what rounding a (nearly) exact
// double to float may cost.
bool within_one_ulp(float got, double want) {
    return std::abs(double(got) - want) <= std::abs(want) * 0x1p-23;
}

}  // namespace

TEST_CASE("sum_squares of a million mixed-magnitude values matches a compensated double sum", "[norms]") {
    std::mt19937 gen(5);
    std::uniform_real_distribution<float> exponent(-12.0f, 6.0f);
    std::bernoulli_distribution sign;
    for (const std::size_t n : {std::size_t{1'000'000}, std::size_t{1'000'003}, std::size_t{131'071}}) {
        INFO("n = " << n);
        std::vector<float> x(n);
        for (float& v : x) v = (sign(gen) ? 1.0f : -1.0f) * std::pow(10.0f, exponent(gen));
        const float got = run(x);
        const double want = reference(x);
        CHECK(within_one_ulp(got, want));
    }
}

TEST_CASE("sum_squares accumulates in double: many small squares are not lost", "[norms]") {
    // 10^6 squares of 0.1f: a float accumulator (in any order, over a few
    // lanes) drifts by far more than one ulp; the exact sum is 10^6 * 0.1f^2.
    const std::size_t n = 1'000'000;
    const std::vector<float> x(n, 0.1f);
    const double exact = double(n) * (double(0.1f) * double(0.1f));
    CHECK(within_one_ulp(run(x), exact));

    // One large square of 2^24 before 10^6 squares of 1: in float, each + 1
    // would round away.
    std::vector<float> y(n + 1, 1.0f);
    y[0] = 4096.0f;
    CHECK(run(y) == float(16'777'216.0 + 1'000'000.0));
}

TEST_CASE("sum_squares on small and odd sizes, and its special values", "[norms]") {
    CHECK(run({}) == 0.0f);
    CHECK(run({-3.0f}) == 9.0f);
    std::vector<float> x(17);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i) - 8.0f;  // sum of squares: 2 * (1 + ... + 64)
    CHECK(run(x) == 408.0f);
    x[5] = std::numeric_limits<float>::infinity();
    CHECK(run(x) == std::numeric_limits<float>::infinity());
    x[5] = std::numeric_limits<float>::quiet_NaN();
    CHECK(std::isnan(run(x)));
    // Finite values whose squares sum past float's range: +inf, not undefined behaviour.
    CHECK(run({3e19f, -3e19f}) == std::numeric_limits<float>::infinity());
    // Squares below float's range (1e-50) that sum to a float subnormal: a
    // float square would be 0; the double sum rounds once, to the nearest subnormal.
    const std::vector<float> tiny(1'000'000, 1e-25f);
    const double tiny_sum = 1e6 * (double(1e-25f) * double(1e-25f));
    CHECK(run(tiny) > 0.0f);
    CHECK(run(tiny) == static_cast<float>(tiny_sum));
}

TEST_CASE("sum_squares is deterministic and rejects a negative size", "[norms]") {
    std::mt19937 gen(8);
    std::normal_distribution<float> dist;
    std::vector<float> x(2'000'001);
    for (float& v : x) v = dist(gen);
    const float first = run(x);
    for (int i = 0; i < 3; ++i) CHECK(run(x) == first);
    float out = 1.0f;
    CHECK_THROWS_AS(snug::host::sum_squares(Device{}, &out, x.data(), -1), snug::ShapeError);
    CHECK(out == 1.0f);
}

TEST_CASE("accumulate_sum adds a span's sum in double to a running total", "[norms]") {
    std::mt19937 gen(21);
    std::uniform_real_distribution<float> dist(0.0f, 12.0f);  // token losses
    double total = 0.25;
    long double expected = 0.25L;  // formed here in long double
    for (int pass = 0; pass < 3; ++pass) {
        std::vector<float> x(40'003 + pass);
        for (float& v : x) {
            v = dist(gen);
            expected += v;
        }
        snug::host::accumulate_sum(Device{}, &total, x.data(), std::int64_t(x.size()));
    }
    CHECK(std::abs(static_cast<long double>(total) - expected) <= 1e-12L * expected);
    // Sums past float's precision keep their low terms: a half and 2^25 ones.
    std::vector<float> ones(std::size_t{1} << 25, 1.0f);
    double big = 0.5;
    snug::host::accumulate_sum(Device{}, &big, ones.data(), std::int64_t(ones.size()));
    CHECK(big == 33'554'432.5);
    CHECK_THROWS_WITH(snug::host::accumulate_sum(Device{}, &big, ones.data(), -2),
                      Catch::Matchers::Contains("accumulate_sum") && Catch::Matchers::Contains("n = -2"));
    CHECK(big == 33'554'432.5);
}
