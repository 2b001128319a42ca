// Registers cuDNN's fused SDPA as this program's attention engine (--attention
// auto or cudnn). Built by the host compiler, as report.cpp is: nvcc never
// compiles cuDNN's frontend. CMake adds this file where it found cuDNN 9 and
// its frontend (snug_cudnn), and to the emulated build, whose cuDNN is emulated.
#include "snug/cuda/cudnn_attention.hpp"

static const snug::cuda::CudnnRegistration cudnn;
