// Host encoder (token + position embedding): forward against a naive double
// sum, backward by central finite differences in double and against a naive
// sequential accumulation (bit-exact: the kernel promises that order), the
// 16-bit forward against the float kernel, and bad token ids / sizes.
#include "snug/host/encoder.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/host_support.hpp"

namespace {

using snug::bfloat16;
using snug::half;
using snug::host::Device;
using snug::test::random_values;

std::vector<std::int32_t> random_tokens(std::size_t n, int V, std::uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> dist(0, V - 1);
    std::vector<std::int32_t> t(n);
    for (auto& x : t) x = dist(gen);
    return t;
}

struct Shape {
    int B, T, C, V, maxT;
};

}  // namespace

TEST_CASE("encoder_forward: float is the correctly rounded wte + wpe", "[encoder]") {
    const Device dev;
    for (const Shape s : {Shape{3, 5, 37, 13, 7}, Shape{2, 1, 5, 3, 1}, Shape{1, 9, 1, 4, 9}}) {
        const auto tokens = random_tokens(static_cast<std::size_t>(s.B) * s.T, s.V, 1);
        const auto wte = random_values<float>(static_cast<std::size_t>(s.V) * s.C, 2);
        const auto wpe = random_values<float>(static_cast<std::size_t>(s.maxT) * s.C, 3);
        std::vector<float> out(static_cast<std::size_t>(s.B) * s.T * s.C, std::numeric_limits<float>::quiet_NaN());
        snug::host::encoder_forward(dev, out.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
        std::size_t bad = 0;
        for (int b = 0; b < s.B; ++b) {
            for (int t = 0; t < s.T; ++t) {
                const int tok = tokens[static_cast<std::size_t>(b) * s.T + t];
                for (int c = 0; c < s.C; ++c) {
                    const double ref = static_cast<double>(wte[static_cast<std::size_t>(tok) * s.C + c]) +
                                       wpe[static_cast<std::size_t>(t) * s.C + c];
                    bad += out[(static_cast<std::size_t>(b) * s.T + t) * s.C + c] != static_cast<float>(ref);
                }
            }
        }
        CHECK(bad == 0);
    }
}

TEMPLATE_TEST_CASE("encoder_forward 16-bit = float kernel on the rounded inputs, rounded once", "[encoder]", half,
                   bfloat16) {
    const Device dev;
    const int B = 2, T = 7, C = 45, V = 11;
    const auto tokens = random_tokens(static_cast<std::size_t>(B) * T, V, 4);
    const auto wte16 = random_values<TestType>(static_cast<std::size_t>(V) * C, 5);
    const auto wpe16 = random_values<TestType>(static_cast<std::size_t>(T) * C, 6);
    std::vector<float> wte(wte16.size()), wpe(wpe16.size());
    for (std::size_t i = 0; i < wte.size(); ++i) wte[i] = static_cast<float>(wte16[i]);
    for (std::size_t i = 0; i < wpe.size(); ++i) wpe[i] = static_cast<float>(wpe16[i]);
    std::vector<float> out(static_cast<std::size_t>(B) * T * C);
    std::vector<TestType> out16(out.size());
    snug::host::encoder_forward(dev, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    snug::host::encoder_forward(dev, out16.data(), tokens.data(), wte16.data(), wpe16.data(), B, T, C);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < out.size(); ++i) bad += out16[i].bits != TestType(out[i]).bits;
    CHECK(bad == 0);
}

TEST_CASE("encoder_backward: central finite differences in double", "[encoder]") {
    const Device dev;
    const int B = 2, T = 3, C = 7, V = 4;  // few token ids: repeats accumulate
    const auto tokens = random_tokens(static_cast<std::size_t>(B) * T, V, 7);
    auto wte = random_values<double>(static_cast<std::size_t>(V) * C, 8);
    auto wpe = random_values<double>(static_cast<std::size_t>(T) * C, 9);
    const auto weights = random_values<double>(static_cast<std::size_t>(B) * T * C, 10);  // L = sum(out * weights)
    std::vector<double> out(weights.size());

    auto loss = [&] {
        snug::host::encoder_forward(dev, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
        double l = 0.0;
        for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * weights[i];
        return l;
    };

    // The gradients accumulate onto what is there.
    const auto dwte0 = random_values<float>(wte.size(), 11);
    const auto dwpe0 = random_values<float>(wpe.size(), 12);
    std::vector<float> dwte = dwte0, dwpe = dwpe0;
    snug::host::encoder_backward(dev, dwte.data(), dwpe.data(), weights.data(), tokens.data(), B, T, C);

    const double h = 1e-4;
    auto check = [&](std::vector<double>& param, const std::vector<float>& grad, const std::vector<float>& grad0) {
        double worst = 0.0;
        for (std::size_t i = 0; i < param.size(); ++i) {
            const double keep = param[i];
            param[i] = keep + h;
            const double lp = loss();
            param[i] = keep - h;
            const double lm = loss();
            param[i] = keep;
            const double fd = (lp - lm) / (2 * h);
            const double analytic = static_cast<double>(grad[i]) - grad0[i];
            worst = std::max(worst, std::fabs(fd - analytic));
        }
        return worst;
    };
    // The gradients are fp32, each contribution rounded once: values up to ~4,
    // at most six roundings of half an ulp (2.4e-7) each.
    CHECK(check(wte, dwte, dwte0) < 2e-6);
    CHECK(check(wpe, dwpe, dwpe0) < 2e-6);
}

TEST_CASE("encoder_backward is deterministic: the (b, t) order of a sequential sum, bit for bit", "[encoder]") {
    const Device dev;
    // Enough rows and channels for the channel-parallel path; few token ids, so
    // that each row of dwte receives hundreds of contributions.
    const int B = 16, T = 257, C = 67, V = 9;
    const auto tokens = random_tokens(static_cast<std::size_t>(B) * T, V, 13);
    const auto dout = random_values<float>(static_cast<std::size_t>(B) * T * C, 14);
    const auto dwte0 = random_values<float>(static_cast<std::size_t>(V) * C, 15);
    const auto dwpe0 = random_values<float>(static_cast<std::size_t>(T) * C, 16);

    std::vector<float> ref_te = dwte0, ref_pe = dwpe0;
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
            const std::size_t row = static_cast<std::size_t>(b) * T + t;
            for (int c = 0; c < C; ++c) {
                ref_te[static_cast<std::size_t>(tokens[row]) * C + c] += dout[row * C + c];
                ref_pe[static_cast<std::size_t>(t) * C + c] += dout[row * C + c];
            }
        }
    }
    for (int run = 0; run < 3; ++run) {
        std::vector<float> dwte = dwte0, dwpe = dwpe0;
        snug::host::encoder_backward(dev, dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
        CHECK(dwte == ref_te);
        CHECK(dwpe == ref_pe);
    }
}

TEMPLATE_TEST_CASE("encoder_backward from 16-bit dout = float kernel on the widened dout", "[encoder]", half,
                   bfloat16) {
    const Device dev;
    const int B = 3, T = 4, C = 33, V = 5;
    const auto tokens = random_tokens(static_cast<std::size_t>(B) * T, V, 17);
    const auto dout16 = random_values<TestType>(static_cast<std::size_t>(B) * T * C, 18);
    std::vector<float> dout(dout16.size());
    for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = static_cast<float>(dout16[i]);
    std::vector<float> a_te(static_cast<std::size_t>(V) * C, 0.5F), a_pe(static_cast<std::size_t>(T) * C, 0.25F);
    auto b_te = a_te, b_pe = a_pe;
    snug::host::encoder_backward(dev, a_te.data(), a_pe.data(), dout.data(), tokens.data(), B, T, C);
    snug::host::encoder_backward(dev, b_te.data(), b_pe.data(), dout16.data(), tokens.data(), B, T, C);
    CHECK(a_te == b_te);
    CHECK(a_pe == b_pe);
}

TEST_CASE("encoder: negative token ids and sizes are refused before any write", "[encoder]") {
    const Device dev;
    const int B = 1, T = 3, C = 2;
    std::vector<std::int32_t> tokens{0, -4, 1};
    std::vector<float> wte(4, 1.0F), wpe(6, 1.0F), out(6, 7.0F), dwte(4, 0.0F), dwpe(6, 0.0F);
    CHECK_THROWS_AS(snug::host::encoder_forward(dev, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C),
                    snug::Error);
    CHECK_THROWS_WITH(snug::host::encoder_forward(dev, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C),
                      Catch::Contains("-4") && Catch::Contains("t = 1"));
    CHECK(out == std::vector<float>(6, 7.0F));
    CHECK_THROWS_AS(snug::host::encoder_backward(dev, dwte.data(), dwpe.data(), out.data(), tokens.data(), B, T, C),
                    snug::Error);
    CHECK(dwte == std::vector<float>(4, 0.0F));
    CHECK_THROWS_AS(snug::host::encoder_forward(dev, out.data(), tokens.data(), wte.data(), wpe.data(), B, -1, C),
                    snug::ShapeError);
    CHECK_THROWS_WITH(
        snug::host::encoder_backward(dev, dwte.data(), dwpe.data(), out.data(), tokens.data(), B, T, -2),
        Catch::Contains("C = -2"));
}

TEMPLATE_TEST_CASE("encoder without positions (wpe nullptr): wte's rows, and wte's gradient unchanged", "[encoder]",
                   float, half, bfloat16) {
    const Device dev;
    const int B = 3, T = 5, C = 7, V = 4, maxT = 6;
    const auto tokens = random_tokens(static_cast<std::size_t>(B) * T, V, 41);
    const auto wte = random_values<TestType>(static_cast<std::size_t>(V) * C, 42);
    const auto wpe = random_values<TestType>(static_cast<std::size_t>(maxT) * C, 43);
    std::vector<TestType> out(static_cast<std::size_t>(B) * T * C, TestType(99.0f));
    snug::host::encoder_forward(dev, out.data(), tokens.data(), wte.data(), static_cast<const TestType*>(nullptr), B,
                                T, C);
    std::size_t differ = 0;
    for (std::size_t r = 0; r < tokens.size(); ++r)
        for (int c = 0; c < C; ++c)
            differ += snug::test::bits_of(out[r * C + static_cast<std::size_t>(c)]) !=
                      snug::test::bits_of(wte[static_cast<std::size_t>(tokens[r]) * C + static_cast<std::size_t>(c)]);
    CHECK(differ == 0);

    const auto dout = random_values<TestType>(out.size(), 44);
    const auto dwte0 = random_values<float>(wte.size(), 45);
    std::vector<float> with = dwte0, without = dwte0, dwpe(wpe.size(), 0.0f);
    snug::host::encoder_backward(dev, with.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    snug::host::encoder_backward(dev, without.data(), static_cast<float*>(nullptr), dout.data(), tokens.data(), B, T,
                                 C);
    CHECK(with == without);
    CHECK(with != dwte0);
}
