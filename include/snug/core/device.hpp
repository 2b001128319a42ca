// Device tags: the type that says where memory lives and where work runs.
// Layers and policies are templated on a tag; each backend supplies the same
// operations. A backend's tag is the `Device` type of the backend's namespace
// (`snug::host::Device`, `snug::cuda::Device`), so a layer's unqualified call
// `layernorm_forward(dev, ...)` finds that backend's kernel by argument-
// dependent lookup. `snug::Host` and `snug::Cuda` are the short names.
// `snug::Cuda` (with its stream) lives in snug/cuda/device.hpp, which only a
// CUDA build includes.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <new>

#include "snug/core/error.hpp"

namespace snug::host {

struct OffloadLink;  // snug/host/offload_link.hpp

// The host backend: plain C++ on the CPU, the reference for every kernel.
struct Device {
    static constexpr const char* name = "host";
    // How an optimizer offloaded to the host reaches this device's memory
    // (optim/offload.hpp); every device tag names one.
    using offload_link = OffloadLink;
    // Host memory is aligned for the widest vector unit and cache lines.
    static constexpr std::size_t alignment = 64;

    // Raw allocation; callers go through MemoryTracker-aware buffers instead.
    static void* allocate(std::size_t bytes) {
        if (bytes == 0) return nullptr;
        std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
        void* p = std::aligned_alloc(alignment, rounded);
        if (p == nullptr) throw std::bad_alloc();
        return p;
    }
    static void deallocate(void* p) noexcept { std::free(p); }
    void synchronize() const noexcept {}
};

}  // namespace snug::host

namespace snug {

using Host = host::Device;

// What a device tag must provide: a name, raw allocation, and a way to wait
// for the work queued on it.
template <class D>
concept DeviceTag = requires(D d, void* p, std::size_t n) {
    { D::name } -> std::convertible_to<const char*>;
    { D::allocate(n) } -> std::same_as<void*>;
    { D::deallocate(p) } noexcept;
    d.synchronize();
};

static_assert(DeviceTag<Host>);

}  // namespace snug
