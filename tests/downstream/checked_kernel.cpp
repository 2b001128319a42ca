// A downstream project's own kernel under the emulated backend's
// shared-memory checker: built by Clang against the installed snug with
// -DSNUG_EMULATED_CHECKS=ON (tests/downstream/run.cmake), so its flags come
// from find_package(snug) alone. The kernel reads shared memory no thread
// wrote; exit code 0 means the checker reported it, naming the kernel.
#include <cstdio>
#include <string>

#include "snug/cuda/check.hpp"
#include "snug/cuda/launch.hpp"
#include "snug/cuda/runtime.hpp"
#include "snug/cuda/shared_memory.hpp"

namespace {

__global__ void reads_unwritten_shared_kernel(float* out) {  // out: (4)
    auto& s = snug::cuda::block_shared<float[4]>();
    out[threadIdx.x] = s[threadIdx.x];  // no thread wrote s
}

}  // namespace

int main() {
    float* out = nullptr;
    snug::cuda::check(cudaMalloc(&out, 4 * sizeof(float)));
    std::string message;
    try {
        snug::cuda::launch<reads_unwritten_shared_kernel>(1, 4, 0, nullptr, out);
        snug::cuda::check(cudaDeviceSynchronize());
    } catch (const snug::CudaError& e) {
        message = e.what();
    }
    // The fault is sticky; the reset clears it and frees `out` (the checker
    // brings AddressSanitizer, whose leak check runs at exit).
    snug::cuda::check(cudaDeviceReset());
    const bool reported = message.find("reads_unwritten_shared_kernel") != std::string::npos &&
                          message.find("no thread of the block has written") != std::string::npos;
    std::printf("%s\n", reported ? ("checked: " + message).c_str()
                                 : ("FAILED: the unwritten read was not reported (" + message + ")").c_str());
    return reported ? 0 : 1;
}
