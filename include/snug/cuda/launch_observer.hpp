// LaunchObserver: something that sees every piece of device work a thread
// queues, for measuring, not computing (the step benchmark's kernel timer).
// Apart from launch.hpp so that host-compiled code (cuda/cudnn_attention.hpp)
// can report its work too without seeing `<<<>>>`.
#pragma once

#include "snug/cuda/runtime.hpp"

namespace snug::cuda {

// Something that sees every piece of device work this thread queues — each
// kernel snug::cuda::launch queues (launch.hpp), each cuBLASLt matmul (blas.hpp) and each fused
// attention call (cuda/cudnn_attention.hpp) — called just before and just
// after it is queued on its stream: the step benchmark records CUDA events
// there to sum the kernels' time against the whole step's, which is how
// launch gaps are measured. None by default (a test per launch).
class LaunchObserver {
public:
    virtual ~LaunchObserver() = default;
    virtual void before(cudaStream_t stream) = 0;
    virtual void after(cudaStream_t stream) = 0;
};

inline LaunchObserver*& launch_observer() {
    thread_local LaunchObserver* observer = nullptr;
    return observer;
}

// Calls launch_observer() around `queue()`, which queues one piece of work on `stream`.
template <class F>
void observed(cudaStream_t stream, F&& queue) {
    LaunchObserver* const o = launch_observer();
    if (o != nullptr) o->before(stream);
    queue();
    if (o != nullptr) o->after(stream);
}

}  // namespace snug::cuda
