// The CUDA runtime, cuBLASLt and device-function declarations snug's CUDA
// backend is written against: NVIDIA's headers under nvcc (and for host code
// beside it), the emulated backend's (snug/cuda/emulated/) where the target
// snug::cuda_emulated defines SNUG_CUDA_EMULATED. Every CUDA header of snug
// includes this one instead of <cuda_runtime_api.h> or <cublasLt.h>; so should
// a user's kernel header that is to run emulated.
#pragma once

#if defined(SNUG_CUDA_EMULATED)
#include "snug/cuda/emulated/cublaslt.hpp"
#include "snug/cuda/emulated/intrinsics.hpp"
#include "snug/cuda/emulated/runtime.hpp"
#include "snug/cuda/emulated/shared_check.hpp"
#include "snug/cuda/emulated/simt.hpp"
#else
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#endif
