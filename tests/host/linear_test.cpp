// Host linear layer: forward against a naive double product; backward (dinp,
// dweight, dbias) against the analytic formulas in double and against finite
// differences of sum(out * R); accumulation of the parameter gradients; the
// 16-bit paths against the float kernel on the same rounded inputs, with a
// known-answer test of round-to-nearest-even; the double path; bad arguments.
#include "snug/host/linear.hpp"

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
using snug::test::to_double;

// Unit roundoff of fp32: the relative error of one rounding.
constexpr double u32 = 0x1p-24;

// n values in [-1, -1/8] u [1/8, 1] (never zero), rounded to T.
template <class T>
std::vector<T> random_values(std::int64_t n, std::mt19937& rng) {
    std::uniform_real_distribution<double> magnitude(0.125, 1.0);
    std::bernoulli_distribution negative(0.5);
    std::vector<T> v(static_cast<std::size_t>(n));
    for (auto& x : v) {
        const double m = magnitude(rng);
        x = from_d<T>(negative(rng) ? -m : m);
    }
    return v;
}

template <class To, class From>
std::vector<To> convert(const std::vector<From>& v) {
    std::vector<To> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = from_d<To>(to_double(v[i]));
    return out;
}

template <class T>
std::vector<T> nan_filled(std::int64_t n) {
    return std::vector<T>(static_cast<std::size_t>(n), from_d<T>(std::numeric_limits<double>::quiet_NaN()));
}

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

// A value and the scale its fp32 rounding error is measured against (the sum
// of the absolute values of the terms that make it).
struct Ref {
    std::vector<double> value, scale;
};

// out = inp W^T + b in double.
template <class T>
Ref forward_ref(const std::vector<T>& inp, const std::vector<T>& w, const T* bias, std::int64_t N, int C,
                int OC) {
    Ref r{std::vector<double>(at(N * OC)), std::vector<double>(at(N * OC))};
    for (std::int64_t n = 0; n < N; ++n) {
        for (int o = 0; o < OC; ++o) {
            double s = bias != nullptr ? to_double(bias[o]) : 0.0;
            double a = std::fabs(s);
            for (int c = 0; c < C; ++c) {
                const double p = to_double(inp[at(n * C + c)]) * to_double(w[at(std::int64_t{o} * C + c)]);
                s += p;
                a += std::fabs(p);
            }
            r.value[at(n * OC + o)] = s;
            r.scale[at(n * OC + o)] = a;
        }
    }
    return r;
}

// The analytic gradients in double: dinp = dout W, dweight = dout^T inp,
// dbias = column sums of dout.
struct Grads {
    Ref dinp, dweight, dbias;
};

template <class T>
Grads backward_ref(const std::vector<T>& dout, const std::vector<T>& inp, const std::vector<T>& w, std::int64_t N,
                   int C, int OC) {
    Grads g{{std::vector<double>(at(N * C)), std::vector<double>(at(N * C))},
            {std::vector<double>(at(std::int64_t{OC} * C)), std::vector<double>(at(std::int64_t{OC} * C))},
            {std::vector<double>(at(OC)), std::vector<double>(at(OC))}};
    for (std::int64_t n = 0; n < N; ++n) {
        for (int o = 0; o < OC; ++o) {
            const double d = to_double(dout[at(n * OC + o)]);
            g.dbias.value[at(o)] += d;
            g.dbias.scale[at(o)] += std::fabs(d);
            for (int c = 0; c < C; ++c) {
                const double pw = d * to_double(w[at(std::int64_t{o} * C + c)]);
                g.dinp.value[at(n * C + c)] += pw;
                g.dinp.scale[at(n * C + c)] += std::fabs(pw);
                const double px = d * to_double(inp[at(n * C + c)]);
                g.dweight.value[at(std::int64_t{o} * C + c)] += px;
                g.dweight.scale[at(std::int64_t{o} * C + c)] += std::fabs(px);
            }
        }
    }
    return g;
}

// Counts entries of got outside |got - (base + times * ref)| <= terms * u *
// (scale + |base|) + 1e-30 and describes the first. `terms` bounds the number
// of fp32 roundings on the way (the classic gamma_n bound for a sum of n
// products, any order, FMA or not, plus the final additions).
template <class G>
std::string check_close(const char* what, const std::vector<G>& got, const Ref& ref, double terms,
                        const std::vector<float>* base = nullptr, double times = 1.0, double unit = u32) {
    std::int64_t bad = 0;
    std::string first;
    for (std::size_t i = 0; i < ref.value.size(); ++i) {
        const double b = base != nullptr ? (*base)[i] : 0.0;
        const double want = b + times * ref.value[i];
        const double tol = terms * unit * (times * ref.scale[i] + std::fabs(b)) + 1e-30;
        const double g = to_double(got[i]);
        if (!(std::fabs(g - want) <= tol)) {
            if (bad++ == 0) first = fmt::format("{}[{}] = {} but want {} (tolerance {:.3g})", what, i, g, want, tol);
        }
    }
    return bad == 0 ? std::string() : fmt::format("{} of {} wrong; first: {}", bad, ref.value.size(), first);
}

struct Shape {
    std::int64_t N;
    int C, OC;
};

// Odd sizes (C and OC not multiples of 8 or 32), one row, one everything, and
// one large enough to be split over threads.
const std::vector<Shape> shapes{{7, 37, 19}, {1, 1, 1}, {1, 45, 3}, {13, 1, 29}, {96, 130, 75}, {257, 200, 150}};

}  // namespace

TEST_CASE("linear_forward (float) matches a double reference", "[linear]") {
    std::mt19937 rng(11);
    for (const Shape s : shapes) {
        for (const bool with_bias : {true, false}) {
            INFO(fmt::format("N = {}, C = {}, OC = {}, bias = {}", s.N, s.C, s.OC, with_bias));
            const auto inp = random_values<float>(s.N * s.C, rng);
            const auto w = random_values<float>(std::int64_t{s.OC} * s.C, rng);
            const auto b = random_values<float>(s.OC, rng);
            auto out = nan_filled<float>(s.N * s.OC);
            snug::host::linear_forward(Dev{}, out.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, s.N,
                                       s.C, s.OC);
            const Ref ref = forward_ref(inp, w, with_bias ? b.data() : nullptr, s.N, s.C, s.OC);
            CHECK(check_close("out", out, ref, s.C + 2) == "");
        }
    }
}

TEST_CASE("linear_backward (float) matches the analytic gradients and accumulates", "[linear]") {
    std::mt19937 rng(12);
    for (const Shape s : shapes) {
        INFO(fmt::format("N = {}, C = {}, OC = {}", s.N, s.C, s.OC));
        const auto inp = random_values<float>(s.N * s.C, rng);
        const auto w = random_values<float>(std::int64_t{s.OC} * s.C, rng);
        const auto dout = random_values<float>(s.N * s.OC, rng);
        // The parameter gradients start from earlier (nonzero) sums: they accumulate.
        const auto dw0 = random_values<float>(std::int64_t{s.OC} * s.C, rng);
        const auto db0 = random_values<float>(s.OC, rng);
        auto dinp = nan_filled<float>(s.N * s.C);  // overwritten, never read
        auto dw = dw0;
        auto db = db0;
        snug::host::linear_backward(Dev{}, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), s.N,
                                    s.C, s.OC);
        const Grads g = backward_ref(dout, inp, w, s.N, s.C, s.OC);
        CHECK(check_close("dinp", dinp, g.dinp, s.OC + 2) == "");
        CHECK(check_close("dweight", dw, g.dweight, double(s.N) + 2, &dw0) == "");
        CHECK(check_close("dbias", db, g.dbias, double(s.N) + 2, &db0) == "");

        // A second call adds the same gradients again; dinp is recomputed
        // from scratch; without dinp and dbias only dweight moves.
        snug::host::linear_backward(Dev{}, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), s.N,
                                    s.C, s.OC);
        CHECK(check_close("dinp (2nd call)", dinp, g.dinp, s.OC + 2) == "");
        CHECK(check_close("dweight (2nd call)", dw, g.dweight, 2.0 * (double(s.N) + 2), &dw0, 2.0) == "");
        CHECK(check_close("dbias (2nd call)", db, g.dbias, 2.0 * (double(s.N) + 2), &db0, 2.0) == "");
        const auto db_before = db;
        snug::host::linear_backward<float>(Dev{}, nullptr, dw.data(), nullptr, dout.data(), inp.data(), nullptr,
                                           s.N, s.C, s.OC);
        CHECK(check_close("dweight (3rd call)", dw, g.dweight, 3.0 * (double(s.N) + 2), &dw0, 3.0) == "");
        CHECK(db == db_before);
    }
}

// L(inp, W, b) = sum(out * R) is linear in every single input, so a central
// difference over a step h has no truncation error at all: the only error is
// fp32 rounding in the two forward passes. Each affected output carries at
// most (C + 2) u S of it (S: the sum of |terms| at the perturbed point), so the
// difference quotient is off by at most sum |R| 2 (C + 2) u S / (x+ - x-),
// plus the kernel gradient's own rounding bound. Only the affected outputs
// enter L (the others do not depend on the perturbed input).
TEST_CASE("linear_backward (float) agrees with finite differences of sum(out * R)", "[linear]") {
    std::mt19937 rng(13);
    for (const Shape s : {Shape{5, 13, 7}, Shape{1, 3, 1}, Shape{4, 1, 9}}) {
        const std::int64_t N = s.N;
        const int C = s.C, OC = s.OC;
        INFO(fmt::format("N = {}, C = {}, OC = {}", N, C, OC));
        auto inp = random_values<float>(N * C, rng);
        auto w = random_values<float>(std::int64_t{OC} * C, rng);
        auto b = random_values<float>(OC, rng);
        const auto R = random_values<float>(N * OC, rng);

        std::vector<float> dinp(at(N * C)), dw(at(std::int64_t{OC} * C), 0.0f), db(at(OC), 0.0f);
        snug::host::linear_backward(Dev{}, dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), N, C,
                                    OC);

        std::vector<float> out(at(N * OC));
        // sum over the outputs in rows [n0, n1) x columns [o0, o1) of out * R,
        // and of |R| * (C + 2) u * S bounding their rounding error.
        auto loss = [&](std::int64_t n0, std::int64_t n1, int o0, int o1, double& err) {
            snug::host::linear_forward(Dev{}, out.data(), inp.data(), w.data(), b.data(), N, C, OC);
            const Ref ref = forward_ref(inp, w, b.data(), N, C, OC);
            double sum = 0.0;
            err = 0.0;
            for (std::int64_t n = n0; n < n1; ++n) {
                for (int o = o0; o < o1; ++o) {
                    sum += double(out[at(n * OC + o)]) * R[at(n * OC + o)];
                    err += std::fabs(R[at(n * OC + o)]) * (C + 2) * u32 * ref.scale[at(n * OC + o)];
                }
            }
            return sum;
        };
        const float h = 1.0f;
        // Central difference in the variable x, whose perturbation affects the
        // given block of outputs; grad is what the kernel computed, grad_err
        // bounds its own rounding.
        auto check = [&](const char* name, std::int64_t index, float& x, float grad, double grad_err,
                         std::int64_t n0, std::int64_t n1, int o0, int o1) {
            const float x0 = x;
            double err_plus = 0.0, err_minus = 0.0;
            x = x0 + h;
            const double x_plus = x;
            const double l_plus = loss(n0, n1, o0, o1, err_plus);
            x = x0 - h;
            const double x_minus = x;
            const double l_minus = loss(n0, n1, o0, o1, err_minus);
            x = x0;
            const double step = x_plus - x_minus;
            const double fd = (l_plus - l_minus) / step;
            const double tol = (err_plus + err_minus) / step + grad_err + 1e-12;
            INFO(fmt::format("{}[{}]: kernel {} finite difference {} tolerance {:.3g}", name, index, grad, fd, tol));
            CHECK(std::fabs(fd - grad) <= tol);
        };
        for (std::int64_t n = 0; n < N; ++n) {
            for (int c = 0; c < C; ++c) {
                double gerr = 0.0;
                for (int o = 0; o < OC; ++o) gerr += std::fabs(R[at(n * OC + o)] * w[at(std::int64_t{o} * C + c)]);
                check("dinp", n * C + c, inp[at(n * C + c)], dinp[at(n * C + c)], (OC + 2) * u32 * gerr, n, n + 1, 0,
                      OC);
            }
        }
        for (int o = 0; o < OC; ++o) {
            for (int c = 0; c < C; ++c) {
                double gerr = 0.0;
                for (std::int64_t n = 0; n < N; ++n) gerr += std::fabs(R[at(n * OC + o)] * inp[at(n * C + c)]);
                const std::int64_t i = std::int64_t{o} * C + c;
                check("dweight", i, w[at(i)], dw[at(i)], (double(N) + 2) * u32 * gerr, 0, N, o, o + 1);
            }
            double gerr = 0.0;
            for (std::int64_t n = 0; n < N; ++n) gerr += std::fabs(R[at(n * OC + o)]);
            check("dbias", o, b[at(o)], db[at(o)], (double(N) + 2) * u32 * gerr, 0, N, o, o + 1);
        }
    }
}

// The 16-bit kernels equal the float kernels applied to the same (already
// rounded) inputs, with the float result rounded to nearest even once.
TEMPLATE_TEST_CASE("linear (16-bit) is the float kernel rounded once", "[linear]", half, snug::bfloat16) {
    using T = TestType;
    std::mt19937 rng(14);
    for (const Shape s : shapes) {
        INFO(fmt::format("N = {}, C = {}, OC = {}", s.N, s.C, s.OC));
        const auto inp = random_values<T>(s.N * s.C, rng);
        const auto w = random_values<T>(std::int64_t{s.OC} * s.C, rng);
        const auto b = random_values<T>(s.OC, rng);
        const auto dout = random_values<T>(s.N * s.OC, rng);
        const auto inp_f = convert<float>(inp), w_f = convert<float>(w), b_f = convert<float>(b),
                   dout_f = convert<float>(dout);

        auto out = nan_filled<T>(s.N * s.OC);
        auto out_f = nan_filled<float>(s.N * s.OC);
        snug::host::linear_forward(Dev{}, out.data(), inp.data(), w.data(), b.data(), s.N, s.C, s.OC);
        snug::host::linear_forward(Dev{}, out_f.data(), inp_f.data(), w_f.data(), b_f.data(), s.N, s.C, s.OC);
        std::int64_t bad = 0;
        for (std::size_t i = 0; i < out.size(); ++i) bad += bits_of(out[i]) != bits_of(T(out_f[i]));
        CHECK(bad == 0);

        auto dinp = nan_filled<T>(s.N * s.C);
        auto dinp_f = nan_filled<float>(s.N * s.C);
        std::vector<float> dw(at(std::int64_t{s.OC} * s.C), 0.5f), dw_f = dw, db(at(s.OC), -0.25f), db_f = db;
        snug::host::linear_backward(Dev{}, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), s.N,
                                    s.C, s.OC);
        snug::host::linear_backward(Dev{}, dinp_f.data(), dw_f.data(), db_f.data(), dout_f.data(), inp_f.data(),
                                    w_f.data(), s.N, s.C, s.OC);
        bad = 0;
        for (std::size_t i = 0; i < dinp.size(); ++i) bad += bits_of(dinp[i]) != bits_of(T(dinp_f[i]));
        CHECK(bad == 0);
        // The fp32 gradients: the same products and sums as the float kernel.
        CHECK(dw == dw_f);
        CHECK(db == db_f);
    }
}

// Sums whose exact value lies halfway between two 16-bit neighbours, or just
// above halfway; u = one ulp at 1. Ties go to the even neighbour (neither
// truncation nor round-half-up gives all three).
TEMPLATE_TEST_CASE("linear (16-bit) rounds to nearest even", "[linear]", half, snug::bfloat16) {
    using T = TestType;
    const double u = std::is_same_v<T, half> ? 0x1p-10 : 0x1p-7;
    // Forward: out_o = 1 * w_o + b_o with N = 1, C = 1, OC = 3.
    const std::vector<T> x{from_d<T>(1.0)};
    const std::vector<T> w{from_d<T>(1.0 + u), from_d<T>(1.0), from_d<T>(1.0)};
    const std::vector<T> b{from_d<T>(u / 2), from_d<T>(u / 2), from_d<T>(u / 2 * (1.0 + u))};
    REQUIRE(to_double(w[0]) == 1.0 + u);  // every input is exact in T
    REQUIRE(to_double(b[2]) == u / 2 * (1.0 + u));
    auto out = nan_filled<T>(3);
    snug::host::linear_forward(Dev{}, out.data(), x.data(), w.data(), b.data(), 1, 1, 3);
    CHECK(to_double(out[0]) == 1.0 + 2 * u);  // 1 + 1.5u: tie, to the even 1 + 2u
    CHECK(to_double(out[1]) == 1.0);          // 1 + 0.5u: tie, to the even 1
    CHECK(to_double(out[2]) == 1.0 + u);      // just above the tie: up

    // Backward: dinp = dout W with N = 1, OC = 2, C = 1: 1 * (1 + u) + 1 * u/2.
    const std::vector<T> dout{from_d<T>(1.0), from_d<T>(1.0)};
    const std::vector<T> w2{from_d<T>(1.0 + u), from_d<T>(u / 2)};
    auto dinp = nan_filled<T>(1);
    std::vector<float> dw(2, 0.0f);
    snug::host::linear_backward<T>(Dev{}, dinp.data(), dw.data(), nullptr, dout.data(), x.data(), w2.data(), 1, 1, 2);
    CHECK(to_double(dinp[0]) == 1.0 + 2 * u);
    CHECK(dw == std::vector<float>{1.0f, 1.0f});
}

// T = double runs a plain loop nest in double: the forward pass and dinp to
// double rounding, dweight and dbias to one fp32 rounding of a double sum.
TEST_CASE("linear (double) matches the references and finite differences", "[linear]") {
    constexpr double u64 = 0x1p-53;
    std::mt19937 rng(15);
    for (const Shape s : {Shape{7, 37, 19}, Shape{1, 1, 1}, Shape{13, 1, 29}}) {
        const std::int64_t N = s.N;
        const int C = s.C, OC = s.OC;
        INFO(fmt::format("N = {}, C = {}, OC = {}", N, C, OC));
        auto inp = random_values<double>(N * C, rng);
        auto w = random_values<double>(std::int64_t{OC} * C, rng);
        const auto b = random_values<double>(OC, rng);
        const auto R = random_values<double>(N * OC, rng);
        auto out = nan_filled<double>(N * OC);
        snug::host::linear_forward(Dev{}, out.data(), inp.data(), w.data(), b.data(), N, C, OC);
        CHECK(check_close("out", out, forward_ref(inp, w, b.data(), N, C, OC), C + 2, nullptr, 1.0, u64) == "");

        auto dinp = nan_filled<double>(N * C);
        std::vector<float> dw(at(std::int64_t{OC} * C), 0.0f), db(at(OC), 0.0f);
        snug::host::linear_backward(Dev{}, dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), N, C,
                                    OC);
        const Grads g = backward_ref(R, inp, w, N, C, OC);
        CHECK(check_close("dinp", dinp, g.dinp, OC + 2, nullptr, 1.0, u64) == "");
        // One fp32 rounding of a (nearly exact) double sum: half an ulp, relative u.
        Ref dw_tol = g.dweight, db_tol = g.dbias;
        for (std::size_t i = 0; i < dw_tol.scale.size(); ++i) dw_tol.scale[i] = std::fabs(g.dweight.value[i]) * 1.01;
        for (std::size_t i = 0; i < db_tol.scale.size(); ++i) db_tol.scale[i] = std::fabs(g.dbias.value[i]) * 1.01;
        CHECK(check_close("dweight", dw, dw_tol, 1.0) == "");
        CHECK(check_close("dbias", db, db_tol, 1.0) == "");

        // Finite differences of sum(out * R) over the inputs, in double: exact
        // linearity again, so the error is double rounding only.
        for (std::int64_t i = 0; i < N * C; ++i) {
            const double x0 = inp[at(i)];
            auto l = [&](double x) {
                inp[at(i)] = x;
                snug::host::linear_forward(Dev{}, out.data(), inp.data(), w.data(), b.data(), N, C, OC);
                double sum = 0.0;
                for (std::size_t k = 0; k < out.size(); ++k) sum += out[k] * R[k];
                return sum;
            };
            const double fd = (l(x0 + 0.5) - l(x0 - 0.5)) / 1.0;
            inp[at(i)] = x0;
            CHECK(std::fabs(fd - dinp[at(i)]) <= 1e-12 * (1.0 + double(C) * double(OC)));
        }
    }
}

TEST_CASE("linear handles empty sizes", "[linear]") {
    std::mt19937 rng(16);
    const auto b = random_values<float>(5, rng);
    const auto inp = random_values<float>(3 * 4, rng);
    // C = 0: out is the bias in every row, inp and weight are not read.
    auto out = nan_filled<float>(3 * 5);
    snug::host::linear_forward<float>(Dev{}, out.data(), nullptr, nullptr, b.data(), 3, 0, 5);
    for (int n = 0; n < 3; ++n) {
        for (int o = 0; o < 5; ++o) CHECK(out[at(n * 5 + o)] == b[at(o)]);
    }
    snug::host::linear_forward<float>(Dev{}, out.data(), nullptr, nullptr, nullptr, 3, 0, 5);
    CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
    // OC = 0: dinp = 0; N = 0: the accumulated gradients do not move.
    auto dinp = nan_filled<float>(3 * 4);
    std::vector<float> dw(5 * 4, 0.75f), db(5, -1.5f);
    snug::host::linear_backward<float>(Dev{}, dinp.data(), nullptr, nullptr, nullptr, inp.data(), nullptr, 3, 4, 0);
    CHECK(std::all_of(dinp.begin(), dinp.end(), [](float v) { return v == 0.0f; }));
    snug::host::linear_backward<float>(Dev{}, nullptr, dw.data(), db.data(), nullptr, nullptr, nullptr, 0, 4, 5);
    CHECK(std::all_of(dw.begin(), dw.end(), [](float v) { return v == 0.75f; }));
    CHECK(std::all_of(db.begin(), db.end(), [](float v) { return v == -1.5f; }));
}

TEST_CASE("linear rejects bad arguments", "[linear]") {
    std::vector<float> x(64, 1.0f), y(64, 1.0f), z(64, 1.0f);
    using Catch::Matchers::Contains;
    CHECK_THROWS_AS(snug::host::linear_forward<float>(Dev{}, y.data(), x.data(), z.data(), nullptr, -1, 2, 2),
                    snug::ShapeError);
    CHECK_THROWS_WITH(snug::host::linear_forward<float>(Dev{}, y.data(), x.data(), z.data(), nullptr, 2, -3, 2),
                      Contains("C = -3"));
    CHECK_THROWS_AS(snug::host::linear_backward<float>(Dev{}, y.data(), z.data(), nullptr, x.data(), x.data(),
                                                       z.data(), 2, 2, -1),
                    snug::ShapeError);
    CHECK_THROWS_WITH(snug::host::linear_forward<float>(Dev{}, y.data(), nullptr, z.data(), nullptr, 2, 2, 2),
                      Contains("inp is null"));
    CHECK_THROWS_WITH(snug::host::linear_backward<float>(Dev{}, y.data(), nullptr, nullptr, x.data(), x.data(),
                                                         z.data(), 2, 2, 2),
                      Contains("dweight is null"));
    CHECK_THROWS_WITH(snug::host::linear_backward<float>(Dev{}, y.data(), z.data(), nullptr, x.data(), x.data(),
                                                         nullptr, 2, 2, 2),
                      Contains("weight is null"));
    CHECK_THROWS_AS(snug::host::linear_backward<double>(Dev{}, nullptr, z.data(), nullptr, nullptr, nullptr, nullptr,
                                                        2, 2, 2),
                    snug::Error);
}
