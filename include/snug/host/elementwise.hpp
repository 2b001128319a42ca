// Host elementwise kernels: the residual add (out = a + b), accumulation
// (dst += src), scaling (x *= s) and the cast between element types (each
// computed in acc_t<T>, rounded once to nearest even on a 16-bit store).
#pragma once

#include <concepts>
#include <cstdint>

#include "snug/core/device.hpp"
#include "snug/host/math.hpp"

namespace snug::host {

namespace detail {

// Elements per parallel task for these memory-bound loops.
inline constexpr std::int64_t elementwise_grain = std::int64_t{1} << 18;

// One element of `cast`: through float for a 16-bit side, so that a value is
// rounded once (float -> 16-bit, double -> float) or converted exactly.
template <HostFloat Dst, HostFloat Src>
Dst convert(Src x) {
    if constexpr (std::same_as<Dst, Src>) {
        return x;
    } else if constexpr (is_16bit_v<Dst>) {
        return Dst(static_cast<float>(to_acc(x)));
    } else {
        return static_cast<Dst>(to_acc(x));
    }
}

}  // namespace detail

// out = a + b, elementwise; out may equal a or b.
template <HostFloat T>
void residual_forward(const Device&, T* out,  // (n)
                      const T* a,             // (n)
                      const T* b,             // (n)
                      std::int64_t n) {
    ops::check_non_negative("residual_forward", {{"n", n}});
    parallel_ranges(n, detail::elementwise_grain, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) out[i] = from_acc<T>(to_acc(a[i]) + to_acc(b[i]));
    });
}

// dst += src, elementwise.
template <HostFloat T>
void add_inplace(const Device&, T* dst,  // (n)
                 const T* src,           // (n)
                 std::int64_t n) {
    ops::check_non_negative("add_inplace", {{"n", n}});
    parallel_ranges(n, detail::elementwise_grain, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) dst[i] = from_acc<T>(to_acc(dst[i]) + to_acc(src[i]));
    });
}

// x *= s, elementwise (in acc_t<T>; for float exactly x[i] * s).
template <HostFloat T>
void scale_inplace(const Device&, T* x,  // (n)
                   std::int64_t n, float s) {
    ops::check_non_negative("scale_inplace", {{"n", n}});
    const acc_t<T> scale = s;
    parallel_ranges(n, detail::elementwise_grain, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) x[i] = from_acc<T>(to_acc(x[i]) * scale);
    });
}

// out = in converted to Dst: exact when widening, one round-to-nearest-even
// step when narrowing (float -> 16-bit, 16-bit -> the other 16-bit, double ->
// float). double -> 16-bit is refused at compile time (it would round twice).
template <HostFloat Dst, HostFloat Src>
void cast(const Device&, Dst* out,  // (n)
          const Src* in,            // (n)
          std::int64_t n) {
    static_assert(!(is_16bit_v<Dst> && std::same_as<Src, double>),
                  "snug::host::cast: double -> 16-bit would round twice (through float); cast to float first");
    ops::check_non_negative("cast", {{"n", n}});
    parallel_ranges(n, detail::elementwise_grain, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) out[i] = detail::convert<Dst>(in[i]);
    });
}

}  // namespace snug::host
