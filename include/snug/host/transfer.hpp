// Moving bytes on the host backend: host <-> "device" copies (plain memcpy,
// since the host is the device) and zero fills. The CUDA twins live in
// snug/cuda/transfer.hpp; layer code calls them unqualified with the device tag
// first, so one line of layer code serves both backends.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "snug/core/device.hpp"

namespace snug::host {

// dst (n) on the device <- src (n) in host memory.
template <class T>
void upload(const Device&, T* dst, const std::type_identity_t<T>* src, std::int64_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(T));
}

// dst (n) in host memory <- src (n) on the device; complete on return.
template <class T>
void download(const Device&, std::type_identity_t<T>* dst, const T* src, std::int64_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(T));
}

// dst (n) <- src (n), both on the device.
template <class T>
void copy(const Device&, T* dst, const std::type_identity_t<T>* src, std::int64_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > 0 && dst != src) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(T));
}

// dst (n) <- all-zero bytes (0.0 for every float type snug stores).
template <class T>
void fill_zero(const Device&, T* dst, std::int64_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > 0) std::memset(static_cast<void*>(dst), 0, static_cast<std::size_t>(n) * sizeof(T));
}

}  // namespace snug::host
