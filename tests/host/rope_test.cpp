// Host RoPE: forward against the rotate_half definition written out in double
// (float and double kernels, the default theta, Llama 3's, and a position
// offset), backward by central finite differences in double and as the exact
// inverse of the forward, in place = out of place, the parallel path, the
// 16-bit kernels against the float kernel on identical rounded inputs (RNE
// stores), and the argument checks (an odd head size names hs).
#include "snug/host/rope.hpp"

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

struct Shape {
    int B, T, NH, hs;
    std::size_t size() const { return static_cast<std::size_t>(B) * T * NH * hs; }
};

// Hugging Face's Llama in double: q * cos + rotate_half(q) * sin, with
// rotate_half(q) = [-q2, q1], cos/sin of (offset + t) * inv_freq[i mod hs/2]
// and inv_freq[i] = 1 / theta^(2i / hs).
template <class T>
std::vector<double> reference_forward(const std::vector<T>& x, Shape s, double theta, std::int64_t offset) {
    std::vector<double> out(s.size());
    const int pairs = s.hs / 2;
    for (int b = 0; b < s.B; ++b) {
        for (int t = 0; t < s.T; ++t) {
            for (int h = 0; h < s.NH; ++h) {
                const std::size_t base = ((static_cast<std::size_t>(b) * s.T + t) * s.NH + h) * s.hs;
                for (int d = 0; d < s.hs; ++d) {
                    const double inv_freq = 1.0 / std::pow(theta, 2.0 * (d % pairs) / s.hs);
                    const double angle = static_cast<double>(offset + t) * inv_freq;
                    const double rotated = d < pairs ? -to_double(x[base + d + pairs]) : to_double(x[base + d - pairs]);
                    out[base + d] = to_double(x[base + d]) * std::cos(angle) + rotated * std::sin(angle);
                }
            }
        }
    }
    return out;
}

}  // namespace

TEST_CASE("rope_forward (float and double) against the rotate_half definition in double", "[rope]") {
    const Device dev;
    struct Case {
        Shape s;
        double theta;
        std::int64_t offset;
    };
    // hs = 2 (one pair), odd T and NH, Llama 3's theta, a large offset (angles
    // of thousands of radians), and a size for the parallel path.
    for (const Case c : {Case{{1, 1, 1, 2}, 10000.0, 0}, Case{{2, 7, 3, 10}, 10000.0, 0},
                         Case{{1, 5, 2, 64}, 500000.0, 3}, Case{{2, 3, 5, 16}, 10000.0, 4093},
                         Case{{3, 257, 4, 32}, 10000.0, 0}}) {
        INFO("B, T, NH, hs = " << c.s.B << ", " << c.s.T << ", " << c.s.NH << ", " << c.s.hs << "; theta "
                               << c.theta << ", offset " << c.offset);
        const auto x = random_values<float>(c.s.size(), 1, -2.0, 2.0);
        std::vector<float> out(x.size(), std::numeric_limits<float>::quiet_NaN());
        snug::host::rope_forward(dev, out.data(), x.data(), c.s.B, c.s.T, c.s.NH, c.s.hs, c.theta, c.offset);
        const auto want = reference_forward(x, c.s, c.theta, c.offset);
        // fp32 cos/sin (rounded from double) and a 2-term dot product in
        // fp32: a few ulp of the inputs' magnitude, which is of order 1 (the
        // floor, for outputs near zero by cancellation).
        CHECK(max_rel(out, want, 1.0) < 1e-6);

        const std::vector<double> xd(x.begin(), x.end());
        std::vector<double> out_d(x.size());
        snug::host::rope_forward(dev, out_d.data(), xd.data(), c.s.B, c.s.T, c.s.NH, c.s.hs, c.theta, c.offset);
        // The reference takes 1 / theta^(2i/hs), the kernel theta^(-2i/hs): angles
        // of up to `pos` radians that differ by an ulp or two.
        CHECK(max_rel(out_d, want, 1.0) < 1e-15 * static_cast<double>(c.offset + c.s.T + 1));
    }
}

TEST_CASE("rope: the default theta is 10000 and the default offset 0", "[rope]") {
    const Device dev;
    const Shape s{2, 9, 3, 8};
    const auto x = random_values<float>(s.size(), 2);
    std::vector<float> a(x.size()), b(x.size());
    snug::host::rope_forward(dev, a.data(), x.data(), s.B, s.T, s.NH, s.hs);
    snug::host::rope_forward(dev, b.data(), x.data(), s.B, s.T, s.NH, s.hs, 10000.0, 0);
    CHECK(a == b);
    // Position 0 is the identity.
    for (int bb = 0; bb < s.B; ++bb) {
        for (int i = 0; i < s.NH * s.hs; ++i) {
            const std::size_t at = static_cast<std::size_t>(bb) * s.T * s.NH * s.hs + i;
            CHECK(a[at] == x[at]);
        }
    }
}

TEST_CASE("rope_backward: central finite differences in double, and the inverse of the forward", "[rope]") {
    const Device dev;
    for (const Shape s : {Shape{1, 1, 1, 2}, Shape{2, 3, 2, 6}, Shape{1, 4, 1, 12}}) {
        INFO("B, T, NH, hs = " << s.B << ", " << s.T << ", " << s.NH << ", " << s.hs);
        const double theta = 100.0;  // larger angles at these few positions
        const std::int64_t offset = 5;
        auto x = random_values<double>(s.size(), 3);
        const auto G = random_values<double>(s.size(), 4);  // L = sum(out * G): dout = G
        std::vector<double> out(s.size());
        auto loss = [&] {
            snug::host::rope_forward(dev, out.data(), x.data(), s.B, s.T, s.NH, s.hs, theta, offset);
            double l = 0.0;
            for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * G[i];
            return l;
        };
        std::vector<double> dx(s.size(), std::numeric_limits<double>::quiet_NaN());  // overwritten
        snug::host::rope_backward(dev, dx.data(), G.data(), s.B, s.T, s.NH, s.hs, theta, offset);
        const auto g = central_differences(x, loss);
        double err = 0.0;
        for (std::size_t i = 0; i < x.size(); ++i) err = std::max(err, std::fabs(dx[i] - g[i]));
        CHECK(err < 1e-9);  // linear in x: rounding of the difference quotient only

        // The rotation is orthogonal: backward(forward(x)) = x.
        snug::host::rope_forward(dev, out.data(), x.data(), s.B, s.T, s.NH, s.hs, theta, offset);
        std::vector<double> back(s.size());
        snug::host::rope_backward(dev, back.data(), out.data(), s.B, s.T, s.NH, s.hs, theta, offset);
        CHECK(max_rel(back, x, 1.0) < 1e-14);
    }
}

TEST_CASE("rope in place equals out of place, the float kernels agree with the double ones", "[rope]") {
    const Device dev;
    const Shape s{3, 129, 4, 64};  // enough positions for the parallel path
    const auto x = random_values<float>(s.size(), 5, -2.0, 2.0);
    std::vector<float> out(x.size()), inplace = x;
    snug::host::rope_forward(dev, out.data(), x.data(), s.B, s.T, s.NH, s.hs, 10000.0, 17);
    snug::host::rope_forward(dev, inplace.data(), inplace.data(), s.B, s.T, s.NH, s.hs, 10000.0, 17);
    CHECK(inplace == out);
    std::vector<float> dx(x.size()), dx_inplace = x;
    snug::host::rope_backward(dev, dx.data(), x.data(), s.B, s.T, s.NH, s.hs, 10000.0, 17);
    snug::host::rope_backward(dev, dx_inplace.data(), dx_inplace.data(), s.B, s.T, s.NH, s.hs, 10000.0, 17);
    CHECK(dx_inplace == dx);

    const std::vector<double> xd(x.begin(), x.end());
    std::vector<double> dx_d(x.size());
    snug::host::rope_backward(dev, dx_d.data(), xd.data(), s.B, s.T, s.NH, s.hs, 10000.0, 17);
    CHECK(max_rel(dx, dx_d, 1.0) < 1e-6);
}

TEMPLATE_TEST_CASE("rope 16-bit = float kernel on the rounded inputs, rounded once (RNE)", "[rope]", half, bfloat16) {
    const Device dev;
    const Shape s{2, 11, 3, 18};
    const auto x16 = random_values<TestType>(s.size(), 6, -3.0, 3.0);
    std::vector<float> x(s.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(x16[i]);
    for (const bool backward : {false, true}) {
        INFO((backward ? "rope_backward" : "rope_forward"));
        std::vector<float> out(s.size());
        std::vector<TestType> out16(s.size());
        if (backward) {
            snug::host::rope_backward(dev, out.data(), x.data(), s.B, s.T, s.NH, s.hs, 10000.0, 2);
            snug::host::rope_backward(dev, out16.data(), x16.data(), s.B, s.T, s.NH, s.hs, 10000.0, 2);
        } else {
            snug::host::rope_forward(dev, out.data(), x.data(), s.B, s.T, s.NH, s.hs, 10000.0, 2);
            snug::host::rope_forward(dev, out16.data(), x16.data(), s.B, s.T, s.NH, s.hs, 10000.0, 2);
        }
        std::size_t bad = 0, not_rne = 0;
        for (std::size_t i = 0; i < out.size(); ++i) {
            bad += out16[i].bits != TestType(out[i]).bits;
            not_rne += !is_rne(static_cast<double>(out[i]), out16[i]);
        }
        CHECK(bad == 0);
        CHECK(not_rne == 0);
    }
}

TEST_CASE("rope: an odd head size, negative sizes, a bad theta or offset throw, naming the problem", "[rope]") {
    const Device dev;
    std::vector<float> x(64, 1.0F);
    CHECK_THROWS_AS(snug::host::rope_forward(dev, x.data(), x.data(), 1, 2, 2, 5), snug::ShapeError);
    CHECK_THROWS_WITH(snug::host::rope_forward(dev, x.data(), x.data(), 1, 2, 2, 5),
                      Catch::Contains("rope_forward") && Catch::Contains("hs = 5 is odd"));
    CHECK_THROWS_WITH(snug::host::rope_backward(dev, x.data(), x.data(), 1, 2, 2, 7),
                      Catch::Contains("rope_backward") && Catch::Contains("hs = 7 is odd"));
    CHECK_THROWS_WITH(snug::host::rope_forward(dev, x.data(), x.data(), 1, -2, 2, 4),
                      Catch::Contains("negative size") && Catch::Contains("T = -2"));
    CHECK_THROWS_AS(snug::host::rope_forward(dev, x.data(), x.data(), 1, 2, 2, 4, 0.0), snug::ConfigError);
    CHECK_THROWS_WITH(snug::host::rope_forward(dev, x.data(), x.data(), 1, 2, 2, 4, 10000.0, -1),
                      Catch::Contains("pos_offset = -1"));
    CHECK_NOTHROW(snug::host::rope_forward(dev, x.data(), x.data(), 0, 2, 2, 4));
}

TEST_CASE("rope with a row stride rotates q and k inside a fused qkv row and leaves v alone", "[rope]") {
    // qkv rows of 3 NH' heads: [q | k | v]; NH = 2 NH' heads rotated per row.
    const Device dev;
    const int B = 2, T = 9, NHq = 3, hs = 8;
    const std::int64_t row = 3 * NHq * hs;
    const auto qkv = random_values<float>(static_cast<std::size_t>(B * T * row), 7, -2.0, 2.0);
    // The same q and k, copied out contiguous: (B, T, 2 NH', hs).
    std::vector<float> qk(static_cast<std::size_t>(B * T * 2 * NHq * hs));
    for (std::int64_t r = 0; r < B * T; ++r)
        std::copy_n(qkv.begin() + r * row, 2 * NHq * hs, qk.begin() + r * 2 * NHq * hs);

    for (const bool backward : {false, true}) {
        INFO((backward ? "rope_backward" : "rope_forward"));
        std::vector<float> strided = qkv, contiguous(qk.size());
        if (backward) {
            snug::host::rope_backward(dev, strided.data(), strided.data(), B, T, 2 * NHq, hs, 10000.0, 3, row);
            snug::host::rope_backward(dev, contiguous.data(), qk.data(), B, T, 2 * NHq, hs, 10000.0, 3);
        } else {
            snug::host::rope_forward(dev, strided.data(), strided.data(), B, T, 2 * NHq, hs, 10000.0, 3, row);
            snug::host::rope_forward(dev, contiguous.data(), qk.data(), B, T, 2 * NHq, hs, 10000.0, 3);
        }
        std::size_t qk_differ = 0, v_changed = 0;
        for (std::int64_t r = 0; r < B * T; ++r) {
            for (std::int64_t j = 0; j < 2 * NHq * hs; ++j)
                qk_differ += strided[static_cast<std::size_t>(r * row + j)] !=
                             contiguous[static_cast<std::size_t>(r * 2 * NHq * hs + j)];
            for (std::int64_t j = 2 * NHq * hs; j < row; ++j)
                v_changed += strided[static_cast<std::size_t>(r * row + j)] != qkv[static_cast<std::size_t>(r * row + j)];
        }
        CHECK(qk_differ == 0);
        CHECK(v_changed == 0);
        CHECK(strided != qkv);  // the rotation did something
    }
    // A stride shorter than the rotated heads would overlap rows.
    std::vector<float> buf = qkv;
    CHECK_THROWS_AS(snug::host::rope_forward(dev, buf.data(), buf.data(), B, T, 2 * NHq, hs, 10000.0, 0,
                                             2 * NHq * hs - 1),
                    snug::ShapeError);
    CHECK_THROWS_WITH(snug::host::rope_backward(dev, buf.data(), buf.data(), B, T, 2 * NHq, hs, 10000.0, 0, 5),
                      Catch::Contains("row_stride = 5") && Catch::Contains("NH * hs = 48"));
}
