// CUDA elementwise kernels: the residual add (out = a + b), accumulation
// (dst += src), scaling (x *= s) and the cast between element types; each
// computed in fp32 and rounded once to nearest even on a 16-bit store, the
// same bits as snug/host/elementwise.hpp. Also the machinery they share with
// gelu.cuh: the element-type concept and a one-pass map over one or two
// inputs with 128-bit loads and stores where the pointers allow.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "snug/core/error.hpp"
#include "snug/core/dtype.hpp"  // FloatStorage: the element types the kernels read and write (math in fp32)
#include "snug/core/half.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/launch.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::cuda {

namespace detail {

inline constexpr int elementwise_block = 256;
// At most this many blocks (about a million threads, enough to keep any
// current GPU's memory busy); grid-stride loops cover larger n.
inline constexpr std::int64_t elementwise_max_blocks = 4096;

// W consecutive elements moved by one load or store (128 bits for the widest
// type of a map, 64 for a 16-bit side of a float <-> 16-bit map).
template <class T, int W>
struct alignas(sizeof(T) * W) Vec {
    T v[W];
};

// Elements per vector in a map over these types: 16 bytes of the widest.
template <class... T>
inline constexpr int vec_width = static_cast<int>(16 / std::max({sizeof(T)...}));

template <class T>
__device__ __forceinline__ float widen(T x) {
    return static_cast<float>(x);
}

// out[i] = Out(f(float(in[i]))). Thread t takes vector t (elements t*W ..
// t*W + W - 1), then every gridDim.x * blockDim.x-th vector; the n % W
// elements past the last whole vector go one each to the first threads.
// out may equal in.
template <int W, class Out, class In, class F>
__global__ void map1_kernel(Out* out,        // (n)
                            const In* in,    // (n)
                            std::int64_t n, F f) {
    const std::int64_t n_vec = n / W;
    const std::int64_t first = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    for (std::int64_t v = first; v < n_vec; v += stride) {
        const Vec<In, W> x = reinterpret_cast<const Vec<In, W>*>(in)[v];
        Vec<Out, W> y;
#pragma unroll
        for (int j = 0; j < W; ++j) y.v[j] = Out(f(widen(x.v[j])));
        reinterpret_cast<Vec<Out, W>*>(out)[v] = y;
    }
    const std::int64_t i = n_vec * W + first;
    if (i < n) out[i] = Out(f(widen(in[i])));
}

// out[i] = Out(f(float(a[i]), float(b[i]))); out may equal a or b.
template <int W, class Out, class In, class F>
__global__ void map2_kernel(Out* out,       // (n)
                            const In* a,    // (n)
                            const In* b,    // (n)
                            std::int64_t n, F f) {
    const std::int64_t n_vec = n / W;
    const std::int64_t first = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    for (std::int64_t v = first; v < n_vec; v += stride) {
        const Vec<In, W> x = reinterpret_cast<const Vec<In, W>*>(a)[v];
        const Vec<In, W> z = reinterpret_cast<const Vec<In, W>*>(b)[v];
        Vec<Out, W> y;
#pragma unroll
        for (int j = 0; j < W; ++j) y.v[j] = Out(f(widen(x.v[j]), widen(z.v[j])));
        reinterpret_cast<Vec<Out, W>*>(out)[v] = y;
    }
    const std::int64_t i = n_vec * W + first;
    if (i < n) out[i] = Out(f(widen(a[i]), widen(b[i])));
}

// True when p is aligned for vectors of W elements of T.
template <class T, int W>
bool vec_aligned(const T* p) {
    return reinterpret_cast<std::uintptr_t>(p) % alignof(Vec<T, W>) == 0;
}

// Blocks for n elements in vectors of W.
inline unsigned map_blocks(std::int64_t n, int W) {
    const std::int64_t work = std::max<std::int64_t>(n / W, n % W);
    const std::int64_t blocks = (work + elementwise_block - 1) / elementwise_block;
    return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, elementwise_max_blocks));
}

// Launches out = f(in) on dev.stream: vectorised when every pointer allows it,
// one element per step otherwise. n > 0.
template <class Out, class In, class F>
void map1(const Device& dev, Out* out, const In* in, std::int64_t n, F f) {
    constexpr int W = vec_width<Out, In>;
    if (vec_aligned<Out, W>(out) && vec_aligned<In, W>(in)) {
        launch<map1_kernel<W, Out, In, F>>(map_blocks(n, W), elementwise_block, 0, dev.stream, out, in, n, f);
    } else {
        launch<map1_kernel<1, Out, In, F>>(map_blocks(n, 1), elementwise_block, 0, dev.stream, out, in, n, f);
    }
}

// Launches out = f(a, b) on dev.stream, like map1. n > 0.
template <class Out, class In, class F>
void map2(const Device& dev, Out* out, const In* a, const In* b, std::int64_t n, F f) {
    constexpr int W = vec_width<Out, In>;
    if (vec_aligned<Out, W>(out) && vec_aligned<In, W>(a) && vec_aligned<In, W>(b)) {
        launch<map2_kernel<W, Out, In, F>>(map_blocks(n, W), elementwise_block, 0, dev.stream, out, a, b, n, f);
    } else {
        launch<map2_kernel<1, Out, In, F>>(map_blocks(n, 1), elementwise_block, 0, dev.stream, out, a, b, n, f);
    }
}

struct Add {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct Scale {
    float s;
    __device__ float operator()(float x) const { return x * s; }
};
struct Identity {
    __device__ float operator()(float x) const { return x; }
};

}  // namespace detail

// out = a + b, elementwise; out may equal a or b.
template <FloatStorage T>
void residual_forward(const Device& dev, T* out,  // (n)
                      const T* a,                 // (n)
                      const T* b,                 // (n)
                      std::int64_t n) {
    ops::check_non_negative("residual_forward", {{"n", n}});
    if (n > 0) detail::map2(dev, out, a, b, n, detail::Add{});
}

// dst += src, elementwise.
template <FloatStorage T>
void add_inplace(const Device& dev, T* dst,  // (n)
                 const T* src,               // (n)
                 std::int64_t n) {
    ops::check_non_negative("add_inplace", {{"n", n}});
    if (n > 0) detail::map2(dev, dst, dst, src, n, detail::Add{});
}

// x *= s, elementwise (in fp32; for float exactly x[i] * s).
template <FloatStorage T>
void scale_inplace(const Device& dev, T* x,  // (n)
                   std::int64_t n, float s) {
    ops::check_non_negative("scale_inplace", {{"n", n}});
    if (n > 0) detail::map1(dev, x, x, n, detail::Scale{s});
}

// out = in converted to Dst: exact when widening, one round-to-nearest-even
// step when narrowing (float -> 16-bit, one 16-bit type -> the other, through
// float); the same type is a byte copy. out must not overlap in unless they
// are the same type and pointer.
template <FloatStorage Dst, FloatStorage Src>
void cast(const Device& dev, Dst* out,  // (n)
          const Src* in,                // (n)
          std::int64_t n) {
    ops::check_non_negative("cast", {{"n", n}});
    if (n == 0) return;
    if constexpr (std::same_as<Dst, Src>) {
        if (out != in)
            check(cudaMemcpyAsync(out, in, static_cast<std::size_t>(n) * sizeof(Dst), cudaMemcpyDeviceToDevice,
                                  dev.stream));
    } else {
        detail::map1(dev, out, in, n, detail::Identity{});
    }
}

}  // namespace snug::cuda
