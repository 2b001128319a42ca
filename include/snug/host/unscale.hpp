// Host unscale_and_check: the loss scaler's one pass over the fp32 gradients
// at an optimizer step: multiply by 1/scale in place and flag any inf or NaN.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>

#include "snug/core/device.hpp"
#include "snug/host/math.hpp"
#include "snug/host/parallel.hpp"

namespace snug::host {

namespace detail {

// Elements per parallel range: a read and a write of 1 MiB, some tens of
// microseconds.
inline constexpr std::int64_t unscale_grain = std::int64_t{1} << 18;

// g[i] *= inv_scale for i < n; returns true when any product is inf or NaN
// (exponent field all ones). The flags are ORed into `lanes` interleaved
// words with no early exit, so the loop vectorises even at -O2.
inline bool unscale_block(float* g,  // (n)
                          std::int64_t n, float inv_scale) {
    constexpr std::uint32_t exponent = 0x7F80'0000U;
    constexpr int lanes = 8;
    const auto non_finite = [](float y) -> std::uint32_t {
        return (std::bit_cast<std::uint32_t>(y) & exponent) == exponent ? 1U : 0U;
    };
    std::uint32_t lane[lanes] = {};
    std::int64_t i = 0;
    for (; i + lanes <= n; i += lanes) {
        for (int l = 0; l < lanes; ++l) {
            const float y = g[i + l] * inv_scale;
            g[i + l] = y;
            lane[l] |= non_finite(y);
        }
    }
    std::uint32_t bad = 0;
    for (; i < n; ++i) {
        const float y = g[i] * inv_scale;
        g[i] = y;
        bad |= non_finite(y);
    }
    for (const std::uint32_t b : lane) bad |= b;
    return bad != 0;
}

}  // namespace detail

// grads[i] *= inv_scale (one fp32 multiply, so exact when inv_scale is a power
// of two and nothing over- or underflows) and, in the same pass, *found_inf =
// 1.0f when any gradient is inf or NaN before or after scaling; otherwise
// *found_inf is left as it was, so the caller zeroes it once and several
// calls (one per gradient buffer) OR into it. Testing the product alone
// covers both: an inf or NaN times anything is inf or NaN (inf * 0 is NaN),
// and a finite gradient that overflows shows up as inf.
// found_inf is a scalar in host memory (the device memory of this backend).
// Throws ShapeError for n < 0; n == 0 touches nothing.
inline void unscale_and_check(const Device&, float* grads,  // (n) multiplied in place
                              std::int64_t n, float inv_scale,
                              float* found_inf) {  // scalar, set to 1.0f on inf/NaN
    ops::check_non_negative("unscale_and_check", {{"n", n}});
    std::atomic<bool> any{false};
    parallel_ranges(n, detail::unscale_grain, [&](std::int64_t begin, std::int64_t end) {
        if (detail::unscale_block(grads + begin, end - begin, inv_scale)) any.store(true, std::memory_order_relaxed);
    });
    if (any.load(std::memory_order_relaxed)) *found_inf = 1.0f;
}

}  // namespace snug::host
