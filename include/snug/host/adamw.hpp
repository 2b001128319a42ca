// The host AdamW step: one fused pass over a span of parameters that updates
// the master weights and both moments (fp32, bf16 rounded stochastically, or
// 8-bit block-wise: adamw_update_8bit), and refreshes the compute copy.
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
#include "snug/ops/moment_quantization.hpp"

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

// The update of up to adamw_tile_size elements in fp32, with the same
// operations, in the same order, as PyTorch's single-tensor AdamW:
//   grad *= grad_scale; p *= 1 - lr wd; m.lerp_(grad, 1 - beta1);
//   v = v beta2 + (1 - beta2) grad^2; p -= step_size m / (sqrt(v) / bc2_sqrt + eps).
// m and v hold the old moments (widened to fp32) on entry and the new ones on
// return; p_new receives the new weights. Every storage of the state calls it.
template <class P>
void adamw_fp32(const ops::AdamWConstants& k, const P* p, const float* grad, float* m, float* v, float* p_new,
                std::int64_t n) {  // all (n), n <= adamw_tile_size
    float root[adamw_tile_size];
    for (std::int64_t i = 0; i < n; ++i) {
        const float g = grad[i] * k.grad_scale;
        m[i] = m[i] + k.one_minus_beta1 * (g - m[i]);
        v[i] = v[i] * k.beta2 + k.one_minus_beta2 * g * g;
        root[i] = v[i];
    }
    adamw_sqrt(root, n);
    for (std::int64_t i = 0; i < n; ++i)
        p_new[i] = static_cast<float>(p[i]) * k.decay - k.step_size * (m[i] / (root[i] / k.bc2_sqrt + k.eps));
}

// working[i] = p[i] rounded to T (nearest even), when working is not null.
template <class T, class P>
void refresh_working(T* working, const P* p, std::int64_t n) {
    if (working == nullptr) return;
    for (std::int64_t i = 0; i < n; ++i) working[i] = from_acc<T>(static_cast<float>(p[i]));
}

// Up to adamw_tile_size elements with moments stored as M: the update in fp32
// (adamw_fp32), then the new m, v and p stored as M, M and P: unchanged for
// float, stochastically rounded to bfloat16 with the words of Philox block
// (seed, step, rounding.first_index + i) (ops::AdamWRounding); then the
// working copy.
template <class T, class P, class M>
void adamw_tile(const ops::AdamWConstants& k, P* p, T* working, const float* grad, M* m, M* v, std::int64_t n, int step,
                ops::AdamWRounding rounding) {  // all (n), n <= adamw_tile_size
    float m_new[adamw_tile_size], v_new[adamw_tile_size], p_new[adamw_tile_size];
    for (std::int64_t i = 0; i < n; ++i) {
        m_new[i] = static_cast<float>(m[i]);
        v_new[i] = static_cast<float>(v[i]);
    }
    adamw_fp32(k, p, grad, m_new, v_new, p_new, n);
    constexpr bool rounds = !std::is_same_v<P, float> || !std::is_same_v<M, float>;
    for (std::int64_t i = 0; i < n; ++i) {
        if constexpr (rounds) {
            const Philox4 r = random_block(rounding.seed, static_cast<std::uint64_t>(step),
                                           static_cast<std::uint64_t>(rounding.first_index + i));
            m[i] = store_rounded<M>(m_new[i], r.v[0]);
            v[i] = store_rounded<M>(v_new[i], r.v[1]);
            p[i] = store_rounded<P>(p_new[i], r.v[2]);
        } else {
            m[i] = m_new[i];
            v[i] = v_new[i];
            p[i] = p_new[i];
        }
    }
    refresh_working(working, p, n);
}

// One quantisation block of n <= moment_block elements (ops/moment_
// quantization.hpp), `s` pointing at its first code and its absmax: m and v
// dequantised, the update in fp32 (adamw_fp32), the block's new absmax of
// |m| and of v, then m and v quantised with words 0 and 1 of Philox block
// (seed, step, rounding.first_index + i) and p stored as P with word 2; then
// the working copy.
template <class T, class P>
void adamw_8bit_block(const ops::AdamWConstants& k, P* p, T* working, const float* grad, ops::BlockwiseMoments s,
                      std::int64_t n, int step, ops::AdamWRounding rounding) {  // all (n), n <= moment_block
    static_assert(ops::moment_block <= adamw_tile_size);
    const ops::MomentCodes& codes = ops::moment_codes;
    float m_new[adamw_tile_size], v_new[adamw_tile_size], p_new[adamw_tile_size];
    for (std::int64_t i = 0; i < n; ++i) {
        m_new[i] = ops::dequantize_first(codes, s.m[i], *s.m_absmax);
        v_new[i] = ops::dequantize_second(codes, s.v[i], *s.v_absmax);
    }
    adamw_fp32(k, p, grad, m_new, v_new, p_new, n);
    float m_max = 0.0f, v_max = 0.0f;
    for (std::int64_t i = 0; i < n; ++i) {
        m_max = ops::max_or_nan(m_max, std::fabs(m_new[i]));
        v_max = ops::max_or_nan(v_max, v_new[i]);
    }
    const float m_absmax = ops::stored_absmax(m_max), v_absmax = ops::stored_absmax(v_max);
    *s.m_absmax = m_absmax;
    *s.v_absmax = v_absmax;
    for (std::int64_t i = 0; i < n; ++i) {
        const Philox4 r = random_block(rounding.seed, static_cast<std::uint64_t>(step),
                                       static_cast<std::uint64_t>(rounding.first_index + i));
        s.m[i] = ops::quantize_first(codes, m_new[i], m_absmax, r.v[0]);
        s.v[i] = ops::quantize_second(codes, v_new[i], v_absmax, r.v[1]);
        p[i] = store_rounded<P>(p_new[i], r.v[2]);
    }
    refresh_working(working, p, n);
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

// AdamW with 8-bit block-wise moments (ops/moment_quantization.hpp): the
// update adamw_update computes, from moments dequantised from `moments`
// (blocks of ops::moment_block from element 0 of this call), which then
// holds the new moments, quantised with stochastic rounding (words 0 and 1
// of the element's Philox block); P = bfloat16 weights without a master round
// with word 2, as in adamw_update. Blocks are independent, so the result does
// not depend on the thread count. Throws ShapeError for n < 0 and ConfigError
// for step < 1.
template <HostFloat T, class P>
    requires OptimizerStateType<P>
void adamw_update_8bit(const Device&, P* master,          // (n) master weights (fp32), or the bf16 weights themselves
                       T* working,                        // (n) compute copy, or nullptr
                       const float* grad,                 // (n)
                       ops::BlockwiseMoments moments,     // codes (n), absmax (moment_blocks(n))
                       std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                       float grad_scale, ops::AdamWRounding rounding = {}) {
    ops::check_adamw_8bit(n, step);
    const ops::AdamWConstants k = ops::adamw_constants(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    constexpr std::int64_t B = ops::moment_block;
    parallel_ranges(ops::moment_blocks(n), detail::adamw_grain / B, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t b = begin; b < end; ++b) {
            const std::int64_t i = b * B;
            const ops::BlockwiseMoments s{moments.m + i, moments.m_absmax + b, moments.v + i, moments.v_absmax + b};
            detail::adamw_8bit_block(k, master + i, working == nullptr ? nullptr : working + i, grad + i, s,
                                     std::min(B, n - i), step,
                                     ops::AdamWRounding{rounding.seed, rounding.first_index + i});
        }
    });
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

}  // namespace snug::host
