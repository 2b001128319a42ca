// The host attention core: causal multi-head self-attention on GPT-2's fused
// qkv tensor, forward (saving the softmax probabilities) and backward.
//
// Per head, as matrix products through the host GEMM (C = alpha A B):
//   forward   S = Q K^T / sqrt(hs), P = causal softmax(S) (the att output),
//             O = P V
//   backward  dP = dO V^T, dS = P * (dP - rowsum(P * dP)) / sqrt(hs),
//             dQ = dS K, dK = dS^T Q, dV = P^T dO
// The T x T products run over blocks of rows, each reaching only the columns
// the causal mask lets through; small heads run in parallel, one per thread,
// large ones one after another with the GEMM and the rows threaded (see
// detail::attention_schedule). fp32 computes in float through `gemm`, double
// (for finite-difference tests) in double through plain loops; 16-bit inputs
// are widened per head and run through the fp32 code, and every 16-bit output
// is rounded once (nearest even) from its fp32 value, so a 16-bit result is the
// fp32 kernel's result on the same (rounded) inputs, rounded.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/host/gemm.hpp"
#include "snug/host/math.hpp"
#include "snug/host/parallel.hpp"
#include "snug/ops/attention.hpp"

namespace snug::host {

namespace detail {

using attn_index = std::int64_t;

// Rows per block of the T x T products: a block of rows [r0, r1) multiplies
// only columns [0, r1), so about half of the upper triangle is never computed.
inline constexpr attn_index attention_row_block = 64;

// e^x for x <= 0 in fp32, branch-free so that a loop of it vectorises:
// exp_parts' 2^n e^r, with 2^n built from the float n + 2^23 + 127, whose
// low mantissa bits are n + 127: no float-to-int conversion, so a NaN or
// -inf argument stays defined behaviour. Below -87.3 (where e^x < FLT_MIN)
// the result is 0; a NaN gives a NaN.
inline float attention_exp(float x) {
    constexpr float lowest = -87.33654F;  // ln(FLT_MIN)
    const auto [n, p] = exp_parts(x);
    const std::uint32_t biased = std::bit_cast<std::uint32_t>(n + (8388608.0F + 127.0F));  // 2^23 + 127 + n
    const float value = p * std::bit_cast<float>(biased << 23);
    // A mask rather than a conditional: GCC gives up on a loop with the latter.
    const std::uint32_t keep = 0U - static_cast<std::uint32_t>(!(x < lowest));
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(value) & keep);
}

inline double attention_exp(double x) { return std::exp(x); }

// Lanes for the row reductions: independent partial results that the
// compiler keeps in vector registers (a single running sum would not
// vectorise without reassociation).
inline constexpr int attention_lanes = 16;

// The causal softmax of one row in place: p[0, n) = softmax(p[0, n)),
// p[n, T) = 0.
template <class A>
void attention_softmax_row(A* p, attn_index n, attn_index T) {  // p: (T)
    A lane_max[attention_lanes];
    for (A& m : lane_max) m = -std::numeric_limits<A>::infinity();
    attn_index j = 0;
    for (; j + attention_lanes <= n; j += attention_lanes) {
        for (int l = 0; l < attention_lanes; ++l) lane_max[l] = lane_max[l] < p[j + l] ? p[j + l] : lane_max[l];
    }
    A max = -std::numeric_limits<A>::infinity();
    for (; j < n; ++j) max = max < p[j] ? p[j] : max;
    for (const A m : lane_max) max = max < m ? m : max;

    for (j = 0; j < n; ++j) p[j] = attention_exp(p[j] - max);
    A lane_sum[attention_lanes] = {};
    j = 0;
    for (; j + attention_lanes <= n; j += attention_lanes) {
        for (int l = 0; l < attention_lanes; ++l) lane_sum[l] += p[j + l];
    }
    A sum = 0;
    for (; j < n; ++j) sum += p[j];
    for (const A s : lane_sum) sum += s;

    const A inv = A(1) / sum;
    for (j = 0; j < n; ++j) p[j] *= inv;
    for (; j < T; ++j) p[j] = A(0);
}

// One row of the softmax backward in place: given P's row p[0, n) and
// dP's row d[0, n), d[j] = scale p[j] (d[j] - sum_k p[k] d[k]) for j < n and
// d[j] = 0 for n <= j < T.
template <class A>
void attention_softmax_backward_row(A* d, const A* p, attn_index n, attn_index T, A scale) {  // d, p: (T)
    A lane_dot[attention_lanes] = {};
    attn_index j = 0;
    for (; j + attention_lanes <= n; j += attention_lanes) {
        for (int l = 0; l < attention_lanes; ++l) lane_dot[l] += p[j + l] * d[j + l];
    }
    A dot = 0;
    for (; j < n; ++j) dot += p[j] * d[j];
    for (const A s : lane_dot) dot += s;

    for (j = 0; j < n; ++j) d[j] = scale * p[j] * (d[j] - dot);
    for (; j < T; ++j) d[j] = A(0);
}

// C = alpha op(A) op(B), overwriting C: fp32 through the host GEMM.
inline void attention_product(Op op_a, Op op_b, attn_index M, attn_index N, attn_index K, float alpha,
                              const float* A, attn_index lda,  // (M, K), or (K, M) when op_a == Op::T
                              const float* B, attn_index ldb,  // (K, N), or (N, K) when op_b == Op::T
                              float* C, attn_index ldc) {      // (M, N)
    gemm(op_a, op_b, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc);
}

// The same in double, by plain loops (only finite-difference tests use it).
inline void attention_product(Op op_a, Op op_b, attn_index M, attn_index N, attn_index K, double alpha,
                              const double* A, attn_index lda,  // (M, K), or (K, M) when op_a == Op::T
                              const double* B, attn_index ldb,  // (K, N), or (N, K) when op_b == Op::T
                              double* C, attn_index ldc) {      // (M, N)
    for (attn_index i = 0; i < M; ++i) {
        double* c = C + i * ldc;
        for (attn_index j = 0; j < N; ++j) c[j] = 0.0;
        for (attn_index k = 0; k < K; ++k) {
            const double a = alpha * (op_a == Op::N ? A[i * lda + k] : A[k * lda + i]);
            for (attn_index j = 0; j < N; ++j) c[j] += a * (op_b == Op::N ? B[k * ldb + j] : B[j * ldb + k]);
        }
    }
}

// Runs the three stages of the attention passes over all heads: first(s) for
// every head s (matrix products), row(s, t) for every row t of every head
// (the softmax part), last(s) for every head. When every product of a head
// is small (attention_row_block x T x hs multiply-adds up to
// attention_small_product, where OpenBLAS and the portable GEMM both stay on
// one thread), whole heads go to the threads, one head per task. Otherwise
// the heads go one by one through first, the rows of all heads are shared
// out in tasks of about 2^15 elements, then last, and the GEMM spreads each
// product over the threads itself (two threads calling a multithreaded
// OpenBLAS at once would wait on each other). Either way each head and each
// row computes the same thing, so the result does not depend on the schedule.
inline constexpr attn_index attention_small_product = attn_index{1} << 18;

template <class First, class Row, class Last>
void attention_schedule(attn_index heads, attn_index T, attn_index hs, First&& first, Row&& row, Last&& last) {
    if (heads > 1 && attention_row_block * T * hs <= attention_small_product) {
        parallel_for(heads, static_cast<unsigned>(std::min<attn_index>(max_threads(), heads)), [&](attn_index s) {
            first(s);
            for (attn_index t = 0; t < T; ++t) row(s, t);
            last(s);
        });
        return;
    }
    for (attn_index s = 0; s < heads; ++s) first(s);
    const attn_index rows = heads * T;
    const attn_index grain = std::max<attn_index>(1, (attn_index{1} << 15) / std::max<attn_index>(T, 1));
    const attn_index tasks = (rows + grain - 1) / grain;
    parallel_for(tasks, static_cast<unsigned>(std::min<attn_index>(max_threads(), tasks)), [&](attn_index task) {
        const attn_index end = std::min(rows, (task + 1) * grain);
        for (attn_index r = task * grain; r < end; ++r) row(r / T, r % T);
    });
    for (attn_index s = 0; s < heads; ++s) last(s);
}

// The forward pass in float or double (A), all heads of all sequences. Head
// s is sequence s / NH, head s % NH.
template <class A>
void attention_forward_core(A* out,        // (B, T, C)
                            A* att,        // (B, NH, T, T)
                            const A* qkv,  // (B, T, 3C)
                            attn_index B, attn_index T, attn_index C, attn_index NH) {
    const attn_index hs = C / NH;
    const attn_index ld = 3 * C;
    const A scale = A(1) / std::sqrt(A(hs));
    auto q_of = [&](attn_index s) { return qkv + (s / NH) * T * ld + (s % NH) * hs; };
    attention_schedule(
        B * NH, T, hs,
        [&](attn_index s) {  // S = scale Q K^T, block rows [r0, r1) against keys [0, r1)
            const A* q = q_of(s);
            A* S = att + s * T * T;
            for (attn_index r0 = 0; r0 < T; r0 += attention_row_block) {
                const attn_index r1 = std::min(T, r0 + attention_row_block);
                attention_product(Op::N, Op::T, r1 - r0, r1, hs, scale, q + r0 * ld, ld, q + C, ld, S + r0 * T, T);
            }
        },
        [&](attn_index s, attn_index t) { attention_softmax_row(att + (s * T + t) * T, t + 1, T); },
        [&](attn_index s) {  // O = P V over the same blocks
            const A* v = q_of(s) + 2 * C;
            const A* P = att + s * T * T;
            A* o = out + (s / NH) * T * C + (s % NH) * hs;
            for (attn_index r0 = 0; r0 < T; r0 += attention_row_block) {
                const attn_index r1 = std::min(T, r0 + attention_row_block);
                attention_product(Op::N, Op::N, r1 - r0, hs, r1, A(1), P + r0 * T, T, v, ld, o + r0 * C, C);
            }
        });
}

// The backward pass in float or double (A); dS lives in `scratch`.
template <class A>
void attention_backward_core(A* dqkv,         // (B, T, 3C)
                             A* scratch,      // (B, NH, T, T)
                             const A* dout,   // (B, T, C)
                             const A* qkv,    // (B, T, 3C)
                             const A* att,    // (B, NH, T, T)
                             attn_index B, attn_index T, attn_index C, attn_index NH) {
    const attn_index hs = C / NH;
    const attn_index ld = 3 * C;
    const A scale = A(1) / std::sqrt(A(hs));
    auto q_of = [&](attn_index s) { return qkv + (s / NH) * T * ld + (s % NH) * hs; };
    auto dout_of = [&](attn_index s) { return dout + (s / NH) * T * C + (s % NH) * hs; };
    attention_schedule(
        B * NH, T, hs,
        [&](attn_index s) {  // dP = dO V^T, causal blocks as in the forward pass
            const A* dO = dout_of(s);
            const A* v = q_of(s) + 2 * C;
            A* dP = scratch + s * T * T;
            for (attn_index r0 = 0; r0 < T; r0 += attention_row_block) {
                const attn_index r1 = std::min(T, r0 + attention_row_block);
                attention_product(Op::N, Op::T, r1 - r0, r1, hs, A(1), dO + r0 * C, C, v, ld, dP + r0 * T, T);
            }
        },
        [&](attn_index s, attn_index t) {
            const attn_index row = (s * T + t) * T;
            attention_softmax_backward_row(scratch + row, att + row, t + 1, T, scale);
        },
        [&](attn_index s) {
            const A* q = q_of(s);
            const A* k = q + C;
            const A* dO = dout_of(s);
            const A* dS = scratch + s * T * T;
            const A* P = att + s * T * T;
            A* dq = dqkv + (s / NH) * T * ld + (s % NH) * hs;
            A* dk = dq + C;
            A* dv = dq + 2 * C;
            for (attn_index r0 = 0; r0 < T; r0 += attention_row_block) {
                const attn_index r1 = std::min(T, r0 + attention_row_block);
                // dQ[r0, r1) = dS[r0, r1)[0, r1) K[0, r1)
                attention_product(Op::N, Op::N, r1 - r0, hs, r1, A(1), dS + r0 * T, T, k, ld, dq + r0 * ld, ld);
                // dK[r0, r1) = dS[r0, T)[r0, r1)^T Q[r0, T), dV[r0, r1) = P[r0, T)[r0, r1)^T dO[r0, T):
                // a query row t sees key r only when t >= r.
                attention_product(Op::T, Op::N, r1 - r0, hs, T - r0, A(1), dS + r0 * T + r0, T, q + r0 * ld, ld,
                                  dk + r0 * ld, ld);
                attention_product(Op::T, Op::N, r1 - r0, hs, T - r0, A(1), P + r0 * T + r0, T, dO + r0 * C, C,
                                  dv + r0 * ld, ld);
            }
        });
}

// fp32 working memory for the 16-bit paths, kept by the calling thread
// between calls (grow-only; freed when it has grown past gemm's limit).
inline ScratchFloats& attention_workspace() {
    thread_local ScratchFloats workspace;
    return workspace;
}

// dst[t * ld_dst + i] = float(src[t * ld_src + i]) for t < rows, i < cols.
template <HostFloat T>
void attention_widen(float* dst, attn_index ld_dst, const T* src, attn_index ld_src, attn_index rows,
                     attn_index cols) {
    for (attn_index t = 0; t < rows; ++t) widen(src + t * ld_src, cols, dst + t * ld_dst);
}

// The reverse, rounding each value to T once (nearest even).
template <HostFloat T>
void attention_narrow(T* dst, attn_index ld_dst, const float* src, attn_index ld_src, attn_index rows,
                      attn_index cols) {
    for (attn_index t = 0; t < rows; ++t) {
        for (attn_index i = 0; i < cols; ++i) dst[t * ld_dst + i] = T(src[t * ld_src + i]);
    }
}

}  // namespace detail

// Causal self-attention, forward. For each sequence b and head h (hs = C / NH
// channels, h * hs .. (h + 1) * hs of each of q, k and v):
//   att[b, h, t, :t+1] = softmax(q_t . k_j / sqrt(hs), j <= t), att[b, h, t, j > t] = 0,
//   out[b, t, h * hs + i] = sum_j att[b, h, t, j] v_j[i].
// fp32 and double compute in place in `out` and `att` (no allocation); a
// 16-bit T runs one head at a time through fp32 copies in a per-thread
// workspace that is kept between calls.
// Throws ShapeError when B or T is negative, or C is not a positive multiple of NH.
template <HostFloat T>
void attention_forward(const Device&, T* out,  // (B, T, C)
                       T* att,                 // (B, NH, T, T)
                       const T* qkv,           // (B, T, 3C)
                       int B, int T_, int C, int NH) {
    ops::check_attention("attention_forward", B, T_, C, NH);
    using detail::attn_index;
    const attn_index Tn = T_, Cn = C;
    if constexpr (!is_16bit_v<T>) {
        detail::attention_forward_core<T>(out, att, qkv, B, Tn, Cn, NH);
    } else {
        const attn_index hs = Cn / NH;
        detail::ScratchFloats& ws = detail::attention_workspace();
        float* qkv_f = ws.get(Tn * 4 * hs + Tn * Tn);  // (T, 3 hs)
        float* out_f = qkv_f + Tn * 3 * hs;             // (T, hs)
        float* att_f = out_f + Tn * hs;                 // (T, T)
        for (attn_index s = 0; s < attn_index{B} * NH; ++s) {
            const attn_index b = s / NH, h = s % NH;
            const T* q = qkv + b * Tn * 3 * Cn + h * hs;
            for (int part = 0; part < 3; ++part) {
                detail::attention_widen(qkv_f + part * hs, 3 * hs, q + part * Cn, 3 * Cn, Tn, hs);
            }
            detail::attention_forward_core<float>(out_f, att_f, qkv_f, 1, Tn, hs, 1);
            detail::attention_narrow(att + s * Tn * Tn, Tn, att_f, Tn, Tn, Tn);
            detail::attention_narrow(out + b * Tn * Cn + h * hs, Cn, out_f, hs, Tn, hs);
        }
        ws.shrink_to(detail::gemm_scratch_keep);
    }
}

// Causal self-attention, backward: dqkv (overwritten) from dout, the inputs
// qkv and the probabilities att saved by attention_forward (whose entries
// above the diagonal must be 0, as attention_forward writes them).
// fp32 and double keep dS in `scratch` (no allocation); a 16-bit T runs one
// head at a time through fp32 copies in a per-thread workspace kept between
// calls, and leaves `scratch` untouched.
// Throws ShapeError when B or T is negative, or C is not a positive multiple of NH.
template <HostFloat T>
void attention_backward(const Device&, T* dqkv,  // (B, T, 3C) overwritten
                        T* scratch,              // (B, NH, T, T) any contents, clobbered
                        const T* dout,           // (B, T, C)
                        const T* qkv,            // (B, T, 3C)
                        const T* att,            // (B, NH, T, T)
                        int B, int T_, int C, int NH) {
    ops::check_attention("attention_backward", B, T_, C, NH);
    using detail::attn_index;
    const attn_index Tn = T_, Cn = C;
    if constexpr (!is_16bit_v<T>) {
        detail::attention_backward_core<T>(dqkv, scratch, dout, qkv, att, B, Tn, Cn, NH);
    } else {
        const attn_index hs = Cn / NH;
        detail::ScratchFloats& ws = detail::attention_workspace();
        float* qkv_f = ws.get(Tn * 7 * hs + 2 * Tn * Tn);  // (T, 3 hs)
        float* dqkv_f = qkv_f + Tn * 3 * hs;               // (T, 3 hs)
        float* dout_f = dqkv_f + Tn * 3 * hs;              // (T, hs)
        float* att_f = dout_f + Tn * hs;                   // (T, T)
        float* scratch_f = att_f + Tn * Tn;                // (T, T)
        for (attn_index s = 0; s < attn_index{B} * NH; ++s) {
            const attn_index b = s / NH, h = s % NH;
            const T* q = qkv + b * Tn * 3 * Cn + h * hs;
            for (int part = 0; part < 3; ++part) {
                detail::attention_widen(qkv_f + part * hs, 3 * hs, q + part * Cn, 3 * Cn, Tn, hs);
            }
            detail::attention_widen(dout_f, hs, dout + b * Tn * Cn + h * hs, Cn, Tn, hs);
            detail::attention_widen(att_f, Tn, att + s * Tn * Tn, Tn, Tn, Tn);
            detail::attention_backward_core<float>(dqkv_f, scratch_f, dout_f, qkv_f, att_f, 1, Tn, hs, 1);
            T* dq = dqkv + b * Tn * 3 * Cn + h * hs;
            for (int part = 0; part < 3; ++part) {
                detail::attention_narrow(dq + part * Cn, 3 * Cn, dqkv_f + part * hs, 3 * hs, Tn, hs);
            }
        }
        ws.shrink_to(detail::gemm_scratch_keep);
    }
}

}  // namespace snug::host
