// Flash attention's contract, for every backend: causal multi-head
// self-attention on the fused qkv (B, T, 3C) that never holds the T x T
// matrix (FlashAttention-2, Dao 2023). What both backends compute, so that
// the host kernel is the CUDA kernels' oracle:
//
// Per sequence b and head h (hs = C / NH, scale = 1 / sqrt(hs)), queries in
// tiles of flash_tile_q rows, keys in tiles of flash_tile_k columns, tiles
// beyond the diagonal skipped, and inside the diagonal tile key j > query t
// masked:
//   forward, per query row t, walking key tiles left to right:
//     s_j   = scale (q_t . k_j)                         (fp32 sums of exact products)
//     m'    = max(m, max_j s_j); l = l e^(m - m') + sum_j e^(s_j - m')
//     acc   = acc e^(m - m') + sum_j round(e^(s_j - m')) v_j
//     out_t = round(acc / l), lse_t = m + log(l)        (m, l, acc, lse in fp32)
//   backward, with D_t = sum_i dout_t[i] out_t[i] (fp32, from the stored out):
//     p_tj  = e^(s_tj - lse_t)                          (recomputed, fp32)
//     dp_tj = dout_t . v_j,  ds_tj = p_tj (dp_tj - D_t)
//     dv_j  = sum_t round(p_tj) dout_t
//     dk_j  = scale sum_t round(ds_tj) q_t,   dq_t = scale sum_j round(ds_tj) k_j
// round() is rounding to the activation type (nearest even; none for fp32
// and double): the 16-bit inputs of the second products, as a tensor-core
// kernel feeds them. Each dK/dV sum runs over query tiles in order, each dQ
// sum over key tiles in order, one owner per output row: no atomics, so the
// backward is deterministic. The CUDA kernels compute dQ in a second pass
// that recomputes s and p (about 7 products where an atomic dQ would need 5);
// the host does one pass per head, key tiles outside, with a per-head fp32 dQ
// accumulator (5 products): both sum in the order above, so they agree.
//
// The forward keeps only `out` and one fp32 log-sum-exp per row (B, NH, T);
// the backward needs them, dout, qkv and a (B, NH, T) fp32 scratch for D.
//
// Grouped-query attention (Ainslie et al. 2023): KV key/value heads, NH a
// multiple of KV, each shared by G = NH / KV consecutive query heads. Each
// row of qkv is then (C + 2 KV hs) wide: the NH query heads, the KV key heads,
// the KV value heads; query head h reads key and value head h / G. KV = NH
// is multi-head attention, the layout above. dK and dV of a key/value head
// sum over its G query heads in order, each over its query tiles in order.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "snug/ops/attention.hpp"

namespace snug::ops {

// Tile sizes shared by the backends (the online softmax's rescaling points).
inline constexpr int flash_tile_q = 64;
inline constexpr int flash_tile_k = 64;

// The type of the per-row statistics (lse, D): double for double activations
// (finite-difference tests), fp32 otherwise.
template <class T>
using flash_stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Elements of the per-row statistics: one per sequence, head and position.
inline std::int64_t flash_stat_elems(int B, int T, int NH) { return std::int64_t{B} * NH * T; }

// The width of a row of qkv: C query channels and KV key and value heads of
// hs = C / NH channels each (3C when KV = NH).
inline std::int64_t qkv_width(int C, int NH, int KV) { return C + std::int64_t{2} * KV * (C / NH); }

// The same checks as attention's: non-negative B and T, C a positive
// multiple of NH (ShapeError); and KV positive with NH a multiple of it.
inline void check_flash_attention(const char* op, int B, int T, int C, int NH, int KV) {
    check_attention(op, B, T, C, NH);
    if (KV <= 0 || NH % KV != 0) {
        throw ShapeError(std::string(op) + ": NH = " + std::to_string(NH) +
                         " query heads is not a multiple of KV = " + std::to_string(KV) + " key/value heads");
    }
}
inline void check_flash_attention(const char* op, int B, int T, int C, int NH) {
    check_flash_attention(op, B, T, C, NH, NH);
}

}  // namespace snug::ops
