// Moving bytes on the CUDA backend: host <-> device copies, device-to-device
// copies and zero fills, queued on the tag's stream. The same signatures and
// meaning as snug/host/transfer.hpp, so one line of layer code serves both
// backends.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"

namespace snug::cuda {

// dst (n) on the device <- src (n) in host memory. Waits for the copy (and
// the work queued before it on dev.stream), so src may be reused on return.
template <class T>
void upload(const Device& dev, T* dst, const std::type_identity_t<T>* src, std::int64_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > 0) copy_to_device(dst, src, static_cast<std::size_t>(n), dev.stream);
}

// dst (n) in host memory <- src (n) on the device, after the work queued
// before it on dev.stream; complete on return.
template <class T>
void download(const Device& dev, std::type_identity_t<T>* dst, const T* src, std::int64_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > 0) copy_to_host(dst, src, static_cast<std::size_t>(n), dev.stream);
}

// dst (n) <- src (n), both on the device; queued on dev.stream (asynchronous).
template <class T>
void copy(const Device& dev, T* dst, const std::type_identity_t<T>* src, std::int64_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > 0 && dst != src)
        check(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyDeviceToDevice,
                              dev.stream));
}

// dst (n) <- all-zero bytes (0.0 for every float type snug stores); queued on
// dev.stream (asynchronous).
template <class T>
void fill_zero(const Device& dev, T* dst, std::int64_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > 0) check(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(n) * sizeof(T), dev.stream));
}

}  // namespace snug::cuda
