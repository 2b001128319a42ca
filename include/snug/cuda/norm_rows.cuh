// What LayerNorm and RMSNorm on CUDA share (layernorm.cuh, rmsnorm.cuh): the
// 16-byte vectors their row kernels move, and their whole backward in one
// launch that reads its inputs once and sums the parameter gradients
// deterministically:
//   dinp[n, :] += (g - mean_c(g) - xhat * mean_c(g * xhat)) * rstd[n]   g = weight * dout[n, :]
//   dweight[c] += sum_n dout[n, c] xhat[n, c]     xhat = (inp - mean) rstd, or inp rstd without a mean
//   dbias[c]   += sum_n dout[n, c]                 (LayerNorm only; RMSNorm drops mean_c(g) too)
#pragma once

#include "snug/cuda/runtime.hpp"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "snug/cuda/blas.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // Vec, vec_aligned
#include "snug/cuda/launch.hpp"
#include "snug/cuda/limits.hpp"
#include "snug/cuda/norms.cuh"
#include "snug/cuda/shared_memory.hpp"

namespace snug::cuda::detail {

// T (every kernel template below): float, snug::bfloat16 or snug::half; math in fp32.

// Forward row kernels: one warp per row, this many rows per block.
inline constexpr int norm_rows_per_block = 8;

inline unsigned norm_row_blocks(std::int64_t N) {
    return grid_stride_blocks(N, norm_rows_per_block, std::int64_t{1} << 20);
}

// The kernels move W consecutive channels per load or store: 16 bytes (W = 4
// floats or 8 16-bit values) when C is a multiple of that and every pointer is
// 16-byte aligned, else W = 1. Lane l of a row's warp takes channels
// [W (l + 32 k), W (l + 32 k) + W).
template <class T>
inline constexpr int norm_vec = static_cast<int>(16 / sizeof(T));

template <class T, int W>
__device__ __forceinline__ Vec<T, W> load_vec(const T* p, int v) {  // elements [W v, W v + W) of p
    return reinterpret_cast<const Vec<T, W>*>(p)[v];
}

// True when C channels of T and every pointer allow 16-byte vectors.
template <class T>
bool norm_vectorised(int C, std::initializer_list<const T*> pointers) {
    constexpr int W = norm_vec<T>;
    if (C % W != 0) return false;
    for (const T* p : pointers)
        if (!vec_aligned<T, W>(p)) return false;
    return true;
}

// ---- the backward ------------------------------------------------------------------
//
// One launch, norm_backward_kernel, where there were four (the input
// gradient, the parameter gradients over row chunks, two launches adding the
// chunks): it reads dinp once, and each row's dout and inp twice in a row
// (the second time from cache: a row is a few KiB):
// - Block b owns rows [N b / G, N (b + 1) / G) of a grid of G blocks; its
//   warp w takes the block's rows w, w + warps, ... one at a time: a first
//   pass over the row gives its two means, a second adds to dinp and adds the
//   row's dout xhat and dout into the warp's own partial sums of dweight and
//   dbias, which live in shared memory (P floats per channel: P = 2 with a
//   bias, 1 without), so that registers do not grow with C.
// - The block then adds its warps' sums in warp order, writes them as its row
//   of `partial` (G x P x C floats), and takes a ticket (atomicInc on a counter
//   that is 0 between launches). The block that draws the last ticket adds the
//   G rows in block order into dweight and dbias; atomicInc wraps the counter
//   back to 0 for the next launch.
// Every sum has a fixed order for given N, C and launch shape (G, warps,
// slice below), so the results are the same bits every run; the launch shape
// follows the GPU's SM count and shared memory, so another GPU may round
// differently (within the tolerances).
//
// Launch shape (norm_backward_shape):
// - G = one block per SM (fewer when N is small, or when the scratch holds
//   fewer partial rows): enough rows per block that G partial rows, which the
//   last block adds alone, stay a small part of the traffic (132 x 2 x 768
//   floats, 0.8 MB, at GPT-2 124M's C on an H100 or H200, against 100 MB of
//   rows at B 16, T 1024 in bf16).
// - Each block as many warps (at most 32) as the shared memory a block may opt
//   in to holds partial sums for (P C floats each): 32 at C = 768 on sm_90
//   (192 KiB), 18 at C = 1600 with a bias, 28 at C = 2048 without; about half
//   that on sm_86/89's 99 KiB. With one block per SM, that is the SM's shared memory.
// - Where one warp's sums do not fit (C > 29056 with a bias on sm_90), the
//   channels go in slices, one warp per block: each slice walks the block's
//   rows again (the means need the whole row, so its first pass repeats).
inline constexpr int norm_backward_max_warps = 32;

// p[0, W) += c in shared memory, 16 bytes per access where W allows (p is
// aligned to them).
template <int W>
__device__ __forceinline__ void add_sums(float* p, const float (&c)[W]) {
    constexpr int A = W < 4 ? W : 4;
#pragma unroll
    for (int j0 = 0; j0 < W; j0 += A) {
        auto& s = *reinterpret_cast<Vec<float, A>*>(p + j0);
        Vec<float, A> t = s;
#pragma unroll
        for (int j = 0; j < A; ++j) t.v[j] += c[j0 + j];
        s = t;
    }
}

struct NormBackwardShape {
    unsigned blocks = 1;  // G
    int warps = 1;        // per block
    int slice = 1;        // channels of partial sums per warp: C, or a multiple of 32 W
    std::size_t shared_bytes = 0;
};

// P: floats of partial sums per channel (2 with a bias); W: channels per
// vector; sms, shared_optin: device_facts(); max_blocks: the partial rows the
// scratch holds (at least 1). N > 0, C > 0.
inline NormBackwardShape norm_backward_shape(std::int64_t N, int C, int P, int W, int sms, std::size_t shared_optin,
                                             std::int64_t max_blocks) {
    NormBackwardShape s;
    const auto per_channel = static_cast<std::int64_t>(P * sizeof(float));
    const std::int64_t fits = static_cast<std::int64_t>(shared_optin) / per_channel;  // channels of one block
    if (C <= fits) {
        s.slice = C;
        s.warps = static_cast<int>(std::min<std::int64_t>(norm_backward_max_warps, fits / C));
    } else {
        s.warps = 1;
        s.slice = static_cast<int>(std::max<std::int64_t>(1, fits / (32 * W)) * 32 * W);
    }
    const std::int64_t wanted = std::min<std::int64_t>(sms, (N + s.warps - 1) / s.warps);
    s.blocks = static_cast<unsigned>(std::clamp<std::int64_t>(std::min(wanted, max_blocks), 1, sms));
    s.shared_bytes = static_cast<std::size_t>(s.warps) * static_cast<std::size_t>(s.slice) * per_channel;
    return s;
}

// Centered: LayerNorm (xhat uses mean; dbias; dinp subtracts mean_c(g));
// else RMSNorm (no mean, no bias). Launched with warps x 32 threads, G blocks,
// warps x P x slice floats of dynamic shared memory; `ticket` is 0 on entry
// and left 0. The row loops are not unrolled: at 1024 threads a thread has 64
// registers, and nvcc's own unrolling of RMSNorm's lighter loops spilled on
// sm_86; 32 warps of an SM keep enough 16-byte loads in flight without it.
template <class T, int W, bool Centered>
__global__ void __launch_bounds__(norm_backward_max_warps * 32)
    norm_backward_kernel(T* dinp,             // (N, C) +=
                         float* dweight,      // (C) +=
                         float* dbias,        // (C) += when Centered, else unused
                         float* partial,      // (gridDim.x, P, C) scratch
                         unsigned* ticket,    // (1) device counter, 0 between launches
                         const T* dout,       // (N, C)
                         const T* inp,        // (N, C)
                         const T* weight,     // (C)
                         const float* mean,   // (N) when Centered, else unused
                         const float* rstd,   // (N)
                         std::int64_t N, int C, int slice) {
    constexpr int P = Centered ? 2 : 1;
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int warp = static_cast<int>(threadIdx.x / 32);
    const int warps = static_cast<int>(blockDim.x / 32);
    // This warp's sums over the current slice: dweight's `slice` floats, then dbias's.
    float* const sums = dynamic_shared<float>();
    float* const acc = sums + std::int64_t{warp} * P * slice;
    const std::int64_t begin = N * blockIdx.x / gridDim.x;
    const std::int64_t end = N * (blockIdx.x + 1) / gridDim.x;
    const int vecs = C / W;
    const float inv_c = 1.0f / static_cast<float>(C);
    float* const block_partial = partial + std::int64_t{blockIdx.x} * P * C;

    for (int s0 = 0; s0 < C; s0 += slice) {
        const int v0 = s0 / W;                    // the slice's vectors: [v0, v1)
        const int v1 = (slice < C - s0 ? s0 + slice : C) / W;
        for (int i = lane; i < (v1 - v0) * W; i += 32) {
            acc[i] = 0.0f;
            if constexpr (Centered) acc[slice + i] = 0.0f;
        }
        for (std::int64_t row = begin + warp; row < end; row += warps) {
            const T* x = inp + row * C;
            const T* dy = dout + row * C;
            const float m = Centered ? mean[row] : 0.0f;
            const float rs = rstd[row];
            // Pass 1, the whole row: mean_c(g) and mean_c(g * xhat).
            float g_sum = 0.0f, gx_sum = 0.0f;
#pragma unroll 1
            for (int v = lane; v < vecs; v += 32) {
                const Vec<T, W> xv = load_vec<T, W>(x, v), dv = load_vec<T, W>(dy, v), wv = load_vec<T, W>(weight, v);
#pragma unroll
                for (int j = 0; j < W; ++j) {
                    const float g = static_cast<float>(wv.v[j]) * static_cast<float>(dv.v[j]);
                    if constexpr (Centered) g_sum += g;
                    gx_sum += g * ((static_cast<float>(xv.v[j]) - m) * rs);
                }
            }
            const float g_mean = Centered ? warp_sum(g_sum) * inv_c : 0.0f;
            const float gx_mean = warp_sum(gx_sum) * inv_c;
            // Pass 2, the slice: dinp, and the parameter gradients' sums.
            T* dx = dinp + row * C;
#pragma unroll 1
            for (int v = v0 + lane; v < v1; v += 32) {
                const Vec<T, W> xv = load_vec<T, W>(x, v), dv = load_vec<T, W>(dy, v), wv = load_vec<T, W>(weight, v);
                Vec<T, W> d = load_vec<T, W>(dx, v);
                float dw[W], db[W];
#pragma unroll
                for (int j = 0; j < W; ++j) {
                    const float dyj = static_cast<float>(dv.v[j]);
                    const float xhat = (static_cast<float>(xv.v[j]) - m) * rs;
                    const float g = static_cast<float>(wv.v[j]) * dyj;
                    const float g_centred = Centered ? g - g_mean : g;
                    d.v[j] = T(static_cast<float>(d.v[j]) + (g_centred - xhat * gx_mean) * rs);
                    dw[j] = dyj * xhat;
                    db[j] = dyj;
                }
                reinterpret_cast<Vec<T, W>*>(dx)[v] = d;
                add_sums<W>(acc + (v - v0) * W, dw);
                if constexpr (Centered) add_sums<W>(acc + slice + (v - v0) * W, db);
            }
        }
        __syncthreads();
        // The block's sums, its warps' in warp order, as its row of `partial`.
        for (int i = static_cast<int>(threadIdx.x); i < (v1 - v0) * W; i += static_cast<int>(blockDim.x)) {
#pragma unroll
            for (int p = 0; p < P; ++p) {
                float total = 0.0f;
                for (int w = 0; w < warps; ++w) total += sums[(std::int64_t{w} * P + p) * slice + i];
                block_partial[std::int64_t{p} * C + s0 + i] = total;
            }
        }
        __syncthreads();  // before the next slice's zeros
    }

    // Every thread's partial stores are visible device-wide before thread 0
    // takes the block's ticket; the block that takes the last one (G - 1)
    // finishes, and atomicInc wraps the counter back to 0.
    __threadfence();
    __syncthreads();
    const bool last = __syncthreads_or(threadIdx.x == 0 && atomicInc(ticket, gridDim.x - 1) == gridDim.x - 1) != 0;
    if (!last) return;
    __threadfence();  // the other blocks' rows, read below, after their tickets
    const int row_floats = P * C;
    for (int i = static_cast<int>(threadIdx.x); i < row_floats; i += static_cast<int>(blockDim.x)) {
        float total = 0.0f;
#pragma unroll 8
        for (unsigned b = 0; b < gridDim.x; ++b) total += __ldcg(partial + std::int64_t{b} * row_floats + i);
        if (Centered && i >= C)
            dbias[i - C] += total;
        else
            dweight[i] += total;
    }
}

// Launches norm_backward_kernel on dev.stream, W channels per lane (norm_vec<T>
// where C and the pointers allow, else 1); dbias and mean only when Centered.
// The partial rows go in dev.blas's scratch, the ticket in its
// ticket_counter(); without a Blas (or with one whose scratch holds no
// partial row), in stream-ordered memory from the runtime's pool, its counter
// zeroed first, freed on the same stream. N > 0, C > 0.
template <bool Centered, class T>
void norm_backward(const Device& dev, T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                   const T* weight, const float* mean, const float* rstd, std::int64_t N, int C) {
    constexpr int P = Centered ? 2 : 1;
    const bool vectorised = norm_vectorised<T>(C, {dinp, dout, inp, weight});
    const int W = vectorised ? norm_vec<T> : 1;
    const DeviceFacts facts = device_facts();
    const auto row_floats = static_cast<std::size_t>(P) * static_cast<std::size_t>(C);
    // Partial rows the Blas workspace holds (0: none, or no Blas).
    const std::size_t scratch_rows = dev.blas != nullptr ? dev.blas->scratch_capacity<float>() / row_floats : 0;
    const NormBackwardShape shape = norm_backward_shape(
        N, C, P, W, facts.multiprocessors, facts.shared_per_block_optin,
        scratch_rows > 0 ? static_cast<std::int64_t>(std::min<std::size_t>(scratch_rows, INT_MAX)) : INT_MAX);
    const auto run = [&]<int V>(float* partial, unsigned* ticket) {
        const std::size_t shared = dynamic_shared_bytes(norm_backward_kernel<T, V, Centered>, shape.shared_bytes);
        launch<norm_backward_kernel<T, V, Centered>>(shape.blocks, static_cast<unsigned>(shape.warps * 32), shared,
                                                     dev.stream, dinp, dweight, dbias, partial, ticket, dout, inp,
                                                     weight, mean, rstd, N, C, shape.slice);
    };
    const auto dispatch = [&](float* partial, unsigned* ticket) {
        if (vectorised)
            run.template operator()<norm_vec<T>>(partial, ticket);
        else
            run.template operator()<1>(partial, ticket);
    };
    if (scratch_rows > 0) {
        dispatch(dev.blas->scratch<float>(shape.blocks * row_floats), dev.blas->ticket_counter());
        return;
    }
    // The counter, then the partial rows 256 bytes on (cudaMalloc's alignment).
    constexpr std::size_t header = 256;
    void* memory = nullptr;
    check(cudaMallocAsync(&memory, header + sizeof(float) * shape.blocks * row_floats, dev.stream));
    try {
        auto* ticket = static_cast<unsigned*>(memory);
        check(cudaMemsetAsync(ticket, 0, sizeof(unsigned), dev.stream));
        dispatch(reinterpret_cast<float*>(static_cast<std::byte*>(memory) + header), ticket);
    } catch (...) {
        (void)cudaFreeAsync(memory, dev.stream);
        throw;
    }
    check(cudaFreeAsync(memory, dev.stream));
}

}  // namespace snug::cuda::detail
