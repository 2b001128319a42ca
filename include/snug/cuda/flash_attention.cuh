// Flash attention on the CUDA backend (issue #15): causal multi-head
// self-attention on the fused qkv that never holds the T x T matrix, computing
// exactly what ops/flash_attention.hpp specifies (64 x 64 tiles, online
// softmax in fp32, p and ds rounded to T before the second products, one
// log-sum-exp per row, a deterministic two-pass backward), with grouped-query
// attention: KV key/value heads, each shared by G = NH / KV query heads (a
// row of qkv is C + 2 KV hs wide; KV = NH is multi-head attention).
//
// Two implementations of that one contract:
//   - tensor cores, for bf16 and fp16 with hs a multiple of 16 up to 128, in
//     FlashAttention-2's shape (Dao 2023): a block owns 128 rows (8 warps of
//     16), walks 64-row tiles of the other side, and each tile loaded to
//     shared memory (cp.async, 16-byte pieces, the next loading while the
//     tensor cores work on this one) is read by all 8 warps through ldmatrix;
//     every product is an mma.sync m16n8k16 with fp32 accumulation. The
//     scores' accumulator fragments are re-packed as the A fragments of the
//     second product (the register trick): that packing is the contract's
//     round(). The forward holds its queries in registers (so Q's shared
//     memory becomes the second stage of K and V), keeps scores in base 2
//     with the scale folded into the exponent's FMA, and runs the key tiles
//     before the diagonal (no mask) apart from the diagonal's. The head size
//     is a template parameter: exact kernels at 64 and 128; other multiples
//     of 16 run in the 64 or 128 kernel, skipping the channel steps past hs.
//     The backward's shape follows the card's shared memory (device_facts):
//     8 warps and two stages where a block may hold them (every card at
//     hs 64; Hopper at 128), else 4 warps and one stage (hs 128 on sm_86 and
//     sm_89, 99 KiB per block). qkv, dout, out and dqkv must be 16-byte
//     aligned (every snug allocation is).
//   - SIMT, for fp32 and for the heads the tensor-core kernels do not take:
//     a block of 64 threads per tile, one thread per row, plain fp32 FMAs over
//     32-channel blocks staged in shared memory (so any hs fits); each output
//     pass covers 32 channels, recomputing the scores for each pass.
// The backward, either way: a small kernel for D = rowsum(dout * out), then
// dK and dV (one block per key block of a key/value head, walking its G query
// heads in order and for each the query tiles from the diagonal down in
// order) and dQ (one block per query block, walking the key tiles in order).
// Each output row has one owner: no atomics, the same bits every run.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/cuda/async_copy.hpp"
#include "snug/cuda/attention.cuh"  // check_query_rows
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // FloatStorage
#include "snug/cuda/launch.hpp"
#include "snug/cuda/mma.hpp"
#include "snug/cuda/norms.cuh"  // warp_sum
#include "snug/cuda/shared_memory.hpp"
#include "snug/ops/flash_attention.hpp"

namespace snug::cuda {

// Whether flash attention of activation type T and head size hs runs on
// tensor cores (bf16 or fp16, hs a multiple of 16 up to 128); otherwise it
// runs the SIMT kernels.
template <FloatStorage T>
constexpr bool flash_attention_uses_tensor_cores(int hs) {
    return MmaInput<T> && hs > 0 && hs % 16 == 0 && hs <= 128;
}

namespace detail {

// T (every template below): float, snug::bfloat16 or snug::half.
// S (tensor-core kernels): the kernel's FlashShape (head size, warps, stages).

inline constexpr int flash_tile = ops::flash_tile_q;
static_assert(ops::flash_tile_q == ops::flash_tile_k,
              "the kernels pair query tile i with key tile i on the diagonal");
static_assert(flash_tile == 64, "the tensor-core kernels assume key tiles of 8 fragments of 8 keys");
inline constexpr int flash_pad = 8;                       // elements after each shared row (bank spread, 16-byte rows)
inline constexpr int flash_chunk = 32;                    // SIMT kernels: channels per shared block and per pass
inline constexpr int flash_d_rows = 8;                    // D kernel: rows (warps) per block
inline constexpr unsigned full_warp = 0xFFFF'FFFFU;

// The contract's round(): to T and back (nothing for fp32).
template <class T>
__device__ inline float flash_round(float x) {
    if constexpr (std::is_same_v<T, float>) {
        return x;
    } else {
        return static_cast<float>(T(x));
    }
}

// What a block of a grid of heads * tiles blocks works on (heads: B NH query
// heads, or B KV key/value heads for dK and dV). Blocks run tile by tile,
// heads inside: with `high_first` the highest tile (a query tile's most key
// tiles) comes first, otherwise the lowest (a key tile's most query tiles),
// so the longest blocks start first.
struct FlashBlock {
    std::int64_t b, h, bh;
    int tile;
};

// In 32-bit arithmetic (the grid, B NH or B KV times the tiles, holds fewer
// than 2^31 blocks), so no 64-bit division routine is called. NH: the heads
// per sequence the grid counts.
__device__ inline FlashBlock flash_block(int tiles, int NH, bool high_first) {
    const unsigned heads = gridDim.x / static_cast<unsigned>(tiles);
    const unsigned i = blockIdx.x / heads;
    const unsigned bh = blockIdx.x - i * heads;
    const auto nh = static_cast<unsigned>(NH);
    const int tile = static_cast<int>(i);
    return {bh / nh, bh % nh, bh, high_first ? tiles - 1 - tile : tile};
}

// The width of a row of qkv (and dqkv): C query channels, then KV key heads
// and KV value heads of hs channels (ops::qkv_width; below 2^31, checked on
// the host, so summed in int: ptxas keeps fewer registers for the products
// of row numbers with it). Query head h reads key head g = h / G (G = NH /
// KV) at channel C + g hs and value head g at C + KV hs + g hs. The kernels
// take both KV and G, so that none divides twice; unsigned, the one division
// is the cheaper routine.
__device__ inline std::int64_t flash_ld(int C, int hs, int KV) { return C + 2 * KV * hs; }
__device__ inline int flash_kv_head(std::int64_t h, int G) {
    return static_cast<int>(static_cast<unsigned>(h) / static_cast<unsigned>(G));
}

// ---- SIMT kernels (any T, any hs) ---------------------------------------------------

// A block of flash_tile rows x flash_chunk channels in fp32, one row per thread.
struct FlashBlockTile {
    float v[flash_tile][flash_chunk + 1];
};

// dst[r][d] = src[r ld + d] for r < rows, d < cols, else 0 (so padding adds
// exact zeros). All threads of the block; the caller places the barriers.
template <class T>
__device__ void flash_load_block(FlashBlockTile& dst, const T* src, std::int64_t ld, int rows, int cols) {
    for (int i = static_cast<int>(threadIdx.x); i < flash_tile * flash_chunk; i += static_cast<int>(blockDim.x)) {
        const int r = i / flash_chunk, d = i % flash_chunk;
        dst.v[r][d] = r < rows && d < cols ? static_cast<float>(src[r * ld + d]) : 0.0f;
    }
}

// acc[i] += a[r] . b[i] over the block's channels, for i < flash_tile: the
// fp32 sums of the contract's products, channel by channel.
__device__ inline void flash_dot_block(float (&acc)[flash_tile], const FlashBlockTile& a, int r,
                                       const FlashBlockTile& b) {
    for (int d = 0; d < flash_chunk; ++d) {
        const float x = a.v[r][d];
#pragma unroll
        for (int i = 0; i < flash_tile; ++i) acc[i] += x * b.v[i][d];
    }
}

// acc[d] += w[i] rows[i][d] over i < flash_tile, d < flash_chunk.
__device__ inline void flash_weighted_rows(float (&acc)[flash_chunk], const float (&w)[flash_tile],
                                           const FlashBlockTile& rows) {
#pragma unroll
    for (int i = 0; i < flash_tile; ++i) {
#pragma unroll
        for (int d = 0; d < flash_chunk; ++d) acc[d] += w[i] * rows.v[i][d];
    }
}

// Forward, one block of flash_tile threads per (b, h, query tile), thread r
// on query row t = q0 + r. For each pass over 32 output channels c0, the key
// tiles left to right: s (64 scores) from 32-channel blocks of Q and K, the
// online softmax, then acc += round(p) V[:, c0 .. c0 + 31].
template <class T>
__global__ void __launch_bounds__(flash_tile)
    flash_forward_simt_kernel(T* out,        // (B, T, C)
                              float* lse,    // (B, NH, T)
                              const T* qkv,  // (B, T, C + 2 KV hs)
                              int T_, int C, int NH, int KV, int G) {
    struct Tiles {
        FlashBlockTile q, k, v;
    };
    Tiles& sh = block_shared<Tiles>();
    const int hs = C / NH;
    const int tiles = (T_ + flash_tile - 1) / flash_tile;
    const FlashBlock blk = flash_block(tiles, NH, true);
    const int r = static_cast<int>(threadIdx.x);
    const int q0 = blk.tile * flash_tile, t = q0 + r;
    const std::int64_t ld = flash_ld(C, hs, KV);
    const int g = flash_kv_head(blk.h, G);
    const T* seq = qkv + blk.b * T_ * ld + blk.h * hs;  // q of row 0 of this sequence and head
    const T* keys = qkv + blk.b * T_ * ld + C + g * hs;  // k of row 0 of its key/value head; v KV hs on
    const int v_at = KV * hs;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));

    for (int c0 = 0; c0 < hs; c0 += flash_chunk) {
        float m = -INFINITY, l = 0.0f;
        float acc[flash_chunk] = {};
        for (int kt = 0; kt <= blk.tile; ++kt) {
            const int k0 = kt * flash_tile;
            float s[flash_tile] = {};
            for (int d0 = 0; d0 < hs; d0 += flash_chunk) {
                flash_load_block(sh.q, seq + q0 * ld + d0, ld, T_ - q0, hs - d0);
                flash_load_block(sh.k, keys + k0 * ld + d0, ld, T_ - k0, hs - d0);
                __syncthreads();
                flash_dot_block(s, sh.q, r, sh.k);
                __syncthreads();
            }
            float row_max = m;
#pragma unroll
            for (int j = 0; j < flash_tile; ++j) {
                s[j] = k0 + j > t ? -INFINITY : scale * s[j];
                row_max = fmaxf(row_max, s[j]);
            }
            const float alpha = expf(m - row_max);  // 0 on the first tile (m = -inf)
            l *= alpha;
#pragma unroll
            for (int d = 0; d < flash_chunk; ++d) acc[d] *= alpha;
#pragma unroll
            for (int j = 0; j < flash_tile; ++j) {
                const float p = expf(s[j] - row_max);  // 0 where masked
                l += p;
                s[j] = flash_round<T>(p);
            }
            m = row_max;
            flash_load_block(sh.v, keys + k0 * ld + v_at + c0, ld, T_ - k0, hs - c0);
            __syncthreads();
            flash_weighted_rows(acc, s, sh.v);
            __syncthreads();
        }
        if (t < T_) {
            T* o = out + (blk.b * T_ + t) * C + blk.h * hs + c0;
            for (int d = 0; d < flash_chunk && c0 + d < hs; ++d) o[d] = T(acc[d] / l);
            if (c0 == 0) lse[blk.bh * T_ + t] = m + logf(l);
        }
    }
}

// dK and dV, one block of flash_tile threads per (b, key/value head g, key
// tile), thread r on key row j = k0 + r. For each pass over 32 output
// channels, the G query heads of g in order, and for each the query tiles
// from the diagonal on, in order: s and dp (64 query rows each) from
// 32-channel blocks of Q, K, dO and V, then p = e^(s - lse), ds = p (dp - D)
// and dv += round(p) dO, dk += round(ds) Q over the pass's channels.
template <class T>
__global__ void __launch_bounds__(flash_tile)
    flash_backward_key_simt_kernel(T* dqkv,          // (B, T, C + 2 KV hs) k and v parts written
                                   const T* dout,    // (B, T, C)
                                   const T* qkv,     // (B, T, C + 2 KV hs)
                                   const float* lse, // (B, NH, T)
                                   const float* D,   // (B, NH, T)
                                   int T_, int C, int NH, int KV, int G) {
    struct Tiles {
        FlashBlockTile q, k, o, v;
        float lse[flash_tile], D[flash_tile];
    };
    Tiles& sh = block_shared<Tiles>();
    const int hs = C / NH;
    const int tiles = (T_ + flash_tile - 1) / flash_tile;
    const FlashBlock blk = flash_block(tiles, KV, false);  // blk.h: the key/value head
    const int r = static_cast<int>(threadIdx.x);
    const int k0 = blk.tile * flash_tile, j = k0 + r;
    const std::int64_t ld = flash_ld(C, hs, KV);
    const int h0 = static_cast<int>(blk.h) * G;  // its first query head
    const T* seq = qkv + blk.b * T_ * ld + h0 * hs;          // q of head h0
    const T* keys = qkv + blk.b * T_ * ld + C + blk.h * hs;  // k; v KV hs on
    const T* dO = dout + blk.b * T_ * C + h0 * hs;
    const std::int64_t stats = (blk.b * NH + h0) * T_;       // head h0's lse and D
    const int v_at = KV * hs;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));

    for (int c0 = 0; c0 < hs; c0 += flash_chunk) {
        float dk[flash_chunk] = {}, dv[flash_chunk] = {};
        for (int n = 0; n < G; ++n) {  // query head h0 + n
            const T* q_n = seq + n * hs;
            const T* dO_n = dO + n * hs;
            const std::int64_t stats_n = stats + std::int64_t{n} * T_;
            for (int qt = blk.tile; qt < tiles; ++qt) {
                const int q0 = qt * flash_tile;
                float s[flash_tile] = {}, dp[flash_tile] = {};
                for (int d0 = 0; d0 < hs; d0 += flash_chunk) {
                    flash_load_block(sh.q, q_n + q0 * ld + d0, ld, T_ - q0, hs - d0);
                    flash_load_block(sh.k, keys + k0 * ld + d0, ld, T_ - k0, hs - d0);
                    flash_load_block(sh.o, dO_n + q0 * std::int64_t{C} + d0, C, T_ - q0, hs - d0);
                    flash_load_block(sh.v, keys + k0 * ld + v_at + d0, ld, T_ - k0, hs - d0);
                    if (d0 == 0) {
                        const bool in = q0 + r < T_;
                        sh.lse[r] = in ? lse[stats_n + q0 + r] : 0.0f;
                        sh.D[r] = in ? D[stats_n + q0 + r] : 0.0f;
                    }
                    __syncthreads();
                    flash_dot_block(s, sh.k, r, sh.q);
                    flash_dot_block(dp, sh.v, r, sh.o);
                    __syncthreads();
                }
#pragma unroll
                for (int i = 0; i < flash_tile; ++i) {
                    const int t = q0 + i;
                    const float p = t < T_ && j <= t ? expf(scale * s[i] - sh.lse[i]) : 0.0f;
                    s[i] = flash_round<T>(p);
                    dp[i] = flash_round<T>(p * (dp[i] - sh.D[i]));
                }
                flash_load_block(sh.q, q_n + q0 * ld + c0, ld, T_ - q0, hs - c0);
                flash_load_block(sh.o, dO_n + q0 * std::int64_t{C} + c0, C, T_ - q0, hs - c0);
                __syncthreads();
                flash_weighted_rows(dv, s, sh.o);
                flash_weighted_rows(dk, dp, sh.q);
                __syncthreads();
            }
        }
        if (j < T_) {
            T* dst = dqkv + (blk.b * T_ + j) * ld + C + blk.h * hs + c0;
            for (int d = 0; d < flash_chunk && c0 + d < hs; ++d) {
                dst[d] = T(scale * dk[d]);
                dst[v_at + d] = T(dv[d]);
            }
        }
    }
}

// dQ, one block of flash_tile threads per (b, h, query tile), thread r on
// query row t = q0 + r. For each pass over 32 output channels, the key tiles
// up to the diagonal, in order: s and dp (64 keys each), p, ds, then
// dq += round(ds) K over the pass's channels.
template <class T>
__global__ void __launch_bounds__(flash_tile)
    flash_backward_query_simt_kernel(T* dqkv,          // (B, T, C + 2 KV hs) q part written
                                     const T* dout,    // (B, T, C)
                                     const T* qkv,     // (B, T, C + 2 KV hs)
                                     const float* lse, // (B, NH, T)
                                     const float* D,   // (B, NH, T)
                                     int T_, int C, int NH, int KV, int G) {
    struct Tiles {
        FlashBlockTile q, k, o, v;
    };
    Tiles& sh = block_shared<Tiles>();
    const int hs = C / NH;
    const int tiles = (T_ + flash_tile - 1) / flash_tile;
    const FlashBlock blk = flash_block(tiles, NH, true);
    const int r = static_cast<int>(threadIdx.x);
    const int q0 = blk.tile * flash_tile, t = q0 + r;
    const std::int64_t ld = flash_ld(C, hs, KV);
    const int g = flash_kv_head(blk.h, G);
    const T* seq = qkv + blk.b * T_ * ld + blk.h * hs;
    const T* keys = qkv + blk.b * T_ * ld + C + g * hs;  // k; v KV hs on
    const int v_at = KV * hs;
    const T* dO = dout + blk.b * T_ * C + blk.h * hs;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const float lse_t = t < T_ ? lse[blk.bh * T_ + t] : 0.0f;
    const float D_t = t < T_ ? D[blk.bh * T_ + t] : 0.0f;

    for (int c0 = 0; c0 < hs; c0 += flash_chunk) {
        float dq[flash_chunk] = {};
        for (int kt = 0; kt <= blk.tile; ++kt) {
            const int k0 = kt * flash_tile;
            float s[flash_tile] = {}, dp[flash_tile] = {};
            for (int d0 = 0; d0 < hs; d0 += flash_chunk) {
                flash_load_block(sh.q, seq + q0 * ld + d0, ld, T_ - q0, hs - d0);
                flash_load_block(sh.k, keys + k0 * ld + d0, ld, T_ - k0, hs - d0);
                flash_load_block(sh.o, dO + q0 * std::int64_t{C} + d0, C, T_ - q0, hs - d0);
                flash_load_block(sh.v, keys + k0 * ld + v_at + d0, ld, T_ - k0, hs - d0);
                __syncthreads();
                flash_dot_block(s, sh.q, r, sh.k);
                flash_dot_block(dp, sh.o, r, sh.v);
                __syncthreads();
            }
#pragma unroll
            for (int j = 0; j < flash_tile; ++j) {
                const float p = t < T_ && k0 + j <= t ? expf(scale * s[j] - lse_t) : 0.0f;
                s[j] = flash_round<T>(p * (dp[j] - D_t));
            }
            flash_load_block(sh.k, keys + k0 * ld + c0, ld, T_ - k0, hs - c0);
            __syncthreads();
            flash_weighted_rows(dq, s, sh.k);
            __syncthreads();
        }
        if (t < T_) {
            T* dst = dqkv + (blk.b * T_ + t) * ld + blk.h * hs + c0;
            for (int d = 0; d < flash_chunk && c0 + d < hs; ++d) dst[d] = T(scale * dq[d]);
        }
    }
}

// ---- D = rowsum(dout * out), both paths -----------------------------------------------

// One warp per row (b, h, t), lanes on consecutive channels.
template <class T>
__global__ void __launch_bounds__(32 * flash_d_rows)
    flash_backward_d_kernel(float* D,        // (B, NH, T)
                            const T* dout,   // (B, T, C)
                            const T* out,    // (B, T, C)
                            int T_, int C, int NH, int rows) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int row = static_cast<int>(blockIdx.x) * flash_d_rows + static_cast<int>(threadIdx.x / 32);
    if (row >= rows) return;  // whole warps leave together
    const int hs = C / NH;
    const std::int64_t bh = row / T_, t = row - bh * T_;
    const std::int64_t b = bh / NH, h = bh - b * NH;
    const std::int64_t at = (b * T_ + t) * C + h * hs;
    float sum = 0.0f;
    for (int d = lane; d < hs; d += 32) sum += static_cast<float>(dout[at + d]) * static_cast<float>(out[at + d]);
    sum = warp_sum(sum);
    if (lane == 0) D[row] = sum;
}

// ---- tensor-core kernels (bf16, fp16; hs a multiple of 16 up to 128) ----------------------

// A tensor-core kernel's shape, a stateless policy the launcher picks:
//   HS:     the head size the kernel is compiled for: exactly hs (Exact), or
//           the capacity of a kernel that takes any multiple of 16 below it,
//           skipping the channel steps past hs at run time.
//   Warps:  warps per block, each owning 16 rows: of queries in the forward
//           and dQ, of keys in dK and dV (so a block owns 16 Warps rows).
//   Stages: shared buffers of the 64-row tiles the block walks (K and V in
//           the forward and dQ; Q and dO in dK and dV): with two, the next
//           tile loads while this one is used; with one, the load waits.
// Shared rows hold HS elements and flash_pad more (so ldmatrix's 8 rows of
// 16 bytes fall in different banks and every row stays 16-byte aligned).
template <int HS, bool Exact, int Warps, int Stages>
struct FlashShape {
    static constexpr int hs = HS;
    static constexpr bool exact = Exact;
    static constexpr int warps = Warps;
    static constexpr int stages = Stages;
    static constexpr int threads = 32 * Warps;
    static constexpr int rows = 16 * Warps;                    // rows a block owns
    static constexpr int stride = HS + flash_pad;              // elements per shared row
    static constexpr int walk_tile = ops::flash_tile_k * stride;  // elements of one walked tile (64 rows)
    static constexpr int diagonal = rows / ops::flash_tile_k;  // walked tiles that cross the block's diagonal
    static_assert(HS % 16 == 0 && HS >= 16 && HS <= 128, "head sizes are multiples of 16 up to 128");
    static_assert(Warps == 4 || Warps == 8, "a block owns one or two 64-row tiles");
    static_assert(Stages == 1 || Stages == 2, "one or two stages");
};

// Whether channel step `channel0` (a multiple of 8 or 16) lies within the
// head: always in an exact kernel, so the check compiles away there.
template <class S>
__device__ inline bool flash_channels_used(int channel0, int hs) {
    return S::exact || channel0 < hs;
}

inline constexpr float flash_log2e = 1.4426950408889634f;
inline constexpr float flash_ln2 = 0.6931471805599453f;

// 2^x on the special function unit (ex2.approx.ftz.f32: within 2 ulp,
// results below 2^-126 flushed to 0, 2^-inf = 0): one instruction, where
// exp2f adds a rescaling for subnormal results. Emulated the same way.
__device__ __forceinline__ float flash_exp2(float x) {
#if defined(SNUG_CUDA_EMULATED)
    return x < -126.0f ? 0.0f : exp2f(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#endif
}

// One thread's share of copying tiles of Rows rows and the head's channels
// into shared memory by cp.async in 16-byte pieces, unrolled, its source
// offsets worked out once: the thread copies piece column() of rows row(),
// row() + step, ... All threads of the block call it alike; the caller
// commits and waits.
template <class S, int Rows>
struct FlashTileCopy {
    static constexpr int pieces = S::hs / 8;          // 16-byte pieces per row
    static constexpr int step = S::threads / pieces;  // rows between a thread's pieces
    static constexpr int count = Rows / step;         // pieces per thread
    static_assert(S::threads % pieces == 0 && Rows % step == 0, "the block's threads cover the tile evenly");

    std::int64_t src;       // the thread's first piece's offset in the source tile (elements)
    std::int64_t src_step;  // step rows of the source

    __device__ explicit FlashTileCopy(std::int64_t ld) : src(row() * ld + column()), src_step(step * ld) {}

    // The thread's first row and its piece's first channel (from threadIdx
    // at each use: cheaper than registers held through the walk).
    __device__ static int row() { return static_cast<int>(threadIdx.x) / pieces; }
    __device__ static int column() { return 8 * (static_cast<int>(threadIdx.x) % pieces); }

    // Issues the copies of rows 0 .. Rows - 1 of `tile` (leading dimension
    // ld; rows >= 1 of them valid) into `shared`, zeros for rows >= rows;
    // hs: the head's channels (the pieces past them are not copied).
    template <class T>
    __device__ void operator()(T* shared, const T* tile, int rows, int hs) const {
        if (!flash_channels_used<S>(column(), hs)) return;
        const int r = row();
        T* dst = shared + r * S::stride + column();
#pragma unroll
        for (int j = 0; j < count; ++j) {
            const bool in = r + j * step < rows;
            cp_async<16>(dst + j * step * S::stride, in ? tile + src + j * src_step : tile, in);
        }
    }
};

// Issues the copies of the fp32 statistics lse and D of `rows` (>= 1) query
// rows, zeros past them, into 2 x 64 floats of shared memory (lse, then D):
// threads 0 .. 127, one value each.
__device__ inline void flash_copy_stats(float* dst, const float* lse, const float* D, int rows) {
    const int t = static_cast<int>(threadIdx.x), r = t % ops::flash_tile_k;
    const float* src = t < ops::flash_tile_k ? lse : D;
    if (t < 2 * ops::flash_tile_k) cp_async<4>(dst + t, src + (r < rows ? r : 0), r < rows);
}

// Two adjacent elements of a row, p[0] = a and p[1] = b (p 4-byte aligned):
// one 32-bit store on the device.
template <class T>
__device__ inline void flash_store2(T* p, float a, float b) {
#if defined(SNUG_CUDA_EMULATED)
    p[0] = T(a);
    p[1] = T(b);
#else
    *reinterpret_cast<std::uint32_t*>(p) = pack2(T(a), T(b));
#endif
}

// The A fragment of rows row0 .. row0 + 15, channels 16 kk .. 16 kk + 15 of
// a shared tile.
template <int Stride, class T>
__device__ inline FragmentA flash_fragment_a(const T* tile, int row0, int kk, int lane) {
    FragmentA a;
    ldmatrix_x4(a.x, tile + (row0 + lane % 16) * Stride + 16 * kk + 8 * (lane / 16));
    return a;
}

// The B fragments of n-blocks nb and nb + 1 for a product with a tile's rows
// as the columns (X Yᵀ, Y's rows 8 nb .. 8 nb + 15 from the shared tile),
// channels 16 kk .. 16 kk + 15: lanes 8i .. 8i + 7 address matrix i (rows
// 8 nb + 8 (i / 2) + 0..7, channels 16 kk + 8 (i % 2)).
template <int Stride, class T>
__device__ inline void flash_fragments_bt(FragmentB& b0, FragmentB& b1, const T* tile, int nb, int kk, int lane) {
    std::uint32_t r[4];
    ldmatrix_x4(r, tile + (8 * nb + 8 * (lane / 16) + lane % 8) * Stride + 16 * kk + 8 * ((lane / 8) % 2));
    b0 = FragmentB{{r[0], r[1]}};
    b1 = FragmentB{{r[2], r[3]}};
}

// The B fragments of n-blocks nb and nb + 1 for a product with a tile as the
// right factor (X Y, Y's rows 16 kk .. 16 kk + 15, channels 8 nb .. 8 nb + 15),
// by ldmatrix.trans: lanes 8i .. 8i + 7 address matrix i (rows 16 kk +
// 8 (i % 2) + 0..7, channels 8 nb + 8 (i / 2)).
template <int Stride, class T>
__device__ inline void flash_fragments_b(FragmentB& b0, FragmentB& b1, const T* tile, int nb, int kk, int lane) {
    std::uint32_t r[4];
    ldmatrix_x4_trans(r, tile + (16 * kk + 8 * ((lane / 8) % 2) + lane % 8) * Stride + 8 * nb + 8 * (lane / 16));
    b0 = FragmentB{{r[0], r[1]}};
    b1 = FragmentB{{r[2], r[3]}};
}

// The A fragment of columns 16 kk .. 16 kk + 15 of a 16 x 64 accumulator
// (fragments c[2 kk], c[2 kk + 1]), each value rounded to T: the register
// trick, and the contract's round().
template <class T>
__device__ inline FragmentA flash_repack(const FragmentC (&c)[ops::flash_tile_k / 8], int kk) {
    const FragmentC& lo = c[2 * kk];
    const FragmentC& hi = c[2 * kk + 1];
    return FragmentA{{pack2(T(lo.x[0]), T(lo.x[1])), pack2(T(lo.x[2]), T(lo.x[3])), pack2(T(hi.x[0]), T(hi.x[1])),
                      pack2(T(hi.x[2]), T(hi.x[3]))}};
}

// The A fragments of a warp's 16 rows of a shared tile, from row row0, over
// the head's channels (those past hs left zero).
template <class S, class T>
__device__ inline void flash_load_rows(FragmentA (&a)[S::hs / 16], const T* tile, int row0, int hs, int lane) {
#pragma unroll
    for (int kk = 0; kk < S::hs / 16; ++kk) {
        a[kk] = FragmentA{};
        if (flash_channels_used<S>(16 * kk, hs)) a[kk] = flash_fragment_a<S::stride>(tile, row0, kk, lane);
    }
}

// acc[nb] += A Bᵀ over the head's channels: A the warp's 16 rows (fragments
// `a`), B the 64 rows of the shared tile `b`: a 16 x 64 product (scores; dO
// Vᵀ; K Qᵀ; V dOᵀ).
template <class S, class T>
__device__ inline void flash_mma_abt(FragmentC (&acc)[ops::flash_tile_k / 8], const FragmentA (&a)[S::hs / 16],
                                     const T* b, int hs, int lane) {
#pragma unroll
    for (int kk = 0; kk < S::hs / 16; ++kk) {
        if (!flash_channels_used<S>(16 * kk, hs)) continue;  // the same for the whole warp
#pragma unroll
        for (int nb = 0; nb < ops::flash_tile_k / 8; nb += 2) {
            FragmentB b0, b1;
            flash_fragments_bt<S::stride>(b0, b1, b, nb, kk, lane);
            mma_m16n8k16<T>(acc[nb], a[kk], b0, acc[nb]);
            mma_m16n8k16<T>(acc[nb + 1], a[kk], b1, acc[nb + 1]);
        }
    }
}

// The same with A the 16 rows from row0 of a shared tile.
template <class S, class T>
__device__ inline void flash_mma_abt(FragmentC (&acc)[ops::flash_tile_k / 8], const T* a, int row0, const T* b,
                                     int hs, int lane) {
#pragma unroll
    for (int kk = 0; kk < S::hs / 16; ++kk) {
        if (!flash_channels_used<S>(16 * kk, hs)) break;
        const FragmentA fa = flash_fragment_a<S::stride>(a, row0, kk, lane);
#pragma unroll
        for (int nb = 0; nb < ops::flash_tile_k / 8; nb += 2) {
            FragmentB b0, b1;
            flash_fragments_bt<S::stride>(b0, b1, b, nb, kk, lane);
            mma_m16n8k16<T>(acc[nb], fa, b0, acc[nb]);
            mma_m16n8k16<T>(acc[nb + 1], fa, b1, acc[nb + 1]);
        }
    }
}

// acc[nb] += round(P) Y over the head's channels, P the 16 x 64 accumulator
// `p`, Y a shared tile of 64 rows (P V, dS K, Pᵀ dO, dSᵀ Q).
template <class S, class T>
__device__ inline void flash_mma_pb(FragmentC (&acc)[S::hs / 8], const FragmentC (&p)[ops::flash_tile_k / 8],
                                    const T* y, int hs, int lane) {
#pragma unroll
    for (int kk = 0; kk < ops::flash_tile_k / 16; ++kk) {
        const FragmentA fa = flash_repack<T>(p, kk);
#pragma unroll
        for (int nb = 0; nb < S::hs / 8; nb += 2) {
            if (!flash_channels_used<S>(8 * nb, hs)) continue;
            FragmentB b0, b1;
            flash_fragments_b<S::stride>(b0, b1, y, nb, kk, lane);
            mma_m16n8k16<T>(acc[nb], fa, b0, acc[nb]);
            mma_m16n8k16<T>(acc[nb + 1], fa, b1, acc[nb + 1]);
        }
    }
}

// Lane l of a 16 x n accumulator holds rows g = l / 4 (x[0], x[1]) and g + 8
// (x[2], x[3]), columns 8 nb + 2 (l % 4) + (i & 1).
__device__ inline int flash_frag_row(int lane, int i) { return lane / 4 + (i >= 2 ? 8 : 0); }
__device__ inline int flash_frag_col(int lane, int nb, int i) { return 8 * nb + 2 * (lane % 4) + (i & 1); }

// Sets the scores of a diagonal tile to -inf where the column (key
// col0 + its fragment column) lies past the row (query row[i / 2]): the
// causal mask, for an accumulator whose rows are queries and columns keys.
__device__ inline void flash_mask_keys_after(FragmentC (&s)[ops::flash_tile_k / 8], int col0, const int (&row)[2],
                                             int lane) {
#pragma unroll
    for (int nb = 0; nb < ops::flash_tile_k / 8; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (col0 + flash_frag_col(lane, nb, i) > row[i / 2]) s[nb].x[i] = -INFINITY;
    }
}

// Writes a warp's 16 x hs accumulator, times `scale`, to rows row[0] and
// row[1] of this lane (those below T_): row r's element c at dst + r ld + c.
template <class S, class T>
__device__ inline void flash_store_rows(T* dst, std::int64_t ld, const FragmentC (&acc)[S::hs / 8],
                                        const int (&row)[2], const float (&scale)[2], int T_, int hs, int lane) {
#pragma unroll
    for (int nb = 0; nb < S::hs / 8; ++nb) {
        if (!flash_channels_used<S>(8 * nb, hs)) break;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (row[r] < T_)
                flash_store2(dst + row[r] * ld + flash_frag_col(lane, nb, 2 * r), scale[r] * acc[nb].x[2 * r],
                             scale[r] * acc[nb].x[2 * r + 1]);
        }
    }
}

// How a block walks its tiles, and which of them each warp works on. A block
// owning rows r0 .. r0 + S::rows - 1 (of queries, or of keys) meets S::diagonal
// walked tiles that cross its diagonal, the first of them tile r0 / 64; warp
// w's own diagonal tile is the (w / 4)-th of them (its 16 rows lie in it).
// Towards the past of the diagonal (the forward's and dQ's key tiles before
// it, dK and dV's query tiles after it) every tile is whole for every warp.
// On the diagonal a warp masks its own tile, works whole on the tiles on its
// past side, and skips those beyond (all masked).
enum class FlashTileWork { skip, masked, whole };

// For a block walking key tiles (forward, dQ): key tile `first + d` of the
// diagonal, for warp w.
__device__ inline FlashTileWork flash_key_tile_work(int d, int w) {
    return d == w / 4 ? FlashTileWork::masked : (d < w / 4 ? FlashTileWork::whole : FlashTileWork::skip);
}

// For a block walking query tiles (dK, dV): query tile `first + d`.
__device__ inline FlashTileWork flash_query_tile_work(int d, int w) {
    return d == w / 4 ? FlashTileWork::masked : (d > w / 4 ? FlashTileWork::whole : FlashTileWork::skip);
}

// The forward's blocks per SM that ptxas must keep registers for (launch
// bounds): at head sizes up to 64, two on sm_90 (128 registers a thread, so
// two blocks of 36 KiB and 16 warps an SM); elsewhere one, where ptxas (nvcc
// 13.0) takes 128 registers unasked on sm_86 and sm_89 and, asked, spills 4
// bytes to keep them. The static report reads the result.
template <class S>
inline constexpr int flash_forward_min_blocks =
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    S::hs <= 64 ? 2 : 1;
#else
    0;  // none asked (0 is CUDA's "unspecified")
#endif

// Shared memory of the forward: two stages of a K and a V tile (Q lands
// first on the second stage, and moves to registers before any K or V does).
template <class S, class T>
constexpr std::size_t flash_forward_shared_bytes() {
    static_assert(S::rows * S::stride <= 2 * S::walk_tile, "Q fits in one stage");
    return std::size_t{4} * S::walk_tile * sizeof(T);
}

// Forward, one block per (b, h, S::rows query rows), warp w on query rows
// q0 + 16w .. q0 + 16w + 15, holding them as A fragments. The key tiles before
// the diagonal (whole for every warp) in a loop, the next K and V loading
// while this one's products run; then the S::diagonal tiles of the diagonal,
// each warp masking its own. Per key tile: S = Q Kᵀ, the online softmax in
// base 2 (the scale folded into the exponent's FMA: p = 2^(s c - m), with c =
// log2(e) / sqrt(hs) and m the running max of s c), then O += round(P) V.
template <class T, class S>
__global__ void __launch_bounds__(S::threads, flash_forward_min_blocks<S>)
    flash_forward_mma_kernel(T* out,        // (B, T, C)
                             float* lse,    // (B, NH, T)
                             const T* qkv,  // (B, T, C + 2 KV hs)
                             int T_, int C, int NH, int KV, int G) {
    constexpr int nf = ops::flash_tile_k / 8;  // score fragments per warp and key tile
    constexpr int tile = S::walk_tile;
    T* kv = dynamic_shared<T>();  // stage s: K at kv + 2s tile, V at kv + (2s + 1) tile
    const int hs = S::exact ? S::hs : C / NH;
    const FlashBlock blk = flash_block((T_ + S::rows - 1) / S::rows, NH, true);
    const int lane = static_cast<int>(threadIdx.x % 32), w = static_cast<int>(threadIdx.x / 32);
    const int q0 = blk.tile * S::rows, first = q0 / ops::flash_tile_k;
    const int key_tiles = min(first + S::diagonal, (T_ + ops::flash_tile_k - 1) / ops::flash_tile_k);
    const std::int64_t ld = flash_ld(C, hs, KV);
    const int g = flash_kv_head(blk.h, G);
    const T* seq = qkv + blk.b * T_ * ld + blk.h * hs;
    const T* keys = qkv + blk.b * T_ * ld + C + g * hs;  // k; v KV hs on
    const int v_at = KV * hs;
    const float scale_log2 = flash_log2e / sqrtf(static_cast<float>(hs));
    const int row[2] = {q0 + 16 * w + flash_frag_row(lane, 0), q0 + 16 * w + flash_frag_row(lane, 2)};
    const FlashTileCopy<S, ops::flash_tile_k> copy_kv(ld);
    const auto load_keys = [&](int kt) {
        const int k0 = kt * ops::flash_tile_k;
        T* stage = kv + (kt % 2) * 2 * tile;
        copy_kv(stage, keys + k0 * ld, T_ - k0, hs);
        copy_kv(stage + tile, keys + k0 * ld + v_at, T_ - k0, hs);
        cp_async_commit();
    };

    FlashTileCopy<S, S::rows>{ld}(kv + 2 * tile, seq + q0 * ld, T_ - q0, hs);
    cp_async_commit();
    load_keys(0);
    cp_async_wait<1>();
    __syncthreads();  // Q has landed
    FragmentA q[S::hs / 16];
    flash_load_rows<S>(q, kv + 2 * tile, 16 * w, hs, lane);

    FragmentC o[S::hs / 8] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // m in base 2; l: this lane's part of the row sums
    const auto begin = [&](int kt) {
        cp_async_wait<0>();
        __syncthreads();  // tile kt has landed; every warp is done with tile kt - 1 (and with Q)
        if (kt + 1 < key_tiles) load_keys(kt + 1);
    };
    const auto attend = [&](auto masked, int kt) {
        const T* k = kv + (kt % 2) * 2 * tile;
        FragmentC s[nf] = {};
        flash_mma_abt<S>(s, q, k, hs, lane);
        if constexpr (decltype(masked)::value) flash_mask_keys_after(s, kt * ops::flash_tile_k, row, lane);
        float top[2] = {-INFINITY, -INFINITY};  // the tile's row maxima of the unscaled scores
#pragma unroll
        for (int nb = 0; nb < nf; ++nb) {
#pragma unroll
            for (int i = 0; i < 4; ++i) top[i / 2] = fmaxf(top[i / 2], s[nb].x[i]);
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // the row's 4 lanes (a quad) agree on its max
            top[r] = fmaxf(top[r], __shfl_xor_sync(full_warp, top[r], 1));
            top[r] = fmaxf(top[r], __shfl_xor_sync(full_warp, top[r], 2));
            const float next = fmaxf(m[r], top[r] * scale_log2);
            alpha[r] = flash_exp2(m[r] - next);  // 0 on the first tile (m = -inf)
            l[r] *= alpha[r];
            m[r] = next;
        }
#pragma unroll
        for (int nb = 0; nb < S::hs / 8; ++nb) {
#pragma unroll
            for (int i = 0; i < 4; ++i) o[nb].x[i] *= alpha[i / 2];
        }
#pragma unroll
        for (int nb = 0; nb < nf; ++nb) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float p = flash_exp2(fmaf(s[nb].x[i], scale_log2, -m[i / 2]));  // 0 where masked
                s[nb].x[i] = p;
                l[i / 2] += p;
            }
        }
        flash_mma_pb<S>(o, s, k + tile, hs, lane);
    };

    for (int kt = 0; kt < first; ++kt) {
        begin(kt);
        attend(std::false_type{}, kt);
    }
#pragma unroll
    for (int d = 0; d < S::diagonal; ++d) {
        if (first + d >= key_tiles) break;
        begin(first + d);
        if (q0 + 16 * w >= T_) continue;  // the warp's rows are all past the sequence
        const FlashTileWork work = flash_key_tile_work(d, w);
        if (work == FlashTileWork::masked) attend(std::true_type{}, first + d);
        if (work == FlashTileWork::whole) attend(std::false_type{}, first + d);
    }

    float inv_l[2];
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(full_warp, l[r], 1);
        l[r] += __shfl_xor_sync(full_warp, l[r], 2);
        inv_l[r] = 1.0f / l[r];
    }
    flash_store_rows<S>(out + blk.b * T_ * C + blk.h * hs, C, o, row, inv_l, T_, hs, lane);
    if (lane % 4 == 0) {
        for (int r = 0; r < 2; ++r) {
            if (row[r] < T_) lse[blk.bh * T_ + row[r]] = m[r] * flash_ln2 + logf(l[r]);
        }
    }
}

// Shared memory of dK and dV: K and V of the block's keys, then per stage a
// Q and a dO tile and the query tile's lse and D (fp32).
template <class S, class T>
constexpr std::size_t flash_backward_key_shared_bytes() {
    return std::size_t{2} * S::rows * S::stride * sizeof(T) +
           std::size_t{S::stages} * (2 * S::walk_tile * sizeof(T) + 2 * ops::flash_tile_k * sizeof(float));
}

// dK and dV, one block per (b, key/value head g, S::rows key rows), warp w
// on key rows k0 + 16w .. k0 + 16w + 15, walking the G query heads of g in
// order, each as follows (the pipeline restarting at each head). The
// S::diagonal query tiles of the diagonal first, each warp masking its own,
// then the query tiles after it (whole for every warp) in a loop, in order,
// with the next Q and dO loading while this one's products run when
// S::stages is 2. Per query tile: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (16 keys x 64
// queries per warp), Pᵀ = 2^(Sᵀ c - lse log2(e)) and dSᵀ = Pᵀ (dPᵀ - D) in
// place, then dV += round(Pᵀ) dO and dK += round(dSᵀ) Q. Query rows past T_
// arrive as zeros (Q, dO, lse and D) and add exact zeros.
template <class T, class S>
__global__ void __launch_bounds__(S::threads)
    flash_backward_key_mma_kernel(T* dqkv,           // (B, T, C + 2 KV hs) k and v parts written
                                  const T* dout,     // (B, T, C)
                                  const T* qkv,      // (B, T, C + 2 KV hs)
                                  const float* lse,  // (B, NH, T)
                                  const float* D,    // (B, NH, T)
                                  int T_, int C, int NH, int KV, int G) {
    constexpr int nf = ops::flash_tile_k / 8;
    constexpr int tile = S::walk_tile;
    // A stage: Q, dO, then lse and D (2 x 64 floats), as elements of T.
    constexpr int stage_elems = 2 * tile + static_cast<int>(2 * ops::flash_tile_k * sizeof(float) / sizeof(T));
    T* sk = dynamic_shared<T>();
    T* sv = sk + S::rows * S::stride;
    T* stages = sv + S::rows * S::stride;  // stage s at stages + s * stage_elems
    const int hs = S::exact ? S::hs : C / NH;
    const int query_tiles = (T_ + ops::flash_tile_k - 1) / ops::flash_tile_k;
    const FlashBlock blk = flash_block((T_ + S::rows - 1) / S::rows, KV, false);  // blk.h: the key/value head
    const int lane = static_cast<int>(threadIdx.x % 32), w = static_cast<int>(threadIdx.x / 32);
    const int k0 = blk.tile * S::rows, first = k0 / ops::flash_tile_k;
    const int h0 = static_cast<int>(blk.h) * G;  // its query heads h0 .. h0 + G - 1
    // flash_ld's value, summed in 64 bits: here (ptxas 13.0) that spills less.
    const std::int64_t ld = std::int64_t{C} + 2 * std::int64_t{KV * hs};
    const std::int64_t kv_at = blk.b * T_ * ld + C + blk.h * hs;  // k in qkv and dqkv; v KV hs on
    const int v_at = KV * hs;
    // The query head being walked (h0, then the next ones): its q and dO, and
    // where its rows' lse and D start.
    const T* seq = qkv + blk.b * T_ * ld + h0 * hs;
    const T* dO = dout + blk.b * T_ * C + h0 * hs;
    std::int64_t stats = (blk.b * NH + h0) * T_;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const float scale_log2 = flash_log2e * scale;
    const int key[2] = {k0 + 16 * w + flash_frag_row(lane, 0), k0 + 16 * w + flash_frag_row(lane, 2)};
    const FlashTileCopy<S, ops::flash_tile_k> copy_tile(ld), copy_dout(C);
    const auto stage_of = [&](int qt) { return stages + ((qt - first) % S::stages) * stage_elems; };
    const auto load_queries = [&](int qt) {
        const int q0 = qt * ops::flash_tile_k;
        T* stage = stage_of(qt);
        copy_tile(stage, seq + q0 * ld, T_ - q0, hs);
        copy_dout(stage + tile, dO + q0 * std::int64_t{C}, T_ - q0, hs);
        flash_copy_stats(reinterpret_cast<float*>(stage + 2 * tile), lse + stats + q0, D + stats + q0, T_ - q0);
        cp_async_commit();
    };

    const FlashTileCopy<S, S::rows> copy_keys(ld);
    copy_keys(sk, qkv + kv_at + k0 * ld, T_ - k0, hs);  // committed with the first head's first query tile
    copy_keys(sv, qkv + kv_at + k0 * ld + v_at, T_ - k0, hs);
    FragmentC dk[S::hs / 8] = {}, dv[S::hs / 8] = {};
    const auto begin = [&](int qt) {
        cp_async_wait<0>();
        __syncthreads();  // tile qt has landed; every warp is done with the other stage
        if (S::stages == 2 && qt + 1 < query_tiles) load_queries(qt + 1);
    };
    const auto end = [&](int qt) {
        if (S::stages == 1 && qt + 1 < query_tiles) {
            __syncthreads();  // every warp is done with the stage
            load_queries(qt + 1);
        }
    };
    const auto attend = [&](auto masked, int qt) {
        const T* q = stage_of(qt);
        const T* o = q + tile;
        const float* lse_q = reinterpret_cast<const float*>(q + 2 * tile);
        const float* D_q = lse_q + ops::flash_tile_k;
        FragmentC st[nf] = {}, dpt[nf] = {};
        flash_mma_abt<S>(st, sk, 16 * w, q, hs, lane);
        flash_mma_abt<S>(dpt, sv, 16 * w, o, hs, lane);
#pragma unroll
        for (int nb = 0; nb < nf; ++nb) {
            const int c = flash_frag_col(lane, nb, 0);  // this lane's columns c, c + 1
            const float2 lse_c = *reinterpret_cast<const float2*>(lse_q + c);
            const float2 D_c = *reinterpret_cast<const float2*>(D_q + c);
            const float shift[2] = {-flash_log2e * lse_c.x, -flash_log2e * lse_c.y}, d[2] = {D_c.x, D_c.y};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float p = flash_exp2(fmaf(st[nb].x[i], scale_log2, shift[i & 1]));
                if constexpr (decltype(masked)::value) {
                    if (qt * ops::flash_tile_k + c + (i & 1) < key[i / 2]) p = 0.0f;
                }
                st[nb].x[i] = p;
                dpt[nb].x[i] = p * (dpt[nb].x[i] - d[i & 1]);
            }
        }
        flash_mma_pb<S>(dv, st, o, hs, lane);
        flash_mma_pb<S>(dk, dpt, q, hs, lane);
    };

    for (int n = 0; n < G; ++n) {  // query head h0 + n
        if (n > 0) {
            seq += hs;
            dO += hs;
            stats += T_;
            __syncthreads();  // every warp is done with the last head's stages
        }
        load_queries(first);
#pragma unroll
        for (int d = 0; d < S::diagonal; ++d) {
            if (first + d >= query_tiles) break;
            begin(first + d);
            if (k0 + 16 * w < T_) {  // else the warp's keys are all past the sequence
                const FlashTileWork work = flash_query_tile_work(d, w);
                if (work == FlashTileWork::masked) attend(std::true_type{}, first + d);
                if (work == FlashTileWork::whole) attend(std::false_type{}, first + d);
            }
            end(first + d);
        }
        for (int qt = first + S::diagonal; qt < query_tiles; ++qt) {
            begin(qt);
            attend(std::false_type{}, qt);
            end(qt);
        }
    }
    T* dst = dqkv + kv_at;
    const float dk_scale[2] = {scale, scale}, one[2] = {1.0f, 1.0f};
    flash_store_rows<S>(dst, ld, dk, key, dk_scale, T_, hs, lane);
    flash_store_rows<S>(dst + v_at, ld, dv, key, one, T_, hs, lane);
}

// Shared memory of dQ: Q and dO of the block's queries, then per stage a K
// and a V tile.
template <class S, class T>
constexpr std::size_t flash_backward_query_shared_bytes() {
    return (std::size_t{2} * S::rows * S::stride + std::size_t{S::stages} * 2 * S::walk_tile) * sizeof(T);
}

// dQ, one block per (b, h, S::rows query rows), warp w on query rows
// q0 + 16w .. q0 + 16w + 15, walking the key tiles as the forward does: per
// key tile S = Q Kᵀ and dP = dO Vᵀ, P and dS in place, then dQ += round(dS) K.
template <class T, class S>
__global__ void __launch_bounds__(S::threads)
    flash_backward_query_mma_kernel(T* dqkv,           // (B, T, C + 2 KV hs) q part written
                                    const T* dout,     // (B, T, C)
                                    const T* qkv,      // (B, T, C + 2 KV hs)
                                    const float* lse,  // (B, NH, T)
                                    const float* D,    // (B, NH, T)
                                    int T_, int C, int NH, int KV, int G) {
    constexpr int nf = ops::flash_tile_k / 8;
    constexpr int tile = S::walk_tile;
    T* sq = dynamic_shared<T>();
    T* so = sq + S::rows * S::stride;
    T* skv = so + S::rows * S::stride;  // stage s: K at skv + 2s tile, V at skv + (2s + 1) tile
    const int hs = S::exact ? S::hs : C / NH;
    const FlashBlock blk = flash_block((T_ + S::rows - 1) / S::rows, NH, true);
    const int lane = static_cast<int>(threadIdx.x % 32), w = static_cast<int>(threadIdx.x / 32);
    const int q0 = blk.tile * S::rows, first = q0 / ops::flash_tile_k;
    const int key_tiles = min(first + S::diagonal, (T_ + ops::flash_tile_k - 1) / ops::flash_tile_k);
    const std::int64_t ld = flash_ld(C, hs, KV);
    const int g = flash_kv_head(blk.h, G);
    const T* seq = qkv + blk.b * T_ * ld + blk.h * hs;
    const T* keys = qkv + blk.b * T_ * ld + C + g * hs;  // k; v KV hs on
    const int v_at = KV * hs;
    const T* dO = dout + blk.b * T_ * C + blk.h * hs;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const float scale_log2 = flash_log2e * scale;
    const int row[2] = {q0 + 16 * w + flash_frag_row(lane, 0), q0 + 16 * w + flash_frag_row(lane, 2)};
    float shift[2], D_r[2];  // -lse log2(e) and D of the lane's rows
    for (int r = 0; r < 2; ++r) {
        shift[r] = row[r] < T_ ? -flash_log2e * lse[blk.bh * T_ + row[r]] : 0.0f;
        D_r[r] = row[r] < T_ ? D[blk.bh * T_ + row[r]] : 0.0f;
    }
    const FlashTileCopy<S, ops::flash_tile_k> copy_kv(ld);
    const auto load_keys = [&](int kt) {
        const int k0 = kt * ops::flash_tile_k;
        T* stage = skv + (kt % S::stages) * 2 * tile;
        copy_kv(stage, keys + k0 * ld, T_ - k0, hs);
        copy_kv(stage + tile, keys + k0 * ld + v_at, T_ - k0, hs);
        cp_async_commit();
    };

    const FlashTileCopy<S, S::rows> copy_rows(ld), copy_dout(C);
    copy_rows(sq, seq + q0 * ld, T_ - q0, hs);
    copy_dout(so, dO + q0 * std::int64_t{C}, T_ - q0, hs);
    load_keys(0);
    FragmentC dq[S::hs / 8] = {};
    const auto begin = [&](int kt) {
        cp_async_wait<0>();
        __syncthreads();  // tile kt has landed; every warp is done with the other stage
        if (S::stages == 2 && kt + 1 < key_tiles) load_keys(kt + 1);
    };
    const auto end = [&](int kt) {
        if (S::stages == 1 && kt + 1 < key_tiles) {
            __syncthreads();  // every warp is done with the stage
            load_keys(kt + 1);
        }
    };
    const auto attend = [&](auto masked, int kt) {
        const T* k = skv + (kt % S::stages) * 2 * tile;
        FragmentC sc[nf] = {}, dp[nf] = {};
        flash_mma_abt<S>(sc, sq, 16 * w, k, hs, lane);
        flash_mma_abt<S>(dp, so, 16 * w, k + tile, hs, lane);
        if constexpr (decltype(masked)::value) flash_mask_keys_after(sc, kt * ops::flash_tile_k, row, lane);
#pragma unroll
        for (int nb = 0; nb < nf; ++nb) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float p = flash_exp2(fmaf(sc[nb].x[i], scale_log2, shift[i / 2]));  // 0 where masked
                dp[nb].x[i] = p * (dp[nb].x[i] - D_r[i / 2]);
            }
        }
        flash_mma_pb<S>(dq, dp, k, hs, lane);
    };

    for (int kt = 0; kt < first; ++kt) {
        begin(kt);
        attend(std::false_type{}, kt);
        end(kt);
    }
#pragma unroll
    for (int d = 0; d < S::diagonal; ++d) {
        if (first + d >= key_tiles) break;
        begin(first + d);
        if (q0 + 16 * w < T_) {  // else the warp's rows are all past the sequence
            const FlashTileWork work = flash_key_tile_work(d, w);
            if (work == FlashTileWork::masked) attend(std::true_type{}, first + d);
            if (work == FlashTileWork::whole) attend(std::false_type{}, first + d);
        }
        end(first + d);
    }
    const float dq_scale[2] = {scale, scale};
    flash_store_rows<S>(dqkv + blk.b * T_ * ld + blk.h * hs, ld, dq, row, dq_scale, T_, hs, lane);
}

// ---- host side ---------------------------------------------------------------------------

// The shared contract (ops/flash_attention.hpp), then this backend's limits:
// the kernels index query rows, and the channels of a row of qkv, with int.
inline void check_flash_attention(const char* op, int B, int T_, int C, int NH, int KV) {
    ops::check_flash_attention(op, B, T_, C, NH, KV);
    check_query_rows(op, B, T_, NH);
    const std::int64_t width = ops::qkv_width(C, NH, KV);
    if (width > INT_MAX) {
        throw ShapeError(std::string(op) + ": a row of qkv, C + 2 KV hs = " + std::to_string(width) +
                         " channels (C = " + std::to_string(C) + ", NH = " + std::to_string(NH) + ", KV = " +
                         std::to_string(KV) + "), is more than 2^31 - 1");
    }
}

// The tensor-core kernels copy 16-byte pieces of qkv and dout (cp.async)
// and store out and dqkv two elements at a time: snug::Error naming the
// tensor when one is not 16-byte aligned (every snug allocation is).
inline void check_flash_aligned(const char* op, const char* name, const void* p) {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    if (address % 16 != 0)
        throw Error(std::string(op) + ": " + name + " (address " + std::to_string(address) +
                    ") is not aligned to 16 bytes, which the tensor-core kernels need; allocate or offset the "
                    "tensor to a multiple of 16 bytes");
}

// Calls f(Shape{}) with the tensor-core kernels' shape (FlashShape) for
// head size hs (a multiple of 16 up to 128), Warps and Stages: the exact
// kernels at 64 and 128, the capacity kernels above any other.
template <int Warps, int Stages, class F>
void flash_with_head(int hs, F&& f) {
    if (hs == 64) {
        f(FlashShape<64, true, Warps, Stages>{});
    } else if (hs == 128) {
        f(FlashShape<128, true, Warps, Stages>{});
    } else if (hs < 64) {
        f(FlashShape<64, false, Warps, Stages>{});
    } else {
        f(FlashShape<128, false, Warps, Stages>{});
    }
}

// The least shared memory a block may opt in to on the cards the tensor-core
// kernels run on (sm_80 and later): 99 KiB, on sm_86 and sm_89.
inline constexpr std::size_t flash_least_optin = std::size_t{99} << 10;

// Calls f(Wide{}) where the card's blocks may opt in to WideBytes of shared
// memory (Wide's, for the backward kernel at hand), else f(Narrow{}): each
// backward kernel takes 8 warps and two stages where the card holds them
// (every card at hs 64; at 128, Hopper's 227 KiB), else 4 warps and one stage
// (hs 128 on sm_86 and sm_89). Narrow is compiled only where some card needs it.
template <class Wide, class Narrow, std::size_t WideBytes, class F>
void flash_backward_shape(std::size_t optin, F&& f) {
    if constexpr (WideBytes <= flash_least_optin) {
        (void)optin;
        f(Wide{});
    } else if (WideBytes <= optin) {
        f(Wide{});
    } else {
        f(Narrow{});
    }
}

}  // namespace detail

// Causal self-attention, forward, per ops/flash_attention.hpp: out and one
// fp32 log-sum-exp per row (lse, (B, NH, T)); no T x T matrix. KV key/value
// heads, each shared by NH / KV query heads (KV = NH: multi-head). Tensor
// cores where flash_attention_uses_tensor_cores<T>(C / NH), the SIMT kernel
// otherwise. Deterministic. Throws ShapeError when B or T is negative, C is
// not a positive multiple of NH, NH not a multiple of KV, B * NH * T >= 2^31,
// or a row of qkv (C + 2 KV hs) holds 2^31 channels or more.
template <FloatStorage T>
void flash_attention_forward(const Device& dev, T* out,       // (B, T, C)
                             ops::flash_stat_t<T>* lse,       // (B, NH, T)
                             const T* qkv,                    // (B, T, C + 2 KV hs)
                             int B, int T_, int C, int NH, int KV) {
    detail::check_flash_attention("flash_attention_forward", B, T_, C, NH, KV);
    if (ops::flash_stat_elems(B, T_, NH) == 0) return;
    const int hs = C / NH;
    const auto blocks = [&](int rows) {  // of `rows` rows of each sequence and query head
        return static_cast<unsigned>(std::int64_t{B} * NH * ((T_ + rows - 1) / rows));
    };
    if constexpr (MmaInput<T>) {
        if (flash_attention_uses_tensor_cores<T>(hs)) {
            detail::check_flash_aligned("flash_attention_forward", "qkv", qkv);
            detail::check_flash_aligned("flash_attention_forward", "out", out);
            detail::flash_with_head<8, 2>(hs, [&](auto shape) {
                using S = decltype(shape);
                const std::size_t shared = detail::dynamic_shared_bytes(
                    detail::flash_forward_mma_kernel<T, S>, detail::flash_forward_shared_bytes<S, T>());
                launch<detail::flash_forward_mma_kernel<T, S>>(blocks(S::rows), S::threads, shared, dev.stream, out,
                                                               lse, qkv, T_, C, NH, KV, NH / KV);
            });
            return;
        }
    }
    launch<detail::flash_forward_simt_kernel<T>>(blocks(detail::flash_tile), detail::flash_tile, 0, dev.stream, out,
                                                 lse, qkv, T_, C, NH, KV, NH / KV);
}

// Causal self-attention, backward, per ops/flash_attention.hpp: dqkv
// (overwritten) from dout, the inputs qkv and the forward's out and lse;
// `scratch` holds D = rowsum(dout * out) on return. dK and dV of a key/value
// head sum over its query heads in order. The same kernels' choice as the
// forward; no atomics: the same bits every run. Throws ShapeError as
// flash_attention_forward.
template <FloatStorage T>
void flash_attention_backward(const Device& dev, T* dqkv,            // (B, T, C + 2 KV hs) overwritten
                              ops::flash_stat_t<T>* scratch,         // (B, NH, T) any contents; D on return
                              const T* dout,                         // (B, T, C)
                              const T* qkv,                          // (B, T, C + 2 KV hs)
                              const T* out,                          // (B, T, C)
                              const ops::flash_stat_t<T>* lse,       // (B, NH, T)
                              int B, int T_, int C, int NH, int KV) {
    detail::check_flash_attention("flash_attention_backward", B, T_, C, NH, KV);
    const std::int64_t rows = ops::flash_stat_elems(B, T_, NH);
    if (rows == 0) return;
    const int hs = C / NH;
    launch<detail::flash_backward_d_kernel<T>>(
        static_cast<unsigned>((rows + detail::flash_d_rows - 1) / detail::flash_d_rows), 32 * detail::flash_d_rows, 0,
        dev.stream, scratch, dout, out, T_, C, NH, static_cast<int>(rows));
    // Blocks of `rows` rows of each sequence and query head (dQ), or key/value head (dK, dV).
    const auto blocks = [&](int heads, int rows) {
        return static_cast<unsigned>(std::int64_t{B} * heads * ((T_ + rows - 1) / rows));
    };
    if constexpr (MmaInput<T>) {
        if (flash_attention_uses_tensor_cores<T>(hs)) {
            detail::check_flash_aligned("flash_attention_backward", "qkv", qkv);
            detail::check_flash_aligned("flash_attention_backward", "dout", dout);
            detail::check_flash_aligned("flash_attention_backward", "dqkv", dqkv);
            const std::size_t optin = device_facts().shared_per_block_optin;
            detail::flash_with_head<8, 2>(hs, [&](auto wide) {
                using Wide = decltype(wide);
                using Narrow = detail::FlashShape<Wide::hs, Wide::exact, 4, 1>;
                detail::flash_backward_shape<Wide, Narrow, detail::flash_backward_key_shared_bytes<Wide, T>()>(
                    optin, [&](auto shape) {
                        using S = decltype(shape);
                        const std::size_t shared =
                            detail::dynamic_shared_bytes(detail::flash_backward_key_mma_kernel<T, S>,
                                                         detail::flash_backward_key_shared_bytes<S, T>());
                        launch<detail::flash_backward_key_mma_kernel<T, S>>(blocks(KV, S::rows), S::threads, shared,
                                                                            dev.stream, dqkv, dout, qkv, lse, scratch,
                                                                            T_, C, NH, KV, NH / KV);
                    });
                detail::flash_backward_shape<Wide, Narrow, detail::flash_backward_query_shared_bytes<Wide, T>()>(
                    optin, [&](auto shape) {
                        using S = decltype(shape);
                        const std::size_t shared =
                            detail::dynamic_shared_bytes(detail::flash_backward_query_mma_kernel<T, S>,
                                                         detail::flash_backward_query_shared_bytes<S, T>());
                        launch<detail::flash_backward_query_mma_kernel<T, S>>(blocks(NH, S::rows), S::threads, shared,
                                                                              dev.stream, dqkv, dout, qkv, lse,
                                                                              scratch, T_, C, NH, KV, NH / KV);
                    });
            });
            return;
        }
    }
    launch<detail::flash_backward_key_simt_kernel<T>>(blocks(KV, detail::flash_tile), detail::flash_tile, 0, dev.stream,
                                                      dqkv, dout, qkv, lse, scratch, T_, C, NH, KV, NH / KV);
    launch<detail::flash_backward_query_simt_kernel<T>>(blocks(NH, detail::flash_tile), detail::flash_tile, 0,
                                                        dev.stream, dqkv, dout, qkv, lse, scratch, T_, C, NH, KV,
                                                        NH / KV);
}

// Multi-head attention (KV = NH): qkv and dqkv (B, T, 3C).
template <FloatStorage T>
void flash_attention_forward(const Device& dev, T* out, ops::flash_stat_t<T>* lse, const T* qkv, int B, int T_, int C,
                             int NH) {
    flash_attention_forward(dev, out, lse, qkv, B, T_, C, NH, NH);
}
template <FloatStorage T>
void flash_attention_backward(const Device& dev, T* dqkv, ops::flash_stat_t<T>* scratch, const T* dout, const T* qkv,
                              const T* out, const ops::flash_stat_t<T>* lse, int B, int T_, int C, int NH) {
    flash_attention_backward(dev, dqkv, scratch, dout, qkv, out, lse, B, T_, C, NH, NH);
}

}  // namespace snug::cuda
