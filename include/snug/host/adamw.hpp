// The host AdamW step: one fused pass over a span of parameters that updates
// the master weights and both moments (fp32, or bf16 rounded stochastically),
// and refreshes the compute copy.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/core/rng.hpp"
#include "snug/core/stochastic_rounding.hpp"
#include "snug/host/math.hpp"
#include "snug/ops/adamw.hpp"

namespace snug::host {

namespace detail {

// Elements per parallel task: about 28 bytes move per element.
inline constexpr std::int64_t adamw_grain = std::int64_t{1} << 16;

// Elements per tile of adamw_tile: its square roots sit in a stack array.
inline constexpr std::int64_t adamw_tile_size = 256;

// sqrt(x[i]) in place for i < n. A square root inside a longer loop stops
// GCC from vectorising it (without -fno-math-errno the call may set errno),
// so the roots are taken here on their own: 4 at a time with SSE on x86-64
// (correctly rounded, like std::sqrt), one at a time elsewhere.
inline void adamw_sqrt(float* x, std::int64_t n) {
    std::int64_t i = 0;
#if defined(__SSE2__)
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
    for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

// Up to adamw_tile_size elements, with the same operations, in the same
// order, as PyTorch's single-tensor AdamW:
//   grad *= grad_scale; p *= 1 - lr wd; m.lerp_(grad, 1 - beta1);
//   v = v beta2 + (1 - beta2) grad^2; p -= step_size m / (sqrt(v) / bc2_sqrt + eps).
// All of it in fp32 (16-bit state widened exactly); then the new m, v and p
// are stored as M, M and P: unchanged for float, stochastically rounded to
// bfloat16 with the words of Philox block (seed, step, rounding.first_index + i)
// (ops::AdamWRounding). Then working[i] = p[i] rounded to T (nearest even),
// when working is not null.
template <class T, class P, class M>
void adamw_tile(const ops::AdamWConstants& k, P* p, T* working, const float* grad, M* m, M* v, std::int64_t n, int step,
                ops::AdamWRounding rounding) {  // all (n), n <= adamw_tile_size
    float m_new[adamw_tile_size], v_new[adamw_tile_size], root[adamw_tile_size];
    for (std::int64_t i = 0; i < n; ++i) {
        const float g = grad[i] * k.grad_scale;
        const float m_old = static_cast<float>(m[i]);
        m_new[i] = m_old + k.one_minus_beta1 * (g - m_old);
        v_new[i] = static_cast<float>(v[i]) * k.beta2 + k.one_minus_beta2 * g * g;
        root[i] = v_new[i];
    }
    adamw_sqrt(root, n);
    constexpr bool rounds = !std::is_same_v<P, float> || !std::is_same_v<M, float>;
    for (std::int64_t i = 0; i < n; ++i) {
        const float p_new = static_cast<float>(p[i]) * k.decay - k.step_size * (m_new[i] / (root[i] / k.bc2_sqrt + k.eps));
        if constexpr (rounds) {
            const Philox4 r = random_block(rounding.seed, static_cast<std::uint64_t>(step),
                                           static_cast<std::uint64_t>(rounding.first_index + i));
            m[i] = store_rounded<M>(m_new[i], r.v[0]);
            v[i] = store_rounded<M>(v_new[i], r.v[1]);
            p[i] = store_rounded<P>(p_new, r.v[2]);
        } else {
            m[i] = m_new[i];
            v[i] = v_new[i];
            p[i] = p_new;
        }
    }
    if (working != nullptr) {
        for (std::int64_t i = 0; i < n; ++i) working[i] = from_acc<T>(static_cast<float>(p[i]));
    }
}

}  // namespace detail

// AdamW over n parameters (PyTorch semantics: decoupled weight decay
// p *= 1 - lr * weight_decay, then p -= lr * mhat / (sqrt(vhat) + eps) with the
// bias-corrected moments mhat = m / (1 - beta1^step), vhat = v / (1 - beta2^step)).
// The gradient is multiplied by grad_scale first (unscale x clip factor).
// When `working` is not null, working[i] = master[i] rounded to T (nearest
// even) after the update; pass nullptr when the master is the parameter.
// The state may be kept lean: P = bfloat16 updates 16-bit weights with no
// master copy (then working is nullptr), M = bfloat16 keeps bf16 moments;
// both round stochastically from `rounding`'s stream (ops::AdamWRounding),
// after an update computed in fp32 as for fp32 state.
// Elementwise, so the result does not depend on the thread count.
// Throws ShapeError for n < 0 and ConfigError for step < 1.
template <HostFloat T, class P, class M>
    requires OptimizerStateType<P> && OptimizerStateType<M>
void adamw_update(const Device&, P* master,  // (n) master weights (fp32), or the bf16 weights themselves
                  T* working,                // (n) compute copy, or nullptr
                  const float* grad,         // (n)
                  M* m,                      // (n) first moment
                  M* v,                      // (n) second moment
                  std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale, ops::AdamWRounding rounding = {}) {
    ops::check_adamw(n, step);
    const ops::AdamWConstants k = ops::adamw_constants(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    parallel_ranges(n, detail::adamw_grain, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; i += detail::adamw_tile_size) {
            detail::adamw_tile(k, master + i, working == nullptr ? nullptr : working + i, grad + i, m + i, v + i,
                               std::min(detail::adamw_tile_size, end - i), step,
                               ops::AdamWRounding{rounding.seed, rounding.first_index + i});
        }
    });
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

}  // namespace snug::host
