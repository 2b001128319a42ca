// The CUDA device tag snug::cuda::Device, alias snug::Cuda (raw device
// allocation, the stream work runs on), what launchers size grids by
// (device_facts: SM count, shared memory per block), and the checked
// host <-> device copies.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <array>
#include <concepts>
#include <cstddef>
#include <mutex>
#include <source_location>
#include <span>
#include <string>
#include <type_traits>

#include "snug/core/bytes.hpp"
#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/core/tensor.hpp"
#include "snug/cuda/check.hpp"

namespace snug::cuda {

class Blas;            // snug/cuda/blas.hpp: the cuBLASLt context linear layers need
class OffloadLink;     // snug/cuda/offload_link.hpp: the second stream of an offloaded optimizer
class FusedAttention;  // snug/cuda/fused_attention.hpp: a library attention engine (cuDNN's SDPA)

// The CUDA backend's tag (snug::Cuda for short). A value of the tag carries the
// stream its work is queued on (nullptr: the legacy default stream), and
// brings the snug::cuda kernels into a layer's unqualified calls by
// argument-dependent lookup. Allocation is per process, so static.
struct Device {
    static constexpr const char* name = "cuda";
    // cudaMalloc returns memory aligned to at least 256 bytes.
    static constexpr std::size_t alignment = 256;
    // How an optimizer offloaded to the host reaches this device's memory.
    using offload_link = OffloadLink;

    cudaStream_t stream = nullptr;
    // The GEMM context linear_forward / linear_backward run through (not
    // owned; must outlive the tag's use). nullptr: no GEMM on this tag.
    Blas* blas = nullptr;
    // The fused attention engine AttentionKind::cudnn runs on (not owned);
    // nullptr: none, such attention takes the flash kernels.
    FusedAttention* fused = nullptr;

    // Raw device memory; callers go through MemoryTracker-aware buffers instead.
    // 0 bytes gives nullptr. A failed cudaMalloc throws snug::OutOfMemory with
    // the driver's free and total figures; any other failure, snug::CudaError.
    static void* allocate(std::size_t bytes) {
        if (bytes == 0) return nullptr;
        void* p = nullptr;
        const cudaError_t status = cudaMalloc(&p, bytes);
        if (status == cudaSuccess) return p;
        (void)cudaGetLastError();  // a failed cudaMalloc is not sticky: leave no trace
        if (status != cudaErrorMemoryAllocation) check(status);
        std::size_t free = 0, total = 0;
        std::string driver = "the driver's free-memory figure is unavailable";
        if (cudaMemGetInfo(&free, &total) == cudaSuccess)
            driver = "the driver reports " + format_bytes(free) + " free of " + format_bytes(total);
        else
            (void)cudaGetLastError();
        throw OutOfMemory("cudaMalloc of " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                          " bytes) failed: " + driver + " (" + detail::describe(status) + ")");
    }

    // Frees what allocate() returned; nullptr is a no-op. cudaFree waits for the
    // device to finish its queued work first. Errors are dropped: this runs in
    // destructors, and after a sticky error the context is unusable anyway.
    static void deallocate(void* p) noexcept {
        if (p == nullptr) return;
        if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
    }

    // Waits until the work queued on this tag's stream is done; throws
    // CudaError if any of it failed.
    void synchronize() const { check(cudaStreamSynchronize(stream)); }
};

// What launchers size their grids by, of one device.
struct DeviceFacts {
    int multiprocessors = 0;                 // SMs (132 on an H100 SXM or H200; the emulator says 132)
    std::size_t shared_per_block_optin = 0;  // bytes of shared memory a block may opt in to (227 KiB on sm_90)
};

// The current device's facts: asked of the runtime once per device, then
// cached (thread-safe); on the emulated backend asked every time, since a
// tool or test may give the emulated device another card's limits
// (emulated::set_device_limits). Throws CudaError when the runtime cannot
// answer.
inline DeviceFacts device_facts(std::source_location loc = std::source_location::current()) {
    int device = 0;
    check(cudaGetDevice(&device), loc);
    const auto ask = [&] {
        DeviceFacts facts;
        int shared = 0;
        check(cudaDeviceGetAttribute(&facts.multiprocessors, cudaDevAttrMultiProcessorCount, device), loc);
        check(cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), loc);
        facts.shared_per_block_optin = static_cast<std::size_t>(shared);
        return facts;
    };
#if defined(SNUG_CUDA_EMULATED)
    return ask();
#else
    constexpr int cached_devices = 64;
    static std::mutex mutex;
    static std::array<DeviceFacts, cached_devices> cache{};
    const std::lock_guard lock(mutex);
    if (device < 0 || device >= cached_devices) return ask();
    DeviceFacts& slot = cache[static_cast<std::size_t>(device)];
    if (slot.multiprocessors == 0) slot = ask();
    return slot;
#endif
}

}  // namespace snug::cuda

namespace snug {

using Cuda = cuda::Device;

static_assert(DeviceTag<Cuda>);

namespace cuda {

// Copies `count` elements from host memory to device memory on `stream` and
// waits for the copy, so `src` may be reused on return.
template <class T>
void copy_to_device(T* dst,                                      // device, (count)
                    const std::type_identity_t<T>* src,          // host, (count)
                    std::size_t count, cudaStream_t stream = nullptr,
                    std::source_location loc = std::source_location::current()) {
    static_assert(std::is_trivially_copyable_v<T>, "only trivially copyable elements can be copied byte for byte");
    if (count == 0) return;
    check(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyHostToDevice, stream), loc);
    check(cudaStreamSynchronize(stream), loc);
}

// Copies `count` elements from device memory to host memory on `stream` and
// waits for the copy, so `dst` may be read on return.
template <class T>
void copy_to_host(std::type_identity_t<T>* dst,  // host, (count)
                  const T* src,                  // device, (count)
                  std::size_t count, cudaStream_t stream = nullptr,
                  std::source_location loc = std::source_location::current()) {
    static_assert(std::is_trivially_copyable_v<T>, "only trivially copyable elements can be copied byte for byte");
    if (count == 0) return;
    check(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDeviceToHost, stream), loc);
    check(cudaStreamSynchronize(stream), loc);
}

// The whole of a host span into device memory that holds at least src.size() elements.
template <class T>
void copy_to_device(T* dst, std::span<const std::type_identity_t<T>> src, cudaStream_t stream = nullptr,
                    std::source_location loc = std::source_location::current()) {
    copy_to_device(dst, src.data(), src.size(), stream, loc);
}

// dst.size() elements of device memory into a host span.
template <class T>
void copy_to_host(std::span<std::type_identity_t<T>> dst, const T* src, cudaStream_t stream = nullptr,
                  std::source_location loc = std::source_location::current()) {
    copy_to_host(dst.data(), src, dst.size(), stream, loc);
}

// Tensor views of the same shape (the source may be a read-only view); a
// mismatch throws snug::ShapeError naming both shapes.
template <class T, class S>
    requires std::same_as<std::remove_const_t<S>, T>
void copy_to_device(const TensorView<T, Cuda>& dst, const TensorView<S, Host>& src, cudaStream_t stream = nullptr,
                    std::source_location loc = std::source_location::current()) {
    if (!(dst.shape() == src.shape()))
        throw ShapeError(snug::detail::where(loc) + "copy_to_device: host source " + src.shape().str() +
                         " and device destination " + dst.shape().str() + " must have the same shape");
    copy_to_device(dst.data(), src.data(), static_cast<std::size_t>(src.numel()), stream, loc);
}

template <class T, class S>
    requires std::same_as<std::remove_const_t<S>, T>
void copy_to_host(const TensorView<T, Host>& dst, const TensorView<S, Cuda>& src, cudaStream_t stream = nullptr,
                  std::source_location loc = std::source_location::current()) {
    if (!(dst.shape() == src.shape()))
        throw ShapeError(snug::detail::where(loc) + "copy_to_host: device source " + src.shape().str() +
                         " and host destination " + dst.shape().str() + " must have the same shape");
    copy_to_host(dst.data(), src.data(), static_cast<std::size_t>(src.numel()), stream, loc);
}

}  // namespace cuda
}  // namespace snug
