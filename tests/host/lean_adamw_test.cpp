// The host AdamW step with lean state — bf16 moments, bf16 weights without a
// master copy, both — against a float64 reference of the same algorithm,
// written here: the update in double from the stored state, then stochastic
// rounding to bfloat16 computed from the value's position between its two
// neighbours (not from float bits) with the same Philox dice. The kernel
// computes in fp32, so a die that lands within a few fp32 ulps of the
// boundary may fall the other way: every element must equal the reference or
// sit one bfloat16 step from it, and such steps must be rare (the fp32 error
// is ~2^-16 of a bfloat16 step: about 1e-4 of the elements; allowed 1e-3).
// Also: rounding is unbiased in the update itself (updates far below half a
// bfloat16 step still move the weights on average), and the stream depends
// on the seed, the step and the model-wide index only (not on how the calls
// split the parameters).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "snug/core/half.hpp"
#include "snug/core/rng.hpp"
#include "snug/host/adamw.hpp"
#include "snug/ops/adamw.hpp"
#include "support/awkward_groups.hpp"
#include "support/host_support.hpp"

namespace {

using snug::bfloat16;
using snug::host::Device;
using snug::test::AdamWHyper;
using snug::test::random_grad;
using snug::test::to_double;
using snug::test::reference_round_bf16;


template <class T>
std::vector<T> random_state(std::size_t n, std::uint32_t seed, float lo, float hi) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<T> v(n);
    for (T& x : v) x = T(dist(gen));
    return v;
}

// How one stored array compares with the reference: elements off by exactly
// one bfloat16 step, and any further off (must be none).
struct Agreement {
    std::size_t one_step = 0, worse = 0;
};

// One update of P weights and M moments (master = P: fp32 master or bf16
// weights; no working copy) from random state, against the reference.
template <class P, class M>
void check_one_update(std::size_t n, const AdamWHyper& h, std::uint64_t seed, std::int64_t first_index,
                      std::uint32_t data_seed) {
    INFO("n = " << n << ", step " << h.step << ", first index " << first_index);
    std::vector<P> p = random_state<P>(n, data_seed, -1.0f, 1.0f);
    std::vector<M> m = random_state<M>(n, data_seed + 1, -0.05f, 0.05f);
    std::vector<M> v = random_state<M>(n, data_seed + 2, 1e-6f, 1e-2f);
    const std::vector<float> grad = random_grad(n, data_seed + 3);
    const std::vector<P> p0 = p;
    const std::vector<M> m0 = m, v0 = v;
    snug::host::adamw_update(Device{}, p.data(), nullptr, grad.data(), m.data(), v.data(), std::int64_t(n), h.lr,
                             h.beta1, h.beta2, h.eps, h.weight_decay, h.step, h.grad_scale,
                             snug::ops::AdamWRounding{seed, first_index});

    const double b1 = h.beta1, b2 = h.beta2;
    Agreement agree_m, agree_v, agree_p;
    double fp32_error = 0.0;  // fp32 state: relative error against the unrounded reference
    auto compare = [](Agreement& a, double got, double want) {
        if (got == want) return;
        int e = 0;
        std::frexp(std::max(std::abs(got), std::abs(want)), &e);
        const double step = std::ldexp(1.0, e - 8);
        // One step apart, allowing for a step across a power of two.
        if (std::abs(got - want) <= step) ++a.one_step;
        else ++a.worse;
    };
    for (std::size_t i = 0; i < n; ++i) {
        const double g = double(grad[i]) * double(h.grad_scale);
        const double m_new = b1 * to_double(m0[i]) + (1 - b1) * g;
        const double v_new = b2 * to_double(v0[i]) + (1 - b2) * g * g;
        const double decayed = to_double(p0[i]) - double(h.lr) * double(h.weight_decay) * to_double(p0[i]);
        const double adam = double(h.lr) * (m_new / (1 - std::pow(b1, h.step))) /
                            (std::sqrt(v_new / (1 - std::pow(b2, h.step))) + double(h.eps));
        const double p_new = decayed - adam;
        const snug::Philox4 dice =
            snug::random_block(seed, std::uint64_t(h.step), std::uint64_t(first_index + std::int64_t(i)));
        if constexpr (std::is_same_v<M, bfloat16>) {
            compare(agree_m, to_double(m[i]), reference_round_bf16(m_new, dice.v[0]));
            compare(agree_v, to_double(v[i]), reference_round_bf16(v_new, dice.v[1]));
        } else {
            // m sums terms that may cancel: fp32 keeps it relative to their size.
            const double terms = b1 * std::abs(to_double(m0[i])) + (1 - b1) * std::abs(g);
            fp32_error = std::max(fp32_error, std::abs(to_double(m[i]) - m_new) / terms);
            fp32_error = std::max(fp32_error, std::abs(to_double(v[i]) - v_new) / v_new);
        }
        if constexpr (std::is_same_v<P, bfloat16>)
            compare(agree_p, to_double(p[i]), reference_round_bf16(p_new, dice.v[2]));
        else
            // p is a difference of two terms: fp32 keeps it relative to their size.
            fp32_error = std::max(fp32_error, std::abs(to_double(p[i]) - p_new) / (std::abs(decayed) + std::abs(adam)));
    }
    const std::size_t allowed = n / 1000 + 1;
    CHECK(agree_m.worse == 0);
    CHECK(agree_v.worse == 0);
    CHECK(agree_p.worse == 0);
    CHECK(agree_m.one_step <= allowed);
    CHECK(agree_v.one_step <= allowed);
    CHECK(agree_p.one_step <= allowed);
    CHECK(fp32_error < 1e-6);  // a few fp32 roundings of the terms' size (2^-24 = 6e-8 each)
}

}  // namespace

TEST_CASE("adamw_update with bf16 moments follows a float64 reference of stochastic rounding", "[adamw][lean]") {
    check_one_update<float, bfloat16>(100'003, AdamWHyper{}, 1, 0, 1);
    check_one_update<float, bfloat16>(1'003, AdamWHyper{3e-4f, 0.8f, 0.999f, 1e-6f, 0.0f, 1, 1.0f}, 99, 12345, 2);
}

TEST_CASE("adamw_update of bf16 weights without a master follows a float64 reference", "[adamw][lean]") {
    check_one_update<bfloat16, bfloat16>(100'003, AdamWHyper{}, 5, 0, 3);
    check_one_update<bfloat16, float>(100'003, AdamWHyper{}, 5, 7, 4);
    check_one_update<bfloat16, bfloat16>(300'007, AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1000, 0.25f}, 6, 1 << 20,
                                         5);  // parallel ranges
}

TEST_CASE("bf16 weights move by updates far below half a bfloat16 step, on average", "[adamw][lean]") {
    // 100,000 weights at 1.0 (bfloat16's step below 1.0 is 2^-8) take one
    // update of lr = 1e-4 with no decay: step 1's Adam term is lr sign(g), so
    // round-to-nearest would leave every weight at 1.0. Stochastic rounding
    // moves each to 1 - 2^-8 with probability 1e-4 / 2^-8 = 0.0256: the mean
    // is 1 - 1e-4, within 5 standard deviations (2^-8 sqrt(p (1 - p) / n)).
    const std::size_t n = 100'000;
    std::vector<bfloat16> p(n, bfloat16(1.0f));
    std::vector<bfloat16> m(n, bfloat16(0.0f)), v(n, bfloat16(0.0f));
    const std::vector<float> grad(n, 0.5f);
    snug::host::adamw_update(Device{}, p.data(), nullptr, grad.data(), m.data(), v.data(), std::int64_t(n), 1e-4f,
                             0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f, snug::ops::AdamWRounding{42, 0});
    double sum = 0.0;
    std::size_t moved = 0;
    for (const bfloat16 x : p) {
        sum += to_double(x);
        moved += x.bits != bfloat16(1.0f).bits;
    }
    const double share = 1e-4 / std::ldexp(1.0, -8);
    const double sigma = std::ldexp(1.0, -8) * std::sqrt(share * (1 - share) / double(n));
    CHECK(moved > 0);
    CHECK(std::abs(sum / double(n) - (1.0 - 1e-4)) < 5 * sigma);
}

TEST_CASE("the rounding stream depends on the seed and the model-wide index, not on how calls split", "[adamw][lean]") {
    const std::size_t n = 4096;
    const std::vector<float> grad = random_grad(n, 8);
    auto run = [&](std::uint64_t seed, int step, std::int64_t first, std::size_t begin, std::size_t count) {
        std::vector<bfloat16> p = random_state<bfloat16>(n, 9, -1.0f, 1.0f);
        std::vector<bfloat16> m = random_state<bfloat16>(n, 10, -0.05f, 0.05f);
        std::vector<bfloat16> v = random_state<bfloat16>(n, 11, 1e-6f, 1e-2f);
        snug::host::adamw_update(Device{}, p.data() + begin, nullptr, grad.data() + begin, m.data() + begin,
                                 v.data() + begin, std::int64_t(count), 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 1.0f,
                                 snug::ops::AdamWRounding{seed, first});
        std::vector<std::uint16_t> bits;
        for (std::size_t i = 0; i < n; ++i) {
            bits.push_back(p[i].bits);
            bits.push_back(m[i].bits);
            bits.push_back(v[i].bits);
        }
        return bits;
    };
    const auto whole = run(3, 2, 0, 0, n);
    CHECK(run(3, 2, 0, 0, n) == whole);  // reproducible
    // Two calls over halves (as parameter groups are) with their model-wide
    // first index give the whole call's bits.
    std::vector<bfloat16> p = random_state<bfloat16>(n, 9, -1.0f, 1.0f);
    std::vector<bfloat16> m = random_state<bfloat16>(n, 10, -0.05f, 0.05f);
    std::vector<bfloat16> v = random_state<bfloat16>(n, 11, 1e-6f, 1e-2f);
    for (std::size_t begin : {std::size_t{0}, n / 2})
        snug::host::adamw_update(Device{}, p.data() + begin, nullptr, grad.data() + begin, m.data() + begin,
                                 v.data() + begin, std::int64_t(n / 2), 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 2, 1.0f,
                                 snug::ops::AdamWRounding{3, std::int64_t(begin)});
    std::vector<std::uint16_t> halves;
    for (std::size_t i = 0; i < n; ++i) {
        halves.push_back(p[i].bits);
        halves.push_back(m[i].bits);
        halves.push_back(v[i].bits);
    }
    CHECK(halves == whole);
    CHECK(run(4, 2, 0, 0, n) != whole);  // another seed
    CHECK(run(3, 2, 1, 0, n) != whole);  // another index
}
