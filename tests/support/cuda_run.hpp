// Test support: the tracker, cuBLASLt handle, arenas and context a CUDA test
// needs to run a model, in one object (the CUDA twin of host_run.hpp).
#pragma once

#include "snug/core/arena.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/cuda/blas.hpp"
#include "snug/cuda/fused_attention.hpp"
#include "snug/nn/context.hpp"

namespace snug::test {

struct CudaRun {
    MemoryTracker tracker;
    cuda::Blas blas{tracker};
    ActivationArena<Cuda> activations{tracker};
    ActivationArena<Cuda> scratch{tracker, ActivationArena<Cuda>::default_chunk_bytes, MemoryCategory::temporaries};
    Context<Cuda> ctx{Cuda{}, activations, scratch};
    CudaRun() {
        ctx.device.blas = &blas;
        ctx.device.fused = cuda::registered_fused_attention();  // AttentionKind::cudnn's engine, if registered
    }
};

}  // namespace snug::test
