// Compiler configuration shared by every snug header: the one host/device
// function qualifier, and what the current compiler can do.
#pragma once

// SNUG_HD marks a function that is compiled for the host and, under nvcc, for
// the device too. It is the only macro the library defines for code; everything
// else is a template or a constexpr.
#if defined(__CUDACC__)
#define SNUG_HD __host__ __device__ inline
#else
#define SNUG_HD inline
#endif

namespace snug {

// True in a translation unit compiled by nvcc (host or device pass).
inline constexpr bool compiling_with_nvcc =
#if defined(__CUDACC__)
    true;
#else
    false;
#endif

}  // namespace snug
