// A kernel that writes one element past the end of its memory: device memory
// (`out_of_bounds global`) or dynamic shared memory (`out_of_bounds shared`).
// Under AddressSanitizer the emulated run must stop with a heap-buffer-overflow
// report whose stack names the kernel; CTest runs it in sanitizer builds and
// looks for that report. Without a sanitizer it proves nothing, and is not run.
#include <cstdio>
#include <cstring>

#include "snug/cuda/check.hpp"
#include "snug/cuda/launch.hpp"
#include "snug/cuda/runtime.hpp"
#include "snug/cuda/shared_memory.hpp"

namespace {

__global__ void past_global_end_kernel(float* out) {  // (n), launched with n + 1 threads
    out[threadIdx.x] = 1.0f;
}

__global__ void past_shared_end_kernel(float* out) {  // n + 1 threads, n floats of dynamic shared memory
    float* s = snug::cuda::dynamic_shared<float>();
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[0] = s[0];
}

}  // namespace

int main(int argc, char** argv) {
    constexpr int n = 32;
    float* out = nullptr;
    snug::cuda::check(cudaMalloc(&out, n * sizeof(float)));
    if (argc == 2 && std::strcmp(argv[1], "global") == 0) {
        snug::cuda::launch<past_global_end_kernel>(1, n + 1, 0, nullptr, out);
    } else if (argc == 2 && std::strcmp(argv[1], "shared") == 0) {
        snug::cuda::launch<past_shared_end_kernel>(1, n + 1, n * sizeof(float), nullptr, out);
    } else {
        std::fprintf(stderr, "usage: out_of_bounds global|shared\n");
        return 2;
    }
    std::puts("no out-of-bounds access was reported");
    return 1;
}
