// snug: the umbrella header. Includes everything a trainer needs; under nvcc it
// adds the CUDA backend (device tag, error checks, kernels).
#pragma once

#include "snug/core/config.hpp"
#include "snug/core/device.hpp"
#include "snug/core/dtype.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/core/memory.hpp"
#include "snug/core/rng.hpp"
#include "snug/core/tensor.hpp"
#include "snug/host/gemm.hpp"

#if defined(__CUDACC__)
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/memory.hpp"
#endif
