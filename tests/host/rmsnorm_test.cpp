// Host RMSNorm: forward against a naive double reference (float and double
// instantiations, the default and an explicit eps), backward by central
// finite differences in double (dinp and dweight both accumulating onto what
// is there), the parallel paths against the double kernels and deterministic,
// the 16-bit kernels against the float kernel on identical rounded inputs
// (RNE stores), and the argument checks.
#include "snug/host/rmsnorm.hpp"

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

struct Reference {
    std::vector<double> out, rstd;
};

// RMSNorm written out in double: rstd = 1 / sqrt(sum x^2 / C + eps).
template <class T>
Reference reference_forward(const std::vector<T>& inp, const std::vector<T>& w, std::int64_t N, int C, double eps) {
    Reference r;
    r.out.resize(static_cast<std::size_t>(N) * C);
    r.rstd.resize(static_cast<std::size_t>(N));
    for (std::int64_t n = 0; n < N; ++n) {
        double ss = 0.0;
        for (int c = 0; c < C; ++c) ss += to_double(inp[n * C + c]) * to_double(inp[n * C + c]);
        const double rs = 1.0 / std::sqrt(ss / C + eps);
        for (int c = 0; c < C; ++c) r.out[n * C + c] = to_double(inp[n * C + c]) * rs * to_double(w[c]);
        r.rstd[n] = rs;
    }
    return r;
}

std::vector<float> to_f(const std::vector<double>& v) {
    std::vector<float> f(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
    return f;
}

std::vector<double> to_d(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

struct Size {
    std::int64_t N;
    int C;
};

}  // namespace

TEST_CASE("rmsnorm_forward (float) against a double reference", "[rmsnorm]") {
    const Device dev;
    // Odd C, C = 1, one row, and a size that takes the row-parallel path.
    for (const Size s : {Size{7, 37}, Size{5, 1}, Size{1, 130}, Size{4099, 64}}) {
        INFO("N = " << s.N << ", C = " << s.C);
        const auto n = static_cast<std::size_t>(s.N) * s.C;
        const auto inp = random_values<float>(n, 1, -2.0, 3.0);
        const auto w = random_values<float>(static_cast<std::size_t>(s.C), 2, 0.5, 1.5);
        std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
        std::vector<float> rstd(static_cast<std::size_t>(s.N), std::numeric_limits<float>::quiet_NaN());
        snug::host::rmsnorm_forward(dev, out.data(), rstd.data(), inp.data(), w.data(), s.N, s.C);
        const Reference r = reference_forward(inp, w, s.N, s.C, 1e-5);
        CHECK(max_rel(out, r.out, 1e-2) < 2e-5);
        CHECK(max_rel(rstd, r.rstd, 0.0) < 1e-5);
    }
}

TEST_CASE("rmsnorm_forward: the eps argument is the one added (Llama 1's 1e-6, and a large one)", "[rmsnorm]") {
    const Device dev;
    const std::int64_t N = 9;
    const int C = 24;
    // Small inputs, so that eps matters: mean square about 3e-4.
    const auto inp = random_values<double>(static_cast<std::size_t>(N) * C, 3, -0.03, 0.03);
    const auto w = random_values<double>(C, 4, 0.5, 1.5);
    for (const double eps : {1e-6, 1e-5, 1e-3, 0.0}) {
        INFO("eps = " << eps);
        std::vector<double> out(inp.size()), rstd(N);
        snug::host::rmsnorm_forward(dev, out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
        const Reference r = reference_forward(inp, w, N, C, eps);
        CHECK(max_rel(out, r.out, 1e-2) < 1e-13);
        CHECK(max_rel(rstd, r.rstd, 0.0) < 1e-13);
    }
    // float statistics for double activations: only the saved rstd is rounded.
    std::vector<double> out(inp.size()), out2(inp.size()), rstd(N);
    std::vector<float> rstdf(N);
    snug::host::rmsnorm_forward(dev, out.data(), rstd.data(), inp.data(), w.data(), N, C);
    snug::host::rmsnorm_forward(dev, out2.data(), rstdf.data(), inp.data(), w.data(), N, C);
    CHECK(out2 == out);
    for (std::int64_t n = 0; n < N; ++n) CHECK(rstdf[n] == static_cast<float>(rstd[n]));
}

TEST_CASE("rmsnorm_backward: central finite differences in double", "[rmsnorm]") {
    const Device dev;
    for (const Size s : {Size{3, 13}, Size{2, 1}, Size{1, 33}}) {
        const std::int64_t N = s.N;
        const int C = s.C;
        const auto nc = static_cast<std::size_t>(N) * C;
        auto inp = random_values<double>(nc, 7, -1.5, 2.5);
        auto w = random_values<double>(static_cast<std::size_t>(C), 8, 0.5, 1.5);
        const auto G = random_values<double>(nc, 10);  // L = sum(out * G): dout = G
        std::vector<double> out(nc), rstd(N);
        auto loss = [&] {
            snug::host::rmsnorm_forward(dev, out.data(), rstd.data(), inp.data(), w.data(), N, C);
            double l = 0.0;
            for (std::size_t i = 0; i < nc; ++i) l += out[i] * G[i];
            return l;
        };
        loss();  // rstd of the unperturbed input
        const auto dinp0 = random_values<double>(nc, 11);
        const auto dw0 = random_values<float>(static_cast<std::size_t>(C), 12);
        std::vector<double> dinp = dinp0;
        std::vector<float> dw = dw0;
        snug::host::rmsnorm_backward(dev, dinp.data(), dw.data(), G.data(), inp.data(), w.data(), rstd.data(), N, C);

        const auto g_inp = central_differences(inp, loss);
        const auto g_w = central_differences(w, loss);
        double err_inp = 0.0, err_w = 0.0;
        for (std::size_t i = 0; i < nc; ++i) err_inp = std::max(err_inp, std::fabs(dinp[i] - dinp0[i] - g_inp[i]));
        for (int c = 0; c < C; ++c) err_w = std::max(err_w, std::fabs(static_cast<double>(dw[c]) - dw0[c] - g_w[c]));
        INFO("N = " << N << ", C = " << C);
        CHECK(err_inp < 1e-8);  // double all the way: finite-difference error only
        CHECK(err_w < 2e-6);    // fp32 parameter gradient (values of order 1)
    }
}

TEST_CASE("rmsnorm_backward (float, parallel sizes) against the double kernels, deterministic", "[rmsnorm]") {
    const Device dev;
    for (const Size s : {Size{4099, 64}, Size{9, 45}}) {
        const std::int64_t N = s.N;
        const int C = s.C;
        const auto nc = static_cast<std::size_t>(N) * C;
        const auto inp = to_f(random_values<double>(nc, 14, -1.0, 2.0));
        const auto w = to_f(random_values<double>(static_cast<std::size_t>(C), 15, 0.5, 1.5));
        const auto dout = to_f(random_values<double>(nc, 17));
        const auto inp2 = to_d(inp), w2 = to_d(w), dout2 = to_d(dout);

        std::vector<double> out_d(nc), rstd_d(N), dinp_d(nc, 0.0);
        std::vector<float> dw_d(C, 0.0F);
        snug::host::rmsnorm_forward(dev, out_d.data(), rstd_d.data(), inp2.data(), w2.data(), N, C);
        snug::host::rmsnorm_backward(dev, dinp_d.data(), dw_d.data(), dout2.data(), inp2.data(), w2.data(),
                                     rstd_d.data(), N, C);

        std::vector<float> out(nc), rstd(N), dinp(nc, 0.0F), dw(C, 0.0F);
        snug::host::rmsnorm_forward(dev, out.data(), rstd.data(), inp.data(), w.data(), N, C);
        snug::host::rmsnorm_backward(dev, dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N,
                                     C);
        CHECK(max_rel(out, out_d, 1e-1) < 1e-5);
        CHECK(max_rel(dinp, dinp_d, 1e-1) < 1e-5);
        // The parameter gradient sums N rows: compare relative to its scale.
        double scale_w = 0.0, err_w = 0.0;
        for (int c = 0; c < C; ++c) scale_w = std::max(scale_w, std::fabs(static_cast<double>(dw_d[c])));
        for (int c = 0; c < C; ++c) err_w = std::max(err_w, std::fabs(static_cast<double>(dw[c]) - dw_d[c]) / scale_w);
        CHECK(err_w < 1e-5);

        std::vector<float> dinp2(nc, 0.0F), dw2(C, 0.0F);
        snug::host::rmsnorm_backward(dev, dinp2.data(), dw2.data(), dout.data(), inp.data(), w.data(), rstd.data(),
                                     N, C);
        CHECK(dinp2 == dinp);
        CHECK(dw2 == dw);
    }
}

TEMPLATE_TEST_CASE("rmsnorm 16-bit = float kernel on the rounded inputs, rounded once (RNE)", "[rmsnorm]", half,
                   bfloat16) {
    const Device dev;
    const std::int64_t N = 11;
    const int C = 53;
    const auto nc = static_cast<std::size_t>(N) * C;
    const auto inp16 = random_values<TestType>(nc, 18, -2.0, 3.0);
    const auto w16 = random_values<TestType>(C, 19, 0.5, 1.5);
    const auto dout16 = random_values<TestType>(nc, 21);
    const auto dinp16_0 = random_values<TestType>(nc, 22);
    auto widen = [](const std::vector<TestType>& v) {
        std::vector<float> f(v.size());
        for (std::size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
        return f;
    };
    const auto inp = widen(inp16), w = widen(w16), dout = widen(dout16);

    std::vector<float> out(nc), rstd(N);
    snug::host::rmsnorm_forward(dev, out.data(), rstd.data(), inp.data(), w.data(), N, C);
    std::vector<TestType> out16(nc);
    std::vector<float> rstd16(N);
    snug::host::rmsnorm_forward(dev, out16.data(), rstd16.data(), inp16.data(), w16.data(), N, C);
    CHECK(rstd16 == rstd);
    std::size_t bad = 0, not_rne = 0;
    for (std::size_t i = 0; i < nc; ++i) {
        bad += out16[i].bits != TestType(out[i]).bits;
        not_rne += !is_rne(static_cast<double>(out[i]), out16[i]);
    }
    CHECK(bad == 0);
    CHECK(not_rne == 0);

    std::vector<float> dinp = widen(dinp16_0), dw(C, 0.0F);
    snug::host::rmsnorm_backward(dev, dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N, C);
    std::vector<TestType> dinp16 = dinp16_0;
    std::vector<float> dw16(C, 0.0F);
    snug::host::rmsnorm_backward(dev, dinp16.data(), dw16.data(), dout16.data(), inp16.data(), w16.data(),
                                 rstd16.data(), N, C);
    CHECK(dw16 == dw);
    bad = 0;
    not_rne = 0;
    for (std::size_t i = 0; i < nc; ++i) {
        bad += dinp16[i].bits != TestType(dinp[i]).bits;
        not_rne += !is_rne(static_cast<double>(dinp[i]), dinp16[i]);
    }
    CHECK(bad == 0);
    CHECK(not_rne == 0);
}

TEST_CASE("rmsnorm: bad sizes and a bad eps throw, naming the problem", "[rmsnorm]") {
    const Device dev;
    std::vector<float> x(4, 1.0F), s(2);
    CHECK_THROWS_AS(snug::host::rmsnorm_forward(dev, x.data(), s.data(), x.data(), x.data(), -1, 2),
                    snug::ShapeError);
    CHECK_THROWS_WITH(snug::host::rmsnorm_forward(dev, x.data(), s.data(), x.data(), x.data(), 2, 0),
                      Catch::Contains("rmsnorm_forward") && Catch::Contains("C = 0"));
    CHECK_THROWS_WITH(snug::host::rmsnorm_backward(dev, x.data(), s.data(), x.data(), x.data(), x.data(), s.data(),
                                                   2, -3),
                      Catch::Contains("rmsnorm_backward") && Catch::Contains("C = -3"));
    CHECK_THROWS_AS(snug::host::rmsnorm_forward(dev, x.data(), s.data(), x.data(), x.data(), 2, 2, -1e-5),
                    snug::ConfigError);
    CHECK_THROWS_WITH(snug::host::rmsnorm_forward(dev, x.data(), s.data(), x.data(), x.data(), 2, 2,
                                                  std::numeric_limits<double>::quiet_NaN()),
                      Catch::Contains("eps"));
}
