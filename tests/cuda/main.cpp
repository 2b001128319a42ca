// Main of the CUDA test executable: exits 77 (ctest's "skipped") with a clear
// message where no CUDA device exists, and runs the Catch2 session otherwise.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char* argv[]) {
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
        std::printf("SKIPPED: no CUDA device (%s); the CUDA-vs-host tests need a GPU\n",
                    status != cudaSuccess ? cudaGetErrorString(status) : "device count is 0");
        return 77;
    }
    return Catch::Session().run(argc, argv);
}
