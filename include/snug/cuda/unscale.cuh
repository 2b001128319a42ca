// CUDA unscale_and_check: the loss scaler's one pass over the fp32 gradients
// at an optimizer step: multiply by 1/scale in place and flag any inf or NaN,
// the same values as snug/host/unscale.hpp.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <cstdint>

#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/launch.hpp"
#include "snug/cuda/elementwise.cuh"  // Vec, vec_aligned, map_blocks

namespace snug::cuda {

namespace detail {

// y = g * inv_scale, stored; true when y is inf or NaN. __fmul_rn: one
// correctly rounded multiply, never contracted into anything else.
__device__ __forceinline__ bool unscale_one(float& g, float inv_scale) {
    const float y = __fmul_rn(g, inv_scale);
    g = y;
    return !isfinite(y);
}

// grads *= inv_scale in place, W elements per load and store: thread t takes
// vector t, then every gridDim.x * blockDim.x-th vector; the n % W elements
// past the last whole vector go one each to the first threads. A thread that
// saw an inf or NaN stores 1.0f to *found_inf once, at the end. Several
// threads may store at the same time: a benign race, since every writer
// stores the same value and nothing reads *found_inf in this kernel, so no
// atomic is needed (a thread that saw none stores nothing).
template <int W>
__global__ void unscale_and_check_kernel(float* grads,  // (n)
                                         std::int64_t n, float inv_scale,
                                         float* found_inf) {  // (1)
    const std::int64_t n_vec = n / W;
    const std::int64_t first = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    bool bad = false;
    for (std::int64_t v = first; v < n_vec; v += stride) {
        Vec<float, W> x = reinterpret_cast<const Vec<float, W>*>(grads)[v];
#pragma unroll
        for (int j = 0; j < W; ++j) bad |= unscale_one(x.v[j], inv_scale);
        reinterpret_cast<Vec<float, W>*>(grads)[v] = x;
    }
    const std::int64_t i = n_vec * W + first;
    if (i < n) bad |= unscale_one(grads[i], inv_scale);
    if (bad) *found_inf = 1.0f;
}

}  // namespace detail

// grads[i] *= inv_scale (one fp32 multiply, so exact when inv_scale is a power
// of two and nothing over- or underflows) and, in the same pass, *found_inf =
// 1.0f when any gradient is inf or NaN before or after scaling; otherwise
// *found_inf is left as it was, so the caller zeroes it once and several
// calls (one per gradient buffer) OR into it. Testing the product alone
// covers both: an inf or NaN times anything is inf or NaN (inf * 0 is NaN),
// and a finite gradient that overflows shows up as inf. found_inf is a scalar
// in device memory; the work is queued on dev.stream. The same values as the
// host kernel (a NaN's payload bits may differ).
// Throws ShapeError for n < 0; n == 0 launches nothing.
inline void unscale_and_check(const Device& dev, float* grads,  // (n) multiplied in place
                              std::int64_t n, float inv_scale,
                              float* found_inf) {  // scalar, set to 1.0f on inf/NaN
    ops::check_non_negative("unscale_and_check", {{"n", n}});
    if (n == 0) return;
    constexpr int W = detail::vec_width<float>;
    if (detail::vec_aligned<float, W>(grads)) {
        launch<detail::unscale_and_check_kernel<W>>(detail::map_blocks(n, W), detail::elementwise_block, 0, dev.stream,
                                                    grads, n, inv_scale, found_inf);
    } else {
        launch<detail::unscale_and_check_kernel<1>>(detail::map_blocks(n, 1), detail::elementwise_block, 0, dev.stream,
                                                    grads, n, inv_scale, found_inf);
    }
}

}  // namespace snug::cuda
