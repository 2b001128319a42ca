// Registers cuDNN's fused SDPA as the fused attention engine of the CUDA test
// executables (tests/cuda/fused_attention_test.cu): on the emulated backend
// its emulated twin, on a GPU cuDNN itself where CMake found it. Built by the
// host compiler, as every program's cuDNN translation unit is.
#include "snug/cuda/cudnn_attention.hpp"

static const snug::cuda::CudnnRegistration cudnn;
