// AdamW with 8-bit block-wise moments (ops/moment_quantization.hpp,
// host/adamw.hpp adamw_update_8bit).
//
// The code tables are checked against their definition (decades, spacing,
// ends). The quantiser is checked for unbiasedness: over many dice the mean
// of the dequantised value is the value. The update is checked against a
// float64 reference of the same algorithm written here: dequantise in
// double, the AdamW update in double, the block's absmax in double, then the
// code chosen from the value's position between its two neighbouring table
// entries against the same Philox die. The kernel computes in fp32, so a
// die within a few fp32 ulps of the boundary may fall the other way: every
// code must equal the reference's or be its neighbour, and such codes must be
// rare (the fp32 error is ~1e-7 of a value, the gap between codes at least
// 0.7% of it: about 1e-5 of the codes; allowed 1e-3).
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "snug/core/half.hpp"
#include "snug/core/rng.hpp"
#include "snug/host/adamw.hpp"
#include "snug/ops/moment_quantization.hpp"
#include "support/awkward_groups.hpp"
#include "support/host_support.hpp"

namespace {

using snug::bfloat16;
using snug::host::Device;
using snug::ops::moment_block;
using snug::ops::moment_codes;
using snug::test::AdamWHyper;
using snug::test::random_grad;
using snug::test::to_double;
using snug::test::reference_round_bf16;

TEST_CASE("the 8-bit code tables are the decades they are defined as", "[adamw][8bit]") {
    const auto& c = moment_codes;
    // Ascending, ending at 1.
    for (int k = 1; k < 128; ++k) CHECK(c.first[k] > c.first[k - 1]);
    for (int q = 1; q < 256; ++q) CHECK(c.second[q] > c.second[q - 1]);
    CHECK(c.first[0] == 0.0f);
    CHECK(c.first[127] == 1.0f);
    CHECK(c.second[0] == 1e-8f);
    CHECK(c.second[255] == 1.0f);
    // Codes per decade (10^-(e+1), 10^-e]: 64, 32, ..., 1 for the first
    // moment's magnitudes; 128, ..., 1 for the second moment; linearly spaced
    // in each, the top one 10^-e.
    auto per_decade = [](const float* table, int n, int decades) {
        std::vector<int> count(static_cast<std::size_t>(decades), 0);
        for (int k = 0; k < n; ++k) {
            const double x = table[k];
            for (int e = 0; e < decades; ++e)
                if (x > std::pow(10.0, -(e + 1)) * (1 + 1e-6) && x <= std::pow(10.0, -e) * (1 + 1e-6))
                    ++count[static_cast<std::size_t>(e)];
        }
        return count;
    };
    CHECK(per_decade(c.first, 128, 7) == std::vector<int>{64, 32, 16, 8, 4, 2, 1});
    CHECK(per_decade(c.second, 256, 8) == std::vector<int>{128, 64, 32, 16, 8, 4, 2, 1});
    CHECK(c.first[1] == Approx(1e-6).epsilon(1e-6));
    CHECK(c.first[63] == Approx(0.1).epsilon(1e-6));  // the top of the second decade
    CHECK(c.first[64] == Approx(0.1 + 0.9 / 64).epsilon(1e-6));
    CHECK(c.second[1] == Approx(1e-7).epsilon(1e-6));
    CHECK(c.second[128] == Approx(0.1 + 0.9 / 128).epsilon(1e-6));
}

TEST_CASE("the code search finds the largest entry at or below a value, as a scan does", "[adamw][8bit]") {
    // At every entry, its float neighbours, midpoints, and random values over
    // all decades, against a plain scan.
    auto scan = [](const float* table, int n, float x) {
        int k = 0;
        while (k + 1 < n && table[k + 1] <= x) ++k;
        return k;
    };
    std::mt19937 gen(11);
    std::uniform_real_distribution<double> exponent(-9.0, 0.0);
    for (const auto& [table, n] : {std::pair{moment_codes.first, 128}, std::pair{moment_codes.second, 256}}) {
        std::vector<float> xs;
        for (int k = 0; k < n; ++k) {
            xs.push_back(table[k]);
            xs.push_back(std::nextafter(table[k], 2.0f));
            xs.push_back(std::nextafter(table[k], -1.0f));
            if (k + 1 < n) xs.push_back(0.5f * (table[k] + table[k + 1]));
        }
        for (int i = 0; i < 20000; ++i) xs.push_back(static_cast<float>(std::pow(10.0, exponent(gen))));
        std::size_t wrong = 0, tried = 0;
        for (const float x : xs) {
            if (!(x >= table[0] && x < table[n - 1])) continue;  // the search's domain
            ++tried;
            const int want = scan(table, n, x);
            const int got = snug::ops::code_at_or_below(table, n, x);
            if (got != want && ++wrong <= 5) FAIL_CHECK("x = " << x << ": code " << got << ", the scan says " << want);
        }
        CHECK(tried > 15000);
        CHECK(wrong == 0);
    }
}

// The mean of dequantise(quantise(x)) over `dice` Philox words.
double mean_round_trip(bool first, float x, float absmax, int dice, std::uint64_t seed) {
    double sum = 0.0;
    for (int i = 0; i < dice; ++i) {
        const std::uint32_t die = snug::random_bits(seed, 0, static_cast<std::uint64_t>(i));
        sum += first ? snug::ops::dequantize_first(moment_codes, snug::ops::quantize_first(moment_codes, x, absmax, die), absmax)
                     : snug::ops::dequantize_second(moment_codes, snug::ops::quantize_second(moment_codes, x, absmax, die), absmax);
    }
    return sum / dice;
}

TEST_CASE("8-bit quantisation is unbiased between neighbouring codes, and exact on a code", "[adamw][8bit]") {
    const float absmax = 0.37f;
    // Values in every decade of the first moment, both signs, and of the
    // second; each mean within 5 standard deviations of the value (the
    // spread of a two-point rounding is at most half the gap).
    std::mt19937 gen(5);
    std::uniform_real_distribution<double> decade(-6.0, 0.0);
    const int dice = 20000;
    for (int trial = 0; trial < 40; ++trial) {
        const float a = static_cast<float>(std::pow(10.0, decade(gen))) * absmax;
        for (const float x : {a, -a}) {
            const double mean = mean_round_trip(true, x, absmax, dice, 100 + static_cast<std::uint64_t>(trial));
            // The gap at x: the two codes around |x| / absmax.
            const float r = std::abs(x) / absmax;
            int k = 0;
            while (k + 1 < 128 && moment_codes.first[k + 1] <= r) ++k;
            const double gap = (k + 1 < 128 ? moment_codes.first[k + 1] - moment_codes.first[k] : 0.0) * absmax;
            INFO("m = " << x << ", mean " << mean << ", gap " << gap);
            CHECK(std::abs(mean - x) <= 5 * 0.5 * gap / std::sqrt(double(dice)) + 1e-7 * std::abs(x));
        }
        const double v = std::pow(10.0, decade(gen) - 2.0) * absmax;  // down to 1e-8 of absmax
        const double mean = mean_round_trip(false, static_cast<float>(v), absmax, dice, 300 + static_cast<std::uint64_t>(trial));
        const float r = static_cast<float>(v) / absmax;
        int q = 0;
        while (q + 1 < 256 && moment_codes.second[q + 1] <= r) ++q;
        const double gap = (moment_codes.second[q + 1] - moment_codes.second[q]) * absmax;
        INFO("v = " << v << ", mean " << mean << ", gap " << gap);
        CHECK(std::abs(mean - v) <= 5 * 0.5 * gap / std::sqrt(double(dice)) + 1e-7 * v);
    }
    // A value on a code stays there whatever the die; the block's largest
    // value is code 127 (m) or 255 (v) exactly.
    for (const std::uint32_t die : {0u, 0x8000'0000u, 0xFFFF'FFFFu}) {
        CHECK(snug::ops::quantize_first(moment_codes, absmax, absmax, die) == 127);
        CHECK(snug::ops::quantize_first(moment_codes, -absmax, absmax, die) == 0x80 + 127);
        CHECK(snug::ops::quantize_first(moment_codes, 0.0f, absmax, die) == 0);
        CHECK(snug::ops::quantize_second(moment_codes, absmax, absmax, die) == 255);
        CHECK(snug::ops::quantize_first(moment_codes, moment_codes.first[70] * absmax, absmax, die) == 70);
        // An all-zero block (absmax 0) stores code 0, which reads back 0.
        CHECK(snug::ops::quantize_second(moment_codes, 0.0f, 0.0f, die) == 0);
        CHECK(snug::ops::dequantize_second(moment_codes, 0, 0.0f) == 0.0f);
        // v far below its block rounds up to the smallest code, never to 0.
        CHECK(snug::ops::quantize_second(moment_codes, absmax * 1e-12f, absmax, die) == 0);
        CHECK(snug::ops::dequantize_second(moment_codes, 0, absmax) > 0.0f);
    }
}


// The reference's code for the double value a = |x| / absmax in `table`:
// the largest entry <= a, or the next with probability (a - lo) / (hi - lo)
// against the die's 24 bits, as ops::round_to_code defines it.
int reference_code(const float* table, int n, double a, std::uint32_t die) {
    if (!(a >= double(table[0]))) return 0;
    int k = 0;
    while (k + 1 < n && double(table[k + 1]) <= a) ++k;
    if (k == n - 1) return k;
    const double position = (a - table[k]) / (double(table[k + 1]) - double(table[k]));
    return position > double(die >> 8) / 16777216.0 ? k + 1 : k;
}

struct Agreement {
    std::size_t neighbour = 0, worse = 0;
    void add(int got, int want) {
        if (got == want) return;
        if (std::abs(got - want) == 1) ++neighbour;
        else ++worse;
    }
};

// One update of n weights (P: fp32 master or bf16 without one) from random
// 8-bit state, against the float64 reference.
template <class P>
void check_one_update(std::size_t n, const AdamWHyper& h, std::uint64_t seed, std::int64_t first_index,
                      std::uint32_t data_seed) {
    INFO("n = " << n << ", step " << h.step << ", first index " << first_index);
    const std::size_t blocks = static_cast<std::size_t>(snug::ops::moment_blocks(std::int64_t(n)));
    std::mt19937 gen(data_seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> unit(0.5f, 1.0f);
    std::vector<P> p(n);
    for (auto& x : p) x = P(2.0f * unit(gen) - 1.5f);
    std::vector<std::uint8_t> mq(n), vq(n);
    for (auto& x : mq) x = static_cast<std::uint8_t>(byte(gen));
    for (auto& x : vq) x = static_cast<std::uint8_t>(byte(gen));
    std::vector<float> m_absmax(blocks), v_absmax(blocks);
    for (auto& x : m_absmax) x = 0.05f * unit(gen);
    for (auto& x : v_absmax) x = 0.01f * unit(gen);
    const std::vector<float> grad = random_grad(n, data_seed + 1);
    const std::vector<P> p0 = p;
    const std::vector<std::uint8_t> mq0 = mq, vq0 = vq;
    const std::vector<float> ma0 = m_absmax, va0 = v_absmax;
    snug::host::adamw_update_8bit(Device{}, p.data(), nullptr, grad.data(),
                                  snug::ops::BlockwiseMoments{mq.data(), m_absmax.data(), vq.data(), v_absmax.data()},
                                  std::int64_t(n), h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step, h.grad_scale,
                                  snug::ops::AdamWRounding{seed, first_index});

    const double b1 = h.beta1, b2 = h.beta2;
    Agreement codes_m, codes_v;
    std::size_t p_one_step = 0, p_worse = 0, negative_zero = 0;
    double absmax_error = 0.0, p_error = 0.0;
    for (std::size_t b = 0; b < blocks; ++b) {
        const std::size_t begin = b * moment_block, end = std::min(n, begin + moment_block);
        std::vector<double> m_new(end - begin), v_new(end - begin), p_new(end - begin), terms(end - begin);
        double m_max = 0.0, v_max = 0.0;
        for (std::size_t i = begin; i < end; ++i) {
            const double sign = (mq0[i] & 0x80) != 0 ? -1.0 : 1.0;
            const double m_old = sign * double(moment_codes.first[mq0[i] & 0x7F]) * double(ma0[b]);
            const double v_old = double(moment_codes.second[vq0[i]]) * double(va0[b]);
            const double g = double(grad[i]) * double(h.grad_scale);
            const double mn = b1 * m_old + (1 - b1) * g;
            const double vn = b2 * v_old + (1 - b2) * g * g;
            const double decayed = to_double(p0[i]) - double(h.lr) * double(h.weight_decay) * to_double(p0[i]);
            const double adam = double(h.lr) * (mn / (1 - std::pow(b1, h.step))) /
                                (std::sqrt(vn / (1 - std::pow(b2, h.step))) + double(h.eps));
            m_new[i - begin] = mn;
            v_new[i - begin] = vn;
            p_new[i - begin] = decayed - adam;
            terms[i - begin] = std::abs(decayed) + std::abs(adam);
            m_max = std::max(m_max, std::abs(mn));
            v_max = std::max(v_max, vn);
        }
        absmax_error = std::max(absmax_error, std::abs(double(m_absmax[b]) - m_max) / m_max);
        absmax_error = std::max(absmax_error, std::abs(double(v_absmax[b]) - v_max) / v_max);
        for (std::size_t i = begin; i < end; ++i) {
            const snug::Philox4 dice =
                snug::random_block(seed, std::uint64_t(h.step), std::uint64_t(first_index + std::int64_t(i)));
            const double mn = m_new[i - begin];
            // Codes as signed integers (sign bit, magnitude): -127 .. 127.
            const int k = reference_code(moment_codes.first, 128, std::abs(mn) / m_max, dice.v[0]);
            const int got = (mq[i] & 0x80) != 0 ? -(mq[i] & 0x7F) : mq[i] & 0x7F;
            codes_m.add(got, mn < 0 ? -k : k);
            negative_zero += mq[i] == 0x80;  // zero is stored as code 0
            codes_v.add(vq[i], reference_code(moment_codes.second, 256, v_new[i - begin] / v_max, dice.v[1]));
            if constexpr (std::is_same_v<P, bfloat16>) {
                const double want = reference_round_bf16(p_new[i - begin], dice.v[2]);
                if (to_double(p[i]) != want) {
                    int e = 0;
                    std::frexp(std::max(std::abs(to_double(p[i])), std::abs(want)), &e);
                    if (std::abs(to_double(p[i]) - want) <= std::ldexp(1.0, e - 8)) ++p_one_step;
                    else ++p_worse;
                }
            } else {
                p_error = std::max(p_error, std::abs(to_double(p[i]) - p_new[i - begin]) / terms[i - begin]);
            }
        }
    }
    const std::size_t allowed = n / 1000 + 1;
    CHECK(codes_m.worse == 0);
    CHECK(codes_v.worse == 0);
    CHECK(negative_zero == 0);
    CHECK(codes_m.neighbour <= allowed);
    CHECK(codes_v.neighbour <= allowed);
    CHECK(absmax_error < 1e-6);  // a few fp32 roundings (2^-24 = 6e-8 each)
    CHECK(p_worse == 0);
    CHECK(p_one_step <= allowed);
    CHECK(p_error < 1e-6);
    // The random state was not a fixed point: most codes moved.
    std::size_t moved = 0;
    for (std::size_t i = 0; i < n; ++i) moved += mq[i] != mq0[i];
    CHECK(moved > n / 2);
}

TEST_CASE("adamw_update_8bit follows a float64 reference of the same quantisation", "[adamw][8bit]") {
    SECTION("fp32 master, whole and partial blocks") {
        check_one_update<float>(100'003, AdamWHyper{}, 1, 0, 1);
        check_one_update<float>(1'000, AdamWHyper{3e-4f, 0.8f, 0.999f, 1e-6f, 0.0f, 1, 1.0f}, 99, 12345, 2);
        check_one_update<float>(7, AdamWHyper{}, 3, 5, 3);  // one partial block
    }
    SECTION("bf16 weights without a master, parallel ranges") {
        check_one_update<bfloat16>(300'007, AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1000, 0.25f}, 6, 1 << 20, 5);
    }
}

TEST_CASE("adamw_update_8bit: a non-finite value marks its block as NaN and no other", "[adamw][8bit]") {
    const std::size_t n = 3 * moment_block + 17;
    std::vector<float> grad = random_grad(n, 7);
    auto run = [&](const std::vector<float>& g) {
        std::vector<float> p(n, 0.5f);
        std::vector<std::uint8_t> m(n, 0), v(n, 0);
        std::vector<float> ma(4, 0.0f), va(4, 0.0f);
        const snug::ops::BlockwiseMoments s{m.data(), ma.data(), v.data(), va.data()};
        for (int step = 1; step <= 3; ++step)
            snug::host::adamw_update_8bit(Device{}, p.data(), nullptr, g.data(), s, std::int64_t(n), 1e-3f, 0.9f,
                                          0.95f, 1e-8f, 0.0f, step, 1.0f, snug::ops::AdamWRounding{9, 0});
        return std::tuple{p, m, v, ma, va};
    };
    const auto clean = run(grad);
    // Every block's absmax is finite and positive after real gradients.
    for (const float a : std::get<3>(clean)) CHECK((std::isfinite(a) && a > 0.0f));
    grad[moment_block + 3] = std::numeric_limits<float>::quiet_NaN();
    const auto [p, m, v, ma, va] = run(grad);
    CHECK(std::isnan(ma[1]));
    CHECK(std::isnan(va[1]));
    CHECK(std::bit_cast<std::uint32_t>(ma[1]) == 0x7FC0'0000U);  // the canonical NaN
    // The other blocks are untouched by it.
    for (const std::size_t b : {std::size_t{0}, std::size_t{2}, std::size_t{3}}) {
        CHECK(ma[b] == std::get<3>(clean)[b]);
        CHECK(va[b] == std::get<4>(clean)[b]);
    }
}

}  // namespace
