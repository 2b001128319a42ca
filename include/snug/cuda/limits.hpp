// What every CUDA GPU snug targets allows a launch (compute capability 7.0 and
// later, so Ampere, Ada and Hopper alike): block and grid sizes, and the
// shared memory a kernel gets without opting in. The emulated device has the
// same limits; launch() checks them before any launch. Plain C++: the
// planner reads blas_workspace_bytes without CUDA.
#pragma once

#include <cstddef>

namespace snug::cuda {

struct LaunchLimits {
    static constexpr unsigned max_threads_per_block = 1024;
    static constexpr unsigned max_block_dim[3] = {1024, 1024, 64};
    static constexpr unsigned max_grid_dim[3] = {0x7FFF'FFFFU, 65535, 65535};
    // Dynamic shared memory a kernel may take unless
    // cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n)
    // raised its limit (up to the device's opt-in maximum: 227 KiB on Hopper,
    // 99 KiB on sm_86/89); also the limit of its static shared memory.
    static constexpr std::size_t default_shared_bytes = std::size_t{48} << 10;
};

// The workspace cuda::Blas gives cuBLASLt on a card of compute capability
// `major`: 32 MiB on Hopper, as NVIDIA recommends there, 4 MiB before. A
// memory plan for a card counts it (train/memory_plan.hpp's Card).
constexpr std::size_t blas_workspace_bytes(int major) {
    return major == 9 ? std::size_t{32} << 20 : std::size_t{4} << 20;
}

}  // namespace snug::cuda
