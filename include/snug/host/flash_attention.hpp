// The host flash attention: causal multi-head self-attention on the fused qkv
// (B, T, 3C) that never holds the T x T matrix, following
// snug/ops/flash_attention.hpp to the letter (tiles, online softmax, the
// points where values are rounded to the activation type, the order of every
// sum of the deterministic backward), so that it is the CUDA kernels' oracle.
//
// A forward task owns one tile of flash_tile_q queries of one head and copies
// its tiles (widened to the compute type) into a per-thread workspace of
// O(tile x hs) elements. A backward task owns one whole head and does it in
// one pass over its (key tile, query tile) pairs, s and p computed once per
// pair, with a per-thread workspace of O(T x hs) elements (the head's q, dO
// and an fp32 dQ accumulator): dQ sums over key tiles in the same order as the
// CUDA kernels' second pass, so the results are the same. Tasks multiply on
// their own thread (fp32: OpenBLAS or the portable GEMM's packed kernel, see
// flash_product; double: plain loops); every sum runs in a fixed order, so
// the results do not depend on the number of threads. float and the 16-bit
// types compute in fp32, double in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "snug/core/device.hpp"
#include "snug/host/attention.hpp"
#include "snug/host/gemm.hpp"
#include "snug/host/math.hpp"
#include "snug/host/parallel.hpp"
#include "snug/ops/flash_attention.hpp"

namespace snug::host {

namespace detail {

using flash_index = std::int64_t;

// C (M, N) = alpha op(A) op(B) + beta C in fp32 on the calling thread (sums
// of exact products for 16-bit inputs); C is not read when beta == 0.
// M, N, K > 0. Through OpenBLAS where snug has it and the product is small
// enough that OpenBLAS keeps it on the calling thread (attention's
// attention_small_product: up to 64 x 64 x 64, where it is 1.6x faster than
// the portable kernel, whose packing costs more at this size); through the
// portable GEMM's packed kernel, on this thread, otherwise.
inline void flash_product(Op op_a, Op op_b, flash_index M, flash_index N, flash_index K, float alpha,
                          const float* A, flash_index lda,  // (M, K), or (K, M) when op_a == Op::T
                          const float* B, flash_index ldb,  // (K, N), or (N, K) when op_b == Op::T
                          float beta, float* C, flash_index ldc) {  // (M, N)
#if defined(SNUG_HAVE_CBLAS)
    if (M * N * K <= attention_small_product) {
        const auto trans = [](Op op) { return op == Op::N ? CblasNoTrans : CblasTrans; };
        const auto i = [](flash_index v) { return static_cast<blasint>(v); };
        cblas_sgemm(CblasRowMajor, trans(op_a), trans(op_b), i(M), i(N), i(K), alpha, A, i(lda), B, i(ldb), beta, C,
                    i(ldc));
        return;
    }
#endif
    gemm_blocked_isa(gemm_best_isa(), op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, gemm_scratch());
}

// The same in double, by plain loops (finite-difference tests only).
inline void flash_product(Op op_a, Op op_b, flash_index M, flash_index N, flash_index K, double alpha,
                          const double* A, flash_index lda,  // (M, K), or (K, M) when op_a == Op::T
                          const double* B, flash_index ldb,  // (K, N), or (N, K) when op_b == Op::T
                          double beta, double* C, flash_index ldc) {  // (M, N)
    for (flash_index i = 0; i < M; ++i) {
        double* c = C + i * ldc;
        for (flash_index j = 0; j < N; ++j) {
            double sum = 0.0;
            for (flash_index k = 0; k < K; ++k) {
                sum += (op_a == Op::N ? A[i * lda + k] : A[k * lda + i]) *
                       (op_b == Op::N ? B[k * ldb + j] : B[j * ldb + k]);
            }
            c[j] = alpha * sum + (beta == 0.0 ? 0.0 : beta * c[j]);
        }
    }
}

// x rounded to the activation type T and widened back: the contract's
// round() (nearest even; the identity for float and double).
template <class T, class A>
inline A flash_round(A x) {
    if constexpr (is_16bit_v<T>) {
        return to_float(from_float<T>(x));
    } else {
        return x;
    }
}

// dst (rows, cols), packed, = src's rows widened to the compute type A.
template <class A, class T>
void flash_load(A* dst, const T* src, flash_index ld_src, flash_index rows, flash_index cols) {  // src: (rows, ld_src)
    for (flash_index r = 0; r < rows; ++r) {
        const T* s = src + r * ld_src;
        A* d = dst + r * cols;
        if constexpr (is_16bit_v<T>) {
            for (flash_index i = 0; i < cols; ++i) d[i] = to_float(s[i]);
        } else {
            for (flash_index i = 0; i < cols; ++i) d[i] = s[i];
        }
    }
}

// A tile of rows of a tensor, as the compute type A: where it is and its
// leading dimension.
template <class A>
struct FlashTile {
    const A* data;
    flash_index ld;
};

// Rows [0, rows) x columns [0, cols) of src as A: src itself when T is A
// (float, double: the products read it in place), else widened into buf.
template <class A, class T>
FlashTile<A> flash_tile(A* buf, const T* src, flash_index ld_src, flash_index rows, flash_index cols) {  // src: (rows, ld_src)
    if constexpr (std::is_same_v<A, T>) {
        return {src, ld_src};
    } else {
        flash_load(buf, src, ld_src, rows, cols);
        return {buf, cols};
    }
}

// dst's rows = alpha src (rows, cols) rounded to T once.
template <class T, class A>
void flash_store(T* dst, flash_index ld_dst, const A* src, flash_index rows, flash_index cols, A alpha) {
    for (flash_index r = 0; r < rows; ++r) {
        const A* s = src + r * cols;
        T* d = dst + r * ld_dst;
        if constexpr (is_16bit_v<T>) {
            for (flash_index i = 0; i < cols; ++i) d[i] = from_float<T>(alpha * s[i]);
        } else {
            for (flash_index i = 0; i < cols; ++i) d[i] = alpha * s[i];
        }
    }
}

// A per-thread buffer of at least n elements of A, kept between calls
// (grow-only; O(tile x hs), some hundreds of KiB at hs = 256).
template <class A>
A* flash_workspace(flash_index n) {
    thread_local std::vector<A> buffer;
    if (static_cast<flash_index>(buffer.size()) < n) buffer.resize(static_cast<std::size_t>(n));
    return buffer.data();
}

// The maximum of x[0, n), n >= 1, in independent lanes (vectorises).
template <class A>
A flash_row_max(const A* x, flash_index n) {
    A lane[attention_lanes];
    for (A& m : lane) m = -std::numeric_limits<A>::infinity();
    flash_index j = 0;
    for (; j + attention_lanes <= n; j += attention_lanes) {
        for (int l = 0; l < attention_lanes; ++l) lane[l] = lane[l] < x[j + l] ? x[j + l] : lane[l];
    }
    A max = -std::numeric_limits<A>::infinity();
    for (; j < n; ++j) max = max < x[j] ? x[j] : max;
    for (const A m : lane) max = max < m ? m : max;
    return max;
}

// The sizes every pass shares, and where query head s (sequence s / NH,
// head s % NH) and its key/value head keep their rows: a row of qkv holds NH
// query heads, then KV key heads, then KV value heads (ops/flash_attention.hpp).
struct FlashShape {
    flash_index B, T, C, NH, KV, hs;
    flash_index heads() const { return B * NH; }
    flash_index group() const { return NH / KV; }  // query heads per key/value head
    flash_index ld() const { return C + 2 * KV * hs; }
    flash_index seq_offset(flash_index s) const { return (s / NH) * T * ld(); }
    flash_index q_offset(flash_index s) const { return seq_offset(s) + (s % NH) * hs; }                     // into qkv
    flash_index k_offset(flash_index s) const { return seq_offset(s) + C + (s % NH) / group() * hs; }      // into qkv
    flash_index v_offset(flash_index s) const { return k_offset(s) + KV * hs; }                             // into qkv
    flash_index o_offset(flash_index s) const { return (s / NH) * T * C + (s % NH) * hs; }                 // into out
};

inline flash_index flash_tiles(flash_index T, flash_index tile) { return (T + tile - 1) / tile; }

// The forward pass for the query tile [r0, r0 + nq) of head s, on the calling
// thread.
template <class T, class A>
void flash_forward_tile(T* out,                     // (B, T, C)
                        ops::flash_stat_t<T>* lse,  // (B, NH, T)
                        const T* qkv,               // (B, T, C + 2 KV hs)
                        const FlashShape& sh, flash_index s, flash_index r0) {
    constexpr flash_index bq = ops::flash_tile_q, bk = ops::flash_tile_k;
    const flash_index hs = sh.hs, ld = sh.ld();
    const flash_index nq = std::min(bq, sh.T - r0), r1 = r0 + nq;
    const A scale = A(1) / std::sqrt(A(hs));
    A* q = flash_workspace<A>(3 * bq * hs + 2 * bk * hs + bq * bk + 2 * bq);
    A* acc = q + bq * hs;     // (nq, hs)
    A* k = acc + bq * hs;     // (nk, hs)
    A* v = k + bk * hs;       // (nk, hs)
    A* p = v + bk * hs;       // (nq, bk): s, then round(p)
    A* m = p + bq * bk;       // (nq)
    A* l = m + bq;            // (nq)
    const FlashTile<A> qt = flash_tile(q, qkv + sh.q_offset(s) + r0 * ld, ld, nq, hs);
    std::fill(acc, acc + nq * hs, A(0));
    std::fill(m, m + nq, -std::numeric_limits<A>::infinity());
    std::fill(l, l + nq, A(0));
    for (flash_index k0 = 0; k0 < r1; k0 += bk) {  // key tiles up to the diagonal
        const flash_index nk = std::min(bk, sh.T - k0);
        const FlashTile<A> kt = flash_tile(k, qkv + sh.k_offset(s) + k0 * ld, ld, nk, hs);
        const FlashTile<A> vt = flash_tile(v, qkv + sh.v_offset(s) + k0 * ld, ld, nk, hs);
        flash_product(Op::N, Op::T, nq, nk, hs, scale, qt.data, qt.ld, kt.data, kt.ld, A(0), p, bk);  // s = scale q k^T
        for (flash_index i = 0; i < nq; ++i) {
            A* row = p + i * bk;
            const flash_index valid = std::clamp<flash_index>(r0 + i - k0 + 1, 0, nk);  // keys j <= t
            A* a = acc + i * hs;
            if (valid == 0) {  // no key of this tile is visible: p = 0, nothing changes
                std::fill(row, row + nk, A(0));
                continue;
            }
            const A m_new = std::max(m[i], flash_row_max(row, valid));
            const A rescale = attention_exp(m[i] - m_new);  // e^(-inf) = 0 on the first tile
            for (flash_index j = 0; j < valid; ++j) row[j] = attention_exp(row[j] - m_new);
            const A sum = lane_sum<A, attention_lanes>(valid, [&](flash_index j) { return row[j]; });
            l[i] = l[i] * rescale + sum;
            m[i] = m_new;
            for (flash_index j = 0; j < valid; ++j) row[j] = flash_round<T>(row[j]);
            for (flash_index j = valid; j < nk; ++j) row[j] = A(0);
            for (flash_index c = 0; c < hs; ++c) a[c] *= rescale;
        }
        flash_product(Op::N, Op::N, nq, hs, nk, A(1), p, bk, vt.data, vt.ld, A(1), acc, hs);  // acc += round(p) v
    }
    T* o = out + sh.o_offset(s) + r0 * sh.C;
    ops::flash_stat_t<T>* L = lse + s * sh.T + r0;
    for (flash_index i = 0; i < nq; ++i) {
        A* a = acc + i * hs;
        for (flash_index c = 0; c < hs; ++c) a[c] = a[c] / l[i];
        flash_store(o + i * sh.C, sh.C, a, 1, hs, A(1));
        L[i] = m[i] + std::log(l[i]);
    }
}

// The recomputed probabilities and score gradients of one (query tile, key
// tile) pair of head s: given q, dO (nq, hs), k, v (nk, hs) and the rows'
// lse and D, p (nq, bk) = round(P) and ds (nq, bk) = round(dS) (both 0 for
// keys after the query), as the contract has them.
template <class T, class A>
void flash_scores(A* p, A* ds,  // (nq, bk) each
                  FlashTile<A> q, FlashTile<A> dout, FlashTile<A> k, FlashTile<A> v, const ops::flash_stat_t<T>* lse,
                  const ops::flash_stat_t<T>* D, flash_index nq, flash_index nk, flash_index hs, flash_index r0,
                  flash_index k0, A scale) {
    constexpr flash_index bk = ops::flash_tile_k;
    flash_product(Op::N, Op::T, nq, nk, hs, scale, q.data, q.ld, k.data, k.ld, A(0), p, bk);    // s = scale q k^T
    flash_product(Op::N, Op::T, nq, nk, hs, A(1), dout.data, dout.ld, v.data, v.ld, A(0), ds, bk);  // dp = dO v^T
    for (flash_index i = 0; i < nq; ++i) {
        A* prow = p + i * bk;
        A* drow = ds + i * bk;
        const flash_index valid = std::clamp<flash_index>(r0 + i - k0 + 1, 0, nk);
        const A L = lse[i], d = D[i];
        for (flash_index j = 0; j < valid; ++j) {
            const A pj = attention_exp(prow[j] - L);
            drow[j] = flash_round<T>(pj * (drow[j] - d));
            prow[j] = flash_round<T>(pj);
        }
        for (flash_index j = valid; j < nk; ++j) prow[j] = drow[j] = A(0);
    }
}

// D for the query tile [r0, r0 + nq) of head s: D_t = sum_i dout_t[i] out_t[i].
template <class T, class A>
void flash_d_tile(ops::flash_stat_t<T>* D, const T* dout, const T* out, const FlashShape& sh, flash_index s,
                  flash_index r0) {
    const flash_index nq = std::min<flash_index>(ops::flash_tile_q, sh.T - r0);
    const flash_index hs = sh.hs;
    A* buf = flash_workspace<A>(2 * hs);
    for (flash_index i = 0; i < nq; ++i) {
        const flash_index offset = sh.o_offset(s) + (r0 + i) * sh.C;
        flash_load(buf, dout + offset, hs, 1, hs);
        flash_load(buf + hs, out + offset, hs, 1, hs);
        D[s * sh.T + r0 + i] = lane_sum<A, attention_lanes>(hs, [&](flash_index c) { return buf[c] * buf[hs + c]; });
    }
}

// The backward for key/value head u (sequence u / KV, key/value head u % KV)
// and its G query heads s = first, ..., first + G - 1, on the calling thread,
// in one pass: D for every row of those heads, then for each key tile j in
// order, for each of the query heads in order, for each query tile i from the
// diagonal on in order, s and p recomputed once (flash_scores) and the three
// second products
//   dv_j += round(p)^T dO_i,  dk_j += round(ds)^T q_i,  dq_i += round(ds) k_j
// (five products per tile pair, where a second dQ pass would need seven). Each
// dk_j, dv_j sums over query heads, then query tiles, in order, each dq_i over
// key tiles in order (into an fp32 accumulator per query head), as the
// contract has them. The query heads' q and dO are widened once into the
// workspace (O(G T hs), beside the accumulators: the products read them in
// place), k_j and v_j once per key tile.
template <class T, class A>
void flash_backward_head(T* dqkv, ops::flash_stat_t<T>* D, const T* dout, const T* qkv, const T* out,
                         const ops::flash_stat_t<T>* lse, const FlashShape& sh, flash_index u) {
    constexpr flash_index bq = ops::flash_tile_q, bk = ops::flash_tile_k;
    const flash_index hs = sh.hs, ld = sh.ld(), n = sh.T, G = sh.group();
    const flash_index first = (u / sh.KV) * sh.NH + (u % sh.KV) * G;  // the first query head of u
    for (flash_index h = first; h < first + G; ++h) {  // D, before the workspace below
        for (flash_index r0 = 0; r0 < n; r0 += bq) flash_d_tile<T, A>(D, dout, out, sh, h, r0);
    }
    const A scale = A(1) / std::sqrt(A(hs));
    A* q = flash_workspace<A>(3 * G * n * hs + 4 * bk * hs + 2 * bq * bk);
    A* dO = q + G * n * hs;      // (G, T, hs)
    A* dq = dO + G * n * hs;     // (G, T, hs), unscaled
    A* k = dq + G * n * hs;      // (nk, hs)
    A* v = k + bk * hs;          // (nk, hs)
    A* dk = v + bk * hs;         // (nk, hs), unscaled
    A* dv = dk + bk * hs;        // (nk, hs)
    A* p = dv + bk * hs;         // (nq, bk)
    A* ds = p + bq * bk;         // (nq, bk)
    for (flash_index g = 0; g < G; ++g) {
        flash_load(q + g * n * hs, qkv + sh.q_offset(first + g), ld, n, hs);
        flash_load(dO + g * n * hs, dout + sh.o_offset(first + g), sh.C, n, hs);
    }
    std::fill(dq, dq + G * n * hs, A(0));
    for (flash_index k0 = 0; k0 < n; k0 += bk) {
        const flash_index nk = std::min(bk, n - k0);
        flash_load(k, qkv + sh.k_offset(first) + k0 * ld, ld, nk, hs);
        flash_load(v, qkv + sh.v_offset(first) + k0 * ld, ld, nk, hs);
        std::fill(dk, dk + 2 * bk * hs, A(0));
        for (flash_index g = 0; g < G; ++g) {
            const ops::flash_stat_t<T>* L = lse + (first + g) * n;
            const ops::flash_stat_t<T>* Dh = D + (first + g) * n;
            for (flash_index r0 = k0 / bq * bq; r0 < n; r0 += bq) {
                const flash_index nq = std::min(bq, n - r0);
                const A* qi = q + (g * n + r0) * hs;
                const A* oi = dO + (g * n + r0) * hs;
                A* dqi = dq + (g * n + r0) * hs;
                flash_scores<T>(p, ds, {qi, hs}, {oi, hs}, {k, hs}, {v, hs}, L + r0, Dh + r0, nq, nk, hs, r0, k0,
                                scale);
                flash_product(Op::T, Op::N, nk, hs, nq, A(1), p, bk, oi, hs, A(1), dv, hs);   // dv += round(p)^T dO
                flash_product(Op::T, Op::N, nk, hs, nq, A(1), ds, bk, qi, hs, A(1), dk, hs);  // dk += round(ds)^T q
                flash_product(Op::N, Op::N, nq, hs, nk, A(1), ds, bk, k, hs, A(1), dqi, hs);  // dq += round(ds) k
            }
        }
        flash_store(dqkv + sh.k_offset(first) + k0 * ld, ld, dk, nk, hs, scale);
        flash_store(dqkv + sh.v_offset(first) + k0 * ld, ld, dv, nk, hs, A(1));
    }
    for (flash_index g = 0; g < G; ++g) flash_store(dqkv + sh.q_offset(first + g), ld, dq + g * n * hs, n, hs, scale);
}

// Runs task(s, tile) for every head s and every tile in [0, tiles) on up to
// `threads` threads, the tiles listed from last to first when
// `heavy_last_tiles` (a query tile's work grows with its index) and first to
// last otherwise (a key tile's shrinks), so that the longest tasks start first.
template <class Task>
void flash_for_tiles(flash_index heads, flash_index tiles, bool heavy_last_tiles, unsigned threads, Task&& task) {
    const flash_index n = heads * tiles;
    parallel_for(n, static_cast<unsigned>(std::clamp<flash_index>(n, 1, threads)), [&](flash_index i) {
        const flash_index order = i % tiles;
        task(i / tiles, heavy_last_tiles ? tiles - 1 - order : order);
    });
}

// The forward and backward passes on `threads` threads (the public functions
// use max_threads(); tests compare thread counts). Shapes already checked.
template <HostFloat T>
void flash_attention_forward_run(T* out, ops::flash_stat_t<T>* lse, const T* qkv, const FlashShape& sh,
                                 unsigned threads) {
    using A = acc_t<T>;
    flash_for_tiles(sh.heads(), flash_tiles(sh.T, ops::flash_tile_q), true, threads, [&](flash_index s, flash_index qt) {
        flash_forward_tile<T, A>(out, lse, qkv, sh, s, qt * ops::flash_tile_q);
    });
}

// The backward runs one task per key/value head (sequence, key/value head):
// with fewer of them than threads (B KV < threads) some threads idle; that
// is accepted, so that no sum is split between threads.
template <HostFloat T>
void flash_attention_backward_run(T* dqkv, ops::flash_stat_t<T>* D, const T* dout, const T* qkv, const T* out,
                                  const ops::flash_stat_t<T>* lse, const FlashShape& sh, unsigned threads) {
    using A = acc_t<T>;
    const flash_index kv_heads = sh.B * sh.KV;
    parallel_for(kv_heads, static_cast<unsigned>(std::clamp<flash_index>(kv_heads, 1, threads)), [&](flash_index u) {
        flash_backward_head<T, A>(dqkv, D, dout, qkv, out, lse, sh, u);
    });
}

inline FlashShape flash_shape(int B, int T, int C, int NH, int KV) { return {B, T, C, NH, KV, NH > 0 ? C / NH : 0}; }

}  // namespace detail

// Flash attention, forward: out and the per-row log-sum-exp lse (fp32; double
// for double activations) of causal softmax(q k^T / sqrt(hs)) v, per sequence
// and query head, never holding more than a tile of scores
// (ops/flash_attention.hpp), with KV key/value heads (KV = NH: multi-head).
// Throws ShapeError when B or T is negative, C is not a positive multiple of
// NH, or NH not a multiple of KV.
template <HostFloat T>
void flash_attention_forward(const Device&, T* out,        // (B, T, C)
                             ops::flash_stat_t<T>* lse,    // (B, NH, T)
                             const T* qkv,                 // (B, T, C + 2 KV hs)
                             int B, int T_, int C, int NH, int KV) {
    ops::check_flash_attention("flash_attention_forward", B, T_, C, NH, KV);
    detail::flash_attention_forward_run(out, lse, qkv, detail::flash_shape(B, T_, C, NH, KV), max_threads());
}

// Flash attention, backward: dqkv (overwritten) from dout, the inputs qkv and
// the forward's out and lse. `scratch` receives D = rowsum(dout * out).
// Throws ShapeError as the forward.
template <HostFloat T>
void flash_attention_backward(const Device&, T* dqkv,            // (B, T, C + 2 KV hs) overwritten
                              ops::flash_stat_t<T>* scratch,     // (B, NH, T), D
                              const T* dout,                     // (B, T, C)
                              const T* qkv,                      // (B, T, C + 2 KV hs)
                              const T* out,                      // (B, T, C)
                              const ops::flash_stat_t<T>* lse,   // (B, NH, T)
                              int B, int T_, int C, int NH, int KV) {
    ops::check_flash_attention("flash_attention_backward", B, T_, C, NH, KV);
    detail::flash_attention_backward_run(dqkv, scratch, dout, qkv, out, lse, detail::flash_shape(B, T_, C, NH, KV),
                                         max_threads());
}

// Multi-head attention (KV = NH): qkv (B, T, 3C).
template <HostFloat T>
void flash_attention_forward(const Device& dev, T* out, ops::flash_stat_t<T>* lse, const T* qkv, int B, int T_, int C,
                             int NH) {
    flash_attention_forward(dev, out, lse, qkv, B, T_, C, NH, NH);
}
template <HostFloat T>
void flash_attention_backward(const Device& dev, T* dqkv, ops::flash_stat_t<T>* scratch, const T* dout, const T* qkv,
                              const T* out, const ops::flash_stat_t<T>* lse, int B, int T_, int C, int NH) {
    flash_attention_backward(dev, dqkv, scratch, dout, qkv, out, lse, B, T_, C, NH, NH);
}

}  // namespace snug::host
