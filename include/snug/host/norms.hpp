// Host reductions: sum_squares, the squared L2 norm of an fp32 span (for
// clipping and the finite check), and accumulate_sum, a running total kept
// where the device keeps it (the training loss of an update); both in double.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>

#include "snug/core/device.hpp"
#include "snug/host/math.hpp"
#include "snug/host/parallel.hpp"

namespace snug::host {

namespace detail {

// The sum is cut into at most norm_max_blocks blocks of at least norm_grain
// elements; where they fall depends on n only, and the block sums are added
// in block order, so the result is the same for every thread count.
inline constexpr std::int64_t norm_grain = std::int64_t{1} << 16;
inline constexpr std::int64_t norm_max_blocks = 64;

// sum x[i]^2 in double, over independent lanes that the compiler keeps in
// vector registers (one running sum would not vectorise).
inline double sum_squares_block(const float* x, std::int64_t n) {  // x: (n)
    constexpr int lanes = 8;
    std::array<double, lanes> acc{};
    std::int64_t i = 0;
    for (; i + lanes <= n; i += lanes) {
        for (int l = 0; l < lanes; ++l) {
            const double xi = x[i + l];
            acc[l] += xi * xi;
        }
    }
    double sum = 0.0;
    for (; i < n; ++i) {
        const double xi = x[i];
        sum += xi * xi;
    }
    for (const double a : acc) sum += a;
    return sum;
}

}  // namespace detail

// *out = sum grad[i]^2, accumulated in double and rounded to float once (a
// sum past the float range is +inf; an inf or NaN element makes it inf or
// NaN). Deterministic: the same bits for every thread count.
// Throws ShapeError for n < 0.
inline void sum_squares(const Device&, float* out,  // scalar, overwritten
                        const float* grad,          // (n)
                        std::int64_t n) {
    ops::check_non_negative("sum_squares", {{"n", n}});
    const std::int64_t blocks = std::clamp<std::int64_t>(n / detail::norm_grain, 1, detail::norm_max_blocks);
    std::array<double, detail::norm_max_blocks> partial{};
    const auto threads = static_cast<unsigned>(std::min<std::int64_t>(max_threads(), blocks));
    parallel_for(blocks, threads, [&](std::int64_t b) {
        const std::int64_t begin = n * b / blocks, end = n * (b + 1) / blocks;
        partial[static_cast<std::size_t>(b)] = detail::sum_squares_block(grad + begin, end - begin);
    });
    double total = 0.0;
    for (std::int64_t b = 0; b < blocks; ++b) total += partial[static_cast<std::size_t>(b)];
    // Rounded to float; a double at or past 2^128 is outside float's range.
    *out = total >= 0x1p128 ? std::numeric_limits<float>::infinity() : static_cast<float>(total);
}

// *total += sum values[i], in double, in index order: a running total that
// stays in device memory between passes (TrainStep adds each micro-batch's
// token losses and reads the total once per update). Throws ShapeError for
// n < 0.
inline void accumulate_sum(const Device&, double* total,  // scalar, accumulated
                           const float* values,           // (n)
                           std::int64_t n) {
    ops::check_non_negative("accumulate_sum", {{"n", n}});
    double sum = 0.0;
    for (std::int64_t i = 0; i < n; ++i) sum += values[i];
    *total += sum;
}

}  // namespace snug::host
