// Compiler configuration shared by every snug header: the one host/device
// function qualifier, and what the current compiler can do.
#pragma once

// SNUG_HD marks a function that is compiled for the host and, under nvcc, for
// the device too. It is the only macro the library defines for code; everything
// else is a template or a constexpr (the emulated backend's CUDA keywords aside).
#if defined(__CUDACC__)
#define SNUG_HD __host__ __device__ inline
#else
#define SNUG_HD inline
#endif

// SNUG_CUDA_BACKEND is defined where snug's CUDA backend is compiled: under
// nvcc, and in the emulated backend (target snug::cuda_emulated, which defines
// SNUG_CUDA_EMULATED and runs the same kernels on the CPU). Headers that offer
// CUDA overloads include them under it.
#if defined(__CUDACC__) || defined(SNUG_CUDA_EMULATED)
#define SNUG_CUDA_BACKEND 1
#endif

namespace snug {

// True where the CUDA backend is the emulated one (kernels run on the CPU).
inline constexpr bool cuda_emulated =
#if defined(SNUG_CUDA_EMULATED)
    true;
#else
    false;
#endif

// True in a translation unit compiled by nvcc (host or device pass).
inline constexpr bool compiling_with_nvcc =
#if defined(__CUDACC__)
    true;
#else
    false;
#endif

}  // namespace snug
