// Error checking for the CUDA runtime and cuBLASLt: check() turns a failed
// call into snug::CudaError naming the call site, check_last_launch() does the
// same for kernel launches, and device_count() / require_device() say whether
// there is a GPU at all. No macros: the call site comes from a
// std::source_location default argument.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <source_location>
#include <string>

#include "snug/core/error.hpp"

namespace snug::cuda {

namespace detail {

inline std::string describe(cudaError_t status) {
    const char* name = cudaGetErrorName(status);
    const char* text = cudaGetErrorString(status);
    return std::string(name != nullptr ? name : "unknown cudaError_t") + " (" + std::to_string(static_cast<int>(status)) +
           "): " + (text != nullptr ? text : "no description");
}

inline std::string describe(cublasStatus_t status) {
    const char* name = cublasLtGetStatusName(status);
    const char* text = cublasLtGetStatusString(status);
    return std::string(name != nullptr ? name : "unknown cublasStatus_t") + " (" +
           std::to_string(static_cast<int>(status)) + "): " + (text != nullptr ? text : "no description");
}

}  // namespace detail

// Throws snug::CudaError "file.cu:42: cudaErrorInvalidValue (1): invalid argument"
// unless `status` is cudaSuccess. The location defaults to the caller's line.
// A failure also resets the runtime's last-error slot, so that the next
// check_last_launch() does not report it a second time. A sticky error cannot
// be reset and keeps failing every call: a fault inside a kernel, or, where
// the driver is missing, the runtime's failed initialisation.
inline void check(cudaError_t status, std::source_location loc = std::source_location::current()) {
    if (status != cudaSuccess) {
        (void)cudaGetLastError();
        throw CudaError(snug::detail::where(loc) + detail::describe(status));
    }
}

// The same for cuBLAS / cuBLASLt: "file.cu:42: CUBLAS_STATUS_INVALID_VALUE (7): ...".
inline void check(cublasStatus_t status, std::source_location loc = std::source_location::current()) {
    if (status != CUBLAS_STATUS_SUCCESS) throw CudaError(snug::detail::where(loc) + detail::describe(status));
}

// Call right after a kernel launch (`kernel<<<grid, block, 0, stream>>>(...)`):
// throws CudaError if the launch itself failed (bad configuration, no kernel
// image for this GPU) and clears that error. Errors while the kernel runs show
// up at the next synchronising call, which check() sees.
inline void check_last_launch(std::source_location loc = std::source_location::current()) {
    check(cudaGetLastError(), loc);
}

// Number of CUDA devices this process can use; 0 (not an exception) when there
// is no GPU, no driver, or the driver is too old for this runtime.
inline int device_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();  // reset it (where it can be) so no later check reports it
        return 0;
    }
    return count;
}

// Throws snug::NoCudaDevice, saying why, unless a CUDA device exists.
inline void require_device(std::source_location loc = std::source_location::current()) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaSuccess && count > 0) return;
    (void)cudaGetLastError();
    const std::string why = status != cudaSuccess ? detail::describe(status) : "the driver reports 0 devices";
    throw NoCudaDevice(snug::detail::where(loc) + "no CUDA device: " + why +
                       "; this needs an NVIDIA GPU with a driver for CUDA " + std::to_string(CUDART_VERSION / 1000) +
                       "." + std::to_string(CUDART_VERSION % 1000 / 10) +
                       " (check nvidia-smi and CUDA_VISIBLE_DEVICES), or use --device host");
}

}  // namespace snug::cuda
