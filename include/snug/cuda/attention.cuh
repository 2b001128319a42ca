// The CUDA attention core: causal multi-head self-attention on GPT-2's fused
// qkv tensor, forward (saving the softmax probabilities) and backward.
//
// Per head (hs = C / NH channels of each of q, k, v), as the host kernel:
//   forward   S = Q K^T / sqrt(hs), P = causal softmax(S) (the att output),
//             O = P V
//   backward  dP = dO V^T, dS = P * (dP - rowsum(P * dP)) / sqrt(hs),
//             dQ = dS K, dK = dS^T Q, dV = P^T dO
// Straightforward kernels, correctness first (a flash-style kernel that never
// writes the T x T matrices is a later step):
//   - forward and the dQ half of the backward run one block per query row
//     (b, h, t): a warp per key computes q_t . k_s with the lanes on
//     consecutive channels, the row lives in shared memory in fp32, and the
//     weighted sums over rows of V (or K) read consecutive channels;
//   - dK and dV run one block per tile of 32 keys, walking tiles of 32 query
//     rows through shared memory (coalesced loads of dS, P, Q and dO).
// Math is fp32 throughout; 16-bit values are rounded once when stored. O and
// dQ use the fp32 row of P and dS, dK and dV read dS back from `scratch` (so a
// 16-bit dS is rounded there, where the host keeps fp32: a difference well
// inside the 16-bit tolerance).
#pragma once

#include "snug/cuda/runtime.hpp"

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // FloatStorage
#include "snug/cuda/launch.hpp"
#include "snug/cuda/norms.cuh"
#include "snug/cuda/shared_memory.hpp"
#include "snug/ops/attention.hpp"

namespace snug::cuda {

namespace detail {

// T (every template below): float, snug::bfloat16 or snug::half.

inline constexpr int attention_threads = 256;
inline constexpr int attention_warps = attention_threads / 32;
// dK/dV kernel: 32 keys x 32 channels per pass, a block of 32 x attention_key_rows threads.
inline constexpr int attention_tile = 32;
inline constexpr int attention_key_rows = 8;
static_assert(attention_tile % attention_key_rows == 0);

// The block's query row: blocks run from the longest rows (t = T - 1) down,
// so the heavy blocks start first. Returns t; sets bh = b * NH + h.
__device__ inline int attention_row(int T_, std::int64_t& bh) {
    const std::int64_t idx = blockIdx.x;
    bh = idx / T_;
    return T_ - 1 - static_cast<int>(idx - bh * T_);
}

// dst[s] = mul * (vec . rows[s][0, hs)) for s < n: a warp per s, lanes on
// consecutive channels. vec: shared memory, (hs); rows[s] = base + s * ld.
template <class T>
__device__ void attention_dots(float* dst,        // (n), shared
                               const float* vec,  // (hs), shared
                               const T* base, std::int64_t ld, int n, int hs, float mul) {
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    for (int s = warp; s < n; s += attention_warps) {
        const T* row = base + s * ld;
        float dot = 0.0f;
        for (int d = lane; d < hs; d += 32) dot += vec[d] * static_cast<float>(row[d]);
        dot = warp_sum(dot);
        if (lane == 0) dst[s] = dot * mul;
    }
}

// out[d] = T(sum_{s < n} w[s] rows[s][d]) for d < hs, rows[s] = base + s * ld.
// When hs <= blockDim, G = blockDim / hs groups of hs threads split the rows
// (group g takes s = g, g + G, ...; consecutive threads on consecutive
// channels), and the G partial sums are added in group order. `part`: shared,
// attention_threads floats. Ends with a barrier.
template <class T>
__device__ void attention_weighted_rows(T* out,          // (hs)
                                        const float* w,  // (n), shared
                                        const T* base, std::int64_t ld, int n, int hs,
                                        float* part) {   // (attention_threads), shared
    const int tid = static_cast<int>(threadIdx.x);
    if (hs > attention_threads) {
        for (int d = tid; d < hs; d += attention_threads) {
            float acc = 0.0f;
            for (int s = 0; s < n; ++s) acc += w[s] * static_cast<float>(base[s * ld + d]);
            out[d] = T(acc);
        }
        __syncthreads();
        return;
    }
    const int groups = attention_threads / hs;
    if (tid < groups * hs) {
        const int g = tid / hs, d = tid - g * hs;
        float acc = 0.0f;
        for (int s = g; s < n; s += groups) acc += w[s] * static_cast<float>(base[s * ld + d]);
        part[tid] = acc;
    }
    __syncthreads();
    if (tid < hs) {
        float acc = 0.0f;
        for (int g = 0; g < groups; ++g) acc += part[g * hs + tid];
        out[tid] = T(acc);
    }
    __syncthreads();
}

// One block per (b, h, t). Dynamic shared memory: q (hs), p (T), part
// (attention_threads) floats.
template <class T>
__global__ void __launch_bounds__(attention_threads)
    attention_forward_kernel(T* out,        // (B, T, C)
                             T* att,        // (B, NH, T, T)
                             const T* qkv,  // (B, T, 3C)
                             int T_, int C, int NH) {
    float* smem = dynamic_shared<float>();
    auto& scratch = block_shared<float[32]>();
    const int hs = C / NH;
    float* q = smem;
    float* p = q + hs;
    float* part = p + T_;
    std::int64_t bh = 0;
    const int t = attention_row(T_, bh);
    const std::int64_t b = bh / NH, h = bh - b * NH;
    const std::int64_t ld = 3 * std::int64_t{C};
    const T* seq = qkv + b * T_ * ld + h * hs;  // q of row 0 of this sequence and head
    const int tid = static_cast<int>(threadIdx.x);

    for (int d = tid; d < hs; d += attention_threads) q[d] = static_cast<float>(seq[t * ld + d]);
    __syncthreads();
    const int n = t + 1;
    attention_dots(p, q, seq + C, ld, n, hs, 1.0f / sqrtf(static_cast<float>(hs)));
    __syncthreads();

    float local_max = -INFINITY;
    for (int s = tid; s < n; s += attention_threads) local_max = fmaxf(local_max, p[s]);
    const float row_max = block_max(local_max, scratch);
    float local_sum = 0.0f;
    for (int s = tid; s < n; s += attention_threads) {
        const float e = expf(p[s] - row_max);
        p[s] = e;
        local_sum += e;
    }
    const float inv = 1.0f / block_sum(local_sum, scratch);  // its barriers order the p writes
    T* att_row = att + (bh * T_ + t) * T_;
    for (int s = tid; s < T_; s += attention_threads) {
        const float prob = s < n ? p[s] * inv : 0.0f;
        att_row[s] = T(prob);
        if (s < n) p[s] = prob;
    }
    __syncthreads();
    attention_weighted_rows(out + (b * T_ + t) * C + h * hs, p, seq + 2 * C, ld, n, hs, part);
}

// The dQ half of the backward, one block per (b, h, t): dP_t = dO_t V^T, then
// dS_t = scale * P_t * (dP_t - P_t . dP_t), stored to scratch (zeros above the
// diagonal), then dq_t = dS_t K. Dynamic shared memory: dO (hs), dP (T),
// P (T), part (attention_threads) floats.
template <class T>
__global__ void __launch_bounds__(attention_threads)
    attention_backward_query_kernel(T* dqkv,        // (B, T, 3C) q part written
                                    T* scratch_ds,  // (B, NH, T, T) dS written
                                    const T* dout,  // (B, T, C)
                                    const T* qkv,   // (B, T, 3C)
                                    const T* att,   // (B, NH, T, T)
                                    int T_, int C, int NH) {
    float* smem = dynamic_shared<float>();
    auto& scratch = block_shared<float[32]>();
    const int hs = C / NH;
    float* dO = smem;
    float* dp = dO + hs;
    float* pr = dp + T_;
    float* part = pr + T_;
    std::int64_t bh = 0;
    const int t = attention_row(T_, bh);
    const std::int64_t b = bh / NH, h = bh - b * NH;
    const std::int64_t ld = 3 * std::int64_t{C};
    const T* seq = qkv + b * T_ * ld + h * hs;
    const int tid = static_cast<int>(threadIdx.x);
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));

    const T* dO_row = dout + (b * T_ + t) * C + h * hs;
    for (int d = tid; d < hs; d += attention_threads) dO[d] = static_cast<float>(dO_row[d]);
    __syncthreads();
    const int n = t + 1;
    attention_dots(dp, dO, seq + 2 * C, ld, n, hs, 1.0f);
    __syncthreads();

    const std::int64_t row = (bh * T_ + t) * T_;
    float local = 0.0f;
    for (int s = tid; s < n; s += attention_threads) {
        const float pv = static_cast<float>(att[row + s]);
        pr[s] = pv;
        local += pv * dp[s];
    }
    const float r = block_sum(local, scratch);
    for (int s = tid; s < T_; s += attention_threads) {
        const float ds = s < n ? scale * pr[s] * (dp[s] - r) : 0.0f;
        scratch_ds[row + s] = T(ds);
        if (s < n) dp[s] = ds;
    }
    __syncthreads();
    attention_weighted_rows(dqkv + (b * T_ + t) * ld + h * hs, dp, seq + C, ld, n, hs, part);
}

// dK = dS^T Q and dV = P^T dO for a tile of 32 keys s0 .. s0 + 31, one block
// of 32 x attention_key_rows threads per (b, h, tile): thread (x, y) owns
// channel d0 + x of keys s0 + y + 8j, j < 4, for each pass over 32 channels
// d0; query rows t >= s0 come through shared memory 32 at a time.
template <class T>
__global__ void __launch_bounds__(attention_tile * attention_key_rows)
    attention_backward_key_kernel(T* dqkv,              // (B, T, 3C) k and v parts written
                                  const T* scratch_ds,  // (B, NH, T, T) dS
                                  const T* dout,        // (B, T, C)
                                  const T* qkv,         // (B, T, 3C)
                                  const T* att,         // (B, NH, T, T)
                                  int T_, int C, int NH) {
    constexpr int tile = attention_tile;
    constexpr int per_thread = attention_tile / attention_key_rows;
    struct Tiles {
        float ds[tile][tile + 1];  // [query row][key]
        float p[tile][tile + 1];   // [query row][key]
        float q[tile][tile + 1];   // [query row][channel]
        float dO[tile][tile + 1];  // [query row][channel]
    };
    Tiles& shared = block_shared<Tiles>();
    auto& ds_tile = shared.ds;
    auto& p_tile = shared.p;
    auto& q_tile = shared.q;
    auto& do_tile = shared.dO;
    const int hs = C / NH;
    const int tiles = (T_ + tile - 1) / tile;
    const std::int64_t bh = blockIdx.x / tiles;
    const int s0 = static_cast<int>(blockIdx.x - bh * tiles) * tile;
    const std::int64_t b = bh / NH, h = bh - b * NH;
    const std::int64_t ld = 3 * std::int64_t{C};
    const T* q = qkv + b * T_ * ld + h * hs;
    const T* dO = dout + b * T_ * C + h * hs;
    const T* ds = scratch_ds + bh * T_ * T_;
    const T* P = att + bh * T_ * T_;
    const int x = static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);

    for (int d0 = 0; d0 < hs; d0 += tile) {
        float acc_k[per_thread] = {};
        float acc_v[per_thread] = {};
        for (int t0 = s0; t0 < T_; t0 += tile) {
            for (int i = y; i < tile; i += attention_key_rows) {
                const int t = t0 + i, s = s0 + x, d = d0 + x;
                const bool causal = t < T_ && s <= t;  // s <= t < T
                ds_tile[i][x] = causal ? static_cast<float>(ds[std::int64_t{t} * T_ + s]) : 0.0f;
                p_tile[i][x] = causal ? static_cast<float>(P[std::int64_t{t} * T_ + s]) : 0.0f;
                const bool in = t < T_ && d < hs;
                q_tile[i][x] = in ? static_cast<float>(q[t * ld + d]) : 0.0f;
                do_tile[i][x] = in ? static_cast<float>(dO[std::int64_t{t} * C + d]) : 0.0f;
            }
            __syncthreads();
            for (int i = 0; i < tile; ++i) {
                const float qv = q_tile[i][x], gv = do_tile[i][x];
                for (int j = 0; j < per_thread; ++j) {
                    acc_k[j] += ds_tile[i][y + j * attention_key_rows] * qv;
                    acc_v[j] += p_tile[i][y + j * attention_key_rows] * gv;
                }
            }
            __syncthreads();
        }
        const int d = d0 + x;
        for (int j = 0; j < per_thread; ++j) {
            const int s = s0 + y + j * attention_key_rows;
            if (s < T_ && d < hs) {
                T* dq = dqkv + (b * T_ + s) * ld + h * hs + d;
                dq[C] = T(acc_k[j]);
                dq[2 * C] = T(acc_v[j]);
            }
        }
    }
}

// This backend's limit on a launch over query rows (attention's and flash
// attention's): the kernels index them with int.
inline void check_query_rows(const char* op, int B, int T_, int NH) {
    if (std::int64_t{B} * NH * T_ > INT_MAX) {
        throw ShapeError(std::string(op) + ": B * NH * T = " + std::to_string(std::int64_t{B} * NH * T_) +
                         " (B = " + std::to_string(B) + ", NH = " + std::to_string(NH) + ", T = " +
                         std::to_string(T_) + ") query rows is more than 2^31 - 1");
    }
}

// The shared contract (ops/attention.hpp), then this backend's own limit.
inline void check_attention(const char* op, int B, int T_, int C, int NH) {
    ops::check_attention(op, B, T_, C, NH);
    check_query_rows(op, B, T_, NH);
}

// Dynamic shared memory of `kernel` for `floats` floats (a long sequence's
// rows may need more than the default 48 KiB; shared_memory.hpp's
// dynamic_shared_bytes raises the limit).
template <class Kernel>
std::size_t attention_shared_bytes(Kernel kernel, std::int64_t floats) {
    return dynamic_shared_bytes(kernel, static_cast<std::size_t>(floats) * sizeof(float));
}

}  // namespace detail

// Causal self-attention, forward. For each sequence b and head h (hs = C / NH
// channels, h * hs .. (h + 1) * hs of each of q, k and v):
//   att[b, h, t, :t+1] = softmax(q_t . k_j / sqrt(hs), j <= t), att[b, h, t, j > t] = 0,
//   out[b, t, h * hs + i] = sum_j att[b, h, t, j] v_j[i]   (from the fp32 probabilities).
// Deterministic. Throws ShapeError when B or T is negative, C is not a
// positive multiple of NH, or B * NH * T >= 2^31.
template <FloatStorage T>
void attention_forward(const Device& dev, T* out,  // (B, T, C)
                       T* att,                     // (B, NH, T, T)
                       const T* qkv,               // (B, T, 3C)
                       int B, int T_, int C, int NH) {
    detail::check_attention("attention_forward", B, T_, C, NH);
    const std::int64_t rows = std::int64_t{B} * NH * T_;
    if (rows == 0) return;
    const std::size_t shared = detail::attention_shared_bytes(
        detail::attention_forward_kernel<T>, std::int64_t{C / NH} + T_ + detail::attention_threads);
    launch<detail::attention_forward_kernel<T>>(static_cast<unsigned>(rows), detail::attention_threads, shared,
                                                dev.stream, out, att, qkv, T_, C, NH);
}

// Causal self-attention, backward: dqkv (overwritten) from dout, the inputs qkv
// and the probabilities att saved by attention_forward (whose entries above
// the diagonal must be 0, as attention_forward writes them). `scratch` holds
// dS on return (zeros above the diagonal). Deterministic. Throws ShapeError as
// attention_forward.
template <FloatStorage T>
void attention_backward(const Device& dev, T* dqkv,  // (B, T, 3C) overwritten
                        T* scratch,                  // (B, NH, T, T) any contents, clobbered
                        const T* dout,               // (B, T, C)
                        const T* qkv,                // (B, T, 3C)
                        const T* att,                // (B, NH, T, T)
                        int B, int T_, int C, int NH) {
    detail::check_attention("attention_backward", B, T_, C, NH);
    const std::int64_t rows = std::int64_t{B} * NH * T_;
    if (rows == 0) return;
    const std::size_t shared =
        detail::attention_shared_bytes(detail::attention_backward_query_kernel<T>,
                                       std::int64_t{C / NH} + 2 * std::int64_t{T_} + detail::attention_threads);
    launch<detail::attention_backward_query_kernel<T>>(static_cast<unsigned>(rows), detail::attention_threads, shared,
                                                       dev.stream, dqkv, scratch, dout, qkv, att, T_, C, NH);
    const std::int64_t key_blocks =
        std::int64_t{B} * NH * ((T_ + detail::attention_tile - 1) / detail::attention_tile);
    const dim3 block(detail::attention_tile, detail::attention_key_rows);
    launch<detail::attention_backward_key_kernel<T>>(static_cast<unsigned>(key_blocks), block, 0, dev.stream, dqkv,
                                                     scratch, dout, qkv, att, T_, C, NH);
}

}  // namespace snug::cuda
