// The CUDA fused softmax + cross-entropy: per-row losses -log softmax(logits)[target]
// and, in place of the logits, their gradient (softmax - onehot(target)) * dloss.
// Probabilities are never stored separately. 128-bit loads and stores where
// the padded row length and the pointer allow.
#pragma once

#include "snug/cuda/runtime.hpp"

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
#include "snug/ops/cross_entropy.hpp"

namespace snug::cuda {

namespace detail {

inline constexpr int cross_entropy_threads = 512;

// A running softmax denominator: sum of exp(x - max) over the values seen.
struct SoftmaxState {
    float max;
    float sum;
};

// The state of the union of two sets of values. A side whose max is the new
// max enters unscaled, so two -inf maxima give no NaN (and an all -inf row
// keeps sum > 0 and max -inf, hence a NaN loss, as on the host).
__device__ inline SoftmaxState softmax_combine(SoftmaxState a, SoftmaxState b) {
    const float m = fmaxf(a.max, b.max);
    const float sa = a.max == m ? a.sum : a.sum * expf(a.max - m);
    const float sb = b.max == m ? b.sum : b.sum * expf(b.max - m);
    return {m, sa + sb};
}

// The state over the whole block, returned to every thread (fixed tree: the
// same bits every run). `scratch` is 64 floats of shared memory.
__device__ inline SoftmaxState block_softmax_combine(SoftmaxState s, float* scratch) {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int offset = 16; offset > 0; offset /= 2) {
        const SoftmaxState other{__shfl_xor_sync(0xFFFF'FFFFU, s.max, offset),
                                 __shfl_xor_sync(0xFFFF'FFFFU, s.sum, offset)};
        s = softmax_combine(s, other);
    }
    if (lane == 0) {
        scratch[warp] = s.max;
        scratch[32 + warp] = s.sum;
    }
    __syncthreads();
    SoftmaxState w = lane < warps ? SoftmaxState{scratch[lane], scratch[32 + lane]} : SoftmaxState{-INFINITY, 0.0f};
    for (int offset = 16; offset > 0; offset /= 2) {
        const SoftmaxState other{__shfl_xor_sync(0xFFFF'FFFFU, w.max, offset),
                                 __shfl_xor_sync(0xFFFF'FFFFU, w.sum, offset)};
        w = softmax_combine(w, other);
    }
    __syncthreads();
    return w;
}

// Adds v to a running softmax state.
__device__ inline void softmax_add(SoftmaxState& s, float v) {
    if (v > s.max) {
        s.sum = s.sum * expf(s.max - v) + 1.0f;
        s.max = v;
    } else {
        s.sum += v == s.max ? 1.0f : expf(v - s.max);  // a NaN v makes the sum NaN
    }
}

// Elements per 16-byte vector of T.
template <class T>
inline constexpr int cross_entropy_vec = static_cast<int>(16 / sizeof(T));

// One block per row (grid-stride over rows). Pass 1: each thread keeps an
// online (max, sum) over its strided columns, the block combines them. Then
// the loss; pass 2 (only when dloss != 0) overwrites the row with the gradient.
// W columns per load and store: 16 bytes when Vp is a multiple of that and the
// logits are aligned (pass 1 takes the whole vectors below V, then the last
// V % W columns one each), else W = 1.
// T: float, snug::bfloat16 or snug::half; math in fp32.
template <class T, int W>
__global__ void __launch_bounds__(cross_entropy_threads)
    softmax_cross_entropy_kernel(float* losses,                // (N)
                                 T* logits,                    // (N, Vp)
                                 const std::int32_t* targets,  // (N)
                                 std::int64_t N, int V, int Vp, float dloss) {
    using Vec = detail::Vec<T, W>;
    auto& scratch = block_shared<float[64]>();
    const int tid = static_cast<int>(threadIdx.x);
    for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
        T* x = logits + row * Vp;
        const std::int32_t target = targets[row];
        if (target < 0 || target >= V) {
            // An id outside [0, V): NaN loss (a finite check sees it), row untouched.
            if (threadIdx.x == 0) losses[row] = __int_as_float(0x7FFF'FFFF);
            continue;
        }
        // Read before any thread of the block writes the row.
        const float x_target = static_cast<float>(x[target]);
        SoftmaxState s{-INFINITY, 0.0f};
        const int whole = V / W;  // vectors entirely below V
        for (int v = tid; v < whole; v += cross_entropy_threads) {
            const Vec xv = reinterpret_cast<const Vec*>(x)[v];
#pragma unroll
            for (int j = 0; j < W; ++j) softmax_add(s, static_cast<float>(xv.v[j]));
        }
        for (int j = whole * W + tid; j < V; j += cross_entropy_threads) softmax_add(s, static_cast<float>(x[j]));
        s = block_softmax_combine(s, scratch);
        if (threadIdx.x == 0) losses[row] = (s.max - x_target) + logf(s.sum);
        if (dloss != 0.0f) {
            const float scale = dloss / s.sum;
            for (int v = tid; v < Vp / W; v += cross_entropy_threads) {
                Vec xv = reinterpret_cast<const Vec*>(x)[v];
#pragma unroll
                for (int k = 0; k < W; ++k) {
                    const int j = v * W + k;
                    float g = 0.0f;
                    if (j == target) {
                        g = (expf(x_target - s.max) / s.sum - 1.0f) * dloss;
                    } else if (j < V) {
                        g = expf(static_cast<float>(xv.v[k]) - s.max) * scale;
                    }
                    xv.v[k] = T(g);
                }
                reinterpret_cast<Vec*>(x)[v] = xv;
            }
        }
    }
}

}  // namespace detail

// losses[i] = -log softmax(logits[i, 0..V))[targets[i]], in fp32, computed as
// (max - x[target]) + log(sum exp(x - max)). When dloss != 0 the logits are
// replaced by the gradient of dloss * sum_i losses[i]: (softmax - onehot(target))
// * dloss, rounded once to T, with the padded columns V..Vp set to 0; when
// dloss == 0 (evaluation) the logits are left untouched. One block per row;
// deterministic. Targets are not checked on the host (they are device memory):
// a target outside [0, V) gives that row a NaN loss and leaves its logits
// untouched. Throws ShapeError for a negative size, V > Vp, or V == 0 with rows.
// T: float, snug::bfloat16 or snug::half.
template <FloatStorage T>
void softmax_cross_entropy(const Device& dev, float* losses,  // (N)
                           T* logits,                         // (N, Vp): in logits, out dlogits
                           const std::int32_t* targets,       // (N)
                           std::int64_t N, int V, int Vp, float dloss) {
    constexpr const char* op = "softmax_cross_entropy";
    ops::check_cross_entropy(op, N, V, Vp);
    if (N == 0) return;
    const auto blocks = static_cast<unsigned>(N < (std::int64_t{1} << 20) ? N : (std::int64_t{1} << 20));
    constexpr int W = detail::cross_entropy_vec<T>;
    if (Vp % W == 0 && detail::vec_aligned<T, W>(logits))
        launch<detail::softmax_cross_entropy_kernel<T, W>>(blocks, detail::cross_entropy_threads, 0, dev.stream, losses,
                                                           logits, targets, N, V, Vp, dloss);
    else
        launch<detail::softmax_cross_entropy_kernel<T, 1>>(blocks, detail::cross_entropy_threads, 0, dev.stream, losses,
                                                           logits, targets, N, V, Vp, dloss);
}

}  // namespace snug::cuda
