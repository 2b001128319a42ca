// Flash attention on the CUDA backend (issue #15): causal multi-head
// self-attention on the fused qkv that never holds the T x T matrix, computing
// exactly what ops/flash_attention.hpp specifies (64 x 64 tiles, online
// softmax in fp32, p and ds rounded to T before the second products, one
// log-sum-exp per row, a deterministic two-pass backward).
//
// Two implementations of that one contract:
//   - tensor cores, for bf16 and fp16 with hs a multiple of 16 up to 128:
//     a block of 4 warps per 64-row tile, each warp owning 16 rows, tiles in
//     shared memory read by ldmatrix, every product an mma.sync m16n8k16 with
//     fp32 accumulation. The scores' accumulator fragments are re-packed as
//     the A fragments of the second product (FlashAttention-2's register
//     trick): that packing is the contract's round(). Tiles come from global
//     memory by cp.async in 16-byte pieces (qkv, dout, out and dqkv 16-byte
//     aligned, as every snug allocation is), the next tile loading while the
//     tensor cores work on this one (two stages; one in the backward at
//     HS = 128, to stay within a consumer card's 99 KiB of shared memory);
//     scores are kept in base 2 so each exponential is one exp2f. The
//     kernels are instantiated for head-size
//     capacities 16, 32, 64 and 128; a head of 48 runs in the 64 kernel,
//     which skips the channel steps past hs.
//   - SIMT, for fp32 and for the heads the tensor-core kernels do not take:
//     a block of 64 threads per tile, one thread per row, plain fp32 FMAs over
//     32-channel blocks staged in shared memory (so any hs fits); each output
//     pass covers 32 channels, recomputing the scores for each pass.
// The backward, either way: a small kernel for D = rowsum(dout * out), then
// dK and dV (one block per key tile, walking the query tiles from the
// diagonal down in order) and dQ (one block per query tile, walking the key
// tiles in order). Each output row has one owner: no atomics, the same bits
// every run.
#pragma once

#include "snug/cuda/runtime.hpp"

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
#include "snug/cuda/elementwise.cuh"  // CudaFloat
#include "snug/cuda/launch.hpp"
#include "snug/cuda/mma.hpp"
#include "snug/cuda/norms.cuh"  // warp_sum
#include "snug/cuda/shared_memory.hpp"
#include "snug/ops/flash_attention.hpp"

namespace snug::cuda {

// Whether flash attention of activation type T and head size hs runs on
// tensor cores (bf16 or fp16, hs a multiple of 16 up to 128); otherwise it
// runs the SIMT kernels.
template <CudaFloat T>
constexpr bool flash_attention_uses_tensor_cores(int hs) {
    return MmaInput<T> && hs > 0 && hs % 16 == 0 && hs <= 128;
}

namespace detail {

// T (every template below): float, snug::bfloat16 or snug::half.
// HS (tensor-core kernels): the head-size capacity, 16, 32, 64 or 128; the
// kernel takes any hs <= HS that is a multiple of 16.

inline constexpr int flash_tile = ops::flash_tile_q;
static_assert(ops::flash_tile_q == ops::flash_tile_k,
              "the kernels pair query tile i with key tile i on the diagonal");
static_assert(flash_tile == 64, "the tensor-core kernels assume 4 warps of 16 rows and 8 fragments of 8 keys");
inline constexpr int flash_warps = flash_tile / 16;      // tensor-core kernels: one warp per 16 rows
inline constexpr int flash_mma_threads = 32 * flash_warps;
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

// What a block of a grid of heads * tiles blocks works on. Blocks run tile
// by tile, heads inside: with `high_first` the highest tile (a query tile's
// most key tiles) comes first, otherwise the lowest (a key tile's most query
// tiles), so the longest blocks start first.
struct FlashBlock {
    std::int64_t b, h, bh;
    int tile;
};

__device__ inline FlashBlock flash_block(int tiles, int NH, bool high_first) {
    const std::int64_t heads = gridDim.x / tiles;
    const std::int64_t idx = blockIdx.x;
    const int i = static_cast<int>(idx / heads);
    const std::int64_t bh = idx - i * heads;
    return {bh / NH, bh % NH, bh, high_first ? tiles - 1 - i : i};
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
                              const T* qkv,  // (B, T, 3C)
                              int T_, int C, int NH) {
    struct Tiles {
        FlashBlockTile q, k, v;
    };
    Tiles& sh = block_shared<Tiles>();
    const int hs = C / NH;
    const int tiles = (T_ + flash_tile - 1) / flash_tile;
    const FlashBlock blk = flash_block(tiles, NH, true);
    const int r = static_cast<int>(threadIdx.x);
    const int q0 = blk.tile * flash_tile, t = q0 + r;
    const std::int64_t ld = 3 * std::int64_t{C};
    const T* seq = qkv + blk.b * T_ * ld + blk.h * hs;  // q of row 0 of this sequence and head
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));

    for (int c0 = 0; c0 < hs; c0 += flash_chunk) {
        float m = -INFINITY, l = 0.0f;
        float acc[flash_chunk] = {};
        for (int kt = 0; kt <= blk.tile; ++kt) {
            const int k0 = kt * flash_tile;
            float s[flash_tile] = {};
            for (int d0 = 0; d0 < hs; d0 += flash_chunk) {
                flash_load_block(sh.q, seq + q0 * ld + d0, ld, T_ - q0, hs - d0);
                flash_load_block(sh.k, seq + k0 * ld + C + d0, ld, T_ - k0, hs - d0);
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
            flash_load_block(sh.v, seq + k0 * ld + 2 * C + c0, ld, T_ - k0, hs - c0);
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

// dK and dV, one block of flash_tile threads per (b, h, key tile), thread r
// on key row j = k0 + r. For each pass over 32 output channels, the query
// tiles from the diagonal on, in order: s and dp (64 query rows each) from
// 32-channel blocks of Q, K, dO and V, then p = e^(s - lse), ds = p (dp - D)
// and dv += round(p) dO, dk += round(ds) Q over the pass's channels.
template <class T>
__global__ void __launch_bounds__(flash_tile)
    flash_backward_key_simt_kernel(T* dqkv,          // (B, T, 3C) k and v parts written
                                   const T* dout,    // (B, T, C)
                                   const T* qkv,     // (B, T, 3C)
                                   const float* lse, // (B, NH, T)
                                   const float* D,   // (B, NH, T)
                                   int T_, int C, int NH) {
    struct Tiles {
        FlashBlockTile q, k, o, v;
        float lse[flash_tile], D[flash_tile];
    };
    Tiles& sh = block_shared<Tiles>();
    const int hs = C / NH;
    const int tiles = (T_ + flash_tile - 1) / flash_tile;
    const FlashBlock blk = flash_block(tiles, NH, false);
    const int r = static_cast<int>(threadIdx.x);
    const int k0 = blk.tile * flash_tile, j = k0 + r;
    const std::int64_t ld = 3 * std::int64_t{C};
    const T* seq = qkv + blk.b * T_ * ld + blk.h * hs;
    const T* dO = dout + blk.b * T_ * C + blk.h * hs;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));

    for (int c0 = 0; c0 < hs; c0 += flash_chunk) {
        float dk[flash_chunk] = {}, dv[flash_chunk] = {};
        for (int qt = blk.tile; qt < tiles; ++qt) {
            const int q0 = qt * flash_tile;
            float s[flash_tile] = {}, dp[flash_tile] = {};
            for (int d0 = 0; d0 < hs; d0 += flash_chunk) {
                flash_load_block(sh.q, seq + q0 * ld + d0, ld, T_ - q0, hs - d0);
                flash_load_block(sh.k, seq + k0 * ld + C + d0, ld, T_ - k0, hs - d0);
                flash_load_block(sh.o, dO + q0 * std::int64_t{C} + d0, C, T_ - q0, hs - d0);
                flash_load_block(sh.v, seq + k0 * ld + 2 * C + d0, ld, T_ - k0, hs - d0);
                if (d0 == 0) {
                    const bool in = q0 + r < T_;
                    sh.lse[r] = in ? lse[blk.bh * T_ + q0 + r] : 0.0f;
                    sh.D[r] = in ? D[blk.bh * T_ + q0 + r] : 0.0f;
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
            flash_load_block(sh.q, seq + q0 * ld + c0, ld, T_ - q0, hs - c0);
            flash_load_block(sh.o, dO + q0 * std::int64_t{C} + c0, C, T_ - q0, hs - c0);
            __syncthreads();
            flash_weighted_rows(dv, s, sh.o);
            flash_weighted_rows(dk, dp, sh.q);
            __syncthreads();
        }
        if (j < T_) {
            T* dst = dqkv + (blk.b * T_ + j) * ld + blk.h * hs + c0;
            for (int d = 0; d < flash_chunk && c0 + d < hs; ++d) {
                dst[C + d] = T(scale * dk[d]);
                dst[2 * C + d] = T(dv[d]);
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
    flash_backward_query_simt_kernel(T* dqkv,          // (B, T, 3C) q part written
                                     const T* dout,    // (B, T, C)
                                     const T* qkv,     // (B, T, 3C)
                                     const float* lse, // (B, NH, T)
                                     const float* D,   // (B, NH, T)
                                     int T_, int C, int NH) {
    struct Tiles {
        FlashBlockTile q, k, o, v;
    };
    Tiles& sh = block_shared<Tiles>();
    const int hs = C / NH;
    const int tiles = (T_ + flash_tile - 1) / flash_tile;
    const FlashBlock blk = flash_block(tiles, NH, true);
    const int r = static_cast<int>(threadIdx.x);
    const int q0 = blk.tile * flash_tile, t = q0 + r;
    const std::int64_t ld = 3 * std::int64_t{C};
    const T* seq = qkv + blk.b * T_ * ld + blk.h * hs;
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
                flash_load_block(sh.k, seq + k0 * ld + C + d0, ld, T_ - k0, hs - d0);
                flash_load_block(sh.o, dO + q0 * std::int64_t{C} + d0, C, T_ - q0, hs - d0);
                flash_load_block(sh.v, seq + k0 * ld + 2 * C + d0, ld, T_ - k0, hs - d0);
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
            flash_load_block(sh.k, seq + k0 * ld + C + c0, ld, T_ - k0, hs - c0);
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

// ---- tensor-core kernels (bf16, fp16; hs a multiple of 16 up to HS) ---------------------

// Shared tiles: flash_tile rows of HS elements, flash_pad more per row (so
// ldmatrix's 8 rows of 16 bytes fall in different banks and each row stays
// 16-byte aligned).
template <int HS>
inline constexpr int flash_stride = HS + flash_pad;

template <int HS>
inline constexpr int flash_tile_elems = flash_tile * flash_stride<HS>;

template <int HS, class T>
constexpr std::size_t flash_tile_bytes() {
    return std::size_t{flash_tile_elems<HS>} * sizeof(T);
}

// The tiles a kernel walks (K and V in the forward and dQ; Q and dO in dK and
// dV) come through cp.async. With two stages the next tile loads while the
// tensor cores work on this one; with one, the load waits for the work. The
// backward at HS = 128 keeps one stage: two would need 104 KiB of shared
// memory per block, past the 99 KiB of the consumer cards (sm_86, sm_89)
// snug is for. The forward has two stages at every HS (87 KiB at 128).
template <int HS>
inline constexpr int flash_backward_stages = HS <= 64 ? 2 : 1;

inline constexpr float flash_log2e = 1.4426950408889634f;
inline constexpr float flash_ln2 = 0.6931471805599453f;

// Issues the copies of one tile into shared memory, 16 bytes each:
// dst[r][d] = src[r ld + d] for d < hs, r < rows; zeros for the rows past
// `rows` (rows >= 1). All threads of the block; the caller commits and waits.
template <int HS, class T>
__device__ void flash_copy_tile(T* dst, const T* src, std::int64_t ld, int rows, int hs) {
    constexpr int pieces = HS / 8;  // 16-byte pieces of a row
    for (int i = static_cast<int>(threadIdx.x); i < flash_tile * pieces; i += static_cast<int>(blockDim.x)) {
        const int r = i / pieces, c = i % pieces;
        if (8 * c >= hs) continue;
        const bool in = r < rows;
        cp_async<16>(dst + r * flash_stride<HS> + 8 * c, src + (in ? r : 0) * ld + 8 * c, in);
    }
}

// Issues the copies of `rows` (>= 1) fp32 row statistics, zeros past them,
// into flash_tile floats of shared memory. Threads 0 .. flash_tile - 1.
__device__ inline void flash_copy_stats(float* dst, const float* src, int rows) {
    const int r = static_cast<int>(threadIdx.x);
    if (r < flash_tile) cp_async<4>(dst + r, src + (r < rows ? r : 0), r < rows);
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

// The A fragment of rows 16w .. 16w + 15, channels 16 kk .. 16 kk + 15 of a
// shared tile.
template <int HS, class T>
__device__ inline FragmentA flash_fragment_a(const T* tile, int w, int kk, int lane) {
    FragmentA a;
    ldmatrix_x4(a.x, tile + (16 * w + lane % 16) * flash_stride<HS> + 16 * kk + 8 * (lane / 16));
    return a;
}

// The B fragments of n-blocks nb and nb + 1 for a product with a tile's rows
// as the columns (X Yᵀ, Y's rows 8 nb .. 8 nb + 15 from the shared tile),
// channels 16 kk .. 16 kk + 15: lanes 8i .. 8i + 7 address matrix i (rows
// 8 nb + 8 (i / 2) + 0..7, channels 16 kk + 8 (i % 2)).
template <int HS, class T>
__device__ inline void flash_fragments_bt(FragmentB& b0, FragmentB& b1, const T* tile, int nb, int kk, int lane) {
    std::uint32_t r[4];
    ldmatrix_x4(r, tile + (8 * nb + 8 * (lane / 16) + lane % 8) * flash_stride<HS> + 16 * kk + 8 * ((lane / 8) % 2));
    b0 = FragmentB{{r[0], r[1]}};
    b1 = FragmentB{{r[2], r[3]}};
}

// The B fragments of n-blocks nb and nb + 1 for a product with a tile as the
// right factor (X Y, Y's rows 16 kk .. 16 kk + 15, channels 8 nb .. 8 nb + 15),
// by ldmatrix.trans: lanes 8i .. 8i + 7 address matrix i (rows 16 kk +
// 8 (i % 2) + 0..7, channels 8 nb + 8 (i / 2)).
template <int HS, class T>
__device__ inline void flash_fragments_b(FragmentB& b0, FragmentB& b1, const T* tile, int nb, int kk, int lane) {
    std::uint32_t r[4];
    ldmatrix_x4_trans(r, tile + (16 * kk + 8 * ((lane / 8) % 2) + lane % 8) * flash_stride<HS> + 8 * nb + 8 * (lane / 16));
    b0 = FragmentB{{r[0], r[1]}};
    b1 = FragmentB{{r[2], r[3]}};
}

// The A fragment of columns 16 kk .. 16 kk + 15 of a 16 x 64 accumulator
// (fragments c[2 kk], c[2 kk + 1]), each value rounded to T: the register
// trick, and the contract's round().
template <class T>
__device__ inline FragmentA flash_repack(const FragmentC (&c)[flash_tile / 8], int kk) {
    const FragmentC& lo = c[2 * kk];
    const FragmentC& hi = c[2 * kk + 1];
    return FragmentA{{pack2(T(lo.x[0]), T(lo.x[1])), pack2(T(lo.x[2]), T(lo.x[3])), pack2(T(hi.x[0]), T(hi.x[1])),
                      pack2(T(hi.x[2]), T(hi.x[3]))}};
}

// acc[nb] += A(rows of warp w of `a`) B(rows of `b`)ᵀ over the first hs
// channels: a 16 x 64 product of two tiles' rows (scores; dO Vᵀ).
template <int HS, class T>
__device__ inline void flash_mma_abt(FragmentC (&acc)[flash_tile / 8], const T* a, int w, const T* b, int hs,
                                     int lane) {
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
        if (16 * kk >= hs) break;  // the same for the whole warp
        const FragmentA fa = flash_fragment_a<HS>(a, w, kk, lane);
#pragma unroll
        for (int nb = 0; nb < flash_tile / 8; nb += 2) {
            FragmentB b0, b1;
            flash_fragments_bt<HS>(b0, b1, b, nb, kk, lane);
            mma_m16n8k16<T>(acc[nb], fa, b0, acc[nb]);
            mma_m16n8k16<T>(acc[nb + 1], fa, b1, acc[nb + 1]);
        }
    }
}

// acc[nb] += round(P) Y over the first hs channels, P the 16 x 64
// accumulator `p`, Y a shared tile of 64 rows (P V, dS K, Pᵀ dO, dSᵀ Q).
template <int HS, class T>
__device__ inline void flash_mma_pb(FragmentC (&acc)[HS / 8], const FragmentC (&p)[flash_tile / 8], const T* y,
                                    int hs, int lane) {
#pragma unroll
    for (int kk = 0; kk < flash_tile / 16; ++kk) {
        const FragmentA fa = flash_repack<T>(p, kk);
#pragma unroll
        for (int nb = 0; nb < HS / 8; nb += 2) {
            if (8 * nb >= hs) break;
            FragmentB b0, b1;
            flash_fragments_b<HS>(b0, b1, y, nb, kk, lane);
            mma_m16n8k16<T>(acc[nb], fa, b0, acc[nb]);
            mma_m16n8k16<T>(acc[nb + 1], fa, b1, acc[nb + 1]);
        }
    }
}

// Lane l of a 16 x n accumulator holds rows g = l / 4 (x[0], x[1]) and g + 8
// (x[2], x[3]), columns 8 nb + 2 (l % 4) + (i & 1).
__device__ inline int flash_frag_row(int lane, int i) { return lane / 4 + (i >= 2 ? 8 : 0); }
__device__ inline int flash_frag_col(int lane, int nb, int i) { return 8 * nb + 2 * (lane % 4) + (i & 1); }

// Writes a warp's 16 x hs accumulator, times `scale`, to rows row[0] and
// row[1] of this lane (those below T_), columns col0 + its fragment columns:
// row r's element c at dst + row * ld + c.
template <int HS, class T>
__device__ inline void flash_store_rows(T* dst, std::int64_t ld, const FragmentC (&acc)[HS / 8], const int (&row)[2],
                                        const float (&scale)[2], int T_, int hs, int lane) {
#pragma unroll
    for (int nb = 0; nb < HS / 8; ++nb) {
        if (8 * nb >= hs) break;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (row[r] < T_)
                flash_store2(dst + row[r] * ld + flash_frag_col(lane, nb, 2 * r), scale[r] * acc[nb].x[2 * r],
                             scale[r] * acc[nb].x[2 * r + 1]);
        }
    }
}

// Forward, one block of 4 warps per (b, h, query tile), warp w on query rows
// q0 + 16w .. q0 + 16w + 15, walking the key tiles up to the diagonal with
// the next K and V loading while this one's products run. Scores are kept in
// base 2 (scaled by log2(e)), so each exponential is one exp2f. Dynamic
// shared memory: Q, then K and V twice.
template <class T, int HS>
__global__ void __launch_bounds__(flash_mma_threads)
    flash_forward_mma_kernel(T* out,        // (B, T, C)
                             float* lse,    // (B, NH, T)
                             const T* qkv,  // (B, T, 3C)
                             int T_, int C, int NH) {
    constexpr int nf = flash_tile / 8;  // score fragments per warp
    constexpr int tile = flash_tile_elems<HS>;
    T* sq = dynamic_shared<T>();
    T* sk = sq + tile;      // stage s at sk + s * tile
    T* sv = sk + 2 * tile;  // stage s at sv + s * tile
    const int hs = C / NH;
    const int tiles = (T_ + flash_tile - 1) / flash_tile;
    const FlashBlock blk = flash_block(tiles, NH, true);
    const int lane = static_cast<int>(threadIdx.x % 32), w = static_cast<int>(threadIdx.x / 32);
    const int q0 = blk.tile * flash_tile;
    const std::int64_t ld = 3 * std::int64_t{C};
    const T* seq = qkv + blk.b * T_ * ld + blk.h * hs;
    const float scale_log2 = flash_log2e / sqrtf(static_cast<float>(hs));
    int row[2];  // this lane's two query rows
    for (int i = 0; i < 2; ++i) row[i] = q0 + 16 * w + flash_frag_row(lane, 2 * i);

    flash_copy_tile<HS>(sq, seq + q0 * ld, ld, T_ - q0, hs);
    flash_copy_tile<HS>(sk, seq + C, ld, T_, hs);
    flash_copy_tile<HS>(sv, seq + 2 * C, ld, T_, hs);
    cp_async_commit();
    FragmentC o[HS / 8] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // m in base 2; l: this lane's part of the row sums
    for (int kt = 0; kt <= blk.tile; ++kt) {
        const int k0 = kt * flash_tile;
        cp_async_wait<0>();
        __syncthreads();  // tile kt has landed; every warp is done with tile kt - 1 (the other stage)
        if (kt < blk.tile) {
            const int next = k0 + flash_tile, stage = (kt + 1) % 2;
            flash_copy_tile<HS>(sk + stage * tile, seq + next * ld + C, ld, T_ - next, hs);
            flash_copy_tile<HS>(sv + stage * tile, seq + next * ld + 2 * C, ld, T_ - next, hs);
            cp_async_commit();
        }
        const T* k = sk + (kt % 2) * tile;
        const T* v = sv + (kt % 2) * tile;
        FragmentC s[nf] = {};
        flash_mma_abt<HS>(s, sq, w, k, hs, lane);
        float row_max[2] = {m[0], m[1]};
#pragma unroll
        for (int nb = 0; nb < nf; ++nb) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float x = scale_log2 * s[nb].x[i];
                if (kt == blk.tile && k0 + flash_frag_col(lane, nb, i) > row[i / 2]) x = -INFINITY;
                s[nb].x[i] = x;
                row_max[i / 2] = fmaxf(row_max[i / 2], x);
            }
        }
        float alpha[2];
        for (int r = 0; r < 2; ++r) {  // the row's 4 lanes (a quad) agree on its max
            row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(full_warp, row_max[r], 1));
            row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(full_warp, row_max[r], 2));
            alpha[r] = exp2f(m[r] - row_max[r]);  // 0 on the first tile (m = -inf)
            l[r] *= alpha[r];
            m[r] = row_max[r];
        }
#pragma unroll
        for (int nb = 0; nb < HS / 8; ++nb) {
#pragma unroll
            for (int i = 0; i < 4; ++i) o[nb].x[i] *= alpha[i / 2];
        }
#pragma unroll
        for (int nb = 0; nb < nf; ++nb) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float p = exp2f(s[nb].x[i] - m[i / 2]);  // 0 where masked
                s[nb].x[i] = p;
                l[i / 2] += p;
            }
        }
        flash_mma_pb<HS>(o, s, v, hs, lane);
    }
    float inv_l[2];
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(full_warp, l[r], 1);
        l[r] += __shfl_xor_sync(full_warp, l[r], 2);
        inv_l[r] = 1.0f / l[r];
    }
    flash_store_rows<HS>(out + blk.b * T_ * C + blk.h * hs, C, o, row, inv_l, T_, hs, lane);
    if (lane % 4 == 0) {
        for (int r = 0; r < 2; ++r) {
            if (row[r] < T_) lse[blk.bh * T_ + row[r]] = m[r] * flash_ln2 + logf(l[r]);
        }
    }
}

// dK and dV, one block of 4 warps per (b, h, key tile), warp w on key rows
// k0 + 16w .. k0 + 16w + 15, walking the query tiles from the diagonal on:
// Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (16 keys x 64 queries per warp), Pᵀ and dSᵀ in
// place, then dV += round(Pᵀ) dO and dK += round(dSᵀ) Q. Dynamic shared
// memory: K, V, then per stage a Q and a dO tile, then per stage lse and D
// of the query tile (fp32).
template <class T, int HS>
__global__ void __launch_bounds__(flash_mma_threads)
    flash_backward_key_mma_kernel(T* dqkv,           // (B, T, 3C) k and v parts written
                                  const T* dout,     // (B, T, C)
                                  const T* qkv,      // (B, T, 3C)
                                  const float* lse,  // (B, NH, T)
                                  const float* D,    // (B, NH, T)
                                  int T_, int C, int NH) {
    constexpr int nf = flash_tile / 8;
    constexpr int tile = flash_tile_elems<HS>;
    constexpr int stages = flash_backward_stages<HS>;
    T* sk = dynamic_shared<T>();
    T* sv = sk + tile;
    T* sq = sv + tile;             // stage s at sq + s * tile
    T* so = sq + stages * tile;    // stage s at so + s * tile
    float* s_lse = reinterpret_cast<float*>(so + stages * tile);  // stage s at s_lse + s * flash_tile
    float* s_D = s_lse + stages * flash_tile;
    const int hs = C / NH;
    const int tiles = (T_ + flash_tile - 1) / flash_tile;
    const FlashBlock blk = flash_block(tiles, NH, false);
    const int lane = static_cast<int>(threadIdx.x % 32), w = static_cast<int>(threadIdx.x / 32);
    const int k0 = blk.tile * flash_tile;
    const std::int64_t ld = 3 * std::int64_t{C};
    const T* seq = qkv + blk.b * T_ * ld + blk.h * hs;
    const T* dO = dout + blk.b * T_ * C + blk.h * hs;
    const float* lse_bh = lse + blk.bh * T_;
    const float* D_bh = D + blk.bh * T_;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const float scale_log2 = flash_log2e * scale;
    int key[2];  // this lane's two key rows
    for (int i = 0; i < 2; ++i) key[i] = k0 + 16 * w + flash_frag_row(lane, 2 * i);
    // The query tile qt's Q, dO, lse and D into stage s.
    const auto copy_queries = [&](int qt, int s) {
        const int q0 = qt * flash_tile;
        flash_copy_tile<HS>(sq + s * tile, seq + q0 * ld, ld, T_ - q0, hs);
        flash_copy_tile<HS>(so + s * tile, dO + q0 * std::int64_t{C}, C, T_ - q0, hs);
        flash_copy_stats(s_lse + s * flash_tile, lse_bh + q0, T_ - q0);
        flash_copy_stats(s_D + s * flash_tile, D_bh + q0, T_ - q0);
        cp_async_commit();
    };

    flash_copy_tile<HS>(sk, seq + k0 * ld + C, ld, T_ - k0, hs);
    flash_copy_tile<HS>(sv, seq + k0 * ld + 2 * C, ld, T_ - k0, hs);
    copy_queries(blk.tile, 0);
    FragmentC dk[HS / 8] = {}, dv[HS / 8] = {};
    for (int qt = blk.tile; qt < tiles; ++qt) {
        const int q0 = qt * flash_tile;
        const int s = (qt - blk.tile) % stages;
        cp_async_wait<0>();
        __syncthreads();  // tile qt has landed; every warp is done with the other stage
        if (stages == 2 && qt + 1 < tiles) copy_queries(qt + 1, 1 - s);
        const T* q = sq + s * tile;
        const T* o = so + s * tile;
        const float* lse_q = s_lse + s * flash_tile;
        const float* D_q = s_D + s * flash_tile;
        FragmentC st[nf] = {}, dpt[nf] = {};
        flash_mma_abt<HS>(st, sk, w, q, hs, lane);
        flash_mma_abt<HS>(dpt, sv, w, o, hs, lane);
#pragma unroll
        for (int nb = 0; nb < nf; ++nb) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int c = flash_frag_col(lane, nb, i), t = q0 + c;
                const float p = t < T_ && key[i / 2] <= t
                                    ? exp2f(fmaf(scale_log2, st[nb].x[i], -flash_log2e * lse_q[c]))
                                    : 0.0f;
                st[nb].x[i] = p;
                dpt[nb].x[i] = p * (dpt[nb].x[i] - D_q[c]);
            }
        }
        flash_mma_pb<HS>(dv, st, o, hs, lane);
        flash_mma_pb<HS>(dk, dpt, q, hs, lane);
        if (stages == 1 && qt + 1 < tiles) {
            __syncthreads();  // every warp is done with this stage
            copy_queries(qt + 1, 0);
        }
    }
    T* dst = dqkv + blk.b * T_ * ld + blk.h * hs;
    const float dk_scale[2] = {scale, scale}, one[2] = {1.0f, 1.0f};
    flash_store_rows<HS>(dst + C, ld, dk, key, dk_scale, T_, hs, lane);
    flash_store_rows<HS>(dst + 2 * C, ld, dv, key, one, T_, hs, lane);
}

// dQ, one block of 4 warps per (b, h, query tile), warp w on query rows
// q0 + 16w .. q0 + 16w + 15, walking the key tiles up to the diagonal:
// S = Q Kᵀ and dP = dO Vᵀ, P and dS in place, then dQ += round(dS) K.
// Dynamic shared memory: Q, dO, then per stage a K and a V tile.
template <class T, int HS>
__global__ void __launch_bounds__(flash_mma_threads)
    flash_backward_query_mma_kernel(T* dqkv,           // (B, T, 3C) q part written
                                    const T* dout,     // (B, T, C)
                                    const T* qkv,      // (B, T, 3C)
                                    const float* lse,  // (B, NH, T)
                                    const float* D,    // (B, NH, T)
                                    int T_, int C, int NH) {
    constexpr int nf = flash_tile / 8;
    constexpr int tile = flash_tile_elems<HS>;
    constexpr int stages = flash_backward_stages<HS>;
    T* sq = dynamic_shared<T>();
    T* so = sq + tile;
    T* sk = so + tile;              // stage s at sk + s * tile
    T* sv = sk + stages * tile;     // stage s at sv + s * tile
    const int hs = C / NH;
    const int tiles = (T_ + flash_tile - 1) / flash_tile;
    const FlashBlock blk = flash_block(tiles, NH, true);
    const int lane = static_cast<int>(threadIdx.x % 32), w = static_cast<int>(threadIdx.x / 32);
    const int q0 = blk.tile * flash_tile;
    const std::int64_t ld = 3 * std::int64_t{C};
    const T* seq = qkv + blk.b * T_ * ld + blk.h * hs;
    const T* dO = dout + blk.b * T_ * C + blk.h * hs;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const float scale_log2 = flash_log2e * scale;
    int row[2];
    float lse_r[2], D_r[2];  // lse_r in base 2
    for (int i = 0; i < 2; ++i) {
        row[i] = q0 + 16 * w + flash_frag_row(lane, 2 * i);
        lse_r[i] = row[i] < T_ ? flash_log2e * lse[blk.bh * T_ + row[i]] : 0.0f;
        D_r[i] = row[i] < T_ ? D[blk.bh * T_ + row[i]] : 0.0f;
    }
    // The key tile kt's K and V into stage s.
    const auto copy_keys = [&](int kt, int s) {
        const int k0 = kt * flash_tile;
        flash_copy_tile<HS>(sk + s * tile, seq + k0 * ld + C, ld, T_ - k0, hs);
        flash_copy_tile<HS>(sv + s * tile, seq + k0 * ld + 2 * C, ld, T_ - k0, hs);
        cp_async_commit();
    };

    flash_copy_tile<HS>(sq, seq + q0 * ld, ld, T_ - q0, hs);
    flash_copy_tile<HS>(so, dO + q0 * std::int64_t{C}, C, T_ - q0, hs);
    copy_keys(0, 0);
    FragmentC dq[HS / 8] = {};
    for (int kt = 0; kt <= blk.tile; ++kt) {
        const int k0 = kt * flash_tile;
        const int s = kt % stages;
        cp_async_wait<0>();
        __syncthreads();  // tile kt has landed; every warp is done with the other stage
        if (stages == 2 && kt < blk.tile) copy_keys(kt + 1, 1 - s);
        const T* k = sk + s * tile;
        const T* v = sv + s * tile;
        FragmentC sc[nf] = {}, dp[nf] = {};
        flash_mma_abt<HS>(sc, sq, w, k, hs, lane);
        flash_mma_abt<HS>(dp, so, w, v, hs, lane);
#pragma unroll
        for (int nb = 0; nb < nf; ++nb) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = i / 2, j = k0 + flash_frag_col(lane, nb, i);
                const float p = row[r] < T_ && j <= row[r] ? exp2f(fmaf(scale_log2, sc[nb].x[i], -lse_r[r])) : 0.0f;
                dp[nb].x[i] = p * (dp[nb].x[i] - D_r[r]);
            }
        }
        flash_mma_pb<HS>(dq, dp, k, hs, lane);
        if (stages == 1 && kt < blk.tile) {
            __syncthreads();  // every warp is done with this stage
            copy_keys(kt + 1, 0);
        }
    }
    const float dq_scale[2] = {scale, scale};
    flash_store_rows<HS>(dqkv + blk.b * T_ * ld + blk.h * hs, ld, dq, row, dq_scale, T_, hs, lane);
}

// ---- host side ---------------------------------------------------------------------------

// The shared contract (ops/flash_attention.hpp), then this backend's limit:
// the kernels index query rows with int.
inline void check_flash_attention(const char* op, int B, int T_, int C, int NH) {
    ops::check_flash_attention(op, B, T_, C, NH);
    check_query_rows(op, B, T_, NH);
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

// Calls f(std::integral_constant<int, HS>{}) with the smallest head-size
// capacity HS (16, 32, 64, 128) that holds hs.
template <class F>
void flash_with_capacity(int hs, F&& f) {
    if (hs <= 16) {
        f(std::integral_constant<int, 16>{});
    } else if (hs <= 32) {
        f(std::integral_constant<int, 32>{});
    } else if (hs <= 64) {
        f(std::integral_constant<int, 64>{});
    } else {
        f(std::integral_constant<int, 128>{});
    }
}

}  // namespace detail

// Causal self-attention, forward, per ops/flash_attention.hpp: out and one
// fp32 log-sum-exp per row (lse, (B, NH, T)); no T x T matrix. Tensor cores
// where flash_attention_uses_tensor_cores<T>(C / NH), the SIMT kernel
// otherwise. Deterministic. Throws ShapeError when B or T is negative, C is
// not a positive multiple of NH, or B * NH * T >= 2^31.
template <CudaFloat T>
void flash_attention_forward(const Device& dev, T* out,       // (B, T, C)
                             ops::flash_stat_t<T>* lse,       // (B, NH, T)
                             const T* qkv,                    // (B, T, 3C)
                             int B, int T_, int C, int NH) {
    detail::check_flash_attention("flash_attention_forward", B, T_, C, NH);
    if (ops::flash_stat_elems(B, T_, NH) == 0) return;
    const int hs = C / NH;
    const auto blocks = static_cast<unsigned>(std::int64_t{B} * NH * ((T_ + detail::flash_tile - 1) / detail::flash_tile));
    if constexpr (MmaInput<T>) {
        if (flash_attention_uses_tensor_cores<T>(hs)) {
            detail::check_flash_aligned("flash_attention_forward", "qkv", qkv);
            detail::check_flash_aligned("flash_attention_forward", "out", out);
            detail::flash_with_capacity(hs, [&](auto capacity) {
                constexpr int HS = decltype(capacity)::value;
                const std::size_t shared = detail::dynamic_shared_bytes(detail::flash_forward_mma_kernel<T, HS>,
                                                                        5 * detail::flash_tile_bytes<HS, T>());
                launch<detail::flash_forward_mma_kernel<T, HS>>(blocks, detail::flash_mma_threads, shared, dev.stream,
                                                                out, lse, qkv, T_, C, NH);
            });
            return;
        }
    }
    launch<detail::flash_forward_simt_kernel<T>>(blocks, detail::flash_tile, 0, dev.stream, out, lse, qkv, T_, C, NH);
}

// Causal self-attention, backward, per ops/flash_attention.hpp: dqkv
// (overwritten) from dout, the inputs qkv and the forward's out and lse;
// `scratch` holds D = rowsum(dout * out) on return. The same kernels' choice
// as the forward; no atomics: the same bits every run. Throws ShapeError as
// flash_attention_forward.
template <CudaFloat T>
void flash_attention_backward(const Device& dev, T* dqkv,            // (B, T, 3C) overwritten
                              ops::flash_stat_t<T>* scratch,         // (B, NH, T) any contents; D on return
                              const T* dout,                         // (B, T, C)
                              const T* qkv,                          // (B, T, 3C)
                              const T* out,                          // (B, T, C)
                              const ops::flash_stat_t<T>* lse,       // (B, NH, T)
                              int B, int T_, int C, int NH) {
    detail::check_flash_attention("flash_attention_backward", B, T_, C, NH);
    const std::int64_t rows = ops::flash_stat_elems(B, T_, NH);
    if (rows == 0) return;
    const int hs = C / NH;
    launch<detail::flash_backward_d_kernel<T>>(
        static_cast<unsigned>((rows + detail::flash_d_rows - 1) / detail::flash_d_rows), 32 * detail::flash_d_rows, 0,
        dev.stream, scratch, dout, out, T_, C, NH, static_cast<int>(rows));
    const auto blocks = static_cast<unsigned>(std::int64_t{B} * NH * ((T_ + detail::flash_tile - 1) / detail::flash_tile));
    if constexpr (MmaInput<T>) {
        if (flash_attention_uses_tensor_cores<T>(hs)) {
            detail::check_flash_aligned("flash_attention_backward", "qkv", qkv);
            detail::check_flash_aligned("flash_attention_backward", "dout", dout);
            detail::check_flash_aligned("flash_attention_backward", "dqkv", dqkv);
            detail::flash_with_capacity(hs, [&](auto capacity) {
                constexpr int HS = decltype(capacity)::value;
                constexpr int stages = detail::flash_backward_stages<HS>;
                const std::size_t key_shared =
                    detail::dynamic_shared_bytes(detail::flash_backward_key_mma_kernel<T, HS>,
                                                 (2 + 2 * stages) * detail::flash_tile_bytes<HS, T>() +
                                                     2 * stages * detail::flash_tile * sizeof(float));
                launch<detail::flash_backward_key_mma_kernel<T, HS>>(blocks, detail::flash_mma_threads, key_shared,
                                                                     dev.stream, dqkv, dout, qkv, lse, scratch, T_, C, NH);
                const std::size_t query_shared = detail::dynamic_shared_bytes(
                    detail::flash_backward_query_mma_kernel<T, HS>, (2 + 2 * stages) * detail::flash_tile_bytes<HS, T>());
                launch<detail::flash_backward_query_mma_kernel<T, HS>>(blocks, detail::flash_mma_threads, query_shared,
                                                                       dev.stream, dqkv, dout, qkv, lse, scratch, T_,
                                                                       C, NH);
            });
            return;
        }
    }
    launch<detail::flash_backward_key_simt_kernel<T>>(blocks, detail::flash_tile, 0, dev.stream, dqkv, dout, qkv, lse,
                                                      scratch, T_, C, NH);
    launch<detail::flash_backward_query_simt_kernel<T>>(blocks, detail::flash_tile, 0, dev.stream, dqkv, dout, qkv,
                                                        lse, scratch, T_, C, NH);
}

}  // namespace snug::cuda
