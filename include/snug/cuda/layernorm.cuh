// The CUDA LayerNorm over the last dimension (PyTorch semantics: biased
// variance, eps = 1e-5, affine weight and bias), forward and backward, with
// fp32 statistics and a deterministic backward; 128-bit loads and stores
// where C and the pointers allow (one element at a time otherwise).
#pragma once

#include "snug/cuda/runtime.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // CudaFloat
#include "snug/cuda/launch.hpp"
#include "snug/cuda/linear.cuh"  // Blas workspace, bias_grad_finish_kernel
#include "snug/cuda/norms.cuh"
#include "snug/cuda/shared_memory.hpp"
#include "snug/ops/layernorm.hpp"

namespace snug::cuda {

namespace detail {

// T (every kernel template below): float, snug::bfloat16 or snug::half; math in fp32.

// The shared epsilon (ops/layernorm.hpp), as the float the kernels add.
inline constexpr float layernorm_eps = static_cast<float>(ops::layernorm_eps);
// Row kernels: one warp per row, this many rows per block.
inline constexpr int layernorm_rows_per_block = 8;
// Parameter-gradient kernel: a block of 32 channels x this many row lanes.
inline constexpr int layernorm_row_lanes = 16;

// The row kernels and the parameter-gradient kernel move W consecutive
// channels per load or store: 16 bytes (W = 4 floats or 8 16-bit values)
// when C is a multiple of that and every pointer is 16-byte aligned, else
// W = 1. Lane l of a row's warp takes channels [W (l + 32 k), W (l + 32 k) + W).
template <class T>
inline constexpr int layernorm_vec = static_cast<int>(16 / sizeof(T));

template <class T, int W>
__device__ __forceinline__ Vec<T, W> load_vec(const T* p, int v) {  // elements [W v, W v + W) of p
    return reinterpret_cast<const Vec<T, W>*>(p)[v];
}

// Add (residual_layernorm_forward): sum = inp + residual (rounded to T) is
// written first and the row normalised from it (sum may equal inp): the bits
// of add_inplace followed by layernorm_forward, in one pass over the inputs.
template <class T, int W, bool Add>
__global__ void __launch_bounds__(layernorm_rows_per_block * 32)
    layernorm_forward_kernel(T* out,              // (N, C)
                             float* mean,         // (N)
                             float* rstd,         // (N)
                             const T* inp,        // (N, C)
                             const T* residual,   // (N, C) when Add, else unused
                             T* sum,              // (N, C) when Add: inp + residual; else unused
                             const T* weight,     // (C)
                             const T* bias,       // (C)
                             std::int64_t N, int C) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int vecs = C / W;
    const std::int64_t stride = std::int64_t{gridDim.x} * layernorm_rows_per_block;
    for (std::int64_t row = std::int64_t{blockIdx.x} * layernorm_rows_per_block + threadIdx.x / 32; row < N;
         row += stride) {
        // The row normalised: inp's, or the sum this lane writes (and alone reads back).
        const T* x = (Add ? sum : inp) + row * C;
        float total = 0.0f;
        for (int v = lane; v < vecs; v += 32) {
            Vec<T, W> xv = load_vec<T, W>(inp + row * C, v);
            if constexpr (Add) {
                const Vec<T, W> rv = load_vec<T, W>(residual + row * C, v);
#pragma unroll
                for (int j = 0; j < W; ++j) xv.v[j] = T(static_cast<float>(xv.v[j]) + static_cast<float>(rv.v[j]));
                reinterpret_cast<Vec<T, W>*>(sum + row * C)[v] = xv;
            }
#pragma unroll
            for (int j = 0; j < W; ++j) total += static_cast<float>(xv.v[j]);
        }
        const float m = warp_sum(total) / static_cast<float>(C);
        float sq = 0.0f;
        for (int v = lane; v < vecs; v += 32) {
            const Vec<T, W> xv = load_vec<T, W>(x, v);
#pragma unroll
            for (int j = 0; j < W; ++j) {
                const float d = static_cast<float>(xv.v[j]) - m;
                sq += d * d;
            }
        }
        const float var = warp_sum(sq) / static_cast<float>(C);
        const float rs = 1.0f / sqrtf(var + layernorm_eps);
        T* o = out + row * C;
        for (int v = lane; v < vecs; v += 32) {
            const Vec<T, W> xv = load_vec<T, W>(x, v), wv = load_vec<T, W>(weight, v), bv = load_vec<T, W>(bias, v);
            Vec<T, W> ov;
#pragma unroll
            for (int j = 0; j < W; ++j)
                ov.v[j] = T((static_cast<float>(xv.v[j]) - m) * rs * static_cast<float>(wv.v[j]) +
                            static_cast<float>(bv.v[j]));
            reinterpret_cast<Vec<T, W>*>(o)[v] = ov;
        }
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = rs;
        }
    }
}

// dinp += (g - mean_c(g) - xhat * mean_c(g * xhat)) * rstd per row, with
// g = weight * dout and xhat = (inp - mean) * rstd; one warp per row.
template <class T, int W>
__global__ void __launch_bounds__(layernorm_rows_per_block * 32)
    layernorm_backward_input_kernel(T* dinp,            // (N, C) +=
                                    const T* dout,      // (N, C)
                                    const T* inp,       // (N, C)
                                    const T* weight,    // (C)
                                    const float* mean,  // (N)
                                    const float* rstd,  // (N)
                                    std::int64_t N, int C) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int vecs = C / W;
    const float inv_c = 1.0f / static_cast<float>(C);
    const std::int64_t stride = std::int64_t{gridDim.x} * layernorm_rows_per_block;
    for (std::int64_t row = std::int64_t{blockIdx.x} * layernorm_rows_per_block + threadIdx.x / 32; row < N;
         row += stride) {
        const T* x = inp + row * C;
        const T* dy = dout + row * C;
        const float m = mean[row], rs = rstd[row];
        float g_sum = 0.0f, gx_sum = 0.0f;
        for (int v = lane; v < vecs; v += 32) {
            const Vec<T, W> xv = load_vec<T, W>(x, v), dv = load_vec<T, W>(dy, v), wv = load_vec<T, W>(weight, v);
#pragma unroll
            for (int j = 0; j < W; ++j) {
                const float g = static_cast<float>(wv.v[j]) * static_cast<float>(dv.v[j]);
                g_sum += g;
                gx_sum += g * ((static_cast<float>(xv.v[j]) - m) * rs);
            }
        }
        const float g_mean = warp_sum(g_sum) * inv_c;
        const float gx_mean = warp_sum(gx_sum) * inv_c;
        T* dx = dinp + row * C;
        for (int v = lane; v < vecs; v += 32) {
            const Vec<T, W> xv = load_vec<T, W>(x, v), dv = load_vec<T, W>(dy, v), wv = load_vec<T, W>(weight, v);
            Vec<T, W> acc = load_vec<T, W>(dx, v);
#pragma unroll
            for (int j = 0; j < W; ++j) {
                const float xhat = (static_cast<float>(xv.v[j]) - m) * rs;
                const float g = static_cast<float>(wv.v[j]) * static_cast<float>(dv.v[j]);
                acc.v[j] = T(static_cast<float>(acc.v[j]) + (g - g_mean - xhat * gx_mean) * rs);
            }
            reinterpret_cast<Vec<T, W>*>(dx)[v] = acc;
        }
    }
}

// dweight[c] += sum_n dout[n, c] xhat[n, c], dbias[c] += sum_n dout[n, c],
// in two deterministic steps (a fixed order of additions for given N, C and
// chunk count; no atomics):
// 1. layernorm_backward_params_kernel: block (x, y) owns channels 32Wx ..
//    32W(x + 1) - 1 (W per lane, so a warp reads 32W consecutive channels of
//    a row) over row chunk y: row lane k sums rows begin + k, begin + k + 16,
//    ... in order, then row lane 0 adds the 16 lane sums in order. With one chunk it adds
//    the totals into the gradients; with several it writes them to
//    partial[y, c] (dweight's) and partial[chunks + y, c] (dbias's).
// 2. bias_grad_finish_kernel (linear.cuh), once for each: the chunks' partial
//    sums in chunk order, added to the gradient.
// Chunks of about 64 rows, at most 256 and what the Blas workspace holds:
// (C / 32) x chunks blocks fill a large GPU where C / 32 alone (24 at C = 768)
// would leave it mostly idle.
inline constexpr std::int64_t layernorm_params_rows_per_chunk = 64;
inline constexpr std::int64_t layernorm_params_max_chunks = 256;

template <class T, int W>
__global__ void __launch_bounds__(32 * layernorm_row_lanes)
    layernorm_backward_params_kernel(float* dweight,     // (C) += when gridDim.y == 1
                                     float* dbias,       // (C) += when gridDim.y == 1
                                     float* partial,     // (2 gridDim.y, C) otherwise
                                     const T* dout,      // (N, C)
                                     const T* inp,       // (N, C)
                                     const float* mean,  // (N)
                                     const float* rstd,  // (N)
                                     std::int64_t N, int C) {
    struct Parts {
        float w[layernorm_row_lanes][32 * W];
        float b[layernorm_row_lanes][32 * W];
    };
    Parts& parts = block_shared<Parts>();
    auto& part_w = parts.w;
    auto& part_b = parts.b;
    const int lane = static_cast<int>(threadIdx.x);
    const int row_lane = static_cast<int>(threadIdx.y);
    const int c0 = (static_cast<int>(blockIdx.x) * 32 + lane) * W;  // this lane's W channels
    const std::int64_t chunks = gridDim.y;
    const std::int64_t begin = N * blockIdx.y / chunks;
    const std::int64_t end = N * (blockIdx.y + 1) / chunks;
    float sw[W] = {}, sb[W] = {};
    if (c0 < C) {
        for (std::int64_t n = begin + row_lane; n < end; n += layernorm_row_lanes) {
            const Vec<T, W> dv = load_vec<T, W>(dout + n * C, c0 / W), xv = load_vec<T, W>(inp + n * C, c0 / W);
            const float m = mean[n], rs = rstd[n];
#pragma unroll
            for (int j = 0; j < W; ++j) {
                const float d = static_cast<float>(dv.v[j]);
                sw[j] += d * ((static_cast<float>(xv.v[j]) - m) * rs);
                sb[j] += d;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < W; ++j) {
        part_w[row_lane][lane * W + j] = sw[j];
        part_b[row_lane][lane * W + j] = sb[j];
    }
    __syncthreads();
    if (row_lane != 0 || c0 >= C) return;
#pragma unroll
    for (int j = 0; j < W; ++j) {
        float tw = 0.0f, tb = 0.0f;
        for (int k = 0; k < layernorm_row_lanes; ++k) {
            tw += part_w[k][lane * W + j];
            tb += part_b[k][lane * W + j];
        }
        const int c = c0 + j;
        if (chunks == 1) {
            dweight[c] += tw;
            dbias[c] += tb;
        } else {
            partial[blockIdx.y * std::int64_t{C} + c] = tw;
            partial[(chunks + blockIdx.y) * std::int64_t{C} + c] = tb;
        }
    }
}

// Row chunks for the parameter gradients of N rows of C channels: about 64
// rows each, at most 256, at most what `scratch_floats` holds (2 x C floats
// a chunk); 1 without scratch.
inline int layernorm_params_chunks(std::int64_t N, int C, std::size_t scratch_floats) {
    const std::int64_t fits = static_cast<std::int64_t>(scratch_floats) / (2 * std::int64_t{C});
    const std::int64_t wanted = (N + layernorm_params_rows_per_chunk - 1) / layernorm_params_rows_per_chunk;
    return static_cast<int>(std::max<std::int64_t>(1, std::min({wanted, layernorm_params_max_chunks, fits})));
}

// True when C channels of T and every pointer allow 16-byte vectors.
template <class T>
bool layernorm_vectorised(int C, std::initializer_list<const T*> pointers) {
    constexpr int W = layernorm_vec<T>;
    if (C % W != 0) return false;
    for (const T* p : pointers)
        if (!vec_aligned<T, W>(p)) return false;
    return true;
}

inline unsigned layernorm_row_blocks(std::int64_t N) {
    return grid_stride_blocks(N, layernorm_rows_per_block, std::int64_t{1} << 20);
}

template <bool Add, class T>
void launch_layernorm_forward(const Device& dev, T* out, float* mean, float* rstd, const T* inp, const T* residual,
                              T* sum, const T* weight, const T* bias, std::int64_t N, int C) {
    const auto run = [&]<int W>() {
        launch<layernorm_forward_kernel<T, W, Add>>(layernorm_row_blocks(N), layernorm_rows_per_block * 32, 0,
                                                    dev.stream, out, mean, rstd, inp, residual, sum, weight, bias, N,
                                                    C);
    };
    const bool aligned = layernorm_vectorised<T>(C, {out, inp, weight, bias}) &&
                         (!Add || layernorm_vectorised<T>(C, {residual, sum}));
    if (aligned)
        run.template operator()<layernorm_vec<T>>();
    else
        run.template operator()<1>();
}

}  // namespace detail

// out[n, :] = (inp[n, :] - mean[n]) * rstd[n] * weight + bias, with the fp32
// statistics mean and rstd = 1 / sqrt(biased variance + 1e-5) of row n saved
// for the backward. One warp per row, two passes over the row (mean, then the
// variance about it). Throws ShapeError for a negative size or C == 0.
template <CudaFloat T>
void layernorm_forward(const Device& dev, T* out,  // (N, C)
                       float* mean,                // (N)
                       float* rstd,                // (N)
                       const T* inp,               // (N, C)
                       const T* weight,            // (C)
                       const T* bias,              // (C)
                       std::int64_t N, int C) {
    ops::check_layernorm("layernorm_forward", N, C);
    if (N == 0) return;
    detail::launch_layernorm_forward<false>(dev, out, mean, rstd, inp, static_cast<const T*>(nullptr),
                                            static_cast<T*>(nullptr), weight, bias, N, C);
}

// res += x (each sum rounded once to T), then out = LayerNorm(res) with its
// statistics saved, as layernorm_forward: the same bits as add_inplace
// followed by layernorm_forward, reading res and x once instead of res twice
// (a block's second residual add and its ln2). Throws ShapeError for a
// negative size or C == 0.
template <CudaFloat T>
void residual_layernorm_forward(const Device& dev, T* out,  // (N, C)
                                float* mean,                // (N)
                                float* rstd,                // (N)
                                T* res,                     // (N, C) += x
                                const T* x,                 // (N, C)
                                const T* weight,            // (C)
                                const T* bias,              // (C)
                                std::int64_t N, int C) {
    ops::check_layernorm("residual_layernorm_forward", N, C);
    if (N == 0) return;
    detail::launch_layernorm_forward<true>(dev, out, mean, rstd, res, x, res, weight, bias, N, C);
}

// With xhat = (inp - mean) * rstd and g = weight * dout, per row:
//   dinp    += (g - mean_c(g) - xhat * mean_c(g * xhat)) * rstd   (T, accumulates)
//   dweight += sum_n dout * xhat,  dbias += sum_n dout               (fp32)
// Deterministic: fixed reduction trees, one owner per output element, the
// parameter gradients' row chunks (layernorm_backward_params_kernel) added in
// order. Throws ShapeError for a negative size or C == 0.
template <CudaFloat T>
void layernorm_backward(const Device& dev, T* dinp,  // (N, C) +=
                        float* dweight,              // (C) +=
                        float* dbias,                // (C) +=
                        const T* dout,               // (N, C)
                        const T* inp,                // (N, C)
                        const T* weight,             // (C)
                        const float* mean,           // (N)
                        const float* rstd,           // (N)
                        std::int64_t N, int C) {
    ops::check_layernorm("layernorm_backward", N, C);
    if (N == 0) return;
    // Partial sums live in the Blas workspace (free between GEMMs on this
    // stream); without a Blas on the device tag, one chunk.
    const int chunks =
        detail::layernorm_params_chunks(N, C, dev.blas != nullptr ? dev.blas->scratch_capacity<float>() : 0);
    float* partial = dev.blas != nullptr ? dev.blas->scratch<float>(2 * static_cast<std::size_t>(chunks) * C) : nullptr;
    const auto run = [&]<int W>() {
        launch<detail::layernorm_backward_input_kernel<T, W>>(detail::layernorm_row_blocks(N),
                                                              detail::layernorm_rows_per_block * 32, 0, dev.stream,
                                                              dinp, dout, inp, weight, mean, rstd, N, C);
        const dim3 grid(static_cast<unsigned>((C + 32 * W - 1) / (32 * W)), static_cast<unsigned>(chunks));
        const dim3 block(32, detail::layernorm_row_lanes);
        launch<detail::layernorm_backward_params_kernel<T, W>>(grid, block, 0, dev.stream, dweight, dbias, partial,
                                                               dout, inp, mean, rstd, N, C);
    };
    constexpr int W = detail::layernorm_vec<T>;
    if (detail::layernorm_vectorised<T>(C, {dinp, dout, inp, weight}))
        run.template operator()<W>();
    else
        run.template operator()<1>();
    if (chunks > 1) {
        const auto finish_blocks = static_cast<unsigned>((C + 255) / 256);
        launch<detail::bias_grad_finish_kernel<float>>(finish_blocks, 256, 0, dev.stream, dweight, partial, chunks, C);
        launch<detail::bias_grad_finish_kernel<float>>(finish_blocks, 256, 0, dev.stream, dbias,
                                                       partial + std::int64_t{chunks} * C, chunks, C);
    }
}

}  // namespace snug::cuda
