// The CUDA C++ vocabulary the emulated backend gives host compilers: the
// keywords (__global__, __device__, __shared__, ...), the built-in vector
// types (dim3, uint3, float4, ...) and warpSize. Only translation units that
// build the emulated CUDA backend (SNUG_CUDA_EMULATED) see this header.
//
// The keywords must be macros: they are CUDA's syntax, and nothing else can
// stand where they stand. __global__ and __device__ vanish (a kernel is an
// ordinary function, started by snug::cuda::launch); __forceinline__ means
// `inline`, as in CUDA's own headers, so a non-template device function in a
// header must be `inline` or `__forceinline__` (under nvcc too, it is then
// safe to include twice). A plain `__shared__` variable becomes a block-scope
// thread_local: one instance per worker thread, which runs one block at a
// time, so its meaning is CUDA's, but the emulator cannot poison it per block
// nor check it for races. Kernels that want both declare shared memory with
// snug::cuda::block_shared<S>() and dynamic_shared<T>() (snug/cuda/shared_memory.hpp),
// as snug's own do. `extern __shared__` arrays do not link: use dynamic_shared<T>().
#pragma once

#if !defined(SNUG_CUDA_EMULATED)
#error "snug/cuda/emulated/types.hpp is for the emulated CUDA backend (link snug::cuda_emulated)"
#endif
#if defined(__CUDACC__)
#error "the emulated CUDA backend is for host compilers; nvcc builds the real one"
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ thread_local
#define __constant__
#define __managed__

// ---- built-in vector types (CUDA's sizes and alignments) -------------------------

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

struct alignas(8) int2 {
    int x, y;
};
struct int3 {
    int x, y, z;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(4) short2 {
    short x, y;
};
struct alignas(4) ushort2 {
    unsigned short x, y;
};
struct alignas(8) float2 {
    float x, y;
};
struct float3 {
    float x, y, z;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) double2 {
    double x, y;
};
struct alignas(16) longlong2 {
    long long x, y;
};
struct alignas(16) ulonglong2 {
    unsigned long long x, y;
};

constexpr int2 make_int2(int x, int y) { return {x, y}; }
constexpr int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
constexpr uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
constexpr uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
constexpr uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
constexpr float2 make_float2(float x, float y) { return {x, y}; }
constexpr float3 make_float3(float x, float y, float z) { return {x, y, z}; }
constexpr float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
constexpr double2 make_double2(double x, double y) { return {x, y}; }

static_assert(sizeof(float4) == 16 && alignof(float4) == 16);
static_assert(sizeof(float2) == 8 && alignof(float2) == 8);

inline constexpr int warpSize = 32;
