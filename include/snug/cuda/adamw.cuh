// The CUDA AdamW step: one fused pass over a span of parameters that updates
// the master weights and both moments (fp32, bf16 rounded stochastically, or
// 8-bit block-wise: adamw_update_8bit), and refreshes the compute copy.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/core/rng.hpp"
#include "snug/core/stochastic_rounding.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/launch.hpp"
#include "snug/cuda/elementwise.cuh"  // FloatStorage
#include "snug/cuda/norms.cuh"
#include "snug/cuda/shared_memory.hpp"
#include "snug/ops/adamw.hpp"
#include "snug/ops/moment_quantization.hpp"

namespace snug::cuda {

namespace detail {

inline constexpr int adamw_threads = 256;

// The update's fp32 arithmetic for one element, in the host's order
// (host/adamw.hpp, adamw_fp32); the __f*_rn intrinsics keep nvcc from fusing
// a multiply and an add into one FMA, so the result is the host's, bit for
// bit. m and v hold the old moments on entry and the new ones on return; the
// new weight is returned.
__device__ inline float adamw_element(const ops::AdamWConstants& k, float p, float grad, float& m, float& v) {
    const float g = __fmul_rn(grad, k.grad_scale);
    m = __fadd_rn(m, __fmul_rn(k.one_minus_beta1, __fsub_rn(g, m)));
    v = __fadd_rn(__fmul_rn(v, k.beta2), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.bc2_sqrt), k.eps);
    return __fsub_rn(__fmul_rn(p, k.decay), __fmul_rn(k.step_size, __fdiv_rn(m, denom)));
}

// One thread per element (grid-stride), the same operations in the same order
// as the host kernel (adamw_element):
//   g = grad * grad_scale; m += (1 - beta1) (g - m); v = v beta2 + (1 - beta2) g^2;
//   p = p (1 - lr wd) - step_size m / (sqrt(v) / bc2_sqrt + eps).
// m, v and p are then stored as M, M and P (bfloat16: stochastically, from
// the Philox block (seed, step, first_index + i), as the host does). T: float,
// snug::bfloat16 or snug::half; `working` may be null.
template <class T, class P, class M>
__global__ void __launch_bounds__(adamw_threads)
    adamw_kernel(P* master,          // (n)
                 T* working,         // (n) or nullptr
                 const float* grad,  // (n)
                 M* m,               // (n)
                 M* v,               // (n)
                 std::int64_t n, ops::AdamWConstants k, int step, ops::AdamWRounding rounding) {
    constexpr bool rounds = !std::is_same_v<P, float> || !std::is_same_v<M, float>;
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
        float m_new = static_cast<float>(m[i]), v_new = static_cast<float>(v[i]);
        const float p = adamw_element(k, static_cast<float>(master[i]), grad[i], m_new, v_new);
        if constexpr (rounds) {
            const Philox4 r = random_block(rounding.seed, static_cast<std::uint64_t>(step),
                                           static_cast<std::uint64_t>(rounding.first_index + i));
            m[i] = store_rounded<M>(m_new, r.v[0]);
            v[i] = store_rounded<M>(v_new, r.v[1]);
            master[i] = store_rounded<P>(p, r.v[2]);
        } else {
            m[i] = m_new;
            v[i] = v_new;
            master[i] = p;
        }
        if (working != nullptr) working[i] = T(static_cast<float>(master[i]));
    }
}

// max_or_nan over the 32 lanes of a full warp (every lane ends with it).
__device__ inline float warp_max_or_nan(float x) {
    for (int offset = warp_size / 2; offset > 0; offset /= 2)
        x = ops::max_or_nan(x, __shfl_xor_sync(0xFFFF'FFFFU, x, offset));
    return x;
}

// 8-bit block-wise moments: a thread block of ops::moment_block threads per
// quantisation block (a grid-stride loop over the blocks), one element per
// thread, as the host's adamw_8bit_block: dequantise, the fp32 update, the
// block's absmax of |m| and v (a NaN-propagating max: order-free, so the
// host's bits), quantise with words 0 and 1 of the element's Philox block,
// p stored as P with word 2. The code tables come by value and are copied to
// shared memory once per thread block.
template <class T, class P>
__global__ void __launch_bounds__(ops::moment_block)
    adamw_8bit_kernel(P* master,                    // (n)
                      T* working,                   // (n) or nullptr
                      const float* grad,            // (n)
                      ops::BlockwiseMoments s,      // codes (n), absmax (moment_blocks(n))
                      std::int64_t n, ops::AdamWConstants k, int step, ops::AdamWRounding rounding,
                      ops::MomentCodes codes) {
    constexpr int warps = ops::moment_block / warp_size;
    struct Shared {
        ops::MomentCodes codes;
        float m_max[warps], v_max[warps];
    };
    Shared& sh = block_shared<Shared>();
    for (int j = threadIdx.x; j < 128; j += blockDim.x) sh.codes.first[j] = codes.first[j];
    for (int j = threadIdx.x; j < 256; j += blockDim.x) sh.codes.second[j] = codes.second[j];
    __syncthreads();
    const int lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
    const std::int64_t blocks = ops::moment_blocks(n);
    for (std::int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
        const std::int64_t i = b * ops::moment_block + threadIdx.x;
        const bool live = i < n;
        float m = 0.0f, v = 0.0f, p = 0.0f;
        if (live) {
            m = ops::dequantize_first(sh.codes, s.m[i], s.m_absmax[b]);
            v = ops::dequantize_second(sh.codes, s.v[i], s.v_absmax[b]);
            p = adamw_element(k, static_cast<float>(master[i]), grad[i], m, v);
        }
        const float m_warp = warp_max_or_nan(fabsf(m)), v_warp = warp_max_or_nan(v);
        if (lane == 0) {
            sh.m_max[warp] = m_warp;
            sh.v_max[warp] = v_warp;
        }
        __syncthreads();
        float m_max = sh.m_max[0], v_max = sh.v_max[0];
        for (int w = 1; w < warps; ++w) {
            m_max = ops::max_or_nan(m_max, sh.m_max[w]);
            v_max = ops::max_or_nan(v_max, sh.v_max[w]);
        }
        __syncthreads();  // m_max and v_max are read before the next block writes them
        const float m_absmax = ops::stored_absmax(m_max), v_absmax = ops::stored_absmax(v_max);
        if (!live) continue;
        if (threadIdx.x == 0) {
            s.m_absmax[b] = m_absmax;
            s.v_absmax[b] = v_absmax;
        }
        const Philox4 r = random_block(rounding.seed, static_cast<std::uint64_t>(step),
                                       static_cast<std::uint64_t>(rounding.first_index + i));
        s.m[i] = ops::quantize_first(sh.codes, m, m_absmax, r.v[0]);
        s.v[i] = ops::quantize_second(sh.codes, v, v_absmax, r.v[1]);
        master[i] = store_rounded<P>(p, r.v[2]);
        if (working != nullptr) working[i] = T(static_cast<float>(master[i]));
    }
}

}  // namespace detail

// AdamW over n parameters (PyTorch semantics: decoupled weight decay
// p *= 1 - lr * weight_decay, then p -= lr * mhat / (sqrt(vhat) + eps) with the
// bias-corrected moments mhat = m / (1 - beta1^step), vhat = v / (1 - beta2^step)).
// The gradient is multiplied by grad_scale first (unscale x clip factor).
// When `working` is not null, working[i] = master[i] rounded to T (nearest
// even) after the update; pass nullptr when the master is the parameter.
// P = bfloat16 (weights with no master copy) and M = bfloat16 (moments) round
// stochastically from `rounding`'s stream (ops::AdamWRounding).
// One pass, elementwise: the host kernel's bits. Throws ShapeError for n < 0
// and ConfigError for step < 1. T: float, snug::bfloat16 or snug::half.
template <FloatStorage T, class P, class M>
    requires OptimizerStateType<P> && OptimizerStateType<M>
void adamw_update(const Device& dev, P* master,  // (n) master weights (fp32), or the bf16 weights themselves
                  T* working,                    // (n) compute copy, or nullptr
                  const float* grad,             // (n)
                  M* m,                          // (n) first moment
                  M* v,                          // (n) second moment
                  std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale, ops::AdamWRounding rounding = {}) {
    ops::check_adamw(n, step);
    if (n == 0) return;
    const ops::AdamWConstants k = ops::adamw_constants(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    launch<detail::adamw_kernel<T, P, M>>(detail::grid_stride_blocks(n, detail::adamw_threads), detail::adamw_threads,
                                          0, dev.stream, master, working, grad, m, v, n, k, step, rounding);
}

// Without a separate compute copy (fp32 weights, or bf16 weights with no
// master): adamw_update(dev, weights, nullptr, ...).
template <class P, class M>
    requires OptimizerStateType<P> && OptimizerStateType<M>
void adamw_update(const Device& dev, P* weights,  // (n)
                  std::nullptr_t,
                  const float* grad,  // (n)
                  M* m,               // (n)
                  M* v,               // (n)
                  std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale, ops::AdamWRounding rounding = {}) {
    adamw_update<float>(dev, weights, static_cast<float*>(nullptr), grad, m, v, n, lr, beta1, beta2, eps,
                        weight_decay, step, grad_scale, rounding);
}

// AdamW with 8-bit block-wise moments (ops/moment_quantization.hpp): the
// update adamw_update computes, from moments dequantised from `moments`
// (blocks of ops::moment_block from element 0 of this call), which then
// holds the new moments, quantised stochastically; P = bfloat16 weights
// without a master round as in adamw_update. The host kernel's bits. Throws
// ShapeError for n < 0 and ConfigError for step < 1.
template <FloatStorage T, class P>
    requires OptimizerStateType<P>
void adamw_update_8bit(const Device& dev, P* master,    // (n) master weights (fp32), or the bf16 weights themselves
                       T* working,                      // (n) compute copy, or nullptr
                       const float* grad,               // (n)
                       ops::BlockwiseMoments moments,   // codes (n), absmax (moment_blocks(n))
                       std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                       float grad_scale, ops::AdamWRounding rounding = {}) {
    ops::check_adamw_8bit(n, step);
    if (n == 0) return;
    const ops::AdamWConstants k = ops::adamw_constants(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>(ops::moment_blocks(n), std::int64_t{1} << 16));
    launch<detail::adamw_8bit_kernel<T, P>>(blocks, ops::moment_block, 0, dev.stream, master, working, grad, moments,
                                            n, k, step, rounding, ops::moment_codes);
}

// Without a separate compute copy (fp32 weights, or bf16 weights with no master).
template <class P>
    requires OptimizerStateType<P>
void adamw_update_8bit(const Device& dev, P* weights,  // (n)
                       std::nullptr_t,
                       const float* grad,  // (n)
                       ops::BlockwiseMoments moments, std::int64_t n, float lr, float beta1, float beta2, float eps,
                       float weight_decay, int step, float grad_scale, ops::AdamWRounding rounding = {}) {
    adamw_update_8bit<float>(dev, weights, static_cast<float*>(nullptr), grad, moments, n, lr, beta1, beta2, eps,
                             weight_decay, step, grad_scale, rounding);
}

}  // namespace snug::cuda
