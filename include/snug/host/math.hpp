// What every host kernel shares: the element types it accepts (HostFloat), the
// type it computes in (acc_t<T>: double for double, float otherwise), loads and
// stores between the two (16-bit stores round to nearest even), the size
// check that turns a negative size into a snug::ShapeError, and
// parallel_ranges, which splits a large loop over the host threads.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "snug/core/dtype.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/host/parallel.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::host {

// Element types a host kernel reads and writes: the storage types
// (FloatStorage: fp32 and the two 16-bit ones) and fp64, for the references
// and finite-difference tests.
template <class T>
concept HostFloat = FloatStorage<T> || std::same_as<T, double>;

// True for the two 16-bit storage types.
template <class T>
inline constexpr bool is_16bit_v = std::same_as<T, half> || std::same_as<T, bfloat16>;

// The type a kernel computes in for elements of type T: double for double,
// float for float, half and bfloat16.
template <class T>
using acc_t = std::conditional_t<std::same_as<T, double>, double, float>;

// x widened to the compute type (exact for every HostFloat).
template <HostFloat T>
inline acc_t<T> to_acc(T x) {
    if constexpr (is_16bit_v<T>) {
        return static_cast<float>(x);
    } else {
        return x;
    }
}

// v narrowed to the storage type T; 16-bit types round to nearest even, once.
template <HostFloat T>
inline T from_acc(acc_t<T> v) {
    return T(v);
}

// *p widened to the compute type.
template <HostFloat T>
inline acc_t<T> load(const T* p) {
    return to_acc(*p);
}

// Stores v at p, rounded to T (nearest even for 16-bit). T is deduced from p
// only, so a wider value converts to acc_t<T> first.
template <HostFloat T>
inline void store(T* p, std::type_identity_t<acc_t<T>> v) {
    *p = from_acc<T>(v);
}

// Calls fn(begin, end) on contiguous ranges that cover [0, n) exactly once,
// each at least `grain` items long (except when n < grain), on up to
// max_threads() threads; for n < 2 * grain it is one call on this thread.
// Choose grain so that one range is some tens of microseconds of work (a
// thread start costs about that). fn must not depend on where the ranges
// split if the result is to be the same for every thread count.
template <class F>
void parallel_ranges(std::int64_t n, std::int64_t grain, F&& fn) {
    if (n <= 0) return;
    const std::int64_t by_size = n / std::max<std::int64_t>(grain, 1);
    const std::int64_t tasks = std::clamp<std::int64_t>(by_size, 1, max_threads());
    if (tasks == 1) {
        fn(std::int64_t{0}, n);
        return;
    }
    parallel_for(tasks, static_cast<unsigned>(tasks), [&](std::int64_t task) {
        fn(n * task / tasks, n * (task + 1) / tasks);
    });
}

namespace detail {

// Sum over j in [0, n) of term(j), term called once for each j in increasing
// order, kept in `Lanes` interleaved partial sums so that the loop vectorises
// without the compiler reassociating anything: the result depends only on n
// and the values, never on the thread count or the build.
template <class A, int Lanes = 8, class F>
A lane_sum(std::int64_t n, F&& term) {
    A lane[Lanes] = {};
    std::int64_t j = 0;
    for (; j + Lanes <= n; j += Lanes) {
        for (int l = 0; l < Lanes; ++l) lane[l] += term(j + l);
    }
    A sum = 0;
    for (; j < n; ++j) sum += term(j);
    for (const A s : lane) sum += s;
    return sum;
}

// The shared core of the host kernels' fast fp32 exponentials (GELU's and
// attention's, which differ only in the range they must cover): e^x = 2^n p
// with n = round(x / ln 2) and p = e^r, r = x - n ln 2 reduced in two steps
// (Cody-Waite: n ln2_hi is exact) and |r| <= ln(2) / 2, p by its degree-7
// Taylor polynomial (truncation below 1e-8 relative). Plain arithmetic, so
// that loops of it vectorise; the caller builds 2^n for its range.
struct ExpParts {
    float n;  // an integer value
    float p;  // e^r, in [0.7, 1.42]
};

inline ExpParts exp_parts(float x) {
    constexpr float log2e = 1.44269504088896341F;
    constexpr float ln2_hi = 0.693145751953125F;  // few mantissa bits: n * ln2_hi is exact
    constexpr float ln2_lo = 1.42860682030941723e-06F;
    constexpr float round_magic = 12582912.0F;  // 1.5 * 2^23: adding it rounds to an integer
    const float n = (x * log2e + round_magic) - round_magic;
    const float r = (x - n * ln2_hi) - n * ln2_lo;
    float p = 1.0F / 5040.0F;
    p = p * r + 1.0F / 720.0F;
    p = p * r + 1.0F / 120.0F;
    p = p * r + 1.0F / 24.0F;
    p = p * r + 1.0F / 6.0F;
    p = p * r + 0.5F;
    p = p * r + 1.0F;
    p = p * r + 1.0F;
    return {n, p};
}

}  // namespace detail
}  // namespace snug::host
