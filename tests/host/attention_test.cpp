// The host attention core against a naive double-precision reference written
// here (explicit loops over heads, masked softmax), its backward against
// central finite differences, and the 16-bit paths against the fp32 kernel on
// the same rounded inputs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/host/attention.hpp"

namespace {

using snug::host::Device;

struct Shape {
    int B, T, C, NH;
    std::size_t qkv() const { return std::size_t(B) * T * 3 * C; }
    std::size_t out() const { return std::size_t(B) * T * C; }
    std::size_t att() const { return std::size_t(B) * NH * T * T; }
    std::string str() const { return fmt::format("B={} T={} C={} NH={}", B, T, C, NH); }
};

std::vector<double> random_values(std::size_t n, std::uint32_t seed, double scale = 1.0) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<double> dist(-scale, scale);
    std::vector<double> v(n);
    for (double& x : v) x = dist(gen);
    return v;
}

template <class T>
std::vector<T> convert(const std::vector<double>& v) {
    std::vector<T> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = T(static_cast<float>(v[i]));
    return out;
}

template <>
std::vector<double> convert<double>(const std::vector<double>& v) {
    return v;
}

template <class T>
std::vector<double> widen(const std::vector<T>& v) {
    std::vector<double> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(static_cast<float>(v[i]));
    return out;
}

template <>
std::vector<double> widen<double>(const std::vector<double>& v) {
    return v;
}

// The textbook definition, one head and one query row at a time, in double.
void reference_forward(std::vector<double>& out, std::vector<double>& att, const std::vector<double>& qkv,
                       const Shape& s) {
    const int hs = s.C / s.NH;
    out.assign(s.out(), 0.0);
    att.assign(s.att(), 0.0);
    std::vector<double> score(s.T);
    for (int b = 0; b < s.B; ++b) {
        for (int h = 0; h < s.NH; ++h) {
            for (int t = 0; t < s.T; ++t) {
                const double* q = &qkv[(std::size_t(b) * s.T + t) * 3 * s.C + h * hs];
                double max = -std::numeric_limits<double>::infinity();
                for (int j = 0; j <= t; ++j) {
                    const double* k = &qkv[(std::size_t(b) * s.T + j) * 3 * s.C + s.C + h * hs];
                    double dot = 0.0;
                    for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
                    score[j] = dot / std::sqrt(double(hs));
                    max = std::max(max, score[j]);
                }
                double z = 0.0;
                for (int j = 0; j <= t; ++j) z += std::exp(score[j] - max);
                double* a = &att[((std::size_t(b) * s.NH + h) * s.T + t) * s.T];
                for (int j = 0; j <= t; ++j) a[j] = std::exp(score[j] - max) / z;
                double* o = &out[(std::size_t(b) * s.T + t) * s.C + h * hs];
                for (int j = 0; j <= t; ++j) {
                    const double* v = &qkv[(std::size_t(b) * s.T + j) * 3 * s.C + 2 * s.C + h * hs];
                    for (int i = 0; i < hs; ++i) o[i] += a[j] * v[i];
                }
            }
        }
    }
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
    double sum = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
    return sum;
}

// Every element of a small input, a spread-out subset of about 400 of a
// large one (a stride that is odd and not a multiple of 3, so that the
// subset visits q, k and v, every head, early and late rows).
std::vector<std::size_t> probe_indices(std::size_t n) {
    std::vector<std::size_t> idx;
    std::size_t stride = n <= 600 ? 1 : n / 400;
    while (stride > 1 && (stride % 2 == 0 || stride % 3 == 0)) ++stride;
    for (std::size_t i = 0; i < n; i += stride) idx.push_back(i);
    if (idx.back() != n - 1) idx.push_back(n - 1);
    return idx;
}

// d/dqkv[i] of loss(qkv) = sum(forward(qkv) * R) by central differences, for
// i in idx.
template <class Forward>
std::vector<double> finite_difference(std::vector<double> qkv, const std::vector<double>& R, double h,
                                      const std::vector<std::size_t>& idx, Forward&& forward) {
    std::vector<double> grad(idx.size());
    for (std::size_t n = 0; n < idx.size(); ++n) {
        const std::size_t i = idx[n];
        const double x = qkv[i];
        qkv[i] = x + h;
        const double plus = dot(forward(qkv), R);
        qkv[i] = x - h;
        const double minus = dot(forward(qkv), R);
        qkv[i] = x;
        grad[n] = (plus - minus) / (2 * h);
    }
    return grad;
}

// Several heads with T hs up to 4096 run one head per thread; larger ones,
// or a single head, in stages (detail::attention_schedule): both are here.
const std::vector<Shape> forward_shapes = {
    {2, 7, 12, 3},    // hs = 4
    {1, 1, 8, 2},     // T = 1
    {3, 37, 40, 4},   // hs = 10, T odd
    {1, 130, 64, 2},  // T past two row blocks (of 64)
    {2, 133, 20, 5},  // hs = 4
    {1, 200, 8, 1},   // one head: in stages, its rows split among tasks
    {2, 300, 64, 4},  // T hs > 4096: in stages
};

}  // namespace

TEMPLATE_TEST_CASE("attention_forward matches a naive double reference", "[attention]", float, double) {
    using T = TestType;
    const double tol = std::same_as<T, float> ? 2e-6 : 1e-13;
    std::uint32_t seed = 1;
    for (const Shape& s : forward_shapes) {
        INFO(s.str());
        // Scaled so that scores reach a few units and the softmax is far from uniform.
        const std::vector<T> qkv = convert<T>(random_values(s.qkv(), seed++, 2.0));
        std::vector<double> ref_out, ref_att;
        reference_forward(ref_out, ref_att, widen(qkv), s);

        std::vector<T> out(s.out(), T(std::numeric_limits<float>::quiet_NaN()));
        std::vector<T> att(s.att(), T(std::numeric_limits<float>::quiet_NaN()));
        snug::host::attention_forward(Device{}, out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);

        double out_err = 0.0, att_err = 0.0, sum_err = 0.0;
        bool upper_zero = true;
        for (std::size_t i = 0; i < out.size(); ++i) {
            out_err = std::max(out_err, std::abs(double(out[i]) - ref_out[i]) / (1.0 + std::abs(ref_out[i])));
        }
        for (std::size_t row = 0; row < std::size_t(s.B) * s.NH * s.T; ++row) {
            const int t = int(row % std::size_t(s.T));
            double sum = 0.0;
            for (int j = 0; j < s.T; ++j) {
                const std::size_t i = row * s.T + j;
                att_err = std::max(att_err, std::abs(double(att[i]) - ref_att[i]));
                if (j > t) upper_zero = upper_zero && att[i] == T(0) && !std::signbit(att[i]);
                sum += double(att[i]);
            }
            sum_err = std::max(sum_err, std::abs(sum - 1.0));
        }
        CHECK(out_err < tol);
        CHECK(att_err < tol);
        CHECK(sum_err < tol * 4);
        CHECK(upper_zero);
    }
}

TEST_CASE("attention_forward with T = 1 returns v and a probability of exactly 1", "[attention]") {
    const Shape s{3, 1, 12, 4};
    const std::vector<float> qkv = convert<float>(random_values(s.qkv(), 7));
    std::vector<float> out(s.out()), att(s.att());
    snug::host::attention_forward(Device{}, out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    for (float p : att) CHECK(p == 1.0f);
    for (int b = 0; b < s.B; ++b) {
        for (int c = 0; c < s.C; ++c) CHECK(out[std::size_t(b) * s.C + c] == qkv[std::size_t(b) * 3 * s.C + 2 * s.C + c]);
    }
}

TEST_CASE("attention_backward in double matches central finite differences of attention_forward", "[attention]") {
    // The last one runs in stages (one head), its rows split among tasks.
    const std::vector<Shape> shapes = {{2, 5, 12, 3}, {1, 1, 6, 2},   {2, 9, 10, 1},
                                       {2, 20, 12, 3}, {1, 131, 4, 2}, {1, 190, 2, 1}};
    std::uint32_t seed = 100;
    for (const Shape& s : shapes) {
        INFO(s.str());
        const std::vector<double> qkv = random_values(s.qkv(), seed++, 1.5);
        const std::vector<double> R = random_values(s.out(), seed++);
        std::vector<double> out(s.out()), att(s.att());
        auto forward = [&](const std::vector<double>& x) {
            snug::host::attention_forward(Device{}, out.data(), att.data(), x.data(), s.B, s.T, s.C, s.NH);
            return out;
        };
        const std::vector<std::size_t> idx = probe_indices(qkv.size());
        const std::vector<double> fd = finite_difference(qkv, R, 1e-5, idx, forward);

        forward(qkv);
        std::vector<double> dqkv(s.qkv(), std::numeric_limits<double>::quiet_NaN());
        std::vector<double> scratch(s.att(), std::numeric_limits<double>::quiet_NaN());
        snug::host::attention_backward(Device{}, dqkv.data(), scratch.data(), R.data(), qkv.data(), att.data(), s.B,
                                       s.T, s.C, s.NH);
        double err = 0.0, scale = 0.0;
        for (std::size_t i = 0; i < fd.size(); ++i) {
            err = std::max(err, std::abs(dqkv[idx[i]] - fd[i]));
            scale = std::max(scale, std::abs(fd[i]));
        }
        CHECK(scale > 0.1);
        CHECK(err < 1e-8 * (1.0 + scale));
    }
}

TEST_CASE("attention_backward in fp32 matches finite differences of the double reference", "[attention]") {
    // The last two run in stages.
    const std::vector<Shape> shapes = {{2, 9, 12, 3}, {1, 1, 6, 2}, {1, 130, 10, 2}, {1, 190, 3, 1}, {1, 33, 256, 2}};
    std::uint32_t seed = 200;
    for (const Shape& s : shapes) {
        INFO(s.str());
        const std::vector<float> qkv = convert<float>(random_values(s.qkv(), seed++, 1.5));
        const std::vector<float> R = convert<float>(random_values(s.out(), seed++));
        std::vector<double> ref_out, ref_att;
        auto forward = [&](const std::vector<double>& x) {
            reference_forward(ref_out, ref_att, x, s);
            return ref_out;
        };
        const std::vector<std::size_t> idx = probe_indices(qkv.size());
        const std::vector<double> fd = finite_difference(widen(qkv), widen(R), 1e-5, idx, forward);

        std::vector<float> out(s.out()), att(s.att());
        snug::host::attention_forward(Device{}, out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
        std::vector<float> dqkv(s.qkv(), std::numeric_limits<float>::quiet_NaN());
        std::vector<float> scratch(s.att(), std::numeric_limits<float>::quiet_NaN());
        snug::host::attention_backward(Device{}, dqkv.data(), scratch.data(), R.data(), qkv.data(), att.data(), s.B,
                                       s.T, s.C, s.NH);
        double err = 0.0, scale = 0.0;
        for (std::size_t i = 0; i < fd.size(); ++i) {
            err = std::max(err, std::abs(double(dqkv[idx[i]]) - fd[i]));
            scale = std::max(scale, std::abs(fd[i]));
        }
        CHECK(scale > 0.1);
        CHECK(err < 3e-6 * (1.0 + scale));
    }
}

TEMPLATE_TEST_CASE("16-bit attention is the fp32 kernel on the rounded inputs, rounded once", "[attention]",
                   snug::half, snug::bfloat16) {
    using T = TestType;
    const std::vector<Shape> shapes = {{2, 7, 12, 3}, {1, 1, 8, 2}, {1, 130, 24, 2}, {1, 160, 64, 2}};
    std::uint32_t seed = 300;
    for (const Shape& s : shapes) {
        INFO(s.str());
        const std::vector<T> qkv = convert<T>(random_values(s.qkv(), seed++, 2.0));
        const std::vector<T> dout = convert<T>(random_values(s.out(), seed++));
        const std::vector<float> qkv_f = convert<float>(widen(qkv));
        const std::vector<float> dout_f = convert<float>(widen(dout));

        std::vector<float> out_f(s.out()), att_f(s.att());
        snug::host::attention_forward(Device{}, out_f.data(), att_f.data(), qkv_f.data(), s.B, s.T, s.C, s.NH);
        std::vector<T> out(s.out(), T::from_bits(0x7FFF)), att(s.att(), T::from_bits(0x7FFF));
        snug::host::attention_forward(Device{}, out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
        std::size_t out_bad = 0, att_bad = 0;
        for (std::size_t i = 0; i < out.size(); ++i) out_bad += out[i].bits != T(out_f[i]).bits;
        for (std::size_t i = 0; i < att.size(); ++i) att_bad += att[i].bits != T(att_f[i]).bits;
        CHECK(out_bad == 0);
        CHECK(att_bad == 0);

        // Backward from the 16-bit probabilities; the fp32 kernel gets them widened.
        const std::vector<float> att16_f = convert<float>(widen(att));
        std::vector<float> dqkv_f(s.qkv()), scratch_f(s.att());
        snug::host::attention_backward(Device{}, dqkv_f.data(), scratch_f.data(), dout_f.data(), qkv_f.data(),
                                       att16_f.data(), s.B, s.T, s.C, s.NH);
        std::vector<T> dqkv(s.qkv(), T::from_bits(0x7FFF)), scratch(s.att(), T::from_bits(0x7FFF));
        snug::host::attention_backward(Device{}, dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(),
                                       s.B, s.T, s.C, s.NH);
        std::size_t dqkv_bad = 0;
        for (std::size_t i = 0; i < dqkv.size(); ++i) dqkv_bad += dqkv[i].bits != T(dqkv_f[i]).bits;
        CHECK(dqkv_bad == 0);
    }
}

TEST_CASE("attention_exp is e^x to a few ulp on the softmax's range", "[attention]") {
    using snug::host::detail::attention_exp;
    double worst = 0.0;
    for (int i = 0; i <= 2'000'000; ++i) {
        const float x = -87.0f * static_cast<float>(i) / 2'000'000.0f;
        const double exact = std::exp(static_cast<double>(x));
        worst = std::max(worst, std::abs(attention_exp(x) - exact) / exact);
    }
    CHECK(worst < 3.0 * 0x1p-24);
    CHECK(attention_exp(0.0f) == 1.0f);
    CHECK(attention_exp(-88.0f) == 0.0f);
    CHECK(attention_exp(-std::numeric_limits<float>::infinity()) == 0.0f);
    CHECK(std::isnan(attention_exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("attention rejects shapes that make no sense", "[attention]") {
    std::vector<float> buf(4096);
    float* p = buf.data();
    using snug::ShapeError;
    using snug::host::attention_backward;
    using snug::host::attention_forward;
    CHECK_THROWS_AS(attention_forward(Device{}, p, p, p, 1, 4, 10, 4), ShapeError);  // 10 % 4 != 0
    CHECK_THROWS_AS(attention_forward(Device{}, p, p, p, 1, 4, 8, 0), ShapeError);
    CHECK_THROWS_AS(attention_forward(Device{}, p, p, p, 1, 4, 0, 2), ShapeError);
    CHECK_THROWS_AS(attention_forward(Device{}, p, p, p, -1, 4, 8, 2), ShapeError);
    CHECK_THROWS_AS(attention_forward(Device{}, p, p, p, 1, -4, 8, 2), ShapeError);
    CHECK_THROWS_AS(attention_backward(Device{}, p, p, p, p, p, 1, 4, 12, 5), ShapeError);
    CHECK_THROWS_WITH(attention_backward(Device{}, p, p, p, p, p, 1, 4, 12, 5),
                      Catch::Matchers::Contains("C = 12") && Catch::Matchers::Contains("NH = 5"));
    // Empty batches are fine and touch nothing.
    buf.assign(buf.size(), 3.0f);
    attention_forward(Device{}, p, p, p, 0, 4, 8, 2);
    attention_backward(Device{}, p, p, p, p, p, 2, 0, 8, 2);
    CHECK(std::all_of(buf.begin(), buf.end(), [](float x) { return x == 3.0f; }));
}
