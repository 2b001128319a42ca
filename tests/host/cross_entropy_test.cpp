// Host fused softmax + cross-entropy: losses against an independent
// log-sum-exp in long double; dlogits against the analytic gradient in long
// double and against central finite differences of sum_i dloss * loss_i (the
// kernel instantiated with double); padded columns; evaluation (dloss == 0)
// leaves the logits alone; logits of +-1e4; 16-bit logits against the float
// kernel rounded once and a known-answer round-to-nearest-even test; targets
// out of range and bad sizes.
#include "snug/host/cross_entropy.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "support/host_support.hpp"

namespace {

using snug::half;
using Dev = snug::host::Device;
using snug::test::bits_of;
using snug::test::from_d;

constexpr double u32 = 0x1p-24;
constexpr double u64 = 0x1p-53;

long double to_ld(float x) { return x; }
long double to_ld(double x) { return x; }
long double to_ld(half x) { return static_cast<float>(x); }
long double to_ld(snug::bfloat16 x) { return static_cast<float>(x); }

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

// An (N, Vp) logits matrix: the first V columns uniform in [-lo, lo] (rounded
// to T), the padding NaN, so that a read or a missed write shows.
template <class T>
std::vector<T> random_logits(std::int64_t N, int V, int Vp, double lo, std::mt19937& rng) {
    std::uniform_real_distribution<double> dist(-lo, lo);
    std::vector<T> x(at(N * Vp), from_d<T>(std::numeric_limits<double>::quiet_NaN()));
    for (std::int64_t i = 0; i < N; ++i) {
        for (int j = 0; j < V; ++j) x[at(i * Vp + j)] = from_d<T>(dist(rng));
    }
    return x;
}

std::vector<std::int32_t> random_targets(std::int64_t N, int V, std::mt19937& rng) {
    std::uniform_int_distribution<std::int32_t> dist(0, V - 1);
    std::vector<std::int32_t> t(at(N));
    for (auto& v : t) v = dist(rng);
    return t;
}

// The reference for one row, in long double, written independently of the
// kernel: log-sum-exp around the largest logit; probabilities.
struct RowRef {
    long double loss;
    std::vector<long double> p;  // softmax (V)
};

template <class T>
RowRef row_ref(const T* x, int V, std::int32_t target) {
    long double m = to_ld(x[0]);
    for (int j = 1; j < V; ++j) m = std::max(m, to_ld(x[j]));
    long double s = 0;
    for (int j = 0; j < V; ++j) s += std::exp(to_ld(x[j]) - m);
    RowRef r{m + std::log(s) - to_ld(x[target]), std::vector<long double>(at(V))};
    for (int j = 0; j < V; ++j) r.p[at(j)] = std::exp(to_ld(x[j]) - m) / s;
    return r;
}

// Checks losses and dlogits (computed from `logits_in` with `dloss`) against
// the long-double reference. unit: the compute type's roundoff. Per row the
// loss is (max - x_t) + log(sum of V exponentials): each exponential carries
// an argument rounding (relative u |x - max|) and about one ulp of its own,
// the sum V - 1 roundings, the log and the final additions a few more; so
// |loss error| <= (V + 4 + max|x - max| p) u (1 + |loss|) is generous and
// still fails on any real mistake. The gradient entries are p * dloss / ...
// with the same relative error, plus 2u |dloss| for the subtraction of 1 and
// the product.
template <class T>
void check_against_reference(const std::vector<T>& logits_in, const std::vector<T>& dlogits,
                             const std::vector<float>& losses, const std::vector<std::int32_t>& targets,
                             std::int64_t N, int V, int Vp, float dloss, double unit) {
    std::int64_t bad = 0;
    std::string first;
    auto fail = [&](const std::string& what) {
        if (bad++ == 0) first = what;
    };
    for (std::int64_t i = 0; i < N; ++i) {
        const T* x = logits_in.data() + i * Vp;
        const std::int32_t t = targets[at(i)];
        const RowRef r = row_ref(x, V, t);
        long double m = to_ld(x[0]);
        for (int j = 1; j < V; ++j) m = std::max(m, to_ld(x[j]));
        const double rel = (V + 8.0) * unit;
        const double loss_tol = rel * (1.0 + std::fabs(double(r.loss))) + u32 * std::fabs(double(r.loss));
        if (!(std::fabs(losses[at(i)] - double(r.loss)) <= loss_tol)) {
            fail(fmt::format("loss[{}] = {} but want {}", i, losses[at(i)], double(r.loss)));
        }
        if (dloss == 0.0f) continue;
        for (int j = 0; j < Vp; ++j) {
            const double got = double(to_ld(dlogits[at(i * Vp + j)]));
            if (j >= V) {
                if (bits_of(dlogits[at(i * Vp + j)]) != 0) fail(fmt::format("padding dlogits[{}, {}] = {}", i, j, got));
                continue;
            }
            const long double onehot = j == t ? 1.0L : 0.0L;
            const double want = double((r.p[at(j)] - onehot) * dloss);
            const double arg = double(std::fabs(to_ld(x[j]) - m));
            const double tol = (rel + arg * unit) * double(r.p[at(j)]) * std::fabs(dloss) +
                               2 * unit * std::fabs(dloss) * double(onehot) + 1e-300;
            if (!(std::fabs(got - want) <= tol)) {
                fail(fmt::format("dlogits[{}, {}] = {} but want {} (tolerance {:.3g})", i, j, got, want, tol));
            }
        }
    }
    INFO(first);
    CHECK(bad == 0);
}

struct Shape {
    std::int64_t N;
    int V, Vp;
};

// V not a multiple of 8, Vp > V, one class, one row, and enough rows to be
// split over threads.
const std::vector<Shape> shapes{{9, 37, 40}, {1, 1, 1}, {4, 2, 8}, {1, 50, 50}, {300, 257, 264}};

}  // namespace

TEMPLATE_TEST_CASE("softmax_cross_entropy matches a long-double reference", "[cross_entropy]", float, double) {
    using T = TestType;
    const double unit = std::is_same_v<T, double> ? u64 : u32;
    std::mt19937 rng(21);
    for (const Shape s : shapes) {
        for (const float dloss : {1.0f / float(s.N), -2.5f, 1.0f}) {
            INFO(fmt::format("N = {}, V = {}, Vp = {}, dloss = {}", s.N, s.V, s.Vp, dloss));
            const auto logits = random_logits<T>(s.N, s.V, s.Vp, 4.0, rng);
            const auto targets = random_targets(s.N, s.V, rng);
            auto dlogits = logits;
            std::vector<float> losses(at(s.N), std::numeric_limits<float>::quiet_NaN());
            snug::host::softmax_cross_entropy(Dev{}, losses.data(), dlogits.data(), targets.data(), s.N, s.V, s.Vp,
                                              dloss);
            check_against_reference(logits, dlogits, losses, targets, s.N, s.V, s.Vp, dloss, unit);
        }
    }
}

TEMPLATE_TEST_CASE("softmax_cross_entropy with dloss == 0 only evaluates", "[cross_entropy]", float, double, half,
                   snug::bfloat16) {
    using T = TestType;
    std::mt19937 rng(22);
    const std::int64_t N = 6;
    const int V = 37, Vp = 48;
    const auto logits = random_logits<T>(N, V, Vp, 4.0, rng);
    const auto targets = random_targets(N, V, rng);
    auto work = logits;
    std::vector<float> losses(at(N), std::numeric_limits<float>::quiet_NaN());
    snug::host::softmax_cross_entropy(Dev{}, losses.data(), work.data(), targets.data(), N, V, Vp, 0.0f);
    bool untouched = true;
    for (std::size_t i = 0; i < work.size(); ++i) untouched = untouched && bits_of(work[i]) == bits_of(logits[i]);
    CHECK(untouched);
    for (std::int64_t i = 0; i < N; ++i) {
        const double want = double(row_ref(logits.data() + i * Vp, V, targets[at(i)]).loss);
        CHECK(std::fabs(losses[at(i)] - want) <= (V + 8.0) * u32 * (1.0 + std::fabs(want)));
    }
}

// Central differences of L = sum_i dloss * losses[i] in the logits, the kernel
// run in double. Only row i's loss depends on logit (i, j). The losses come
// back as float (one rounding: |error| <= u |loss|), so the quotient carries
// |dloss| u |loss| / h from rounding; the truncation error is h^2 / 6 times a
// third derivative of log-sum-exp along one coordinate, p (1 - p) (1 - 2p),
// which is at most 1 / (6 sqrt 3) < 0.1. h = 0.03 roughly balances the two.
TEST_CASE("softmax_cross_entropy (double) agrees with finite differences", "[cross_entropy]") {
    std::mt19937 rng(23);
    for (const Shape s : {Shape{3, 37, 40}, Shape{2, 2, 2}, Shape{1, 11, 16}}) {
        for (const float dloss : {1.0f / 3.0f, -2.0f}) {
            INFO(fmt::format("N = {}, V = {}, Vp = {}, dloss = {}", s.N, s.V, s.Vp, dloss));
            auto logits = random_logits<double>(s.N, s.V, s.Vp, 3.0, rng);
            const auto targets = random_targets(s.N, s.V, rng);
            auto dlogits = logits;
            std::vector<float> losses(at(s.N));
            snug::host::softmax_cross_entropy(Dev{}, losses.data(), dlogits.data(), targets.data(), s.N, s.V, s.Vp,
                                              dloss);
            const double h = 0.03;
            auto loss_i = [&](std::int64_t i) {
                std::vector<float> l(at(s.N));
                snug::host::softmax_cross_entropy(Dev{}, l.data(), logits.data(), targets.data(), s.N, s.V, s.Vp, 0.0f);
                return double(dloss) * l[at(i)];
            };
            for (std::int64_t i = 0; i < s.N; ++i) {
                for (int j = 0; j < s.V; ++j) {
                    double& x = logits[at(i * s.Vp + j)];
                    const double x0 = x;
                    x = x0 + h;
                    const double lp = loss_i(i);
                    x = x0 - h;
                    const double lm = loss_i(i);
                    x = x0;
                    const double fd = (lp - lm) / (2 * h);
                    const double tol =
                        std::fabs(dloss) * (u32 * (std::fabs(losses[at(i)]) + 2 * h) / h + h * h / 6 * 0.1);
                    const double got = dlogits[at(i * s.Vp + j)];
                    INFO(fmt::format("dlogits[{}, {}] = {}, finite difference {}, tolerance {:.3g}", i, j, got, fd,
                                     tol));
                    CHECK(std::fabs(fd - got) <= tol);
                }
            }
        }
    }
}

TEMPLATE_TEST_CASE("softmax_cross_entropy stays finite for logits of +-1e4", "[cross_entropy]", float, double, half,
                   snug::bfloat16) {
    using T = TestType;
    const int V = 37, Vp = 40;  // more columns than the kernel's 16 lanes
    // Integer logits (exact in every T after rounding, and so are their
    // differences in fp32). Rows: the target far below the top logit, which
    // sits in the first block of lanes; the target on top among hugely negative logits;
    // all equal and huge; alternating +-1e4; random integers in [-1e4, 1e4].
    std::vector<std::vector<double>> rows(5, std::vector<double>(at(V)));
    std::mt19937 rng(26);
    std::uniform_int_distribution<int> small(-8, 8), big(-10000, 10000);
    for (int j = 0; j < V; ++j) {
        rows[0][at(j)] = small(rng);
        rows[1][at(j)] = -1e4;
        rows[2][at(j)] = 1e4;
        rows[3][at(j)] = j % 2 == 0 ? 1e4 : -1e4;
        rows[4][at(j)] = big(rng);
    }
    rows[0][2] = 1e4;
    rows[0][3] = -1e4;
    rows[0][9] = 1e4 - 2;
    rows[1][18] = -1e4 + 8;
    const std::vector<std::int32_t> targets{3, 18, 5, 1, 35};
    const auto N = static_cast<std::int64_t>(rows.size());
    std::vector<T> logits(at(N * Vp), from_d<T>(std::numeric_limits<double>::quiet_NaN()));
    for (std::int64_t i = 0; i < N; ++i) {
        for (int j = 0; j < V; ++j) logits[at(i * Vp + j)] = from_d<T>(rows[at(i)][at(j)]);
    }
    auto dlogits = logits;
    std::vector<float> losses(at(N));
    snug::host::softmax_cross_entropy(Dev{}, losses.data(), dlogits.data(), targets.data(), N, V, Vp, 0.5f);
    for (std::int64_t i = 0; i < N; ++i) {
        const RowRef r = row_ref(logits.data() + i * Vp, V, targets[at(i)]);
        INFO(fmt::format("row {}: loss {} want {}", i, losses[at(i)], double(r.loss)));
        CHECK(std::isfinite(losses[at(i)]));
        // The differences x - max that matter are exact here, so only the sum,
        // the log and the final additions round.
        CHECK(std::fabs(losses[at(i)] - double(r.loss)) <= 32 * u32 * (1.0 + std::fabs(double(r.loss))));
        for (int j = 0; j < Vp; ++j) {
            const double g = double(to_ld(dlogits[at(i * Vp + j)]));
            CHECK(std::isfinite(g));
            if (j < V) {
                const double want = double((r.p[at(j)] - (j == targets[at(i)] ? 1.0L : 0.0L)) * 0.5L);
                const double p_plus_onehot = double(r.p[at(j)]) + (j == targets[at(i)] ? 1.0 : 0.0);
                // 16-bit stores add half an ulp (relative 2^-11 for half, 2^-8 for bfloat16).
                const double store = std::is_same_v<T, half>             ? 0x1p-11
                                     : std::is_same_v<T, snug::bfloat16> ? 0x1p-8
                                                                         : 0.0;
                CHECK(std::fabs(g - want) <= 64 * u32 * 0.5 * p_plus_onehot + store * std::fabs(want) + 1e-30);
            }
        }
    }
    // Row 0's target sits 2e4 below the top: the loss is about 2e4, not inf.
    // (Half rounds 9998 to 10000: a tie at the top.)
    CHECK(losses[0] > 1.9e4f);
}

TEMPLATE_TEST_CASE("softmax_cross_entropy (16-bit) is the float kernel rounded once", "[cross_entropy]", half,
                   snug::bfloat16) {
    using T = TestType;
    std::mt19937 rng(24);
    for (const Shape s : shapes) {
        INFO(fmt::format("N = {}, V = {}, Vp = {}", s.N, s.V, s.Vp));
        const auto logits = random_logits<T>(s.N, s.V, s.Vp, 6.0, rng);
        const auto targets = random_targets(s.N, s.V, rng);
        std::vector<float> logits_f(logits.size());
        for (std::size_t i = 0; i < logits.size(); ++i) logits_f[i] = float(to_ld(logits[i]));
        auto work = logits;
        std::vector<float> losses(at(s.N)), losses_f(at(s.N));
        snug::host::softmax_cross_entropy(Dev{}, losses.data(), work.data(), targets.data(), s.N, s.V, s.Vp, 0.125f);
        snug::host::softmax_cross_entropy(Dev{}, losses_f.data(), logits_f.data(), targets.data(), s.N, s.V, s.Vp,
                                          0.125f);
        CHECK(losses == losses_f);
        std::int64_t bad = 0;
        for (std::size_t i = 0; i < work.size(); ++i) bad += bits_of(work[i]) != bits_of(T(logits_f[i]));
        CHECK(bad == 0);
    }
}

// Two equal logits give p = 1/2 exactly, so dlogits = +-dloss / 2. With
// u = one ulp at 1: dloss = 1 + 1.5u puts dloss / 2 halfway between an odd and
// the next even 16-bit value (ties go up to the even one), dloss = 1 + 0.5u
// halfway between the even 1/2 and the odd next one (down), and 1 + 0.75u
// just above halfway (up).
TEMPLATE_TEST_CASE("softmax_cross_entropy (16-bit) rounds to nearest even", "[cross_entropy]", half,
                   snug::bfloat16) {
    using T = TestType;
    const double u = std::is_same_v<T, half> ? 0x1p-10 : 0x1p-7;
    struct Case {
        double dloss, want;
    };
    for (const Case c :
         {Case{1 + 1.5 * u, 0.5 * (1 + 2 * u)}, Case{1 + 0.5 * u, 0.5}, Case{1 + 0.75 * u, 0.5 * (1 + u)}}) {
        INFO(fmt::format("dloss = {}", c.dloss));
        std::vector<T> x{from_d<T>(0.25), from_d<T>(0.25)};
        const std::vector<std::int32_t> target{1};
        float loss = 0.0f;
        snug::host::softmax_cross_entropy(Dev{}, &loss, x.data(), target.data(), 1, 2, 2, float(c.dloss));
        CHECK(double(to_ld(x[0])) == c.want);
        CHECK(double(to_ld(x[1])) == -c.want);
        CHECK(loss == float(std::log(2.0)));
    }
}

TEST_CASE("softmax_cross_entropy propagates NaN logits into the loss", "[cross_entropy]") {
    std::vector<float> x{0.5f, std::numeric_limits<float>::quiet_NaN(), 1.0f, -1.0f, 2.0f, 0.0f};
    const std::vector<std::int32_t> targets{0, 2};
    std::vector<float> losses(2, 0.0f);
    snug::host::softmax_cross_entropy(Dev{}, losses.data(), x.data(), targets.data(), 2, 3, 3, 1.0f);
    CHECK(std::isnan(losses[0]));
    CHECK(std::isfinite(losses[1]));
}

TEST_CASE("softmax_cross_entropy rejects bad targets and sizes, writing nothing", "[cross_entropy]") {
    using Catch::Matchers::Contains;
    std::mt19937 rng(25);
    const std::int64_t N = 5;
    const int V = 37, Vp = 40;
    const auto logits = random_logits<float>(N, V, Vp, 4.0, rng);
    auto targets = random_targets(N, V, rng);
    auto work = logits;
    std::vector<float> losses(at(N), -7.0f);
    auto unchanged = [&] {
        bool same = true;
        for (std::size_t i = 0; i < work.size(); ++i) same = same && bits_of(work[i]) == bits_of(logits[i]);
        return same && std::all_of(losses.begin(), losses.end(), [](float v) { return v == -7.0f; });
    };
    auto run = [&](std::int64_t n, int v, int vp) {
        snug::host::softmax_cross_entropy(Dev{}, losses.data(), work.data(), targets.data(), n, v, vp, 1.0f);
    };
    targets[3] = V;  // inside the padding, still not a class
    CHECK_THROWS_WITH(run(N, V, Vp), Contains("target id 37") && Contains("row 3"));
    CHECK_THROWS_AS(run(N, V, Vp), snug::Error);
    CHECK(unchanged());
    targets[3] = 0;
    targets[4] = -1;
    CHECK_THROWS_WITH(run(N, V, Vp), Contains("target id -1") && Contains("row 4"));
    CHECK(unchanged());
    targets[4] = 0;
    CHECK_THROWS_AS(run(N, Vp + 1, Vp), snug::ShapeError);
    CHECK_THROWS_WITH(run(N, Vp + 1, Vp), Contains("V = 41") && Contains("Vp = 40"));
    CHECK_THROWS_AS(run(-1, V, Vp), snug::ShapeError);
    CHECK_THROWS_AS(run(N, -2, Vp), snug::ShapeError);
    CHECK_THROWS_AS(run(N, 0, Vp), snug::ShapeError);
    CHECK(unchanged());
    CHECK_THROWS_AS(snug::host::softmax_cross_entropy<float>(Dev{}, losses.data(), nullptr, targets.data(), N, V, Vp,
                                                             1.0f),
                    snug::Error);
    run(0, V, Vp);  // no rows: nothing to do
    CHECK(unchanged());
}
