// Host GELU (tanh approximation): the fp32 exponential against std::exp, the
// forward and its derivative against the textbook tanh formula evaluated in
// long double, the backward by central finite differences in double, aliasing,
// non-finite inputs, the parallel path, and the 16-bit kernels against the
// float kernel on identical rounded inputs (RNE stores).
#include "snug/host/gelu.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "support/host_support.hpp"

namespace {

using snug::bfloat16;
using snug::half;
using snug::host::Device;
using snug::test::is_rne;

constexpr long double pi_l = 3.14159265358979323846264338327950288L;

// The definition in long double: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x +
// 0.044715 x^3). Where 1 + tanh(u) cancels (u < -1) it is evaluated as the
// equal 2 e^(2u) / (1 + e^(2u)), so that the reference keeps its precision in
// the negative tail.
long double gelu_ref(long double x) {
    const long double u = std::sqrt(2.0L / pi_l) * (x + 0.044715L * x * x * x);
    const long double one_plus_tanh = u >= -1.0L ? 1.0L + std::tanh(u) : 2.0L * std::exp(2.0L * u) / (1.0L + std::exp(2.0L * u));
    return 0.5L * x * one_plus_tanh;
}

// Its derivative: 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx, with
// 1 - tanh^2 u = 4 e^(2u) / (1 + e^(2u))^2 evaluated directly. With
// `magnitude`, the sum of the two terms' absolute values instead: the scale of
// the rounding error where they cancel (near x = -0.75, gelu's minimum).
long double gelu_grad_ref(long double x, bool magnitude = false) {
    const long double k0 = std::sqrt(2.0L / pi_l);
    const long double u = k0 * (x + 0.044715L * x * x * x);
    const long double t = std::tanh(u);
    const long double e = std::exp(-2.0L * std::fabs(u));  // <= 1: no overflow
    const long double sech2 = 4.0L * e / ((1.0L + e) * (1.0L + e));
    const long double one_plus_tanh = u >= -1.0L ? 1.0L + t : 2.0L * std::exp(2.0L * u) / (1.0L + std::exp(2.0L * u));
    const long double a = 0.5L * one_plus_tanh;
    const long double b = 0.5L * x * sech2 * k0 * (1.0L + 3.0L * 0.044715L * x * x);
    return magnitude ? std::fabs(a) + std::fabs(b) : a + b;
}

// How many fp32 roundings' worth of relative error gelu at x may carry: e^(-2u)
// amplifies the rounding of u by |2u| (a property of the function in fp32,
// the same for CUDA's tanhf form).
double gelu_condition(double x) {
    const double u = std::sqrt(2.0 / 3.141592653589793) * (x + 0.044715 * x * x * x);
    return 4.0 + 2.0 * std::fabs(u);
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo, float hi) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) {
        do {
            x = dist(gen);
        } while (x == 0.0F);
    }
    return v;
}

}  // namespace

TEST_CASE("exp_f32 is within 2 ulp of e^x over [-87, 88]", "[gelu]") {
    double worst_ulp = 0.0;
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> dist(-87.0F, 88.0F);
    std::vector<float> xs{-87.0F, 88.0F, 0.0F, -0.0F, 1.0F, -1.0F, 0.34657359F, -0.34657359F, 1e-8F};
    for (int i = 0; i < 200000; ++i) xs.push_back(dist(gen));
    for (int i = -2000; i <= 2000; ++i) xs.push_back(static_cast<float>(i) * 0.001F);  // near 0
    for (float x : xs) {
        const float got = snug::host::detail::exp_f32(x);
        const double want = std::exp(static_cast<double>(x));
        // ulp of the float nearest `want` (normal or subnormal).
        const auto wf = static_cast<float>(want);
        const double ulp = std::nextafter(wf, std::numeric_limits<float>::infinity()) - wf;
        worst_ulp = std::max(worst_ulp, std::fabs(static_cast<double>(got) - want) / ulp);
    }
    CHECK(worst_ulp < 2.0);
}

TEST_CASE("gelu_forward (float) against the tanh formula in long double", "[gelu]") {
    const Device dev;
    auto x = random_floats(5001, 2, -8.0F, 8.0F);
    for (float v : {1e-6F, -1e-6F, 0.5F, -0.5F, 3.0F, -3.0F, 7.99F, -7.99F, -0.75F}) x.push_back(v);
    const auto n = static_cast<std::int64_t>(x.size());
    std::vector<float> out(x.size(), std::numeric_limits<float>::quiet_NaN());
    snug::host::gelu_forward(dev, out.data(), x.data(), n);
    // Relative error in units of fp32 epsilon times the condition number.
    double worst = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const auto want = static_cast<double>(gelu_ref(x[i]));
        const double rel = std::fabs(out[i] - want) / std::fabs(want);
        worst = std::max(worst, rel / (0x1p-24 * gelu_condition(x[i])));
    }
    CHECK(worst < 4.0);
}

TEST_CASE("gelu: the far negative tail, large positive x and non-finite inputs", "[gelu]") {
    const Device dev;
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> x{-10.0F, -30.0F, -1e4F, -3e38F, 10.0F, 100.0F, 3e38F, inf, -inf, nan, 0.0F};
    std::vector<float> out(x.size()), d(x.size());
    const std::vector<float> ones(x.size(), 1.0F);
    snug::host::gelu_forward(dev, out.data(), x.data(), static_cast<std::int64_t>(x.size()));
    snug::host::gelu_backward(dev, d.data(), x.data(), ones.data(), static_cast<std::int64_t>(x.size()));
    for (std::size_t i = 0; i < 4; ++i) {
        INFO("x = " << x[i]);
        CHECK(out[i] <= 0.0F);
        CHECK(out[i] > -1e-20F);  // true values: -5e-21 at x = -10, underflow below
        CHECK(std::fabs(d[i]) < 1e-18F);
    }
    CHECK(out[4] == 10.0F);  // 10 / (1 + e^-~88): exactly x in fp32
    CHECK(out[5] == 100.0F);
    CHECK(out[6] == 3e38F);
    CHECK(d[4] == 1.0F);
    CHECK(out[7] == inf);
    CHECK(!std::isfinite(out[8]));  // the limit is -inf * 0: not finite either way
    CHECK(std::isnan(out[9]));
    CHECK(std::isnan(d[9]));
    CHECK(out[10] == 0.0F);
    CHECK(d[10] == 0.5F);
}

TEST_CASE("gelu_backward (float) against the derivative in long double", "[gelu]") {
    const Device dev;
    const auto x = random_floats(4003, 3, -8.0F, 8.0F);
    const auto dout = random_floats(4003, 4, -2.0F, 2.0F);
    const auto n = static_cast<std::int64_t>(x.size());
    std::vector<float> dinp(x.size(), std::numeric_limits<float>::quiet_NaN());
    snug::host::gelu_backward(dev, dinp.data(), x.data(), dout.data(), n);
    double worst = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const auto want = static_cast<double>(gelu_grad_ref(x[i]) * dout[i]);
        const auto scale = static_cast<double>(gelu_grad_ref(x[i], true) * std::fabs(dout[i]));
        const double rel = std::fabs(dinp[i] - want) / scale;
        worst = std::max(worst, rel / (0x1p-24 * gelu_condition(x[i])));
    }
    CHECK(worst < 4.0);

    // dinp may be dout itself.
    std::vector<float> inplace = dout;
    snug::host::gelu_backward(dev, inplace.data(), x.data(), inplace.data(), n);
    CHECK(inplace == dinp);
    // and out may be inp.
    std::vector<float> out(x.size()), y = x;
    snug::host::gelu_forward(dev, out.data(), x.data(), n);
    snug::host::gelu_forward(dev, y.data(), y.data(), n);
    CHECK(y == out);
}

TEST_CASE("gelu_backward: central finite differences in double", "[gelu]") {
    const Device dev;
    std::mt19937 gen(5);
    std::uniform_real_distribution<double> dist(-6.0, 6.0);
    const std::int64_t n = 301;
    std::vector<double> x(n), dout(n);
    for (auto& v : x) v = dist(gen);
    for (auto& v : dout) v = dist(gen) / 3 + 0.01;
    std::vector<double> dinp(n);
    snug::host::gelu_backward(dev, dinp.data(), x.data(), dout.data(), n);
    const double h = 1e-5;
    std::vector<double> xp(n), xm(n), yp(n), ym(n);
    for (std::int64_t i = 0; i < n; ++i) {
        xp[i] = x[i] + h;
        xm[i] = x[i] - h;
    }
    snug::host::gelu_forward(dev, yp.data(), xp.data(), n);
    snug::host::gelu_forward(dev, ym.data(), xm.data(), n);
    double worst = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
        const double fd = (yp[i] - ym[i]) / (2 * h) * dout[i];
        worst = std::max(worst, std::fabs(fd - dinp[i]));
    }
    CHECK(worst < 1e-9);

    // The double forward also agrees with the tanh formula to double precision.
    std::vector<double> y(n);
    snug::host::gelu_forward(dev, y.data(), x.data(), n);
    double worst_fwd = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
        const auto want = static_cast<double>(gelu_ref(x[i]));
        worst_fwd = std::max(worst_fwd, std::fabs(y[i] - want) / (std::fabs(want) * gelu_condition(x[i])));
    }
    CHECK(worst_fwd < 1e-15);
}

TEST_CASE("gelu on a size that takes the parallel path", "[gelu]") {
    const Device dev;
    const auto x = random_floats((std::size_t{1} << 17) + 5, 6, -5.0F, 5.0F);
    const auto n = static_cast<std::int64_t>(x.size());
    std::vector<float> out(x.size()), d(x.size());
    const auto ones = std::vector<float>(x.size(), 1.0F);
    snug::host::gelu_forward(dev, out.data(), x.data(), n);
    snug::host::gelu_backward(dev, d.data(), x.data(), ones.data(), n);
    // Element by element the same as one-element calls (no dependence on the split).
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); i += 97) {
        float o = 0.0F, g = 0.0F;
        const float one = 1.0F;
        snug::host::gelu_forward(dev, &o, &x[i], 1);
        snug::host::gelu_backward(dev, &g, &x[i], &one, 1);
        bad += (o != out[i]) + (g != d[i]);
    }
    CHECK(bad == 0);
    CHECK(out.back() == out.back());  // not NaN: the tail was written
    // In place of the input (as the GPT block's backward runs it): the same bits.
    std::vector<float> in_place = x;
    snug::host::gelu_backward(dev, in_place.data(), in_place.data(), ones.data(), n);
    CHECK(in_place == d);
}

TEMPLATE_TEST_CASE("gelu 16-bit = float kernel on the rounded inputs, rounded once (RNE)", "[gelu]", half,
                   bfloat16) {
    const Device dev;
    const std::size_t n = 3001;  // several 256-element chunks and a partial one
    const auto xf = random_floats(n, 7, -6.0F, 6.0F);
    const auto df = random_floats(n, 8, -3.0F, 3.0F);
    std::vector<TestType> x16(n), d16(n);
    std::vector<float> x(n), d(n);
    for (std::size_t i = 0; i < n; ++i) {
        x16[i] = TestType(xf[i]);
        d16[i] = TestType(df[i]);
        x[i] = static_cast<float>(x16[i]);
        d[i] = static_cast<float>(d16[i]);
    }
    std::vector<float> out(n), dinp(n);
    snug::host::gelu_forward(dev, out.data(), x.data(), static_cast<std::int64_t>(n));
    snug::host::gelu_backward(dev, dinp.data(), x.data(), d.data(), static_cast<std::int64_t>(n));
    std::vector<TestType> out16(n), dinp16(n);
    snug::host::gelu_forward(dev, out16.data(), x16.data(), static_cast<std::int64_t>(n));
    snug::host::gelu_backward(dev, dinp16.data(), x16.data(), d16.data(), static_cast<std::int64_t>(n));
    std::size_t bad = 0, not_rne = 0;
    for (std::size_t i = 0; i < n; ++i) {
        bad += (out16[i].bits != TestType(out[i]).bits) + (dinp16[i].bits != TestType(dinp[i]).bits);
        not_rne += !is_rne(static_cast<double>(out[i]), out16[i]) + !is_rne(static_cast<double>(dinp[i]), dinp16[i]);
    }
    CHECK(bad == 0);
    CHECK(not_rne == 0);

    // In place on 16-bit: dinp over dout.
    std::vector<TestType> inplace = d16;
    snug::host::gelu_backward(dev, inplace.data(), x16.data(), inplace.data(), static_cast<std::int64_t>(n));
    bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += inplace[i].bits != dinp16[i].bits;
    CHECK(bad == 0);
}

TEST_CASE("gelu: negative n throws ShapeError", "[gelu]") {
    const Device dev;
    float x = 1.0F;
    CHECK_THROWS_AS(snug::host::gelu_forward(dev, &x, &x, -1), snug::ShapeError);
    CHECK_THROWS_WITH(snug::host::gelu_backward(dev, &x, &x, &x, -7), Catch::Contains("n = -7"));
}
