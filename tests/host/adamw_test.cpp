// The host AdamW step against AdamW as torch.optim.AdamW documents it,
// written here in double: several steps (bias correction at steps 1..5),
// decoupled weight decay, the gradient scale, and the rounded working copy.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/host/adamw.hpp"
#include "support/awkward_groups.hpp"
#include "support/host_support.hpp"

namespace {

using snug::host::Device;
using snug::test::random_grad;

struct Hyper {
    float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};

// The documented algorithm, in double, from the same fp32 inputs:
//   g = grad * scale; theta -= lr * wd * theta; m = b1 m + (1 - b1) g;
//   v = b2 v + (1 - b2) g^2; mhat = m / (1 - b1^t); vhat = v / (1 - b2^t);
//   theta -= lr * mhat / (sqrt(vhat) + eps).
struct Reference {
    std::vector<double> p, m, v;
    std::vector<double> m_abs;  // m's recursion on |g|: the size of the terms m sums
    void step(const std::vector<float>& grad, const Hyper& h, int t, double scale) {
        const double b1 = h.beta1, b2 = h.beta2, lr = h.lr;
        for (std::size_t i = 0; i < p.size(); ++i) {
            const double g = double(grad[i]) * scale;
            p[i] -= lr * double(h.weight_decay) * p[i];
            m[i] = b1 * m[i] + (1 - b1) * g;
            m_abs[i] = b1 * m_abs[i] + (1 - b1) * std::abs(g);
            v[i] = b2 * v[i] + (1 - b2) * g * g;
            const double mhat = m[i] / (1 - std::pow(b1, t));
            const double vhat = v[i] / (1 - std::pow(b2, t));
            p[i] -= lr * mhat / (std::sqrt(vhat) + double(h.eps));
        }
    }
};

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo, float hi) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    return v;
}

// max |got - want| / max(|want|, floor).
double max_rel_error(const std::vector<float>& got, const std::vector<double>& want, double floor) {
    double err = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::abs(double(got[i]) - want[i]) / std::max(std::abs(want[i]), floor));
    }
    return err;
}

// max |got - want| / size: for a sum whose terms may cancel, fp32 keeps an
// accuracy relative to the size of the terms, not to the (small) result.
double max_error_relative_to(const std::vector<float>& got, const std::vector<double>& want,
                             const std::vector<double>& size) {
    double err = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(double(got[i]) - want[i]) / size[i]);
    return err;
}

// Runs `steps` steps of the kernel (fp32 master only) and of the reference on
// the same gradients; checks parameters and both moments after each step.
void check_against_reference(std::size_t n, int steps, const Hyper& h, float grad_scale, std::uint32_t seed) {
    std::vector<float> master = random_floats(n, seed, -1.0f, 1.0f);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    Reference ref{std::vector<double>(master.begin(), master.end()), std::vector<double>(n, 0.0),
                  std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
    for (int t = 1; t <= steps; ++t) {
        INFO("n = " << n << ", step " << t << ", grad_scale = " << grad_scale);
        const std::vector<float> grad = random_grad(n, seed + 1000 + std::uint32_t(t));
        snug::host::adamw_update(Device{}, master.data(), nullptr, grad.data(), m.data(), v.data(),
                                 std::int64_t(n), h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, t, grad_scale);
        ref.step(grad, h, t, grad_scale);
        // Each step moves a parameter by about lr = 1e-2; fp32 keeps it to a few 1e-7.
        CHECK(max_rel_error(master, ref.p, 1e-2) < 2e-6);
        CHECK(max_error_relative_to(m, ref.m, ref.m_abs) < 1e-6);
        CHECK(max_rel_error(v, ref.v, 1e-30) < 1e-6);
    }
}

}  // namespace

TEST_CASE("adamw_update follows PyTorch's AdamW over five steps", "[adamw]") {
    check_against_reference(1003, 5, Hyper{}, 1.0f, 1);
    check_against_reference(1003, 5, Hyper{}, 0.25f, 2);                                 // unscale x clip
    check_against_reference(37, 5, Hyper{2e-3f, 0.8f, 0.999f, 1e-6f, 0.0f}, 3.0f, 3);     // no decay
    check_against_reference(300'007, 3, Hyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.5f}, 0.5f, 4);  // parallel ranges
}

TEST_CASE("adamw_update: the first step moves every parameter by about lr against its gradient", "[adamw]") {
    // With mhat = g and vhat = g^2 at step 1, the Adam term is lr * sign(g)
    // (for |g| >> eps): a check of the bias correction that needs no reference.
    const std::size_t n = 333;
    std::vector<float> master(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
    const std::vector<float> grad = random_grad(n, 9);
    snug::host::adamw_update(Device{}, master.data(), nullptr, grad.data(), m.data(), v.data(), std::int64_t(n),
                             1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 1.0f);
    for (std::size_t i = 0; i < n; ++i) {
        const double expected = 0.5 - 1e-3 * (grad[i] > 0 ? 1.0 : -1.0);
        CHECK(std::abs(master[i] - expected) < 1e-6);
    }
}

TEMPLATE_TEST_CASE("adamw_update rounds the working copy from the new master", "[adamw]", snug::half,
                   snug::bfloat16, float, double) {
    using T = TestType;
    const std::size_t n = 1021;
    const std::vector<float> start = random_floats(n, 11, -2.0f, 2.0f);
    std::vector<float> master = start, m(n, 0.0f), v(n, 0.0f);
    std::vector<float> master_alone = start, m_alone(n, 0.0f), v_alone(n, 0.0f);
    std::vector<T> working(n, T(0.0f));
    for (int t = 1; t <= 3; ++t) {
        const std::vector<float> grad = random_grad(n, 20 + std::uint32_t(t));
        snug::host::adamw_update(Device{}, master.data(), working.data(), grad.data(), m.data(), v.data(),
                                 std::int64_t(n), 3e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
        snug::host::adamw_update(Device{}, master_alone.data(), nullptr, grad.data(), m_alone.data(),
                                 v_alone.data(), std::int64_t(n), 3e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
    }
    std::size_t wrong = 0, master_differs = 0;
    for (std::size_t i = 0; i < n; ++i) {
        if constexpr (std::same_as<T, snug::half>) {
            wrong += working[i].bits != snug::float_to_half_bits(master[i]);
        } else if constexpr (std::same_as<T, snug::bfloat16>) {
            wrong += working[i].bits != snug::float_to_bfloat16_bits(master[i]);
        } else {
            wrong += working[i] != T(master[i]);
        }
        master_differs += master[i] != master_alone[i] || m[i] != m_alone[i] || v[i] != v_alone[i];
    }
    CHECK(wrong == 0);
    CHECK(master_differs == 0);  // the working copy changes nothing else
}

TEST_CASE("adamw_update rejects a negative size and a step before 1", "[adamw]") {
    float x = 1.0f, m = 0.0f, v = 0.0f;
    const float g = 1.0f;
    CHECK_THROWS_AS(snug::host::adamw_update(Device{}, &x, nullptr, &g, &m, &v, -1, 1e-3f, 0.9f, 0.999f, 1e-8f,
                                             0.0f, 1, 1.0f),
                    snug::ShapeError);
    CHECK_THROWS_AS(snug::host::adamw_update(Device{}, &x, nullptr, &g, &m, &v, 1, 1e-3f, 0.9f, 0.999f, 1e-8f,
                                             0.0f, 0, 1.0f),
                    snug::ConfigError);
    CHECK(x == 1.0f);
    CHECK(m == 0.0f);
}
