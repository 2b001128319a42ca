// The CUDA AdamW step: one fused pass over a span of parameters that updates
// the master weights and both moments (fp32, or bf16 rounded stochastically),
// and refreshes the compute copy.
#pragma once

#include "snug/cuda/runtime.hpp"

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
#include "snug/cuda/elementwise.cuh"  // CudaFloat
#include "snug/cuda/norms.cuh"
#include "snug/ops/adamw.hpp"

namespace snug::cuda {

namespace detail {

inline constexpr int adamw_threads = 256;

// One thread per element (grid-stride), the same operations in the same order
// as the host kernel:
//   g = grad * grad_scale; m += (1 - beta1) (g - m); v = v beta2 + (1 - beta2) g^2;
//   p = p (1 - lr wd) - step_size m / (sqrt(v) / bc2_sqrt + eps).
// The __f*_rn intrinsics keep nvcc from fusing a multiply and an add into one
// FMA, so the result is the host's, bit for bit. m, v and p are then stored as
// M, M and P (bfloat16: stochastically, from the Philox block (seed, step,
// first_index + i), as the host does). T: float, snug::bfloat16 or snug::half;
// `working` may be null.
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
        const float g = __fmul_rn(grad[i], k.grad_scale);
        const float m_old = static_cast<float>(m[i]);
        const float m_new = __fadd_rn(m_old, __fmul_rn(k.one_minus_beta1, __fsub_rn(g, m_old)));
        const float v_new =
            __fadd_rn(__fmul_rn(static_cast<float>(v[i]), k.beta2), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v_new), k.bc2_sqrt), k.eps);
        const float p = __fsub_rn(__fmul_rn(static_cast<float>(master[i]), k.decay),
                                  __fmul_rn(k.step_size, __fdiv_rn(m_new, denom)));
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
template <CudaFloat T, class P, class M>
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

}  // namespace snug::cuda
