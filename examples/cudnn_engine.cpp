// Registers cuDNN's fused SDPA as the program's attention engine (--attention
// auto or cudnn; cuda/cudnn_attention.hpp). A program of your own copies
// these two lines into a .cpp built by the host compiler: nvcc never compiles
// cuDNN's frontend. snug's build compiles this file once (the object library
// snug_cudnn_engine, where CMake found cuDNN 9 and its frontend) for
// train_gpt, vram_ladder, the CUDA tests and benchmarks, and once more per
// emulated program, whose cuDNN is emulated.
#include "snug/cuda/cudnn_attention.hpp"

static const snug::cuda::CudnnRegistration cudnn;
