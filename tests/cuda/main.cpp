// Main of the CUDA test executables. Emulated (snug_cuda_tests_emulated), it
// runs the Catch2 session on the emulated device. On the real backend
// (snug_cuda_tests): a machine without an NVIDIA GPU (no /dev/nvidia<N>, no
// /proc/driver/nvidia/gpus/*) exits 77, ctest's "skipped", saying so; a machine
// with one whose CUDA runtime cannot start (a driver too old for this runtime,
// say) fails with the runtime's reason, since silence there would hide a broken
// GPU set-up.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

#include "snug/cuda/runtime.hpp"

namespace {

// Whether this machine shows an NVIDIA GPU to processes, whatever the CUDA
// runtime thinks of it.
[[maybe_unused]] bool nvidia_gpu_present() {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator("/dev", ec)) {
        const std::string name = entry.path().filename().string();
        if (name.size() > 6 && name.starts_with("nvidia") && name.find_first_not_of("0123456789", 6) == std::string::npos)
            return true;
    }
    return fs::exists("/proc/driver/nvidia/gpus", ec) && !fs::is_empty("/proc/driver/nvidia/gpus", ec);
}

}  // namespace

int main(int argc, char* argv[]) {
#if !defined(SNUG_CUDA_EMULATED)
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
        const char* why = status != cudaSuccess ? cudaGetErrorString(status) : "the runtime sees 0 devices";
        if (!nvidia_gpu_present()) {
            std::printf("SKIPPED: no NVIDIA GPU on this machine (%s); snug_cuda_tests_emulated runs these tests on "
                        "the emulated device\n",
                        why);
            return 77;
        }
        std::fprintf(stderr,
                     "FAILED: this machine has an NVIDIA GPU, but the CUDA runtime cannot use it: %s (%s). Check the "
                     "driver (nvidia-smi: it must support CUDA %d.%d or later) and CUDA_VISIBLE_DEVICES.\n",
                     why, cudaGetErrorName(status), CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
        return 1;
    }
#endif
    return Catch::Session().run(argc, argv);
}
