// Host SwiGLU: forward against the definition in double (float and double
// kernels, including gates far in both tails), backward by central finite
// differences in double (both halves of dinp, overwritten), the parallel
// path against the double kernel, the 16-bit kernels against the float kernel
// on identical rounded inputs (RNE stores), and the size checks.
#include "snug/host/swiglu.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "support/host_support.hpp"

namespace {

using snug::bfloat16;
using snug::half;
using snug::host::Device;
using snug::test::central_differences;
using snug::test::is_rne;
using snug::test::max_rel;
using snug::test::random_values;
using snug::test::to_double;

// out[n, h] = gate / (1 + exp(-gate)) * up in double, inp laid out [gate | up].
template <class T>
std::vector<double> reference_forward(const std::vector<T>& inp, std::int64_t N, int H) {
    std::vector<double> out(static_cast<std::size_t>(N) * H);
    for (std::int64_t n = 0; n < N; ++n) {
        for (int h = 0; h < H; ++h) {
            const double g = to_double(inp[n * 2 * H + h]);
            const double u = to_double(inp[n * 2 * H + H + h]);
            out[n * H + h] = g / (1.0 + std::exp(-g)) * u;
        }
    }
    return out;
}

struct Size {
    std::int64_t N;
    int H;
};

}  // namespace

TEST_CASE("swiglu_forward (float and double) against the definition in double", "[swiglu]") {
    const Device dev;
    for (const Size s : {Size{1, 1}, Size{7, 37}, Size{3, 130}, Size{2000, 33}}) {
        INFO("N = " << s.N << ", H = " << s.H);
        const auto n_in = static_cast<std::size_t>(s.N) * 2 * s.H;
        const auto n_out = static_cast<std::size_t>(s.N) * s.H;
        const auto inp = random_values<float>(n_in, 1, -6.0, 6.0);
        std::vector<float> out(n_out, std::numeric_limits<float>::quiet_NaN());
        snug::host::swiglu_forward(dev, out.data(), inp.data(), s.N, s.H);
        const auto want = reference_forward(inp, s.N, s.H);
        // One fp32 exponential, a division and two products: a few ulp.
        CHECK(max_rel(out, want, 1e-3) < 1e-6);

        const std::vector<double> inp_d(inp.begin(), inp.end());
        std::vector<double> out_d(n_out);
        snug::host::swiglu_forward(dev, out_d.data(), inp_d.data(), s.N, s.H);
        CHECK(max_rel(out_d, want, 0.0) < 1e-14);
    }
}

TEST_CASE("swiglu: gates far in both tails stay finite and exact in the limit", "[swiglu]") {
    const Device dev;
    // silu(g) -> 0 as g -> -inf (exp(-g) overflows to inf in float past -88),
    // silu(g) -> g as g -> +inf; the derivative -> 0 and -> 1.
    const std::vector<float> gates{-200.0F, -100.0F, -89.0F, -20.0F, 20.0F, 89.0F, 200.0F};
    const int H = static_cast<int>(gates.size());
    std::vector<float> inp(gates);
    for (int h = 0; h < H; ++h) inp.push_back(2.0F);  // up = 2
    std::vector<float> out(H), dinp(2 * H);
    const std::vector<float> dout(H, 1.0F);
    snug::host::swiglu_forward(dev, out.data(), inp.data(), 1, H);
    snug::host::swiglu_backward(dev, dinp.data(), inp.data(), dout.data(), 1, H);
    for (int h = 0; h < H; ++h) {
        INFO("gate = " << gates[h]);
        const double g = gates[h];
        const double silu = g / (1.0 + std::exp(-g));
        const double s = 1.0 / (1.0 + std::exp(-g));
        const double dsilu = s * (1.0 + g * (1.0 - s));
        CHECK(std::isfinite(out[h]));
        CHECK(std::isfinite(dinp[h]));
        CHECK(std::isfinite(dinp[H + h]));
        CHECK(std::fabs(out[h] - 2.0 * silu) <= 1e-6 * (std::fabs(2.0 * silu) + 1e-30));
        CHECK(std::fabs(dinp[h] - 2.0 * dsilu) <= 1e-6 * (std::fabs(2.0 * dsilu) + 1e-30));
        CHECK(std::fabs(dinp[H + h] - silu) <= 1e-6 * (std::fabs(silu) + 1e-30));
    }
}

TEST_CASE("swiglu_backward: central finite differences in double", "[swiglu]") {
    const Device dev;
    for (const Size s : {Size{3, 13}, Size{2, 1}, Size{1, 33}}) {
        const std::int64_t N = s.N;
        const int H = s.H;
        const auto n_in = static_cast<std::size_t>(N) * 2 * H;
        const auto n_out = static_cast<std::size_t>(N) * H;
        auto inp = random_values<double>(n_in, 7, -5.0, 5.0);
        const auto G = random_values<double>(n_out, 8);  // L = sum(out * G): dout = G
        std::vector<double> out(n_out);
        auto loss = [&] {
            snug::host::swiglu_forward(dev, out.data(), inp.data(), N, H);
            double l = 0.0;
            for (std::size_t i = 0; i < n_out; ++i) l += out[i] * G[i];
            return l;
        };
        std::vector<double> dinp(n_in, std::numeric_limits<double>::quiet_NaN());  // overwritten
        snug::host::swiglu_backward(dev, dinp.data(), inp.data(), G.data(), N, H);
        const auto g = central_differences(inp, loss);
        double err = 0.0;
        for (std::size_t i = 0; i < n_in; ++i) err = std::max(err, std::fabs(dinp[i] - g[i]));
        INFO("N = " << N << ", H = " << H);
        CHECK(err < 1e-8);  // double all the way: finite-difference error only
    }
}

TEST_CASE("swiglu_backward (float, parallel size) against the double kernel", "[swiglu]") {
    const Device dev;
    const std::int64_t N = 3001;
    const int H = 45;
    const auto inp = random_values<float>(static_cast<std::size_t>(N) * 2 * H, 9, -6.0, 6.0);
    const auto dout = random_values<float>(static_cast<std::size_t>(N) * H, 10);
    const std::vector<double> inp_d(inp.begin(), inp.end()), dout_d(dout.begin(), dout.end());
    std::vector<float> dinp(inp.size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<double> dinp_d(inp.size());
    snug::host::swiglu_backward(dev, dinp.data(), inp.data(), dout.data(), N, H);
    snug::host::swiglu_backward(dev, dinp_d.data(), inp_d.data(), dout_d.data(), N, H);
    // The gate's derivative s (1 + g (1 - s)) cancels to zero near g = -1.28,
    // leaving an fp32 rounding of its terms' scale: a floor of 1, the scale of
    // the outputs (|dout| < 1, |up| < 6).
    CHECK(max_rel(dinp, dinp_d, 1.0) < 1e-6);
}

TEMPLATE_TEST_CASE("swiglu 16-bit = float kernel on the rounded inputs, rounded once (RNE)", "[swiglu]", half,
                   bfloat16) {
    const Device dev;
    const std::int64_t N = 11;
    const int H = 53;
    const auto n_in = static_cast<std::size_t>(N) * 2 * H;
    const auto n_out = static_cast<std::size_t>(N) * H;
    const auto inp16 = random_values<TestType>(n_in, 18, -6.0, 6.0);
    const auto dout16 = random_values<TestType>(n_out, 21);
    auto widen = [](const std::vector<TestType>& v) {
        std::vector<float> f(v.size());
        for (std::size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
        return f;
    };
    const auto inp = widen(inp16), dout = widen(dout16);
    std::vector<float> out(n_out), dinp(n_in);
    snug::host::swiglu_forward(dev, out.data(), inp.data(), N, H);
    snug::host::swiglu_backward(dev, dinp.data(), inp.data(), dout.data(), N, H);
    std::vector<TestType> out16(n_out), dinp16(n_in);
    snug::host::swiglu_forward(dev, out16.data(), inp16.data(), N, H);
    snug::host::swiglu_backward(dev, dinp16.data(), inp16.data(), dout16.data(), N, H);
    std::size_t bad = 0, not_rne = 0;
    for (std::size_t i = 0; i < n_out; ++i) {
        bad += out16[i].bits != TestType(out[i]).bits;
        not_rne += !is_rne(static_cast<double>(out[i]), out16[i]);
    }
    for (std::size_t i = 0; i < n_in; ++i) {
        bad += dinp16[i].bits != TestType(dinp[i]).bits;
        not_rne += !is_rne(static_cast<double>(dinp[i]), dinp16[i]);
    }
    CHECK(bad == 0);
    CHECK(not_rne == 0);
}

TEST_CASE("swiglu: negative sizes throw ShapeError naming them, empty is a no-op", "[swiglu]") {
    const Device dev;
    std::vector<float> x(4, 1.0F);
    CHECK_THROWS_WITH(snug::host::swiglu_forward(dev, x.data(), x.data(), -1, 2),
                      Catch::Contains("swiglu_forward") && Catch::Contains("N = -1"));
    CHECK_THROWS_AS(snug::host::swiglu_backward(dev, x.data(), x.data(), x.data(), 2, -2), snug::ShapeError);
    CHECK_NOTHROW(snug::host::swiglu_forward(dev, x.data(), x.data(), 0, 2));
    CHECK_NOTHROW(snug::host::swiglu_forward(dev, x.data(), x.data(), 2, 0));
}
