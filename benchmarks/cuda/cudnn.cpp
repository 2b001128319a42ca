// Registers cuDNN's fused SDPA for the CUDA benchmarks, which then time
// attention on it beside snug's flash kernels. Built by the host compiler.
#include "snug/cuda/cudnn_attention.hpp"

static const snug::cuda::CudnnRegistration cudnn;
