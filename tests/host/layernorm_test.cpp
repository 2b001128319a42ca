// Host LayerNorm: forward against a naive two-pass double reference (float and
// double instantiations, float and double statistics), backward by central
// finite differences in double (dinp, dweight, dbias; dinp accumulating onto
// what is there), the parallel paths against the same references, the 16-bit
// kernels against the float kernel on identical rounded inputs, RNE stores,
// and the size checks.
#include "snug/host/layernorm.hpp"

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
using snug::test::central_differences;
using snug::test::is_rne;
using snug::test::max_rel;
using snug::test::random_values;
using snug::test::to_double;

// Naive two-pass LayerNorm in double.
struct Reference {
    std::vector<double> out, mean, rstd;
};

template <class T>
Reference reference_forward(const std::vector<T>& inp, const std::vector<T>& w, const std::vector<T>& b,
                            std::int64_t N, int C) {
    Reference r;
    r.out.resize(static_cast<std::size_t>(N) * C);
    r.mean.resize(static_cast<std::size_t>(N));
    r.rstd.resize(static_cast<std::size_t>(N));
    for (std::int64_t n = 0; n < N; ++n) {
        double m = 0.0;
        for (int c = 0; c < C; ++c) m += to_double(inp[n * C + c]);
        m /= C;
        double v = 0.0;
        for (int c = 0; c < C; ++c) v += (to_double(inp[n * C + c]) - m) * (to_double(inp[n * C + c]) - m);
        v /= C;
        const double rs = 1.0 / std::sqrt(v + 1e-5);
        for (int c = 0; c < C; ++c) r.out[n * C + c] = (to_double(inp[n * C + c]) - m) * rs * to_double(w[c]) + to_double(b[c]);
        r.mean[n] = m;
        r.rstd[n] = rs;
    }
    return r;
}

struct Size {
    std::int64_t N;
    int C;
};

}  // namespace

TEST_CASE("layernorm_forward (float) against a double reference", "[layernorm]") {
    const Device dev;
    // Odd C, C = 1 (zero variance), one row, and a size that takes the
    // row-parallel path (2^16 elements per task).
    for (const Size s : {Size{7, 37}, Size{5, 1}, Size{1, 130}, Size{4099, 64}}) {
        const auto n = static_cast<std::size_t>(s.N) * s.C;
        const auto inp = random_values<float>(n, 1, -2.0, 3.0);  // nonzero mean
        const auto w = random_values<float>(static_cast<std::size_t>(s.C), 2);
        const auto b = random_values<float>(static_cast<std::size_t>(s.C), 3);
        std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
        std::vector<float> mean(static_cast<std::size_t>(s.N), std::numeric_limits<float>::quiet_NaN());
        std::vector<float> rstd = mean;
        snug::host::layernorm_forward(dev, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), s.N,
                                      s.C);
        const Reference r = reference_forward(inp, w, b, s.N, s.C);
        CHECK(max_rel(out, r.out, 1e-2) < 2e-5);
        CHECK(max_rel(mean, r.mean, 1e-2) < 1e-5);
        CHECK(max_rel(rstd, r.rstd, 0.0) < 1e-5);
    }
}

TEST_CASE("residual_layernorm_forward: res += x, then the norm of the sum, against a double reference",
          "[layernorm]") {
    const Device dev;
    const std::int64_t N = 9;
    const int C = 40;
    const auto n = static_cast<std::size_t>(N) * C;
    const auto res0 = random_values<float>(n, 4, -2.0, 3.0);
    const auto x = random_values<float>(n, 5, -1.0, 1.0);
    const auto w = random_values<float>(static_cast<std::size_t>(C), 6);
    const auto b = random_values<float>(static_cast<std::size_t>(C), 7);
    std::vector<float> res = res0, out(n, std::numeric_limits<float>::quiet_NaN());
    std::vector<float> mean(static_cast<std::size_t>(N), std::numeric_limits<float>::quiet_NaN()), rstd = mean;
    snug::host::residual_layernorm_forward(dev, out.data(), mean.data(), rstd.data(), res.data(), x.data(), w.data(),
                                           b.data(), N, C);
    std::vector<double> sum(n);
    for (std::size_t i = 0; i < n; ++i) sum[i] = double(res0[i]) + double(x[i]);
    CHECK(max_rel(res, sum, 1e-6) < 1e-7);  // one float rounding
    const Reference r = reference_forward(res, w, b, N, C);
    CHECK(max_rel(out, r.out, 1e-2) < 2e-5);
    CHECK(max_rel(mean, r.mean, 1e-2) < 1e-5);
    CHECK(max_rel(rstd, r.rstd, 0.0) < 1e-5);
    CHECK_THROWS_AS(snug::host::residual_layernorm_forward(dev, out.data(), mean.data(), rstd.data(), res.data(),
                                                           x.data(), w.data(), b.data(), N, 0),
                    snug::ShapeError);
}

TEST_CASE("layernorm_forward (double): double statistics, or float ones", "[layernorm]") {
    const Device dev;
    const std::int64_t N = 6;
    const int C = 29;
    const auto inp = random_values<double>(static_cast<std::size_t>(N) * C, 4, -1.0, 2.0);
    const auto w = random_values<double>(C, 5);
    const auto b = random_values<double>(C, 6);
    const Reference r = reference_forward(inp, w, b, N, C);

    std::vector<double> out(inp.size()), mean(N), rstd(N);
    snug::host::layernorm_forward(dev, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    CHECK(max_rel(out, r.out, 1e-2) < 1e-13);
    CHECK(max_rel(mean, r.mean, 1e-2) < 1e-13);
    CHECK(max_rel(rstd, r.rstd, 0.0) < 1e-13);

    // float statistics for double activations: the output is still computed
    // with the double statistics; only the saved ones are rounded.
    std::vector<double> out2(inp.size());
    std::vector<float> meanf(N), rstdf(N);
    snug::host::layernorm_forward(dev, out2.data(), meanf.data(), rstdf.data(), inp.data(), w.data(), b.data(), N,
                                  C);
    CHECK(out2 == out);
    for (std::int64_t n = 0; n < N; ++n) {
        CHECK(meanf[n] == static_cast<float>(mean[n]));
        CHECK(rstdf[n] == static_cast<float>(rstd[n]));
    }
}

TEST_CASE("layernorm_backward: central finite differences in double", "[layernorm]") {
    const Device dev;
    for (const Size s : {Size{3, 13}, Size{2, 1}, Size{1, 33}}) {
        const std::int64_t N = s.N;
        const int C = s.C;
        const auto nc = static_cast<std::size_t>(N) * C;
        auto inp = random_values<double>(nc, 7, -1.5, 2.5);
        auto w = random_values<double>(static_cast<std::size_t>(C), 8, 0.5, 1.5);
        auto b = random_values<double>(static_cast<std::size_t>(C), 9);
        const auto G = random_values<double>(nc, 10);  // L = sum(out * G): dout = G
        std::vector<double> out(nc), mean(N), rstd(N);
        auto loss = [&] {
            snug::host::layernorm_forward(dev, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(),
                                          N, C);
            double l = 0.0;
            for (std::size_t i = 0; i < nc; ++i) l += out[i] * G[i];
            return l;
        };
        loss();  // mean and rstd of the unperturbed input
        const auto dinp0 = random_values<double>(nc, 11);
        const auto dw0 = random_values<float>(static_cast<std::size_t>(C), 12);
        const auto db0 = random_values<float>(static_cast<std::size_t>(C), 13);
        std::vector<double> dinp = dinp0;
        std::vector<float> dw = dw0, db = db0;
        snug::host::layernorm_backward(dev, dinp.data(), dw.data(), db.data(), G.data(), inp.data(), w.data(),
                                       mean.data(), rstd.data(), N, C);

        const auto g_inp = central_differences(inp, loss);
        const auto g_w = central_differences(w, loss);
        const auto g_b = central_differences(b, loss);
        double err_inp = 0.0, err_w = 0.0, err_b = 0.0;
        for (std::size_t i = 0; i < nc; ++i) err_inp = std::max(err_inp, std::fabs(dinp[i] - dinp0[i] - g_inp[i]));
        for (int c = 0; c < C; ++c) {
            err_w = std::max(err_w, std::fabs(static_cast<double>(dw[c]) - dw0[c] - g_w[c]));
            err_b = std::max(err_b, std::fabs(static_cast<double>(db[c]) - db0[c] - g_b[c]));
        }
        INFO("N = " << N << ", C = " << C);
        CHECK(err_inp < 1e-8);  // double all the way: finite-difference error only
        CHECK(err_w < 2e-6);    // fp32 parameter gradients (values of order 1)
        CHECK(err_b < 2e-6);
        if (C == 1) {
            // A single-element row normalises to 0: out = bias, no input gradient.
            for (std::size_t i = 0; i < nc; ++i) CHECK(dinp[i] == dinp0[i]);
        }
    }
}

TEST_CASE("layernorm_backward (float, parallel sizes) against the double backward", "[layernorm]") {
    const Device dev;
    // Large enough for both the row-parallel and the channel-parallel parts.
    for (const Size s : {Size{4099, 64}, Size{9, 45}}) {
        const std::int64_t N = s.N;
        const int C = s.C;
        const auto nc = static_cast<std::size_t>(N) * C;
        const auto inp_d = random_values<double>(nc, 14, -1.0, 2.0);
        const auto w_d = random_values<double>(static_cast<std::size_t>(C), 15);
        const auto b_d = random_values<double>(static_cast<std::size_t>(C), 16);
        const auto dout_d = random_values<double>(nc, 17);
        // The same values in float (they were drawn as doubles; round them).
        auto to_f = [](const std::vector<double>& v) {
            std::vector<float> f(v.size());
            for (std::size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
            return f;
        };
        auto to_d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
        const auto inp = to_f(inp_d), w = to_f(w_d), b = to_f(b_d), dout = to_f(dout_d);
        const auto inp2 = to_d(inp), w2 = to_d(w), b2 = to_d(b), dout2 = to_d(dout);

        std::vector<double> out_d(nc), mean_d(N), rstd_d(N), dinp_d(nc, 0.0);
        std::vector<float> dw_d(C, 0.0F), db_d(C, 0.0F);
        snug::host::layernorm_forward(dev, out_d.data(), mean_d.data(), rstd_d.data(), inp2.data(), w2.data(),
                                      b2.data(), N, C);
        snug::host::layernorm_backward(dev, dinp_d.data(), dw_d.data(), db_d.data(), dout2.data(), inp2.data(),
                                       w2.data(), mean_d.data(), rstd_d.data(), N, C);

        std::vector<float> out(nc), mean(N), rstd(N), dinp(nc, 0.0F), dw(C, 0.0F), db(C, 0.0F);
        snug::host::layernorm_forward(dev, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N,
                                      C);
        snug::host::layernorm_backward(dev, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                                       mean.data(), rstd.data(), N, C);
        // Parameter gradients sum N rows: compare relative to their scale.
        double scale_w = 0.0, scale_b = 0.0;
        for (int c = 0; c < C; ++c) {
            scale_w = std::max(scale_w, std::fabs(static_cast<double>(dw_d[c])));
            scale_b = std::max(scale_b, std::fabs(static_cast<double>(db_d[c])));
        }
        CHECK(max_rel(dinp, dinp_d, 1e-1) < 1e-5);
        double err_w = 0.0, err_b = 0.0;
        for (int c = 0; c < C; ++c) {
            err_w = std::max(err_w, std::fabs(static_cast<double>(dw[c]) - dw_d[c]) / scale_w);
            err_b = std::max(err_b, std::fabs(static_cast<double>(db[c]) - db_d[c]) / scale_b);
        }
        CHECK(err_w < 1e-5);
        CHECK(err_b < 1e-5);

        // Deterministic: the same bits on a second run.
        std::vector<float> dinp2(nc, 0.0F), dw2(C, 0.0F), db2(C, 0.0F);
        snug::host::layernorm_backward(dev, dinp2.data(), dw2.data(), db2.data(), dout.data(), inp.data(), w.data(),
                                       mean.data(), rstd.data(), N, C);
        CHECK(dinp2 == dinp);
        CHECK(dw2 == dw);
        CHECK(db2 == db);
    }
}

TEMPLATE_TEST_CASE("layernorm 16-bit = float kernel on the rounded inputs, rounded once (RNE)", "[layernorm]", half,
                   bfloat16) {
    const Device dev;
    const std::int64_t N = 11;
    const int C = 53;
    const auto nc = static_cast<std::size_t>(N) * C;
    const auto inp16 = random_values<TestType>(nc, 18, -2.0, 3.0);
    const auto w16 = random_values<TestType>(C, 19);
    const auto b16 = random_values<TestType>(C, 20);
    const auto dout16 = random_values<TestType>(nc, 21);
    const auto dinp16_0 = random_values<TestType>(nc, 22);
    auto widen = [](const std::vector<TestType>& v) {
        std::vector<float> f(v.size());
        for (std::size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
        return f;
    };
    const auto inp = widen(inp16), w = widen(w16), b = widen(b16), dout = widen(dout16);

    std::vector<float> out(nc), mean(N), rstd(N);
    snug::host::layernorm_forward(dev, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    std::vector<TestType> out16(nc);
    std::vector<float> mean16(N), rstd16(N);
    snug::host::layernorm_forward(dev, out16.data(), mean16.data(), rstd16.data(), inp16.data(), w16.data(),
                                  b16.data(), N, C);
    CHECK(mean16 == mean);
    CHECK(rstd16 == rstd);
    std::size_t bad = 0, not_rne = 0;
    for (std::size_t i = 0; i < nc; ++i) {
        bad += out16[i].bits != TestType(out[i]).bits;
        not_rne += !is_rne(static_cast<double>(out[i]), out16[i]);
    }
    CHECK(bad == 0);
    CHECK(not_rne == 0);

    // Backward: dinp accumulates onto 16-bit values; the float kernel starts
    // from the same values widened, and its result rounded once must match.
    std::vector<float> dinp = widen(dinp16_0), dw(C, 0.0F), db(C, 0.0F);
    snug::host::layernorm_backward(dev, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                                   mean.data(), rstd.data(), N, C);
    std::vector<TestType> dinp16 = dinp16_0;
    std::vector<float> dw16(C, 0.0F), db16(C, 0.0F);
    snug::host::layernorm_backward(dev, dinp16.data(), dw16.data(), db16.data(), dout16.data(), inp16.data(),
                                   w16.data(), mean16.data(), rstd16.data(), N, C);
    CHECK(dw16 == dw);
    CHECK(db16 == db);
    bad = 0;
    not_rne = 0;
    for (std::size_t i = 0; i < nc; ++i) {
        bad += dinp16[i].bits != TestType(dinp[i]).bits;
        not_rne += !is_rne(static_cast<double>(dinp[i]), dinp16[i]);
    }
    CHECK(bad == 0);
    CHECK(not_rne == 0);
}

TEST_CASE("layernorm: nonsensical sizes throw ShapeError", "[layernorm]") {
    const Device dev;
    std::vector<float> x(4, 1.0F), s(2);
    CHECK_THROWS_AS(snug::host::layernorm_forward(dev, x.data(), s.data(), s.data(), x.data(), x.data(), x.data(),
                                                  -1, 2),
                    snug::ShapeError);
    CHECK_THROWS_WITH(snug::host::layernorm_forward(dev, x.data(), s.data(), s.data(), x.data(), x.data(),
                                                    x.data(), 2, 0),
                      Catch::Contains("C = 0"));
    CHECK_THROWS_WITH(snug::host::layernorm_backward(dev, x.data(), s.data(), s.data(), x.data(), x.data(),
                                                     x.data(), s.data(), s.data(), 2, -3),
                      Catch::Contains("C = -3"));
}
