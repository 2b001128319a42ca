// The CUDA encoder: token embedding plus position embedding (GPT-2's wte and
// wpe), forward and a deterministic backward into fp32 gradients that gives
// the host kernel's bits exactly.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <climits>
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
#include "snug/ops/encoder.hpp"

namespace snug::cuda {

namespace detail {

// T (every kernel template below): float, snug::bfloat16 or snug::half; math in fp32.

// out[r, c] = wte[tokens[r], c] + wpe[r % T, c], summed in fp32 and rounded
// once (wpe == nullptr: wte's value, copied); one thread per element,
// consecutive threads on consecutive channels.
template <class T>
__global__ void encoder_forward_kernel(T* out,                      // (B, T, C)
                                       const std::int32_t* tokens,  // (B, T)
                                       const T* wte,                // (Vp, C)
                                       const T* wpe,                // (maxT, C) or nullptr
                                       std::int64_t n, int T_, int C) {
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
        const std::int64_t row = i / C;
        const int c = static_cast<int>(i - row * C);
        const std::int64_t t = row % T_;
        const T te = wte[std::int64_t{tokens[row]} * C + c];
        out[i] = wpe == nullptr ? te : T(static_cast<float>(te) + static_cast<float>(wpe[t * C + c]));
    }
}

// dwpe[t, c] += dout[b, t, c] for b = 0, 1, ... in that order, one thread per
// (t, c): the host's order of additions, so the same bits.
template <class T>
__global__ void encoder_backward_wpe_kernel(float* dwpe,    // (maxT, C) +=
                                            const T* dout,  // (B, T, C)
                                            int B, int T_, int C) {
    const std::int64_t n = std::int64_t{T_} * C;
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
        float acc = dwpe[i];
        for (int b = 0; b < B; ++b) acc += static_cast<float>(dout[std::int64_t{b} * n + i]);
        dwpe[i] = acc;
    }
}

// The dwte backward. Token ids are split into encoder_partitions classes by
// id % encoder_partitions; block j owns class j, so every row of dwte has
// exactly one writer and no atomics are needed. Each block:
//   1. scans all B*T token ids in order, encoder_scan_rows at a time, and
//      appends the rows whose id is in its class to a list in shared memory
//      (a block-wide prefix sum keeps them in row order);
//   2. when the list could overflow, or at the end, sorts it by (id, row)
//      (bitonic sort in shared memory), and
//   3. walks the sorted list: for every run of one id, each thread takes its
//      channels, loads dwte[id, c] once, adds dout[row, c] for the run's rows in
//      row order, and stores it once.
// Every dwte element thus receives its contributions one at a time in row
// order, starting from its old value: the host kernel's order, hence its bits,
// on any GPU. Cost: every block reads all B*T ids (encoder_partitions * B*T
// 4-byte reads, mostly from L2: about 32 MiB for B*T = 16k), one small sort
// per list flush, and one pass over dout with coalesced reads and one
// read-modify-write of dwte per (distinct id in a flush, channel). A very
// frequent id makes its block the longest (its run is summed by one block,
// serially over rows, parallel over channels). Negative ids are skipped.
inline constexpr int encoder_partitions = 512;
inline constexpr int encoder_threads = 256;
inline constexpr int encoder_ids_per_thread = 4;
inline constexpr int encoder_scan_rows = encoder_threads * encoder_ids_per_thread;  // 1024
inline constexpr int encoder_list_capacity = 2048;
static_assert(encoder_list_capacity >= 2 * encoder_scan_rows, "a flush must leave room for one more scan");
static_assert(encoder_threads % 32 == 0 && encoder_threads <= 1024);

// Sorts keys[0, n) ascending in shared memory (n a power of two, n <= capacity).
__device__ inline void bitonic_sort(unsigned long long* keys, int n) {
    for (int size = 2; size <= n; size *= 2) {
        for (int stride = size / 2; stride > 0; stride /= 2) {
            for (int i = static_cast<int>(threadIdx.x); i < n / 2; i += static_cast<int>(blockDim.x)) {
                // The i-th compare-exchange pair (lo, lo + stride) of this stage.
                const int lo = 2 * i - (i & (stride - 1));
                const int hi = lo + stride;
                const bool ascending = (lo & size) == 0;
                const unsigned long long a = keys[lo], b = keys[hi];
                if ((a > b) == ascending) {
                    keys[lo] = b;
                    keys[hi] = a;
                }
            }
            __syncthreads();
        }
    }
}

template <class T>
__global__ void __launch_bounds__(encoder_threads)
    encoder_backward_wte_kernel(float* dwte,                 // (Vp, C) +=
                                const T* dout,               // (B, T, C)
                                const std::int32_t* tokens,  // (B, T)
                                std::int64_t rows, int C) {
    // key = id << 32 | row: sorting the keys sorts by id, then by row.
    struct Lists {
        unsigned long long list[encoder_list_capacity];
        int warp_counts[encoder_threads / 32];
        int count;
    };
    Lists& lists = block_shared<Lists>();
    auto& list = lists.list;
    auto& warp_counts = lists.warp_counts;
    int& count_shared = lists.count;
    const int part = static_cast<int>(blockIdx.x);
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int count = 0;  // the list's length, the same in every thread

    auto flush = [&]() {
        if (count == 0) return;
        int n = 1;
        while (n < count) n *= 2;
        for (int i = count + static_cast<int>(threadIdx.x); i < n; i += encoder_threads) list[i] = ~0ULL;
        __syncthreads();
        bitonic_sort(list, n);
        for (int c = static_cast<int>(threadIdx.x); c < C; c += encoder_threads) {
            int i = 0;
            while (i < count) {
                const auto id = static_cast<std::int64_t>(list[i] >> 32);
                float* g = dwte + id * C + c;
                float acc = *g;
                for (; i < count && static_cast<std::int64_t>(list[i] >> 32) == id; ++i) {
                    const auto row = static_cast<std::int64_t>(list[i] & 0xFFFF'FFFFULL);
                    acc += static_cast<float>(dout[row * C + c]);
                }
                *g = acc;
            }
        }
        __syncthreads();  // the list is rewritten next
        count = 0;
    };

    for (std::int64_t base = 0; base < rows; base += encoder_scan_rows) {
        // Thread k looks at rows base + 4k .. base + 4k + 3.
        std::int64_t mine[encoder_ids_per_thread];
        int ids[encoder_ids_per_thread];
        int matches = 0;
        for (int j = 0; j < encoder_ids_per_thread; ++j) {
            const std::int64_t r = base + std::int64_t{threadIdx.x} * encoder_ids_per_thread + j;
            const int id = r < rows ? tokens[r] : -1;
            if (id >= 0 && id % encoder_partitions == part) {
                mine[matches] = r;
                ids[matches] = id;
                ++matches;
            }
        }
        // Exclusive prefix sum of `matches` over the block, in thread order.
        int inclusive = matches;
        for (int offset = 1; offset < 32; offset *= 2) {
            const int other = __shfl_up_sync(0xFFFF'FFFFU, inclusive, offset);
            if (static_cast<int>(lane) >= offset) inclusive += other;
        }
        if (lane == 31) warp_counts[warp] = inclusive;
        __syncthreads();
        int before = inclusive - matches;
        for (unsigned w = 0; w < warp; ++w) before += warp_counts[w];
        if (threadIdx.x == encoder_threads - 1) count_shared = before + matches;
        for (int j = 0; j < matches; ++j) {
            list[count + before + j] = static_cast<unsigned long long>(ids[j]) << 32 |
                                       static_cast<unsigned long long>(mine[j]);
        }
        __syncthreads();
        count += count_shared;
        __syncthreads();  // count_shared and warp_counts are rewritten next
        if (count > encoder_list_capacity - encoder_scan_rows) flush();
    }
    flush();
}

// The shared contract (ops/encoder.hpp), then this backend's own limit: the
// kernels index rows with int.
inline void check_encoder(const char* op, int B, int T_, int C) {
    ops::check_encoder(op, B, T_, C);
    if (std::int64_t{B} * T_ > INT_MAX) {
        throw ShapeError(std::string(op) + ": B * T = " + std::to_string(std::int64_t{B} * T_) + " (B = " +
                         std::to_string(B) + ", T = " + std::to_string(T_) + ") rows is more than 2^31 - 1");
    }
}

}  // namespace detail

// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :], summed in fp32 and rounded
// once (the host kernel's bits); wpe == nullptr: wte's row, copied. Token ids are not checked on the device: they
// must lie in [0, Vp). Throws ShapeError for a negative size or B * T >= 2^31.
template <FloatStorage T>
void encoder_forward(const Device& dev, T* out,   // (B, T, C)
                     const std::int32_t* tokens,  // (B, T)
                     const T* wte,                // (Vp, C)
                     const T* wpe,                // (maxT, C) or nullptr
                     int B, int T_, int C) {
    detail::check_encoder("encoder_forward", B, T_, C);
    const std::int64_t n = std::int64_t{B} * T_ * C;
    if (n == 0) return;
    launch<detail::encoder_forward_kernel<T>>(detail::grid_stride_blocks(n, 256), 256, 0, dev.stream, out, tokens, wte,
                                              wpe, n, T_, C);
}

// dwte[tokens[b, t], :] += dout[b, t, :] and dwpe[t, :] += dout[b, t, :]
// (dwpe == nullptr: no positions), in fp32. Deterministic, and equal bit for bit to the host kernel: every gradient
// element receives its contributions one at a time in order of (b, t) (see
// encoder_backward_wte_kernel for how, and what it costs). Negative token ids
// are skipped; ids >= Vp are not checked. Throws ShapeError for a negative size
// or B * T >= 2^31.
template <FloatStorage T>
void encoder_backward(const Device& dev, float* dwte,  // (Vp, C) +=
                      float* dwpe,                     // (maxT, C) += or nullptr
                      const T* dout,                   // (B, T, C)
                      const std::int32_t* tokens,      // (B, T)
                      int B, int T_, int C) {
    detail::check_encoder("encoder_backward", B, T_, C);
    const std::int64_t rows = std::int64_t{B} * T_;
    if (rows == 0 || C == 0) return;
    launch<detail::encoder_backward_wte_kernel<T>>(detail::encoder_partitions, detail::encoder_threads, 0, dev.stream,
                                                   dwte, dout, tokens, rows, C);
    if (dwpe == nullptr) return;
    const std::int64_t n = std::int64_t{T_} * C;
    launch<detail::encoder_backward_wpe_kernel<T>>(detail::grid_stride_blocks(n, 256), 256, 0, dev.stream, dwpe, dout, B,
                                                   T_, C);
}

}  // namespace snug::cuda
