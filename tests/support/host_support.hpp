// Test support for the host tests in tests/host: values as double, exact
// round trips from double, object bits, seeded random inputs (an optimizer's
// gradient: awkward_groups.hpp), the round-to-nearest-even check for 16-bit results, a float64 reference of
// stochastic rounding to bfloat16, the largest relative error
// of a result, and central finite differences.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "snug/core/half.hpp"

namespace snug::test {

// The value of a float, half or bfloat16 (through float), or of a double.
template <class T>
double to_double(T x) {
    return static_cast<double>(static_cast<float>(x));
}
inline double to_double(double x) { return x; }

// x rounded to T (through float unless T is double).
template <class T>
T from_d(double x) {
    if constexpr (std::is_same_v<T, double>) {
        return x;
    } else {
        return T(static_cast<float>(x));
    }
}

// The object representation of x, zero-extended.
template <class T>
std::uint64_t bits_of(T x) {
    static_assert(sizeof(T) <= sizeof(std::uint64_t));
    std::uint64_t b = 0;
    std::memcpy(&b, &x, sizeof(T));
    return b;
}

// n values uniform in [lo, hi) drawn in double from mt19937(seed), never
// zero, rounded to T.
template <class T>
std::vector<T> random_values(std::size_t n, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<double> dist(lo, hi);
    std::vector<T> v(n);
    for (auto& x : v) {
        double d = 0.0;
        do {
            d = dist(gen);
        } while (d == 0.0);
        x = from_d<T>(d);
    }
    return v;
}

// An optimizer test's AdamW hyper-parameters (one update at `step`).
struct AdamWHyper {
    float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    int step = 3;
    float grad_scale = 0.5f;
};

// x (double, finite, |x| in bfloat16's normal range or 0) rounded
// stochastically to bfloat16 with the low 16 bits of `die`, computed from the
// value's position between its two neighbours (not from float bits): up in
// magnitude when die + position x 2^16 reaches 2^16. The optimizer tests'
// float64 reference of core/stochastic_rounding.hpp.
inline double reference_round_bf16(double x, std::uint32_t die) {
    if (x == 0.0) return 0.0;
    const double a = std::abs(x);
    int e = 0;
    const double f = std::frexp(a, &e);
    const double step = std::ldexp(1.0, e - 8);
    const double lo = std::ldexp(std::floor(std::ldexp(f, 8)), e - 8);
    const double position = (a - lo) / step;  // [0, 1)
    const bool up = double(die & 0xFFFFU) + position * 65536.0 >= 65536.0;
    return std::copysign(up ? lo + step : lo, x);
}

// True when the finite 16-bit `b` (half or bfloat16) is the
// round-to-nearest-even image of x: neither magnitude neighbour is nearer,
// and a tie leaves b's mantissa even.
template <class T>
bool is_rne(double x, T b) {
    static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16>);
    const double v = to_double(b);
    const auto mag = static_cast<int>(b.bits & 0x7FFF);
    const auto sign = static_cast<std::uint16_t>(b.bits & 0x8000);
    const int max_finite = std::is_same_v<T, half> ? 0x7BFF : 0x7F7F;
    for (int step : {-1, 1}) {
        const int nm = mag + step;
        if (nm < 0 || nm > max_finite) continue;
        const double nd = std::fabs(x - to_double(T::from_bits(static_cast<std::uint16_t>(sign | nm))));
        if (nd < std::fabs(x - v) || (nd == std::fabs(x - v) && (b.bits & 1) != 0)) return false;
    }
    return true;
}

// max over i of |got[i] - want[i]| / (|want[i]| + floor); a NaN anywhere
// counts as infinitely wrong.
template <class G>
double max_rel(const std::vector<G>& got, const std::vector<double>& want, double floor) {
    double worst = 0.0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        const double e = std::fabs(static_cast<double>(got[i]) - want[i]) / (std::fabs(want[i]) + floor);
        worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(worst, e);
    }
    return worst;
}

// d loss / d param[i] for every i by central differences with step h
// (loss() reads param; each entry is restored after its two evaluations).
template <class Loss>
std::vector<double> central_differences(std::vector<double>& param, Loss&& loss, double h = 1e-5) {
    std::vector<double> g(param.size());
    for (std::size_t i = 0; i < param.size(); ++i) {
        const double keep = param[i];
        param[i] = keep + h;
        const double lp = loss();
        param[i] = keep - h;
        const double lm = loss();
        param[i] = keep;
        g[i] = (lp - lm) / (2 * h);
    }
    return g;
}

}  // namespace snug::test
