// The kernels layers call, for every backend this translation unit can use:
// the host backend and the metering device (snug::Meter) always, the CUDA
// backend under nvcc or emulated (SNUG_CUDA_BACKEND). Layer code calls them
// unqualified with the device tag first; argument-dependent lookup picks the
// backend from the tag's namespace.
#pragma once

#include "snug/host/adamw.hpp"
#include "snug/host/attention.hpp"
#include "snug/host/cross_entropy.hpp"
#include "snug/host/elementwise.hpp"
#include "snug/host/encoder.hpp"
#include "snug/host/flash_attention.hpp"
#include "snug/host/fused_attention.hpp"
#include "snug/host/gelu.hpp"
#include "snug/host/layernorm.hpp"
#include "snug/host/linear.hpp"
#include "snug/host/norms.hpp"
#include "snug/host/rmsnorm.hpp"
#include "snug/host/rope.hpp"
#include "snug/host/swiglu.hpp"
#include "snug/host/transfer.hpp"
#include "snug/host/unscale.hpp"
#include "snug/meter/ops.hpp"

#if defined(SNUG_CUDA_BACKEND)
#include "snug/cuda/adamw.cuh"
#include "snug/cuda/attention.cuh"
#include "snug/cuda/cross_entropy.cuh"
#include "snug/cuda/elementwise.cuh"
#include "snug/cuda/encoder.cuh"
#include "snug/cuda/flash_attention.cuh"
#include "snug/cuda/fused_attention.hpp"
#include "snug/cuda/gelu.cuh"
#include "snug/cuda/layernorm.cuh"
#include "snug/cuda/linear.cuh"
#include "snug/cuda/norms.cuh"
#include "snug/cuda/rmsnorm.cuh"
#include "snug/cuda/rope.cuh"
#include "snug/cuda/swiglu.cuh"
#include "snug/cuda/transfer.cuh"
#include "snug/cuda/unscale.cuh"
#endif
